// Compute precision of the forward pass: bf16 autocast on CUDA, plain fp32 on CPU.
// Wraps libtorch's autocast API, whose names changed across versions (guarded here only).
#pragma once

#include <torch/types.h>
#include <torch/utils.h>

namespace loco::model {

// While alive, enables bf16 autocast for CUDA when `device` is CUDA and `enabled`; a no-op on CPU.
// Not thread-safe across threads sharing autocast state (autocast state is thread-local in torch).
class AutocastGuard {
 public:
  AutocastGuard(const torch::Device& device, bool enabled);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;
  bool active() const { return active_; }

 private:
  bool active_ = false;
  bool previous_ = false;
};

// Whether bf16 autocast for CUDA is on in this thread (what an AutocastGuard turned on).
bool cuda_autocast_enabled();

// "cpu" -> CPU; "cuda" / "cuda:N" -> CUDA (ConfigError when this LibTorch has no CUDA or no GPU);
// "auto" -> CUDA when available, else CPU.
torch::Device resolve_device(const std::string& name);

}  // namespace loco::model
