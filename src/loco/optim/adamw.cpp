#include "loco/optim/adamw.h"

#include <cmath>
#include <fmt/ranges.h>

#include <map>

#include "loco/core/error.h"

namespace loco::optim {

AdamW::AdamW(std::vector<NamedParameter> parameters, AdamWOptions options)
    : parameters_(std::move(parameters)), options_(options) {
  options_.validate();
  for (const auto& p : parameters_) {
    exp_avg_.push_back(torch::zeros_like(p.tensor, torch::kFloat32));
    exp_avg_sq_.push_back(torch::zeros_like(p.tensor, torch::kFloat32));
  }
}

void AdamW::step(double lr) {
  torch::NoGradGuard no_grad;
  ++steps_;
  const double bias1 = 1 - std::pow(options_.beta1, static_cast<double>(steps_));
  const double bias2 = 1 - std::pow(options_.beta2, static_cast<double>(steps_));
  const double step_size = lr / bias1;
  const double bias2_sqrt = std::sqrt(bias2);
  // The parameters with a gradient, updated as lists: on CUDA each line below is a few fused
  // multi-tensor kernels instead of one kernel per parameter; on the CPU the same per-tensor
  // operations run in the same order, so results are unchanged.
  std::vector<torch::Tensor> params, grads, exp_avg, exp_avg_sq, decaying;
  for (size_t i = 0; i < parameters_.size(); ++i) {
    auto& p = parameters_[i].tensor;
    if (!p.grad().defined()) continue;
    params.push_back(p);
    grads.push_back(p.grad());
    exp_avg.push_back(exp_avg_[i]);
    exp_avg_sq.push_back(exp_avg_sq_[i]);
    if (parameters_[i].decay) decaying.push_back(p);
  }
  if (params.empty()) return;
  // Same operation order as torch.optim.AdamW (decoupled decay first), so results match it.
  if (options_.weight_decay != 0 && !decaying.empty()) at::_foreach_mul_(decaying, 1 - lr * options_.weight_decay);
  at::_foreach_mul_(exp_avg, options_.beta1);
  at::_foreach_add_(exp_avg, grads, 1 - options_.beta1);
  at::_foreach_mul_(exp_avg_sq, options_.beta2);
  at::_foreach_addcmul_(exp_avg_sq, grads, grads, 1 - options_.beta2);
  auto denom = at::_foreach_sqrt(exp_avg_sq);
  at::_foreach_div_(denom, bias2_sqrt);
  at::_foreach_add_(denom, options_.eps);
  at::_foreach_addcdiv_(params, exp_avg, denom, -step_size);
}

void AdamW::zero_grad() {
  for (auto& p : parameters_) {
    if (p.tensor.grad().defined()) p.tensor.mutable_grad().reset();
  }
}

std::vector<std::pair<std::string, torch::Tensor>> AdamW::state() const {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (size_t i = 0; i < parameters_.size(); ++i) {
    out.emplace_back(parameters_[i].name + ".exp_avg", exp_avg_[i]);
    out.emplace_back(parameters_[i].name + ".exp_avg_sq", exp_avg_sq_[i]);
  }
  return out;
}

void AdamW::load_state(const std::vector<std::pair<std::string, torch::Tensor>>& tensors, int64_t steps) {
  std::map<std::string, torch::Tensor> by_name(tensors.begin(), tensors.end());
  torch::NoGradGuard no_grad;
  auto restore = [&](const std::string& key, torch::Tensor& into) {
    auto it = by_name.find(key);
    if (it == by_name.end()) throw DataError("optim", fmt::format("optimizer state has no entry '{}'", key));
    if (!it->second.sizes().equals(into.sizes())) {
      throw DataError("optim", fmt::format("optimizer state '{}' has shape {}, the model needs {}", key,
                                           fmt::join(it->second.sizes(), "x"), fmt::join(into.sizes(), "x")));
    }
    into.copy_(it->second);
  };
  for (size_t i = 0; i < parameters_.size(); ++i) {
    restore(parameters_[i].name + ".exp_avg", exp_avg_[i]);
    restore(parameters_[i].name + ".exp_avg_sq", exp_avg_sq_[i]);
  }
  if (by_name.size() != 2 * parameters_.size()) {
    throw DataError("optim", fmt::format("optimizer state has {} entries, the model needs {}", by_name.size(),
                                         2 * parameters_.size()));
  }
  steps_ = steps;
}

double clip_grad_norm(const std::vector<torch::Tensor>& parameters, double max_norm) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> norms;
  for (const auto& p : parameters) {
    if (p.grad().defined()) norms.push_back(p.grad().detach().to(torch::kFloat32).norm());
  }
  if (norms.empty()) return 0.0;
  const double total = torch::stack(norms).norm().item<double>();
  if (max_norm > 0 && total > max_norm) {
    const double scale = max_norm / (total + 1e-6);
    for (const auto& p : parameters) {
      if (p.grad().defined()) p.grad().mul_(scale);
    }
  }
  return total;
}

}  // namespace loco::optim
