// What the tests of the loco binary share.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>

#include "process_util.h"
#include "tiny_corpus.h"

namespace loco::testing_util {

// Writes the tiny corpus into DIR/corpus and prepares it into `out` with `loco prepare` (vocabulary
// 320, cache DIR/cache, output in DIR/prepare.log). Call through ASSERT_NO_FATAL_FAILURE.
inline void prepare_tiny_dataset(const std::filesystem::path& dir, const std::filesystem::path& out) {
  write_tiny_corpus(dir / "corpus");
  auto r = run_command({LOCO_BINARY, "prepare", "--corpus", (dir / "corpus").string(), "--out", out.string(),
                        "--vocab-size", "320", "--cache", (dir / "cache").string()},
                       (dir / "prepare.log").string());
  ASSERT_EQ(r.status, 0) << r.output;
}

}  // namespace loco::testing_util
