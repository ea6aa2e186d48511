// Byte-level BPE (tokenizer.json): its merge order on hand-made vocabularies, what it refuses, and
// parity with Hugging Face's own JavaScript tokenizers (npm @huggingface/tokenizers, run by node)
// on a Qwen2-layout tokenizer (tests/data/fixtures/qwen2_tokenizer, from scripts/bpe_fixture.py)
// and on the other layouts this family uses (GPT-2's, Llama 3's, SmolLM's), over multilingual
// text, emoji, white space, digits, added tokens and real English.
#include "loco/data/byte_level_bpe.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "data/data_test_util.h"
#include "loco/core/error.h"
#include "loco/data/tokenizer.h"
#include "process_util.h"

namespace loco::data {
namespace {

using json = nlohmann::json;
using testing::read_text;
using testing::TempDir;
using testing::throws_with;
using testing::write_text;

const fs::path kFixture = testing_util::source_dir() / "tests/data/fixtures/qwen2_tokenizer";
constexpr const char* kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// A hand-made tokenizer.json over a few characters (no ByteLevel regex: one piece per text).
std::string tiny(const json& vocab, const json& merges, bool ignore_merges = false) {
  return json{{"normalizer", nullptr},
              {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}},
              {"added_tokens", json::array()},
              {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}, {"ignore_merges", ignore_merges}}}}
      .dump();
}

TEST(ByteLevelBpe, MergesTheLowestRankedPairFirstAndTheLeftmostAmongEquals) {
  const json vocab = {{"a", 0}, {"b", 1}, {"c", 2}, {"ab", 3}, {"bc", 4}, {"abc", 5}, {"aa", 6}};
  // "b c" ranks before "a b": abc becomes a|bc, then abc; the other way round it would be ab|c.
  auto bpe = ByteLevelBpe::parse(tiny(vocab, {"b c", "a b", "a bc", "a a"}), "tiny");
  EXPECT_EQ(bpe->encode("abc"), (std::vector<int32_t>{5}));
  EXPECT_EQ(bpe->encode("aaa"), (std::vector<int32_t>{6, 0})) << "the leftmost pair of equal rank first";
  EXPECT_EQ(bpe->encode("cab"), (std::vector<int32_t>{2, 3}));
  auto other = ByteLevelBpe::parse(tiny(vocab, json::array({json{"a", "b"}, json{"b", "c"}})), "tiny, new merges format");
  EXPECT_EQ(other->encode("abc"), (std::vector<int32_t>{3, 2}));
  EXPECT_EQ(other->decode({3, 2}), "abc");
  EXPECT_EQ(other->vocab_size(), 7);
  // A pair listed twice takes its last rank, as tokenizers' (and tokenizers.js') map does: "b c" wins.
  EXPECT_EQ(ByteLevelBpe::parse(tiny(vocab, {"a b", "b c", "a b"}), "twice")->encode("abc"), (std::vector<int32_t>{0, 4}));
}

TEST(ByteLevelBpe, AByteTheVocabularyLacksIsUnkAndMergesWithNothing) {
  json file = json::parse(tiny({{"a", 0}, {"b", 1}, {"c", 2}, {"ab", 3}, {"bc", 4}, {"<unk>", 5}}, {"a b"}));
  file["model"]["unk_token"] = "<unk>";
  EXPECT_EQ(ByteLevelBpe::parse(file.dump(), "unk")->encode("axb"), (std::vector<int32_t>{0, 5, 1}));
  EXPECT_EQ(ByteLevelBpe::parse(file.dump(), "unk")->encode("axxb"), (std::vector<int32_t>{0, 5, 5, 1}));
  file["model"]["fuse_unk"] = true;
  EXPECT_EQ(ByteLevelBpe::parse(file.dump(), "fused")->encode("axxb"), (std::vector<int32_t>{0, 5, 1}));
}

TEST(ByteLevelBpe, IgnoreMergesKeepsAPieceOfTheVocabularyWhole) {
  const json vocab = {{"a", 0}, {"b", 1}, {"c", 2}, {"ab", 3}, {"abc", 4}};
  EXPECT_EQ(ByteLevelBpe::parse(tiny(vocab, {"a b"}), "t")->encode("abc"), (std::vector<int32_t>{3, 2}));
  EXPECT_EQ(ByteLevelBpe::parse(tiny(vocab, {"a b"}, true), "t")->encode("abc"), (std::vector<int32_t>{4}));
}

TEST(ByteLevelBpe, RefusesWhatItDoesNotReadNamingIt) {
  json file = json::parse(read_text(kFixture / "tokenizer.json"));
  auto refused = [&](const std::function<void(json&)>& change, const std::vector<std::string>& needles) {
    json changed = file;
    change(changed);
    return throws_with<DataError>([&] { ByteLevelBpe::parse(changed.dump(), "the file"); }, needles);
  };
  EXPECT_TRUE(refused([](json& j) { j["pre_tokenizer"] = {{"type", "Metaspace"}}; }, {"the file", "Metaspace", "not supported"}));
  EXPECT_TRUE(refused([](json& j) { j["pre_tokenizer"] = nullptr; }, {"not a byte-level BPE", "tokenizer.model"}));
  EXPECT_TRUE(refused([](json& j) { j["normalizer"] = {{"type", "Lowercase"}}; }, {"Lowercase", "not supported"}));
  EXPECT_TRUE(refused([](json& j) { j["model"]["merges"].push_back("Ġ zzz"); }, {"zzz", "not in the vocabulary"}));
  EXPECT_TRUE(refused([](json& j) { j["model"]["byte_fallback"] = true; }, {"byte fallback"}));
  EXPECT_TRUE(refused([](json& j) { j["model"]["type"] = "Unigram"; }, {"Unigram", "not BPE"}));
  EXPECT_TRUE(refused([](json& j) { j["added_tokens"][0]["single_word"] = true; }, {"<|endoftext|>", "single_word"}));
  EXPECT_TRUE(refused([](json& j) { j["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "MergedWithPrevious"; },
                      {"MergedWithPrevious", "not supported"}));
  EXPECT_TRUE(refused([](json& j) { j["pre_tokenizer"]["pretokenizers"] = {j["pre_tokenizer"]["pretokenizers"][1],
                                                                            j["pre_tokenizer"]["pretokenizers"][0]}; },
                      {"after ByteLevel"}));
  EXPECT_TRUE(refused([](json& j) { j["model"]["vocab"]["huge"] = 2000000000; }, {"2000000000", "outside"}));
  EXPECT_TRUE(refused([](json& j) { j["model"]["vocab"]["half"] = 1.5; }, {"half", "not an integer"}));
  EXPECT_TRUE(refused([](json& j) { j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(unclosed"; },
                      {"does not compile", "(unclosed"}));
  EXPECT_TRUE(throws_with<DataError>([] { ByteLevelBpe::parse("{\"model\": ", "half"); }, {"half", "not a tokenizer.json"}));
  auto bpe = ByteLevelBpe::parse(file.dump(), "fixture");
  EXPECT_TRUE(throws_with<DataError>([&] { bpe->encode("bad \xff byte"); }, {"UTF-8"}));
  EXPECT_TRUE(throws_with<Error>([&] { bpe->decode({100000}); }, {"100000"}));
}

// The text the parity test encodes: many scripts, emoji (joined, flags, skin tones), white space
// of several kinds, digits, contractions, a decomposed accent (NFC composes it), added tokens.
std::string mixed_text() {
  return "Hello, world! It's 2024-06-01 at 12:30; you'LL see DON'T and we've 3.14159 or 1234567 items.\n"
         "Größe und Straße — naïve café, e\xCC\x81t\xC3\xA9 (decomposed), Ångström.\n"
         "Быстрая лиса, Ελληνικά, 敏捷的棕色狐狸跳过了懒狗。こんにちは世界！ 한국어 텍스트 مرحبا بالعالم नमस्ते\n"
         "Emoji: 😀😂 👩‍👩‍👧 👍🏽 🇩🇪🇯🇵 ❤️ 🚀x\n"
         "\ttabs\tand  two spaces,   three, trailing   \n\n\r\nCRLF\r\nnbsp\xC2\xA0here ideographic\xE3\x80\x80space "
         "line\xE2\x80\xA8separator\n"
         "<|im_start|>user\nhi there<|im_end|><|endoftext|> before   <mask> after <extra_word> end\n"
         "<mask>   <extra_word> x, x<extra_word>   <|im_end|> mongolian a \xE1\xA0\x8Ex b\n"
         "    indented code(x) { return x*2; }  // comment\n";
}

// An inverted Split, as Hugging Face's tokenizers (Rust) reads one: Removed keeps only what the
// pattern matches, each match a piece; Isolated keeps every piece, inverted or not.
TEST(ByteLevelBpe, AnInvertedSplitKeepsOnlyTheMatchesWhenRemoving) {
  const json file = json::parse(read_text(kFixture / "tokenizer.json"));
  auto with_split = [&](const std::string& behavior, bool invert, const std::string& pattern) {
    json changed = file;
    changed["pre_tokenizer"]["pretokenizers"][0] = {
        {"type", "Split"}, {"pattern", {{"Regex", pattern}}}, {"behavior", behavior}, {"invert", invert}};
    return ByteLevelBpe::parse(changed.dump(), "the file");
  };
  const auto fixture = ByteLevelBpe::parse(file.dump(), "fixture");
  const auto words = with_split("Removed", true, "\\p{L}+");
  auto expected = fixture->encode("Hello");
  for (const char* word : {"world", "again"}) {
    const auto ids = fixture->encode(word);
    expected.insert(expected.end(), ids.begin(), ids.end());
  }
  EXPECT_EQ(words->encode("Hello, world -- again!"), expected);
  const std::string pattern = file["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"];
  EXPECT_EQ(with_split("Isolated", true, pattern)->encode(mixed_text()), fixture->encode(mixed_text()));
}

struct Variant {
  std::string name;
  std::function<void(json&)> change;
};

// The layouts of the byte-level family, made from the Qwen2 fixture.
std::vector<Variant> variants() {
  const json byte_level_regex = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}};
  return {
      {"qwen2", [](json&) {}},
      {"llama3",
       [](json& j) {
         j["normalizer"] = nullptr;
         j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = kLlama3Pattern;
         j["model"]["ignore_merges"] = true;
         json merges = json::array();  // the newer format, pairs
         for (const auto& m : j["model"]["merges"]) {
           const std::string s = m.get<std::string>();
           merges.push_back({s.substr(0, s.find(' ')), s.substr(s.find(' ') + 1)});
         }
         j["model"]["merges"] = merges;
       }},
      {"gpt2",
       [=](json& j) {
         j["normalizer"] = nullptr;
         j["pre_tokenizer"] = byte_level_regex;
       }},
      {"smollm",
       [=](json& j) {
         j["normalizer"] = nullptr;
         j["pre_tokenizer"] = {{"type", "Sequence"},
                               {"pretokenizers", {{{"type", "Digits"}, {"individual_digits", true}}, byte_level_regex}}};
       }},
      {"prefix-space-nfkc-stripped",
       [=](json& j) {
         j["normalizer"] = {{"type", "Sequence"}, {"normalizers", {{{"type", "NFKC"}}}}};
         j["added_tokens"][4]["lstrip"] = true;  // <extra_word>, normalized: stripped after normalization
         j["added_tokens"][4]["rstrip"] = true;
         json with_prefix = byte_level_regex;
         with_prefix["add_prefix_space"] = true;
         j["pre_tokenizer"] = with_prefix;
       }},
      // (Isolated: tokenizers.js keeps a String pattern's matches even when Removed, as JavaScript's
      // split does with the group it wraps them in; tokenizers, and loco, drop them.)
      {"split-on-a-string",
       [](json& j) {
         j["pre_tokenizer"]["pretokenizers"][0] = {
             {"type", "Split"}, {"pattern", {{"String", ", "}}}, {"behavior", "Isolated"}, {"invert", false}};
       }},
      {"split-removing-a-regex",
       [](json& j) {
         j["pre_tokenizer"]["pretokenizers"][0] = {
             {"type", "Split"}, {"pattern", {{"Regex", "[,;]\\s"}}}, {"behavior", "Removed"}, {"invert", false}};
       }},
      // GPT-4o's kind: Split Removed, inverted (only the matches are kept), then ByteLevel without
      // its regex; a pattern that leaves white space and punctuation out, so that what is removed shows.
      {"split-inverted-keeping-the-matches",
       [](json& j) {
         j["normalizer"] = nullptr;
         j["pre_tokenizer"]["pretokenizers"][0] = {
             {"type", "Split"}, {"pattern", {{"Regex", "\\p{L}+|\\p{N}{1,3}"}}}, {"behavior", "Removed"}, {"invert", true}};
         j["pre_tokenizer"]["pretokenizers"][1]["use_regex"] = false;
       }},
  };
}

// Texts to compare on, written into `dir`: the mixed text, real English the merges were not learned
// on, and an empty text.
std::vector<std::string> parity_texts() {
  const std::string english = read_text("/usr/share/common-licenses/Apache-2.0").substr(0, 6000);
  EXPECT_GT(english.size(), 5000u);
  return {mixed_text(), english, ""};
}

// What Hugging Face's JavaScript tokenizers make of `texts` with the tokenizer.json and
// tokenizer_config.json in `dir`: for each text, {"ids": [...], "text": decoded}.
std::vector<json> reference_encodings(const fs::path& dir, const std::vector<std::string>& texts) {
  const fs::path package = (testing_util::build_dir() / "hf-tokenizers") / "node_modules/@huggingface/tokenizers";
  EXPECT_TRUE(fs::exists(package / "dist/tokenizers.mjs"))
      << "@huggingface/tokenizers is not installed in " << (testing_util::build_dir() / "hf-tokenizers").string() << " (npm failed at configure time?)";
  std::vector<std::string> argv = {"/usr/bin/env", "node", (testing_util::build_dir() / "hf-tokenizers") / "hf_tokenize.mjs",
                                   package.string(), dir.string()};
  for (size_t i = 0; i < texts.size(); ++i) {
    argv.push_back((dir / fmt::format("text-{}.txt", i)).string());
    write_text(argv.back(), texts[i]);
  }
  const auto reference = loco::testing_util::run_command(argv, (dir / "node.log").string(), std::chrono::seconds(120));
  EXPECT_EQ(reference.status, 0) << reference.output;
  std::vector<json> out;
  std::istringstream lines(reference.output);
  for (std::string line; std::getline(lines, line);) out.push_back(json::parse(line));
  EXPECT_EQ(out.size(), texts.size()) << reference.output;
  return out;
}

TEST(ByteLevelBpe, MatchesHuggingFacesJavaScriptTokenizers) {
  TempDir tmp;
  const std::vector<std::string> texts = parity_texts();
  for (const auto& variant : variants()) {
    SCOPED_TRACE(variant.name);
    json file = json::parse(read_text(kFixture / "tokenizer.json"));
    variant.change(file);
    const fs::path dir = tmp / variant.name;
    write_text(dir / "tokenizer.json", file.dump());
    fs::copy_file(kFixture / "tokenizer_config.json", dir / "tokenizer_config.json");
    const auto expected = reference_encodings(dir, texts);
    ASSERT_EQ(expected.size(), texts.size());
    const auto bpe = ByteLevelBpe::parse(file.dump(), variant.name);
    for (size_t i = 0; i < texts.size(); ++i) {
      const auto ids = bpe->encode(texts[i]);
      EXPECT_EQ(ids, expected[i]["ids"].get<std::vector<int32_t>>()) << "text " << i;
      EXPECT_EQ(bpe->decode(ids), expected[i]["text"].get<std::string>()) << "text " << i;
      if (i == 1) EXPECT_LT(ids.size(), texts[i].size() / 2) << "the merges apply: fewer tokens than half the bytes";
    }
  }
}

// A SentencePiece tokenizer.model made as Llama 2's (byte fallback, a dummy prefix, white space kept),
// read by loco through SentencePiece, gives the ids Hugging Face's tokenizer.json of the same model
// (as transformers' LlamaConverter writes it; scripts/bpe_fixture.py) gives in JavaScript.
TEST(SentencePieceModel, MatchesHuggingFacesJavaScriptTokenizersOnALlama2StyleModel) {
  TempDir tmp;
  const fs::path fixture = testing_util::source_dir() / "tests/data/fixtures/llama2_tokenizer";
  for (const char* name : {"tokenizer.json", "tokenizer_config.json"}) fs::copy_file(fixture / name, tmp.path() / name);
  const std::vector<std::string> texts = parity_texts();
  const auto expected = reference_encodings(tmp.path(), texts);
  ASSERT_EQ(expected.size(), texts.size());
  const auto tokenizer = Tokenizer::load(fixture / "tokenizer.model");
  EXPECT_FALSE(tokenizer.is_byte_level());
  for (size_t i = 0; i < texts.size(); ++i) {
    const auto ids = tokenizer.encode(texts[i]);
    EXPECT_EQ(ids, expected[i]["ids"].get<std::vector<int32_t>>()) << "text " << i;
    EXPECT_EQ(tokenizer.decode(ids), expected[i]["text"].get<std::string>()) << "text " << i;
  }
  const auto ids = tokenizer.encode(texts[0]);
  EXPECT_TRUE(std::any_of(ids.begin(), ids.end(), [](int32_t id) { return id >= 3 && id < 259; }))
      << "the mixed text needs byte fallback";
}

TEST(ByteLevelBpe, ATokenizerJsonIsADatasetsTokenizerWithItsEndOfTextToken) {
  TempDir tmp;
  const auto tokenizer = Tokenizer::load(kFixture / "tokenizer.json");
  EXPECT_TRUE(tokenizer.is_byte_level());
  EXPECT_EQ(tokenizer.eos_id(), 856);  // <|endoftext|>, named by tokenizer_config.json
  EXPECT_EQ(tokenizer.bos_id(), -1);
  EXPECT_EQ(tokenizer.vocab_size(), 861);
  EXPECT_EQ(tokenizer.decode(tokenizer.encode("plain text, decoded back")), "plain text, decoded back");
  tokenizer.save(tmp / "copy" / "tokenizer.json");
  EXPECT_EQ(Tokenizer::load(tmp / "copy" / "tokenizer.json").hash(), tokenizer.hash());

  // Without tokenizer_config.json, config.json's eos_token_id names it; without either, it is refused.
  write_text(tmp / "bare" / "tokenizer.json", read_text(kFixture / "tokenizer.json"));
  EXPECT_TRUE(throws_with<DataError>([&] { Tokenizer::load(tmp / "bare" / "tokenizer.json"); },
                                     {"no end-of-text token", "eos_token"}));
  write_text(tmp / "bare" / "config.json", R"({"eos_token_id": 858, "bos_token_id": 857})");
  const auto from_config = Tokenizer::load(tmp / "bare" / "tokenizer.json");
  EXPECT_EQ(from_config.eos_id(), 858);
  EXPECT_EQ(from_config.bos_id(), 857);
  EXPECT_NE(from_config.hash(), tokenizer.hash()) << "the end-of-text token is part of what the hash identifies";
  write_text(tmp / "bare" / "tokenizer_config.json", R"({"eos_token": "<|endoftext|>", "bos_token": null})");
  EXPECT_EQ(Tokenizer::load(tmp / "bare" / "tokenizer.json").bos_id(), -1) << "a null bos_token says none";
  write_text(tmp / "bare" / "tokenizer_config.json", R"({"eos_token": "<|nope|>"})");
  EXPECT_TRUE(throws_with<DataError>([&] { Tokenizer::load(tmp / "bare" / "tokenizer.json"); }, {"<|nope|>", "not a token"}));
}

}  // namespace
}  // namespace loco::data
