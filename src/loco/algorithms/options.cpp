#include "loco/algorithms/options.h"

#include <fmt/format.h>

#include "loco/core/error.h"

namespace loco::algorithms {

void StreamingOptions::validate() const {
  if (inner_steps < 1) throw ConfigError("algorithms", fmt::format("sync.inner_steps must be >= 1, got {}", inner_steps));
  if (total_steps < 1) throw ConfigError("algorithms", fmt::format("the run must have >= 1 step, got {}", total_steps));
  if (fragments < 1 || fragments > inner_steps) {
    throw ConfigError("algorithms", fmt::format("sync.fragments must be in [1, sync.inner_steps = {}] so that every "
                                                "fragment has its own sync step, got {}", inner_steps, fragments));
  }
  if (overlap_steps < 0 || overlap_steps >= inner_steps) {
    throw ConfigError("algorithms", fmt::format("sync.overlap_steps must be in [0, sync.inner_steps = {}), got {}: a "
                                                "fragment's result must arrive before its next sync starts",
                                                inner_steps, overlap_steps));
  }
  if (!(merge_alpha >= 0 && merge_alpha <= 1)) {
    throw ConfigError("algorithms", fmt::format("sync.merge_alpha must be in [0, 1], got {}", merge_alpha));
  }
  if (piece_bytes < 4) throw ConfigError("algorithms", "sync.bucket_mb is too small");
  if (!(drop_probability >= 0 && drop_probability < 1)) {
    throw ConfigError("algorithms", fmt::format("sync.drop_probability must be in [0, 1), got {}", drop_probability));
  }
  if (eager && (overlap_steps != 0 || round_seconds > 0 || drop_probability > 0)) {
    throw ConfigError("algorithms", "eager outer updates (sync.eager) overlap a whole round by themselves: they need "
                                    "sync.overlap_steps = 0, fixed rounds (sync.round_seconds = 0) and no dropped outer "
                                    "gradients (sync.drop_probability = 0)");
  }
  if (round_seconds < 0 || (round_seconds > 0 && (fragments != 1 || overlap_steps != 0))) {
    throw ConfigError("algorithms", "time-budgeted rounds (sync.round_seconds) need one fragment and no overlap (DiLoCo)");
  }
  outer.validate();
}

void DiLoCoOptions::validate() const {
  if (inner_steps < 1) throw ConfigError("algorithms", fmt::format("sync.inner_steps must be >= 1, got {}", inner_steps));
  if (total_steps < 1) throw ConfigError("algorithms", fmt::format("the run must have >= 1 step, got {}", total_steps));
  if (piece_bytes < 4) throw ConfigError("algorithms", "sync.bucket_mb is too small");
  if (round_seconds < 0) throw ConfigError("algorithms", fmt::format("sync.round_seconds must be >= 0, got {}", round_seconds));
  outer.validate();
}

StreamingOptions DiLoCoOptions::as_streaming() const {
  validate();
  StreamingOptions o;
  o.inner_steps = inner_steps;
  o.total_steps = total_steps;
  o.fragments = 1;
  o.overlap_steps = 0;
  o.merge_alpha = 0;
  o.exchange = exchange;
  o.round_seconds = round_seconds;
  o.outer = outer;
  o.weighting = weighting;
  o.shard_tokens = shard_tokens;
  o.drop_probability = drop_probability;
  o.drop_seed = drop_seed;
  o.piece_bytes = piece_bytes;
  o.eager = eager;
  return o;
}

}  // namespace loco::algorithms
