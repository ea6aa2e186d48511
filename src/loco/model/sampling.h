// Autoregressive sampling from a Transformer: temperature and top-k, seeded, no KV cache (the
// models loco trains on a CPU are small; the whole window is recomputed per token).
#pragma once

#include <cstdint>
#include <vector>

#include "loco/model/transformer_fwd.h"

namespace loco::model {

struct SampleOptions {
  int64_t max_new_tokens = 200;
  double temperature = 0.8;  // 0 = greedy (argmax)
  int64_t top_k = 50;        // 0 = no truncation
  uint64_t seed = 0;
  int32_t stop_token = -1;   // stop after emitting this token (e.g. eos); -1 = never
};

// Returns only the new tokens. The prompt is cropped to the last `context` tokens as generation
// proceeds. Throws ConfigError on invalid options, InternalError on an empty prompt.
std::vector<int32_t> generate(Transformer& model, const std::vector<int32_t>& prompt, const SampleOptions& options);

}  // namespace loco::model
