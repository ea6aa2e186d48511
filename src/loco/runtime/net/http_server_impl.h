// The state of the coordinator's HTTP server (http_server.h) that its connections share: the table of
// open connections and how room is made in it, the bodies' budgets, the handshake queue, the routes.
// Internal to net/: http_server.cpp runs the server, http_session.cpp its connections.
#pragma once

#include <atomic>
#include <boost/asio.hpp>
#include <boost/asio/ssl.hpp>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>

#include "loco/runtime/net/handshake_queue.h"
#include "loco/runtime/net/http_server.h"
#include "loco/runtime/net/http_server_parts.h"

namespace loco::runtime {
namespace detail {

// What the server needs to know of a connection to make room for another.
struct Connection {
  explicit Connection(std::string from) : address(std::move(from)) {}
  virtual ~Connection() = default;
  virtual void close() = 0;
  const std::string address;  // the peer's
  // Waiting for its TLS handshake, a request's headers or its body, or lingering after a refusal:
  // evictable, since nothing in it is authenticated yet (a MAC covers the body).
  bool waiting = true;
  std::chrono::steady_clock::time_point waiting_since = std::chrono::steady_clock::now();
  // Writing an answer since `writing_since`: evictable once its client has not taken it for
  // HttpServerOptions::write_blocked_after (nothing of it is owed to a client that does not read).
  bool writing = false;
  std::chrono::steady_clock::time_point writing_since;
  // Since when it may be closed to make room, or nullopt while it may not.
  std::optional<std::chrono::steady_clock::time_point> evictable_since(std::chrono::steady_clock::time_point now,
                                                                       std::chrono::milliseconds write_blocked_after) const {
    if (waiting) return waiting_since;
    if (writing && now - writing_since >= write_blocked_after) return writing_since;
    return std::nullopt;
  }
  std::atomic<size_t> held{0};  // bytes of a request body counted against the budgets (HttpServer::Impl::hold)
  bool held_wide = false;       // ... against the wide routes' budget
};

// How large a request's body may be, and how long it may take to arrive.
struct BodyBound {
  size_t max_bytes = 0;
  std::chrono::milliseconds deadline{0};
  bool wide = false;     // a wide route's (HttpServerOptions::wide_routes), admitted
  std::string why_not;   // why a body over the default bound was not admitted on a wide route
};

}  // namespace detail

struct HttpServer::Impl {
  using Clock = std::chrono::steady_clock;
  using tcp = boost::asio::ip::tcp;

  explicit Impl(HttpServerOptions o) : options(std::move(o)) {}

  HttpServerOptions options;
  std::map<std::pair<std::string, std::string>, Handler> routes;  // (method, path)
  Gate gate;
  WideGate wide_gate;
  std::optional<boost::asio::ssl::context> tls;
  detail::HandlerPool pool;
  std::thread io_thread;
  std::atomic<int64_t> tick_due{0};  // when the I/O thread's next tick is due (steady clock, ns)
  std::atomic<int64_t> evicted{0}, timed_out{0}, refused_at_gate{0}, refused_over_budget{0};
  std::atomic<int64_t> answering{0};  // requests taken in and not yet answered (handled and written)
  size_t max_connections = 0;
  int port = 0;

  // Open connections, by id: touched on the I/O thread, and where a connection is destroyed.
  mutable std::mutex connections_mutex;
  struct Entry {
    std::weak_ptr<detail::Connection> connection;
    std::string address;
  };
  std::map<uint64_t, Entry> connections;
  std::map<std::string, size_t> open_by_address;  // how many of `connections` each address has

  void enter(uint64_t id, const std::shared_ptr<detail::Connection>& connection) {
    std::lock_guard lock(connections_mutex);
    connections.emplace(id, Entry{connection, connection->address});
    ++open_by_address[connection->address];
  }
  uint64_t next_id = 1;  // (0 is no connection to the handshake queue)

  // The bytes of request bodies held, in all and by address (only addresses holding some):
  // declared before `io`, whose destruction ends the connections that give their bytes back.
  mutable std::mutex held_mutex;
  size_t held_bytes = 0;
  std::map<std::string, size_t> held_by_address;
  size_t held_wide_bytes = 0;  // on the wide routes, in all

  // Destroyed before the state above, with the connections its pending handlers still hold (only
  // the handshake queue below, which holds connections too, goes before it).
  boost::asio::io_context io;
  tcp::acceptor acceptor{io};
  boost::asio::steady_timer tick{io}, retry{io};

  HttpResponse handle(const HttpRequest& request) const {
    HttpResponse response;
    const auto it = routes.find({request.method, request.path});
    if (it != routes.end()) {
      it->second(request, response);
      return response;
    }
    const bool known = std::any_of(routes.begin(), routes.end(), [&](const auto& r) { return r.first.second == request.path; });
    response.status = known ? 405 : 404;
    response.set_content(fmt::format("{{\"error\": \"{} {}\"}}", known ? "no such method for" : "no such path", request.path),
                         "application/json");
    return response;
  }

  // The largest body any request may announce (the parser's bound until its route is known).
  size_t largest_body() const {
    size_t largest = options.max_body_bytes;
    for (const auto& [path, wide] : options.wide_routes) largest = std::max(largest, wide.max_body_bytes);
    return largest;
  }
  // The bound on `request`'s body, which announces `announced` bytes (nullopt: chunked, never wide).
  detail::BodyBound body_bound(const HttpRequest& request, std::optional<uint64_t> announced) const {
    detail::BodyBound bound{options.max_body_bytes, options.body_deadline, false, {}};
    if (!announced || *announced <= options.max_body_bytes) return bound;
    const auto route = options.wide_routes.find(request.path);
    if (route == options.wide_routes.end() || *announced > route->second.max_body_bytes) return bound;
    if (wide_gate) {
      if (auto why = wide_gate(request, *announced)) {
        bound.why_not = *why;
        return bound;
      }
    }
    return {route->second.max_body_bytes, route->second.body_deadline, true, {}};
  }

  void forget(uint64_t id) {
    std::lock_guard lock(connections_mutex);
    const auto it = connections.find(id);
    if (it == connections.end()) return;
    if (const auto by = open_by_address.find(it->second.address); by != open_by_address.end() && --by->second == 0) {
      open_by_address.erase(by);
    }
    connections.erase(it);
  }

  // Of the connections `since` allows (it gives a time for those, nullopt for the others), the one
  // to close first (null if none): an untrusted address's (HandshakeQueue::trust) before a trusted
  // one's, then the one with the earliest time (that has waited longest).
  template <class Since>
  std::shared_ptr<detail::Connection> first_to_close(Since since) {
    std::shared_ptr<detail::Connection> first;
    std::pair<bool, Clock::time_point> first_key;
    std::lock_guard lock(connections_mutex);
    for (const auto& [id, entry] : connections) {
      auto c = entry.connection.lock();
      if (!c) continue;
      const auto when = since(*c);
      if (!when) continue;
      const std::pair<bool, Clock::time_point> key{handshakes.trusted(c->address), *when};
      if (!first || key < first_key) {
        first = c;
        first_key = key;
      }
    }
    return first;
  }
  // When a connection may be closed to make room for a new one (Connection::evictable_since).
  std::optional<Clock::time_point> evictable(const detail::Connection& c, Clock::time_point now) const {
    return c.evictable_since(now, options.write_blocked_after);
  }

  // Room for a new connection from `address`: at that address's bound, its own connection that
  // has waited longest is closed; at the table's, anyone's (first_to_close). False when none can
  // be (then the new one is refused).
  bool make_room(const std::string& address) {
    const auto now = Clock::now();
    size_t open = 0, from_address = 0;
    {
      std::lock_guard lock(connections_mutex);
      open = connections.size();
      const auto by = open_by_address.find(address);
      from_address = by == open_by_address.end() ? 0 : by->second;
    }
    if (from_address >= options.max_connections_per_address) {
      auto own = first_to_close([&](const detail::Connection& c) { return c.address == address ? evictable(c, now) : std::nullopt; });
      if (!own) return false;
      own->close();
      ++evicted;
      return true;
    }
    if (open < max_connections) return true;
    auto oldest = first_to_close([&](const detail::Connection& c) { return evictable(c, now); });
    if (!oldest) return false;
    oldest->close();
    ++evicted;
    return true;
  }

  // Counts `bytes` of `connection`'s body (from `address`) against the budgets, closing the
  // connections that have waited longest on a body while the bound in all would be passed. False
  // (nothing counted) over the address's bound, or when no other connection can be closed.
  bool hold(detail::Connection& connection, const std::string& address, size_t bytes, bool wide) {
    if (wide) {  // members' bodies: their own budget, nothing of anyone's closed for them
      std::lock_guard lock(held_mutex);
      if (held_wide_bytes + bytes > options.max_held_wide_body_bytes) return false;
      held_wide_bytes += bytes;
      connection.held_wide = true;
      connection.held += bytes;
      return true;
    }
    for (;;) {
      {
        std::lock_guard lock(held_mutex);
        const size_t by_address = held_by_address.count(address) ? held_by_address[address] : 0;
        if (by_address + bytes > options.max_held_body_bytes_per_address) return false;
        if (held_bytes + bytes <= options.max_held_body_bytes) {
          held_by_address[address] = by_address + bytes;
          held_bytes += bytes;
          connection.held += bytes;
          return true;
        }
      }
      auto oldest = first_to_close([&](const detail::Connection& c) {
        return &c != &connection && c.waiting && c.held > 0 ? std::optional(c.waiting_since) : std::nullopt;
      });
      if (!oldest) return false;
      oldest->close();  // gives back what it held
      ++evicted;
    }
  }
  void release(const std::string& address, size_t bytes, bool wide) {
    std::lock_guard lock(held_mutex);
    if (wide) {
      held_wide_bytes -= bytes;
      return;
    }
    held_bytes -= bytes;
    const auto mine = held_by_address.find(address);
    if (mine != held_by_address.end() && (mine->second -= bytes) == 0) held_by_address.erase(mine);
  }

  // TLS handshakes waiting for their turn (handshake_queue.h); one is taken per turn of the I/O
  // loop. Declared after `io`: destroyed before it, with the connections it holds.
  detail::HandshakeQueue handshakes;
  bool handshake_turn_posted = false;
  void post_handshake_turn() {
    if (handshake_turn_posted || handshakes.empty()) return;
    handshake_turn_posted = true;
    boost::asio::post(io, [this] {
      handshake_turn_posted = false;
      if (auto start = handshakes.pop()) start();
      post_handshake_turn();  // behind whatever else is ready by now
    });
  }

  void accept();
  void on_accept(tcp::socket socket);
  void start_tick();
};

}  // namespace loco::runtime
