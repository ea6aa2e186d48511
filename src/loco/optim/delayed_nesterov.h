// Delayed Nesterov: the outer optimizer of asynchronous DiLoCo (Liu et al. 2024, arXiv 2401.09135,
// Algorithm 3; docs/async.md), which applies each worker's outer gradient g as it arrives.
//
//   Σ ← Σ + g                                       the arrivals since the momentum last moved
//   every N-th arrival:  m ← β m + Σ / N ;  θ ← θ − η (g / N + β m) ;  Σ ← 0
//   otherwise:           θ ← θ − η g / N                                 (no momentum)
//
// Over N arrivals θ moves by −η (mean g + β m): synchronous DiLoCo's Nesterov step (outer.h) on
// their mean, with the momentum moved once per N arrivals rather than by each stale one. N = 1 is
// Nesterov on every arrival. θ is one flat fp32 tensor, updated in place.
//
// State by name, for checkpoints: "momentum", "pending" (Σ) and "arrivals" (a 0-dim int64 tensor).
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace loco::optim {

class DelayedNesterov {
 public:
  DelayedNesterov(torch::Tensor parameters, double lr, double momentum, int64_t delay);

  // One arrival: `outer_gradient` has θ's shape (fp32).
  void step(const torch::Tensor& outer_gradient);
  int64_t arrivals() const { return arrivals_; }
  int64_t delay() const { return delay_; }

  std::vector<std::pair<std::string, torch::Tensor>> state() const;
  // Restores what state() returned. Throws DataError naming a missing, extra or misshapen entry.
  void load_state(const std::vector<std::pair<std::string, torch::Tensor>>& tensors);

 private:
  torch::Tensor parameters_, momentum_, pending_;
  double lr_, beta_;
  int64_t delay_;
  int64_t arrivals_ = 0;
};

}  // namespace loco::optim
