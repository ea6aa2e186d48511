// The one seam between the training loop and a synchronization algorithm.
//
// The loop (runtime/trainer) calls the hooks below in this order for every inner step:
//   forward/backward (with gradient accumulation) -> after_backward -> clip -> AdamW step -> after_step
// and knows nothing else about the algorithm. DDP averages gradients in after_backward; DiLoCo
// takes an outer step every H calls of after_step; a single process (NoSync) does nothing.
//
// Hooks that communicate return a SyncReport, which the loop writes as a `sync` event. A
// collective that fails throws PeerError out of the hook, leaving the strategy's state as it was
// before the hook (the loop checkpoints that state; see docs/failure-model.md).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "loco/comm/group.h"
#include "loco/model/transformer.h"

namespace loco::algorithms {

struct StepContext {
  int64_t step = 0;               // 0-based index of the inner step just taken
  int64_t step_tokens = 0;        // tokens processed by this step (all micro-batches)
  model::Transformer* model = nullptr;
};

// One synchronization: the `sync` event of metrics.jsonl.
struct SyncReport {
  int64_t round = 0;          // synchronizations completed so far, this one included
  int64_t step = 0;           // inner steps completed when it happened
  int64_t world_size = 0;     // workers that took part
  comm::CommStats stats;      // all its collectives together
  uint64_t params_hash = 0;   // XXH3-64 of the parameters after it; equal on every worker
};

using NamedTensors = std::vector<std::pair<std::string, torch::Tensor>>;

class SyncStrategy {
 public:
  virtual ~SyncStrategy() = default;
  virtual std::string name() const = 0;

  // Called once before the first step, with the model (restored, after a resume) and the inner
  // steps already done. A strategy that was checkpointed with a synchronization still due (its
  // collective failed) performs it here.
  virtual std::optional<SyncReport> on_start(model::Transformer& model, int64_t step) {
    (void)model;
    (void)step;
    return std::nullopt;
  }
  // Gradients are final for this step; the strategy may rewrite them (e.g. average across workers).
  virtual std::optional<SyncReport> after_backward(StepContext& context) {
    (void)context;
    return std::nullopt;
  }
  // Parameters were updated by the inner optimizer; the strategy may rewrite them.
  virtual std::optional<SyncReport> after_step(StepContext& context) {
    (void)context;
    return std::nullopt;
  }
  // Whether the model's parameters are the global parameters θ now. Evaluation waits for this.
  virtual bool in_sync() const { return true; }

  // State the strategy needs to resume exactly (outer optimizer, global copy...), saved with the
  // checkpoint; load_state receives what state() returned, before on_start. Default: stateless.
  virtual NamedTensors state() const { return {}; }
  virtual void load_state(const NamedTensors& tensors) { (void)tensors; }
};

// No communication: one process, or `local` replicas that never talk (a baseline).
class NoSync final : public SyncStrategy {
 public:
  explicit NoSync(std::string name = "none") : name_(std::move(name)) {}
  std::string name() const override { return name_; }

 private:
  std::string name_;
};

}  // namespace loco::algorithms
