// Preparing a dataset (`loco prepare`): a corpus split into train and validation documents,
// a tokenizer trained or taken, every document encoded, and the folder written (dataset_files.h),
// the manifest last.
#include <algorithm>
#include <cmath>
#include <exception>
#include <map>
#include <set>
#include <span>
#include <thread>

#include "loco/core/error.h"
#include "loco/core/files.h"
#include "loco/core/hash.h"
#include "loco/data/corpus.h"
#include "loco/data/dataset.h"
#include "loco/data/dataset_files.h"
#include "loco/data/sampling.h"
#include "loco/data/shard.h"

namespace loco::data {
namespace {

using namespace files;

// ---- preparing ----------------------------------------------------------------------------------

void validate(const PrepareOptions& o) {
  auto bad = [](const std::string& m) { throw ConfigError(kModule, m); };
  if (o.corpus.empty()) bad("prepare: no corpus given");
  if (o.out.empty()) bad("prepare: no output folder given");
  if (o.vocab_size < kMinVocab) {
    bad(
        fmt::format("prepare: vocab_size = {} is too small: the tokenizer needs at least {} (3 special ids, 256 "
                    "byte-fallback pieces, and the corpus' characters)",
                    o.vocab_size, kMinVocab));
  }
  if (!(o.character_coverage > 0 && o.character_coverage <= 1)) {
    bad(fmt::format("prepare: character_coverage = {} must be in (0, 1]", o.character_coverage));
  }
  if (!(o.val_fraction > 0 && o.val_fraction < 1)) {
    bad(fmt::format("prepare: val_fraction = {} must be in (0, 1)", o.val_fraction));
  }
  if (o.shard_tokens == 0) bad("prepare: shard_tokens must be positive");
  if (o.cache_dir.empty() && (o.corpus == "brown" || o.corpus == "nlp-corpus" || o.corpus == "domains")) {
    bad(fmt::format("prepare: corpus '{}' is (in part) downloaded with npm, but no cache folder was given", o.corpus));
  }
}

bool is_output_file(const std::string& name) {
  auto numbered_shard = [&](std::string_view prefix) { return name.starts_with(prefix) && name.ends_with(".tok"); };
  return name == kManifestFile || name == "tokenizer.model" || name == "tokenizer.json" ||
         name == "tokenizer_config.json" || name == docs_file_name("train") ||
         name == docs_file_name("val") || numbered_shard("train-") || numbered_shard("val-");
}

// Refuses a non-empty `out` unless `overwrite`; with it, removes the files an earlier preparation
// wrote (the manifest first, so that a crash in between leaves a folder marked incomplete) and
// leaves anything else alone.
void prepare_out_folder(const fs::path& out, bool overwrite) {
  std::error_code ec;
  if (fs::exists(out, ec)) {
    if (!fs::is_directory(out, ec)) throw Error(kModule, fmt::format("{}: exists and is not a folder", out.string()));
    if (!fs::is_empty(out, ec)) {
      if (!overwrite) {
        throw Error(kModule, fmt::format("{}: the output folder is not empty; refusing to overwrite it. hint: choose "
                                         "a new folder, or pass --overwrite",
                                         out.string()));
      }
      fs::remove(out / kManifestFile, ec);
      for (const auto& entry : fs::directory_iterator(out)) {
        if (entry.is_regular_file() && is_output_file(entry.path().filename().string())) fs::remove(entry.path(), ec);
      }
    }
  }
  fs::create_directories(out, ec);
  if (ec) throw Error(kModule, fmt::format("{}: cannot create folder: {}", out.string(), ec.message()));
}

bool is_blank(std::string_view s) {
  return std::all_of(s.begin(), s.end(),
                     [](char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == '\f' || c == '\v'; });
}

// Encodes documents in parallel (SentencePiece encoding is const and thread-safe); the result
// does not depend on the number of threads.
std::vector<std::vector<int32_t>> encode_all(const Tokenizer& tokenizer, const std::vector<const Document*>& docs) {
  std::vector<std::vector<int32_t>> out(docs.size());
  const size_t threads = std::clamp<size_t>(std::thread::hardware_concurrency(), 1, 8);
  std::vector<std::exception_ptr> errors(threads);
  std::vector<std::thread> workers;
  for (size_t t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      try {
        for (size_t i = t; i < docs.size(); i += threads) out[i] = tokenizer.encode(docs[i]->text);
      } catch (...) {
        errors[t] = std::current_exception();
      }
    });
  }
  for (auto& w : workers) w.join();
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
  return out;
}

Split build_split(const Tokenizer& tokenizer, const std::vector<const Document*>& docs,
                  const std::map<std::string, uint32_t>& label_index) {
  std::vector<std::vector<int32_t>> encoded = encode_all(tokenizer, docs);
  Split split;
  size_t total = 0;
  const bool bos = tokenizer.bos_per_document();
  for (const auto& e : encoded) total += e.size() + 1 + (bos ? 1 : 0);
  split.tokens.reserve(total);
  for (size_t i = 0; i < docs.size(); ++i) {
    const uint64_t length = encoded[i].size() + 1 + (bos ? 1 : 0);  // (bos) + text + eos
    if (length > UINT32_MAX) {
      throw DataError(kModule, fmt::format("document {} has {} tokens, more than the index can hold ({})",
                                           docs[i]->name, length, UINT32_MAX));
    }
    split.documents.push_back(
        DocumentEntry{split.tokens.size(), static_cast<uint32_t>(length), label_index.at(docs[i]->label)});
    if (bos) split.tokens.push_back(tokenizer.bos_id());
    split.tokens.insert(split.tokens.end(), encoded[i].begin(), encoded[i].end());
    split.tokens.push_back(tokenizer.eos_id());
  }
  return split;
}

std::vector<std::string> write_split(const fs::path& out, std::string_view name, const Split& split, const Manifest& m,
                                     uint64_t shard_tokens) {
  std::vector<std::string> shards;
  const std::span<const int32_t> all(split.tokens);
  for (uint64_t start = 0; start < all.size(); start += shard_tokens) {
    std::string file = fmt::format("{}-{:05d}.tok", name, shards.size());
    write_shard(out / file, all.subspan(start, std::min<uint64_t>(shard_tokens, all.size() - start)),
                static_cast<uint32_t>(m.vocab_size), m.tokenizer_hash);
    shards.push_back(std::move(file));
  }
  write_file_atomic(out / docs_file_name(name), encode_document_index(split.documents), kModule);
  return shards;
}

std::vector<uint64_t> documents_per_label(const Split& split, size_t labels) {
  std::vector<uint64_t> counts(labels, 0);
  for (const auto& d : split.documents) ++counts[d.label];
  return counts;
}

}  // namespace

double unigram_entropy(const std::vector<int32_t>& tokens, int vocab_size) {
  LOCO_CHECK(vocab_size > 0, "unigram_entropy: vocab_size {}", vocab_size);
  if (tokens.empty()) return 0.0;
  std::vector<uint64_t> counts(static_cast<size_t>(vocab_size), 0);
  for (int32_t t : tokens) {
    LOCO_CHECK(t >= 0 && t < vocab_size, "unigram_entropy: token {} outside [0, {})", t, vocab_size);
    ++counts[static_cast<size_t>(t)];
  }
  const double n = static_cast<double>(tokens.size());
  double h = 0.0;
  for (uint64_t c : counts) {
    if (c == 0) continue;
    const double p = static_cast<double>(c) / n;
    h -= p * std::log(p);
  }
  return h;
}

namespace {

Tokenizer train_tokenizer(const PrepareOptions& options, const std::vector<const Document*>& train_docs) {
  if (options.progress) {
    options.progress(fmt::format("training tokenizer (vocab {}{}) on {} documents", options.vocab_size,
                                 options.character_coverage < 1 ? fmt::format(", character coverage {}", options.character_coverage) : "",
                                 train_docs.size()));
  }
  std::vector<std::string_view> train_texts;
  for (const Document* d : train_docs) train_texts.push_back(d->text);
  TokenizerTrainOptions tokenizer_options;
  tokenizer_options.vocab_size = options.vocab_size;
  tokenizer_options.seed = options.seed;
  tokenizer_options.character_coverage = options.character_coverage;
  Tokenizer tokenizer = Tokenizer::train(train_texts, tokenizer_options);
  LOCO_CHECK(tokenizer.vocab_size() == options.vocab_size, "trained vocab {} != requested {}", tokenizer.vocab_size(),
             options.vocab_size);
  return tokenizer;
}

}  // namespace

Manifest prepare_dataset(const PrepareOptions& options) {
  validate(options);
  auto progress = [&](const std::string& line) {
    if (options.progress) options.progress(line);
  };
  prepare_out_folder(options.out, options.overwrite);

  std::vector<Document> corpus =
      load_corpus(options.corpus, CorpusOptions{options.cache_dir, options.label_by, options.progress});
  const size_t read = corpus.size();
  std::erase_if(corpus, [](const Document& d) { return is_blank(d.text); });
  std::set<std::string> label_set;
  for (const auto& d : corpus) label_set.insert(d.label);
  progress(fmt::format("read {} documents ({} labels) from {}{}", read, label_set.size(), options.corpus,
                       read == corpus.size() ? "" : fmt::format(", dropped {} empty", read - corpus.size())));
  if (corpus.size() < 2) {
    throw DataError(kModule, fmt::format("corpus '{}' has {} non-empty documents; at least 2 are needed (one for "
                                         "training, one for validation)",
                                         options.corpus, corpus.size()));
  }

  Manifest m;
  m.corpus = options.corpus;
  m.label_by = options.label_by;
  m.labels.assign(label_set.begin(), label_set.end());
  std::map<std::string, uint32_t> label_index;
  for (uint32_t i = 0; i < m.labels.size(); ++i) label_index[m.labels[i]] = i;
  m.seed = options.seed;
  m.val_fraction = options.val_fraction;

  // Split by document: the first n_val of a seeded permutation are validation. Both streams keep
  // the permuted order, so that reading a split front to back does not walk through one genre
  // after another.
  const uint64_t n = corpus.size();
  const uint64_t n_val = std::clamp<uint64_t>(
      static_cast<uint64_t>(std::llround(static_cast<double>(n) * options.val_fraction)), 1, n - 1);
  const std::vector<uint64_t> order = detail::permutation(n, options.seed);
  std::vector<const Document*> train_docs, val_docs;
  for (uint64_t i = 0; i < n; ++i) (i < n_val ? val_docs : train_docs).push_back(&corpus[order[i]]);
  progress(
      fmt::format("split by document (seed {}): {} train, {} val", options.seed, train_docs.size(), val_docs.size()));

  Tokenizer tokenizer = options.tokenizer.empty() ? train_tokenizer(options, train_docs) : Tokenizer::load_model_tokenizer(options.tokenizer);
  if (!options.tokenizer.empty()) {
    progress(fmt::format("tokenizer: {} (vocab {}){}", options.tokenizer.string(), tokenizer.vocab_size(),
                         tokenizer.bos_per_document()
                             ? fmt::format("; each document starts with its bos token ({}), as the model's tokenizer adds it",
                                           tokenizer.bos_id())
                             : ""));
  }

  Split train = build_split(tokenizer, train_docs, label_index);
  Split val = build_split(tokenizer, val_docs, label_index);
  progress(fmt::format("tokenized: train {} tokens, val {} tokens", train.tokens.size(), val.tokens.size()));

  m.vocab_size = options.tokenizer.empty() ? tokenizer.vocab_size() : model_vocab_size(options.tokenizer, tokenizer.vocab_size());
  m.tokenizer_hash = tokenizer.hash();
  m.tokenizer_type = tokenizer.type_name();
  m.tokenizer_file = tokenizer.file_name();
  m.train_documents = train.documents.size();
  m.val_documents = val.documents.size();
  m.train_tokens = train.tokens.size();
  m.val_tokens = val.tokens.size();
  m.val_unigram_entropy = unigram_entropy(val.tokens, m.vocab_size);

  tokenizer.save(options.out / m.tokenizer_file);
  m.train_shards = write_split(options.out, "train", train, m, options.shard_tokens);
  m.val_shards = write_split(options.out, "val", val, m, options.shard_tokens);
  // Last: a folder with a manifest is a complete dataset.
  write_file_atomic(
      options.out / kManifestFile,
      manifest_json(m, documents_per_label(train, m.labels.size()), documents_per_label(val, m.labels.size())),
      kModule);
  progress(fmt::format("wrote {}: {} train and {} val shards, val unigram entropy {:.3f} nats/token",
                       options.out.string(), m.train_shards.size(), m.val_shards.size(), m.val_unigram_entropy));
  return m;
}


}  // namespace loco::data
