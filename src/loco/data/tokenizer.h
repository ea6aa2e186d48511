// SentencePiece BPE tokenizer, trained on the training split and shipped inside the dataset folder.
// Fixed special ids: unk = 0, bos = 1, eos = 2 (documents end with eos in the token stream).
// SentencePiece itself runs in the plugin libloco_spm.so, loaded on first use (spm/spm_c_api.h
// says why); every function below throws Error when the plugin cannot be loaded.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace loco::data {

namespace fs = std::filesystem;

struct TokenizerTrainOptions {
  int vocab_size = 4096;
  int num_threads = 2;
  uint64_t seed = 0;                    // documents are sampled deterministically from it
  size_t max_sentences = 2'000'000;     // SentencePiece input_sentence_size
};

class Tokenizer {
 public:
  // Trains a BPE model on `texts` (each split into lines). Throws Error when SentencePiece fails
  // (for example a vocabulary larger than the text allows).
  static Tokenizer train(const std::vector<std::string_view>& texts, const TokenizerTrainOptions& options);
  // Loads a model file written by save(). Throws DataError naming the file when it is not one.
  static Tokenizer load(const fs::path& model_file);
  static Tokenizer from_serialized(std::string serialized_model, std::string_view where);

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  void save(const fs::path& model_file) const;  // atomic
  std::vector<int32_t> encode(std::string_view text) const;
  std::string decode(const std::vector<int32_t>& ids) const;
  int vocab_size() const;
  int eos_id() const { return 2; }
  int bos_id() const { return 1; }
  // XXH3-64 of the serialized model: identifies the tokenizer in shards, manifests and checkpoints.
  uint64_t hash() const { return hash_; }
  const std::string& serialized() const { return serialized_; }

 private:
  Tokenizer();
  class Processor;  // a model loaded in libloco_spm.so (see tokenizer.cpp)
  std::unique_ptr<Processor> processor_;
  std::string serialized_;
  uint64_t hash_ = 0;
};

}  // namespace loco::data
