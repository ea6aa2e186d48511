#include "loco/model/precision.h"

#include <ATen/autocast_mode.h>
#include <torch/torch.h>  // torch::cuda
#include <torch/version.h>

#include "loco/core/error.h"

namespace loco::model {

#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
#define LOCO_AUTOCAST_BY_DEVICE 1
#endif

AutocastGuard::AutocastGuard(const torch::Device& device, bool enabled) {
  if (!enabled || !device.is_cuda()) return;
#ifdef LOCO_AUTOCAST_BY_DEVICE
  previous_ = at::autocast::is_autocast_enabled(at::kCUDA);
  at::autocast::set_autocast_enabled(at::kCUDA, true);
  at::autocast::set_autocast_dtype(at::kCUDA, at::kBFloat16);
#else
  previous_ = at::autocast::is_enabled();
  at::autocast::set_enabled(true);
  at::autocast::set_autocast_gpu_dtype(at::kBFloat16);
#endif
  active_ = true;
}

AutocastGuard::~AutocastGuard() {
  if (!active_) return;
#ifdef LOCO_AUTOCAST_BY_DEVICE
  at::autocast::set_autocast_enabled(at::kCUDA, previous_);
#else
  at::autocast::set_enabled(previous_);
#endif
  at::autocast::clear_cache();
}

bool cuda_autocast_enabled() {
#ifdef LOCO_AUTOCAST_BY_DEVICE
  return at::autocast::is_autocast_enabled(at::kCUDA);
#else
  return at::autocast::is_enabled();
#endif
}

torch::Device resolve_device(const std::string& name) {
  if (name == "auto") return torch::cuda::is_available() ? torch::Device(torch::kCUDA) : torch::Device(torch::kCPU);
  if (name == "cpu") return torch::Device(torch::kCPU);
  if (name == "cuda" || name.starts_with("cuda:")) {
    if (!torch::cuda::is_available()) {
      throw ConfigError("model", fmt::format("device '{}' requested but no CUDA GPU is usable with this LibTorch; "
                                             "hint: use device = \"cpu\" or build against a CUDA LibTorch",
                                             name));
    }
    return torch::Device(name);
  }
  throw ConfigError("model", fmt::format("unknown device '{}': expected auto, cpu, cuda or cuda:N", name));
}

}  // namespace loco::model
