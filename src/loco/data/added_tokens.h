// A tokenizer.json's added tokens (byte_level_bpe.h): cut out of a text before anything else, as
// Hugging Face's tokenizers does. Internal to the byte-level BPE; exposed for its tests.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace loco::data::detail {

struct AddedToken {
  std::string content;
  int32_t id = 0;
  bool lstrip = false, rstrip = false;  // take the white space before / after it with it
};

// A stretch of text, or an added token cut out of it.
struct Section {
  std::string text;
  const AddedToken* token = nullptr;
};

// Added tokens, and which of them start with each byte (most bytes start none: a text is scanned
// once, looking only where one could begin).
struct AddedTokens {
  std::vector<AddedToken> tokens;
  std::array<std::vector<size_t>, 256> by_first_byte;

  void add(AddedToken token);  // an empty one is ignored
};

// Cuts `added` out of `text` (UTF-8), leftmost and longest first, and strips white space (Unicode's
// White_Space, as Rust's regex \s) beside those that ask for it. The tokens point into `added`.
std::vector<Section> split_added(const std::string& text, const AddedTokens& added);

}  // namespace loco::data::detail
