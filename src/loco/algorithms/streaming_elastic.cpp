// Streaming DiLoCo's elastic rounds (docs/failure-model.md, "Elastic Streaming DiLoCo"): the
// state sent to a round's joiners, a joiner's first round, and which round at the run's last step
// ends the training.
#include "loco/algorithms/streaming.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>

#include "loco/core/error.h"
#include "loco/core/hash.h"

namespace loco::algorithms {

bool StreamingDiLoCo::owes_final_sync(const Fragment& f, int64_t step) const {
  if (options_.eager) return f.final_phase != 0 || f.started < step;
  return f.pending || (f.started < step && f.exact != step);  // as advance() decides at the last step
}

bool StreamingDiLoCo::rounds_follow(int64_t step, size_t index) const {
  for (size_t p = 0; p < fragments_.size(); ++p) {
    if (p != index && owes_final_sync(fragments_[p], step)) return true;
  }
  return false;
}

comm::CommStats StreamingDiLoCo::state_to_joiners(int64_t step) {
  if (!plan_->has_joiners()) return {};
  try {
    return transfer_state(elastic_.group(), step, /*joiner=*/false);
  } catch (const PeerError&) {
    // A joiner failed while receiving: the coordinator hears of it by heartbeats, and the next
    // round forms a new group. The round itself stands.
    return {};
  }
}

comm::CommStats StreamingDiLoCo::transfer_state(comm::Group& group, int64_t step, bool joiner) {
  // θ, every fragment's outer state, and the schedule: rounds, the step, and per fragment its
  // syncs and the step its last one started.
  std::vector<torch::Tensor> parts(global_.begin(), global_.end());
  std::vector<NamedTensors> outer_states;
  for (auto& f : fragments_) {
    outer_states.push_back(f.outer->state());
    for (auto& [name, tensor] : outer_states.back()) parts.push_back(tensor);
  }
  std::vector<int64_t> counters = {rounds_, step};
  for (const auto& f : fragments_) {
    counters.push_back(f.round);
    counters.push_back(f.started);
  }
  // Eager updates: rank 0's exchanges too (every one has arrived: rounds come one at a time), so
  // that the joiner continues as rank 0 would, its Δ_m and weight taken for its own.
  auto weights = torch::zeros({2 * fragments()}, torch::kFloat64);  // per fragment its weight in the sum, then its fresh one
  if (options_.eager) {
    for (size_t p = 0; p < fragments_.size(); ++p) {
      auto& f = fragments_[p];
      parts.insert(parts.end(), {f.result->flat(), f.sent->flat(), f.step_by->flat()});
      counters.insert(counters.end(), {f.arrived ? 1 : 0, f.arrived ? f.arrived->participants : 0, f.final_phase});
      if (f.arrived) weights[static_cast<int64_t>(p)] = f.arrived->weight;
      weights[fragments() + static_cast<int64_t>(p)] = f.fresh_weight;
    }
    parts.push_back(weights);
    counters.push_back(static_cast<int64_t>(reported_hash_));
  }
  // Another contributor receives into copies it drops: the broadcast writes into what it is given.
  if (group.rank() != 0 && !joiner) {
    for (auto& part : parts) part = part.clone();
  }
  comm::CommStats stats = broadcast_state(group, counters, parts);
  if (group.rank() == 0 || !joiner) return stats;
  torch::NoGradGuard no_grad;
  rounds_ = counters[0];
  step_ = counters[1];
  round_start_ = std::chrono::steady_clock::now();
  const size_t eager_at = 2 + 2 * fragments_.size();
  if (options_.eager) reported_hash_ = static_cast<uint64_t>(counters.back());
  for (size_t p = 0; p < fragments_.size(); ++p) {
    auto& f = fragments_[p];
    f.outer->load_state(outer_states[p]);
    f.round = counters[2 + 2 * p];
    f.started = counters[3 + 2 * p];
    f.exact = step_;
    f.tokens = 0;
    f.pending = false;
    f.arrived.reset();
    if (options_.eager) {
      f.pending = counters[eager_at + 3 * p] != 0;
      if (f.pending) f.arrived = Reduced{{}, counters[eager_at + 3 * p + 1], weights[static_cast<int64_t>(p)].item<double>()};
      f.final_phase = counters[eager_at + 3 * p + 2];
      f.fresh_weight = weights[fragments() + static_cast<int64_t>(p)].item<double>();
    }
  }
  for (size_t i = 0; i < global_.size(); ++i) parameters_[i].copy_(global_[i]);  // the model takes θ
  return stats;
}

SyncReport StreamingDiLoCo::join_round() {
  return elastic_.join(step_, [&](const RoundPlan& plan) {
    torch::NoGradGuard no_grad;
    auto& group = elastic_.group();
    // Which fragment this round syncs (eager updates: P + p for fragment p's average at the run's
    // end), then that round's collectives with nothing added.
    auto which = torch::tensor({int64_t{-1}}, torch::kInt64);
    comm::CommStats stats = group.broadcast(which, 0);
    const int64_t named = which.item<int64_t>();
    const bool average = options_.eager && named >= fragments();
    const int64_t index = average ? named - fragments() : named;
    LOCO_CHECK(index >= 0 && index < fragments(), "rank 0 named fragment {} of {}", named, fragments());
    auto& f = fragments_[static_cast<size_t>(index)];
    comm::Tally tally = sync_tally(0, 0, 0, 0, options_.screening);  // as submit() sends it: nothing, not counted
    f.result->flat().zero_();
    if (average) {
      stats += f.result->all_reduce_sum(group);
    } else {
      stats += f.result->all_reduce_sum(group, options_.exchange, &tally, options_.screening.combine, options_.screening.trim);
    }
    stats += transfer_state(group, step_, /*joiner=*/true);
    SyncReport report;
    report.round = rounds_;
    report.step = step_;
    report.world_size = average ? plan.contributors : std::llround(tally.sum(1));
    report.stats = stats;
    report.params_hash = options_.eager ? reported_hash_ : hash_tensors(global_);  // eager: rank 0's, sent with the state
    report.fragment = options_.fragments > 1 ? index : -1;
    // The contributors report the round first (before they send the state): only they can end the run.
    return ElasticRounds::Joined{report, f.started, false};
  });
}

}  // namespace loco::algorithms
