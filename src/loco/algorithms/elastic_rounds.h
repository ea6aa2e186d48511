// The round plumbing that DiLoCo and Streaming DiLoCo share (docs/failure-model.md, "Elastic
// runs"): the group a round runs in, taken from the Membership at each round's start; the bytes
// sent by the groups of earlier epochs; who leads; and a joiner's first round, tried again in a
// new epoch when a peer fails. Without a Membership it stands for the run's one fixed group.
//
// Each strategy keeps its own retry of a failed round (DiLoCo's is blocking, Streaming DiLoCo's
// waits on its background reduction), built on begin() and end().
#pragma once

#include <optional>
#include <utility>

#include "loco/algorithms/membership.h"
#include "loco/algorithms/sync.h"
#include "loco/comm/group.h"

namespace loco::algorithms {

class ElasticRounds {
 public:
  ElasticRounds(comm::Group group, Membership* membership) : group_(std::move(group)), membership_(membership) {}

  bool elastic() const { return membership_ != nullptr; }
  // Whether this worker joins a run under way (its first round adds nothing and receives the state).
  bool joining() const { return membership_ != nullptr && membership_->joining(); }
  // The group of the current round (the fixed group without a Membership).
  comm::Group& group() { return group_; }
  // Blocks until round `round` is convened (see Membership::begin_round) and makes its group the
  // current one. Throws MembershipEnded or RunStopping.
  RoundPlan begin(int64_t round, int64_t step, int64_t failed_epoch, const std::string& failure = "");
  // The round completed here at `step` with θ hashing to `params_hash`; `last`: no round follows.
  void end(const RoundPlan& plan, int64_t step, uint64_t params_hash, bool last) {
    membership_->end_round(plan, step, params_hash, last);
  }

  // What a joiner's attempt returns: its round's report, and the step it reports the round at.
  struct Joined {
    SyncReport report;
    int64_t round_step = 0;
    bool last = false;  // the run has no round after this one
  };
  // A joiner's first round: `attempt(plan)` runs the round's collectives adding nothing and
  // receives the run's state; a PeerError convenes the round again with whoever is left.
  template <class Attempt>
  SyncReport join(int64_t step, Attempt&& attempt) {
    int64_t failed_epoch = -1;
    std::string failure;
    for (;;) {
      RoundPlan plan = begin(0, step, failed_epoch, failure);
      try {
        Joined joined = attempt(plan);
        joined_step_ = joined.report.step;
        end(plan, joined.round_step, joined.report.params_hash, joined.last);
        return joined.report;
      } catch (const PeerError& e) {
        failed_epoch = plan.epoch;
        failure = e.what();
      }
    }
  }
  // Set once a joiner's first round completed: the step it continues from.
  std::optional<int64_t> joined_step() const { return joined_step_; }
  // Rank 0 of the last round this worker took part in (always, without a Membership).
  bool leads() const { return membership_ == nullptr || membership_->leads(); }
  // Payload bytes sent by every group this worker used.
  int64_t bytes_sent() const { return bytes_before_ + group_.bytes_sent(); }

 private:
  comm::Group group_;
  Membership* membership_ = nullptr;
  int64_t bytes_before_ = 0;  // sent by the groups of earlier epochs
  std::optional<int64_t> joined_step_;
};

}  // namespace loco::algorithms
