// The tokenizer of a dataset, shipped inside its folder: a SentencePiece BPE model (tokenizer.model),
// trained on the training split or a model's own, with the special ids unk = 0, bos = 1, eos = 2; or a
// model's own byte-level BPE (tokenizer.json, byte_level_bpe.h), whose end-of-text token
// tokenizer_config.json beside it names. Documents end with eos in the token stream.
// SentencePiece itself runs in the plugin libloco_spm.so, loaded on first use (spm/spm_c_api.h
// says why); every function below throws Error when the plugin cannot be loaded.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "loco/data/byte_level_bpe.h"

namespace loco::data {

namespace fs = std::filesystem;

struct TokenizerTrainOptions {
  int vocab_size = 4096;
  int num_threads = 2;
  uint64_t seed = 0;                    // documents are sampled deterministically from it
  size_t max_sentences = 2'000'000;     // SentencePiece input_sentence_size
  // The share of the text's characters that get pieces of their own, the most frequent first, in
  // (0, 1]; the rarer ones are written as their UTF-8 bytes (byte fallback). Below 1, a vocabulary
  // need not hold every character of a corpus that has thousands (SentencePiece's character_coverage).
  double character_coverage = 1.0;
};

class Tokenizer {
 public:
  // Trains a BPE model on `texts` (each split into lines). Throws Error when SentencePiece fails
  // (for example a vocabulary larger than the text allows).
  static Tokenizer train(const std::vector<std::string_view>& texts, const TokenizerTrainOptions& options);
  // Loads a tokenizer.model (SentencePiece), or a tokenizer.json (byte-level BPE) with its eos and
  // bos tokens from tokenizer_config.json beside it (eos_token, bos_token) or else from config.json
  // (eos_token_id, bos_token_id). Throws DataError naming the file when it is not one, or when no
  // end-of-text token is named.
  static Tokenizer load(const fs::path& model_file);
  // A model's own tokenizer: the file (as load()), or the folder's tokenizer.model, else its
  // tokenizer.json. Throws DataError when there is none.
  static Tokenizer load_model_tokenizer(const fs::path& file_or_folder);
  static Tokenizer from_serialized(std::string serialized_model, std::string_view where);

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // Writes the model to `model_file` (atomically), and the tokenizer_config.json it was read with
  // beside it, unchanged (its chat template, padding token and the rest); a byte-level BPE read
  // without one gets one naming its eos and bos tokens.
  void save(const fs::path& model_file) const;
  // Writes the tokenizer into a Hugging Face model folder: tokenizer.json or tokenizer.model, and a
  // tokenizer_config.json naming its special tokens (for SentencePiece, LlamaTokenizer's <s>, </s>
  // and <unk>, adding neither bos nor eos, as loco's documents are tokenized).
  void save_hugging_face(const fs::path& folder) const;
  bool is_byte_level() const { return bpe_ != nullptr; }
  const char* file_name() const { return is_byte_level() ? "tokenizer.json" : "tokenizer.model"; }
  const char* type_name() const { return is_byte_level() ? "byte-level-bpe" : "sentencepiece-bpe"; }
  std::vector<int32_t> encode(std::string_view text) const;
  // A prompt as the start of a document, as training saw documents start: after the bos token
  // where documents start with one (bos_per_document); an empty prompt without one is the eos
  // that ended the document before.
  std::vector<int32_t> encode_prompt(std::string_view text) const;
  // The text of generated ids, a leading bos left out.
  std::string decode_text(const std::vector<int32_t>& ids) const;
  std::string decode(const std::vector<int32_t>& ids) const;
  int vocab_size() const;
  int eos_id() const { return eos_id_; }
  int bos_id() const { return bos_id_; }  // -1: none
  // Whether a document starts with the bos token, as the model's tokenizer adds it to every text:
  // tokenizer_config.json's add_bos_token, else a tokenizer.json's post-processor whose template
  // starts with a special token (Llama 3's <|begin_of_text|>). False for the tokenizers loco trains.
  bool bos_per_document() const { return bos_per_document_; }
  // XXH3-64 of the serialized model (and of a byte-level BPE's eos and bos): identifies the
  // tokenizer in shards, manifests and checkpoints.
  uint64_t hash() const { return hash_; }
  const std::string& serialized() const { return serialized_; }

 private:
  Tokenizer();
  static Tokenizer load_byte_level(const fs::path& json_file);
  class Processor;  // a model loaded in libloco_spm.so (see tokenizer.cpp)
  std::unique_ptr<Processor> processor_;
  std::unique_ptr<ByteLevelBpe> bpe_;  // instead of processor_
  std::string eos_token_, bos_token_;  // a byte-level BPE's, as written in tokenizer_config.json
  std::string settings_;               // the tokenizer_config.json read beside it, written back as it was
  bool bos_per_document_ = false;
  void read_bos_rule(std::string_view where);
  int eos_id_ = 2, bos_id_ = 1;
  std::string serialized_;
  uint64_t hash_ = 0;
};

// The vocabulary of the model beside a tokenizer (`file_or_folder` as load_model_tokenizer's):
// config.json's vocab_size when it is larger than the tokenizer's `tokenizer_vocab` (Qwen2 pads its
// embedding to a multiple of 128), else `tokenizer_vocab`. Throws DataError for a malformed config.json.
int model_vocab_size(const fs::path& file_or_folder, int tokenizer_vocab);

}  // namespace loco::data
