// Batches for training and evaluation, cut from a split's token stream.
//
// The stream is cut into non-overlapping windows of context + 1 tokens (inputs are the first
// `context`, targets the last `context`, shifted by one). Training visits every window once per
// epoch, in an order drawn from (seed, epoch) by a fixed algorithm (SplitMix64 + Fisher-Yates), so
// a position {epoch, cursor} restores the exact same future batches on any platform.
#pragma once

#include <torch/types.h>
#include <torch/utils.h>

#include <cstdint>
#include <vector>

#include "loco/data/sampler_position.h"

namespace loco::data {

// A target that no loss counts (torch's cross_entropy ignore_index): DiPaCo's routing tokens.
constexpr int32_t kIgnoredTarget = -100;

struct Batch {
  torch::Tensor inputs;   // (B, T) int64
  torch::Tensor targets;  // (B, T) int64
};

class WindowSampler {
 public:
  // Copies `tokens`. Throws DataError when the stream holds fewer than context + 1 tokens.
  // `targets`, when given, is a stream as long as `tokens` that the targets are read from instead
  // (the same tokens with kIgnoredTarget where no loss is to count).
  WindowSampler(const std::vector<int32_t>& tokens, int64_t context, uint64_t seed,
                const std::vector<int32_t>* targets = nullptr);

  // The next `batch_size` windows (crossing into the next epoch when this one runs out).
  Batch next(int64_t batch_size);

  SamplerPosition position() const { return position_; }
  // Jumps to `position` (as returned by position()). Throws DataError if it is out of range.
  void restore(const SamplerPosition& position);

  int64_t windows_per_epoch() const { return static_cast<int64_t>(order_.size()); }
  int64_t context() const { return context_; }

 private:
  void shuffle_for_epoch(uint64_t epoch);
  torch::Tensor stream_;  // (N) int64
  torch::Tensor targets_;  // (N) int64: stream_, or the given target stream
  int64_t context_;
  uint64_t seed_;
  std::vector<int64_t> order_;  // window indices of the current epoch, in visiting order
  SamplerPosition position_;
};

// `count` windows spread evenly over the whole stream (deterministic; every part of the split, and
// so every document of a small split, is represented). Returns fewer when the stream is short.
std::vector<Batch> evaluation_batches(const std::vector<int32_t>& tokens, int64_t context, int64_t count,
                                      int64_t batch_size, const std::vector<int32_t>* targets = nullptr);

// Windows that score every target of one document exactly once, in order: window k's inputs are
// tokens[k*context, (k+1)*context) and its targets the next token of each; the last window's
// missing positions are padding (token 0, an ignored target), which a causal model's earlier
// positions never see. `targets` as for WindowSampler. Throws DataError below 2 tokens.
std::vector<Batch> covering_batches(const std::vector<int32_t>& tokens, int64_t context, int64_t batch_size,
                                    const std::vector<int32_t>* targets = nullptr);

}  // namespace loco::data
