// Data parallelism, the baseline DiLoCo is measured against: every inner step, the workers'
// gradients are averaged (all-reduced in buckets, not one collective per tensor) before the
// optimizer step, so every worker takes the same step, as one process with an M× batch would.
#pragma once

#include <memory>

#include "loco/algorithms/flat_buffer.h"
#include "loco/algorithms/sync.h"

namespace loco::algorithms {

struct DdpOptions {
  int64_t piece_bytes = 1 << 20;  // gradient bytes per message of the all-reduce
};

class Ddp final : public SyncStrategy {
 public:
  Ddp(comm::Group group, DdpOptions options);
  std::string name() const override { return "ddp"; }

  // Checks that every worker starts from identical parameters.
  SyncReports on_start(model::Transformer& model, int64_t step) override;
  // Replaces each gradient by its mean over the workers.
  SyncReports after_backward(StepContext& context) override;
  // Reports the step's all-reduce with the hash of the updated parameters.
  SyncReports after_step(StepContext& context) override;
  int64_t bytes_sent() const override { return group_.bytes_sent(); }

 private:
  comm::Group group_;
  DdpOptions options_;
  std::vector<torch::Tensor> parameters_;
  std::unique_ptr<FlatBuffer> buffer_;
  comm::CommStats pending_;
  int64_t rounds_ = 0;
};

}  // namespace loco::algorithms
