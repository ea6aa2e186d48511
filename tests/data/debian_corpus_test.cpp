#include "loco/data/debian_corpus.h"

#include <gtest/gtest.h>
#include <zlib.h>

#include <algorithm>
#include <map>
#include <sstream>

#include "data/data_test_util.h"
#include "loco/core/error.h"

namespace loco::data {
namespace {

using testing::TempDir;
using testing::throws_with;
using testing::write_text;

void write_gzip(const fs::path& path, std::string_view text) {
  fs::create_directories(path.parent_path());
  gzFile out = gzopen(path.c_str(), "wb");
  ASSERT_NE(out, nullptr) << path;
  ASSERT_EQ(gzwrite(out, text.data(), static_cast<unsigned>(text.size())), static_cast<int>(text.size()));
  ASSERT_EQ(gzclose(out), Z_OK);
}

std::map<std::string, const Document*> by_name(const std::vector<Document>& documents) {
  std::map<std::string, const Document*> out;
  for (const auto& d : documents) out[d.name] = &d;
  return out;
}

// ---- bible --------------------------------------------------------------------------------------

TEST(ParseBible, OneDocumentPerBookWithTheReferencesStripped) {
  const std::string text =
      "Ge1:1 In the beginning God created the heaven and the earth.\n"
      "Ge1:2 And the earth was without form, and void.\n"
      "\n"
      "1Sm1:1 Now there was a certain man of Ramathaimzophim.\n"
      "SSol1:1 The song of songs, which is Solomon's.\n"
      "SSol1:2 Let him kiss me with the kisses of his mouth.\n"
      "Rev22:21 The grace of our Lord Jesus Christ be with you all. Amen.\n";
  const auto books = parse_bible(text, "bible-output");
  ASSERT_EQ(books.size(), 4u);
  EXPECT_EQ(books[0].name, "Ge");
  EXPECT_EQ(books[0].text,
            "In the beginning God created the heaven and the earth. And the earth was without form, and void.");
  EXPECT_EQ(books[1].name, "1Sm");
  EXPECT_EQ(books[1].text, "Now there was a certain man of Ramathaimzophim.");
  EXPECT_EQ(books[2].name, "SSol");
  EXPECT_EQ(books[2].text, "The song of songs, which is Solomon's. Let him kiss me with the kisses of his mouth.");
  EXPECT_EQ(books[3].name, "Rev");
  for (const auto& b : books) EXPECT_EQ(b.label, "bible");
}

TEST(ParseBible, RefusesALineThatIsNotAVerse) {
  // bible's pretty-printed form (without -f): a heading, then indented verse numbers.
  EXPECT_TRUE(throws_with<DataError>([] { parse_bible("Ge1:1 In the beginning\nGenesis 1\n", "out"); },
                                     {"out:2", "expected a verse", "Genesis 1"}));
  EXPECT_TRUE(throws_with<DataError>([] { parse_bible("  1 In the beginning God\n", "out"); }, {"out:1"}));
  EXPECT_TRUE(throws_with<DataError>([] { parse_bible("Ge1: In the beginning\n", "out"); }, {"out:1"}));
  EXPECT_TRUE(throws_with<DataError>([] { parse_bible("Ge1:1x In the beginning\n", "out"); }, {"out:1"}));
  EXPECT_TRUE(parse_bible("\n\n", "out").empty());
}

// ---- fortunes -----------------------------------------------------------------------------------

TEST(FortuneText, SeparatesFortunesByBlankLines) {
  EXPECT_EQ(fortune_text("%\nFirst fortune,  \n\ttwo lines.\n%\n%\n\nSecond.\n\n%\nThird.\n"),
            "First fortune,\n\ttwo lines.\n\nSecond.\n\nThird.");
  EXPECT_EQ(fortune_text("Only one, no separator"), "Only one, no separator");
  EXPECT_EQ(fortune_text("%\n%\n"), "");
}

TEST(FortuneText, ResolvesOverstrikesAndDropsControlCharacters) {
  // From fortunes' "people": underlined with "____" and four backspaces.
  EXPECT_EQ(fortune_text("no one ____\b\b\b\bdoes anything about it."), "no one does anything about it.");
  EXPECT_EQ(fortune_text("_\bu_\bn_\bd_\be_\br"), "under");    // underline letter by letter
  EXPECT_EQ(fortune_text("B\bBo\bol\bld\bd!"), "Bold!");       // bold: struck twice
  EXPECT_EQ(fortune_text("x\b_ stays"), "x stays");           // an underline struck over a letter
  EXPECT_EQ(fortune_text("\b\bat the start"), "at the start");  // nothing to step back over
  EXPECT_EQ(fortune_text("Look out!\a\a\a Behind you!\x7F"), "Look out! Behind you!");
  EXPECT_EQ(fortune_text("caf\xC3\xA9\b\xC3\xA9 ok"), "caf\xC3\xA9 ok");  // a multi-byte letter is one cell
}

TEST(ReadFortuneFiles, OneDocumentPerFileNamedByIt) {
  TempDir tmp;
  write_text(tmp / "fortunes" / "tao", "The Way\n%\nAbstraction\n%\n");
  write_text(tmp / "fortunes" / "zippy", "YOW!!\n");
  const auto docs = read_fortune_files({tmp / "fortunes" / "tao", tmp / "fortunes" / "zippy"});
  ASSERT_EQ(docs.size(), 2u);
  EXPECT_EQ(docs[0].name, "tao");
  EXPECT_EQ(docs[0].text, "The Way\n\nAbstraction");
  EXPECT_EQ(docs[1].name, "zippy");
  EXPECT_EQ(docs[0].label, "fortunes");
  write_text(tmp / "fortunes" / "latin1", "caf\xE9\n");
  EXPECT_TRUE(throws_with<DataError>([&] { read_fortune_files({tmp / "fortunes" / "latin1"}); },
                                     {"latin1", "invalid UTF-8 at byte 3"}));
}

// ---- man pages ----------------------------------------------------------------------------------

TEST(IsManRedirect, OnlyASoRequestBesideComments) {
  EXPECT_TRUE(is_man_redirect(".so man7/queue.7\n"));
  EXPECT_TRUE(is_man_redirect(".so man2/ioctl_tty.2\n.\\\" Link for old name of this page\n"));
  EXPECT_TRUE(is_man_redirect("'\\\" t\n\n.so man7/system_data_types.7\n"));
  EXPECT_FALSE(is_man_redirect(".TH READ 2\n.SH NAME\nread \\- read from a file descriptor\n"));
  EXPECT_FALSE(is_man_redirect(".so man7/a.7\n.so man7/b.7\n"));        // two pages included: content
  EXPECT_FALSE(is_man_redirect(".so man7/a.7\n.SH MORE\ntext\n"));     // a page that includes another
  EXPECT_FALSE(is_man_redirect(".\\\" only a comment\n"));
}

// A page whose paragraph wraps: long words that groff would hyphenate, and no sentence ends, so
// that every space in the output is one the page asked for unless groff justified the line.
std::string paragraph_page() {
  std::string words;
  for (int i = 0; i < 24; ++i) words += " internationalization counterrevolutionaries";
  return "'\\\" t\n.TH HELLO 1 2024-01-01 \"loco tests\"\n.SH NAME\nhello \\- say hello\n.SH DESCRIPTION\nwords" +
         words + "\n";
}

TEST(ReadManPages, RendersPagesAndSkipsRedirects) {
  TempDir tmp;
  write_gzip(tmp / "man1" / "hello.1.gz", paragraph_page());
  write_gzip(tmp / "man1" / "hi.1.gz", ".so man1/hello.1\n");
  write_text(tmp / "man7" / "plain.7", ".TH PLAIN 7\n.SH NAME\nplain \\- not compressed\n");
  std::vector<std::string> lines;
  const auto docs = read_man_pages({tmp / "man1" / "hello.1.gz", tmp / "man1" / "hi.1.gz", tmp / "man7" / "plain.7"},
                                   [&](const std::string& line) { lines.push_back(line); });
  ASSERT_EQ(docs.size(), 2u);
  EXPECT_EQ(docs[0].name, "man1/hello.1");
  EXPECT_EQ(docs[1].name, "man7/plain.7");
  EXPECT_EQ(docs[0].label, "man-pages");
  EXPECT_NE(docs[0].text.find("NAME\n       hello - say hello"), std::string::npos) << docs[0].text;
  EXPECT_NE(docs[1].text.find("plain - not compressed"), std::string::npos) << docs[1].text;
  ASSERT_FALSE(lines.empty());
  EXPECT_NE(lines.back().find("2 pages rendered, 1 that only redirect"), std::string::npos) << lines.back();

  // Plain text: no escape sequences or overstrikes, no trailing spaces, no justification, no
  // hyphenation.
  size_t paragraph_lines = 0;
  std::istringstream in(docs[0].text);
  for (std::string line; std::getline(in, line);) {
    EXPECT_EQ(line.find_first_of("\x1B\b"), std::string::npos) << line;
    EXPECT_FALSE(!line.empty() && line.back() == ' ') << line;
    if (line.find("internationalization") == std::string::npos) continue;
    ++paragraph_lines;
    const std::string words = line.substr(line.find_first_not_of(' '));
    EXPECT_EQ(words.find("  "), std::string::npos) << "justified: " << line;
    EXPECT_TRUE(words.ends_with("internationalization") || words.ends_with("counterrevolutionaries")) << line;
  }
  EXPECT_GT(paragraph_lines, 5u);
}

TEST(ReadManPages, NamesAPageThatCannotBeRead) {
  TempDir tmp;
  write_gzip(tmp / "man1" / "latin1.1.gz", ".TH X 1\n.SH NAME\ncaf\xE9\n");
  EXPECT_TRUE(throws_with<DataError>([&] { read_man_pages({tmp / "man1" / "latin1.1.gz"}, {}); },
                                     {"latin1.1.gz", "invalid UTF-8"}));
  EXPECT_TRUE(throws_with<DataError>([&] { read_man_pages({tmp / "man1" / "absent.1.gz"}, {}); }, {"absent.1.gz"}));
}

// ---- pass-through text --------------------------------------------------------------------------

TEST(ReadTextFiles, PassesTextThroughNamedUnderTheirCommonFolder) {
  TempDir tmp;
  const std::string rst = ":mod:`os` --- Miscellaneous operating system interfaces\n=====\n\n.. module:: os\n";
  const std::string pod = "=head1 NAME\n\nperlfunc - Perl builtin functions\n\n=cut\n";
  write_text(tmp / "_sources" / "library" / "os.rst.txt", rst);
  write_text(tmp / "_sources" / "index.rst.txt", "\xEF\xBB\xBFWelcome\n");
  write_text(tmp / "pod" / "perlfunc.pod", pod);
  auto docs = read_text_files({tmp / "_sources" / "index.rst.txt", tmp / "_sources" / "library" / "os.rst.txt"},
                              "python-docs");
  ASSERT_EQ(docs.size(), 2u);
  EXPECT_EQ(docs[0].name, "index.rst.txt");
  EXPECT_EQ(docs[0].text, "Welcome\n");  // the byte order mark dropped
  EXPECT_EQ(docs[1].name, "library/os.rst.txt");
  EXPECT_EQ(docs[1].text, rst);
  EXPECT_EQ(docs[1].label, "python-docs");
  docs = read_text_files({tmp / "pod" / "perlfunc.pod"}, "perl-docs");
  ASSERT_EQ(docs.size(), 1u);
  EXPECT_EQ(docs[0].name, "perlfunc.pod");
  EXPECT_EQ(docs[0].text, pod);
  write_text(tmp / "pod" / "bad.pod", "=head1 caf\xE9\n");
  EXPECT_TRUE(throws_with<DataError>([&] { read_text_files({tmp / "pod" / "bad.pod"}, "perl-docs"); },
                                     {"bad.pod", "invalid UTF-8 at byte 10"}));
}

// ---- the installed packages (scripts/setup.sh installs them; a missing one fails, named) --------

TEST(DebianPackages, AMissingPackageIsNamedWithItsInstallHint) {
  EXPECT_TRUE(throws_with<DataError>([] { debian_package_files("loco-no-such-package"); },
                                     {"loco-no-such-package is not installed", "apt install loco-no-such-package"}));
  EXPECT_THROW(read_debian_corpus("brown", {}), InternalError);
}

TEST(DebianPackages, Bible) {
  std::vector<std::string> lines;
  const auto books = read_debian_corpus("bible", [&](const std::string& l) { lines.push_back(l); });
  ASSERT_EQ(books.size(), 66u);
  EXPECT_EQ(books.front().name, "Ge");
  EXPECT_TRUE(books.front().text.starts_with("In the beginning God created the heaven and the earth. And the earth"))
      << books.front().text.substr(0, 200);
  EXPECT_EQ(books.back().name, "Rev");
  EXPECT_TRUE(books.back().text.ends_with("The grace of our Lord Jesus Christ be with you all. Amen."));
  size_t bytes = 0;
  for (const auto& b : books) {
    EXPECT_EQ(b.label, "bible");
    EXPECT_EQ(b.text.find('\n'), std::string::npos) << b.name;
    bytes += b.text.size();
  }
  EXPECT_GT(bytes, 4'000'000u);  // about 4.3 MB of verses
  EXPECT_LT(bytes, 4'600'000u);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_NE(lines[0].find("bible: 66 books from bible-kjv "), std::string::npos) << lines[0];
}

TEST(DebianPackages, Fortunes) {
  const auto docs = read_debian_corpus("fortunes", {});
  EXPECT_GE(docs.size(), 40u);  // 43 in fortunes 1:1.99.1
  EXPECT_LE(docs.size(), 60u);
  const auto named = by_name(docs);
  for (const char* name : {"fortunes", "literature", "riddles", "computers", "tao"}) {
    EXPECT_TRUE(named.contains(name)) << name;  // the first three from fortunes-min
  }
  for (const auto& d : docs) {
    EXPECT_EQ(d.label, "fortunes");
    EXPECT_FALSE(d.name.ends_with(".dat") || d.name.ends_with(".u8")) << d.name;
    EXPECT_GT(d.text.size(), 100u) << d.name;
    EXPECT_EQ(d.text.find("\n%\n"), std::string::npos) << d.name;
    EXPECT_FALSE(std::any_of(d.text.begin(), d.text.end(),
                             [](char c) { return (c >= 0 && c < 0x20 && c != '\n' && c != '\t') || c == 0x7F; }))
        << d.name;
  }
  EXPECT_TRUE(named.at("tao")->text.starts_with("The Way\n\nThe Way that can be experienced is not true;"))
      << named.at("tao")->text.substr(0, 200);
}

TEST(DebianPackages, ManPages) {
  std::vector<std::string> lines;
  const auto docs = read_debian_corpus("man-pages", [&](const std::string& l) { lines.push_back(l); });
  EXPECT_GE(docs.size(), 1000u);  // 1,100 pages in manpages 6.03 and manpages-dev 6.03
  EXPECT_LE(docs.size(), 1500u);
  const auto named = by_name(docs);
  ASSERT_TRUE(named.contains("man2/read.2"));
  EXPECT_NE(named.at("man2/read.2")->text.find("NAME\n       read - read from a file descriptor"), std::string::npos)
      << named.at("man2/read.2")->text.substr(0, 400);
  EXPECT_FALSE(named.contains("man3/queue.3"));        // `.so man7/queue.7`
  EXPECT_FALSE(named.contains("man2/oldlstat.2"));     // a symlink to stat.2.gz
  EXPECT_TRUE(named.contains("man2/stat.2"));
  for (const auto& d : docs) {
    EXPECT_EQ(d.label, "man-pages");
    EXPECT_GT(d.text.size(), 200u) << d.name;
  }
  ASSERT_GE(lines.size(), 2u);
  EXPECT_NE(lines.front().find("man-pages: rendering"), std::string::npos) << lines.front();
  EXPECT_NE(lines.back().find("that only redirect (.so) skipped"), std::string::npos) << lines.back();
}

TEST(DebianPackages, PythonDocs) {
  const auto docs = read_debian_corpus("python-docs", {});
  EXPECT_GE(docs.size(), 400u);  // 497 in python3.11-doc
  const auto named = by_name(docs);
  ASSERT_TRUE(named.contains("library/os.rst.txt"));
  EXPECT_TRUE(named.at("library/os.rst.txt")->text.starts_with(":mod:`os` --- Miscellaneous operating system"));
  for (const auto& d : docs) EXPECT_EQ(d.label, "python-docs");
}

TEST(DebianPackages, KernelDocs) {
  const auto docs = read_debian_corpus("kernel-docs", {});
  EXPECT_GE(docs.size(), 2500u);  // 3,183 in linux-doc-6.1
  const auto named = by_name(docs);
  ASSERT_TRUE(named.contains("index.rst.txt"));
  ASSERT_TRUE(named.contains("admin-guide/index.rst.txt"));
  EXPECT_NE(named.at("admin-guide/index.rst.txt")->text.find("Linux"), std::string::npos);
  for (const auto& d : docs) EXPECT_EQ(d.label, "kernel-docs");
}

TEST(DebianPackages, PerlDocs) {
  const auto docs = read_debian_corpus("perl-docs", {});
  EXPECT_GE(docs.size(), 150u);  // 206 in perl-doc 5.36
  const auto named = by_name(docs);
  ASSERT_TRUE(named.contains("perlfunc.pod"));
  EXPECT_NE(named.at("perlfunc.pod")->text.find("=head1 NAME"), std::string::npos);
  for (const auto& d : docs) EXPECT_EQ(d.label, "perl-docs");
}

TEST(DebianPackages, LabelBySourceThroughLoadCorpus) {
  TempDir tmp;
  const auto own = load_corpus("bible+fortunes", tmp / "cache");
  const auto by_source = load_corpus("bible+fortunes", CorpusOptions{tmp / "cache", LabelBy::kSource, {}});
  ASSERT_EQ(own.size(), by_source.size());
  ASSERT_GT(own.size(), 66u);
  for (size_t i = 0; i < own.size(); ++i) {
    EXPECT_EQ(by_source[i].label, i < 66 ? "bible" : "fortunes");
    EXPECT_EQ(by_source[i].name, own[i].name);
  }
}

}  // namespace
}  // namespace loco::data
