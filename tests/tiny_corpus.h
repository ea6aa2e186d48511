// A small synthetic corpus with structure a tiny model can learn (a few sentence templates over a
// seeded vocabulary), and a prepared dataset made from it. Deterministic; no network.
#pragma once

#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "loco/data/dataset.h"

namespace loco::testing_util {

inline void write_tiny_corpus(const std::filesystem::path& folder, int documents = 40, int sentences = 60) {
  const std::vector<std::string> subjects = {"the cat", "a dog", "the old man", "my sister", "the river", "a small bird"};
  const std::vector<std::string> verbs = {"sees", "likes", "follows", "remembers", "carries", "finds"};
  const std::vector<std::string> objects = {"the red ball", "a green house", "the morning light", "an open door",
                                            "the long road", "a quiet song"};
  std::mt19937_64 rng(7);
  std::filesystem::create_directories(folder);
  for (int d = 0; d < documents; ++d) {
    std::ofstream out(folder / fmt::format("doc{:03}.txt", d));
    for (int s = 0; s < sentences; ++s) {
      out << subjects[rng() % subjects.size()] << " " << verbs[rng() % verbs.size()] << " "
          << objects[rng() % objects.size()] << ". ";
      if (s % 8 == 7) out << "\n";
    }
  }
}

// Prepares DIR/data from a tiny corpus written to DIR/corpus; returns the dataset folder.
inline std::filesystem::path prepare_tiny_dataset(const std::filesystem::path& dir, int vocab_size = 320) {
  write_tiny_corpus(dir / "corpus");
  data::PrepareOptions options;
  options.corpus = (dir / "corpus").string();
  options.out = dir / "data";
  options.cache_dir = dir / "cache";
  options.vocab_size = vocab_size;
  options.val_fraction = 0.1;
  data::prepare_dataset(options);
  return options.out;
}

}  // namespace loco::testing_util
