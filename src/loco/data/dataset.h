// A prepared dataset folder, written by `loco prepare` and read by training and evaluation.
//
//   DIR/manifest.json        counts, labels (and how they were chosen), tokenizer info, split seed,
//                            val_unigram_entropy, files
//   DIR/tokenizer.model      SentencePiece model, or
//   DIR/tokenizer.json       a model's own byte-level BPE, with tokenizer_config.json naming its eos
//   DIR/train-00000.tok ...  token shards of the training split (see shard.h)
//   DIR/val-00000.tok ...    token shards of the validation split
//   DIR/train.docs, val.docs document index of each split (see docs/data-format.md)
//
// Each split is one token stream, the concatenation of its documents in index order, each document
// followed by the eos token. The split is by document, deterministic given the seed.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "loco/data/corpus.h"
#include "loco/data/tokenizer.h"

namespace loco::data {

namespace fs = std::filesystem;

struct DocumentEntry {
  uint64_t offset = 0;  // first token in the split's stream
  uint32_t length = 0;  // tokens, eos included
  uint32_t label = 0;   // index into Manifest::labels
};

struct Split {
  std::vector<int32_t> tokens;
  std::vector<DocumentEntry> documents;
};

struct Manifest {
  int format_version = 1;
  std::string corpus;                 // the --corpus spec
  LabelBy label_by = LabelBy::kOwn;   // how the documents were labelled (--label)
  std::vector<std::string> labels;    // label names; DocumentEntry::label indexes this
  int vocab_size = 0;                 // of the model: the tokenizer's, or more where a model pads it
  uint64_t tokenizer_hash = 0;
  std::string tokenizer_type = "sentencepiece-bpe";  // or "byte-level-bpe"
  std::string tokenizer_file = "tokenizer.model";    // or "tokenizer.json"
  uint64_t seed = 0;
  double val_fraction = 0;
  uint64_t train_documents = 0, val_documents = 0;
  uint64_t train_tokens = 0, val_tokens = 0;
  double val_unigram_entropy = 0;     // nats/token of the validation tokens' unigram distribution
  std::vector<std::string> train_shards, val_shards;  // file names relative to the folder
};

struct PrepareOptions {
  std::string corpus;                 // see corpus.h
  LabelBy label_by = LabelBy::kOwn;   // documents' own labels, or their source's name (corpus.h)
  fs::path out;
  fs::path cache_dir;                 // npm downloads; default chosen by the CLI
  int vocab_size = 4096;              // of the tokenizer trained here (not with `tokenizer`)
  double character_coverage = 1.0;    // of the tokenizer trained here: TokenizerTrainOptions
  // A model's own tokenizer: a tokenizer.model (SentencePiece) or tokenizer.json (byte-level BPE)
  // file, or a (Hugging Face) folder that holds one; used as it is instead of training one, and the
  // dataset's vocabulary is the model's (config.json's vocab_size beside it, when larger). "" = train
  // one on the training split.
  fs::path tokenizer;
  double val_fraction = 0.1;          // share of documents in the validation split, (0, 1)
  uint64_t seed = 1234;
  uint64_t shard_tokens = 1ull << 26; // max tokens per shard file
  bool overwrite = false;             // refuse a non-empty `out` unless set
  Progress progress;                  // one line per stage (more while a slow corpus is read); may be empty
};

// Reads the corpus, splits it, trains the tokenizer on the training split (or takes the given one:
// DataError when it is not a SentencePiece model with unk = 0, bos = 1, eos = 2, nor a byte-level
// BPE tokenizer.json that loco reads, with an end-of-text token named), tokenizes both splits
// and writes the folder (files are written atomically; the manifest last, so a folder without a
// manifest is an incomplete preparation). Throws Error/DataError on bad input.
Manifest prepare_dataset(const PrepareOptions& options);

// Unigram entropy (nats/token) of `tokens` over a vocabulary of `vocab_size`.
double unigram_entropy(const std::vector<int32_t>& tokens, int vocab_size);

// A prepared dataset, opened and verified: manifest fields, every shard's header and checksum,
// that shards and document indexes agree, and that the tokenizer hashes to the manifest's
// tokenizer_hash. Throws DataError naming the file and the problem.
class Dataset {
 public:
  static Dataset open(const fs::path& dir);
  // Only the tokenizer of the dataset in `dir`, checked against its manifest.
  static Tokenizer open_tokenizer(const fs::path& dir);

  const fs::path& dir() const { return dir_; }
  const Manifest& manifest() const { return manifest_; }
  const Tokenizer& tokenizer() const { return tokenizer_; }
  const Split& train() const { return train_; }
  const Split& val() const { return val_; }

 private:
  Dataset(fs::path dir, Manifest manifest, Tokenizer tokenizer, Split train, Split val);
  fs::path dir_;
  Manifest manifest_;
  Tokenizer tokenizer_;
  Split train_, val_;
};

// DIR/manifest.json, parsed and checked (fields, types, ranges, shard names, label counts).
// Throws DataError naming the file and the field.
Manifest read_manifest(const fs::path& dir);
// The same on the text of a manifest; `file` only names it in errors.
Manifest decode_manifest(const std::string& text, const fs::path& file);

// A document index (train.docs / val.docs, docs/data-format.md) from its bytes, checked on its own
// (magic, version, size, checksum; not yet against the shards). Throws DataError naming `file`.
std::vector<DocumentEntry> decode_document_index(std::string_view bytes, const fs::path& file);
// ... and its bytes, for `documents`.
std::string encode_document_index(const std::vector<DocumentEntry>& documents);

}  // namespace loco::data
