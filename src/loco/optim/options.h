// The optimizers' options, with no torch: inner AdamW's (adamw.h) and DiLoCo's outer optimizer's
// (outer.h), for the config that names them.
#pragma once

#include <cstdint>

namespace loco::optim {

struct AdamWOptions {
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;
  // Throws ConfigError("[optim] ...") naming the bad option.
  void validate() const;
};

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

}  // namespace loco::optim
