#include "loco/core/allocator.h"

#include <cstdlib>
#include <cstring>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace loco {

bool keep_freed_memory() {
#if defined(__GLIBC__)
  const char* tunables = std::getenv("GLIBC_TUNABLES");
  if (tunables != nullptr && std::strstr(tunables, "glibc.malloc.") != nullptr) return false;
  constexpr int kMmapThreshold = 32 << 20;  // DEFAULT_MMAP_THRESHOLD_MAX on 64-bit glibc
  constexpr int kTrimThreshold = 1 << 30;
  const bool mmap_set = ::mallopt(M_MMAP_THRESHOLD, kMmapThreshold) == 1;
  const bool trim_set = ::mallopt(M_TRIM_THRESHOLD, kTrimThreshold) == 1;
  return mmap_set && trim_set;
#else
  return false;
#endif
}

}  // namespace loco
