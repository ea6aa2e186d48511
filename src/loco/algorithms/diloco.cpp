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

DiLoCo::DiLoCo(comm::Group group, DiLoCoOptions options) : group_(std::move(group)), options_(options) {
  options_.validate();
}

bool DiLoCo::round_ends_at(int64_t step) const {
  return step % options_.inner_steps == 0 || step == options_.total_steps;
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
  if (!restored_ || restored_->empty()) {
    check_identical(group_, global_, "the initial parameters");
    synced_step_ = step;
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
  torch::NoGradGuard no_grad;
  // w_m = tokens_m / Σ tokens: one small all-reduce of (tokens, 1) gives the total and the count.
  auto control = torch::tensor({static_cast<double>(round_tokens_), 1.0}, torch::kFloat64);
  comm::CommStats stats = group_.all_reduce_sum(control);
  const double total_tokens = control[0].item<double>();
  const int64_t participants = std::llround(control[1].item<double>());
  const double weight = options_.weighting == Weighting::kTokens && total_tokens > 0
                            ? static_cast<double>(round_tokens_) / total_tokens
                            : 1.0 / static_cast<double>(participants);

  // The workers' weighted average θ̄ = Σ w_m θ_m; the outer gradient Δ = Σ w_m Δ_m = θ − θ̄ follows
  // on every worker alike. (Summing θ_m rather than Δ_m moves the same bytes, and keeps FedAvg,
  // θ ← θ̄, exact; see docs/diloco.md.)
  auto& average = average_->views();
  for (size_t i = 0; i < global_.size(); ++i) average[i].copy_(parameters_[i].detach());
  if (weight != 1.0) average_->flat().mul_(weight);
  stats += average_->all_reduce_sum(group_);

  // Nothing above changed any state: a PeerError leaves the round pending. From here on, commit.
  outer_->step_to_average(average);
  for (size_t i = 0; i < global_.size(); ++i) parameters_[i].copy_(global_[i]);
  ++round_;
  synced_step_ = step;
  step_ = step;
  round_tokens_ = 0;
  stats.participants = participants;

  SyncReport report;
  report.round = round_;
  report.step = step;
  report.world_size = participants;
  report.stats = stats;
  report.params_hash = hash_tensors(global_);
  report.stall_seconds = stats.seconds;
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
