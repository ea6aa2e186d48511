#include "loco/core/allocator.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstring>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace loco {
namespace {

#if defined(__GLIBC__) && __GLIBC_PREREQ(2, 33)

// Each test runs in a process of its own (CTest), so the allocator's settings start from glibc's.
TEST(AllocatorTest, KeepsABlockOfSeveralMegabytesOnTheHeapAndMappedAfterItIsFreed) {
  ASSERT_TRUE(keep_freed_memory());
  constexpr size_t kBytes = 20 << 20;  // above glibc's default mmap threshold, as a step's logits are
  const auto before = ::mallinfo2();
  auto* block = static_cast<char*>(std::malloc(kBytes));
  ASSERT_NE(block, nullptr);
  std::memset(block, 1, kBytes);
  const auto held = ::mallinfo2();
  EXPECT_EQ(held.hblkhd, before.hblkhd) << "the block was mapped on its own (mmap), so freeing it unmaps it";
  EXPECT_GE(held.arena, before.arena + kBytes) << "the block should come from the heap";
  std::free(block);
  const auto after = ::mallinfo2();
  EXPECT_EQ(after.arena, held.arena) << "freeing the block gave the heap's top back to the kernel";
}

TEST(AllocatorTest, LeavesTheAllocatorAsTheUsersTunablesSetIt) {
  ASSERT_EQ(::setenv("GLIBC_TUNABLES", "glibc.malloc.trim_threshold=65536", 1), 0);
  EXPECT_FALSE(keep_freed_memory());
  ::unsetenv("GLIBC_TUNABLES");
}

#endif

}  // namespace
}  // namespace loco
