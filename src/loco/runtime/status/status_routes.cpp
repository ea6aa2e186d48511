#include "loco/runtime/status/status_routes.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <unistd.h>

#include <chrono>

#include "loco/core/error.h"
#include "loco/runtime/net/auth.h"
#include "loco/runtime/net/wire.h"
#include "loco/runtime/status/web_assets.h"

namespace loco::runtime {
namespace {

// Headers of the page and its assets: nothing but this origin may be loaded or framed.
void page_headers(HttpResponse& response) {
  response.headers = {{"Content-Security-Policy", "default-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
                                                   "frame-ancestors 'none'; base-uri 'none'; form-action 'none'"},
                      {"X-Content-Type-Options", "nosniff"}, {"Referrer-Policy", "no-referrer"}, {"Cache-Control", "no-store"}};
}

}  // namespace

double wall_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

bool is_status_read(const HttpRequest& request) {
  return request.method == "GET" && (request.path == "/" || request.path == "/v1/state" || request.path == "/v1/status" ||
                                     request.path == "/metrics" || request.path.starts_with("/assets/"));
}

// Whether the request names this machine as the host it asked for (its Host header): a page on
// another site that rebinds its DNS name to 127.0.0.1 still sends its own name.
// The host a request's Host header names, without its port or an IPv6 literal's brackets.
std::optional<std::string> requested_host(const HttpRequest& request) {
  const auto* header = request.header("Host");
  if (header == nullptr) return std::nullopt;
  std::string host = *header;
  if (host.starts_with("[")) {
    host = host.substr(1, host.find(']') == std::string::npos ? std::string::npos : host.find(']') - 1);
  } else if (auto colon = host.rfind(':'); colon != std::string::npos) {
    host.resize(colon);
  }
  return host;
}

bool asks_for_local_host(const HttpRequest& request) {
  const auto host = requested_host(request);
  return host && (*host == "localhost" || auth::is_loopback(*host));
}

std::optional<std::string> browser_refusal(const HttpRequest& request, bool check_host, const std::string& this_host) {
  if (request.method != "GET" && request.method != "HEAD") {
    if (request.header("Origin") != nullptr || request.header("Sec-Fetch-Site") != nullptr) {
      return "a request from a web page (it carries Origin or Sec-Fetch-Site): refused, loco's clients send neither";
    }
    const auto* type = request.header("Content-Type");
    if (type == nullptr || !type->starts_with("application/json")) {
      return "a state-changing request must carry a JSON body (Content-Type: application/json)";
    }
  }
  if (!check_host) return std::nullopt;
  const auto named = requested_host(request);
  if (!named) return "the request names no Host";
  const std::string& host = *named;
  in_addr v4{};
  in6_addr v6{};
  if (host == "localhost" || ::inet_pton(AF_INET, host.c_str(), &v4) == 1 || ::inet_pton(AF_INET6, host.c_str(), &v6) == 1) {
    return std::nullopt;
  }
  // This machine's name exactly (a prefix would let `<name>.attacker.example` rebind to it), with
  // or without a final dot.
  if (!this_host.empty() && (host == this_host || host == this_host + ".")) return std::nullopt;
  return fmt::format("the request's Host header names neither an IP address, localhost nor this machine ('{}'): a web "
                     "page whose DNS name was rebound here? hint: reach the coordinator by its IP address or by '{}'",
                     this_host, this_host);
}

bool status_read_open(const HttpRequest& request, const std::string& view_key) {
  if (!is_status_read(request)) return false;
  if (request.path.starts_with("/assets/")) return true;
  if (auth::is_loopback(request.remote_addr) && asks_for_local_host(request)) return true;
  std::string offered = request.param("key");
  if (const auto* authorization = request.header("Authorization"); authorization != nullptr && authorization->starts_with("Bearer ")) {
    offered = authorization->substr(7);
  }
  return !view_key.empty() && auth::same_key(offered, view_key);
}

void install_status_routes(HttpServer& server, const StatusSource& source, const HandlerWrap& wrap) {
  for (const auto* asset : web_assets()) {
    if (asset->path == "/") continue;
    server.route("GET", std::string(asset->path), wrap([asset](const HttpRequest&, HttpResponse& response) {
      response.set_content(std::string(asset->content), std::string(asset->content_type));
      page_headers(response);
    }));
  }
  server.route("GET", "/v1/status", wrap([source](const HttpRequest&, HttpResponse& response) {
    response.set_content(wire::to_wire(source.dashboard->status(source.run(), wall_now())), "application/json");
    response.headers = {{"Cache-Control", "no-store"}};
  }));
  server.route("GET", "/metrics", wrap([source](const HttpRequest&, HttpResponse& response) {
    response.set_content(source.dashboard->prometheus(source.run(), wall_now()), "text/plain; version=0.0.4; charset=utf-8");
  }));
  // A browser gets the page; curl and scripts the plain-text status.
  server.route("GET", "/", wrap([source](const HttpRequest& request, HttpResponse& response) {
    const auto* accept = request.header("Accept");
    if (accept != nullptr && accept->find("text/html") != std::string::npos) {
      const auto* page = find_web_asset("/");
      response.set_content(std::string(page->content), std::string(page->content_type));
      page_headers(response);
      return;
    }
    response.set_content(source.text(), "text/plain");
  }));
}

std::string status_page_url(const std::string& bind, int port, bool tls, const std::string& view_key) {
  std::string host = bind;
  if (host == "0.0.0.0" || host == "::") {
    char name[256] = {};
    host = ::gethostname(name, sizeof name - 1) == 0 ? name : "localhost";
  }
  if (host.find(':') != std::string::npos) host = "[" + host + "]";
  const bool key = !view_key.empty() && !auth::is_loopback(bind);
  return fmt::format("{}://{}:{}/{}", tls ? "https" : "http", host, port, key ? "?key=" + view_key : "");
}

StatusServer::StatusServer(const std::string& bind, int64_t port, const std::string& token, std::function<nlohmann::json()> run,
                           std::function<std::string()> text)
    : bind_(bind), view_key_(token.empty() ? "" : auth::view_key(token)) {
  HttpServerOptions http;
  http.bind = bind;
  http.port = port;
  http.handler_threads = 4;
  server_ = std::make_unique<HttpServer>(http);
  // Only status reads are served, and beyond loopback only with the view key.
  server_->set_gate([this](const HttpRequest& request) -> std::optional<HttpResponse> {
    if (status_read_open(request, view_key_)) return std::nullopt;
    HttpResponse refusal;
    refusal.status = is_status_read(request) ? 401 : 404;
    refusal.set_content(wire::to_wire({{"error", refusal.status == 401 ? "the status page needs its view key from this address"
                                                                          : "not found"}}),
                        "application/json");
    return refusal;
  });
  auto wrap = [](HttpServer::Handler handler) -> HttpServer::Handler {
    return [handler](const HttpRequest& request, HttpResponse& response) {
      try {
        handler(request, response);
      } catch (const std::exception& e) {
        response.status = 500;
        response.set_content(wire::to_wire({{"error", e.what()}}), "application/json");
      }
    };
  };
  install_status_routes(*server_, {&dashboard_, std::move(run), std::move(text)}, wrap);
}

StatusServer::~StatusServer() { server_->stop(); }

std::string StatusServer::url() const { return status_page_url(bind_, server_->port(), false, view_key_); }

void StatusServer::start() { server_->start(); }

}  // namespace loco::runtime
