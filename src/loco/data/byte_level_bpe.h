// Byte-level BPE, the tokenizer of GPT-2 and of Llama 3, Qwen2 and SmolLM, read from a Hugging Face
// tokenizer.json (docs/hugging-face.md). Encoding follows Hugging Face's `tokenizers` step by step:
//   1. added tokens (`added_tokens`) are cut out of the text first, leftmost and longest, honouring
//      their lstrip/rstrip; those marked `normalized` are looked for again after normalization;
//   2. the normalizer: none, NFC, NFD, NFKC, NFKD or a Sequence of them (utf8proc);
//   3. the pre-tokenizer: ByteLevel (GPT-2's split when use_regex), Split on the file's own regex
//      (Isolated or Removed; compiled by PCRE2, \s read as Unicode's White_Space as Oniguruma
//      reads it; a pattern PCRE2 cannot compile is refused), Digits (numbers as Rust's
//      char::is_numeric), or a Sequence of them ending with ByteLevel;
//   4. BPE on the UTF-8 bytes of each piece: the adjacent pair of lowest merge rank is merged first,
//      the leftmost among equals (`ignore_merges`: a piece that is a vocabulary entry is kept whole).
// No special tokens are added (add_special_tokens = false): loco ends each document with the eos
// token itself. What the file asks for beyond this (another model, a single_word added token,
// dropout, byte fallback, an inverted Split, a step after ByteLevel) is refused when it is read,
// never approximated.
// Tested against Hugging Face's own JavaScript tokenizers (tests/data/byte_level_bpe_test.cpp).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace loco::data {

class ByteLevelBpe {
 public:
  // Parses tokenizer.json text. Throws DataError naming `where` and what it cannot read.
  static std::unique_ptr<ByteLevelBpe> parse(std::string_view json_text, std::string_view where);
  ~ByteLevelBpe();
  ByteLevelBpe(const ByteLevelBpe&) = delete;
  ByteLevelBpe& operator=(const ByteLevelBpe&) = delete;

  // Token ids of `text` (UTF-8). Thread-safe. Throws DataError for text that is not UTF-8.
  std::vector<int32_t> encode(std::string_view text) const;
  // The bytes the ids stand for (added tokens as their content). Throws Error for an unknown id.
  std::string decode(const std::vector<int32_t>& ids) const;
  // The highest id of the vocabulary or the added tokens, plus one.
  int vocab_size() const;
  // The id of a vocabulary entry or added token as the file writes it ("<|endoftext|>", "Ġthe").
  std::optional<int32_t> id_of(std::string_view token) const;

 private:
  struct Impl;
  explicit ByteLevelBpe(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace loco::data
