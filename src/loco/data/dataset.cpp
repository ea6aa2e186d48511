#include "loco/data/dataset.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <exception>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "loco/core/error.h"
#include "loco/core/files.h"
#include "loco/core/hash.h"
#include "loco/data/corpus.h"
#include "loco/data/sampling.h"
#include "loco/data/shard.h"

namespace loco::data {
namespace {

static_assert(std::endian::native == std::endian::little, "loco's file formats are little-endian");

using json = nlohmann::ordered_json;

constexpr std::string_view kModule = "data";
constexpr int kFormatVersion = 1;
constexpr const char* kManifestFile = "manifest.json";
// The tokenizer kinds a dataset may hold: type in the manifest -> its file.
const std::map<std::string, std::string> kTokenizerFiles = {{"sentencepiece-bpe", "tokenizer.model"},
                                                            {"byte-level-bpe", "tokenizer.json"}};
// 3 special ids + 256 byte-fallback pieces; SentencePiece needs room for the characters on top.
constexpr int kMinVocab = 260;

[[noreturn]] void fail(const fs::path& file, const std::string& problem) {
  throw DataError(kModule, fmt::format("{}: {}", file.string(), problem));
}

std::string docs_file_name(std::string_view split) { return fmt::format("{}.docs", split); }

}  // namespace

namespace {

std::vector<DocumentEntry> read_docs(const fs::path& file) { return decode_document_index(read_file(file, kModule), file); }

// ---- manifest -----------------------------------------------------------------------------------

bool is_plain_file_name(const std::string& name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos &&
         name.find('\\') == std::string::npos && name.find('\0') == std::string::npos;
}

// Typed access to manifest fields; every failure names the file and the field.
class Fields {
 public:
  Fields(const json& object, fs::path file, std::string prefix = "")
      : object_(object), file_(std::move(file)), prefix_(std::move(prefix)) {}

  const json& at(const char* key) const {
    auto it = object_.find(key);
    if (it == object_.end()) fail(file_, fmt::format("missing field \"{}{}\"", prefix_, key));
    return *it;
  }
  [[noreturn]] void wrong(const char* key, std::string_view expected) const {
    fail(file_, fmt::format("field \"{}{}\" must be {}", prefix_, key, expected));
  }
  uint64_t u64(const char* key) const {
    const json& v = at(key);
    if (!v.is_number_unsigned()) wrong(key, "a non-negative integer");
    return v.get<uint64_t>();
  }
  int positive_int(const char* key) const {
    const json& v = at(key);
    if (!v.is_number_unsigned() || v.get<uint64_t>() == 0 || v.get<uint64_t>() > INT32_MAX) {
      wrong(key, "a positive integer");
    }
    return static_cast<int>(v.get<uint64_t>());
  }
  double number(const char* key) const {
    const json& v = at(key);
    if (!v.is_number()) wrong(key, "a number");
    return v.get<double>();
  }
  std::string string(const char* key) const {
    const json& v = at(key);
    if (!v.is_string()) wrong(key, "a string");
    return v.get<std::string>();
  }
  std::vector<std::string> strings(const char* key) const {
    const json& v = at(key);
    if (!v.is_array() || !std::all_of(v.begin(), v.end(), [](const json& e) { return e.is_string(); })) {
      wrong(key, "a list of strings");
    }
    return v.get<std::vector<std::string>>();
  }
  std::vector<uint64_t> u64s(const char* key) const {
    const json& v = at(key);
    if (!v.is_array() || !std::all_of(v.begin(), v.end(), [](const json& e) { return e.is_number_unsigned(); })) {
      wrong(key, "a list of non-negative integers");
    }
    return v.get<std::vector<uint64_t>>();
  }
  Fields object(const char* key) const {
    const json& v = at(key);
    if (!v.is_object()) wrong(key, "an object");
    return Fields(v, file_, prefix_ + key + ".");
  }

 private:
  const json& object_;
  fs::path file_;
  std::string prefix_;
};

struct ParsedManifest {
  Manifest manifest;
  std::vector<uint64_t> train_label_documents, val_label_documents;  // per label
};

ParsedManifest parse_manifest_text(const std::string& text, const fs::path& file);

ParsedManifest parse_manifest(const fs::path& dir) {
  const fs::path file = dir / kManifestFile;
  std::error_code ec;
  if (!fs::exists(file, ec)) {
    fail(file,
         "no such file: the folder is not a prepared dataset, or its preparation did not finish. "
         "hint: run loco prepare");
  }
  return parse_manifest_text(read_file(file, kModule), file);
}

ParsedManifest parse_manifest_text(const std::string& text, const fs::path& file) {
  json root;
  try {
    root = json::parse(text);
  } catch (const json::exception& e) {
    fail(file, fmt::format("malformed JSON: {}", e.what()));
  }
  if (!root.is_object()) fail(file, "expected a JSON object");
  Fields f(root, file);

  ParsedManifest parsed;
  Manifest& m = parsed.manifest;
  const uint64_t version = f.u64("format_version");
  if (version != kFormatVersion) {
    fail(file, fmt::format("dataset format version {}, this loco reads version {}. hint: re-run loco prepare", version,
                           kFormatVersion));
  }
  m.format_version = kFormatVersion;
  m.corpus = f.string("corpus");
  // Absent from datasets prepared before --label existed: those have their documents' own labels.
  const std::string label_by = root.contains("label_by") ? f.string("label_by") : "own";
  if (label_by != "own" && label_by != "source") {
    fail(file, fmt::format("field \"label_by\" is \"{}\", expected \"own\" or \"source\"", label_by));
  }
  m.label_by = parse_label_by(label_by);
  m.labels = f.strings("labels");
  m.vocab_size = f.positive_int("vocab_size");
  m.tokenizer_hash = parse_hex64(f.string("tokenizer_hash"), kModule, fmt::format("{}: tokenizer_hash", file.string()));
  m.seed = f.u64("seed");
  m.val_fraction = f.number("val_fraction");
  m.train_documents = f.u64("train_documents");
  m.val_documents = f.u64("val_documents");
  m.train_tokens = f.u64("train_tokens");
  m.val_tokens = f.u64("val_tokens");
  m.val_unigram_entropy = f.number("val_unigram_entropy");
  m.train_shards = f.strings("train_shards");
  m.val_shards = f.strings("val_shards");

  if (m.labels.empty()) fail(file, "field \"labels\" is empty (documents without a label use \"\")");
  if (!(m.val_fraction > 0 && m.val_fraction < 1)) {
    fail(file, fmt::format("val_fraction {} is not in (0, 1)", m.val_fraction));
  }
  if (m.train_documents == 0 || m.val_documents == 0) fail(file, "a split has no documents");
  if (m.train_shards.empty() || m.val_shards.empty()) fail(file, "a split has no shard files");
  for (const auto* shards : {&m.train_shards, &m.val_shards}) {
    for (const auto& name : *shards) {
      if (!is_plain_file_name(name)) fail(file, fmt::format("shard name \"{}\" is not a plain file name", name));
    }
  }

  Fields tok = f.object("tokenizer");
  m.tokenizer_type = tok.string("type");
  auto kind = kTokenizerFiles.find(m.tokenizer_type);
  if (kind == kTokenizerFiles.end()) {
    fail(file, fmt::format("tokenizer type \"{}\" is not supported (expected sentencepiece-bpe or byte-level-bpe)",
                           m.tokenizer_type));
  }
  if (tok.string("file") != kind->second) fail(file, fmt::format("tokenizer file must be \"{}\"", kind->second));
  m.tokenizer_file = kind->second;
  if (tok.positive_int("vocab_size") != m.vocab_size) fail(file, "tokenizer.vocab_size differs from vocab_size");
  if (parse_hex64(tok.string("hash"), kModule, fmt::format("{}: tokenizer.hash", file.string())) != m.tokenizer_hash) {
    fail(file, "tokenizer.hash differs from tokenizer_hash");
  }

  Fields per_label = f.object("label_documents");
  parsed.train_label_documents = per_label.u64s("train");
  parsed.val_label_documents = per_label.u64s("val");
  for (const auto& [counts, total, split] : {std::tuple{&parsed.train_label_documents, m.train_documents, "train"},
                                             std::tuple{&parsed.val_label_documents, m.val_documents, "val"}}) {
    if (counts->size() != m.labels.size()) {
      fail(file,
           fmt::format("label_documents.{} has {} entries for {} labels", split, counts->size(), m.labels.size()));
    }
    uint64_t sum = 0;
    for (uint64_t c : *counts) sum += c;
    if (sum != total) fail(file, fmt::format("label_documents.{} adds up to {}, not {} documents", split, sum, total));
  }
  return parsed;
}

std::string manifest_json(const Manifest& m, const std::vector<uint64_t>& train_label_documents,
                          const std::vector<uint64_t>& val_label_documents) {
  json root;
  root["format_version"] = m.format_version;
  root["corpus"] = m.corpus;
  root["label_by"] = label_by_name(m.label_by);
  root["labels"] = m.labels;
  root["label_documents"] = {{"train", train_label_documents}, {"val", val_label_documents}};
  root["vocab_size"] = m.vocab_size;
  root["tokenizer_hash"] = hex64(m.tokenizer_hash);
  root["tokenizer"] = {{"type", m.tokenizer_type},
                       {"vocab_size", m.vocab_size},
                       {"hash", hex64(m.tokenizer_hash)},
                       {"file", m.tokenizer_file}};
  root["seed"] = m.seed;
  root["val_fraction"] = m.val_fraction;
  root["train_documents"] = m.train_documents;
  root["val_documents"] = m.val_documents;
  root["train_tokens"] = m.train_tokens;
  root["val_tokens"] = m.val_tokens;
  root["val_unigram_entropy"] = m.val_unigram_entropy;
  root["train_shards"] = m.train_shards;
  root["val_shards"] = m.val_shards;
  root["document_index"] = {{"train", docs_file_name("train")}, {"val", docs_file_name("val")}};
  return root.dump(2) + "\n";
}

// ---- opening a split ----------------------------------------------------------------------------

Split load_split(const fs::path& dir, const ParsedManifest& parsed, std::string_view name, int eos_id) {
  const Manifest& m = parsed.manifest;
  const bool train = name == "train";
  const auto& shards = train ? m.train_shards : m.val_shards;
  const uint64_t expected_tokens = train ? m.train_tokens : m.val_tokens;
  const uint64_t expected_documents = train ? m.train_documents : m.val_documents;
  const auto& label_documents = train ? parsed.train_label_documents : parsed.val_label_documents;

  Split split;
  split.tokens.reserve(expected_tokens);
  for (const auto& shard : shards) {
    const fs::path path = dir / shard;
    ShardInfo info;
    std::vector<int32_t> tokens = read_shard(path, &info);
    if (info.tokenizer_hash != m.tokenizer_hash || info.vocab_size != static_cast<uint32_t>(m.vocab_size)) {
      fail(path, fmt::format("written with tokenizer {} (vocab {}), but the dataset's tokenizer is {} (vocab {}): "
                             "a dataset whose tokenizer does not match its shards. hint: re-run loco prepare",
                             hex64(info.tokenizer_hash), info.vocab_size, hex64(m.tokenizer_hash), m.vocab_size));
    }
    split.tokens.insert(split.tokens.end(), tokens.begin(), tokens.end());
  }
  if (split.tokens.size() != expected_tokens) {
    fail(dir / kManifestFile,
         fmt::format("the {} shards hold {} tokens, the manifest says {}", name, split.tokens.size(), expected_tokens));
  }

  const fs::path docs_file = dir / docs_file_name(name);
  split.documents = read_docs(docs_file);
  if (split.documents.size() != expected_documents) {
    fail(docs_file, fmt::format("{} documents, the manifest says {}", split.documents.size(), expected_documents));
  }
  std::vector<uint64_t> per_label(m.labels.size(), 0);
  uint64_t next = 0;
  for (size_t i = 0; i < split.documents.size(); ++i) {
    const DocumentEntry& d = split.documents[i];
    if (d.offset != next) {
      fail(docs_file, fmt::format("document {} starts at token {}, expected {} (documents must be contiguous)", i,
                                  d.offset, next));
    }
    if (d.length == 0 || d.length > split.tokens.size() - d.offset) {
      fail(docs_file, fmt::format("document {} (tokens {}..{}) lies outside the split's {} tokens", i, d.offset,
                                  d.offset + d.length, split.tokens.size()));
    }
    if (split.tokens[d.offset + d.length - 1] != eos_id) {
      fail(docs_file, fmt::format("document {} does not end with the eos token", i));
    }
    if (d.label >= m.labels.size()) {
      fail(docs_file, fmt::format("document {} has label {} of {}", i, d.label, m.labels.size()));
    }
    ++per_label[d.label];
    next = d.offset + d.length;
  }
  if (next != split.tokens.size()) {
    fail(docs_file, fmt::format("the documents cover {} of the split's {} tokens", next, split.tokens.size()));
  }
  if (per_label != label_documents) {
    fail(docs_file, "documents per label differ from the manifest's label_documents");
  }
  return split;
}

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
  for (const auto& e : encoded) total += e.size() + 1;
  split.tokens.reserve(total);
  for (size_t i = 0; i < docs.size(); ++i) {
    const uint64_t length = encoded[i].size() + 1;  // + eos
    if (length > UINT32_MAX) {
      throw DataError(kModule, fmt::format("document {} has {} tokens, more than the index can hold ({})",
                                           docs[i]->name, length, UINT32_MAX));
    }
    split.documents.push_back(
        DocumentEntry{split.tokens.size(), static_cast<uint32_t>(length), label_index.at(docs[i]->label)});
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
    options.progress(fmt::format("training tokenizer (vocab {}) on {} documents", options.vocab_size, train_docs.size()));
  }
  std::vector<std::string_view> train_texts;
  for (const Document* d : train_docs) train_texts.push_back(d->text);
  TokenizerTrainOptions tokenizer_options;
  tokenizer_options.vocab_size = options.vocab_size;
  tokenizer_options.seed = options.seed;
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
  if (!options.tokenizer.empty()) progress(fmt::format("tokenizer: {} (vocab {})", options.tokenizer.string(), tokenizer.vocab_size()));

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

Manifest read_manifest(const fs::path& dir) { return parse_manifest(dir).manifest; }
Manifest decode_manifest(const std::string& text, const fs::path& file) { return parse_manifest_text(text, file).manifest; }

Dataset::Dataset(fs::path dir, Manifest manifest, Tokenizer tokenizer, Split train, Split val)
    : dir_(std::move(dir)),
      manifest_(std::move(manifest)),
      tokenizer_(std::move(tokenizer)),
      train_(std::move(train)),
      val_(std::move(val)) {}

namespace {

Tokenizer checked_tokenizer(const fs::path& dir, const Manifest& m) {
  const fs::path tokenizer_file = dir / m.tokenizer_file;
  Tokenizer tokenizer = Tokenizer::load(tokenizer_file);
  if (tokenizer.hash() != m.tokenizer_hash) {
    fail(tokenizer_file, fmt::format("tokenizer hash {} differs from the manifest's tokenizer_hash {}: a dataset whose "
                                     "tokenizer does not match. hint: restore the tokenizer it was prepared "
                                     "with, or re-run loco prepare",
                                     hex64(tokenizer.hash()), hex64(m.tokenizer_hash)));
  }
  if (tokenizer.vocab_size() > m.vocab_size) {
    fail(tokenizer_file,
         fmt::format("vocabulary of {} pieces, the manifest says {}", tokenizer.vocab_size(), m.vocab_size));
  }
  return tokenizer;
}

}  // namespace

Tokenizer Dataset::open_tokenizer(const fs::path& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) throw DataError(kModule, fmt::format("{}: no such dataset folder", dir.string()));
  return checked_tokenizer(dir, parse_manifest(dir).manifest);
}

Dataset Dataset::open(const fs::path& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) throw DataError(kModule, fmt::format("{}: no such dataset folder", dir.string()));
  ParsedManifest parsed = parse_manifest(dir);
  const Manifest& m = parsed.manifest;

  Tokenizer tokenizer = checked_tokenizer(dir, m);
  Split train = load_split(dir, parsed, "train", tokenizer.eos_id());
  Split val = load_split(dir, parsed, "val", tokenizer.eos_id());
  return Dataset(dir, std::move(parsed.manifest), std::move(tokenizer), std::move(train), std::move(val));
}

}  // namespace loco::data
