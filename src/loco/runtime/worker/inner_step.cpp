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

model::LossParts training_loss(model::Transformer& model, const torch::Tensor& inputs, const torch::Tensor& targets,
                               double z_loss) {
  if (inputs.is_cuda()) return model->loss(inputs, targets, z_loss);
  return model::language_model_loss(model->forward(inputs), targets, z_loss);
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

namespace {

// A batch's tensor on `device`: on a GPU staged in pinned memory and copied without waiting (the
// caching host allocator keeps the pinned block until the copy has run).
torch::Tensor to_device(const torch::Tensor& tensor, const torch::Device& device) {
  if (!device.is_cuda()) return tensor.to(device);
  return tensor.pin_memory().to(device, /*non_blocking=*/true);
}

}  // namespace

torch::Tensor InnerStep::forward_backward(data::WindowSampler& source) {
  adamw_.zero_grad();
  auto loss = torch::zeros({}, torch::TensorOptions().dtype(torch::kFloat32).device(device_));
  for (int64_t micro = 0; micro < grad_accum_; ++micro) {
    auto batch = source.next(batch_size_);
    if ((batch.targets != data::kIgnoredTarget).sum().item<int64_t>() == 0) continue;  // only routing tokens (host tensors)
    model::LossParts parts;
    {
      model::AutocastGuard autocast(device_, true);
      parts = training_loss(model_, to_device(batch.inputs, device_), to_device(batch.targets, device_), z_loss_);
    }
    (parts.loss / static_cast<double>(grad_accum_)).backward();
    loss += parts.cross_entropy.detach().to(torch::kFloat32) / static_cast<double>(grad_accum_);
  }
  return loss;
}

double InnerStep::read(const torch::Tensor& value, int64_t step, const char* what) const {
  const double x = value.defined() ? value.item<double>() : 0.0;
  check(x, step, what);
  return x;
}

void InnerStep::check(double value, int64_t step, const char* what) const {
  if (std::isfinite(value)) return;
  throw Error("train", fmt::format("the {} became {} at step {}; hint: lower optim.lr or enable optim.grad_clip ({})", what,
                                   value, step, intact_));
}

torch::Tensor InnerStep::update(double lr, const torch::Tensor& loss) {
  auto norm = optim::clip_gradients(parameters_, grad_clip_);
  torch::Tensor skip;
  if (adamw_.skips_on_device()) {
    // 1 when the loss or the norm is not finite (a sum is finite only when both are).
    skip = norm.defined() ? torch::isfinite(loss + norm).logical_not().to(torch::kFloat32)
                          : torch::isfinite(loss).logical_not().to(torch::kFloat32);
  }
  adamw_.step(lr, skip);
  return norm;
}

double InnerStep::step(data::WindowSampler& source, int64_t step, double lr) {
  const auto loss = forward_backward(source);
  const double value = read(loss, step);
  update(lr, loss);
  return value;
}

}  // namespace loco::runtime
