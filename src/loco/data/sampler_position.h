// Where a training sampler stands in its split's token stream (data/batcher.h): the coordinator
// records and hands these out without knowing anything of tensors, so they live apart from it.
#pragma once

#include <cstdint>

namespace loco::data {

struct SamplerPosition {
  uint64_t epoch = 0;
  uint64_t cursor = 0;  // windows already taken in this epoch
  bool operator==(const SamplerPosition&) const = default;
};

}  // namespace loco::data
