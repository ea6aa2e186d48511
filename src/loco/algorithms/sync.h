// The one seam between the training loop and a synchronization algorithm.
//
// The loop (runtime/trainer) calls the hooks below in this order for every inner step:
//   forward/backward (with gradient accumulation) -> after_backward -> clip -> AdamW step -> after_step
// and knows nothing else about the algorithm. DDP averages gradients in after_backward; DiLoCo
// takes an outer step every H calls of after_step; Streaming DiLoCo synchronizes one fragment at a
// time with the collective running in the background; a single process (NoSync) does nothing.
//
// Hooks return a SyncReport for each synchronization they completed, which the loop writes as a
// `sync` event. A
// collective that fails throws PeerError out of the hook, leaving the strategy's state as it was
// before the hook (the loop checkpoints that state; see docs/failure-model.md).
#pragma once

#include <torch/types.h>
#include <torch/utils.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "loco/comm/group.h"
#include "loco/model/transformer_fwd.h"

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
  comm::CommStats stats;      // all its collectives together (their wall time, wherever they ran)
  uint64_t params_hash = 0;   // XXH3-64 of the (global) parameters after it; equal on every worker
  int64_t fragment = -1;      // Streaming DiLoCo: the fragment synchronized; -1: the whole model
  double stall_seconds = 0;   // time the training loop waited for it (= stats.seconds when blocking)
  int64_t attempts = 1;       // elastic runs: tries it took (a failed collective is tried again)
  double weight = -1;         // DiLoCo: this worker's weight in the average (-1: not a weighted average)
  int64_t tokens = -1;        // DiLoCo: the tokens it trained on this round (-1: not counted)
  int64_t rejected = 0;       // DiLoCo: outer gradients screening left out (Screening)
  std::string screening;      // ... who was left out or clipped, and why ("" when none)
  int64_t staleness = -1;     // asynchronous DiLoCo: versions of θ applied since this worker's Δ began (-1: not async)
};
using SyncReports = std::vector<SyncReport>;

using NamedTensors = std::vector<std::pair<std::string, torch::Tensor>>;

class SyncStrategy {
 public:
  virtual ~SyncStrategy() = default;
  virtual std::string name() const = 0;

  // Called once before the first step, with the model (restored, after a resume) and the inner
  // steps already done. A strategy that was checkpointed with a synchronization still due (its
  // collective failed) performs it here.
  virtual SyncReports on_start(model::Transformer& model, int64_t step) {
    (void)model;
    (void)step;
    return {};
  }
  // Gradients are final for this step; the strategy may rewrite them (e.g. average across workers).
  virtual SyncReports after_backward(StepContext& context) {
    (void)context;
    return {};
  }
  // Parameters were updated by the inner optimizer; the strategy may rewrite them.
  virtual SyncReports after_step(StepContext& context) {
    (void)context;
    return {};
  }
  // Whether the model's parameters are the global parameters θ now.
  virtual bool in_sync() const { return true; }
  // Whether no synchronization is under way, so that state() is one of the run's round ends:
  // elastic runs checkpoint there. (DiLoCo: in_sync; Streaming DiLoCo: no fragment on the wire.)
  virtual bool at_boundary() const { return in_sync(); }
  // Elastic runs: set when on_start joined a run under way; the loop continues from this step.
  virtual std::optional<int64_t> joined_at_step() const { return std::nullopt; }
  // Whether this worker leads the current membership (elastic runs: rank 0 of its last round),
  // and so evaluates and writes the global checkpoint. Fixed membership: always true.
  virtual bool leads() const { return true; }
  // The global parameters θ (in the model's parameter order) for evaluation to score at any step,
  // when the strategy offers them; nullptr: evaluation waits until in_sync().
  virtual const std::vector<torch::Tensor>* evaluation_parameters() const { return nullptr; }
  // Asynchronous DiLoCo shares the run's inner steps among its workers by speed: whether this
  // worker's part is done (nullopt: it ends after train.steps, as with every other strategy) ...
  virtual std::optional<bool> part_done() const { return std::nullopt; }
  // ... and where the learning-rate schedule stands at this worker's inner step `step` (nullopt:
  // at `step`).
  virtual std::optional<double> schedule_step(int64_t step) const {
    (void)step;
    return std::nullopt;
  }
  // Asynchronous DiLoCo: whether on_start found the run under way (its schedule past its start): a
  // worker without saved AdamW moments then starts them from zero in the middle of the schedule.
  virtual bool joined_under_way() const { return false; }
  // Payload bytes sent so far, updated as each collective completes, even in the background; the
  // loop samples it every step to find the busiest step.
  virtual int64_t bytes_sent() const { return 0; }

  // State the strategy needs to resume exactly (outer optimizer, global copy...), saved with the
  // checkpoint; load_state receives what state() returned, before on_start. Default: stateless.
  // May wait for communication in flight, so that what it returns is complete.
  virtual NamedTensors state() { return {}; }
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
