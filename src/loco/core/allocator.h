// How the C allocator hands memory back to the kernel, set for training (docs/footguns.md).
#pragma once

namespace loco {

// A training step allocates and frees the same tensors every step: activations, gradients, logits
// of a few MB each. glibc's malloc serves blocks over its mmap threshold (128 kB at first) with
// mmap and gives the top of its heap back past a trim threshold, so each step faults those pages in
// again and zeroes them: up to 2 million page faults and 15% of a worker's CPU in a 300-step run
// (docs/benchmarks.md, "The allocator"). This keeps blocks up to 32 MiB (glibc's largest mmap
// threshold) on the heap and freed memory mapped (up to 1 GiB at the heap's top), for the process.
// Returns false when it changed nothing: not glibc, or the user's own GLIBC_TUNABLES set the
// allocator, which is then left as they asked. Call it first thing in main.
bool keep_freed_memory();

}  // namespace loco
