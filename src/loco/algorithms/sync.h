// The one seam between the training loop and a synchronization algorithm.
//
// The loop (runtime/trainer) calls the hooks below in this order for every inner step:
//   forward/backward (with gradient accumulation) -> after_backward -> clip -> AdamW step -> after_step
// and knows nothing else about the algorithm. DDP averages gradients in after_backward; DiLoCo
// takes an outer step every H calls of after_step; a single process (NoSync) does nothing.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "loco/model/transformer.h"

namespace loco::algorithms {

struct StepContext {
  int64_t step = 0;               // 0-based index of the inner step just taken
  int64_t step_tokens = 0;        // tokens processed by this step (all micro-batches)
  model::Transformer* model = nullptr;
};

using NamedTensors = std::vector<std::pair<std::string, torch::Tensor>>;

class SyncStrategy {
 public:
  virtual ~SyncStrategy() = default;
  virtual std::string name() const = 0;

  // Called once before the first step (after a resume, with the restored model).
  virtual void on_start(model::Transformer& model) { (void)model; }
  // Gradients are final for this step; the strategy may rewrite them (e.g. average across workers).
  virtual void after_backward(StepContext& context) { (void)context; }
  // Parameters were updated by the inner optimizer; the strategy may rewrite them.
  virtual void after_step(StepContext& context) { (void)context; }

  // State the strategy needs to resume exactly (outer optimizer, global copy...), saved with the
  // checkpoint; load_state receives what state() returned. Default: stateless.
  virtual NamedTensors state() const { return {}; }
  virtual void load_state(const NamedTensors& tensors) { (void)tensors; }
};

// One process, no communication.
class NoSync final : public SyncStrategy {
 public:
  std::string name() const override { return "none"; }
};

}  // namespace loco::algorithms
