#include "loco/runtime/coordinator/coordinator_client.h"

#include <fmt/format.h>

#include <random>
#include <thread>

#include "loco/core/error.h"
#include "loco/core/run_folder.h"

namespace loco::runtime {
namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

std::string percent_encode(const std::string& text) {
  std::string out;
  for (unsigned char c : text) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~' || c == '/') {
      out += static_cast<char>(c);
    } else {
      out += fmt::format("%{:02X}", c);
    }
  }
  return out;
}

// comm::KeyValueStore over the coordinator's /v1/kv endpoints. Waits are polled in slices of at
// most 2 s (the coordinator holds a request no longer), up to the caller's timeout.
class HttpKeyValueStore final : public comm::KeyValueStore {
 public:
  explicit HttpKeyValueStore(CoordinatorClient& client) : client_(client) {}

  void set(const std::string& key, const std::string& value) override {
    expect_ok(client_.request("POST", "/v1/kv/set?key=" + percent_encode(key), value, 10s), "set");
  }
  std::optional<std::string> get(const std::string& key, comm::Duration timeout) override {
    const auto deadline = Clock::now() + timeout;
    while (true) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      const auto slice = std::clamp<int64_t>(left.count(), 0, 2000);
      auto [status, body] = client_.request(
          "GET", fmt::format("/v1/kv/get?key={}&wait_ms={}", percent_encode(key), slice), "", std::chrono::milliseconds(slice) + 10s);
      if (status == 200) return body;
      if (status != 404) throw PeerError("coordinator", fmt::format("store get '{}': HTTP {}: {}", key, status, error_text(body)));
      if (Clock::now() >= deadline) return std::nullopt;
    }
  }
  int64_t add(const std::string& key, int64_t delta) override {
    // One request id for the call and all its retries: the coordinator applies it once (a retry
    // after a lost answer gets the first answer again).
    const std::string id = fmt::format("{:016x}", std::random_device{}() * (uint64_t{1} << 32) + std::random_device{}());
    auto body = expect_ok(client_.request("POST", fmt::format("/v1/kv/add?key={}&delta={}&request={}", percent_encode(key),
                                                              delta, id), "", 10s), "add");
    return nlohmann::json::parse(body).at("value").get<int64_t>();
  }
  bool check(const std::vector<std::string>& keys) override {
    auto body = expect_ok(client_.request("POST", "/v1/kv/check", nlohmann::json(keys).dump(), 10s), "check");
    return nlohmann::json::parse(body).at("ok").get<bool>();
  }
  bool remove(const std::string& key) override {
    auto body = expect_ok(client_.request("POST", "/v1/kv/remove?key=" + percent_encode(key), "", 10s), "remove");
    return nlohmann::json::parse(body).at("removed").get<bool>();
  }
  int64_t size() override {
    auto body = expect_ok(client_.request("GET", "/v1/kv/size", "", 10s), "size");
    return nlohmann::json::parse(body).at("size").get<int64_t>();
  }

 private:
  static std::string expect_ok(std::pair<int, std::string> reply, const char* what) {
    if (reply.first != 200) {
      throw PeerError("coordinator", fmt::format("store {}: HTTP {}: {}", what, reply.first, error_text(reply.second)));
    }
    return std::move(reply.second);
  }
  CoordinatorClient& client_;
};

}  // namespace

ClientSecurity client_security(const RunConfig& config, bool insecure) {
  ClientSecurity s;
  s.insecure = insecure;
  s.token = auth::resolve_token(join_token(config.cluster), config.run.dir);
  if (s.token.empty() && join_token(config.cluster).empty()) s.token_file = RunFolder(config.run.dir).join_token();
  s.tls_ca = config.cluster.tls_ca.empty() ? config.cluster.tls_cert : config.cluster.tls_ca;
  s.tls = !s.tls_ca.empty();
  return s;
}

CoordinatorClient::CoordinatorClient(const std::string& address, std::chrono::milliseconds connect_timeout,
                                     ClientSecurity security)
    : http_("coordinator", address, std::move(security)), connect_timeout_(connect_timeout) {}

CoordinatorClient::~CoordinatorClient() = default;

protocol::JoinReply CoordinatorClient::join(const protocol::JoinRequest& join_request,
                                            std::chrono::milliseconds wait_for_slot,
                                            const std::function<void(const std::string&)>& waiting) {
  auto tries_from = Clock::now();
  auto deadline = tries_from + connect_timeout_;
  const auto slot_deadline = Clock::now() + wait_for_slot;
  bool told = false;
  auto backoff = 200ms;
  std::string last_error, unsigned_refusal;
  while (true) {
    auto reply = http_.attempt("POST", "/v1/join", join_request.to_json().dump(), 30s, last_error);
    bool refused_unsigned = false;  // this try's answer
    if (reply) {
      if (reply->first == 200) return protocol::JoinReply::from_json(nlohmann::json::parse(reply->second));
      if (reply->first == 410) throw RunComplete(error_text(reply->second));
      if (reply->first == 409) throw ConfigError("coordinator", fmt::format("refused to join: {}", error_text(reply->second)));
      if (reply->first == 401) {
        // Unsigned, and this worker has no token to check it with: whoever holds the port could
        // send it to end the worker with a text of its choosing (issue #69, M2). So it is not
        // believed at once: asked again until cluster.connect_timeout_s, and then named as what it is.
        unsigned_refusal = error_text(reply->second);
        refused_unsigned = true;
      } else if (reply->first == 503) {
        if (Clock::now() + backoff > slot_deadline) {
          throw ConfigError("coordinator", fmt::format("refused to join: {} (waited {:.0f} s for a slot to free; "
                                                       "cluster.join_timeout_s)", error_text(reply->second),
                                                       std::chrono::duration<double>(wait_for_slot).count()));
        }
        if (!told && waiting) {
          waiting(fmt::format("{}; waiting up to {:.0f} s for a member to fail or leave", error_text(reply->second),
                              std::chrono::duration<double>(wait_for_slot).count()));
        }
        told = true;
        tries_from = Clock::now();  // the coordinator answers: reaching it is not the problem
        deadline = tries_from + connect_timeout_;
        std::this_thread::sleep_for(backoff);
        backoff = std::min(backoff * 2, std::chrono::milliseconds(2000));
        continue;
      } else {
        throw Error("coordinator", fmt::format("join failed (HTTP {}): {}", reply->first, error_text(reply->second)));
      }
    }
    if (Clock::now() + backoff > deadline && refused_unsigned) {
      throw ConfigError("coordinator", fmt::format(
          "refused to join: {} (unsigned, answered for {:.0f} s: this worker has no join token to check who sent it); "
          "hint: every worker needs the run's join token: LOCO_JOIN_TOKEN or cluster.join_token, or on the "
          "coordinator's machine the run folder's join_token file", unsigned_refusal,
          std::chrono::duration<double>(Clock::now() - tries_from).count()));
    }
    if (Clock::now() + backoff > deadline) {
      if (told) {  // it answered "full" until now
        throw PeerError("worker", fmt::format("the coordinator at {} stopped answering while this worker waited for a slot "
                                              "({}): the run has ended, its steps done, or its coordinator stopped; this "
                                              "worker had not joined, so nothing of it is lost", address(), last_error));
      }
      // A worker with a token is refused unsigned when its token is not the run's (a refusal is
      // never signed, so it is not believed at once: HttpClient::attempt).
      if (!unsigned_refusal.empty()) last_error += fmt::format("; before that, an unsigned refusal (HTTP 401: {})", unsigned_refusal);
      const bool refused = last_error.starts_with("a refusal") || !unsigned_refusal.empty();
      const bool unsigned_answer = last_error.starts_with("an unsigned answer");
      throw PeerError("worker", fmt::format("cannot reach the coordinator at {} ({:.0f} s of tries; {}); hint: {} "
                                            "(cluster.connect_timeout_s = {:.0f} s)", address(),
                                            std::chrono::duration<double>(Clock::now() - tries_from).count(), last_error,
                                            refused ? "every worker needs the run's join token: LOCO_JOIN_TOKEN or "
                                                      "cluster.join_token, the same on every host"
                                            : unsigned_answer ? "give this worker the run's join token (LOCO_JOIN_TOKEN or "
                                                                "cluster.join_token), or, only for a coordinator run with "
                                                                "--insecure on a network you trust, pass --insecure here too"
                                                    : "is `loco coordinator` (or `loco launch`) running there, and is "
                                                      "the port open?",
                                            std::chrono::duration<double>(connect_timeout_).count()));
    }
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, std::chrono::milliseconds(5000));
  }
}

protocol::StartReply CoordinatorClient::wait_for_start(int64_t rank, const std::atomic<bool>* stop) {
  while (true) {
    auto [status, body] = request("POST", "/v1/start", nlohmann::json{{"rank", rank}}.dump(), 15s);
    if (status != 200) throw Error("coordinator", fmt::format("start: HTTP {}: {}", status, error_text(body)));
    auto reply = protocol::StartReply::from_json(nlohmann::json::parse(body));
    if (reply.phase == protocol::Phase::kFailed) throw Error("coordinator", fmt::format("the run failed before training: {}", reply.error));
    if (reply.phase != protocol::Phase::kWaiting) return reply;
    if (stop != nullptr && stop->load()) {
      reply.phase = protocol::Phase::kStopping;
      return reply;
    }
  }
}

bool CoordinatorClient::run_stopping() {
  try {
    auto [status, body] = request("GET", "/v1/state", "", 5s);
    if (status != 200) return false;
    auto state = nlohmann::json::parse(body);
    return state.value("stopping", false) || state.value("phase", "") == "finished" || state.value("phase", "") == "failed";
  } catch (const std::exception&) {
    return false;
  }
}

void CoordinatorClient::report_stop(int64_t rank, const std::string& reason) {
  request("POST", "/v1/stop", nlohmann::json{{"rank", rank}, {"reason", reason}}.dump(), 5s);
}

void CoordinatorClient::report_done(const protocol::DoneRequest& done) {
  auto [status, body] = request("POST", "/v1/done", done.to_json().dump(), 10s);
  if (status != 200) throw Error("coordinator", fmt::format("done: HTTP {}: {}", status, error_text(body)));
}

namespace {

nlohmann::json expect_json(std::pair<int, std::string> reply, const char* what) {
  if (reply.first != 200) throw PeerError("coordinator", fmt::format("{}: HTTP {}: {}", what, reply.first, error_text(reply.second)));
  try {
    return nlohmann::json::parse(reply.second);
  } catch (const nlohmann::json::exception&) {
    throw PeerError("coordinator", fmt::format("{}: the answer is not JSON", what));
  }
}

}  // namespace

protocol::HeartbeatReply CoordinatorClient::heartbeat(const protocol::HeartbeatRequest& heartbeat_request) {
  return protocol::HeartbeatReply::from_json(
      expect_json(request("POST", "/v1/heartbeat", heartbeat_request.to_json().dump(), 5s), "heartbeat"));
}

protocol::RoundReply CoordinatorClient::round(const protocol::RoundRequest& round_request) {
  return protocol::RoundReply::from_json(expect_json(request("POST", "/v1/round", round_request.to_json().dump(), 15s), "round"));
}

void CoordinatorClient::round_done(const protocol::RoundDone& done) {
  expect_json(request("POST", "/v1/round_done", done.to_json().dump(), 10s), "round_done");
}

std::shared_ptr<comm::KeyValueStore> CoordinatorClient::key_value_store() { return std::make_shared<HttpKeyValueStore>(*this); }

}  // namespace loco::runtime
