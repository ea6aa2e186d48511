// Elastic membership as an algorithm sees it (docs/failure-model.md). The runtime implements it
// over the coordinator (runtime/elastic.h); an algorithm only asks, at each round's end, for the
// group of that round's participants, and reports the round done.
//
// A round's group lists the contributors first (ranks 0 .. contributors - 1: the workers that
// trained the round) and then the joiners, who add nothing to the average and receive the state
// from rank 0 once the round completes. Rank 0 of the round leads: it evaluates and writes the
// global checkpoint.
#pragma once

#include <torch/types.h>
#include <torch/utils.h>

#include <cstdint>
#include <optional>
#include <string>

#include "loco/comm/group.h"
#include "loco/core/error.h"

namespace loco::algorithms {

// The kinds of loco::MembershipEnded (core/error.h): this worker's membership ended under it. The
// training loop saves nothing and passes them on, and so do the retry loops of the algorithms,
// which catch only PeerError.

// This worker is no longer a member (declared failed while frozen, or its round completed without
// it): its state is stale, and it must join again as a new member.
class Evicted : public MembershipEnded {
 public:
  explicit Evicted(std::string_view message) : MembershipEnded("membership", message) {}
};

// No live member held the run's state when this worker was to receive it: the coordinator makes
// it a member that continues from the global checkpoint of `step` (none: from the start), reading
// its slot from (data_epoch, data_cursor).
class RestartFromCheckpoint : public MembershipEnded {
 public:
  RestartFromCheckpoint(std::optional<int64_t> step, uint64_t data_epoch, uint64_t data_cursor)
      : MembershipEnded("membership", "no live member holds the run's state: continuing from the global checkpoint"),
        step(step), data_epoch(data_epoch), data_cursor(data_cursor) {}
  std::optional<int64_t> step;
  uint64_t data_epoch = 0, data_cursor = 0;
};

// The coordinator did not answer for cluster.coordinator_timeout_s: the worker exits, and the run
// continues from the state saved at the last round's end (docs/failure-model.md).
class CoordinatorLost : public MembershipEnded {
 public:
  explicit CoordinatorLost(std::string_view message) : MembershipEnded("membership", message) {}
};

// The run is stopping (interrupted, failed, or training completed before this worker took part).
// A PeerError: the collective it interrupts cannot complete, and the loop saves its state.
class RunStopping : public PeerError {
 public:
  // `completed`: the run's training is complete (a member that asks for a round after the last one,
  // such as a replacement that joined in the last round), so this member ends finished.
  explicit RunStopping(std::string_view message, bool completed = false)
      : PeerError("membership", message), completed_(completed) {}
  bool completed() const { return completed_; }

 private:
  bool completed_;
};

struct RoundPlan {
  comm::Group group = comm::Group::single();
  int64_t round = 0;          // the run's round being synchronized (1-based)
  int64_t epoch = 0;          // the membership epoch of `group`
  int64_t contributors = 1;   // ranks below this add their outer gradients
  int64_t step = 0;           // the round's step: the furthest contributor's
  bool contributes() const { return group.rank() < contributors; }
  bool has_joiners() const { return group.size() > contributors; }
};

class Membership {
 public:
  virtual ~Membership() = default;
  // Whether this worker joins a run under way: it takes part in its first round as a joiner.
  virtual bool joining() const = 0;
  // Blocks until round `round` (rounds completed + 1; ignored for a joiner) is convened, and
  // returns its group. `failed_epoch` >= 0 reports that the last attempt failed in that epoch,
  // `failure` how (the error, for the run's events). Throws Evicted, CoordinatorLost or
  // RunStopping (PeerErrors).
  virtual RoundPlan begin_round(int64_t round, int64_t step, int64_t failed_epoch, const std::string& failure) = 0;
  // The round completed here, with θ hashing to `params_hash` (the coordinator compares);
  // `last`: this worker has no round after it (at the run's last step, the training is complete).
  virtual void end_round(const RoundPlan& plan, int64_t step, uint64_t params_hash, bool last) = 0;
  // Rank 0 of the last round this worker took part in.
  virtual bool leads() const = 0;
};

}  // namespace loco::algorithms
