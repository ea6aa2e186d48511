// AdamW (Loshchilov & Hutter 2019) with the exact update of torch.optim.AdamW, and with its state
// addressable by parameter name, so that checkpoints store it in safetensors and DiLoCo can keep
// one per worker (never averaged, never reset; docs/diloco.md).
//
// Weight decay is applied only to the parameters flagged `decay` (matrices and embeddings; not
// norm weights or biases). The learning rate is passed to every step() by the schedule.
#pragma once

#include <torch/types.h>
#include <torch/utils.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "loco/optim/options.h"

namespace loco::optim {

struct NamedParameter {
  std::string name;
  torch::Tensor tensor;
  bool decay = true;
};

class AdamW {
 public:
  AdamW(std::vector<NamedParameter> parameters, AdamWOptions options);

  // One update of every parameter that has a gradient, at learning rate `lr`. Not thread-safe.
  void step(double lr);
  void zero_grad();
  int64_t steps() const { return steps_; }

  // Moments by name: "<param>.exp_avg" and "<param>.exp_avg_sq" (fp32, same shapes as the params).
  std::vector<std::pair<std::string, torch::Tensor>> state() const;
  // Restores moments and the step count. Throws DataError naming a missing or misshapen entry.
  void load_state(const std::vector<std::pair<std::string, torch::Tensor>>& tensors, int64_t steps);

  const std::vector<NamedParameter>& parameters() const { return parameters_; }
  const AdamWOptions& options() const { return options_; }

 private:
  std::vector<NamedParameter> parameters_;
  std::vector<torch::Tensor> exp_avg_, exp_avg_sq_;
  AdamWOptions options_;
  int64_t steps_ = 0;
};

// Global L2 norm of all gradients, clipped in place to `max_norm` when max_norm > 0. Returns the
// norm before clipping (like torch.nn.utils.clip_grad_norm_).
double clip_grad_norm(const std::vector<torch::Tensor>& parameters, double max_norm);

}  // namespace loco::optim
