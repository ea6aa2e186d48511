// Inside comm: a tensor as the backends take it (group.cpp, all_reduce.cpp). Not for other folders.
#pragma once

#include <torch/types.h>
#include <torch/utils.h>

#include <vector>

#include "loco/core/error.h"

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

// Several tensors of one dtype as the one flat CPU buffer a collective sums (a view of a lone
// contiguous CPU tensor, else a copy), and the flat result written back into them (nothing to do
// when `flat` is that view). InternalError on mixed dtypes.
inline torch::Tensor flatten(const std::vector<torch::Tensor>& tensors) {
  for (const auto& t : tensors) {
    LOCO_CHECK(t.scalar_type() == tensors.front().scalar_type(), "all_reduce_sum: mixed dtypes {} and {}",
               c10::toString(tensors.front().scalar_type()), c10::toString(t.scalar_type()));
  }
  const auto& first = tensors.front();
  if (tensors.size() == 1 && first.device().is_cpu() && first.is_contiguous()) return first.view({-1});
  std::vector<torch::Tensor> views;
  for (const auto& t : tensors) views.push_back(t.to(torch::kCPU).reshape({-1}));
  return torch::cat(views);
}
inline void unflatten(const torch::Tensor& flat, std::vector<torch::Tensor>& tensors) {
  if (tensors.size() == 1 && flat.data_ptr() == tensors.front().data_ptr()) return;
  int64_t offset = 0;
  for (auto& t : tensors) {
    t.copy_(flat.narrow(0, offset, t.numel()).view(t.sizes()));
    offset += t.numel();
  }
}

}  // namespace loco::comm
