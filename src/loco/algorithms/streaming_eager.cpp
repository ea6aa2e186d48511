// Streaming DiLoCo's eager outer updates (streaming.h, "Eager updates"; Kale et al. 2025, arXiv
// 2502.12996): a fragment's exchange overlaps the next H inner steps, and each worker steps with the
// others' stale share plus its own fresh one.
#include "loco/algorithms/streaming.h"

#include <fmt/ranges.h>

#include <algorithm>

#include "loco/core/error.h"
#include "loco/core/hash.h"

namespace loco::algorithms {

SyncReport StreamingDiLoCo::eager_sync(size_t index, int64_t step, bool last) {
  torch::NoGradGuard no_grad;
  auto& f = fragments_[index];
  auto& group = elastic_.group();
  f.stall = 0;
  // The previous exchange (Σ_k w_k·Δ_k^{r−1}, in `result`; this worker's Δ_m^{r−1} still in `sent`).
  std::optional<Reduced> previous;
  if (f.pending) {
    await(f, index);
    previous = std::exchange(f.arrived, std::nullopt);
    f.pending = false;
  }
  const double own_weight = previous ? previous->weight : 1.0 / static_cast<double>(group.size());
  auto& g = f.step_by->flat();
  if (previous && own_weight != 0) torch::sub_out(g, f.result->flat(), f.sent->flat() * own_weight);  // the others' stale share
  else if (previous) g.copy_(f.result->flat());  // left out by screening: none of its own, whatever it holds
  else g.zero_();
  // What every worker shares this sync (the replicas' θ differ): the all-reduced sum, with the
  // sync's place in the schedule (a first sync's sum is zeros for every fragment).
  const uint64_t shared_hash =
      hash_tensors({previous ? f.result->flat() : g, torch::tensor({rounds_ + 1, static_cast<int64_t>(index)})});
  // This worker's fresh Δ_m^r = θ_p − θ_{m,p}, and its exchange on the background thread.
  auto& sent = f.sent->views();
  for (size_t i = 0; i < sent.size(); ++i) sent[i].copy_(f.local[i]).sub_(f.global[i]).neg_();
  f.pending_tokens = f.tokens;
  f.tokens = 0;
  f.started = step;
  f.failure = nullptr;
  f.pending = true;
  f.reduction = submit(f);
  const comm::CommStats stats = previous ? previous->stats : comm::CommStats{};
  const int64_t participants = previous ? previous->participants : group.size();
  if (last) {
    f.final_phase = 1;
    return eager_finish(index, step, stats, participants, own_weight);
  }
  if (own_weight != 0) g.add_(f.sent->flat(), own_weight);  // its own fresh share in place of its stale one
  f.outer->step(f.step_by->views());
  return eager_report(index, step, options_.merge_alpha, stats, participants, own_weight, shared_hash);
}

// The run's end, in two phases a failure can stop between and a resume continues from (state()
// keeps f.final_phase, and `step_by` in phase 1): 1, wait for the last exchange and step with
// everything not yet applied (the others' stale share in `step_by`, and the whole last sum);
// 2, average θ_p over the workers, so that a finished run's model is one θ.
SyncReport StreamingDiLoCo::eager_finish(size_t index, int64_t step, comm::CommStats stats, int64_t participants,
                                         double weight) {
  torch::NoGradGuard no_grad;
  auto& f = fragments_[index];
  auto& group = elastic_.group();
  if (f.final_phase == 1) {
    await(f, index);
    const Reduced final_exchange = *std::exchange(f.arrived, std::nullopt);
    f.pending = false;
    f.step_by->flat().add_(f.result->flat());
    f.outer->step(f.step_by->views());
    stats += final_exchange.stats;
    participants = final_exchange.participants;
    f.final_phase = 2;
  }
  auto& average = f.result->views();
  for (size_t i = 0; i < average.size(); ++i) average[i].copy_(f.global[i]);
  stats += background_.submit([&] { return f.result->all_reduce_sum(group); }).get();
  f.result->flat().div_(static_cast<double>(group.size()));
  for (size_t i = 0; i < average.size(); ++i) f.global[i].copy_(average[i]);
  f.final_phase = 0;
  std::vector<torch::Tensor> shared(f.global.begin(), f.global.end());
  shared.push_back(torch::tensor({rounds_ + 1, static_cast<int64_t>(index)}));
  return eager_report(index, step, 0.0, stats, participants, weight, hash_tensors(shared));
}

SyncReport StreamingDiLoCo::eager_report(size_t index, int64_t step, double alpha, const comm::CommStats& stats,
                                         int64_t participants, double weight, uint64_t hash) {
  auto& f = fragments_[index];
  for (size_t i = 0; i < f.local.size(); ++i) {
    auto global = f.global[i].to(f.local[i].device(), f.local[i].scalar_type());
    if (alpha == 0) f.local[i].copy_(global);
    else f.local[i].copy_(torch::lerp(global, f.local[i], alpha));
  }
  f.round += 1;
  if (alpha == 0) f.exact = step;
  step_ = std::max(step_, step);
  rounds_ += 1;
  SyncReport report;
  report.round = rounds_;
  report.step = step;
  report.world_size = participants;
  report.stats = stats;
  report.stats.participants = participants;
  report.params_hash = hash;
  report.fragment = options_.fragments > 1 ? static_cast<int64_t>(index) : -1;
  report.stall_seconds = f.stall;
  report.weight = weight;
  report.tokens = f.pending_tokens;
  return report;
}

}  // namespace loco::algorithms
