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
  // `skip`, a float scalar on the parameters' device, or undefined: where skips_on_device(), the
  // update is not applied when it holds 1 (a non-finite loss or gradient norm), decided on the
  // device with no host synchronization; elsewhere it is ignored, and the caller must read its
  // loss before stepping.
  void step(double lr, const torch::Tensor& skip = {});
  // Whether step() can skip an update on the device: on CUDA with a LibTorch that has the fused
  // AdamW kernel (2.2 and later), which then takes the step (one kernel launch per group of
  // parameters instead of the multi-tensor operations' several).
  bool skips_on_device() const { return fused_; }
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
  bool fused_ = false;
  torch::Tensor step_count_;  // fused_: the step count on the device, which the fused kernel reads
};

// Global L2 norm of all gradients, clipped in place to `max_norm` when max_norm > 0. Returns the
// norm before clipping (like torch.nn.utils.clip_grad_norm_), as a float scalar on the gradients'
// device: on a GPU nothing is read back to the host, so the queue of work is not drained. When
// the norm exceeds max_norm every gradient is scaled by max_norm / (norm + 1e-6) (on the CPU
// computed in double, as always; on a GPU in float32 on the device); otherwise the gradients are
// left as they are. Undefined when no parameter has a gradient.
torch::Tensor clip_gradients(const std::vector<torch::Tensor>& parameters, double max_norm);
// clip_gradients, with the norm read back (0 when no parameter has a gradient).
double clip_grad_norm(const std::vector<torch::Tensor>& parameters, double max_norm);

}  // namespace loco::optim
