// The sync strategies' options, with no torch: what a config names for DiLoCo and Streaming DiLoCo
// (streaming.h and diloco.h implement them).
#pragma once

#include <cstdint>
#include <string_view>

#include "loco/comm/wire_format.h"
#include "loco/optim/options.h"

namespace loco::algorithms {

enum class FragmentPattern { kStrided, kSequential };

// How the workers' outer gradients are weighted: by the tokens each trained on this round, by the
// size of each worker's shard (DiLoCo §6.1 and DiPaCo, for shards of unequal size), or 1/M.
enum class Weighting { kTokens, kShard, kUniform };

// Screening of the workers' outer gradients Δ_m before they are averaged (docs/failure-model.md,
// "A worker that sends harm"). A Δ_m with a value that is not finite is left out (unless
// reject_not_finite is false, to show the harm it does: θ becomes NaN); with
// reject_ratio > 0, so is one whose norm exceeds reject_ratio times the median norm of the other
// counted workers' finite ones; with clip_norm > 0, each Δ_m kept enters the average as
// Δ_m·min(1, clip_norm / ‖Δ_m‖). A worker left out counts as a dropped one for that sync (the
// others' weights renormalize), and the sync reports it. Every worker decides alike, from the
// norms that ride with the exchange (comm::Tally): each worker states its own. With `combine`
// median or trimmed mean, the contributions kept are combined value by value robustly instead of
// averaged (comm::Combine): a worker that lies about its norm still moves θ by little.
struct Screening {
  double reject_ratio = 0;  // 0 = off
  double clip_norm = 0;     // 0 = off
  comm::Combine combine = comm::Combine::kSum;
  int64_t trim = 1;         // kTrimmedMean: contributions left out at each end, value by value
  bool reject_not_finite = true;
  void validate() const;    // ConfigError naming the bad key
};

// A fault to inject, for the tests and benchmarks of screening: worker `worker`'s outer gradient
// goes out as Δ·scale (scale NaN: one value of it NaN) at every sync, or only at its sync number
// `round` (1-based, per fragment) when that is > 0.
struct Poison {
  int64_t worker = -1;  // -1: none
  double scale = 1;
  int64_t round = 0;
  bool hits(int64_t rank, int64_t sync) const { return worker >= 0 && rank == worker && (round == 0 || round == sync); }
};
// "WORKER:xSCALE" or "WORKER:nan", each optionally "@ROUND" (e.g. "1:x100", "2:nan@3"); "" = none.
// ConfigError naming sync.poison otherwise.
Poison parse_poison(std::string_view text);

struct StreamingOptions {
  int64_t inner_steps = 50;   // H: inner steps between two syncs of one fragment
  int64_t total_steps = 0;    // the run's inner steps; its last step synchronizes every fragment
  int64_t fragments = 4;      // P
  FragmentPattern pattern = FragmentPattern::kStrided;
  int64_t overlap_steps = 1;  // τ: inner steps between the start of a fragment's sync and its use
  double merge_alpha = 0.5;   // α: the share of the local fragment kept at the merge
  comm::Encoding exchange = comm::Encoding::kFp32;
  // > 0: time-budgeted rounds (elastic DiLoCo): a round ends once this many seconds of inner steps
  // have passed since it began, and the round's step is the furthest contributor's. Needs one
  // fragment and no overlap.
  double round_seconds = 0;
  optim::OuterOptions outer;
  Weighting weighting = Weighting::kTokens;
  int64_t shard_tokens = 0;         // kShard: the tokens of this worker's shard (> 0)
  // An experiment (DiLoCo paper §6.3): each worker's outer gradient is left out of a sync with this
  // probability, drawn from (drop_seed, fragment, sync, rank); the others' weights renormalize, and
  // a sync that every worker dropped leaves θ as it was.
  double drop_probability = 0;
  uint64_t drop_seed = 0;
  int64_t piece_bytes = 1 << 20;  // fp32 bytes per message of an exchange
  bool eager = false;               // eager outer updates (above)
  Screening screening;
  Poison poison;
  void validate() const;            // ConfigError naming the bad option
};

struct DiLoCoOptions {
  int64_t inner_steps = 50;         // H
  double round_seconds = 0;         // > 0: a round ends after this long of inner steps instead (elastic)
  int64_t total_steps = 0;          // the run's inner steps; its last step ends the final round
  optim::OuterOptions outer;
  Weighting weighting = Weighting::kTokens;
  int64_t shard_tokens = 0;         // Weighting::kShard: the tokens of this worker's shard
  double drop_probability = 0;      // an experiment: see StreamingOptions
  comm::Encoding exchange = comm::Encoding::kFp32;  // outer gradients on the wire (fp32: θ̄ travels)
  uint64_t drop_seed = 0;
  int64_t piece_bytes = 1 << 20;  // outer-gradient bytes per message of the all-reduce
  bool eager = false;               // eager outer updates (streaming.h): a round's exchange overlaps the next
  Screening screening;
  Poison poison;
  void validate() const;            // ConfigError

  // The Streaming DiLoCo options that are this DiLoCo: one fragment, τ = 0, α = 0, fp32.
  StreamingOptions as_streaming() const;
};

// Asynchronous DiLoCo's outer state (async_outer.h).
struct AsyncOptions {
  int64_t workers = 1;          // M
  int64_t inner_steps = 50;     // H: the fastest worker's inner steps per cycle
  int64_t total_steps = 0;      // train.steps: the run takes total_steps × workers inner steps in all
  int64_t delay = 0;            // N, arrivals per momentum update (0: M)
  bool dynamic_steps = true;    // H_w by speed (false: H for every worker)
  int64_t max_staleness = 0;    // an outer gradient more versions behind θ than this is left out (0: 4M)
  double lr = 0.7, momentum = 0.9;
  // Each outer gradient alone, against the recent ones: not finite left out; reject_ratio > 0: left
  // out when ‖Δ‖ > ratio × the median of the last M kept norms; clip_norm > 0: Δ · min(1, clip/‖Δ‖).
  // (combine: none; there is no mean to make robust.)
  Screening screening;
  // Outer gradients that arrive together are applied together: the first opens a batch that
  // waits up to grace × its cycle's time for the other workers' (closing as soon as every worker
  // with a cycle under way is in), and all of them continue from the θ after the batch. 0: each
  // is applied alone as it arrives.
  double grace = 0;
  double max_wait_s = 60;       // ... and never longer than this (below the workers' read timeout)
  int64_t values = 0;           // the model's parameters, when known: a first θ of another size is refused
  // A worker silent this long past what its cycle should take (at least `silence_s`), or this long
  // between cycles, is gone: its unfinished share of the steps goes back to the others.
  double silence_s = 60;
  void validate() const;        // ConfigError naming the sync.async_* key
  int64_t delay_or_default() const { return delay > 0 ? delay : workers; }
  int64_t staleness_or_default() const { return max_staleness > 0 ? max_staleness : 4 * workers; }
};

}  // namespace loco::algorithms
