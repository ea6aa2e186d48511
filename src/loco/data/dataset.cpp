#include "loco/data/dataset.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <exception>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "loco/core/error.h"
#include "loco/core/files.h"
#include "loco/core/hash.h"
#include "loco/data/corpus.h"
#include "loco/data/dataset_files.h"
#include "loco/data/shard.h"

namespace loco::data {

static_assert(std::endian::native == std::endian::little, "loco's file formats are little-endian");

std::string files::docs_file_name(std::string_view split) { return fmt::format("{}.docs", split); }

namespace {

using json = nlohmann::ordered_json;
using namespace files;
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

}  // namespace

std::string files::manifest_json(const Manifest& m, const std::vector<uint64_t>& train_label_documents,
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

namespace {

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

}  // namespace

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
