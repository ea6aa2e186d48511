#include "loco/runtime/coordinator/events.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <vector>

namespace loco::runtime {
namespace {

struct Wording {
  std::string operator()(const metrics::MemberJoinEvent& e) const {
    return fmt::format("{} joined as member {} (slot {}){}", e.name, e.member, e.slot,
                       e.joiner ? ", to receive the state at the next round" : "");
  }
  std::string operator()(const metrics::SlotTakenEvent& e) const {
    return fmt::format("member {} took part in round {}: it now trains slot {}", e.member, e.round, e.slot);
  }
  std::string operator()(const metrics::MemberFailureEvent& e) const {
    return fmt::format("member {} ({}) failed: {}", e.member, e.name, e.how);
  }
  std::string operator()(const metrics::CollectiveFailedEvent& e) const {
    return fmt::format("member {} reports that round {}'s collective failed in epoch {}{}: the round is convened again "
                       "with the members still alive", e.reported_by, e.round, e.epoch, e.error.empty() ? "" : " (" + e.error + ")");
  }
  std::string operator()(const metrics::RoundRetriedEvent& e) const {
    return fmt::format("round {} is tried again in epoch {} with {} workers (its collective in epoch {} failed)", e.round,
                       e.epoch, e.participants, e.failed_epoch);
  }
  std::string operator()(const metrics::LeftOutEvent& e) const {
    return fmt::format("round {} goes on without member(s) {}: still training {:.1f} s after the first arrival "
                       "(sync.round_grace_s); they rejoin", e.round, fmt::join(e.members, ", "), e.waited_s);
  }
  std::string operator()(const metrics::RestoredFromCheckpointEvent& e) const {
    const auto undone = e.undone == 0 ? std::string()
                        : e.undone == 1
                            ? fmt::format("; round {} is undone and trained again (its θ was held only by members now gone, "
                                          "and its checkpoint was not saved)", e.round + 1)
                            : fmt::format("; rounds {}-{} are undone and trained again (their θ was held only by members now "
                                          "gone, and their checkpoints were not saved)", e.round + 1, e.round + e.undone);
    return fmt::format("member(s) {} continue from the global checkpoint (round {}){}", fmt::join(e.members, ", "), e.round,
                       undone);
  }
  std::string operator()(const metrics::MemberLeaveEvent& e) const {
    return fmt::format("member {} left: {}", e.member, e.status);
  }
  std::string operator()(const metrics::RejoinEvent& e) const {
    return fmt::format("member {} must rejoin: {}", e.member, e.reason);
  }
  std::string operator()(const metrics::MembershipEvent& e) const {
    std::vector<std::string> who;
    for (const auto& m : e.members) who.push_back(fmt::format("{}{}", m.member, m.joining ? " (joining)" : ""));
    return fmt::format("epoch {} for round {}: members {}", e.epoch, e.round, fmt::join(who, ", "));
  }
  std::string operator()(const metrics::RoundCompleteEvent& e) const {
    return fmt::format("round {} complete at step {} with {} of {} workers{}", e.round, e.step, e.contributors, e.slots,
                       e.recovery_s >= 0 ? fmt::format(" (recovered {:.1f} s after the failure)", e.recovery_s) : "");
  }
  template <typename Other>
  std::string operator()(const Other& e) const {
    const metrics::Event event = e;
    auto fields = metrics::to_json(event);
    fields.erase("event");
    return metrics::kind_of(event) + " " + fields.dump();
  }
};

}  // namespace

std::string describe_event(const metrics::Event& event) { return std::visit(Wording{}, event); }

}  // namespace loco::runtime
