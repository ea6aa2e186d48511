#include "loco/data/tokenizer.h"

#include <dlfcn.h>
#include <gtest/gtest.h>

#include <algorithm>

#include "data/data_test_util.h"
#include "loco/core/error.h"
#include "loco/core/hash.h"

namespace loco::data {
namespace {

using testing::TempDir;
using testing::TextGenerator;
using testing::throws_with;

constexpr int kVocab = 320;  // 3 special + 256 byte-fallback pieces + characters + ~40 merges

std::vector<std::string> generate_paragraphs(uint64_t seed, size_t count) {
  TextGenerator gen(seed);
  std::vector<std::string> out;
  for (size_t i = 0; i < count; ++i) out.push_back(gen.paragraph(3));
  return out;
}

std::vector<std::string_view> views(const std::vector<std::string>& texts) {
  return std::vector<std::string_view>(texts.begin(), texts.end());
}

Tokenizer train_small(uint64_t seed = 7, size_t max_sentences = 2'000'000) {
  static const std::vector<std::string> texts = generate_paragraphs(1, 200);
  TokenizerTrainOptions options;
  options.vocab_size = kVocab;
  options.seed = seed;
  options.max_sentences = max_sentences;
  return Tokenizer::train(views(texts), options);
}

TEST(Tokenizer, TrainsExactlyTheRequestedVocabulary) {
  Tokenizer tok = train_small();
  EXPECT_EQ(tok.vocab_size(), kVocab);
  EXPECT_EQ(tok.bos_id(), 1);
  EXPECT_EQ(tok.eos_id(), 2);
  EXPECT_EQ(tok.hash(), hash64(tok.serialized()));
}

TEST(Tokenizer, EncodeDecodeRoundTrip) {
  Tokenizer tok = train_small();
  // Held-out text from another seed of the same word sampler.
  TextGenerator gen(99);
  for (int i = 0; i < 20; ++i) {
    std::string text = gen.paragraph(2);
    std::vector<int32_t> ids = tok.encode(text);
    ASSERT_FALSE(ids.empty());
    for (int32_t id : ids) {
      ASSERT_GE(id, 3) << "special ids never come out of encode: " << text;
      ASSERT_LT(id, kVocab);
    }
    EXPECT_EQ(tok.decode(ids), text);
    // BPE merges: fewer tokens than bytes.
    EXPECT_LT(ids.size(), text.size());
  }
  EXPECT_TRUE(tok.encode("").empty());
}

TEST(Tokenizer, UnseenCharactersFallBackToBytesNotUnk) {
  Tokenizer tok = train_small();
  const std::string text = "kalo Zebra caf\xC3\xA9 \xE6\x97\xA5\xE6\x9C\xAC \xF0\x9F\x98\x80 #42!";
  std::vector<int32_t> ids = tok.encode(text);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 0), 0) << "no <unk>";
  EXPECT_EQ(tok.decode(ids), text);
  EXPECT_THROW(tok.decode({kVocab}), Error);
  EXPECT_THROW(tok.decode({-1}), Error);
}

TEST(Tokenizer, TrainingIsDeterministic) {
  EXPECT_EQ(train_small(7).hash(), train_small(7).hash());
  // Sampling 50 of the 200 lines: the seed picks the lines, and the same seed the same lines.
  const uint64_t a = train_small(1, 50).hash();
  EXPECT_EQ(a, train_small(1, 50).hash());
  EXPECT_NE(a, train_small(2, 50).hash());
  EXPECT_NE(a, train_small(7).hash());
}

TEST(Tokenizer, SaveLoadKeepsTheHash) {
  TempDir tmp;
  Tokenizer tok = train_small();
  tok.save(tmp / "sub" / "tokenizer.model");
  Tokenizer loaded = Tokenizer::load(tmp / "sub" / "tokenizer.model");
  EXPECT_EQ(loaded.hash(), tok.hash());
  EXPECT_EQ(loaded.serialized(), tok.serialized());
  EXPECT_EQ(loaded.vocab_size(), kVocab);
  const std::string text = "kalo mine rusa tevo.";
  EXPECT_EQ(loaded.encode(text), tok.encode(text));

  Tokenizer moved = std::move(loaded);
  EXPECT_EQ(moved.hash(), tok.hash());
  EXPECT_EQ(moved.encode(text), tok.encode(text));
}

TEST(Tokenizer, LoadRejectsWhatIsNotAModel) {
  TempDir tmp;
  testing::write_text(tmp / "junk.model", "this is not a protobuf \xFF\xFF\xFF");
  EXPECT_TRUE(throws_with<DataError>([&] { Tokenizer::load(tmp / "junk.model"); },
                                     {"junk.model", "not a SentencePiece model"}));
  EXPECT_TRUE(throws_with<DataError>([&] { Tokenizer::load(tmp / "absent.model"); }, {"absent.model", "no such file"}));
}

TEST(Tokenizer, TrainingErrors) {
  const std::vector<std::string> tiny = {"ab ab ab", "ba ba"};
  TokenizerTrainOptions options;
  options.vocab_size = 4096;  // far more pieces than two words allow
  EXPECT_TRUE(throws_with<Error>([&] { Tokenizer::train(views(tiny), options); }, {"[data]", "vocab 4096", "hint"}));
  options.vocab_size = 100;  // smaller than 3 special + 256 byte pieces
  EXPECT_TRUE(throws_with<Error>([&] { Tokenizer::train(views(tiny), options); }, {"vocab 100"}));
  options.vocab_size = kVocab;
  const std::vector<std::string> blank = {"", "  \n\n \t"};
  EXPECT_TRUE(throws_with<DataError>([&] { Tokenizer::train(views(blank), options); }, {"training text is empty"}));
}

// 400 distinct CJK characters, each once, among 200 paragraphs of ASCII: every character a piece
// needs more than 320 entries; kept to the most frequent 98% of the text, the rare ones are bytes.
TEST(Tokenizer, ACharacterCoverageBelowOneWritesTheRareCharactersAsBytes) {
  std::vector<std::string> texts = generate_paragraphs(1, 200);
  std::string rare;
  for (char32_t c = 0x4E00; c < 0x4E00 + 400; ++c) {
    rare += static_cast<char>(0xE0 | (c >> 12));
    rare += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    rare += static_cast<char>(0x80 | (c & 0x3F));
  }
  texts.push_back(rare);
  TokenizerTrainOptions options;
  options.vocab_size = kVocab;
  EXPECT_TRUE(throws_with<Error>([&] { Tokenizer::train(views(texts), options); }, {"character coverage 1", "below 1"}));

  options.character_coverage = 0.98;
  const Tokenizer tok = Tokenizer::train(views(texts), options);
  EXPECT_EQ(tok.vocab_size(), kVocab);
  const auto ids = tok.encode(rare);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 0), 0) << "no <unk>";
  EXPECT_GE(ids.size(), 3u * 400) << "each rare character is its three bytes";
  EXPECT_EQ(tok.decode(ids), rare);
  const std::string common = "kalo mine rusa tevo.";
  EXPECT_LT(tok.encode(common).size(), common.size()) << "the frequent characters are merged as before";

  for (double bad : {0.0, -0.5, 1.5}) {
    options.character_coverage = bad;
    EXPECT_TRUE(throws_with<ConfigError>([&] { Tokenizer::train(views(texts), options); }, {"character_coverage", "(0, 1]"}));
  }
}

TEST(Tokenizer, VeryLongLinesStillTrain) {
  // One 60 KB line without newlines: cut into pieces instead of silently dropped by SentencePiece.
  TextGenerator gen(5);
  std::string line;
  while (line.size() < 60'000) line += gen.sentence() + " ";
  TokenizerTrainOptions options;
  options.vocab_size = kVocab;
  Tokenizer tok = Tokenizer::train({line}, options);
  EXPECT_EQ(tok.vocab_size(), kVocab);
  EXPECT_LT(tok.encode(line).size(), line.size() / 2);
}

TEST(Tokenizer, SentencePieceStaysOutOfTheGlobalSymbolNamespace) {
  // This binary links libtorch (and so the system libprotobuf). SentencePiece's bundled protobuf
  // must stay inside the loco_spm plugin: linking SentencePiece directly would crash at startup.
  Tokenizer tok = train_small();
  EXPECT_EQ(tok.vocab_size(), kVocab);
  EXPECT_EQ(::dlsym(RTLD_DEFAULT, "_ZN13sentencepiece22SentencePieceProcessorC1Ev"), nullptr);
  EXPECT_EQ(::dlsym(RTLD_DEFAULT, "loco_spm_encode"), nullptr);
}

}  // namespace
}  // namespace loco::data
