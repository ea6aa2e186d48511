// An elastic run (cluster.elastic; docs/failure-model.md): members join, fail and are replaced
// while training goes on. The MembershipTable (membership.h) decides who takes part in each round;
// this class serves it to the coordinator's routes and keeps what a coordinator needs beyond it:
//   - RUN/coordinator.json, the table's durable state, written atomically after every change and
//     before any answer that depends on it, so that a coordinator started again carries the run on;
//   - the run's events, in the log and in RUN/metrics.jsonl (wording in events.h);
//   - resuming from the global checkpoint (--resume), and continuing from it when every member that
//     held θ failed while others waited for it;
//   - the run's end: every member left, with training complete or stopped (else the run failed).
#pragma once

#include <map>
#include <set>

#include "loco/core/files.h"
#include "loco/metrics/metrics_log.h"
#include "loco/runtime/coordinator/membership.h"
#include "loco/runtime/coordinator/run.h"

namespace loco::runtime {

class ElasticRun final : public Run {
 public:
  // Takes back RUN/coordinator.json when it holds a run under way, or (options.resume) the newest
  // global checkpoint. Throws ConfigError / DataError naming the file when neither can be used.
  ElasticRun(const CoordinatorOptions& options, RunStatus& status, RunIdentity& identity);

  protocol::JoinReply join(const protocol::JoinRequest& request, const RunConfig& theirs) override;
  protocol::StartReply start_reply(int64_t rank) const override;
  void done(const protocol::DoneRequest& request) override;
  void check_start(Clock::time_point now) override;
  void check_end(Clock::time_point now) override;
  CoordinatorResult result() const override;
  nlohmann::json describe() const override;
  std::vector<std::string> status_lines() const override;
  int64_t workers() const override { return options_.config.cluster.workers; }

  protocol::HeartbeatReply heartbeat(const protocol::HeartbeatRequest& request, Clock::time_point now) override;
  // One look at a member's arrival at a round's end: go, or wait (the route asks again).
  protocol::RoundReply arrive(const protocol::RoundRequest& request, Clock::time_point now);
  // Returns false when the report's θ differs from the round's: the run then failed.
  bool round_done(const protocol::RoundDone& report, Clock::time_point now);
  // The worker process `pid` of `host` exited without reporting its end: its member failed.
  void process_exited(const std::string& host, int64_t pid, int status, Clock::time_point now) override;
  // Ends the run as failed, and saves that.
  void fail(const std::string& why);
  // Logged once per episode.
  void hold_off(std::chrono::milliseconds behind, Clock::time_point now) override;

 private:
  void restore_live_state();
  void restore_from_checkpoint();
  // The round and the slots' data positions of the global checkpoint of `step`.
  std::pair<int64_t, std::vector<data::SamplerPosition>> read_global_checkpoint(int64_t step) const;
  void restart_orphans();
  void start(const std::string& why);
  void flush_events();
  void persist();
  void log(const std::string& line) const;

  const CoordinatorOptions& options_;
  RunStatus& status_;
  RunIdentity& identity_;
  MembershipTable table_;
  metrics::MetricsLog events_;                  // RUN/metrics.jsonl: membership, failures, rounds
  std::optional<uint64_t> shards_hash_;         // the first worker's division of the data
  struct Ended {
    int64_t slot = 0;
    protocol::EndStatus status = protocol::EndStatus::kFinished;
    std::string error;
    nlohmann::json summary;
  };
  std::map<int64_t, Ended> ended_;              // members that reported their end, by member id
  std::optional<int64_t> resume_step_;          // a resumed run: the global checkpoint's step
  // When a worker last found the run full and asked again (it waits for a slot; quieter than
  // kWaiterSilence, it no longer counts as waiting).
  std::map<std::string, Clock::time_point> slot_waiters_;
  // Rounds past the table's whose completion RUN/metrics.jsonl records already: a predecessor killed
  // after it wrote the event and before it saved the table. The workers report the round done again
  // and it completes again, once in the table; the event is not written twice.
  std::set<int64_t> recorded_rounds_;
  const fs::path state_file_;
  std::string saved_state_;                     // what state_file_ holds
  bool state_write_failed_ = false;
  bool holding_off_ = false;  // hold_off: within an episode of request handling behind
  const Clock::time_point created_ = Clock::now();
};

}  // namespace loco::runtime
