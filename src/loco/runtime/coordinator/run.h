// The coordinator's two kinds of run, behind one interface: a run of fixed membership (every
// worker joins by rank before the start; fixed_run.h) and an elastic run (members come and go;
// elastic_run.h). The coordinator (coordinator.cpp) owns the HTTP server, the lock, the key-value
// store and the RunStatus; it calls a Run under its lock for everything that depends on the kind,
// and wakes its waiting requests after each call.
#pragma once

#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "loco/runtime/config/config.h"
#include "loco/runtime/coordinator/coordinator.h"
#include "loco/runtime/coordinator/protocol.h"

namespace loco::runtime {

// A refusal the worker can act on: answered with HTTP 409 and shown to the user as is.
class Refusal : public Error {
 public:
  explicit Refusal(std::string_view message) : Error("coordinator", message) {}
};

// A refusal for now (HTTP 503): every slot of an elastic run is held by a live member; the worker
// may ask again (a slot frees when a member fails or leaves).
class Full : public Refusal {
 public:
  using Refusal::Refusal;
};

// The run's training is complete (HTTP 410): a worker that asks to join it now has nothing to train
// (a replacement started in the run's last seconds) and ends as finished.
class Completed : public Refusal {
 public:
  using Refusal::Refusal;
};

// Where the run stands (GET /v1/state). The phase moves only along protocol::legal_transition.
class RunStatus {
 public:
  // A fresh random run id; a restarted elastic coordinator takes its predecessor's back.
  RunStatus();
  const std::string& run_id() const { return run_id_; }
  void set_run_id(std::string id) { run_id_ = std::move(id); }

  protocol::Phase phase() const { return phase_; }
  bool ended() const { return phase_ == protocol::Phase::kFinished || phase_ == protocol::Phase::kFailed; }
  // Moves to `next`; an illegal transition is a bug (InternalError).
  void enter(protocol::Phase next);
  // Ends the run as failed with `why` (once: a run that ended stays as it ended). Returns whether
  // it did.
  bool fail(const std::string& why);
  // A stop was asked (a worker was interrupted, or the launcher); the first reason is kept.
  void stop(const std::string& why);
  // Restores a saved stop (a restarted coordinator).
  void set_stopping(bool stopping) { stopping_ = stopping; }
  bool stopping() const { return stopping_; }
  const std::string& reason() const { return reason_; }

 private:
  std::string run_id_;
  protocol::Phase phase_ = protocol::Phase::kWaiting;
  bool stopping_ = false;
  std::string reason_;  // of the stop or the failure
};

// An elastic run's answer to a join: a run that ended takes nobody (Completed once finished: a
// worker that comes back has nothing to train, and is no error; Refusal once failed), nor does
// one that is stopping.
void refuse_join_when_over(const RunStatus& status);

// Checks that make a joining worker part of this run, whatever its kind: the same config (but for
// per-worker keys) and the same prepared dataset (the first worker's is the run's when the
// coordinator has none of its own).
class RunIdentity {
 public:
  RunIdentity(RunConfig config, std::optional<protocol::DatasetIdentity> dataset)
      : config_(std::move(config)), dataset_(std::move(dataset)) {}
  // Throws Refusal naming the keys or fields that differ.
  void check(const protocol::JoinRequest& request, const RunConfig& theirs);
  const RunConfig& config() const { return config_; }

 private:
  RunConfig config_;
  std::optional<protocol::DatasetIdentity> dataset_;
};

class Run {
 public:
  using Clock = std::chrono::steady_clock;
  virtual ~Run() = default;

  // A worker asks to join (its token and config were checked). Throws Refusal (or Full).
  virtual protocol::JoinReply join(const protocol::JoinRequest& request, const RunConfig& theirs) = 0;
  virtual protocol::StartReply start_reply(int64_t rank) const = 0;
  // A worker's end. Throws ProtocolError for a rank or member the run does not have.
  virtual void done(const protocol::DoneRequest& request) = 0;
  // What comes with time before the start: a worker that never joined by cluster.join_timeout_s
  // (the run fails; an elastic run starts with its quorum instead).
  virtual void check_start(Clock::time_point now) = 0;
  // The worker process `pid` of `host` exited without reporting its end (the launcher saw it):
  // an elastic run's member failed; a fixed run learns it from the launcher's stop.
  virtual void process_exited(const std::string& host, int64_t pid, int status, Clock::time_point now) {
    (void)host, (void)pid, (void)status, (void)now;
  }
  // A member's heartbeat (elastic runs: every cluster.heartbeat_s from each member). Throws
  // ProtocolError where the run takes none (a fixed run).
  virtual protocol::HeartbeatReply heartbeat(const protocol::HeartbeatRequest& request, Clock::time_point now) {
    (void)request, (void)now;
    throw protocol::ProtocolError("this run takes no heartbeats (cluster.elastic = false)");
  }
  // The coordinator's request handling is `behind` (HttpServer::behind): from kBehind on, members'
  // heartbeats may be waiting unread, so none is to be declared dead for its silence meanwhile.
  static constexpr std::chrono::milliseconds kBehind{500};
  virtual void hold_off(std::chrono::milliseconds behind, Clock::time_point now) { (void)behind, (void)now; }
  // What comes with time after it: a worker that never reported its end, members declared failed,
  // the end of the run. Called often (at least every 200 ms while the run is waited for).
  virtual void check_end(Clock::time_point now) = 0;
  // The outcome, once the run ended.
  virtual CoordinatorResult result() const = 0;
  // The members, for GET /v1/state ("members", "missing", and "elastic" for an elastic run).
  virtual nlohmann::json describe() const = 0;
  // One line per worker, for the plain-text status page.
  virtual std::vector<std::string> status_lines() const = 0;
  virtual int64_t workers() const = 0;
};

}  // namespace loco::runtime
