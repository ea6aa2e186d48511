#include "loco/algorithms/ddp.h"

#include "loco/core/error.h"
#include "loco/model/transformer.h"

namespace loco::algorithms {

Ddp::Ddp(comm::Group group, DdpOptions options) : group_(std::move(group)), options_(options) {}

SyncReports Ddp::on_start(model::Transformer& model, int64_t step) {
  parameters_ = model->parameters();
  buffer_ = std::make_unique<FlatBuffer>(parameters_, options_.piece_bytes);
  check_identical(group_, parameters_, "the parameters at step " + std::to_string(step));
  rounds_ = step;
  return {};
}

SyncReports Ddp::after_backward(StepContext& context) {
  (void)context;
  torch::NoGradGuard no_grad;
  auto& views = buffer_->views();
  for (size_t i = 0; i < parameters_.size(); ++i) {
    const auto& grad = parameters_[i].grad();
    if (grad.defined()) views[i].copy_(grad);
    else views[i].zero_();
  }
  pending_ = buffer_->all_reduce_sum(group_);
  buffer_->flat().div_(static_cast<double>(group_.size()));  // equal batches: the mean is the M× batch's gradient
  for (size_t i = 0; i < parameters_.size(); ++i) {
    auto& p = parameters_[i];
    if (p.grad().defined()) p.mutable_grad().copy_(views[i]);
    else p.mutable_grad() = views[i].to(p.device()).clone();
  }
  return {};
}

SyncReports Ddp::after_step(StepContext& context) {
  SyncReport report;
  report.round = ++rounds_;
  report.step = context.step + 1;
  report.world_size = group_.size();
  report.stats = pending_;
  report.params_hash = hash_tensors(parameters_);
  report.stall_seconds = pending_.seconds;
  return {report};
}

}  // namespace loco::algorithms
