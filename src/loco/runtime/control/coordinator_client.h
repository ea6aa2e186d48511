// A worker's side of the coordinator protocol (coordinator.h): join, wait for the start, the
// rendezvous store, and the run's state. Every request has a timeout; a coordinator that cannot be
// reached is retried with backoff, then reported as PeerError naming its address.
#pragma once

#include <atomic>
#include <chrono>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "loco/comm/key_value.h"
#include "loco/runtime/config/config.h"
#include "loco/runtime/control/auth.h"
#include "loco/runtime/control/protocol.h"

namespace httplib {
class Client;
}

namespace loco::runtime {

// The coordinator did not answer (refused, reset or timed out) through all of a request's retries.
class CoordinatorUnreachable : public PeerError {
 public:
  explicit CoordinatorUnreachable(std::string_view message) : PeerError("coordinator", message) {}
};

// How a client reaches the coordinator securely (docs/security.md).
struct ClientSecurity {
  std::string token;   // signs every request (auth.h); "" = requests are not signed
  bool tls = false;    // HTTPS, verifying the coordinator's certificate against `tls_ca`
  std::string tls_ca;  // PEM file of the CA (or the self-signed certificate) to trust
  // Where the run's generated token appears when a coordinator on this machine makes one
  // (RUN/join_token): read when `token` is "" and the file exists by the time of a request, so
  // that a worker started together with its coordinator finds it.
  std::filesystem::path token_file;

  // From a worker's config: the token it was given, else its run folder's (auth::resolve_token);
  // TLS when cluster.tls_ca or cluster.tls_cert is set.
  static ClientSecurity of(const RunConfig& config);
};

class CoordinatorClient {
 public:
  // `address` is "host:port" (ConfigError when malformed). Nothing is sent yet.
  CoordinatorClient(const std::string& address, std::chrono::milliseconds connect_timeout, ClientSecurity security = {});
  ~CoordinatorClient();

  const std::string& host() const { return host_; }
  int port() const { return port_; }
  std::string address() const;
  const ClientSecurity& security() const { return security_; }

  // Joins the run. Retries while the coordinator cannot be reached, up to the connect timeout
  // (then PeerError: "cannot reach the coordinator at ..."). A refusal throws ConfigError with the
  // coordinator's reason (a config, dataset or rank that does not fit the run). An elastic run
  // whose every slot is held (HTTP 503) is asked again with backoff for `wait_for_slot` (a slot
  // frees when a member fails or leaves; `waiting` is told once), then refused the same way.
  protocol::JoinReply join(const protocol::JoinRequest& request, std::chrono::milliseconds wait_for_slot = {},
                           const std::function<void(const std::string&)>& waiting = {});
  // Polls until every worker has joined and training may start; throws Error with the
  // coordinator's reason when the run failed (e.g. a worker never joined), PeerError when the
  // coordinator is gone, and stops early (returning phase "stopping") when `stop` is set.
  protocol::StartReply wait_for_start(int64_t rank, const std::atomic<bool>* stop);
  // Whether the run is stopping or over (asked after a collective failed). A coordinator that does
  // not answer counts as "no".
  bool run_stopping();
  void report_stop(int64_t rank, const std::string& reason);
  void report_done(const protocol::DoneRequest& request);

  // Elastic runs (membership.h): a heartbeat, a round's long poll (held at most 2 s: "wait" means
  // ask again), and a round's completion.
  protocol::HeartbeatReply heartbeat(const protocol::HeartbeatRequest& request);
  protocol::RoundReply round(const protocol::RoundRequest& request);
  void round_done(const protocol::RoundDone& request);

  // The coordinator's key-value store, for comm::Group::connect.
  std::shared_ptr<comm::KeyValueStore> key_value_store();

  // The local address this machine uses to reach the coordinator: the one peers on its network
  // can reach this worker at (no packet is sent to find it).
  std::string local_address() const;

  // How long a request keeps retrying a coordinator that does not answer (backoff from 0.2 s,
  // doubling to 5 s). Default 3 s; elastic workers wait cluster.coordinator_timeout_s, so that a
  // restarted coordinator finds them still there.
  void set_patience(std::chrono::milliseconds patience) { patience_ = patience; }

  // Low level, for the key-value store: one request, signed when there is a token, retried (signed
  // anew) on connection errors for the patience. Returns (HTTP status, body); throws
  // CoordinatorUnreachable when it stays unreachable.
  std::pair<int, std::string> request(const std::string& method, const std::string& path, const std::string& body,
                                      std::chrono::milliseconds read_timeout);

 private:
  // One attempt of a request, signed; null on a connection error (then `error` says which). A
  // request refused (401) is signed and sent again when there is something new to sign it with:
  // the run's token file, for an unsigned request (a coordinator starting beside this worker
  // writes it just before it listens), or the coordinator instance the refusal told (this
  // client's first request, or its first after the coordinator restarted).
  std::optional<std::pair<int, std::string>> send(const std::string& method, const std::string& path,
                                                  const std::string& body, std::string& error);
  // One request; on a refusal that tells an instance (auth::kInstanceHeader), `told` is set to it.
  std::optional<std::pair<int, std::string>> send_once(const std::string& method, const std::string& path,
                                                       const std::string& body, std::string& error, std::string& told);
  // Adopts the run's generated token once its file exists (ClientSecurity::token_file).
  void load_token_file();

  std::string host_;
  int port_ = 0;
  ClientSecurity security_;
  std::optional<auth::Key> key_;
  std::string instance_;  // the coordinator instance requests are signed for; "" until a refusal tells it
  std::chrono::milliseconds connect_timeout_;
  std::chrono::milliseconds patience_{3000};
  std::mutex mutex_;
  std::unique_ptr<httplib::Client> client_;
};

}  // namespace loco::runtime
