#include "loco/core/hash.h"

#include <xxhash.h>

#include "loco/core/error.h"

namespace loco {

uint64_t hash64(const void* data, size_t size, uint64_t seed) { return XXH3_64bits_withSeed(data, size, seed); }

Hasher::Hasher() : state_(XXH3_createState()) {
  LOCO_CHECK(state_ != nullptr, "out of memory for a hash state");
  XXH3_64bits_reset(static_cast<XXH3_state_t*>(state_));
}

Hasher::~Hasher() { XXH3_freeState(static_cast<XXH3_state_t*>(state_)); }

void Hasher::update(const void* data, size_t size) {
  XXH3_64bits_update(static_cast<XXH3_state_t*>(state_), data, size);
}

uint64_t Hasher::digest() const { return XXH3_64bits_digest(static_cast<XXH3_state_t*>(state_)); }

std::string hex64(uint64_t value) { return fmt::format("{:016x}", value); }

uint64_t parse_hex64(std::string_view text, std::string_view module, std::string_view what) {
  if (text.size() != 16) throw DataError(module, fmt::format("{}: expected 16 hex digits, got '{}'", what, text));
  uint64_t value = 0;
  for (char c : text) {
    int digit = (c >= '0' && c <= '9') ? c - '0' : (c >= 'a' && c <= 'f') ? c - 'a' + 10 : -1;
    if (digit < 0) throw DataError(module, fmt::format("{}: expected 16 hex digits, got '{}'", what, text));
    value = value << 4 | static_cast<uint64_t>(digit);
  }
  return value;
}

}  // namespace loco
