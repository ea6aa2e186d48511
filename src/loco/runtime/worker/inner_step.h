// One inner training step: what the training loop (trainer.h) and DiPaCo's path tasks
// (runtime/dipaco/path_task.cpp) share, written once. A step is grad_accum micro-batches of forward
// and backward from a sampler, a check that the loss is finite, gradient clipping and the AdamW
// step at the schedule's learning rate (re-warmed after a join whose AdamW moments started from
// zero). Whatever happens between the backward pass and the update (DDP's gradient all-reduce) is
// the caller's.
#pragma once

#include <torch/types.h>
#include <torch/utils.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "loco/data/batcher.h"
#include "loco/model/transformer_fwd.h"
#include "loco/optim/adamw.h"
#include "loco/optim/schedule.h"

namespace loco::runtime {

struct RunConfig;  // config/config.h

// The model's parameters under AdamW, decayed when they are matrices (the transformer's weights;
// not its norms and biases): what every inner optimizer of a run is built from.
optim::AdamW make_inner_optimizer(const model::Transformer& model, const optim::AdamWOptions& options);

// The loss a training step backpropagates. On a GPU the head and the loss run fused
// (model::linear_cross_entropy: no float32 logits); on the CPU the plain head and cross entropy,
// with which every CPU measurement so far was made: the fused loss agrees with it to about 1e-6,
// but a run's trajectory, and so its final loss, would not be bit-identical to theirs.
model::LossParts training_loss(model::Transformer& model, const torch::Tensor& inputs, const torch::Tensor& targets,
                               double z_loss);

// What an inner step reads of a run's config.
struct InnerStepOptions {
  optim::ScheduleOptions schedule;  // optim.lr, warm-up, train.steps, the floor
  int64_t rewarmup_steps = 0;       // optim.rewarmup_steps
  int64_t batch_size = 0;           // train.batch_size: windows per micro-batch
  int64_t grad_accum = 1;           // train.grad_accum: micro-batches per step
  int64_t context = 0;              // model.context: tokens per window
  double z_loss = 0;                // train.z_loss
  double grad_clip = 0;             // optim.grad_clip; 0 = no clipping
};
// The inner step's options of `config`, the schedule validated. Throws ConfigError.
InnerStepOptions inner_step_options(const RunConfig& config);

class InnerStep {
 public:
  // `model` and `adamw` are the caller's and must outlive this. `intact` says what a failed step
  // leaves safe ("the last checkpoint is intact"), for the error's hint.
  InnerStep(model::Transformer& model, optim::AdamW& adamw, const InnerStepOptions& options, torch::Device device,
            std::string intact);

  // The learning rate of step `step` (0-based): the schedule's, times the re-warm-up factor over
  // optim.rewarmup_steps from the step given to rewarm_from().
  double learning_rate(int64_t step) const;
  // AdamW's moments start from zero at `step` (a joiner, or a DiPaCo path whose inner state was
  // lost): the learning rate warms up again from there (optim.rewarmup_steps; 0: it does not).
  void rewarm_from(int64_t step) { rewarm_from_ = step; }
  std::optional<int64_t> rewarmed_from() const { return rewarm_from_; }

  // Zeroes the gradients, then forward and backward of the step's micro-batches from `source`
  // (train.grad_accum of train.batch_size windows; on a GPU each copied from pinned memory without
  // waiting). A micro-batch with no target to score (only routing tokens, in DiPaCo) is skipped.
  // Returns the step's mean cross entropy, a float scalar on the device, unread: nothing here
  // waits for the GPU.
  torch::Tensor forward_backward(data::WindowSampler& source);
  // Clips the gradients to optim.grad_clip and takes the AdamW step at `lr`. Returns the norm
  // before clipping, on the device, unread. Where defers_reads(), an update whose `loss` or norm
  // is not finite is skipped on the device; elsewhere the caller reads the loss (read()) first.
  torch::Tensor update(double lr, const torch::Tensor& loss);
  // Whether the loss and the norm of a step may be read later than the step: on a GPU whose AdamW
  // skips a non-finite update itself. Elsewhere the caller reads each step's loss before update().
  bool defers_reads() const { return adamw_.skips_on_device(); }
  // `value` (a loss, or a norm with `what` "gradient norm") of step `step` read back. Throws
  // Error naming the step when it is not finite; an undefined norm reads as 0.
  double read(const torch::Tensor& value, int64_t step, const char* what = "loss") const;
  // Throws read()'s Error when `value`, already read, is not finite.
  void check(double value, int64_t step, const char* what) const;
  // forward_backward, the loss read and checked, then update(): one step, read at once. Returns
  // the step's mean cross entropy.
  double step(data::WindowSampler& source, int64_t step, double lr);

  int64_t tokens_per_step() const { return batch_size_ * grad_accum_ * context_; }

 private:
  model::Transformer& model_;
  optim::AdamW& adamw_;
  torch::Device device_;
  std::string intact_;
  optim::ScheduleOptions schedule_;
  int64_t rewarmup_steps_ = 0;
  std::optional<int64_t> rewarm_from_;
  int64_t batch_size_ = 0, grad_accum_ = 1, context_ = 0;
  double z_loss_ = 0, grad_clip_ = 0;
  std::vector<torch::Tensor> parameters_;
};

}  // namespace loco::runtime
