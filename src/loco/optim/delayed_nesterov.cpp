#include "loco/optim/delayed_nesterov.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <map>

#include "loco/core/error.h"

namespace loco::optim {

DelayedNesterov::DelayedNesterov(torch::Tensor parameters, double lr, double momentum, int64_t delay)
    : parameters_(std::move(parameters)), lr_(lr), beta_(momentum), delay_(delay) {
  LOCO_CHECK(parameters_.scalar_type() == torch::kFloat32, "the global copy must be fp32");
  LOCO_CHECK(delay_ >= 1, "the momentum's delay must be >= 1, got {}", delay_);
  momentum_ = torch::zeros_like(parameters_);
  pending_ = torch::zeros_like(parameters_);
}

void DelayedNesterov::step(const torch::Tensor& g) {
  LOCO_CHECK(g.sizes().equals(parameters_.sizes()), "delayed Nesterov: the outer gradient has the wrong shape");
  torch::NoGradGuard no_grad;
  ++arrivals_;
  const double n = static_cast<double>(delay_);
  pending_.add_(g);
  if (arrivals_ % delay_ == 0) {
    momentum_.mul_(beta_).add_(pending_, 1 / n);                 // m ← β m + Σ / N
    parameters_.sub_(g / n + beta_ * momentum_, lr_);            // θ ← θ − η (g / N + β m)
    pending_.zero_();
  } else {
    parameters_.sub_(g, lr_ / n);                                // θ ← θ − η g / N
  }
}

std::vector<std::pair<std::string, torch::Tensor>> DelayedNesterov::state() const {
  return {{"momentum", momentum_}, {"pending", pending_}, {"arrivals", torch::tensor(arrivals_, torch::kInt64)}};
}

void DelayedNesterov::load_state(const std::vector<std::pair<std::string, torch::Tensor>>& tensors) {
  std::map<std::string, torch::Tensor> by_name(tensors.begin(), tensors.end());
  auto take = [&](const std::string& key) {
    auto it = by_name.find(key);
    if (it == by_name.end()) throw DataError("optim", fmt::format("delayed Nesterov state has no entry '{}'", key));
    auto value = it->second;
    by_name.erase(it);
    return value;
  };
  torch::NoGradGuard no_grad;
  using Entry = std::pair<const char*, torch::Tensor*>;
  for (const auto& [name, into] : {Entry{"momentum", &momentum_}, Entry{"pending", &pending_}}) {
    auto value = take(name);
    if (!value.sizes().equals(into->sizes())) {
      throw DataError("optim", fmt::format("delayed Nesterov state '{}' has shape [{}], the model needs [{}]", name,
                                           fmt::join(value.sizes(), ", "), fmt::join(into->sizes(), ", ")));
    }
    into->copy_(value);
  }
  arrivals_ = take("arrivals").item<int64_t>();
  if (!by_name.empty()) throw DataError("optim", fmt::format("delayed Nesterov state has an unexpected entry '{}'", by_name.begin()->first));
}

}  // namespace loco::optim
