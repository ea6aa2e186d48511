// Helpers of the data module's tests: error-message checks and a
// seeded generator of English-like text.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "../test_util.h"

namespace loco::data::testing {

namespace fs = std::filesystem;

// Temporary folders shared with the other modules' tests.
using TempDir = ::loco::testing_util::TempDir;

inline void write_text(const fs::path& path, std::string_view bytes) {
  fs::create_directories(path.parent_path());
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

inline std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Succeeds when `f` throws exactly `E` (or a subclass) whose message contains every needle.
template <typename E, typename F>
::testing::AssertionResult throws_with(F&& f, const std::vector<std::string>& needles) {
  try {
    f();
  } catch (const E& e) {
    const std::string message = e.what();
    for (const auto& needle : needles) {
      if (message.find(needle) == std::string::npos) {
        return ::testing::AssertionFailure() << "message \"" << message << "\" does not contain \"" << needle << "\"";
      }
    }
    return ::testing::AssertionSuccess();
  } catch (const std::exception& e) {
    return ::testing::AssertionFailure() << "threw a different exception type: " << e.what();
  }
  return ::testing::AssertionFailure() << "did not throw";
}

// Words built from syllables, sampled with a fixed seed; sentences of lowercase words separated by
// single spaces and ending with " ." -> ".", so that SentencePiece's whitespace normalization keeps
// them unchanged (decode(encode(s)) == s).
class TextGenerator {
 public:
  explicit TextGenerator(uint64_t seed, size_t words = 150) : rng_(seed) {
    static constexpr const char* kSyllables[] = {"ka", "lo", "mi", "ne", "ru", "sa",  "te",  "vo",  "zu",  "pe",
                                                 "an", "or", "is", "el", "um", "qua", "bri", "sto", "fen", "dax"};
    for (size_t i = 0; i < words; ++i) {
      std::string w;
      size_t n = 1 + next(3);
      for (size_t k = 0; k < n; ++k) w += kSyllables[next(std::size(kSyllables))];
      words_.push_back(w);
    }
  }
  // Index skewed towards small values, so that word frequencies are Zipf-like.
  std::string word() { return words_[std::min(next(words_.size()), next(words_.size()))]; }
  std::string sentence() {
    std::string s;
    size_t n = 4 + next(10);
    for (size_t i = 0; i < n; ++i) s += (i ? " " : "") + word();
    return s + ".";
  }
  std::string paragraph(size_t sentences) {
    std::string p;
    for (size_t i = 0; i < sentences; ++i) p += (i ? " " : "") + sentence();
    return p;
  }
  size_t next(size_t n) { return static_cast<size_t>(rng_() % n); }

 private:
  std::mt19937_64 rng_;
  std::vector<std::string> words_;
};

}  // namespace loco::data::testing
