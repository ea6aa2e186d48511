#include "loco/runtime/coordinator/coordinator.h"

#include <fmt/format.h>
#include <unistd.h>

#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <thread>

#include "loco/comm/key_value.h"
#include "loco/data/dataset.h"
#include "loco/runtime/net/auth.h"
#include "loco/runtime/net/refusal_log.h"
#include "loco/runtime/status/dashboard.h"
#include "loco/runtime/coordinator/async_elastic_run.h"
#include "loco/runtime/coordinator/elastic_run.h"
#include "loco/runtime/net/http_server.h"
#include "loco/runtime/coordinator/fixed_run.h"
#include "loco/runtime/coordinator/outer_service.h"
#include "loco/runtime/coordinator/outer_wire.h"
#include "loco/runtime/coordinator/run.h"
#include "loco/runtime/status/status_routes.h"

namespace loco::runtime {
namespace {

using Clock = std::chrono::steady_clock;
using protocol::Phase;
using protocol::ProtocolError;

constexpr auto kMaxWait = std::chrono::milliseconds(2000);  // longest a request is held
constexpr size_t kMaxKeyBytes = 512;

nlohmann::json body_json(const HttpRequest& request) {
  nlohmann::json body;
  try {
    body = nlohmann::json::parse(request.body);
  } catch (const nlohmann::json::exception&) {
    throw ProtocolError("the request body is not valid JSON");
  }
  // Handlers may copy or dump what they read, which recurses once per level of nesting.
  if (protocol::nested_deeper_than(body, protocol::kMaxJsonDepth)) {
    throw ProtocolError(fmt::format("the request body nests deeper than {} levels", protocol::kMaxJsonDepth));
  }
  return body;
}

std::string key_param(const HttpRequest& request) {
  if (!request.has_param("key")) throw ProtocolError("parameter 'key' is missing");
  auto key = request.param("key");
  if (key.empty() || key.size() > kMaxKeyBytes) throw ProtocolError("parameter 'key' must have 1 to 512 bytes");
  return key;
}

int64_t int_param(const HttpRequest& request, const char* name) {
  if (!request.has_param(name)) throw ProtocolError(fmt::format("parameter '{}' is missing", name));
  try {
    size_t used = 0;
    const auto text = request.param(name);
    const int64_t value = std::stoll(text, &used);
    if (used != text.size()) throw std::invalid_argument(text);
    return value;
  } catch (const std::exception&) {
    throw ProtocolError(fmt::format("parameter '{}' is not an integer", name));
  }
}

void reply_json(HttpResponse& response, const nlohmann::json& body, int status = 200) {
  response.status = status;
  response.set_content(protocol::to_wire(body), "application/json");
}

auth::SignatureHeaders signature_headers(const HttpRequest& request) {
  return {request.header(auth::kTimeHeader), request.header(auth::kNonceHeader), request.header(auth::kMacHeader),
          request.header(auth::kInstanceHeader), request.header(auth::kHeadMacHeader)};
}

// Raised by a handler's authentication check: answered 401.
class Unauthenticated : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace

// The HTTP server, the lock and the key-value store; everything that depends on the kind of run is
// the Run's (fixed_run.h, elastic_run.h), called under the lock. Every call that may change the
// run wakes the requests waiting on `changed`.
struct Coordinator::Impl {
  explicit Impl(CoordinatorOptions o) : options(std::move(o)), identity(options.config, options.dataset) {
    // Every event the coordinator logs also goes on the status page's timeline.
    user_log = options.log;
    options.log = [this, user = options.log](const std::string& text) {
      dashboard.note(text, wall_now());
      if (user) user(text);
    };
    if (!options.token.empty()) view_key = auth::view_key(options.token);
    if (options.config.sync.async) {
      outer = std::make_unique<OuterService>(options.config, options.dataset ? options.dataset->vocab_size : 0, options.resume,
                                             options.log, [this] { return outer_refusal(); });
    }
    if (options.config.cluster.elastic && outer) {
      run = std::make_unique<AsyncElasticRun>(options, status, identity, outer->server());
    } else if (options.config.cluster.elastic) {
      auto run_kind = std::make_unique<ElasticRun>(options, status, identity);
      elastic = run_kind.get();
      run = std::move(run_kind);
    } else {
      run = std::make_unique<FixedRun>(options, status, identity, outer ? &outer->server() : nullptr);
    }
  }

  CoordinatorOptions options;
  std::function<void(const std::string&)> user_log;  // the caller's, without the timeline
  Dashboard dashboard;
  std::string view_key;  // the status page's read-only key, when the run has a token
  std::unique_ptr<HttpServer> server;
  comm::MemoryKeyValueStore store;
  std::optional<auth::Verifier> verifier;  // when the run has a token
  std::unique_ptr<OuterService> outer;  // asynchronous DiLoCo's outer state (sync.async)

  // Refused requests are logged at most once per address every 10 s, with a count of the others,
  // so that a flood of them cannot flood the log.
  const std::string this_host = [] {
    char name[256] = {};
    return ::gethostname(name, sizeof name - 1) == 0 ? std::string(name) : std::string();
  }();
  std::mutex refused_mutex;
  RefusalLog refused;  // which refusals are logged (refusal_log.h)
  void log_refused(const HttpRequest& request, const std::string& why) {
    std::optional<RefusalLog::Line> line;
    {
      std::lock_guard lock(refused_mutex);
      line = refused.admit(request.remote_addr, RefusalLog::Clock::now());
    }
    if (!line) return;
    std::string counts;
    if (line->from_address > 1) counts += fmt::format(" ({} refused from this address since its last report)", line->from_address);
    if (line->elsewhere > 0) counts += fmt::format(" ({} more refused from other addresses, not logged)", line->elsewhere);
    // To the caller's log, and to the timeline under its own quota (a flood displaces only itself).
    const auto text = fmt::format("refused {} {} from {}:{}: {}{}", request.method, request.path, request.remote_addr,
                                  request.remote_port, why, counts);
    dashboard.note_refusal(text, wall_now());
    if (user_log) user_log(text);
  }

  bool open_read(const HttpRequest& request) const { return status_read_open(request, view_key); }

  // The address of the status page, with the view key where one is needed.
  std::string page_url() const {
    return status_page_url(options.bind, server->port(), !options.tls_cert.empty(), view_key);
  }

  // The coordinator's state with what the page shows of the run's config.
  nlohmann::json page_state() const {
    std::lock_guard lock(mutex);
    auto state = state_locked();
    state.update({{"run_dir", options.config.run.dir}, {"algorithm", to_string(options.config.sync.algorithm)},
                  {"steps", options.config.train.steps}});
    return state;
  }

  // The full check of a request's signature, once its body is in (the pre-routing handler has
  // refused those without one already). Whether the request was signed and authentic (then its
  // answer is signed): an open status read without a signature is let through unsigned, and one
  // with a signature is checked like any other.
  bool authenticate(const HttpRequest& request) {
    if (!verifier) return false;
    if (open_read(request) && request.header(auth::kMacHeader) == nullptr) return false;
    if (auto why = verifier->verify(request.method, request.target, request.body, signature_headers(request),
                                    auth::unix_now())) {
      throw Unauthenticated(*why);
    }
    return true;
  }

  mutable std::mutex mutex;
  std::condition_variable changed;
  RunStatus status;
  RunIdentity identity;
  std::unique_ptr<Run> run;
  ElasticRun* elastic = nullptr;  // `run`, when the run is elastic with rounds (not asynchronous DiLoCo's)

  // Idempotent /v1/kv/add: the answers to the last kAddsRemembered request ids, so that a client's
  // retry (its answer was lost) is answered again rather than applied twice.
  static constexpr size_t kAddsRemembered = 4096;
  std::mutex added_mutex;
  std::map<std::string, int64_t> added;
  std::deque<std::string> added_order;
  void remember_add(const std::string& id, int64_t value) {
    added.emplace(id, value);
    added_order.push_back(id);
    if (added_order.size() > kAddsRemembered) {
      added.erase(added_order.front());
      added_order.pop_front();
    }
  }

  void log(const std::string& line) const {
    if (options.log) options.log(line);
  }

  ElasticRun& elastic_run() {
    if (elastic == nullptr) throw ProtocolError("this run has no rounds (cluster.elastic = false, or sync.async)");
    return *elastic;
  }

  protocol::JoinReply join(const protocol::JoinRequest& request) {
    RunConfig theirs;
    try {
      theirs = parse_config(request.config_toml, "the worker's config");
    } catch (const ConfigError& e) {
      throw Refusal(fmt::format("{}'s config is invalid: {}", request.name, e.what()));
    }
    std::lock_guard lock(mutex);
    run->check_start(Clock::now());
    auto reply = run->join(request, theirs);
    changed.notify_all();
    return reply;
  }

  nlohmann::json state_locked() const {
    nlohmann::json state = {{"phase", protocol::to_string(status.phase())}, {"stopping", status.stopping()},
                            {"reason", status.reason()}, {"epoch", 0}, {"workers", run->workers()},
                            {"run_id", status.run_id()}};
    state.update(run->describe());
    return state;
  }

  // Wraps a handler: protocol errors are the peer's (400), refusals are answers (409; 410 once the
  // training is complete); any other exception is logged and answered 500. The coordinator keeps
  // serving the others either way.
  template <class F>
  HttpServer::Handler guard(F&& handler) {
    return [this, handler](const HttpRequest& request, HttpResponse& response) {
      bool authenticated = false;
      try {
        authenticated = authenticate(request);
        handler(request, response);
      } catch (const Unauthenticated& e) {
        log_refused(request, e.what());
        reply_json(response, {{"error", e.what()}}, 401);
      } catch (const Full& e) {
        reply_json(response, {{"error", e.what()}}, 503);  // asked again until a slot frees: not logged each time
      } catch (const Completed& e) {
        log(fmt::format("refused {} from {}: {}", request.path, request.remote_addr, e.what()));
        reply_json(response, {{"error", e.what()}}, 410);
      } catch (const Refusal& e) {
        log(fmt::format("refused {} from {}: {}", request.path, request.remote_addr, e.what()));
        reply_json(response, {{"error", e.what()}}, 409);
      } catch (const ProtocolError& e) {
        log(fmt::format("bad request {} from {}: {}", request.path, request.remote_addr, e.what()));
        reply_json(response, {{"error", e.what()}}, 400);
      } catch (const std::exception& e) {
        log(fmt::format("request {} from {} failed: {}", request.path, request.remote_addr, e.what()));
        reply_json(response, {{"error", e.what()}}, 500);
      }
      // The answer to an authentic request is signed for that request (auth.h); a refusal is not,
      // so that nobody obtains a signed answer for a nonce of their choosing.
      if (authenticated) {
        response.authentic = true;
        response.headers.emplace_back(auth::kAnswerMacHeader, auth::answer_mac(verifier->key(), *request.header(auth::kNonceHeader),
                                                                               response.status, response.body));
      }
    };
  }

  void install_routes() {
    install_run_routes();
    install_elastic_routes();
    install_store_routes();
    install_outer_route();
    install_status_routes();
  }

  // The status page (docs/status-page.md): the page and its assets, the JSON it polls, Prometheus'
  // metrics, and the workers' telemetry that feeds them.
  void install_status_routes() {
    const StatusSource source{&dashboard, [this] { return page_state(); }, [this] { return status_text(); }};
    runtime::install_status_routes(*server, source, [this](HttpServer::Handler handler) { return guard(std::move(handler)); });
    server->route("POST", "/v1/telemetry", guard([this](const auto& request, auto& response) {
      dashboard.report(body_json(request), wall_now());
      reply_json(response, {{"ok", true}});
    }));
  }

  // The plain-text status, for clients that do not ask for the page (curl).
  std::string status_text() const {
    std::lock_guard lock(mutex);
    std::string text = fmt::format("loco coordinator, run {} ({})\nphase: {}{}\n{} workers\n", options.config.run.dir,
                                   status.run_id(), protocol::to_string(status.phase()),
                                   status.stopping() ? " (stopping: " + status.reason() + ")" : "", run->workers());
    for (const auto& line : run->status_lines()) text += "  " + line + "\n";
    return text;
  }

  // Joining, starting, stopping and ending: every run.
  void install_run_routes() {
    server->route("POST", "/v1/join", guard([this](const auto& request, auto& response) {
      reply_json(response, join(protocol::JoinRequest::from_json(body_json(request))).to_json());
    }));
    server->route("POST", "/v1/start", guard([this](const auto& request, auto& response) {
      const auto body = body_json(request);
      if (!body.is_object() || !body.contains("rank") || !body["rank"].is_number_integer()) {
        throw ProtocolError("field 'rank' is missing or not an integer");
      }
      const int64_t rank = body["rank"].template get<int64_t>();
      std::unique_lock lock(mutex);
      run->check_start(Clock::now());
      changed.wait_for(lock, kMaxWait, [&] { return status.phase() != Phase::kWaiting; });
      run->check_start(Clock::now());
      reply_json(response, run->start_reply(rank).to_json());
    }));
    server->route("POST", "/v1/stop", guard([this](const auto& request, auto& response) {
      const auto body = body_json(request);
      const std::string why = body.is_object() && body.contains("reason") && body["reason"].is_string()
                                  ? body["reason"].template get<std::string>().substr(0, 1024)
                                  : "a worker asked";
      std::lock_guard lock(mutex);
      if (!status.stopping()) log("stopping: " + why);
      status.stop(why);
      reply_json(response, {{"stopping", true}});
    }));
    server->route("GET", "/v1/state", guard([this](const auto&, auto& response) {
      std::lock_guard lock(mutex);
      reply_json(response, state_locked());
    }));
    server->route("POST", "/v1/done", guard([this](const auto& request, auto& response) {
      const auto body = protocol::DoneRequest::from_json(body_json(request));
      std::lock_guard lock(mutex);
      run->done(body);
      changed.notify_all();
      reply_json(response, {{"ok", true}});
    }));
  }

  // Why asynchronous DiLoCo's exchanges are refused: the run is stopping or failed.
  std::optional<std::string> outer_refusal() const {
    std::lock_guard lock(mutex);
    if (!status.stopping() && status.phase() != Phase::kFailed) return std::nullopt;
    return status.reason().empty() ? std::string("the run is stopping") : "the run is stopping: " + status.reason();
  }

  // Asynchronous DiLoCo (sync.async): POST /v1/outer.
  void install_outer_route() {
    if (outer) outer->install(*server, [this](HttpServer::Handler handler) { return guard(std::move(handler)); });
  }

  // Heartbeats (elastic runs) and rounds (ElasticRun, over the MembershipTable).
  void install_elastic_routes() {
    server->route("POST", "/v1/heartbeat", guard([this](const auto& request, auto& response) {
      const auto body = protocol::HeartbeatRequest::from_json(body_json(request));
      std::lock_guard lock(mutex);
      const auto reply = run->heartbeat(body, Clock::now());
      changed.notify_all();
      reply_json(response, reply.to_json());
    }));
    server->route("POST", "/v1/round", guard([this](const auto& request, auto& response) {
      const auto body = protocol::RoundRequest::from_json(body_json(request));
      std::unique_lock lock(mutex);
      auto& run = elastic_run();
      const auto deadline = Clock::now() + kMaxWait;
      for (;;) {
        const auto reply = run.arrive(body, Clock::now());
        changed.notify_all();
        if (reply.action != protocol::RoundAction::kWait || Clock::now() >= deadline) {
          reply_json(response, reply.to_json());
          return;
        }
        changed.wait_until(lock, std::min(deadline, Clock::now() + std::chrono::milliseconds(200)));
      }
    }));
    server->route("POST", "/v1/round_done", guard([this](const auto& request, auto& response) {
      const auto body = protocol::RoundDone::from_json(body_json(request));
      std::lock_guard lock(mutex);
      const bool accepted = elastic_run().round_done(body, Clock::now());
      changed.notify_all();
      reply_json(response, {{"ok", accepted}});
    }));
  }

  // The rendezvous store through which the workers form their process groups.
  void install_store_routes() {
    server->route("POST", "/v1/kv/set", guard([this](const auto& request, auto& response) {
      try {
        store.set(key_param(request), request.body);
      } catch (const Error& e) {
        throw ProtocolError(e.what());  // over a limit
      }
      reply_json(response, {{"ok", true}});
    }));
    server->route("GET", "/v1/kv/get", guard([this](const auto& request, auto& response) {
      const auto key = key_param(request);
      const auto wait = std::clamp<int64_t>(int_param(request, "wait_ms"), 0, kMaxWait.count());
      auto value = store.get(key, std::chrono::milliseconds(wait));
      if (!value) {
        reply_json(response, {{"error", "not set"}}, 404);
        return;
      }
      response.set_content(*value, "application/octet-stream");
    }));
    server->route("POST", "/v1/kv/add", guard([this](const auto& request, auto& response) {
      const auto key = key_param(request);
      const int64_t delta = int_param(request, "delta");
      const auto id = request.param("request");
      if (id.size() > 64) throw ProtocolError("parameter 'request' must have at most 64 bytes");
      std::lock_guard lock(added_mutex);
      if (auto it = added.find(id); !id.empty() && it != added.end()) {
        reply_json(response, {{"value", it->second}});  // a retry: applied once already
        return;
      }
      int64_t value = 0;
      try {
        value = store.add(key, delta);
      } catch (const Error& e) {
        throw ProtocolError(e.what());
      }
      if (!id.empty()) remember_add(id, value);
      reply_json(response, {{"value", value}});
    }));
    server->route("POST", "/v1/kv/check", guard([this](const auto& request, auto& response) {
      const auto body = body_json(request);
      std::vector<std::string> keys;
      try {
        keys = body.template get<std::vector<std::string>>();
      } catch (const nlohmann::json::exception&) {
        throw ProtocolError("the body must be a JSON array of keys");
      }
      reply_json(response, {{"ok", store.check(keys)}});
    }));
    server->route("POST", "/v1/kv/remove", guard([this](const auto& request, auto& response) {
      reply_json(response, {{"removed", store.remove(key_param(request))}});
    }));
    server->route("GET", "/v1/kv/size", guard([this](const auto&, auto& response) { reply_json(response, {{"size", store.size()}}); }));
  }
};

Coordinator::Coordinator(CoordinatorOptions options) : impl_(std::make_unique<Impl>(std::move(options))) {
  const auto& o = impl_->options;
  if (o.token.empty() && !o.insecure && !auth::is_loopback(o.bind)) {
    throw ConfigError("coordinator", fmt::format(
        "refusing to listen on {} without a join token: anyone who can reach the port could stop the run or rewrite the "
        "rendezvous its workers connect through; hint: set LOCO_JOIN_TOKEN (or cluster.join_token) on every host, or "
        "--bind 127.0.0.1, or pass --insecure on a network you trust", o.bind));
  }
  HttpServerOptions http;
  http.bind = o.bind;
  http.port = o.port;
  http.tls_cert = o.tls_cert;
  http.tls_key = o.tls_key;
  http.handler_threads = static_cast<size_t>(std::max<int64_t>(8, 2 * impl_->run->workers() + 4));
  if (impl_->outer) protocol::widen_for_outer_exchanges(http, o.config, o.dataset ? o.dataset->vocab_size : 0);
  impl_->server = std::make_unique<HttpServer>(http);
  if (!o.token.empty()) impl_->verifier.emplace(o.token);
  // Requests without a well-formed, fresh signature are refused before their bodies are read.
  impl_->server->set_gate([this](const HttpRequest& request) -> std::optional<HttpResponse> {
    auto& impl = *impl_;
    // What a web page could send is refused in every mode; without a token no MAC guards the
    // rest, so the Host header must name this machine too (status_routes.h).
    if (auto why = browser_refusal(request, !impl.verifier, impl.this_host)) {
      impl.log_refused(request, *why);
      HttpResponse refusal;
      reply_json(refusal, {{"error", *why}}, 403);
      return refusal;
    }
    // A status read has no body: one that announces a body would hold a connection while it
    // trickles in, unauthenticated; it is refused before a byte of it is read.
    if (impl.open_read(request) && request.header(auth::kMacHeader) == nullptr) {
      const auto* length = request.header("Content-Length");
      if ((length != nullptr && *length != "0") || request.header("Transfer-Encoding") != nullptr) {
        HttpResponse refusal;
        reply_json(refusal, {{"error", "a status read carries no body"}}, 400);
        return refusal;
      }
      return std::nullopt;
    }
    if (!impl.verifier) return std::nullopt;
    const auto headers = signature_headers(request);
    auto why = impl.verifier->precheck(headers, auth::unix_now());
    if (!why) return std::nullopt;
    // A signed request for no instance is a worker's first: it is told the instance, as every
    // refusal here tells it, and asks again; that is not worth a line in the log.
    if (headers.instance != nullptr || headers.mac == nullptr) impl.log_refused(request, *why);
    HttpResponse refusal;
    reply_json(refusal, {{"error", *why}}, 401);
    refusal.headers.emplace_back(auth::kInstanceHeader, impl.verifier->instance());
    return refusal;
  });
  // A body larger than the server's default bound (an asynchronous run's outer gradient) is read
  // only when the request's head is signed: a stranger's stays within the documented bounds.
  if (impl_->verifier) {
    impl_->server->set_wide_gate([this](const HttpRequest& request, uint64_t bytes) -> std::optional<std::string> {
      auto why = impl_->verifier->verify_head(request.method, request.target, bytes, signature_headers(request), auth::unix_now());
      if (why) impl_->log_refused(request, *why);
      return why;
    });
  }
  impl_->install_routes();
}

Coordinator::~Coordinator() {
  if (impl_->outer) impl_->outer->close();  // no handler waits on a batch nobody will complete
  impl_->server->stop();
  if (impl_->outer) impl_->outer->save(true);  // what the last exchanges brought, for a resume
}

int64_t Coordinator::port() const { return impl_->server->port(); }

void Coordinator::start() {
  impl_->server->start();
  const auto& o = impl_->options;
  impl_->log(fmt::format("listening on {}://{}:{} for {} worker(s) of {}{}", o.tls_cert.empty() ? "http" : "https", o.bind,
                         impl_->server->port(), impl_->run->workers(), o.config.run.dir,
                         o.token.empty() ? "; no join token: requests are not authenticated" : "; requests are signed with the join token"));
  // The address with its view key is for whoever started the coordinator; the timeline, which any
  // local user may read over loopback, gets it without the key.
  impl_->dashboard.note(fmt::format("status page: {}", status_page_url(o.bind, impl_->server->port(), !o.tls_cert.empty(), "")),
                        wall_now());
  if (impl_->user_log) impl_->user_log(fmt::format("status page: {}", impl_->page_url()));
}

std::string Coordinator::page_url() const { return impl_->page_url(); }

void Coordinator::process_started(int64_t rank, const std::string& host, int64_t pid) {
  impl_->dashboard.process_started(rank, host, pid, wall_now());
}

std::optional<CoordinatorResult> Coordinator::wait_for(std::chrono::milliseconds timeout) {
  std::unique_lock lock(impl_->mutex);
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    if (!impl_->status.ended()) {
      impl_->run->hold_off(impl_->server->behind(), Clock::now());
      impl_->run->check_start(Clock::now());
      impl_->run->check_end(Clock::now());
      impl_->changed.notify_all();
    }
    if (impl_->status.ended()) return impl_->run->result();
    if (Clock::now() >= deadline) return std::nullopt;
    impl_->changed.wait_for(lock, std::min<Clock::duration>(std::chrono::milliseconds(200), deadline - Clock::now()));
  }
}

void Coordinator::request_stop(const std::string& reason) {
  std::lock_guard lock(impl_->mutex);
  if (!impl_->status.stopping()) impl_->log("stopping: " + reason);
  impl_->status.stop(reason);
}

void Coordinator::process_exited(const std::string& host, int64_t pid, int status, bool failed) {
  impl_->dashboard.process_exited(host, pid, status, failed, wall_now());
  std::lock_guard lock(impl_->mutex);
  if (!failed) return;
  impl_->run->process_exited(host, pid, status, Clock::now());
  impl_->changed.notify_all();
}

void Coordinator::fail(const std::string& reason) {
  std::lock_guard lock(impl_->mutex);
  if (impl_->elastic != nullptr) {
    impl_->elastic->fail(reason);
  } else if (impl_->status.fail(reason)) {
    impl_->log("run failed: " + reason);
  }
  impl_->changed.notify_all();
}

nlohmann::json Coordinator::state() const {
  std::lock_guard lock(impl_->mutex);
  return impl_->state_locked();
}

CoordinatorOptions standalone_coordinator_options(const RunConfig& config, const std::string& bind, bool insecure,
                                                  int64_t port, bool resume) {
  CoordinatorOptions options;
  const auto user_token = join_token(config.cluster);
  options.bind = !bind.empty() ? bind : user_token.empty() ? "127.0.0.1" : "0.0.0.0";
  options.insecure = insecure;
  options.token = auth::coordinator_token(user_token, config.run.dir, options.bind, insecure);
  options.tls_cert = config.cluster.tls_cert;
  options.tls_key = config.cluster.tls_key;
  options.port = port > 0 ? port : config.cluster.port;
  options.config = config;
  options.resume = resume;
  if (std::filesystem::exists(std::filesystem::path(config.data.dir) / "manifest.json")) {
    options.dataset = protocol::DatasetIdentity::of(data::read_manifest(config.data.dir));
  }
  return options;
}

}  // namespace loco::runtime
