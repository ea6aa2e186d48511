#include "loco/runtime/control/coordinator_client.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <httplib.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <random>
#include <thread>

#include "loco/core/error.h"

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

std::string error_of(const std::string& body) {
  try {
    auto json = nlohmann::json::parse(body);
    if (json.is_object() && json.contains("error") && json["error"].is_string()) return json["error"].get<std::string>();
  } catch (const nlohmann::json::exception&) {
  }
  return body.substr(0, 500);
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
      if (status != 404) throw PeerError("coordinator", fmt::format("store get '{}': HTTP {}: {}", key, status, error_of(body)));
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
      throw PeerError("coordinator", fmt::format("store {}: HTTP {}: {}", what, reply.first, error_of(reply.second)));
    }
    return std::move(reply.second);
  }
  CoordinatorClient& client_;
};

}  // namespace

ClientSecurity ClientSecurity::of(const RunConfig& config) {
  ClientSecurity s;
  s.token = auth::resolve_token(join_token(config.cluster), config.run.dir);
  if (s.token.empty() && join_token(config.cluster).empty()) s.token_file = std::filesystem::path(config.run.dir) / "join_token";
  s.tls_ca = config.cluster.tls_ca.empty() ? config.cluster.tls_cert : config.cluster.tls_ca;
  s.tls = !s.tls_ca.empty();
  return s;
}

CoordinatorClient::CoordinatorClient(const std::string& address, std::chrono::milliseconds connect_timeout,
                                     ClientSecurity security)
    : connect_timeout_(connect_timeout), security_(std::move(security)) {
  const auto colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == address.size()) {
    throw ConfigError("worker", fmt::format("coordinator address '{}' is not HOST:PORT", address));
  }
  host_ = address.substr(0, colon);
  if (host_.size() > 2 && host_.front() == '[' && host_.back() == ']') host_ = host_.substr(1, host_.size() - 2);
  try {
    size_t used = 0;
    port_ = std::stoi(address.substr(colon + 1), &used);
    if (used != address.size() - colon - 1 || port_ < 1 || port_ > 65535) throw std::out_of_range("port");
  } catch (const std::exception&) {
    throw ConfigError("worker", fmt::format("coordinator address '{}': the port must be a number in 1..65535", address));
  }
  if (!security_.token.empty()) key_.emplace(security_.token);
  if (security_.tls) {
    const auto bracketed = host_.find(':') != std::string::npos ? "[" + host_ + "]" : host_;
    client_ = std::make_unique<httplib::Client>(fmt::format("https://{}:{}", bracketed, port_));
    client_->set_ca_cert_path(security_.tls_ca.c_str());
    client_->enable_server_certificate_verification(true);
  } else {
    client_ = std::make_unique<httplib::Client>(host_, port_);
  }
  if (!client_->is_valid()) throw ConfigError("worker", fmt::format("cannot make a client for the coordinator at {}", address));
  client_->set_url_encode(false);  // paths are encoded already, and signed as sent
  client_->set_connection_timeout(5s);
  client_->set_write_timeout(10s);
  client_->set_keep_alive(true);
}

CoordinatorClient::~CoordinatorClient() = default;

std::string CoordinatorClient::address() const { return fmt::format("{}:{}", host_, port_); }

void CoordinatorClient::load_token_file() {
  if (key_ || security_.token_file.empty()) return;
  std::error_code missing;
  if (std::filesystem::exists(security_.token_file, missing)) {
    security_.token = auth::resolve_token("", security_.token_file.parent_path());
    key_.emplace(security_.token);
  }
}

std::optional<std::pair<int, std::string>> CoordinatorClient::send(const std::string& method, const std::string& path,
                                                                   const std::string& body, std::string& error) {
  load_token_file();
  std::string told;
  auto reply = send_once(method, path, body, error, told);
  // At most twice: an unsigned request, then signed without the instance, would be refused twice.
  for (int again = 0; again < 2 && reply && reply->first == 401; ++again) {
    const bool was_signed = key_.has_value();
    const auto used = instance_;
    if (!was_signed) load_token_file();
    if (!told.empty()) instance_ = told;
    if (!key_ || (was_signed && instance_ == used)) break;  // nothing new to sign with
    reply = send_once(method, path, body, error, told);
  }
  return reply;
}

std::optional<std::pair<int, std::string>> CoordinatorClient::send_once(const std::string& method, const std::string& path,
                                                                        const std::string& body, std::string& error,
                                                                        std::string& told) {
  httplib::Headers headers;
  std::string nonce;
  if (key_) {
    const auto s = auth::sign(*key_, method, path, instance_, method == "GET" ? std::string_view() : std::string_view(body));
    headers = {{auth::kTimeHeader, std::to_string(s.time)}, {auth::kNonceHeader, s.nonce}, {auth::kMacHeader, s.mac}};
    if (!instance_.empty()) headers.emplace(auth::kInstanceHeader, instance_);
    nonce = s.nonce;
  }
  // The answer is read into `answer`, up to auth::kMaxAnswerBytes: a longer one is cut off.
  httplib::Request request;
  request.method = method;
  request.path = path;
  request.headers = std::move(headers);
  if (method != "GET") {
    request.body = body;
    request.set_header("Content-Type", "application/json");
  }
  std::string answer;
  bool too_long = false;
  request.content_receiver = [&](const char* data, size_t length, uint64_t, uint64_t) {
    if (answer.size() + length > auth::kMaxAnswerBytes) {
      too_long = true;
      return false;
    }
    answer.append(data, length);
    return true;
  };
  auto result = client_->send(request);
  if (too_long) {
    error = fmt::format("the answer to {} is over {} MiB (not the coordinator's)", path, auth::kMaxAnswerBytes >> 20);
    return std::nullopt;
  }
  if (!result) {
    error = httplib::to_string(result.error());
    if (security_.tls && result.error() == httplib::Error::SSLServerVerification) {
      error += fmt::format(" (the coordinator's certificate is not signed by {}, or does not name {})", security_.tls_ca, host_);
    }
    return std::nullopt;
  }
  told.clear();
  if (result->status == 401 && auth::is_instance(result->get_header_value(auth::kInstanceHeader))) {
    told = result->get_header_value(auth::kInstanceHeader);
  }
  // With a key, only answers signed for this request are believed; a refusal (401, 403) need not
  // be, since believing one gives nothing away (whoever can forge it could drop the answer too).
  if (key_ && result->status != 401 && result->status != 403) {
    const auto mac = result->get_header_value(auth::kAnswerMacHeader);
    if (auto why = auth::check_answer(*key_, nonce, result->status, answer, result->has_header(auth::kAnswerMacHeader) ? &mac : nullptr)) {
      error = fmt::format("{} (HTTP {} to {}): not the run's coordinator, or an answer altered on the way", *why,
                          result->status, path);
      return std::nullopt;
    }
  }
  return std::pair{result->status, std::move(answer)};
}

std::pair<int, std::string> CoordinatorClient::request(const std::string& method, const std::string& path,
                                                       const std::string& body, std::chrono::milliseconds read_timeout) {
  std::lock_guard lock(mutex_);
  client_->set_read_timeout(read_timeout);
  std::string error;
  const auto start = Clock::now();
  auto backoff = 200ms;
  for (;;) {
    if (auto reply = send(method, path, body, error)) return *reply;
    if (Clock::now() + backoff > start + patience_) break;
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, std::chrono::milliseconds(5000));
  }
  throw CoordinatorUnreachable(fmt::format("the coordinator at {} did not answer {} for {:.0f} s: {}", address(), path,
                                           std::chrono::duration<double>(Clock::now() - start).count(), error));
}

protocol::JoinReply CoordinatorClient::join(const protocol::JoinRequest& join_request,
                                            std::chrono::milliseconds wait_for_slot,
                                            const std::function<void(const std::string&)>& waiting) {
  auto deadline = Clock::now() + connect_timeout_;
  const auto slot_deadline = Clock::now() + wait_for_slot;
  bool told = false;
  auto backoff = 200ms;
  std::string last_error;
  while (true) {
    std::optional<std::pair<int, std::string>> reply;
    {
      std::lock_guard lock(mutex_);
      client_->set_read_timeout(30s);
      reply = send("POST", "/v1/join", join_request.to_json().dump(), last_error);
    }
    if (reply) {
      if (reply->first == 200) return protocol::JoinReply::from_json(nlohmann::json::parse(reply->second));
      if (reply->first == 409) throw ConfigError("coordinator", fmt::format("refused to join: {}", error_of(reply->second)));
      if (reply->first == 401) {
        throw ConfigError("coordinator", fmt::format(
            "refused to join: {}; hint: every worker needs the run's join token: LOCO_JOIN_TOKEN or cluster.join_token, "
            "or on the coordinator's machine the run folder's join_token file ({})", error_of(reply->second),
            key_ ? "this worker has a token, not the run's" : "this worker has none"));
      }
      if (reply->first == 503) {
        if (Clock::now() + backoff > slot_deadline) {
          throw ConfigError("coordinator", fmt::format("refused to join: {} (waited {:.0f} s for a slot to free; "
                                                       "cluster.join_timeout_s)", error_of(reply->second),
                                                       std::chrono::duration<double>(wait_for_slot).count()));
        }
        if (!told && waiting) {
          waiting(fmt::format("{}; waiting up to {:.0f} s for a member to fail or leave", error_of(reply->second),
                              std::chrono::duration<double>(wait_for_slot).count()));
        }
        told = true;
        deadline = Clock::now() + connect_timeout_;  // the coordinator answers: reaching it is not the problem
        std::this_thread::sleep_for(backoff);
        backoff = std::min(backoff * 2, std::chrono::milliseconds(2000));
        continue;
      }
      throw Error("coordinator", fmt::format("join failed (HTTP {}): {}", reply->first, error_of(reply->second)));
    }
    if (Clock::now() + backoff > deadline) {
      throw PeerError("worker", fmt::format("cannot reach the coordinator at {} within {:.0f} s ({}); hint: is `loco "
                                            "coordinator` (or `loco launch`) running there, and is the port open? "
                                            "(cluster.connect_timeout_s)", address(),
                                            std::chrono::duration<double>(connect_timeout_).count(), last_error));
    }
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, std::chrono::milliseconds(5000));
  }
}

protocol::StartReply CoordinatorClient::wait_for_start(int64_t rank, const std::atomic<bool>* stop) {
  while (true) {
    auto [status, body] = request("POST", "/v1/start", nlohmann::json{{"rank", rank}}.dump(), 15s);
    if (status != 200) throw Error("coordinator", fmt::format("start: HTTP {}: {}", status, error_of(body)));
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
  if (status != 200) throw Error("coordinator", fmt::format("done: HTTP {}: {}", status, error_of(body)));
}

namespace {

nlohmann::json expect_json(std::pair<int, std::string> reply, const char* what) {
  if (reply.first != 200) throw PeerError("coordinator", fmt::format("{}: HTTP {}: {}", what, reply.first, error_of(reply.second)));
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

std::string CoordinatorClient::local_address() const {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(host_.c_str(), std::to_string(port_).c_str(), &hints, &found) != 0 || found == nullptr) {
    throw ConfigError("worker", fmt::format("cannot resolve the coordinator's host '{}'", host_));
  }
  std::string out;
  const int fd = ::socket(AF_INET, SOCK_DGRAM, 0);
  if (fd >= 0 && ::connect(fd, found->ai_addr, found->ai_addrlen) == 0) {
    sockaddr_in local{};
    socklen_t length = sizeof local;
    char text[INET_ADDRSTRLEN] = {};
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &length) == 0 &&
        ::inet_ntop(AF_INET, &local.sin_addr, text, sizeof text) != nullptr) {
      out = text;
    }
  }
  if (fd >= 0) ::close(fd);
  ::freeaddrinfo(found);
  if (out.empty()) throw ConfigError("worker", fmt::format("cannot find the local address that reaches {}; set cluster.host", host_));
  return out;
}

}  // namespace loco::runtime
