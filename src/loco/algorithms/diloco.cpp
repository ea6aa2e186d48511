#include "loco/algorithms/diloco.h"

#include <fmt/ranges.h>

#include "loco/core/error.h"

namespace loco::algorithms {
namespace {

torch::Tensor scalar(int64_t value) { return torch::tensor(value, torch::kInt64); }

}  // namespace

void DiLoCoOptions::validate() const {
  if (inner_steps < 1) throw ConfigError("algorithms", fmt::format("sync.inner_steps must be >= 1, got {}", inner_steps));
  if (total_steps < 1) throw ConfigError("algorithms", fmt::format("the run must have >= 1 step, got {}", total_steps));
  if (bucket_bytes < 4) throw ConfigError("algorithms", "sync.bucket_mb is too small");
  outer.validate();
}

DiLoCo::DiLoCo(comm::Group group, DiLoCoOptions options, Membership* membership)
    : elastic_(std::move(group), membership), options_(options) {
  options_.validate();
}

bool DiLoCo::round_ends_at(int64_t step) const {
  if (step == options_.total_steps) return true;
  if (options_.round_seconds > 0) {
    return std::chrono::steady_clock::now() - round_start_ >= std::chrono::duration<double>(options_.round_seconds);
  }
  return step % options_.inner_steps == 0;
}

SyncReports DiLoCo::on_start(model::Transformer& model, int64_t step) {
  torch::NoGradGuard no_grad;
  names_.clear();
  parameters_.clear();
  global_.clear();
  for (const auto& item : model->named_parameters()) {
    names_.push_back(item.key());
    parameters_.push_back(item.value());
    global_.push_back(item.value().detach().to(torch::kCPU, torch::kFloat32).clone());
  }
  outer_ = std::make_unique<optim::OuterOptimizer>(names_, global_, options_.outer);
  average_ = std::make_unique<FlatBuffer>(global_, options_.bucket_bytes);
  step_ = step;
  round_start_ = std::chrono::steady_clock::now();
  if (!restored_ || restored_->empty()) {
    synced_step_ = step;
    if (!elastic_.elastic()) {
      check_identical(elastic_.group(), global_, "the initial parameters");
    } else if (elastic_.joining()) {
      return {join_round()};
    }
    return {};
  }

  // Resumed: θ and the outer state come from the checkpoint; the model holds θ_m.
  auto& restored = *restored_;
  for (size_t i = 0; i < names_.size(); ++i) restored.take_into("global." + names_[i], global_[i]);
  round_ = restored.take_int("diloco.round");
  synced_step_ = restored.take_int("diloco.synced_step");
  round_tokens_ = restored.take_int("diloco.round_tokens");
  NamedTensors outer_state = restored.take_prefix("outer.");
  restored.expect_all_taken();
  restored_.reset();
  outer_->load_state(outer_state);
  // Checkpointed after its round's inner steps but before the round's sync completed: sync now.
  if (synced_step_ < step && round_ends_at(step)) return {synchronize(step)};
  return {};
}

SyncReports DiLoCo::after_step(StepContext& context) {
  round_tokens_ += context.step_tokens;
  step_ = context.step + 1;
  if (!round_ends_at(step_)) return {};
  return {synchronize(step_)};
}

SyncReport DiLoCo::synchronize(int64_t step) {
  if (elastic_.elastic()) return synchronize_elastic(step);
  return reduce_and_step(elastic_.group(), true, step);
}

SyncReport DiLoCo::synchronize_elastic(int64_t step) {
  int64_t failed_epoch = std::exchange(failed_epoch_, -1);
  for (int64_t attempt = 0;; ++attempt) {
    RoundPlan plan = elastic_.begin(round_ + 1, step, failed_epoch);
    // Time-budgeted rounds: the contributors took different numbers of steps; the round's step is
    // the furthest one's (H-step rounds: everyone's).
    const int64_t round_step = std::max(step, plan.step);
    SyncReport report;
    try {
      report = reduce_and_step(elastic_.group(), plan.contributes(), round_step);
    } catch (const PeerError&) {
      failed_epoch = plan.epoch;  // nothing changed: the round is convened again with whoever is left
      continue;
    }
    elastic_.end(plan, round_step, report.params_hash);
    if (plan.has_joiners()) {
      try {
        report.stats += transfer_state(elastic_.group());
      } catch (const PeerError&) {
        failed_epoch_ = plan.epoch;  // a joiner failed: its epoch is reported broken at the next round
      }
    }
    report.attempts = attempt + 1;
    return report;
  }
}

SyncReport DiLoCo::join_round() {
  return elastic_.join(step_, [&](const RoundPlan&) {
    SyncReport report = reduce_and_step(elastic_.group(), false, step_);
    report.stats += transfer_state(elastic_.group());
    step_ = synced_step_;
    round_start_ = std::chrono::steady_clock::now();
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < global_.size(); ++i) parameters_[i].copy_(global_[i]);
    report.round = round_;
    report.step = synced_step_;
    report.params_hash = hash_tensors(global_);
    return ElasticRounds::Joined{report, synced_step_};
  });
}

comm::CommStats DiLoCo::transfer_state(comm::Group& group) {
  // θ and the outer state (their shapes are the model's on every rank), the round and its step.
  std::vector<torch::Tensor> parts(global_.begin(), global_.end());
  auto outer_state = outer_->state();
  for (auto& [name, tensor] : outer_state) parts.push_back(tensor);
  std::vector<int64_t> counters = {round_, synced_step_};
  comm::CommStats stats = broadcast_state(group, counters, parts);
  if (group.rank() == 0) return stats;
  outer_->load_state(outer_state);
  round_ = counters[0];
  synced_step_ = counters[1];
  round_tokens_ = 0;
  return stats;
}

SyncReport DiLoCo::reduce_and_step(comm::Group& group, bool contributes, int64_t step) {
  torch::NoGradGuard no_grad;
  // w_m = tokens_m / Σ tokens: one small all-reduce of (tokens, 1) gives the total and the count.
  auto control = contributes ? torch::tensor({static_cast<double>(round_tokens_), 1.0}, torch::kFloat64)
                             : torch::zeros({2}, torch::kFloat64);
  comm::CommStats stats = group.all_reduce_sum(control);
  const double total_tokens = control[0].item<double>();
  const int64_t participants = std::llround(control[1].item<double>());
  const double weight = !contributes ? 0.0
                        : options_.weighting == Weighting::kTokens && total_tokens > 0
                            ? static_cast<double>(round_tokens_) / total_tokens
                            : 1.0 / static_cast<double>(participants);

  // The workers' weighted average θ̄ = Σ w_m θ_m; the outer gradient Δ = Σ w_m Δ_m = θ − θ̄ follows
  // on every worker alike. (Summing θ_m rather than Δ_m moves the same bytes, and keeps FedAvg,
  // θ ← θ̄, exact; see docs/diloco.md.)
  auto& average = average_->views();
  if (contributes) {
    for (size_t i = 0; i < global_.size(); ++i) average[i].copy_(parameters_[i].detach());
    if (weight != 1.0) average_->flat().mul_(weight);
  } else {
    average_->flat().zero_();
  }
  stats += average_->all_reduce_sum(group);
  stats.participants = participants;
  if (!contributes) {  // a joiner: θ and the outer state arrive next, from rank 0
    SyncReport report;
    report.world_size = participants;
    report.stats = stats;
    report.stall_seconds = stats.seconds;
    return report;
  }

  // Nothing above changed any state: a PeerError leaves the round pending. From here on, commit.
  const int64_t tokens = round_tokens_;
  outer_->step_to_average(average);
  for (size_t i = 0; i < global_.size(); ++i) parameters_[i].copy_(global_[i]);
  ++round_;
  synced_step_ = step;
  step_ = step;
  round_tokens_ = 0;
  round_start_ = std::chrono::steady_clock::now();
  stats.participants = participants;

  SyncReport report;
  report.round = round_;
  report.step = step;
  report.world_size = participants;
  report.stats = stats;
  report.params_hash = hash_tensors(global_);
  report.stall_seconds = stats.seconds;
  report.weight = weight;
  report.tokens = tokens;
  return report;
}

NamedTensors DiLoCo::state() {
  NamedTensors out;
  for (size_t i = 0; i < names_.size(); ++i) out.emplace_back("global." + names_[i], global_[i]);
  for (auto& [key, value] : outer_->state()) out.emplace_back("outer." + key, value);
  out.emplace_back("diloco.round", scalar(round_));
  out.emplace_back("diloco.synced_step", scalar(synced_step_));
  out.emplace_back("diloco.round_tokens", scalar(round_tokens_));
  return out;
}

void DiLoCo::load_state(const NamedTensors& tensors) {
  restored_.emplace("DiLoCo", tensors);
}

}  // namespace loco::algorithms
