// Checksums used by every loco file format and by the parameter hash that replicas compare.
// XXH3-64: fast (GB/s), well-kept (libxxhash), and collisions are irrelevant for integrity checks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace loco {

uint64_t hash64(const void* data, size_t size, uint64_t seed = 0);
inline uint64_t hash64(std::string_view s) { return hash64(s.data(), s.size()); }

// Incremental XXH3-64 over several buffers; equal to hash64 of their concatenation.
class Hasher {
 public:
  Hasher();
  ~Hasher();
  Hasher(const Hasher&) = delete;
  Hasher& operator=(const Hasher&) = delete;
  void update(const void* data, size_t size);
  void update(std::string_view s) { update(s.data(), s.size()); }
  uint64_t digest() const;

 private:
  void* state_;
};

// 16 lowercase hex digits.
std::string hex64(uint64_t value);
// Inverse of hex64; throws DataError(module) naming `what` on malformed input.
uint64_t parse_hex64(std::string_view text, std::string_view module, std::string_view what);

}  // namespace loco
