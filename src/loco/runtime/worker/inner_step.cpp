#include "loco/runtime/worker/inner_step.h"

#include <fmt/format.h>

#include <cmath>

#include "loco/core/error.h"
#include "loco/model/precision.h"
#include "loco/runtime/worker/weights.h"

namespace loco::runtime {

optim::AdamW make_inner_optimizer(const model::Transformer& model, const RunConfig& config) {
  std::vector<optim::NamedParameter> named;
  for (const auto& [name, tensor] : model_weights(model)) named.push_back({name, tensor, tensor.dim() >= 2});
  return optim::AdamW(std::move(named), config.optim.adamw);
}

optim::ScheduleOptions inner_schedule(const RunConfig& config) {
  optim::ScheduleOptions schedule{config.optim.lr, config.optim.warmup_steps, config.train.steps, config.optim.min_lr_ratio};
  schedule.validate();
  return schedule;
}

InnerStep::InnerStep(model::Transformer& model, optim::AdamW& adamw, const RunConfig& config, torch::Device device,
                     std::string intact)
    : model_(model), adamw_(adamw), device_(device), intact_(std::move(intact)), schedule_(inner_schedule(config)),
      rewarmup_steps_(config.optim.rewarmup_steps), batch_size_(config.train.batch_size),
      grad_accum_(config.train.grad_accum), context_(config.model.context), z_loss_(config.train.z_loss),
      grad_clip_(config.optim.grad_clip) {
  for (const auto& p : adamw_.parameters()) parameters_.push_back(p.tensor);
}

double InnerStep::learning_rate(int64_t step) const {
  double lr = optim::learning_rate(schedule_, step);
  if (rewarm_from_) lr *= optim::rewarmup_factor(step - *rewarm_from_, rewarmup_steps_);
  return lr;
}

double InnerStep::forward_backward(data::WindowSampler& source, int64_t step) {
  adamw_.zero_grad();
  double loss = 0;
  for (int64_t micro = 0; micro < grad_accum_; ++micro) {
    auto batch = source.next(batch_size_);
    if ((batch.targets != data::kIgnoredTarget).sum().item<int64_t>() == 0) continue;  // only routing tokens
    torch::Tensor total, cross_entropy;
    {
      model::AutocastGuard autocast(device_, true);
      auto logits = model_->forward(batch.inputs.to(device_));  // (B, T, V)
      auto parts = model::language_model_loss(logits, batch.targets.to(device_), z_loss_);
      total = parts.loss;
      cross_entropy = parts.cross_entropy;
    }
    (total / static_cast<double>(grad_accum_)).backward();
    loss += cross_entropy.item<double>() / static_cast<double>(grad_accum_);
  }
  if (!std::isfinite(loss)) {
    throw Error("train", fmt::format("the loss became {} at step {}; hint: lower optim.lr or enable optim.grad_clip ({})",
                                     loss, step, intact_));
  }
  return loss;
}

double InnerStep::update(double lr) {
  const double norm = optim::clip_grad_norm(parameters_, grad_clip_);
  adamw_.step(lr);
  return norm;
}

}  // namespace loco::runtime
