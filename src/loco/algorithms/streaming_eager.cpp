// Streaming DiLoCo's eager outer updates (streaming.h, "Eager updates"; Kale et al. 2025, arXiv
// 2502.12996): a fragment's exchange overlaps the next H inner steps, and each worker steps with the
// others' stale share plus its own fresh one.
#include "loco/algorithms/streaming.h"

#include <fmt/ranges.h>

#include <algorithm>

#include "loco/core/error.h"
#include "loco/core/hash.h"

namespace loco::algorithms {

namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

uint64_t StreamingDiLoCo::averaged_hash(size_t index) const {
  const auto& f = fragments_[index];
  std::vector<torch::Tensor> shared(f.global.begin(), f.global.end());
  shared.push_back(torch::tensor({rounds_ + 1, static_cast<int64_t>(index)}));
  return hash_tensors(shared);
}

// Elastic membership: rounds come one at a time, so the exchange's round opened at a sync closes
// at the next sync of any fragment (or at once, when joiners wait for the state or the run ends):
// waited for (again with whoever is left when a peer failed, sending the same Δ_m), reported done,
// and the state sent to its joiners. Returns what closing it sent; `stall` gains its wait.
comm::CommStats StreamingDiLoCo::close_round(int64_t step, double& stall) {
  torch::NoGradGuard no_grad;
  const auto index = static_cast<size_t>(open_);
  auto& f = fragments_[index];
  const auto wait_start = std::chrono::steady_clock::now();
  while (!f.arrived) {
    try {
      if (f.failure) std::rethrow_exception(std::exchange(f.failure, nullptr));
      LOCO_CHECK(f.reduction.valid(), "fragment {} has a round open but nothing to wait for", index);
      f.arrived = f.reduction.get();
    } catch (const PeerError& e) {
      begin_round(plan_->round, f.started, plan_->epoch, e.what());
      f.reduction = submit(f, plan_->has_joiners());
    }
  }
  stall += seconds_since(wait_start);
  elastic_.end(*plan_, f.started, reported_hash_, /*last=*/false);
  open_ = -1;
  const comm::CommStats stats = state_to_joiners(step);
  plan_.reset();
  return stats;
}

// Elastic membership, the run's end: fragment f's θ_p averaged in a round of its own (over whoever
// holds the state; joiners add nothing and receive it), convened again if a peer fails.
comm::CommStats StreamingDiLoCo::average_round(size_t index, int64_t step) {
  torch::NoGradGuard no_grad;
  auto& f = fragments_[index];
  comm::CommStats stats;
  int64_t failed_epoch = -1;
  std::string failure;
  for (;;) {
    begin_round(rounds_ + 1, step, failed_epoch, failure);
    auto& average = f.result->views();
    for (size_t i = 0; i < average.size(); ++i) average[i].copy_(f.global[i]);
    const bool tell_joiners = plan_->has_joiners();
    try {
      stats += background_.submit([&] {
        comm::CommStats told;
        if (tell_joiners) {
          auto which = torch::tensor({fragments() + static_cast<int64_t>(index)}, torch::kInt64);
          told = elastic_.group().broadcast(which, 0);
        }
        told += f.result->all_reduce_sum(elastic_.group());
        return told;
      }).get();
      break;
    } catch (const PeerError& e) {
      failed_epoch = plan_->epoch;
      failure = e.what();
    }
  }
  rounds_ += 1;
  f.result->flat().div_(static_cast<double>(plan_->contributors));
  for (size_t i = 0; i < f.global.size(); ++i) f.global[i].copy_(f.result->views()[i]);
  f.final_phase = 0;
  reported_hash_ = averaged_hash(index);  // before the joiners take it with the state
  elastic_.end(*plan_, step, reported_hash_, !rounds_follow(step, index));
  stats += state_to_joiners(step);
  plan_.reset();
  return stats;
}

SyncReport StreamingDiLoCo::eager_sync(size_t index, int64_t step, bool last) {
  torch::NoGradGuard no_grad;
  auto& f = fragments_[index];
  f.stall = 0;
  comm::CommStats closing;
  if (elastic_.elastic()) {
    // The round before closes, and this exchange's opens, before anything here changes: a stop
    // in between saves this fragment as it was, and its sync runs again on resume.
    if (open_ >= 0) closing = close_round(step, f.stall);
    begin_round(rounds_ + 1, step, -1);
    rounds_ += 1;
    open_ = static_cast<int64_t>(index);
  }
  auto& group = elastic_.group();
  // The previous exchange (Σ_k w_k·Δ_k^{r−1}, in `result`; this worker's Δ_m^{r−1} still in `sent`).
  std::optional<Reduced> previous;
  if (f.pending) {
    await(f, index);
    previous = std::exchange(f.arrived, std::nullopt);
    f.pending = false;
  }
  // Its fresh share's weight: its weight in the last sum (0 when screening left it out, less when clipped).
  const double own_weight = previous ? previous->weight : 1.0 / static_cast<double>(group.size());
  auto& g = f.step_by->flat();
  // The others' stale share, and its own as the sum holds it in place of the fresh one it applied a
  // sync ago: S^{r−1} − w_fresh·Δ_m^{r−1}. Each replica then holds every sum once, plus its own
  // latest fresh share; a worker left out takes its own share back.
  if (previous) torch::sub_out(g, f.result->flat(), f.sent->flat(), f.fresh_weight);
  else g.zero_();
  // What every worker shares this sync (the replicas' θ differ): the all-reduced sum, with the
  // sync's place in the schedule (a first sync's sum is zeros for every fragment).
  reported_hash_ =
      hash_tensors({previous ? f.result->flat() : g, torch::tensor({rounds_ + 1, static_cast<int64_t>(index)})});
  // This worker's fresh Δ_m^r = θ_p − θ_{m,p}, and its exchange on the background thread.
  auto& sent = f.sent->views();
  for (size_t i = 0; i < sent.size(); ++i) sent[i].copy_(f.local[i]).sub_(f.global[i]).neg_();
  f.pending_tokens = f.tokens;
  f.tokens = 0;
  f.started = step;
  f.failure = nullptr;
  f.pending = true;
  f.sync_number = f.round + 1;
  f.reduction = submit(f, plan_ && plan_->has_joiners());
  comm::CommStats stats = previous ? previous->stats : comm::CommStats{};
  stats += closing;
  const int64_t participants = previous ? previous->participants : group.size();
  if (last) {
    f.final_phase = 1;
    return eager_finish(index, step, stats, participants, own_weight);
  }
  if (own_weight != 0) g.add_(f.sent->flat(), own_weight);  // its own fresh share
  f.fresh_weight = own_weight;
  f.outer->step(f.step_by->views());
  SyncReport report = eager_report(index, step, options_.merge_alpha, stats, participants, own_weight, reported_hash_);
  if (previous) {  // the screening of the sum it stepped with
    report.rejected = previous->rejected;
    report.screening = previous->screening;
  }
  // Joiners wait in the round for the state: it closes now (this once, the exchange is not overlapped).
  if (plan_ && plan_->has_joiners()) report.stats += close_round(step, report.stall_seconds);
  return report;
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
  int64_t rejected = 0;
  std::string screening;
  if (f.final_phase == 1) {
    if (open_ >= 0) stats += close_round(step, f.stall);  // elastic: the last exchange's round
    await(f, index);
    const Reduced final_exchange = *std::exchange(f.arrived, std::nullopt);
    f.pending = false;
    f.step_by->flat().add_(f.result->flat());
    f.outer->step(f.step_by->views());
    stats += final_exchange.stats;
    participants = final_exchange.participants;
    rejected = final_exchange.rejected;
    screening = final_exchange.screening;
    f.final_phase = 2;
  }
  if (elastic_.elastic()) {
    stats += average_round(index, step);
  } else {
    auto& average = f.result->views();
    for (size_t i = 0; i < average.size(); ++i) average[i].copy_(f.global[i]);
    stats += background_.submit([&] { return f.result->all_reduce_sum(group); }).get();
    f.result->flat().div_(static_cast<double>(group.size()));
    for (size_t i = 0; i < average.size(); ++i) f.global[i].copy_(average[i]);
    f.final_phase = 0;
  }
  if (!elastic_.elastic()) reported_hash_ = averaged_hash(index);
  SyncReport report = eager_report(index, step, 0.0, stats, participants, weight, reported_hash_);
  report.rejected = rejected;
  report.screening = screening;
  return report;
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
  if (!elastic_.elastic()) rounds_ += 1;  // elastic: counted as each round opens
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
