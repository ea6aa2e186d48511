#include "loco/data/dataset.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "data/data_test_util.h"
#include "loco/core/error.h"
#include "loco/core/hash.h"
#include "loco/data/shard.h"
#include "loco/data/tokenizer.h"

namespace loco::data {
namespace {

using testing::read_text;
using testing::TempDir;
using testing::TextGenerator;
using testing::throws_with;
using testing::write_text;

constexpr int kDatasetVocab = 320;
const std::vector<std::string> kLabels = {"fiction", "news", "science"};

// 40 documents with labels, as JSONL; returns the texts in file order.
std::vector<std::string> write_jsonl_corpus(const fs::path& file, size_t documents = 40) {
  TextGenerator gen(2024);
  std::vector<std::string> texts;
  std::string jsonl;
  for (size_t i = 0; i < documents; ++i) {
    texts.push_back(gen.paragraph(2 + i % 4));
    nlohmann::json line = {{"text", texts.back()}, {"label", kLabels[i % kLabels.size()]}};
    jsonl += line.dump() + "\n";
  }
  write_text(file, jsonl);
  return texts;
}

PrepareOptions options_for(const fs::path& corpus, const fs::path& out, uint64_t seed = 1234) {
  PrepareOptions o;
  o.corpus = corpus.string();
  o.out = out;
  o.cache_dir = out.parent_path() / "cache";
  o.vocab_size = kDatasetVocab;
  o.val_fraction = 0.25;
  o.seed = seed;
  o.shard_tokens = 1000;  // several shards per split
  return o;
}

std::multiset<std::string> decoded_documents(const Dataset& ds, const Split& split) {
  std::multiset<std::string> out;
  for (const auto& d : split.documents) {
    // Drop the eos that ends every document.
    std::vector<int32_t> ids(split.tokens.begin() + static_cast<ptrdiff_t>(d.offset),
                             split.tokens.begin() + static_cast<ptrdiff_t>(d.offset + d.length - 1));
    out.insert(ds.tokenizer().decode(ids));
  }
  return out;
}

TEST(UnigramEntropy, ClosedForms) {
  EXPECT_DOUBLE_EQ(unigram_entropy({0, 1, 2, 3}, 8), std::log(4.0));
  EXPECT_DOUBLE_EQ(unigram_entropy({5, 5, 5}, 8), 0.0);
  EXPECT_DOUBLE_EQ(unigram_entropy({0, 0, 1, 1}, 2), std::log(2.0));
  // p = (1/2, 1/4, 1/4): H = 1.5 ln 2
  EXPECT_NEAR(unigram_entropy({7, 7, 1, 2}, 8), 1.5 * std::log(2.0), 1e-15);
  EXPECT_EQ(unigram_entropy({}, 8), 0.0);
  EXPECT_THROW(unigram_entropy({8}, 8), InternalError);
}

class PreparedDataset : public ::testing::Test {
 protected:
  void SetUp() override {
    texts_ = write_jsonl_corpus(tmp_ / "corpus.jsonl");
    PrepareOptions o = options_for(tmp_ / "corpus.jsonl", out_);
    o.progress = [this](const std::string& line) { progress_.push_back(line); };
    manifest_ = prepare_dataset(o);
  }
  TempDir tmp_;
  fs::path out_ = tmp_ / "ds";
  std::vector<std::string> texts_;
  std::vector<std::string> progress_;
  Manifest manifest_;
};

TEST_F(PreparedDataset, ManifestDescribesTheFolder) {
  const Manifest& m = manifest_;
  EXPECT_EQ(m.format_version, 1);
  EXPECT_EQ(m.corpus, (tmp_ / "corpus.jsonl").string());
  EXPECT_EQ(m.label_by, LabelBy::kOwn);
  EXPECT_EQ(m.labels, kLabels);
  EXPECT_EQ(m.vocab_size, kDatasetVocab);
  EXPECT_EQ(m.seed, 1234u);
  EXPECT_EQ(m.val_fraction, 0.25);
  EXPECT_EQ(m.train_documents, 30u);
  EXPECT_EQ(m.val_documents, 10u);
  EXPECT_GT(m.train_tokens, m.val_tokens);
  EXPECT_GT(m.train_shards.size(), 1u);
  EXPECT_EQ(m.train_shards.front(), "train-00000.tok");
  EXPECT_EQ(m.val_shards.front(), "val-00000.tok");
  EXPECT_EQ(m.train_shards.size(), (m.train_tokens + 999) / 1000);
  EXPECT_EQ(m.val_shards.size(), (m.val_tokens + 999) / 1000);
  for (const auto& f : m.train_shards) EXPECT_TRUE(fs::exists(out_ / f)) << f;
  EXPECT_TRUE(fs::exists(out_ / "tokenizer.model"));
  EXPECT_TRUE(fs::exists(out_ / "train.docs"));
  EXPECT_TRUE(fs::exists(out_ / "val.docs"));
  EXPECT_EQ(m.tokenizer_hash, hash64(read_text(out_ / "tokenizer.model")));

  // read_manifest gives back what prepare_dataset returned.
  Manifest r = read_manifest(out_);
  EXPECT_EQ(r.corpus, m.corpus);
  EXPECT_EQ(r.label_by, m.label_by);
  EXPECT_EQ(r.labels, m.labels);
  EXPECT_EQ(r.tokenizer_hash, m.tokenizer_hash);
  EXPECT_EQ(r.train_tokens, m.train_tokens);
  EXPECT_EQ(r.val_tokens, m.val_tokens);
  EXPECT_EQ(r.train_shards, m.train_shards);
  EXPECT_EQ(r.val_shards, m.val_shards);
  EXPECT_EQ(r.val_unigram_entropy, m.val_unigram_entropy);  // exact through JSON

  // The JSON also describes the tokenizer and counts documents per label.
  auto j = nlohmann::json::parse(read_text(out_ / "manifest.json"));
  EXPECT_EQ(j["tokenizer"]["type"], "sentencepiece-bpe");
  EXPECT_EQ(j["tokenizer"]["vocab_size"], kDatasetVocab);
  EXPECT_EQ(j["tokenizer"]["file"], "tokenizer.model");
  EXPECT_EQ(j["tokenizer"]["hash"], hex64(m.tokenizer_hash));
  EXPECT_EQ(j["tokenizer_hash"], hex64(m.tokenizer_hash));
  EXPECT_EQ(j["label_by"], "own");
  uint64_t train_sum = 0, val_sum = 0;
  for (auto c : j["label_documents"]["train"]) train_sum += c.get<uint64_t>();
  for (auto c : j["label_documents"]["val"]) val_sum += c.get<uint64_t>();
  EXPECT_EQ(train_sum, 30u);
  EXPECT_EQ(val_sum, 10u);
}

TEST_F(PreparedDataset, ReportsProgress) {
  ASSERT_GE(progress_.size(), 4u);
  EXPECT_NE(progress_[0].find("read 40 documents (3 labels)"), std::string::npos) << progress_[0];
  bool training = false, tokenized = false;
  for (const auto& line : progress_) {
    training |= line.find("training tokenizer (vocab 320) on 30 documents") != std::string::npos;
    tokenized |= line.find(fmt::format("tokenized: train {} tokens, val {} tokens", manifest_.train_tokens,
                                       manifest_.val_tokens)) != std::string::npos;
  }
  EXPECT_TRUE(training);
  EXPECT_TRUE(tokenized);
}

TEST_F(PreparedDataset, OpensAndHoldsEveryDocumentOnce) {
  Dataset ds = Dataset::open(out_);
  EXPECT_EQ(ds.manifest().tokenizer_hash, manifest_.tokenizer_hash);
  EXPECT_EQ(ds.tokenizer().hash(), manifest_.tokenizer_hash);
  ASSERT_EQ(ds.train().tokens.size(), manifest_.train_tokens);
  ASSERT_EQ(ds.val().tokens.size(), manifest_.val_tokens);
  ASSERT_EQ(ds.train().documents.size(), 30u);
  ASSERT_EQ(ds.val().documents.size(), 10u);

  // Contiguous documents, each ending with eos; labels as in the corpus.
  std::map<std::string, std::string> label_of;
  for (size_t i = 0; i < texts_.size(); ++i) label_of[texts_[i]] = kLabels[i % kLabels.size()];
  for (const Split* split : {&ds.train(), &ds.val()}) {
    uint64_t next = 0;
    for (const auto& d : split->documents) {
      EXPECT_EQ(d.offset, next);
      EXPECT_EQ(split->tokens[d.offset + d.length - 1], 2);
      std::vector<int32_t> ids(split->tokens.begin() + static_cast<ptrdiff_t>(d.offset),
                               split->tokens.begin() + static_cast<ptrdiff_t>(d.offset + d.length - 1));
      EXPECT_EQ(std::count(ids.begin(), ids.end(), 2), 0) << "eos only at the end of a document";
      EXPECT_EQ(ds.manifest().labels.at(d.label), label_of.at(ds.tokenizer().decode(ids)));
      next = d.offset + d.length;
    }
    EXPECT_EQ(next, split->tokens.size());
  }

  // Train and val together are exactly the corpus: nothing lost, nothing in both.
  std::multiset<std::string> all = decoded_documents(ds, ds.train());
  std::multiset<std::string> val = decoded_documents(ds, ds.val());
  all.insert(val.begin(), val.end());
  EXPECT_EQ(all, std::multiset<std::string>(texts_.begin(), texts_.end()));
}

TEST_F(PreparedDataset, ValUnigramEntropyMatchesARecomputation) {
  Dataset ds = Dataset::open(out_);
  std::map<int32_t, double> counts;
  for (int32_t t : ds.val().tokens) counts[t] += 1;
  double h = 0;
  const double n = static_cast<double>(ds.val().tokens.size());
  for (const auto& [t, c] : counts) h -= c / n * std::log(c / n);
  EXPECT_NEAR(manifest_.val_unigram_entropy, h, 1e-12);
  EXPECT_GT(h, 1.0);
  EXPECT_LT(h, std::log(static_cast<double>(kDatasetVocab)));
}

TEST_F(PreparedDataset, SameSeedGivesIdenticalFilesAndAnotherSeedAnotherSplit) {
  prepare_dataset(options_for(tmp_ / "corpus.jsonl", tmp_ / "again"));
  std::set<std::string> files;
  for (const auto& e : fs::directory_iterator(out_)) files.insert(e.path().filename().string());
  std::set<std::string> files_again;
  for (const auto& e : fs::directory_iterator(tmp_ / "again")) files_again.insert(e.path().filename().string());
  EXPECT_EQ(files, files_again);
  for (const auto& f : files) EXPECT_EQ(read_text(out_ / f), read_text(tmp_ / "again" / f)) << f;

  prepare_dataset(options_for(tmp_ / "corpus.jsonl", tmp_ / "other", 99));
  Dataset a = Dataset::open(out_), b = Dataset::open(tmp_ / "other");
  EXPECT_NE(decoded_documents(a, a.val()), decoded_documents(b, b.val()));
  EXPECT_EQ(b.manifest().val_documents, 10u);
}

// Copies the prepared folder, lets `damage` break it, and expects Dataset::open to fail naming
// `file` and saying `problem`.
void expect_open_fails(const fs::path& prepared, const fs::path& scratch,
                       const std::function<void(const fs::path&)>& damage, const std::string& file,
                       const std::string& problem) {
  fs::remove_all(scratch);
  fs::copy(prepared, scratch, fs::copy_options::recursive);
  ASSERT_NO_THROW(Dataset::open(scratch));
  damage(scratch);
  EXPECT_TRUE(throws_with<DataError>([&] { Dataset::open(scratch); }, {(scratch / file).string(), problem}));
}

TEST_F(PreparedDataset, OpenFailsClearlyOnDamage) {
  const fs::path copy = tmp_ / "copy";
  expect_open_fails(
      out_, copy, [](const fs::path& d) { fs::remove(d / "manifest.json"); }, "manifest.json",
      "hint: run loco prepare");
  expect_open_fails(
      out_, copy,
      [](const fs::path& d) {
        std::string bytes = read_text(d / "train-00001.tok");
        write_text(d / "train-00001.tok", bytes.substr(0, bytes.size() - 10));
      },
      "train-00001.tok", "truncated");
  expect_open_fails(
      out_, copy,
      [](const fs::path& d) {
        std::string bytes = read_text(d / "val-00000.tok");
        bytes[kShardHeaderBytes + 5] ^= 0x40;
        write_text(d / "val-00000.tok", bytes);
      },
      "val-00000.tok", "checksum mismatch");
  expect_open_fails(
      out_, copy, [](const fs::path& d) { fs::remove(d / "val-00000.tok"); }, "val-00000.tok", "no such file");
  expect_open_fails(
      out_, copy,
      [](const fs::path& d) {
        std::string bytes = read_text(d / "train.docs");
        bytes[40] ^= 0x01;
        write_text(d / "train.docs", bytes);
      },
      "train.docs", "checksum mismatch");
  expect_open_fails(
      out_, copy,
      [](const fs::path& d) {
        std::string bytes = read_text(d / "val.docs");
        write_text(d / "val.docs", bytes.substr(0, bytes.size() - 16));
      },
      "val.docs", "truncated");
  expect_open_fails(
      out_, copy,
      [](const fs::path& d) {
        std::string text = read_text(d / "manifest.json");
        auto j = nlohmann::ordered_json::parse(text);
        j["train_tokens"] = j["train_tokens"].get<uint64_t>() + 1;
        write_text(d / "manifest.json", j.dump(2));
      },
      "manifest.json", "the train shards hold");
  expect_open_fails(
      out_, copy,
      [](const fs::path& d) {
        auto j = nlohmann::ordered_json::parse(read_text(d / "manifest.json"));
        j["vocab_size"] = "320";
        write_text(d / "manifest.json", j.dump(2));
      },
      "manifest.json", "field \"vocab_size\" must be a positive integer");
  expect_open_fails(
      out_, copy, [](const fs::path& d) { write_text(d / "manifest.json", "{\"format_version\": 1,"); },
      "manifest.json", "malformed JSON");
}

TEST_F(PreparedDataset, OpenRejectsAnotherTokenizer) {
  // A tokenizer trained with another seed's split: a valid model, but not this dataset's.
  prepare_dataset(options_for(tmp_ / "corpus.jsonl", tmp_ / "other", 99));
  ASSERT_NE(read_manifest(tmp_ / "other").tokenizer_hash, manifest_.tokenizer_hash);
  expect_open_fails(
      out_, tmp_ / "copy",
      [&](const fs::path& d) {
        fs::copy_file(tmp_ / "other" / "tokenizer.model", d / "tokenizer.model", fs::copy_options::overwrite_existing);
      },
      "tokenizer.model", "tokenizer does not match");

  // Shards written with another tokenizer: named by file, even when tokenizer.model and manifest agree.
  expect_open_fails(
      out_, tmp_ / "copy",
      [&](const fs::path& d) {
        std::vector<int32_t> tokens = read_shard(d / "val-00000.tok");
        write_shard(d / "val-00000.tok", tokens, kDatasetVocab, manifest_.tokenizer_hash ^ 1);
      },
      "val-00000.tok", "tokenizer does not match");
}

TEST_F(PreparedDataset, RefusesANonEmptyOutputFolderUnlessOverwrite) {
  PrepareOptions o = options_for(tmp_ / "corpus.jsonl", out_);
  EXPECT_TRUE(throws_with<Error>([&] { prepare_dataset(o); }, {out_.string(), "not empty", "--overwrite"}));

  // Overwrite with larger shards: the stale numbered shards go, unrelated files stay.
  write_text(out_ / "notes.md", "mine");
  o.overwrite = true;
  o.shard_tokens = 1ull << 20;
  Manifest m = prepare_dataset(o);
  EXPECT_EQ(m.train_shards, std::vector<std::string>{"train-00000.tok"});
  EXPECT_FALSE(fs::exists(out_ / "train-00001.tok"));
  EXPECT_EQ(read_text(out_ / "notes.md"), "mine");
  EXPECT_EQ(Dataset::open(out_).train().tokens.size(), m.train_tokens);
  EXPECT_EQ(m.train_tokens, manifest_.train_tokens);  // same seed, same split, same tokens

  write_text(tmp_ / "a-file", "x");
  EXPECT_TRUE(throws_with<Error>([&] { prepare_dataset(options_for(tmp_ / "corpus.jsonl", tmp_ / "a-file")); },
                                 {"a-file", "not a folder"}));
}

TEST(PrepareDataset, TextFolderCorpusDropsEmptyDocuments) {
  TempDir tmp;
  TextGenerator gen(3);
  for (int i = 0; i < 12; ++i) write_text(tmp / "docs" / fmt::format("{:02d}.txt", i), gen.paragraph(4));
  write_text(tmp / "docs" / "99-empty.txt", " \n\n");
  std::vector<std::string> lines;
  PrepareOptions o = options_for(tmp / "docs", tmp / "ds");
  o.val_fraction = 0.01;  // rounds to 0 documents, but validation always gets one
  o.progress = [&](const std::string& l) { lines.push_back(l); };
  Manifest m = prepare_dataset(o);
  EXPECT_EQ(m.labels, std::vector<std::string>{""});
  EXPECT_EQ(m.val_documents, 1u);
  EXPECT_EQ(m.train_documents, 11u);
  EXPECT_NE(lines.at(0).find("read 13 documents (1 labels)"), std::string::npos) << lines.at(0);
  EXPECT_NE(lines.at(0).find("dropped 1 empty"), std::string::npos) << lines.at(0);
  EXPECT_NO_THROW(Dataset::open(tmp / "ds"));
}

// A corpus of more characters than the vocabulary holds prepares with a character coverage below 1,
// its rare characters written as bytes and read back whole.
TEST(PrepareDataset, ACharacterCoverageBelowOneFitsASmallVocabulary) {
  TempDir tmp;
  TextGenerator gen(3);
  std::string rare;
  for (char32_t c = 0x4E00; c < 0x4E00 + 300; ++c) {
    rare += {static_cast<char>(0xE0 | (c >> 12)), static_cast<char>(0x80 | ((c >> 6) & 0x3F)), static_cast<char>(0x80 | (c & 0x3F))};
  }
  for (int i = 0; i < 12; ++i) write_text(tmp / "docs" / fmt::format("{:02d}.txt", i), gen.paragraph(30) + (i == 0 ? rare : ""));
  PrepareOptions o = options_for(tmp / "docs", tmp / "ds");
  o.val_fraction = 0.01;
  std::vector<std::string> lines;
  o.progress = [&](const std::string& l) { lines.push_back(l); };
  EXPECT_TRUE(throws_with<Error>([&] { prepare_dataset(o); }, {"character coverage 1", "below 1"}));
  o.character_coverage = 0.98;
  o.overwrite = true;
  lines.clear();
  const Manifest m = prepare_dataset(o);
  EXPECT_EQ(m.vocab_size, kDatasetVocab);
  EXPECT_TRUE(std::any_of(lines.begin(), lines.end(), [](const auto& l) { return l.find("character coverage 0.98") != std::string::npos; }));
  const Dataset ds = Dataset::open(tmp / "ds");
  auto documents = decoded_documents(ds, ds.train());
  documents.merge(decoded_documents(ds, ds.val()));
  EXPECT_TRUE(std::any_of(documents.begin(), documents.end(), [&](const auto& d) { return d.ends_with(rare); }));
}

TEST(PrepareDataset, LabelBySourceIsRecordedInTheManifest) {
  TempDir tmp;
  write_jsonl_corpus(tmp / "corpus.jsonl", 20);
  TextGenerator gen(5);
  for (int i = 0; i < 6; ++i) write_text(tmp / "docs" / fmt::format("{:02d}.txt", i), gen.paragraph(3));
  PrepareOptions o = options_for(tmp / "corpus.jsonl", tmp / "ds");
  o.corpus = (tmp / "corpus.jsonl").string() + "+" + (tmp / "docs").string();
  o.label_by = LabelBy::kSource;
  const Manifest m = prepare_dataset(o);
  EXPECT_EQ(m.label_by, LabelBy::kSource);
  // The sources' names in place of the genres; labels are sorted.
  const std::vector<std::string> sources = {(tmp / "corpus.jsonl").string(), (tmp / "docs").string()};
  EXPECT_EQ(m.labels, sources);
  EXPECT_EQ(nlohmann::json::parse(read_text(tmp / "ds" / "manifest.json"))["label_by"], "source");
  const Dataset ds = Dataset::open(tmp / "ds");
  EXPECT_EQ(ds.manifest().label_by, LabelBy::kSource);
  std::vector<uint64_t> per_label(2, 0);
  for (const auto* split : {&ds.train(), &ds.val()}) {
    for (const auto& d : split->documents) ++per_label.at(d.label);
  }
  EXPECT_EQ(per_label, (std::vector<uint64_t>{20, 6}));

  // A manifest written before --label existed reads as "own"; another value is refused.
  auto j = nlohmann::ordered_json::parse(read_text(tmp / "ds" / "manifest.json"));
  j.erase("label_by");
  EXPECT_EQ(decode_manifest(j.dump(), "manifest.json").label_by, LabelBy::kOwn);
  j["label_by"] = "genre";
  EXPECT_TRUE(throws_with<DataError>([&] { decode_manifest(j.dump(), "manifest.json"); },
                                     {"manifest.json", "label_by", "genre"}));
}

// A model's own SentencePiece tokenizer (`loco prepare --tokenizer`): the dataset is tokenized with
// it as it is, not one trained on the corpus; a folder with only a tokenizer.json is refused.
TEST(PrepareDataset, AModelsOwnTokenizerIsUsedAsItIs) {
  TempDir tmp;
  std::vector<std::string> lines;
  for (int i = 0; i < 40; ++i) {
    lines.push_back(fmt::format(R"({{"text": "Document {} says hello to the tokenizer, and counts {} {} {}."}})", i, i, 2 * i, 3 * i));
  }
  write_text(tmp / "corpus.jsonl", fmt::format("{}\n", fmt::join(lines, "\n")));
  // The model's tokenizer: one trained elsewhere, with another vocabulary than --vocab-size's.
  std::vector<std::string_view> texts(lines.begin(), lines.end());
  TokenizerTrainOptions trained;
  trained.vocab_size = 300;
  const auto own = Tokenizer::train(texts, trained);
  fs::create_directories(tmp / "model");
  own.save(tmp / "model" / "tokenizer.model");
  auto o = options_for(tmp / "corpus.jsonl", tmp / "ds");
  o.tokenizer = tmp / "model";
  const auto m = prepare_dataset(o);
  EXPECT_EQ(m.vocab_size, 300);
  EXPECT_EQ(m.tokenizer_hash, own.hash());
  const auto dataset = Dataset::open(tmp / "ds");
  EXPECT_EQ(Tokenizer::load(tmp / "ds" / "tokenizer.model").hash(), own.hash());
  // Every document as the model's tokenizer encodes it, and its end (eos).
  uint64_t expected = 0;
  for (const auto& line : lines) expected += own.encode(nlohmann::json::parse(line)["text"].get<std::string>()).size() + 1;
  EXPECT_EQ(m.train_tokens + m.val_tokens, expected);
  for (int32_t t : dataset.train().tokens) ASSERT_LT(t, 300);

  // A byte-level BPE (tokenizer.json) with its eos named by tokenizer_config.json, and a model
  // beside it whose embedding is padded beyond the tokenizer's vocabulary (as Qwen2's is).
  const fs::path fixture = testing_util::source_dir() / "tests/data/fixtures/qwen2_tokenizer";
  fs::create_directories(tmp / "bpe");
  for (const char* name : {"tokenizer.json", "tokenizer_config.json"}) fs::copy_file(fixture / name, tmp / "bpe" / name);
  write_text(tmp / "bpe" / "config.json", R"({"vocab_size": 896})");
  o.tokenizer = tmp / "bpe";
  o.out = tmp / "ds2";
  const auto bpe_manifest = prepare_dataset(o);
  const auto bpe = Tokenizer::load(tmp / "bpe" / "tokenizer.json");
  EXPECT_EQ(bpe_manifest.vocab_size, 896) << "the model's padded vocabulary";
  EXPECT_EQ(bpe_manifest.tokenizer_type, "byte-level-bpe");
  EXPECT_TRUE(fs::exists(tmp / "ds2" / "tokenizer_config.json"));
  const auto bpe_dataset = Dataset::open(tmp / "ds2");
  EXPECT_EQ(bpe_dataset.tokenizer().hash(), bpe.hash());
  EXPECT_EQ(bpe_dataset.tokenizer().eos_id(), 856) << "<|endoftext|>, the first added token, after 856 entries";
  std::multiset<std::string> expected_texts, decoded;
  for (const auto& line : lines) expected_texts.insert(nlohmann::json::parse(line)["text"].get<std::string>());
  for (const auto* split : {&bpe_dataset.train(), &bpe_dataset.val()}) {
    for (const auto& text : decoded_documents(bpe_dataset, *split)) decoded.insert(text);
  }
  EXPECT_EQ(decoded, expected_texts) << "every document, decoded, is its text";

  fs::create_directories(tmp / "nothing");
  o.tokenizer = tmp / "nothing";
  o.out = tmp / "ds3";
  EXPECT_TRUE(throws_with<DataError>([&] { prepare_dataset(o); }, {"neither a tokenizer.model nor a tokenizer.json"}));
}

// A tokenizer that adds a beginning-of-text token to every text (a post-processor's template, as
// Llama 3's, or tokenizer_config.json's add_bos_token) gets it at the start of every document;
// add_bos_token false overrides the template; the same tokenizer without either adds none.
TEST(PrepareDataset, ABosTheModelsTokenizerAddsStartsEveryDocument) {
  TempDir tmp;
  std::vector<std::string> lines;
  for (int i = 0; i < 20; ++i) lines.push_back(fmt::format(R"({{"text": "Document {} begins somewhere."}})", i));
  write_text(tmp / "corpus.jsonl", fmt::format("{}\n", fmt::join(lines, "\n")));
  const fs::path fixture = testing_util::source_dir() / "tests/data/fixtures/qwen2_tokenizer";
  auto file = nlohmann::json::parse(read_text(fixture / "tokenizer.json"));
  const int start = 857;  // <|im_start|>, an added token of the fixture
  ASSERT_EQ(file["added_tokens"][1]["content"], "<|im_start|>");
  ASSERT_EQ(file["added_tokens"][1]["id"], start);
  // Llama 3's kind: ByteLevel, then a template that puts a special token before every text.
  file["post_processor"] = nlohmann::json::parse(R"({"type": "Sequence", "processors": [
      {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false},
      {"type": "TemplateProcessing",
       "single": [{"SpecialToken": {"id": "<|im_start|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
       "pair": [],
       "special_tokens": {"<|im_start|>": {"id": "<|im_start|>", "ids": [857], "tokens": ["<|im_start|>"]}}}]})");
  auto prepared = [&](const std::string& name, const std::string& settings) {
    fs::create_directories(tmp / name);
    write_text(tmp / name / "tokenizer.json", file.dump());
    write_text(tmp / name / "tokenizer_config.json", settings);
    auto o = options_for(tmp / "corpus.jsonl", tmp / ("ds-" + name));
    o.tokenizer = tmp / name;
    prepare_dataset(o);
    return Dataset::open(tmp / ("ds-" + name));
  };
  const auto with_template = prepared("template", R"({"eos_token": "<|endoftext|>"})");
  EXPECT_TRUE(with_template.tokenizer().bos_per_document());
  EXPECT_EQ(with_template.tokenizer().bos_id(), start) << "the template's token, where tokenizer_config.json names none";
  size_t documents = 0;
  for (const auto* split : {&with_template.train(), &with_template.val()}) {
    for (const auto& d : split->documents) {
      EXPECT_EQ(split->tokens[d.offset], start);
      EXPECT_EQ(split->tokens[d.offset + d.length - 1], 856) << "and ends with eos";
      ++documents;
    }
  }
  EXPECT_EQ(documents, lines.size());
  // A prompt starts as a document does; its text comes back without the bos.
  const auto prompt = with_template.tokenizer().encode_prompt("Document 3");
  ASSERT_FALSE(prompt.empty());
  EXPECT_EQ(prompt.front(), start);
  EXPECT_EQ(with_template.tokenizer().decode_text(prompt), "Document 3");
  const auto turned_off = prepared("off", R"({"eos_token": "<|endoftext|>", "add_bos_token": false})");
  EXPECT_FALSE(turned_off.tokenizer().bos_per_document());
  EXPECT_NE(turned_off.train().tokens[turned_off.train().documents[0].offset], start);
  file.erase("post_processor");
  const auto named = prepared("named", R"({"eos_token": "<|endoftext|>", "bos_token": "<|im_end|>", "add_bos_token": true})");
  EXPECT_TRUE(named.tokenizer().bos_per_document());
  EXPECT_EQ(named.train().tokens[named.train().documents[0].offset], 858) << "<|im_end|>, the bos tokenizer_config.json names";
  const auto plain = prepared("plain", R"({"eos_token": "<|endoftext|>"})");
  EXPECT_FALSE(plain.tokenizer().bos_per_document());
  EXPECT_EQ(plain.tokenizer().encode_prompt(""), std::vector<int32_t>{856}) << "an empty prompt starts a new document";
}

TEST(PrepareDataset, InputErrors) {
  TempDir tmp;
  write_text(tmp / "one" / "only.txt", "a single document");
  write_text(tmp / "one" / "blank.txt", "   ");
  EXPECT_TRUE(throws_with<DataError>([&] { prepare_dataset(options_for(tmp / "one", tmp / "ds")); },
                                     {"1 non-empty documents", "at least 2"}));
  EXPECT_FALSE(fs::exists(tmp / "ds" / "manifest.json"));

  PrepareOptions o = options_for(tmp / "one", tmp / "ds2");
  o.vocab_size = 100;
  EXPECT_TRUE(throws_with<ConfigError>([&] { prepare_dataset(o); }, {"vocab_size = 100"}));
  o = options_for(tmp / "one", tmp / "ds2");
  o.character_coverage = 0;
  EXPECT_TRUE(throws_with<ConfigError>([&] { prepare_dataset(o); }, {"character_coverage = 0"}));
  o = options_for(tmp / "one", tmp / "ds2");
  o.val_fraction = 1.0;
  EXPECT_TRUE(throws_with<ConfigError>([&] { prepare_dataset(o); }, {"val_fraction"}));
  o = options_for(tmp / "nope.jsonl", tmp / "ds2");
  EXPECT_TRUE(throws_with<DataError>([&] { prepare_dataset(o); }, {"nope.jsonl"}));
}

TEST(ReadManifest, MissingFolderOrManifest) {
  TempDir tmp;
  EXPECT_TRUE(throws_with<DataError>([&] { read_manifest(tmp.path()); }, {"manifest.json", "no such file"}));
  EXPECT_TRUE(throws_with<DataError>([&] { Dataset::open(tmp / "absent"); }, {"absent", "no such dataset folder"}));
}

}  // namespace
}  // namespace loco::data
