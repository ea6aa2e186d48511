// The training driver: a thin loop that composes the parts (dataset, sampler, model, AdamW,
// schedule, sync strategy, evaluator, checkpoints, metrics, progress) and owns none of their logic.
//
// Per step: lr from the schedule -> grad_accum micro-batches of forward/backward -> sync.after_backward
// -> gradient clipping -> AdamW step -> sync.after_step -> metrics, evaluation and checkpoint when due.
#pragma once

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <map>
#include <optional>
#include <nlohmann/json.hpp>
#include <vector>

#include "loco/algorithms/sync.h"
#include "loco/metrics/events.h"
#include "loco/metrics/progress.h"
#include "loco/metrics/telemetry.h"
#include "loco/data/batcher.h"
#include "loco/data/dataset.h"
#include "loco/model/transformer_fwd.h"
#include "loco/runtime/config/config.h"
#include "loco/runtime/store/checkpoint.h"
#include "loco/runtime/store/safetensors.h"
#include "loco/runtime/worker/weights.h"

namespace loco::runtime {

// What the loop asks of the run it belongs to, beyond its sync strategy. A multi-process worker
// implements it over the coordinator (runtime/worker); a single process has none. Called on the
// training thread only.
class RunLink {
 public:
  virtual ~RunLink() = default;
  // After a collective failed: is the whole run stopping (a peer was interrupted), so that the
  // failure is a clean stop rather than a crash?
  virtual bool stopping() = 0;

  // Elastic runs (docs/failure-model.md, "Data"). The runtime, not the sync strategy, owns where
  // every shard stands: each round's plan says it, and the loop saves it with the checkpoint.
  //
  // Where this worker's own shard starts, once on_start has run (a joiner learns it in its first
  // round); nullopt: where the checkpoint or the seed put it.
  virtual std::optional<data::SamplerPosition> start_position() { return std::nullopt; }
  // The shards of vacant slots the latest plan gives this worker to read in turn with its own
  // (slot -> where that shard stands), when they changed since the last call; nullopt: no change.
  virtual std::optional<std::map<int64_t, data::SamplerPosition>> take_adoption() { return std::nullopt; }
  // The tokens of slot `slot`'s shard (one this worker adopted).
  virtual const std::vector<int32_t>& shard_tokens(int64_t slot);
  // Where its own shard and the adopted ones stand after each step, and the steps done.
  virtual void record_progress(const data::SamplerPosition& own, const std::map<int64_t, data::SamplerPosition>& adopted,
                               int64_t step) {
    (void)own;
    (void)adopted;
    (void)step;
  }
  // The run's section of a checkpoint: the rounds completed and every shard's position as of the
  // last completed round (nullopt outside elastic runs, or before the first plan).
  virtual std::optional<RunProgress> run_progress() const { return std::nullopt; }
  // The membership epoch in which this worker last completed round `round` (-1: none, or not
  // elastic): a sync's record, which tells a round trained again after a restart from the global
  // checkpoint from its first, undone completion.
  virtual int64_t round_epoch(int64_t round) const {
    (void)round;
    return -1;
  }
};

// This process's place in a run of several workers (set by runtime/worker). The defaults describe
// a single process.
struct WorkerRole {
  int64_t rank = 0;
  int64_t world_size = 1;
  // One of the workers of `loco launch` / `loco worker`: its checkpoints live in
  // RUN/workers/<rank>/checkpoints, and its events in RUN/metrics.jsonl carry its rank.
  bool distributed = false;
  // Whether this worker evaluates. The global parameters are the same on every worker, so only
  // one scores them; evaluation never communicates (every collective belongs to the sync strategy).
  bool evaluates = true;
  // This worker's shard of the training split (nullptr: the whole split).
  const std::vector<int32_t>* train_tokens = nullptr;
  // Elastic runs (cluster.elastic): the run's checkpoints are the global ones in RUN/checkpoints,
  // written at each round's end by the worker that leads it (SyncStrategy::leads), which also
  // evaluates. Every member also saves its slot's inner state at each round's end in
  // RUN/slots/<rank>, which a resume of the same round loads.
  bool elastic = false;
  // Takes over a slot of a run under way (asynchronous DiLoCo's elastic runs): its folder may hold
  // what its predecessor wrote, which a fresh start there must not refuse.
  bool replaces = false;
  RunLink* link = nullptr;  // the run this worker belongs to (nullptr: none)
};

struct TrainOptions {
  bool resume = false;                         // continue from the latest checkpoint
  std::optional<int64_t> resume_step;          // ... or from this step's (workers agree on one)
  const std::atomic<bool>* stop = nullptr;     // set (e.g. by SIGINT): checkpoint and return
  metrics::ProgressMode progress = metrics::ProgressMode::kLines;
  std::FILE* out = stderr;                     // progress and messages
  metrics::Telemetry* telemetry = nullptr;     // also receives every event, and what the loop is doing
  WorkerRole worker;
};

// A training loop's totals (metrics/events.h: the `summary` event).
using metrics::TrainSummary;
using metrics::summary_json;
using metrics::summary_from_json;

// Runs (or resumes) the training described by `config` with `sync` plugged in. Writes
// RUN/config.toml, RUN/metrics.jsonl and RUN/checkpoints/ (RUN/workers/<rank>/checkpoints/ for a
// worker). Throws ConfigError/DataError on bad input before any step is taken. When a collective
// fails (PeerError) it checkpoints the last consistent state, then returns as interrupted if the
// run is stopping, or rethrows.
TrainSummary train(const RunConfig& config, algorithms::SyncStrategy& sync, const TrainOptions& options);

}  // namespace loco::runtime
