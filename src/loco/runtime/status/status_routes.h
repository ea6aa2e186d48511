// The status page's HTTP side (docs/status-page.md), shared by the coordinator and by a DiPaCo
// launch, which has no coordinator: which requests only read the status and may come without a
// signature, the page and its assets, GET /v1/status and GET /metrics, the page's address, and
// StatusServer, a server of the page alone.
#pragma once

#include <nlohmann/json.hpp>

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "loco/runtime/status/dashboard.h"
#include "loco/runtime/net/http_server.h"

namespace loco::runtime {

// Seconds since the Unix epoch: the dashboard's clock, like the workers' events.
double wall_now();

// A request that only reads the run's status: the page and its assets, the JSON API behind it,
// the state workers ask for, and Prometheus' metrics.
bool is_status_read(const HttpRequest& request);
// A status read that needs no signature: from this machine (a loopback address, asking for a
// loopback host or "localhost" in its Host header, so that DNS rebinding cannot lend another
// site's page this machine's address), of the page's static assets (the same in every run), or
// carrying `view_key` (auth::view_key; "" = none) as ?key= or as "Authorization: Bearer" (as
// Prometheus sends it).
bool status_read_open(const HttpRequest& request, const std::string& view_key);

// Why a request a web page could have made is refused, or nullopt. A state-changing request (any
// method but GET and HEAD) carrying a browser's Origin or Sec-Fetch-Site header, or whose body is
// not JSON (a cross-site form may post text/plain or a urlencoded form without asking first), is
// refused: loco's own clients send neither header and post JSON. With `check_host` (a coordinator
// without a join token, whose requests no MAC protects), so is any request whose Host header names
// neither an IP address, "localhost", nor exactly `this_host` (gethostname()): a page whose DNS
// name was rebound to this machine still names its own site.
std::optional<std::string> browser_refusal(const HttpRequest& request, bool check_host, const std::string& this_host);

// What the status routes draw from.
struct StatusSource {
  Dashboard* dashboard = nullptr;
  std::function<nlohmann::json()> run;   // the `run` section: phase, epoch, run_dir, algorithm, ...
  std::function<std::string()> text;     // the plain-text status, for clients that do not ask for HTML
};
// Wraps each handler (the coordinator's authenticates and turns exceptions into answers).
using HandlerWrap = std::function<HttpServer::Handler(HttpServer::Handler)>;
// GET / (the page for a browser, `text` for others), the assets, GET /v1/status and GET /metrics.
void install_status_routes(HttpServer& server, const StatusSource& source, const HandlerWrap& wrap);

// The page's address for a server on `bind`:`port`, with the view key where a reader needs one
// (beyond loopback).
std::string status_page_url(const std::string& bind, int port, bool tls, const std::string& view_key);

// The page without a coordinator (a DiPaCo launch): its own HTTP server answering the status reads
// only, on loopback unless told otherwise; beyond loopback, reads need the view key of `token`.
class StatusServer {
 public:
  // Binds now (ConfigError naming the address when it cannot).
  StatusServer(const std::string& bind, int64_t port, const std::string& token, std::function<nlohmann::json()> run,
               std::function<std::string()> text);
  ~StatusServer();
  Dashboard& dashboard() { return dashboard_; }
  std::string url() const;
  void start();

 private:
  Dashboard dashboard_;
  std::string bind_, view_key_;
  std::unique_ptr<HttpServer> server_;
};

}  // namespace loco::runtime
