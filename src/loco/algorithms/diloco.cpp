#include "loco/algorithms/diloco.h"

#include <fmt/format.h>

#include "loco/core/error.h"

namespace loco::algorithms {

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

DiLoCo::DiLoCo(comm::Group group, DiLoCoOptions options, Membership* membership)
    : StreamingDiLoCo(std::move(group), options.as_streaming(), membership, "diloco"), total_steps_(options.total_steps) {}

bool DiLoCo::round_ends_at(int64_t step) const { return step == total_steps_ || starts_at(0, step); }

}  // namespace loco::algorithms
