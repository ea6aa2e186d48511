// Asynchronous DiLoCo with elastic membership (sync.async with cluster.elastic; docs/async.md).
// The outer state (algorithms::AsyncOuterServer) needs no rounds, so the membership is slots, as
// in a fixed run, that change hands: each of the cluster.workers slots reads its shard and holds
// one member at a time. A worker joins whenever a slot is vacant (before the start, or while the
// run trains), and continues from the current θ; one that asks while every slot is held waits
// (HTTP 503). A slot falls vacant when its member ends, when its process exits (the launcher
// says so), when its heartbeats stop for cluster.dead_after_s, or when the outer state finds it
// silent past its cycle; the cycle it had under way
// goes back to the others, and a later exchange of the old member is refused (its slot is
// another's). A member continues its slot's shard from the newest checkpoint it finds of that
// slot (a launcher's restart finds its predecessor's), else from the shard's start.
//
// Training starts when every slot is held, or after cluster.join_timeout_s with the quorum
// (cluster.min_workers). The run ends when every member has left: finished once the run's steps
// are all done; stopped on request; failed when nobody holds a slot for cluster.join_timeout_s
// with steps left. RUN/coordinator.json is not kept: a killed coordinator is continued with
// --resume, from RUN/outer.safetensors and each slot's checkpoints.
#pragma once

#include <map>

#include "loco/algorithms/async_outer.h"
#include "loco/metrics/metrics_log.h"
#include "loco/runtime/coordinator/run.h"

namespace loco::runtime {

class AsyncElasticRun final : public Run {
 public:
  // `outer` is the coordinator's outer state, which outlives the run.
  AsyncElasticRun(const CoordinatorOptions& options, RunStatus& status, RunIdentity& identity, algorithms::AsyncOuterServer& outer);

  protocol::JoinReply join(const protocol::JoinRequest& request, const RunConfig& theirs) override;
  protocol::StartReply start_reply(int64_t rank) const override;
  void done(const protocol::DoneRequest& request) override;
  void process_exited(const std::string& host, int64_t pid, int status, Clock::time_point now) override;
  // Its member's (none once it lost its slot: `member` false). One whose heartbeats stop for
  // cluster.dead_after_s is gone at once, not after its cycle's silence (sync.async_silence_s).
  protocol::HeartbeatReply heartbeat(const protocol::HeartbeatRequest& request, Clock::time_point now) override;
  // Behind, or itself stalled (frozen, its machine paused) for over dead_after_s / 2 between two
  // looks: the members' silence is the coordinator's own, and their heartbeats count as fresh.
  void hold_off(std::chrono::milliseconds behind, Clock::time_point now) override;
  void check_start(Clock::time_point now) override;
  void check_end(Clock::time_point now) override;
  CoordinatorResult result() const override;
  nlohmann::json describe() const override;
  std::vector<std::string> status_lines() const override;
  int64_t workers() const override { return static_cast<int64_t>(slots_.size()); }

 private:
  struct Member {
    int64_t id = -1;
    std::string name;
    std::optional<int64_t> resume_step;          // the newest checkpoint of its slot it holds
    bool joiner = false;                         // joined while the run trained
    Clock::time_point joined_at{};
    std::optional<Clock::time_point> heartbeat;  // its last (none: it sent none yet)
    std::optional<protocol::EndStatus> status;   // none while it holds the slot
    bool reported = false;                       // it reported its end (and its summary)
    std::string error;
    nlohmann::json summary = nlohmann::json::object();
  };
  struct Slot {
    std::optional<Member> holder;  // the member holding it (or the last one, once it ended)
  };

  bool vacant(int64_t slot, Clock::time_point now);
  int64_t take_slot(const protocol::JoinRequest& request, Clock::time_point now);
  // The slot's member is gone (`how`); its slot vacant.
  void lose(int64_t slot, const std::string& how);
  void start(const std::string& why);
  int64_t live() const;
  void log(const std::string& line) const;
  void write(const metrics::Event& event);

  const CoordinatorOptions& options_;
  RunStatus& status_;
  RunIdentity& identity_;
  algorithms::AsyncOuterServer& outer_;
  metrics::MetricsLog events_;
  std::vector<Slot> slots_;
  std::vector<Member> ended_;                     // members that left, in order
  int64_t next_member_ = 0;
  const Clock::time_point created_ = Clock::now();
  Clock::time_point started_{};  // training started
  std::optional<Clock::time_point> empty_since_;  // nobody holds a slot, with steps left
  std::optional<Clock::time_point> last_look_;    // the last check_end: a longer gap is a stall
};

}  // namespace loco::runtime
