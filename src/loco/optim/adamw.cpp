#include "loco/optim/adamw.h"

#include <cmath>
#include <fmt/ranges.h>
#include <torch/version.h>

#include <algorithm>
#include <map>

#include "loco/core/error.h"

// The fused AdamW kernel (aten::_fused_adamw_) with its found_inf argument: LibTorch 2.2 and later.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 2)
#define LOCO_FUSED_ADAMW 1
#else
#define LOCO_FUSED_ADAMW 0
#endif

namespace loco::optim {

AdamW::AdamW(std::vector<NamedParameter> parameters, AdamWOptions options)
    : parameters_(std::move(parameters)), options_(options) {
  options_.validate();
  for (const auto& p : parameters_) {
    exp_avg_.push_back(torch::zeros_like(p.tensor, torch::kFloat32));
    exp_avg_sq_.push_back(torch::zeros_like(p.tensor, torch::kFloat32));
  }
#if LOCO_FUSED_ADAMW
  const bool on_gpu = !parameters_.empty() && std::all_of(parameters_.begin(), parameters_.end(), [&](const auto& p) {
    return p.tensor.is_cuda() && p.tensor.scalar_type() == torch::kFloat32 && p.tensor.device() == parameters_[0].tensor.device();
  });
  if (on_gpu) {
    fused_ = true;
    step_count_ = torch::zeros({}, parameters_[0].tensor.options());
  }
#endif
}

void AdamW::step(double lr, const torch::Tensor& skip) {
  torch::NoGradGuard no_grad;
  ++steps_;
#if LOCO_FUSED_ADAMW
  if (fused_) {
    step_count_.fill_(static_cast<double>(steps_));
    // Two groups, decayed and not, each one launch: decoupled decay, the moments, the
    // bias-corrected update, as torch.optim.AdamW(fused=True) does.
    for (const bool decay : {true, false}) {
      std::vector<torch::Tensor> params, grads, exp_avg, exp_avg_sq, steps;
      for (size_t i = 0; i < parameters_.size(); ++i) {
        const auto& p = parameters_[i].tensor;
        if (parameters_[i].decay != decay || !p.grad().defined()) continue;
        params.push_back(p);
        grads.push_back(p.grad());
        exp_avg.push_back(exp_avg_[i]);
        exp_avg_sq.push_back(exp_avg_sq_[i]);
        steps.push_back(step_count_);
      }
      if (params.empty()) continue;
      const double weight_decay = decay ? options_.weight_decay : 0.0;
      if (skip.defined()) {
        at::_fused_adamw_(params, grads, exp_avg, exp_avg_sq, /*max_exp_avg_sqs=*/{}, steps, lr, options_.beta1,
                          options_.beta2, weight_decay, options_.eps, /*amsgrad=*/false, /*maximize=*/false,
                          /*grad_scale=*/{}, /*found_inf=*/skip);
      } else {
        at::_fused_adamw_(params, grads, exp_avg, exp_avg_sq, /*max_exp_avg_sqs=*/{}, steps, lr, options_.beta1,
                          options_.beta2, weight_decay, options_.eps, /*amsgrad=*/false, /*maximize=*/false,
                          /*grad_scale=*/{}, /*found_inf=*/{});
      }
    }
    return;
  }
#endif
  (void)skip;
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

torch::Tensor clip_gradients(const std::vector<torch::Tensor>& parameters, double max_norm) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> grads;
  for (const auto& p : parameters) {
    if (p.grad().defined()) grads.push_back(p.grad());
  }
  if (grads.empty()) return {};
  // On a GPU, multi-tensor kernels; elsewhere one operation per tensor, as before.
  const bool lists = LOCO_FUSED_ADAMW && grads[0].is_cuda();
  std::vector<torch::Tensor> norms;
  if (lists) {
    norms = at::_foreach_norm(grads);
  } else {
    for (const auto& g : grads) norms.push_back(g.detach().to(torch::kFloat32).norm());
  }
  auto total = torch::stack(norms).to(torch::kFloat32).norm();
  if (max_norm <= 0) return total;
  if (!total.is_cuda()) {
    // On the CPU reading costs nothing, and the scale in double is the one every CPU run so far
    // was made with (bit for bit).
    const double norm = total.item<double>();
    if (norm > max_norm) {
      for (auto& g : grads) g.mul_(max_norm / (norm + 1e-6));
    }
    return total;
  }
  // max_norm / (norm + 1e-6) where the norm exceeds max_norm, else exactly 1: decided on the
  // device, so nothing is read.
  auto scale = torch::where(total > max_norm, max_norm / (total + 1e-6), torch::ones_like(total));
#if LOCO_FUSED_ADAMW
  if (lists) {
    at::_foreach_mul_(grads, scale);
    return total;
  }
#endif
  for (auto& g : grads) g.mul_(scale.to(g.scalar_type()));
  return total;
}

double clip_grad_norm(const std::vector<torch::Tensor>& parameters, double max_norm) {
  const auto total = clip_gradients(parameters, max_norm);
  return total.defined() ? total.item<double>() : 0.0;
}

}  // namespace loco::optim
