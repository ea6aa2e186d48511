// The outer optimizer of DiLoCo: it applies the averaged outer gradient Δ = θ − mean(θ_m) to the
// global parameters θ (fp32), once per round (docs/diloco.md; Douillard et al. 2023, Alg. 1).
//
//   nesterov  v ← μ v + Δ ;  θ ← θ − η (Δ + μ v)          the published choice (η 0.7, μ 0.9)
//   sgd       μ = 0: θ ← θ − η Δ  (η 1: FedAvg, θ becomes the workers' average θ̄)
//             μ > 0: v ← μ v + Δ ;  θ ← θ − η v          (heavy ball)
//   adam      Adam on Δ (β1 = μ, β2, ε, bias-corrected), no weight decay
//
// State by name, so it travels in checkpoints: "<param>.momentum" (nesterov, heavy-ball sgd),
// "<param>.exp_avg" and "<param>.exp_avg_sq" (adam), and "steps" (a 0-dim int64 tensor).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace loco::optim {

enum class OuterKind { kNesterov, kSgd, kAdam };
const char* to_string(OuterKind kind);

struct OuterOptions {
  OuterKind kind = OuterKind::kNesterov;
  double lr = 0.7;        // η
  double momentum = 0.9;  // μ (nesterov, sgd); β1 (adam)
  double beta2 = 0.95;    // adam only
  // adam only: the DiLoCo paper found outer Adam stable only with ε about 0.1. Outer gradients are
  // mostly smaller than that, so Adam then acts as momentum SGD with rate η/ε on small Δ and as
  // sign descent of size η on large ones.
  double eps = 0.1;
  // nesterov and sgd: the momentum of outer step t (from 1) is μ · min(1, t / momentum_warmup), so
  // that the first rounds' outer gradients are not amplified up to 1 / (1 − μ) times before the
  // momentum has seen any; 0 = μ from the first step.
  int64_t momentum_warmup = 0;
  // Throws ConfigError("[optim] ...") naming the bad option.
  void validate() const;
};

// The defaults of each kind: nesterov η 0.7 μ 0.9 and sgd η 1 μ 0 (FedAvg), as published; adam
// η 0.1, β1 0.9, ε 0.1 (with ε 0.1, η 0.1 moves θ by about the averaged Δ when Δ is small).
OuterOptions default_outer_options(OuterKind kind);

class OuterOptimizer {
 public:
  // `parameters` are the global copy θ (fp32, any device), updated in place by step().
  OuterOptimizer(std::vector<std::string> names, std::vector<torch::Tensor> parameters, OuterOptions options);

  // One outer step: `outer_gradients[i]` is Δ for parameters[i] (same shape; fp32).
  void step(const std::vector<torch::Tensor>& outer_gradients);
  // The same step given the workers' weighted average θ̄ = Σ w_m θ_m instead, Δ = θ − θ̄. SGD
  // without momentum then computes θ ← lerp(θ, θ̄, η), which is θ̄ exactly for η = 1 (FedAvg),
  // where θ − fl(θ − θ̄) can be off by a rounding.
  void step_to_average(const std::vector<torch::Tensor>& averages);
  int64_t steps() const { return steps_; }
  const OuterOptions& options() const { return options_; }

  std::vector<std::pair<std::string, torch::Tensor>> state() const;
  // Restores what state() returned. Throws DataError naming a missing, extra or misshapen entry.
  void load_state(const std::vector<std::pair<std::string, torch::Tensor>>& tensors);

 private:
  void update(const std::vector<torch::Tensor>* outer_gradients, const std::vector<torch::Tensor>* averages);
  std::vector<std::string> names_;
  std::vector<torch::Tensor> parameters_;
  std::vector<torch::Tensor> first_, second_;  // momentum / exp_avg; exp_avg_sq (adam)
  OuterOptions options_;
  int64_t steps_ = 0;
};

}  // namespace loco::optim
