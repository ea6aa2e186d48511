// A run of fixed membership (cluster.elastic = false): its workers join by rank before the start,
// train together in one membership epoch (0), and each reports its end. Its policy over the task
// table (tasks.h) is the simplest: at the start, one task per rank for the whole run (its own
// shard, every step; each synchronization happens inside it over the run's group), leased to that
// rank until it reports; a worker that stopped or failed leaves its task open (a resume continues it). A worker that never joins
// within cluster.join_timeout_s, or never reports its end once another has, fails the run (unless,
// in an asynchronous run, the outer state took it as gone and the run's steps are all done). With
// --resume, every worker continues from the newest checkpoint whose global parameters all of them
// saved; one that holds none continues from a copy of another's, sent over the group.
#pragma once

#include <map>

#include "loco/runtime/coordinator/run.h"
#include "loco/runtime/coordinator/tasks.h"

namespace loco::algorithms {
class AsyncOuterServer;
}

namespace loco::runtime {

class FixedRun final : public Run {
 public:
  // `outer`: an asynchronous run's outer state (nullptr otherwise), which may have taken a silent
  // worker as gone.
  FixedRun(const CoordinatorOptions& options, RunStatus& status, RunIdentity& identity,
           algorithms::AsyncOuterServer* outer = nullptr);

  protocol::JoinReply join(const protocol::JoinRequest& request, const RunConfig& theirs) override;
  protocol::StartReply start_reply(int64_t rank) const override;
  void done(const protocol::DoneRequest& request) override;
  void check_start(Clock::time_point now) override;
  void check_end(Clock::time_point now) override;
  CoordinatorResult result() const override;
  nlohmann::json describe() const override;
  std::vector<std::string> status_lines() const override;
  int64_t workers() const override { return static_cast<int64_t>(members_.size()); }

 private:
  struct Member {
    std::string name;
    protocol::JoinRequest request;
    std::optional<protocol::EndStatus> status;  // none while training
    std::string error;
    nlohmann::json summary = nlohmann::json::object();
  };

  int64_t take_rank(const protocol::JoinRequest& request) const;
  // Everyone joined: the run starts, with one task per rank.
  void start();
  std::vector<int64_t> missing() const;
  void plan_resume();
  void plan_async_resume();
  void no_state_to_resume(const std::vector<int64_t>& without);
  void log(const std::string& line) const;

  const CoordinatorOptions& options_;
  RunStatus& status_;
  RunIdentity& identity_;
  algorithms::AsyncOuterServer* outer_;
  std::vector<std::optional<Member>> members_;  // by rank
  std::map<int64_t, int64_t> resume_steps_;     // rank -> the step it resumes from
  std::optional<protocol::CheckpointCopy> copy_;  // resuming workers that hold no checkpoint
  TaskTable tasks_;
  std::map<int64_t, int64_t> task_of_;          // rank -> its task
  const Clock::time_point created_ = Clock::now();
  std::optional<Clock::time_point> first_end_;  // when the first worker reported its end
};

}  // namespace loco::runtime
