#include "loco/runtime/coordinator/run.h"

#include <fmt/ranges.h>

#include <random>

#include "loco/core/hash.h"

namespace loco::runtime {
namespace {

std::string random_run_id() {
  std::random_device device;
  return hex64((static_cast<uint64_t>(device()) << 32) ^ device());
}

}  // namespace

RunStatus::RunStatus() : run_id_(random_run_id()) {}

void RunStatus::enter(protocol::Phase next) {
  LOCO_CHECK(protocol::legal_transition(phase_, next), "the run cannot go from {} to {}", protocol::to_string(phase_),
             protocol::to_string(next));
  phase_ = next;
}

bool RunStatus::fail(const std::string& why) {
  if (ended()) return false;
  enter(protocol::Phase::kFailed);
  reason_ = why;
  return true;
}

void RunStatus::stop(const std::string& why) {
  stopping_ = true;
  if (reason_.empty()) reason_ = why;
}

void refuse_join_when_over(const RunStatus& status) {
  if (status.ended()) {
    const auto why = fmt::format("the run is {}{}", protocol::to_string(status.phase()),
                                 status.phase() == protocol::Phase::kFailed ? ": " + status.reason() : "");
    if (status.phase() == protocol::Phase::kFinished) throw Completed(why);
    throw Refusal(why);
  }
  if (status.stopping()) throw Refusal("the run is stopping");
}

void RunIdentity::check(const protocol::JoinRequest& request, const RunConfig& theirs) {
  auto changed_keys = differences_except(config_, theirs, kPerWorkerKeys);
  if (!changed_keys.empty()) {
    throw Refusal(fmt::format("{}'s config differs from the run's (run -> worker): {}", request.name,
                              fmt::join(changed_keys, "; ")));
  }
  if (!dataset_) {
    dataset_ = request.dataset;  // the first worker's dataset is the run's
  } else if (auto diff = dataset_->differences(request.dataset); !diff.empty()) {
    throw Refusal(fmt::format("{}'s dataset differs from the run's: {}; every worker needs the same prepared dataset",
                              request.name, fmt::join(diff, "; ")));
  }
}

}  // namespace loco::runtime
