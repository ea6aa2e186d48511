// Elastic runs: the shards of vacant slots a round's plan gave this worker, read in turn with its
// own, one step each (docs/failure-model.md). A slot's sampler draws the same order its owner's
// would (seed + slot), so whoever reads a shard, it is visited once per epoch.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "loco/data/batcher.h"
#include "loco/runtime/worker/trainer.h"

namespace loco::runtime {

class ShardTurns {
 public:
  // `link` is null in a fixed run (then there is nothing to adopt).
  ShardTurns(data::WindowSampler& own, RunLink* link, int64_t context, uint64_t seed)
      : own_(own), link_(link), context_(context), seed_(seed) {}

  // Takes the adoption of a new plan, if any: what changed, in words.
  std::optional<std::string> update();
  // The sampler of the next step: its own, then each adopted shard, in turn.
  data::WindowSampler& next();

  std::map<int64_t, data::SamplerPosition> positions() const;
  std::vector<int64_t> adopted_slots() const;

 private:
  data::WindowSampler& own_;
  RunLink* link_;
  int64_t context_;
  uint64_t seed_;
  std::map<int64_t, data::WindowSampler> adopted_;
  int64_t turn_ = 0;
};

}  // namespace loco::runtime
