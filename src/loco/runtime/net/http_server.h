// The coordinator's HTTP/1.1 server, built so that its availability does not depend on its clients
// (docs/security.md): connections are served by one event-driven I/O thread (Boost.Beast over
// Asio), so an idle or slow connection holds no thread; every request has deadlines for its
// headers, its body and its answer; a gate refuses a request on its headers alone, before its body
// is read; complete requests run on a fixed pool of handler threads. When the connection table is
// full, the connection that has waited longest for a request (or for its client to take an
// answer) is closed to make room, a stranger's before one from an address that made an authentic
// request (a worker's client reconnects); connections are bounded per address, and the bytes of
// request bodies held per address and in all.
// Optional TLS through Asio's OpenSSL streams: a client's ClientHello is read whole before the
// server answers it, and the answers (a key exchange and a signature each, the costly step) are
// given one per turn of the I/O loop, trusted addresses first (handshake_queue.h).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace loco::runtime {

struct HttpRequest {
  struct Caseless {
    bool operator()(const std::string& a, const std::string& b) const;
  };
  std::string method;  // "GET", "POST", ...
  std::string target;  // as sent: the path and the query
  std::string path;    // the target up to '?'
  std::multimap<std::string, std::string> params;          // the query, percent-decoded
  std::map<std::string, std::string, Caseless> headers;    // names compared without case
  std::string body;    // empty at the gate (not read yet)
  std::string remote_addr;
  int remote_port = 0;

  bool has_param(const std::string& name) const { return params.count(name) > 0; }
  // The first value of `name`, or "".
  std::string param(const std::string& name) const;
  // The header's value, or null.
  const std::string* header(const std::string& name) const;
};

struct HttpResponse {
  int status = 200;
  std::string body;
  std::string content_type = "text/plain";
  std::vector<std::pair<std::string, std::string>> headers;  // more headers (names as sent)
  // The request was authentic (signed with the run's key): the server then trusts its address,
  // whose TLS handshakes go first and whose connections are closed last to make room.
  bool authentic = false;
  void set_content(std::string content, std::string type) {
    body = std::move(content);
    content_type = std::move(type);
  }
};

struct HttpServerOptions {
  std::string bind = "127.0.0.1";
  int64_t port = 0;                     // 0 = any free port
  std::string tls_cert, tls_key;        // PEM files: HTTPS only when set
  size_t handler_threads = 8;           // requests handled at once (a handler may wait up to its own bound)
  std::chrono::milliseconds header_deadline{5000};  // a request's headers (and the TLS handshake) must arrive whole within this
  std::chrono::milliseconds body_deadline{10000};   // then its body
  std::chrono::milliseconds write_deadline{10000};  // the answer must be taken within this
  size_t max_header_bytes = 16 << 10;   // larger: 431, and the connection is closed
  size_t max_body_bytes = 4 << 20;      // larger: 413, and the connection is closed
  size_t max_connections = 4096;        // open at once (fewer when the process may not open that many files)
  // Open at once from one address: a new one past it closes that address's own connection that
  // has waited longest, or is refused when none can be closed. All the workers of a machine share
  // its address (every one of a `loco launch` is 127.0.0.1), each with a few connections.
  size_t max_connections_per_address = 1024;
  // An answer its client has not taken for this long (a client pipelining requests and never
  // reading) may be closed to make room, as a connection waiting for a request may.
  std::chrono::milliseconds write_blocked_after{1000};
  // Bytes of request bodies the server holds at once, from one address and in all: a body is
  // counted whole (its Content-Length) from its headers until its answer is written. Over the
  // address's bound: 503. Over the bound in all: the connection that has waited longest on a body
  // is closed to make room, or 503 when none can be.
  size_t max_held_body_bytes_per_address = 32 << 20;
  size_t max_held_body_bytes = 256 << 20;
  // Routes (by path) that take bodies larger than max_body_bytes, up to their own bound and within
  // their own deadline, from a request the wide gate admits on its headers (HttpServer::set_wide_gate:
  // the coordinator's admits only a request whose head is signed with the run's key). Such bodies
  // count against a budget of their own in all (max_held_wide_body_bytes), not against the two
  // above, which a stranger's bodies share; over it: 503.
  struct WideRoute {
    size_t max_body_bytes = 0;
    std::chrono::milliseconds body_deadline{10000};
  };
  std::map<std::string, WideRoute> wide_routes;
  size_t max_held_wide_body_bytes = 0;
};

class HttpServer {
 public:
  using Handler = std::function<void(const HttpRequest&, HttpResponse&)>;
  // Looks at a request before its body is read (`body` is empty): an answer refuses it (the
  // connection is then closed), nullopt lets it through. Runs on the I/O thread: keep it cheap.
  using Gate = std::function<std::optional<HttpResponse>(const HttpRequest&)>;

  // Binds now. Throws ConfigError naming the address when it cannot, or when the TLS certificate
  // or key cannot be loaded.
  explicit HttpServer(HttpServerOptions options);
  ~HttpServer();  // stops
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Routes are exact paths; register them before start(). Unknown paths get 404, known paths
  // with another method 405.
  void route(const std::string& method, const std::string& path, Handler handler);
  void set_gate(Gate gate);
  // Looks at a request on a wide route (HttpServerOptions::wide_routes) whose Content-Length is
  // over max_body_bytes and within the route's bound, after the gate let it through: why it may
  // not send that many bytes, or nullopt when it may. Without one, every such request may. Runs on
  // the I/O thread: keep it cheap.
  using WideGate = std::function<std::optional<std::string>(const HttpRequest&, uint64_t body_bytes)>;
  void set_wide_gate(WideGate gate);
  int port() const;
  // Starts the I/O thread and the handler threads.
  void start();
  void stop();

  // How far request handling is behind: the longest a complete request has been waiting for a
  // handler thread, or the I/O thread's lag behind its 100 ms tick, whichever is larger. A
  // coordinator that is behind holds off declaring members dead.
  std::chrono::milliseconds behind() const;

  // Connections open now, and refused or closed by the server since the start (over a limit, past
  // a deadline, evicted).
  struct Counts {
    int64_t open = 0, evicted = 0, timed_out = 0, refused_at_gate = 0;
    int64_t held_body_bytes = 0, refused_over_budget = 0;  // bodies held now; 503s for bytes held
  };
  Counts counts() const;

  struct Impl;  // (public only so that the connection types in the .cpp can name it)

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace loco::runtime
