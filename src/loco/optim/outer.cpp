#include "loco/optim/outer.h"

#include <fmt/ranges.h>

#include <cmath>
#include <map>

#include "loco/core/error.h"

namespace loco::optim {

OuterOptimizer::OuterOptimizer(std::vector<std::string> names, std::vector<torch::Tensor> parameters, OuterOptions options)
    : names_(std::move(names)), parameters_(std::move(parameters)), options_(options) {
  options_.validate();
  LOCO_CHECK(names_.size() == parameters_.size(), "{} names for {} parameters", names_.size(), parameters_.size());
  const bool has_first = options_.kind != OuterKind::kSgd || options_.momentum > 0;
  for (const auto& p : parameters_) {
    LOCO_CHECK(p.scalar_type() == torch::kFloat32, "the global copy must be fp32, got {}", c10::toString(p.scalar_type()));
    if (has_first) first_.push_back(torch::zeros_like(p));
    if (options_.kind == OuterKind::kAdam) second_.push_back(torch::zeros_like(p));
  }
}

void OuterOptimizer::step(const std::vector<torch::Tensor>& outer_gradients) { update(&outer_gradients, nullptr); }

void OuterOptimizer::step_to_average(const std::vector<torch::Tensor>& averages) { update(nullptr, &averages); }

void OuterOptimizer::update(const std::vector<torch::Tensor>* outer_gradients, const std::vector<torch::Tensor>* averages) {
  const auto& given = outer_gradients != nullptr ? *outer_gradients : *averages;
  LOCO_CHECK(given.size() == parameters_.size(), "{} tensors for {} parameters", given.size(), parameters_.size());
  torch::NoGradGuard no_grad;
  ++steps_;
  const double lr = options_.lr;
  double mu = options_.momentum;
  if (options_.kind != OuterKind::kAdam && options_.momentum_warmup > 0) {
    mu *= std::min(1.0, static_cast<double>(steps_) / static_cast<double>(options_.momentum_warmup));
  }
  for (size_t i = 0; i < parameters_.size(); ++i) {
    auto& theta = parameters_[i];
    LOCO_CHECK(given[i].sizes().equals(theta.sizes()), "outer step: '{}' has the wrong shape", names_[i]);
    if (averages != nullptr && options_.kind == OuterKind::kSgd && first_.empty()) {
      theta.lerp_(given[i], lr);  // θ + η (θ̄ − θ), exact at η = 1
      continue;
    }
    const torch::Tensor delta = outer_gradients != nullptr ? given[i] : theta - given[i];
    switch (options_.kind) {
      case OuterKind::kNesterov:
        first_[i].mul_(mu).add_(delta);                        // v ← μ v + Δ
        theta.sub_(delta + mu * first_[i], lr);                // θ ← θ − η (Δ + μ v)
        break;
      case OuterKind::kSgd:
        if (first_.empty()) {
          theta.sub_(delta, lr);                               // θ ← θ − η Δ
        } else {
          first_[i].mul_(mu).add_(delta);                      // v ← μ v + Δ
          theta.sub_(first_[i], lr);                           // θ ← θ − η v
        }
        break;
      case OuterKind::kAdam: {
        const double bias1 = 1 - std::pow(mu, static_cast<double>(steps_));
        const double bias2 = 1 - std::pow(options_.beta2, static_cast<double>(steps_));
        first_[i].mul_(mu).add_(delta, 1 - mu);
        second_[i].mul_(options_.beta2).addcmul_(delta, delta, 1 - options_.beta2);
        auto denom = (second_[i].sqrt() / std::sqrt(bias2)).add_(options_.eps);
        theta.addcdiv_(first_[i], denom, -lr / bias1);
        break;
      }
    }
  }
}

std::vector<std::pair<std::string, torch::Tensor>> OuterOptimizer::state() const {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  const char* first_name = options_.kind == OuterKind::kAdam ? ".exp_avg" : ".momentum";
  for (size_t i = 0; i < first_.size(); ++i) out.emplace_back(names_[i] + first_name, first_[i]);
  for (size_t i = 0; i < second_.size(); ++i) out.emplace_back(names_[i] + ".exp_avg_sq", second_[i]);
  out.emplace_back("steps", torch::tensor(steps_, torch::kInt64));
  return out;
}

void OuterOptimizer::load_state(const std::vector<std::pair<std::string, torch::Tensor>>& tensors) {
  std::map<std::string, torch::Tensor> by_name(tensors.begin(), tensors.end());
  auto take = [&](const std::string& key) {
    auto it = by_name.find(key);
    if (it == by_name.end()) {
      throw DataError("optim", fmt::format("outer optimizer state has no entry '{}' (was it saved with outer.optimizer = "
                                           "\"{}\"?)", key, to_string(options_.kind)));
    }
    auto value = it->second;
    by_name.erase(it);
    return value;
  };
  torch::NoGradGuard no_grad;
  const char* first_name = options_.kind == OuterKind::kAdam ? ".exp_avg" : ".momentum";
  auto restore = [&](std::vector<torch::Tensor>& into, const char* suffix) {
    for (size_t i = 0; i < into.size(); ++i) {
      auto value = take(names_[i] + suffix);
      if (!value.sizes().equals(into[i].sizes())) {
        throw DataError("optim", fmt::format("outer optimizer state '{}{}' has shape [{}], the model needs [{}]", names_[i],
                                             suffix, fmt::join(value.sizes(), ", "), fmt::join(into[i].sizes(), ", ")));
      }
      into[i].copy_(value);
    }
  };
  restore(first_, first_name);
  restore(second_, ".exp_avg_sq");
  steps_ = take("steps").item<int64_t>();
  if (!by_name.empty()) {
    throw DataError("optim", fmt::format("outer optimizer state has an unexpected entry '{}'", by_name.begin()->first));
  }
}

}  // namespace loco::optim
