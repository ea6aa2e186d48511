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
#include "loco/runtime/net/http_client.h"
#include "loco/runtime/coordinator/protocol.h"

namespace loco::runtime {

// The coordinator did not answer (refused, reset or timed out) through all of a request's retries.
using CoordinatorUnreachable = PeerUnreachable;

// The run's training is complete (an elastic run refuses new members then): nothing to train.
class RunComplete : public Error {
 public:
  explicit RunComplete(std::string_view message) : Error("coordinator", message) {}
};

// How a worker reaches its run's coordinator securely (docs/security.md): the token it was given,
// else its run folder's (auth::resolve_token); TLS when cluster.tls_ca or cluster.tls_cert is set;
// `insecure` (loco worker --insecure): unsigned answers believed while it has no token.
ClientSecurity client_security(const RunConfig& config, bool insecure = false);

class CoordinatorClient {
 public:
  // `address` is "host:port" (ConfigError when malformed). Nothing is sent yet.
  CoordinatorClient(const std::string& address, std::chrono::milliseconds connect_timeout, ClientSecurity security = {});
  ~CoordinatorClient();

  const std::string& host() const { return http_.host(); }
  int port() const { return http_.port(); }
  std::string address() const { return http_.address(); }
  const ClientSecurity& security() const { return http_.security(); }

  // Joins the run. Retries while the coordinator cannot be reached, up to the connect timeout
  // (then PeerError: "cannot reach the coordinator at ..."). A refusal throws ConfigError with the
  // coordinator's reason (a config, dataset or rank that does not fit the run); RunComplete when
  // an elastic run's training is already complete. An elastic run
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
  std::string local_address() const { return http_.local_address(); }
  // The data plane's secret, derived from the run's token; "" without one.
  std::string data_plane_secret() { return http_.data_plane_secret(); }

  // How long a request keeps retrying a coordinator that does not answer (backoff from 0.2 s,
  // doubling to 5 s). Default 3 s; elastic workers wait cluster.coordinator_timeout_s, so that a
  // restarted coordinator finds them still there.
  void set_patience(std::chrono::milliseconds patience) { http_.set_patience(patience); }
  // The largest answer it reads (asynchronous DiLoCo's carry the model: outer_wire.h).
  void set_max_answer_bytes(size_t bytes) { http_.set_max_answer_bytes(bytes); }

  // Low level, for the key-value store: one request, signed when there is a token, retried (signed
  // anew) on connection errors for the patience. Returns (HTTP status, body); throws
  // CoordinatorUnreachable when it stays unreachable.
  std::pair<int, std::string> request(const std::string& method, const std::string& path, const std::string& body,
                                      std::chrono::milliseconds read_timeout) {
    return http_.request(method, path, body, read_timeout);
  }

 private:
  HttpClient http_;
  std::chrono::milliseconds connect_timeout_;
};

}  // namespace loco::runtime
