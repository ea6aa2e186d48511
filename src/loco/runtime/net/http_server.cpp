#include "loco/runtime/net/http_server.h"

#include <fmt/format.h>
#include <openssl/ssl.h>
#include <strings.h>

#include <atomic>
#include <boost/asio.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <mutex>
#include <thread>
#include <vector>

#include "loco/core/error.h"
#include "loco/runtime/net/http_server_impl.h"

namespace loco::runtime {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
using tcp = asio::ip::tcp;
using Clock = std::chrono::steady_clock;

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

void HttpServer::set_wide_gate(WideGate gate) { impl_->wide_gate = std::move(gate); }

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
    std::vector<std::shared_ptr<detail::Connection>> open;
    {
      std::lock_guard lock(impl->connections_mutex);
      for (const auto& [id, entry] : impl->connections) {
        if (auto c = entry.connection.lock()) open.push_back(c);
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
  c.held_body_bytes = static_cast<int64_t>(impl_->held_bytes + impl_->held_wide_bytes);
  return c;
}

}  // namespace loco::runtime
