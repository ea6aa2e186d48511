// Inside comm: a tensor as the backends take it (group.cpp, all_reduce.cpp). Not for other folders.
#pragma once

#include <torch/types.h>
#include <torch/utils.h>

namespace loco::comm {

// Backends take contiguous CPU tensors. A tensor that is neither is staged through a contiguous
// CPU copy and written back after the operation (CUDA tensors cross host memory this way).
struct Staged {
  explicit Staged(torch::Tensor& original) : original_(original) {
    needs_copy_ = !original.device().is_cpu() || !original.is_contiguous();
    staged = needs_copy_ ? original.to(torch::kCPU).contiguous() : original;
  }
  void write_back() {
    if (needs_copy_) original_.copy_(staged);
  }
  torch::Tensor staged;

 private:
  torch::Tensor& original_;
  bool needs_copy_ = false;
};

}  // namespace loco::comm
