#include "loco/runtime/net/http_server.h"

#include <fmt/format.h>
#include <httplib.h>  // the query-string parser, the one cpp-httplib's own server uses
#include <openssl/ssl.h>
#include <strings.h>

#include <array>
#include <atomic>
#include <boost/asio.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include "loco/core/error.h"
#include "loco/runtime/net/handshake_queue.h"
#include "loco/runtime/net/http_server_parts.h"

namespace loco::runtime {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using Clock = std::chrono::steady_clock;

// What the server needs to know of a connection to make room for another.
struct Connection {
  explicit Connection(std::string from) : address(std::move(from)) {}
  virtual ~Connection() = default;
  virtual void close() = 0;
  const std::string address;  // the peer's
  // Waiting for its TLS handshake, a request's headers or its body, or lingering after a refusal:
  // evictable, since nothing in it is authenticated yet (a MAC covers the body).
  bool waiting = true;
  Clock::time_point waiting_since = Clock::now();
  std::atomic<size_t> held{0};  // bytes of a request body counted against the budgets (HttpServer::Impl::hold)
};

}  // namespace

bool HttpRequest::Caseless::operator()(const std::string& a, const std::string& b) const {
  return ::strcasecmp(a.c_str(), b.c_str()) < 0;
}

std::string HttpRequest::param(const std::string& name) const {
  const auto it = params.find(name);
  return it == params.end() ? std::string() : it->second;
}

const std::string* HttpRequest::header(const std::string& name) const {
  const auto it = headers.find(name);
  return it == headers.end() ? nullptr : &it->second;
}

struct HttpServer::Impl {
  explicit Impl(HttpServerOptions o) : options(std::move(o)) {}

  HttpServerOptions options;
  std::map<std::pair<std::string, std::string>, Handler> routes;  // (method, path)
  Gate gate;
  std::optional<asio::ssl::context> tls;
  detail::HandlerPool pool;
  std::thread io_thread;
  std::atomic<int64_t> tick_due{0};  // when the I/O thread's next tick is due (steady clock, ns)
  std::atomic<int64_t> evicted{0}, timed_out{0}, refused_at_gate{0}, refused_over_budget{0};
  std::atomic<int64_t> answering{0};  // requests taken in and not yet answered (handled and written)
  size_t max_connections = 0;
  int port = 0;

  // Open connections, by id: touched on the I/O thread, and where a connection is destroyed.
  mutable std::mutex connections_mutex;
  std::map<uint64_t, std::weak_ptr<Connection>> connections;
  uint64_t next_id = 1;  // (0 is no connection to the handshake queue)

  // The bytes of request bodies held, in all and by address (only addresses holding some):
  // declared before `io`, whose destruction ends the connections that give their bytes back.
  mutable std::mutex held_mutex;
  size_t held_bytes = 0;
  std::map<std::string, size_t> held_by_address;

  // Destroyed before the state above, with the connections its pending handlers still hold (only
  // the handshake queue below, which holds connections too, goes before it).
  asio::io_context io;
  tcp::acceptor acceptor{io};
  asio::steady_timer tick{io}, retry{io};

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

  void forget(uint64_t id) {
    std::lock_guard lock(connections_mutex);
    connections.erase(id);
  }

  // Of the connections `may_go` allows, the one to close first (null if none): an untrusted address's
  // (HandshakeQueue::trust) before a trusted one's, then the one that has waited longest.
  template <class MayGo>
  std::shared_ptr<Connection> first_to_close(MayGo may_go) {
    std::shared_ptr<Connection> first;
    bool first_trusted = false;
    std::lock_guard lock(connections_mutex);
    for (const auto& [id, weak] : connections) {
      auto c = weak.lock();
      if (!c || !may_go(*c)) continue;
      const bool trusted = handshakes.trusted(c->address);
      if (!first || std::make_pair(trusted, c->waiting_since) < std::make_pair(first_trusted, first->waiting_since)) {
        first = c;
        first_trusted = trusted;
      }
    }
    return first;
  }

  // At the limit: closes a waiting connection (first_to_close). False when every connection is
  // busy (then the new one is refused).
  bool make_room() {
    if (std::lock_guard lock(connections_mutex); connections.size() < max_connections) return true;
    auto oldest = first_to_close([](const Connection& c) { return c.waiting; });
    if (!oldest) return false;
    oldest->close();
    ++evicted;
    return true;
  }

  // Counts `bytes` of `connection`'s body (from `address`) against the budgets, closing the
  // connections that have waited longest on a body while the bound in all would be passed. False
  // (nothing counted) over the address's bound, or when no other connection can be closed.
  bool hold(Connection& connection, const std::string& address, size_t bytes) {
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
      auto oldest = first_to_close([&](const Connection& c) { return &c != &connection && c.waiting && c.held > 0; });
      if (!oldest) return false;
      oldest->close();  // gives back what it held
      ++evicted;
    }
  }
  void release(const std::string& address, size_t bytes) {
    std::lock_guard lock(held_mutex);
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
    asio::post(io, [this] {
      handshake_turn_posted = false;
      if (auto start = handshakes.pop()) start();
      post_handshake_turn();  // behind whatever else is ready by now
    });
  }

  void accept();
  void on_accept(tcp::socket socket);
  void start_tick();
};

namespace {

// One connection: TLS handshake (when TLS), then requests one after another, each read with
// deadlines, gated, handled on the pool and answered; everything but the handler on the I/O thread.
template <class Stream>
class Session final : public Connection, public std::enable_shared_from_this<Session<Stream>> {
 public:
  Session(HttpServer::Impl& server, uint64_t id, Stream stream, std::string address, int port)
      : Connection(std::move(address)), server_(server), id_(id), stream_(std::move(stream)), port_(port) {}
  ~Session() override {
    release_body();
    server_.forget(id_);
  }

  static constexpr bool kTls = !std::is_same_v<Stream, beast::tcp_stream>;

  void start() {
    if constexpr (kTls) {
      // The whole handshake, its wait for a turn included, within the headers' deadline.
      lowest().expires_after(server_.options.header_deadline);
      handshake_deadline_ = Clock::now() + server_.options.header_deadline;
      read_hello();
    } else {
      read_header();
    }
  }

  void close() override {  // on the I/O thread, by one that holds the session
    release_body();
    beast::error_code ignored;
    lowest().socket().shutdown(tcp::socket::shutdown_both, ignored);
    lowest().socket().close(ignored);
    server_.handshakes.remove(id_);
  }

 private:
  beast::tcp_stream& lowest() { return beast::get_lowest_layer(stream_); }

  // TLS: the client's first flight is read whole (handshake_queue.h: client_hello_missing) before
  // the server does any work for it; then the handshake waits its turn and takes these bytes first.
  void read_hello() {
    const auto missing = detail::client_hello_missing(hello_);
    if (!missing) return close();  // not a TLS client's hello
    if (*missing == 0) {
      server_.handshakes.push(id_, address, [self = this->shared_from_this()] { self->handshake(); });
      return server_.post_handshake_turn();
    }
    const size_t at = hello_.size();
    hello_.resize(at + *missing);
    asio::async_read(lowest(), asio::buffer(hello_.data() + at, *missing), [self = this->shared_from_this()](beast::error_code ec, size_t) {
      if (ec) return self->fail(ec);
      self->read_hello();
    });
  }
  // Its turn: the costly step (the answer to the ClientHello) runs now, on this thread.
  void handshake() {
    if constexpr (kTls) {
      if (Clock::now() >= handshake_deadline_) {
        ++server_.timed_out;
        return close();
      }
      stream_.async_handshake(asio::ssl::stream_base::server, asio::buffer(hello_),
                              [self = this->shared_from_this()](beast::error_code ec, size_t) {
                                self->hello_ = std::string();
                                if (ec) return self->fail(ec);
                                self->read_header();
                              });
    }
  }

  void read_header() {
    waiting = true;
    waiting_since = Clock::now();
    parser_.emplace();
    parser_->header_limit(static_cast<uint32_t>(server_.options.max_header_bytes));
    parser_->body_limit(server_.options.max_body_bytes);
    // One deadline for the whole of the headers, however slowly they trickle in.
    lowest().expires_after(server_.options.header_deadline);
    http::async_read_header(stream_, buffer_, *parser_, [self = this->shared_from_this()](beast::error_code ec, size_t) {
      self->on_header(ec);
    });
  }

  void on_header(beast::error_code ec) {
    if (ec == http::error::header_limit) return refuse(431, "the request's headers are too large");
    if (ec == http::error::body_limit) return too_large();  // its Content-Length says so already
    if (ec) return fail(ec);
    waiting = false;
    const auto& message = parser_->get();
    request_ = HttpRequest{};
    request_.method = std::string(message.method_string());
    request_.target = std::string(message.target());
    const auto query = request_.target.find('?');
    request_.path = request_.target.substr(0, query);
    if (query != std::string::npos) httplib::detail::parse_query_text(request_.target.substr(query + 1), request_.params);
    for (const auto& field : message) request_.headers.emplace(std::string(field.name_string()), std::string(field.value()));
    request_.remote_addr = address;
    request_.remote_port = port_;
    if (server_.gate) {
      if (auto refusal = server_.gate(request_)) {
        ++server_.refused_at_gate;
        return write(std::move(*refusal), true);
      }
    }
    if (parser_->is_done()) return dispatch();
    // A body still on its way holds a slot, and memory, that a client without the key can hold as
    // well as a member (its well-formed but wrong signature is found out only with the body):
    // evictable, and counted whole against the budgets before a byte of it is read.
    const auto announced = parser_->content_length();
    const size_t bytes = announced ? static_cast<size_t>(std::min<uint64_t>(*announced, server_.options.max_body_bytes))
                                   : server_.options.max_body_bytes;
    if (!server_.hold(*this, address, bytes)) {
      ++server_.refused_over_budget;
      return refuse(503, "the server holds as many request bodies as it may; ask again");
    }
    waiting = true;
    waiting_since = Clock::now();
    lowest().expires_after(server_.options.body_deadline);
    http::async_read(stream_, buffer_, *parser_, [self = this->shared_from_this()](beast::error_code ec, size_t) {
      self->on_body(ec);
    });
  }

  void on_body(beast::error_code ec) {
    waiting = false;
    if (ec == http::error::body_limit) return too_large();
    if (ec) return fail(ec);
    request_.body = std::move(parser_->get().body());
    dispatch();
  }

  // The handler runs on the pool; the I/O thread gets the session back whole (TSan: not destroyed on the pool).
  void dispatch() {
    lowest().expires_never();
    ++server_.answering;
    const bool close_after = !parser_->get().keep_alive();
    const bool taken = server_.pool.enqueue([self = this->shared_from_this(), request = std::move(request_), close_after]() mutable {
      HttpResponse response;
      try {
        response = self->server_.handle(request);
      } catch (const std::exception& e) {
        response.status = 500;
        response.set_content(detail::json_error(e.what()), "application/json");
      }
      auto& io = self->server_.io;
      asio::post(io, [self = std::move(self), response = std::move(response), close_after]() mutable {
        self->write(std::move(response), close_after, true);
      });
    });
    if (!taken) {  // stopping: a task queued now would outlive the server's state
      --server_.answering;
      close();
    }
  }

  void too_large() { refuse(413, fmt::format("the body is over {} bytes", server_.options.max_body_bytes)); }

  void refuse(int status, const std::string& why) {
    HttpResponse response;
    response.status = status;
    response.set_content(detail::json_error(why), "application/json");
    write(std::move(response), true);
  }

  void write(HttpResponse response, bool close_after, bool answer = false) {
    waiting = false;
    if (response.authentic) server_.handshakes.trust(address, Clock::now());
    response_.emplace(static_cast<http::status>(response.status), 11);
    response_->reason(detail::reason_of(response.status));
    response_->set(http::field::content_type, response.content_type);
    for (const auto& [name, value] : response.headers) response_->set(name, value);
    response_->keep_alive(!close_after);
    response_->body() = std::move(response.body);
    response_->prepare_payload();
    lowest().expires_after(server_.options.write_deadline);
    http::async_write(stream_, *response_, [self = this->shared_from_this(), close_after, answer](beast::error_code ec, size_t) {
      if (answer) --self->server_.answering;
      self->release_body();
      if (ec) return self->fail(ec);
      if (close_after) return self->linger();
      self->read_header();
    });
  }

  // A close after refusing a request whose body may still be on its way: stop sending, then read
  // and drop what comes for a short while, so that the peer reads the answer rather than a reset.
  void linger() {
    waiting = true;  // nothing more is answered on it
    waiting_since = Clock::now();
    beast::error_code ignored;
    lowest().socket().shutdown(tcp::socket::shutdown_send, ignored);
    lowest().expires_after(std::chrono::seconds(2));
    drain(8 << 20);
  }
  void drain(size_t budget) {
    if (!discard_) discard_ = std::make_unique<std::array<char, 16384>>();
    lowest().async_read_some(asio::buffer(*discard_), [self = this->shared_from_this(), budget](beast::error_code ec, size_t n) {
      if (ec || n >= budget) return self->close();
      self->drain(budget - n);
    });
  }

  // Gives back the bytes of the request body counted against the budgets.
  void release_body() {
    if (const size_t bytes = held.exchange(0)) server_.release(address, bytes);
  }

  void fail(beast::error_code ec) {
    if (ec == beast::error::timeout) ++server_.timed_out;
    close();
  }

  HttpServer::Impl& server_;
  const uint64_t id_;
  Stream stream_;
  const int port_;
  std::string hello_;  // TLS: the client's first flight, until the handshake has taken it
  Clock::time_point handshake_deadline_;
  beast::flat_buffer buffer_;
  std::unique_ptr<std::array<char, 16384>> discard_;  // lingering: what is read and dropped
  std::optional<http::request_parser<http::string_body>> parser_;
  std::optional<http::response<http::string_body>> response_;
  HttpRequest request_;
};

}  // namespace

void HttpServer::Impl::accept() {
  acceptor.async_accept([this](beast::error_code ec, tcp::socket socket) {
    if (!acceptor.is_open()) return;
    if (ec) {
      // Out of file descriptors, say: try again shortly rather than spin.
      retry.expires_after(std::chrono::milliseconds(50));
      retry.async_wait([this](beast::error_code wait_error) {
        if (!wait_error) accept();
      });
      return;
    }
    on_accept(std::move(socket));
    // Takes in what else waits (without blocking): connections wait in the server's order, not the backlog's.
    for (int more = 0; more < 64; ++more) {
      tcp::socket next(io);
      acceptor.accept(next, ec);
      if (ec) break;
      on_accept(std::move(next));
    }
    accept();
  });
}

void HttpServer::Impl::on_accept(tcp::socket socket) {
  if (!make_room()) return;  // every connection is busy: this one is closed as it goes
  beast::error_code ec;
  const auto remote = socket.remote_endpoint(ec);
  if (ec) return;
  const uint64_t id = next_id++;
  auto begin = [&](auto session) {
    std::unique_lock lock(connections_mutex);
    connections.emplace(id, session);
    lock.unlock();
    session->start();
  };
  auto address = remote.address().to_string();
  if (tls) {
    begin(std::make_shared<Session<beast::ssl_stream<beast::tcp_stream>>>(
        *this, id, beast::ssl_stream<beast::tcp_stream>(std::move(socket), *tls), std::move(address), remote.port()));
  } else {
    begin(std::make_shared<Session<beast::tcp_stream>>(*this, id, beast::tcp_stream(std::move(socket)), std::move(address),
                                                       remote.port()));
  }
}

// Every 100 ms: how late the I/O thread is in running a timer is how far it is behind.
void HttpServer::Impl::start_tick() {
  const auto due = Clock::now() + std::chrono::milliseconds(100);
  tick_due = due.time_since_epoch().count();
  tick.expires_at(due);
  tick.async_wait([this](beast::error_code ec) {
    if (!ec) start_tick();
  });
}

HttpServer::HttpServer(HttpServerOptions options) : impl_(std::make_unique<Impl>(std::move(options))) {
  auto& o = impl_->options;
  const size_t files = detail::raise_file_limit();
  impl_->max_connections = std::max<size_t>(16, std::min(o.max_connections, files > 512 ? files - 256 : files / 2));
  if (!o.tls_cert.empty()) {
    try {
      impl_->tls.emplace(asio::ssl::context::tls_server);
      impl_->tls->set_options(asio::ssl::context::default_workarounds | asio::ssl::context::no_sslv2 |
                              asio::ssl::context::no_sslv3 | asio::ssl::context::no_tlsv1 | asio::ssl::context::no_tlsv1_1);
      // TLS 1.2 only with forward-secret key exchanges (TLS 1.3's are), and no renegotiation: a
      // stranger gets one costly step per connection from the server, taken in turn.
      SSL_CTX_set_options(impl_->tls->native_handle(), SSL_OP_NO_RENEGOTIATION);
      if (SSL_CTX_set_cipher_list(impl_->tls->native_handle(), "ECDHE+AESGCM:ECDHE+CHACHA20") != 1) {
        throw std::runtime_error("OpenSSL has none of the ECDHE ciphers");
      }
      impl_->tls->use_certificate_chain_file(o.tls_cert);
      impl_->tls->use_private_key_file(o.tls_key, asio::ssl::context::pem);
      if (SSL_CTX_check_private_key(impl_->tls->native_handle()) != 1) throw std::runtime_error("the key is not the certificate's");
    } catch (const std::exception& e) {
      throw ConfigError("coordinator", fmt::format("cannot load the TLS certificate {} and key {} (PEM files, the key "
                                                   "matching the certificate): {}", o.tls_cert, o.tls_key, e.what()));
    }
  }
  beast::error_code ec;
  tcp::resolver resolver(impl_->io);
  const auto found = resolver.resolve(o.bind, std::to_string(o.port), tcp::resolver::passive | tcp::resolver::numeric_service, ec);
  auto& acceptor = impl_->acceptor;
  if (!ec && found.empty()) ec = asio::error::host_not_found;
  if (!ec) {
    const auto endpoint = found.begin()->endpoint();
    acceptor.open(endpoint.protocol(), ec);
    // Plain SO_REUSEADDR (no SO_REUSEPORT): a second coordinator on the port is an error.
    if (!ec) acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
    if (!ec) acceptor.bind(endpoint, ec);
    if (!ec) acceptor.listen(asio::socket_base::max_listen_connections, ec);
    if (!ec) acceptor.non_blocking(true, ec);
    if (!ec) impl_->port = acceptor.local_endpoint(ec).port();
  }
  if (ec) {
    throw ConfigError("coordinator", fmt::format("cannot listen on {}:{}: {}; hint: choose another --port (cluster.port) or "
                                                 "stop what holds it", o.bind, o.port, ec.message()));
  }
}

HttpServer::~HttpServer() { stop(); }

void HttpServer::route(const std::string& method, const std::string& path, Handler handler) {
  impl_->routes[{method, path}] = std::move(handler);
}

void HttpServer::set_gate(Gate gate) { impl_->gate = std::move(gate); }

int HttpServer::port() const { return impl_->port; }

void HttpServer::start() {
  impl_->pool.start(std::max<size_t>(1, impl_->options.handler_threads));
  impl_->accept();
  impl_->start_tick();
  impl_->io_thread = std::thread([impl = impl_.get()] { impl->io.run(); });
}

void HttpServer::stop() {
  if (!impl_->io_thread.joinable()) return;
  // Gracefully: no new connections; the requests already taken in are handled and their answers
  // written (a worker waiting in a long poll learns how the run ended), for at most 2 s more.
  asio::post(impl_->io, [impl = impl_.get()] {
    beast::error_code ignored;
    impl->acceptor.close(ignored);
  });
  impl_->pool.stop();
  const auto grace = Clock::now() + std::chrono::seconds(2);
  while (impl_->answering.load() > 0 && Clock::now() < grace) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  asio::post(impl_->io, [impl = impl_.get()] {
    impl->tick.cancel();
    impl->retry.cancel();
    std::vector<std::shared_ptr<Connection>> open;
    {
      std::lock_guard lock(impl->connections_mutex);
      for (const auto& [id, weak] : impl->connections) {
        if (auto c = weak.lock()) open.push_back(c);
      }
    }
    for (auto& c : open) c->close();
  });
  impl_->io.stop();
  impl_->io_thread.join();
}

std::chrono::milliseconds HttpServer::behind() const {
  const auto queued = std::chrono::duration_cast<std::chrono::milliseconds>(impl_->pool.oldest_wait());
  const auto due = Clock::time_point(Clock::duration(impl_->tick_due.load()));
  const auto late = impl_->tick_due.load() == 0 ? Clock::duration::zero() : std::max(Clock::duration::zero(), Clock::now() - due);
  return std::max(queued, std::chrono::duration_cast<std::chrono::milliseconds>(late));
}

HttpServer::Counts HttpServer::counts() const {
  Counts c;
  {
    std::lock_guard lock(impl_->connections_mutex);
    c.open = static_cast<int64_t>(impl_->connections.size());
  }
  c.evicted = impl_->evicted;
  c.timed_out = impl_->timed_out;
  c.refused_at_gate = impl_->refused_at_gate;
  c.refused_over_budget = impl_->refused_over_budget;
  std::lock_guard lock(impl_->held_mutex);
  c.held_body_bytes = static_cast<int64_t>(impl_->held_bytes);
  return c;
}

}  // namespace loco::runtime
