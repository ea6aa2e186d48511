// What the tests of the loco binary share.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "process_util.h"
#include "test_util.h"
#include "tiny_corpus.h"

namespace loco::testing_util {

// Writes the tiny corpus into DIR/corpus and prepares it into `out` with `loco prepare` (vocabulary
// 320, cache DIR/cache, output in DIR/prepare.log). Call through ASSERT_NO_FATAL_FAILURE.
inline void prepare_tiny_dataset(const std::filesystem::path& dir, const std::filesystem::path& out) {
  write_tiny_corpus(dir / "corpus");
  auto r = run_command({testing_util::loco_binary(), "prepare", "--corpus", (dir / "corpus").string(), "--out", out.string(),
                        "--vocab-size", "320", "--cache", (dir / "cache").string()},
                       (dir / "prepare.log").string());
  ASSERT_EQ(r.status, 0) << r.output;
}

// The launch tests' run: a tiny DiLoCo (H = 5) of 40 steps with `workers` processes and short
// timeouts; `more` is appended (further sections).
inline std::string tiny_launch_config(int workers, const std::string& more = "") {
  return R"([model]
context = 32
layers = 2
width = 32
heads = 2
[optim]
lr = 0.003
warmup_steps = 5
[train]
steps = 40
batch_size = 4
device = "cpu"
log_every = 5
[eval]
every = 20
windows = 8
[checkpoint]
every = 10
[sync]
algorithm = "diloco"
inner_steps = 5
[cluster]
workers = )" + std::to_string(workers) + R"(
timeout_s = 20
join_timeout_s = 30
connect_timeout_s = 10
)" + more;
}

// The command a hint in `output` prints after `marker` (to the end of its line), as argv with
// `loco` the binary under test: what a user would paste. Empty when there is none. The hint's
// words are split at spaces (the tests' paths hold none; shell quotes are not undone).
inline std::vector<std::string> printed_command(const std::string& output, const std::string& marker) {
  const auto at = output.find(marker);
  if (at == std::string::npos) return {};
  const auto begin = at + marker.size();
  const auto line = output.substr(begin, output.find('\n', begin) - begin);
  std::vector<std::string> argv;
  for (size_t i = 0; i < line.size();) {
    const auto space = line.find(' ', i);
    const auto word = line.substr(i, space == std::string::npos ? std::string::npos : space - i);
    if (!word.empty()) argv.push_back(argv.empty() && word == "loco" ? loco_binary() : word);
    if (space == std::string::npos) break;
    i = space + 1;
  }
  return argv;
}

}  // namespace loco::testing_util
