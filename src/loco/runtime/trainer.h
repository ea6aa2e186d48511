// The training driver: a thin loop that composes the parts (dataset, sampler, model, AdamW,
// schedule, sync strategy, evaluator, checkpoints, metrics, progress) and owns none of their logic.
//
// Per step: lr from the schedule -> grad_accum micro-batches of forward/backward -> sync.after_backward
// -> gradient clipping -> AdamW step -> sync.after_step -> metrics, evaluation and checkpoint when due.
#pragma once

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "loco/algorithms/sync.h"
#include "loco/data/batcher.h"
#include "loco/data/dataset.h"
#include "loco/model/transformer.h"
#include "loco/runtime/config.h"
#include "loco/runtime/safetensors.h"

namespace loco::runtime {

struct TrainOptions {
  bool resume = false;                         // continue from RUN/checkpoints/latest
  const std::atomic<bool>* stop = nullptr;     // set (e.g. by SIGINT): checkpoint and return
  bool interactive = false;                    // draw a progress bar
  std::FILE* out = stderr;                     // progress and messages
};

struct TrainSummary {
  int64_t first_step = 0;  // 0, or the step resumed from
  int64_t steps = 0;       // steps completed in total
  int64_t tokens = 0;
  double val_loss = 0, val_ppl = 0;
  double val_unigram_entropy = 0;  // of the dataset, for comparison
  double wall_s = 0;
  bool interrupted = false;
  std::vector<double> losses;  // training loss of each step taken by this call
};

// Runs (or resumes) the training described by `config` with `sync` plugged in. Writes
// RUN/config.toml, RUN/metrics.jsonl and RUN/checkpoints/. Throws ConfigError/DataError on bad
// input before any step is taken.
TrainSummary train(const RunConfig& config, algorithms::SyncStrategy& sync, const TrainOptions& options);

struct EvalResult {
  double loss = 0;  // mean cross entropy, nats/token
  double ppl = 0;
  int64_t tokens = 0;
};

// Mean loss of `model` over `batches` (no gradients; the model's training mode is restored).
EvalResult evaluate(model::Transformer& model, const std::vector<data::Batch>& batches, const torch::Device& device);

// The model described by `config` (vocab_size already resolved), initialized from train.seed.
model::Transformer build_model(const RunConfig& config);
// The model's parameters by name, for checkpoints.
NamedTensors model_weights(const model::Transformer& model);
// Copies `weights` into the model; throws DataError naming a missing, extra or misshapen tensor.
void load_model_weights(model::Transformer& model, const NamedTensors& weights, const std::string& where);

// Sets torch's intra-op threads: `threads`, or (0) the cores divided among the local processes
// (environment LOCO_LOCAL_PROCESSES, default 1). Returns the count set.
int64_t configure_threads(int64_t threads);

}  // namespace loco::runtime
