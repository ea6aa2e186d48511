#include "loco/runtime/worker/inner_step.h"

#include <fmt/format.h>

#include <cmath>

#include "loco/core/error.h"
#include "loco/model/precision.h"
#include "loco/model/transformer.h"
#include "loco/runtime/config/config.h"
#include "loco/runtime/worker/weights.h"

namespace loco::runtime {

optim::AdamW make_inner_optimizer(const model::Transformer& model, const optim::AdamWOptions& options) {
  std::vector<optim::NamedParameter> named;
  for (const auto& [name, tensor] : model_weights(model)) named.push_back({name, tensor, tensor.dim() >= 2});
  return optim::AdamW(std::move(named), options);
}

InnerStepOptions inner_step_options(const RunConfig& config) {
  InnerStepOptions options;
  options.schedule = {config.optim.lr, config.optim.warmup_steps, config.train.steps, config.optim.min_lr_ratio};
  options.schedule.validate();
  options.rewarmup_steps = config.optim.rewarmup_steps;
  options.batch_size = config.train.batch_size;
  options.grad_accum = config.train.grad_accum;
  options.context = config.model.context;
  options.z_loss = config.train.z_loss;
  options.grad_clip = config.optim.grad_clip;
  return options;
}

InnerStep::InnerStep(model::Transformer& model, optim::AdamW& adamw, const InnerStepOptions& options, torch::Device device,
                     std::string intact)
    : model_(model), adamw_(adamw), device_(device), intact_(std::move(intact)), schedule_(options.schedule),
      rewarmup_steps_(options.rewarmup_steps), batch_size_(options.batch_size), grad_accum_(options.grad_accum),
      context_(options.context), z_loss_(options.z_loss), grad_clip_(options.grad_clip) {
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
