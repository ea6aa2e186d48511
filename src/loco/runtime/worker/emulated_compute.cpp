#include "loco/runtime/worker/emulated_compute.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <thread>

#include "loco/model/transformer.h"

namespace loco::runtime {

EmulatedCompute::EmulatedCompute(model::Transformer& model, double step_s, uint64_t seed, bool gradients)
    : gradients_(gradients), step_s_(step_s) {
  torch::NoGradGuard no_grad;
  auto generator = at::detail::createCPUGenerator(seed);
  const auto first = model->parameters().front();
  tile_ = torch::randn({kTile}, generator).to(first.device(), first.scalar_type());
  for (auto& p : model->parameters()) {
    auto flat = p.view(-1);
    torch::Tensor flat_gradient;
    if (gradients_) {
      p.mutable_grad() = torch::empty_like(p);
      flat_gradient = p.mutable_grad().view(-1);
    }
    for (int64_t offset = 0; offset < flat.numel(); offset += kTile) {
      const int64_t length = std::min(kTile, flat.numel() - offset);
      Piece piece{flat.narrow(0, offset, length), {}};
      if (gradients_) {
        piece.gradient = flat_gradient.narrow(0, offset, length);
        piece.gradient.copy_(tile_.narrow(0, 0, length));
      }
      pieces_.push_back(std::move(piece));
    }
  }
}

void EmulatedCompute::forward_backward() {
  std::this_thread::sleep_for(std::chrono::duration<double>(std::max(0.0, step_s_ - update_s_)));
}

void EmulatedCompute::update(double lr) {
  const auto start = std::chrono::steady_clock::now();
  torch::NoGradGuard no_grad;
  for (auto& pending : pending_lr_) pending += lr;
  const auto part = static_cast<size_t>(steps_ % kRotation);
  const double move = pending_lr_[part];
  pending_lr_[part] = 0;
  for (size_t i = part; i < pieces_.size(); i += kRotation) {
    auto& piece = pieces_[i];
    if (gradients_) {
      piece.parameter.add_(piece.gradient, -move);
    } else {
      piece.parameter.add_(tile_.narrow(0, 0, piece.parameter.numel()), -move);
    }
  }
  ++steps_;
  update_s_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace loco::runtime
