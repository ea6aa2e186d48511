// Corpora from the files Debian packages install: `loco prepare --corpus bible` and its siblings.
//
// Each source asks dpkg which files its package installed (`dpkg-query -L`, no shell), so a corpus
// is exactly what the installed package version holds, read in sorted order: the same package
// versions give the same documents on every machine. A source whose package is not installed
// throws DataError naming the package, with the hint `apt install PACKAGE`.
//
//   bible        bible-kjv (program /usr/bin/bible, text from bible-kjv-text): the King James Bible,
//                one document per book (66), verses joined with spaces
//   fortunes     fortunes and fortunes-min: the fortune files of /usr/share/games/fortunes/ (not
//                their *.dat indexes or *.u8 links), one document per file, fortunes separated by
//                blank lines
//   man-pages    manpages and manpages-dev: the pages /usr/share/man/man*/*.gz, rendered to plain
//                text by groff (groff-base); pages that only redirect (`.so`, or a symlink) skipped
//   python-docs  python3.X-doc (what python3-doc depends on): html/_sources/**/*.rst.txt, raw
//                reStructuredText, one document per file
//   kernel-docs  linux-doc-X.Y (what linux-doc depends on): html/_sources/**/*.rst.txt, the same
//                way (its translations, under translations/, included)
//   perl-docs    perl-doc: the *.pod files, raw POD, one document per file
//
// Each document's label is its source's name. Torch-free, like corpus.cpp.
#pragma once

#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "loco/data/corpus.h"

namespace loco::data {

namespace fs = std::filesystem;

// The Debian sources' names, in the order `domains` joins them.
const std::vector<std::string>& debian_corpus_names();

// Reads the Debian source `name` (one of debian_corpus_names()). `progress` (may be empty) gets a
// line naming the package versions read, and every few seconds one while man pages render (about
// 20 s on 2 cores for 1,100 pages). Throws DataError when a package is missing or a file is not
// UTF-8, Error when dpkg-query, bible or groff cannot run or fail, InternalError for another name.
std::vector<Document> read_debian_corpus(std::string_view name, const Progress& progress);

// The files Debian package `package` installed: regular files only (no folders, no symlinks),
// sorted. Throws DataError naming the package and `apt install PACKAGE` when it is not installed.
std::vector<fs::path> debian_package_files(const std::string& package);

// ---- the conversions, exposed for tests ---------------------------------------------------------

// `bible -f` output, one verse per line ("Ge1:1 In the beginning ...", "1Sm1:1 Now there ...";
// book abbreviation, chapter:verse, text) -> one document per book, named by the abbreviation, the
// references stripped and the verses joined with spaces, label "bible". Blank lines are skipped;
// any other line that is not a verse throws DataError naming `where` and the line number.
std::vector<Document> parse_bible(std::string_view text, const std::string& where);

// A fortune file's text: the fortunes (separated by lines of "%") with trailing spaces and blank
// lines around them trimmed, joined by one blank line. Overstrikes ("____\b\b\b\bthis", "X\bX")
// become the letters they print, and control characters other than tab are dropped (the files ring
// the terminal's bell).
std::string fortune_text(std::string_view raw);

// One document per fortune file, named by the file name, label "fortunes". Throws DataError naming
// a file that is not valid UTF-8 (every file of fortunes 1:1.99.1 is; no guessing at latin-1).
std::vector<Document> read_fortune_files(const std::vector<fs::path>& files);

// Whether a man page's source only points at another page: one `.so manN/page.N` request and
// nothing else but comments and blank lines.
bool is_man_redirect(std::string_view source);

// Renders man pages (gzipped when named *.gz, else plain) to text with `groff -mandoc -Tutf8
// -P-cbou` (plus -t for tables, input read as UTF-8, no hyphenation, lines not justified), several
// pages at once; trailing spaces and runs of blank lines are dropped. One document per page that is
// not a redirect, in the order of `files`, named by its folder and file ("man2/read.2"), label
// "man-pages". `progress` as for read_debian_corpus. Throws DataError for a page that cannot be
// read or is not UTF-8, Error when groff cannot run or fails.
std::vector<Document> read_man_pages(const std::vector<fs::path>& files, const Progress& progress);

// Text files passed through as they are (validated UTF-8; a byte order mark dropped), each named
// by its path relative to the folder all of them are in ("library/os.rst.txt"), label `label`.
// Throws DataError naming a file that cannot be read or is not UTF-8.
std::vector<Document> read_text_files(const std::vector<fs::path>& files, const std::string& label);

}  // namespace loco::data
