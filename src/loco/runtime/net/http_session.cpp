#include "loco/runtime/net/http_server_impl.h"

#include <fmt/format.h>
#include <httplib.h>  // the query-string parser, the one cpp-httplib's own server uses

#include <array>
#include <boost/asio.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <memory>
#include <optional>
#include <type_traits>

namespace loco::runtime {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using Clock = std::chrono::steady_clock;
using detail::Connection;

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
    parser_->body_limit(server_.largest_body());  // the route's own bound is applied once the headers are in
    // One deadline for the whole of the headers, however slowly they trickle in.
    lowest().expires_after(server_.options.header_deadline);
    http::async_read_header(stream_, buffer_, *parser_, [self = this->shared_from_this()](beast::error_code ec, size_t) {
      self->on_header(ec);
    });
  }

  void on_header(beast::error_code ec) {
    if (ec == http::error::header_limit) return refuse(431, "the request's headers are too large");
    if (ec == http::error::body_limit) return too_large({server_.largest_body()});  // its Content-Length says so already
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
    const auto length = parser_->content_length();
    const auto announced = length ? std::optional<uint64_t>(*length) : std::nullopt;
    const auto bound = server_.body_bound(request_, announced);
    if (announced && *announced > bound.max_bytes) return too_large(bound);
    parser_->body_limit(bound.max_bytes);  // a chunked body's
    if (parser_->is_done()) return dispatch();
    // A body still on its way holds a slot, and memory, that a client without the key can hold as
    // well as a member (its well-formed but wrong signature is found out only with the body):
    // evictable, and counted whole against the budgets before a byte of it is read. A wide route's
    // body, admitted on its authentic head, counts against the wide budget.
    const size_t bytes = announced ? static_cast<size_t>(*announced) : bound.max_bytes;
    if (!server_.hold(*this, address, bytes, bound.wide)) {
      ++server_.refused_over_budget;
      return refuse(503, "the server holds as many request bodies as it may; ask again");
    }
    waiting = true;
    waiting_since = Clock::now();
    lowest().expires_after(bound.deadline);
    http::async_read(stream_, buffer_, *parser_, [self = this->shared_from_this()](beast::error_code ec, size_t) {
      self->on_body(ec);
    });
  }

  void on_body(beast::error_code ec) {
    waiting = false;
    if (ec == http::error::body_limit) return too_large({server_.options.max_body_bytes});  // chunked, over its bound
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

  void too_large(const detail::BodyBound& bound) {
    refuse(413, bound.why_not.empty() ? fmt::format("the body is over {} bytes", bound.max_bytes)
                                      : fmt::format("the body is over {} bytes: {}", bound.max_bytes, bound.why_not));
  }

  void refuse(int status, const std::string& why) {
    HttpResponse response;
    response.status = status;
    response.set_content(detail::json_error(why), "application/json");
    write(std::move(response), true);
  }

  void write(HttpResponse response, bool close_after, bool answer = false) {
    waiting = false;
    writing = true;
    writing_since = Clock::now();
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
      self->writing = false;
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
    if (const size_t bytes = held.exchange(0)) server_.release(address, bytes, held_wide);
    held_wide = false;
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

void HttpServer::Impl::on_accept(tcp::socket socket) {
  beast::error_code ec;
  const auto remote = socket.remote_endpoint(ec);
  if (ec) return;
  auto address = remote.address().to_string();
  if (!make_room(address)) return;  // every connection is busy: this one is closed as it goes
  const uint64_t id = next_id++;
  auto begin = [&](auto session) {
    enter(id, session);
    session->start();
  };
  if (tls) {
    begin(std::make_shared<Session<beast::ssl_stream<beast::tcp_stream>>>(
        *this, id, beast::ssl_stream<beast::tcp_stream>(std::move(socket), *tls), std::move(address), remote.port()));
  } else {
    begin(std::make_shared<Session<beast::tcp_stream>>(*this, id, beast::tcp_stream(std::move(socket)), std::move(address),
                                                       remote.port()));
  }
}

}  // namespace loco::runtime
