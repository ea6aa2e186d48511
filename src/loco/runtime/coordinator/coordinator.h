// The coordinator: owns the membership of a run and serves the key-value store through which the
// workers form their process group. One HTTP port (an event-driven Boost.Beast server,
// http_server.h), JSON messages (protocol.h):
//
//   POST /v1/join        a worker asks to join: its config, dataset and rank are checked against
//                        the run's, and a refusal names the difference
//   POST /v1/start       long-poll: has everyone joined? (then: the epoch, the resume step)
//   POST /v1/stop        a worker was interrupted: the run is stopping
//   GET  /v1/state       phase, stopping, epoch, members (workers ask after a collective failed)
//   POST /v1/done        a worker's end and summary
//   POST /v1/heartbeat, /v1/round (long-poll), /v1/round_done   elastic runs (MembershipTable)
//   /v1/kv/{set,get,add,check,remove,size}   the rendezvous store (comm::KeyValueStore)
//   GET  /               the status page (docs/status-page.md) for a browser; plain text for others
//   GET  /v1/status, /metrics, /assets/*   its JSON, Prometheus' metrics, the page's scripts
//   POST /v1/telemetry   a worker's events and activity, for the page (dashboard.h)
//
// Membership has epochs: each is one fixed set of workers with its own process group (keys under
// "epoch/<n>/"). A fixed run has one epoch: every worker joins before training starts. An elastic
// run (cluster.elastic) opens a new epoch whenever the members taking part in a round change; it
// keeps its membership in RUN/coordinator.json, so that a coordinator started again on the run
// carries it on, and resumes from the global checkpoint with --resume.
// With a token (docs/security.md), every request must carry an HMAC of itself keyed by the token
// (auth.h), but status reads from this machine or with the status page's view key; others are
// answered 401 and logged.
// Every request is bounded: bodies are size-limited, waits are at most 2 s per request (clients
// poll), and a worker that never joins fails the run after cluster.join_timeout_s, naming it.
#pragma once

#include <nlohmann/json.hpp>

#include <chrono>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "loco/metrics/events.h"
#include "loco/runtime/config/config.h"
#include "loco/runtime/coordinator/protocol.h"

namespace loco::runtime {

struct CoordinatorOptions {
  std::string bind = "127.0.0.1";
  int64_t port = 29500;  // 0 = any free port
  RunConfig config;      // the run's resolved config: the reference every worker must match
  std::optional<protocol::DatasetIdentity> dataset;  // the reference dataset, when known here
  bool resume = false;   // workers continue from their checkpoints
  std::function<void(const std::string&)> log;       // human-readable events; may be empty
  // The run's join token (auth.h): every request must be signed with it, except GET / and
  // GET /v1/state from a loopback address. "" = no authentication, allowed only on a loopback
  // address unless `insecure`.
  std::string token;
  bool insecure = false;
  // TLS (PEM files): when set, the coordinator serves HTTPS only.
  std::string tls_cert, tls_key;
};

// The options of a coordinator of its own (`loco coordinator`) for `config`: listening on `bind`
// (default: 0.0.0.0 when the run has a join token, else 127.0.0.1) at `port` (0: cluster.port),
// the run's token (the user's, or on loopback the run folder's generated one), TLS, and the
// reference dataset when data.dir holds one. Throws ConfigError (auth.h) for an address it may not
// listen on without a token.
CoordinatorOptions standalone_coordinator_options(const RunConfig& config, const std::string& bind, bool insecure,
                                                  int64_t port, bool resume);

enum class RunOutcome { kFinished, kStopped, kFailed };

struct CoordinatorResult {
  RunOutcome outcome = RunOutcome::kFinished;
  std::string message;                    // why it stopped or failed
  std::vector<std::optional<metrics::TrainSummary>> summaries;  // each worker's, by rank (none when none came)
};

// Where run.dir records that its run finished: RUN/coordinator.json's phase for an elastic run;
// every worker's checkpoint of the last step (train.steps) for a fixed distributed run, or the one
// process's for `loco train` (`one_process`). A command started again on a finished run, without
// --resume, says so (describe) and exits 0, rather than refuse the folder or start the run anew.
// An asynchronous run's end is not recorded yet (nullopt): its coordinator asks for --resume on a
// saved outer state.
struct FinishedRun {
  std::string record;                    // what says it finished
  std::filesystem::path checkpoints;     // where its checkpoints are
};
std::optional<FinishedRun> finished_run(const RunConfig& config, bool one_process = false);
// "the run in RUN finished already (...)": the record, the report's command and the checkpoints.
std::string describe(const FinishedRun& finished, const RunConfig& config);

class Coordinator {
 public:
  // Binds the port now. Throws ConfigError naming the address when it cannot (in use, or not an
  // address of this machine), when the TLS certificate or key cannot be loaded, and when asked to
  // listen on a non-loopback address without a token and without `insecure`.
  explicit Coordinator(CoordinatorOptions options);
  ~Coordinator();
  Coordinator(const Coordinator&) = delete;
  Coordinator& operator=(const Coordinator&) = delete;

  int64_t port() const;
  // Serves requests in a background thread until destroyed.
  void start();
  // Blocks until every worker has reported its end, or the run failed (a worker never joined, or
  // the resume points disagree), at most `timeout`; nullopt if it is still going.
  std::optional<CoordinatorResult> wait_for(std::chrono::milliseconds timeout);
  // Marks the run as stopping (workers that see a collective fail then stop cleanly).
  void request_stop(const std::string& reason);
  // The address of the status page (with its view key when the coordinator listens beyond loopback).
  std::string page_url() const;
  // The launcher started worker `rank` as process `pid` of `host` (the status page lists it).
  void process_started(int64_t rank, const std::string& host, int64_t pid);
  // The worker process `pid` of `host` exited with `status`: the status page marks it, dead when
  // `failed` (not a clean end or a requested stop). In an elastic run its member is then declared
  // failed at once rather than after its heartbeats stop.
  void process_exited(const std::string& host, int64_t pid, int status, bool failed = true);
  // Ends the run as failed (e.g. a worker process died before reporting).
  void fail(const std::string& reason);
  // The state as GET /v1/state reports it.
  nlohmann::json state() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace loco::runtime
