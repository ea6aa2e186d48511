// Private to the data module: seeded sampling whose results are the same on every platform.
// std::uniform_int_distribution and std::shuffle are implementation-defined (libstdc++ and libc++
// give different splits for the same seed); std::mt19937_64's output sequence is fixed by the
// standard, so everything here is built on it alone.
#pragma once

#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

namespace loco::data::detail {

// Uniform integer in [0, n), n > 0, by rejection (no modulo bias).
inline uint64_t uniform_below(std::mt19937_64& rng, uint64_t n) {
  const uint64_t limit = UINT64_MAX - UINT64_MAX % n;  // largest multiple of n, exclusive
  uint64_t x = rng();
  while (x >= limit) x = rng();
  return x % n;
}

// A permutation of 0..n-1 (Fisher-Yates), deterministic given `seed`.
inline std::vector<uint64_t> permutation(uint64_t n, uint64_t seed) {
  std::vector<uint64_t> order(n);
  std::iota(order.begin(), order.end(), uint64_t{0});
  std::mt19937_64 rng(seed);
  for (uint64_t i = n; i > 1; --i) std::swap(order[i - 1], order[uniform_below(rng, i)]);
  return order;
}

}  // namespace loco::data::detail
