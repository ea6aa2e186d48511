#include "loco/data/debian_corpus.h"

#include <fmt/format.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <exception>
#include <fstream>
#include <optional>
#include <thread>

#include "loco/core/command.h"
#include "loco/core/error.h"
#include "loco/core/files.h"
#include "loco/data/text.h"

namespace loco::data {
namespace {

constexpr auto kToolTimeout = std::chrono::seconds(120);
constexpr std::string_view kDpkgHint =
    "loco reads these corpora from Debian packages: is this Debian, with dpkg-query?";
constexpr std::string_view kFortuneFolder = "/usr/share/games/fortunes";
constexpr std::string_view kManFolder = "/usr/share/man";
constexpr std::string_view kDocSources = "/html/_sources/";
// The whole Bible, as `bible` spells its first and last verse.
constexpr std::string_view kWholeBible = "Gen1:1-Rev22:21";
constexpr size_t kBibleBooks = 66;
constexpr auto kProgressEvery = std::chrono::seconds(5);

bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_letter(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }

std::vector<std::string_view> split_lines(std::string_view text) {
  std::vector<std::string_view> lines;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string_view::npos) end = text.size();
    lines.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  return lines;
}

// Lines with their trailing spaces removed, runs of blank lines as one, none at either end.
std::string tidy_lines(std::string_view text) {
  std::string out;
  bool blank_pending = false;
  for (std::string_view line : split_lines(text)) {
    line = trim_right(line);
    if (line.empty()) {
      blank_pending = !out.empty();
      continue;
    }
    if (blank_pending) out += '\n';
    blank_pending = false;
    out += line;
    out += '\n';
  }
  if (!out.empty()) out.pop_back();
  return out;
}

// A private folder for commands' output and logs, removed with everything in it.
class ScratchFolder {
 public:
  ScratchFolder() {
    const auto stamp = std::chrono::steady_clock::now().time_since_epoch().count();
    path_ = fs::temp_directory_path() / fmt::format("loco-corpus-{}-{}", ::getpid(), stamp);
    std::error_code ec;
    fs::create_directories(path_, ec);
    if (ec) throw Error(kModule, fmt::format("{}: cannot create folder: {}", path_.string(), ec.message()));
  }
  ~ScratchFolder() {
    std::error_code ignored;
    fs::remove_all(path_, ignored);
  }
  ScratchFolder(const ScratchFolder&) = delete;
  ScratchFolder& operator=(const ScratchFolder&) = delete;
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

struct Captured {
  CommandResult result;
  std::string out;  // the whole stdout
};

// Runs argv with its stdout into a file of `scratch` (named by `tag`) and returns what it printed.
Captured capture(const std::vector<std::string>& argv, const fs::path& scratch, const std::string& tag,
                 std::string_view hint) {
  const fs::path out = scratch / (tag + ".out");
  Captured captured;
  captured.result = run_command(kModule, kToolTimeout, argv, scratch / (tag + ".log"), hint, CommandStreams{out});
  std::error_code ec;
  if (fs::exists(out, ec)) captured.out = read_file(out, kModule);
  return captured;
}

bool succeeded(const CommandResult& result) { return result.signal == 0 && result.exit_code == 0; }

[[noreturn]] void not_installed(std::string_view corpus, const std::string& package) {
  fail(fmt::format("{}Debian package {} is not installed. hint: apt install {}",
                   corpus.empty() ? "" : fmt::format("corpus '{}' reads ", corpus), package, package));
}

// The version of `package` when dpkg has it installed, else nothing.
std::optional<std::string> installed_version(const std::string& package, const fs::path& scratch) {
  const Captured c = capture({"dpkg-query", "-W", "--showformat=${Status}\t${Version}", package}, scratch,
                             "dpkg-query-W", kDpkgHint);
  const size_t tab = c.out.find('\t');
  if (!succeeded(c.result) || tab == std::string::npos || c.out.substr(0, tab) != "install ok installed") {
    return std::nullopt;
  }
  return c.out.substr(tab + 1);
}

// "bible-kjv 4.38", or DataError when `package`, which `corpus` reads, is not installed.
std::string require_package(const std::string& package, std::string_view corpus, const fs::path& scratch) {
  auto version = installed_version(package, scratch);
  if (!version) not_installed(corpus, package);
  return package + " " + *version;
}

// Orders "python3.9-doc" before "python3.11-doc": runs of digits compare as numbers.
bool natural_less(const std::string& a, const std::string& b) {
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    if (is_digit(a[i]) && is_digit(b[j])) {
      size_t ei = i, ej = j;
      while (ei < a.size() && is_digit(a[ei])) ++ei;
      while (ej < b.size() && is_digit(b[ej])) ++ej;
      const auto na = std::stoull(a.substr(i, std::min<size_t>(ei - i, 18)));
      const auto nb = std::stoull(b.substr(j, std::min<size_t>(ej - j, 18)));
      if (na != nb) return na < nb;
      i = ei, j = ej;
    } else {
      if (a[i] != b[j]) return a[i] < b[j];
      ++i, ++j;
    }
  }
  return a.size() - i < b.size() - j;
}

// The newest installed package matching the dpkg pattern (python3.*-doc), for a meta package
// (python3-doc) that depends on one versioned package. Throws DataError naming the meta package.
std::string newest_installed(const std::string& pattern, const std::string& meta, std::string_view corpus,
                             const fs::path& scratch) {
  const Captured c = capture({"dpkg-query", "-W", "--showformat=${Package}\t${Status}\n", pattern}, scratch,
                             "dpkg-query-pattern", kDpkgHint);
  std::vector<std::string> installed;
  for (std::string_view line : split_lines(c.out)) {
    const size_t tab = line.find('\t');
    if (tab != std::string_view::npos && line.substr(tab + 1) == "install ok installed") {
      installed.emplace_back(line.substr(0, tab));
    }
  }
  if (installed.empty()) {
    fail(fmt::format("corpus '{}' reads Debian package {} (the one {} depends on), and none is installed. hint: apt "
                     "install {}",
                     corpus, pattern, meta, meta));
  }
  return *std::max_element(installed.begin(), installed.end(), natural_less);
}

std::vector<fs::path> package_files(const std::string& package, const fs::path& scratch) {
  const Captured c = capture({"dpkg-query", "-L", package}, scratch, "dpkg-query-L", kDpkgHint);
  if (!succeeded(c.result)) not_installed("", package);
  std::vector<fs::path> files;
  for (std::string_view line : split_lines(c.out)) {
    // Other lines say where a diversion moved a file ("package diverts others to: ...").
    if (!line.starts_with('/')) continue;
    const fs::path path(line);
    std::error_code ec;
    if (fs::is_regular_file(fs::symlink_status(path, ec))) files.push_back(path);
  }
  std::sort(files.begin(), files.end());
  return files;
}

bool is_under(const fs::path& file, const fs::path& folder) {
  const fs::path relative = file.lexically_relative(folder);
  return !relative.empty() && *relative.begin() != "..";
}

void report(const Progress& progress, const std::string& line) {
  if (progress) progress(line);
}

// "1Sm3:4 And the LORD ..." -> ("1Sm", "And the LORD ..."): an optional digit and letters (the
// book), digits ':' digits (chapter and verse), then the text. Nothing when `line` is not a verse.
std::optional<std::pair<std::string_view, std::string_view>> parse_verse(std::string_view line) {
  size_t p = 0;
  auto skip = [&](auto is) {
    const size_t from = p;
    while (p < line.size() && is(line[p])) ++p;
    return p > from;
  };
  if (p < line.size() && is_digit(line[p])) ++p;
  if (!skip(is_letter)) return std::nullopt;
  const std::string_view book = line.substr(0, p);
  if (!skip(is_digit) || p == line.size() || line[p++] != ':' || !skip(is_digit)) return std::nullopt;
  if (p < line.size() && line[p] != ' ') return std::nullopt;
  return std::pair{book, trim(line.substr(p))};
}

// Writes `bytes` to a scratch file (no fsync: nothing durable about it).
void write_scratch(const fs::path& path, std::string_view bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out.good()) throw Error(kModule, fmt::format("{}: cannot write (is the temporary folder full?)", path.string()));
}

// ---- the sources --------------------------------------------------------------------------------

std::vector<Document> read_bible(const Progress& progress, const fs::path& scratch) {
  const std::string versions =
      require_package("bible-kjv", "bible", scratch) + ", " + require_package("bible-kjv-text", "bible", scratch);
  const auto files = package_files("bible-kjv", scratch);
  auto program = std::find_if(files.begin(), files.end(), [](const fs::path& f) { return f == "/usr/bin/bible"; });
  if (program == files.end()) {
    fail("Debian package bible-kjv installed no /usr/bin/bible. hint: apt install --reinstall bible-kjv");
  }
  // -f turns bible's pretty-printing off: one verse per line, each with its reference.
  const std::vector<std::string> argv = {program->string(), "-f", std::string(kWholeBible)};
  const Captured c = capture(argv, scratch, "bible", "apt install --reinstall bible-kjv bible-kjv-text");
  check_command_result(c.result, kModule, join_argv(argv), "apt install --reinstall bible-kjv bible-kjv-text");
  check_utf8(c.out, join_argv(argv));
  auto books = parse_bible(c.out, join_argv(argv));
  if (books.size() != kBibleBooks) {
    fail(fmt::format("`{}` printed {} books, not the {} of the King James Bible. hint: apt install --reinstall "
                     "bible-kjv-text",
                     join_argv(argv), books.size(), kBibleBooks));
  }
  report(progress, fmt::format("bible: {} books from {}", books.size(), versions));
  return books;
}

std::vector<Document> read_fortunes(const Progress& progress, const fs::path& scratch) {
  std::vector<fs::path> files;
  std::string versions;
  // fortunes holds most files, fortunes-min (its dependency) the rest.
  for (const std::string package : {"fortunes", "fortunes-min"}) {
    versions += (versions.empty() ? "" : ", ") + require_package(package, "fortunes", scratch);
    for (const auto& file : package_files(package, scratch)) {
      const std::string ext = file.extension().string();
      if (file.parent_path() == kFortuneFolder && ext != ".dat" && ext != ".u8") files.push_back(file);
    }
  }
  std::sort(files.begin(), files.end());
  auto documents = read_fortune_files(files);
  report(progress, fmt::format("fortunes: {} files from {}", documents.size(), versions));
  return documents;
}

std::vector<Document> read_man_page_packages(const Progress& progress, const fs::path& scratch) {
  std::vector<fs::path> files;
  std::string versions;
  for (const std::string package : {"manpages", "manpages-dev"}) {
    versions += (versions.empty() ? "" : ", ") + require_package(package, "man-pages", scratch);
    for (const auto& file : package_files(package, scratch)) {
      // /usr/share/man/man2/read.2.gz, not a translation (/usr/share/man/fr/man1/...).
      const std::string section = file.parent_path().filename().string();
      if (file.parent_path().parent_path() == kManFolder && section.starts_with("man") && file.extension() == ".gz") {
        files.push_back(file);
      }
    }
  }
  std::sort(files.begin(), files.end());
  report(progress, fmt::format("man-pages: rendering {} pages of {} with groff", files.size(), versions));
  return read_man_pages(files, progress);
}

// python-docs and kernel-docs: the reStructuredText sources that Sphinx keeps next to its HTML.
std::vector<Document> read_doc_sources(const std::string& name, const std::string& pattern, const std::string& meta,
                                       const Progress& progress, const fs::path& scratch) {
  const std::string package = newest_installed(pattern, meta, name, scratch);
  const std::string version = require_package(package, name, scratch);
  std::vector<fs::path> files;
  for (const auto& file : package_files(package, scratch)) {
    const std::string path = file.string();
    if (path.find(kDocSources) != std::string::npos && path.ends_with(".rst.txt")) files.push_back(file);
  }
  if (files.empty()) {
    fail(fmt::format("Debian package {} holds no html/_sources/*.rst.txt files. hint: apt install --reinstall {}",
                     package, package));
  }
  auto documents = read_text_files(files, name);
  report(progress, fmt::format("{}: {} files from {}", name, documents.size(), version));
  return documents;
}

std::vector<Document> read_perl_docs(const Progress& progress, const fs::path& scratch) {
  const std::string version = require_package("perl-doc", "perl-docs", scratch);
  std::vector<fs::path> files;
  for (const auto& file : package_files("perl-doc", scratch)) {
    if (file.extension() == ".pod") files.push_back(file);
  }
  if (files.empty()) fail("Debian package perl-doc holds no *.pod files. hint: apt install --reinstall perl-doc");
  auto documents = read_text_files(files, "perl-docs");
  report(progress, fmt::format("perl-docs: {} files from {}", documents.size(), version));
  return documents;
}

// ---- man pages ----------------------------------------------------------------------------------

std::string gunzip_file(const fs::path& file) {
  gzFile in = gzopen(file.c_str(), "rb");
  if (in == nullptr) fail(fmt::format("{}: cannot open", file.string()));
  std::string out;
  char buffer[1 << 16];
  int n = 0;
  while ((n = gzread(in, buffer, sizeof(buffer))) > 0) out.append(buffer, static_cast<size_t>(n));
  int code = 0;
  const std::string message = n < 0 ? gzerror(in, &code) : "";
  gzclose(in);
  if (n < 0) fail(fmt::format("{}: cannot decompress: {}", file.string(), message));
  return out;
}

// One page to text, or nothing for a redirect. `stem` names this page's files in the scratch folder.
std::optional<Document> render_man_page(const fs::path& file, const fs::path& stem) {
  const std::string source = file.extension() == ".gz" ? gunzip_file(file) : read_file(file, kModule);
  check_utf8(source, file.string());
  if (is_man_redirect(source)) return std::nullopt;
  // Left-adjusted, so that justification does not pad words apart; the pages' own `.ad` requests
  // (without a mode) keep it.
  const fs::path input = fs::path(stem.string() + ".man");
  write_scratch(input, ".ad l\n" + source);
  const std::vector<std::string> argv = {"groff", "-mandoc", "-Tutf8", "-P-cbou", "-t", "-Kutf-8", "-rHY=0",
                                         input.string()};
  const fs::path out = fs::path(stem.string() + ".txt");
  const auto result = run_command(kModule, kToolTimeout, argv, fs::path(stem.string() + ".log"),
                                  "apt install groff-base", CommandStreams{out});
  check_command_result(result, kModule, fmt::format("rendering {} with groff", file.string()),
                       "apt install groff-base");
  std::string text = read_file(out, kModule);
  check_utf8(text, fmt::format("{} rendered by groff", file.string()));
  const std::string name = (file.parent_path().filename() / file.filename()).string();
  return Document{name.ends_with(".gz") ? name.substr(0, name.size() - 3) : name, tidy_lines(text), "man-pages"};
}

}  // namespace

// ---- public -------------------------------------------------------------------------------------

const std::vector<std::string>& debian_corpus_names() {
  static const std::vector<std::string> kNames = {"bible",       "fortunes",    "man-pages",
                                                  "python-docs", "kernel-docs", "perl-docs"};
  return kNames;
}

std::vector<Document> read_debian_corpus(std::string_view name, const Progress& progress) {
  ScratchFolder scratch;
  if (name == "bible") return read_bible(progress, scratch.path());
  if (name == "fortunes") return read_fortunes(progress, scratch.path());
  if (name == "man-pages") return read_man_page_packages(progress, scratch.path());
  if (name == "python-docs") {
    return read_doc_sources("python-docs", "python3.*-doc", "python3-doc", progress, scratch.path());
  }
  if (name == "kernel-docs") {
    return read_doc_sources("kernel-docs", "linux-doc-*", "linux-doc", progress, scratch.path());
  }
  if (name == "perl-docs") return read_perl_docs(progress, scratch.path());
  throw InternalError(kModule, fmt::format("read_debian_corpus: no Debian source named '{}'", name));
}

std::vector<fs::path> debian_package_files(const std::string& package) {
  ScratchFolder scratch;
  return package_files(package, scratch.path());
}

std::vector<Document> parse_bible(std::string_view text, const std::string& where) {
  std::vector<Document> books;
  const auto lines = split_lines(text);
  for (size_t i = 0; i < lines.size(); ++i) {
    const std::string_view line = trim(lines[i]);
    if (line.empty()) continue;
    const auto verse = parse_verse(line);
    if (!verse) {
      fail(fmt::format("{}:{}: expected a verse like \"Ge1:1 In the beginning ...\", got \"{}\"", where, i + 1,
                       line.substr(0, 80)));
    }
    const auto& [book, verse_text] = *verse;
    if (books.empty() || books.back().name != book) books.push_back(Document{std::string(book), "", "bible"});
    std::string& joined = books.back().text;
    if (!joined.empty() && !verse_text.empty()) joined += ' ';
    joined += verse_text;
  }
  return books;
}

std::string fortune_text(std::string_view raw) {
  std::string out, fortune;
  auto flush = [&] {
    const std::string tidy = tidy_lines(fortune);
    if (!tidy.empty()) out += (out.empty() ? "" : "\n\n") + tidy;
    fortune.clear();
  };
  for (std::string_view line : split_lines(raw)) {
    if (trim_right(line) == "%") {
      flush();
      continue;
    }
    // A line as a terminal prints it: a backspace steps back, and a letter struck over '_' (an
    // underline) or over itself (bold) stays.
    std::vector<std::string> cells;
    size_t at = 0;
    for (size_t i = 0; i < line.size();) {
      const auto c = static_cast<unsigned char>(line[i]);
      const size_t len = c < 0x80 ? 1 : (c >= 0xF0 ? 4 : (c >= 0xE0 ? 3 : 2));
      const std::string cell(line.substr(i, len));
      i += len;
      if (c == '\b') {
        at -= at > 0 ? 1 : 0;
      } else if ((c < 0x20 && c != '\t') || c == 0x7F) {
        continue;
      } else if (at < cells.size()) {
        if (cells[at] == "_" || cell != "_") cells[at] = cell;
        ++at;
      } else {
        cells.push_back(cell);
        ++at;
      }
    }
    for (const auto& cell : cells) fortune += cell;
    fortune += '\n';
  }
  flush();
  return out;
}

std::vector<Document> read_fortune_files(const std::vector<fs::path>& files) {
  std::vector<Document> documents;
  for (const auto& file : files) {
    const std::string raw = read_file(file, kModule);
    check_utf8(raw, file.string());
    documents.push_back(Document{file.filename().string(), fortune_text(raw), "fortunes"});
  }
  return documents;
}

bool is_man_redirect(std::string_view source) {
  int redirects = 0;
  for (std::string_view line : split_lines(source)) {
    line = trim(line);
    if (line.empty() || line.starts_with(".\\\"") || line.starts_with("'\\\"")) continue;  // blank, or a comment
    if (!line.starts_with(".so ")) return false;
    ++redirects;
  }
  return redirects == 1;
}

std::vector<Document> read_man_pages(const std::vector<fs::path>& files, const Progress& progress) {
  ScratchFolder scratch;
  // groff's pipeline (preconv, tbl, troff, grotty) is a few processes per page, mostly CPU: twice
  // as many pages at once as cores keeps them busy while others start.
  const size_t threads = std::clamp<size_t>(2 * std::thread::hardware_concurrency(), 2, 16);
  std::vector<std::optional<Document>> pages(files.size());
  std::vector<std::exception_ptr> errors(threads);
  std::atomic<size_t> rendered{0}, finished{0};
  std::atomic<bool> failed{false};
  std::vector<std::thread> workers;
  for (size_t t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      try {
        for (size_t i = t; i < files.size() && !failed; i += threads) {
          pages[i] = render_man_page(files[i], scratch.path() / fmt::format("page-{}", t));
          ++rendered;
        }
      } catch (...) {
        errors[t] = std::current_exception();
        failed = true;
      }
      ++finished;
    });
  }
  auto last = std::chrono::steady_clock::now();
  while (finished < threads) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    if (std::chrono::steady_clock::now() - last >= kProgressEvery) {
      last = std::chrono::steady_clock::now();
      report(progress, fmt::format("man-pages: {} of {} pages rendered", rendered.load(), files.size()));
    }
  }
  for (auto& w : workers) w.join();
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
  std::vector<Document> documents;
  for (auto& page : pages) {
    if (page) documents.push_back(std::move(*page));
  }
  report(progress, fmt::format("man-pages: {} pages rendered, {} that only redirect (.so) skipped", documents.size(),
                               files.size() - documents.size()));
  return documents;
}

std::vector<Document> read_text_files(const std::vector<fs::path>& files, const std::string& label) {
  if (files.empty()) return {};
  fs::path root = files.front().parent_path();
  for (const auto& file : files) {
    while (root.has_relative_path() && !is_under(file, root)) root = root.parent_path();
  }
  std::vector<Document> documents;
  documents.reserve(files.size());
  for (const auto& file : files) {
    std::string text = read_file(file, kModule);
    check_utf8(text, file.string());
    if (text.starts_with("\xEF\xBB\xBF")) text.erase(0, 3);  // a byte order mark is not text
    documents.push_back(Document{file.lexically_relative(root).string(), std::move(text), label});
  }
  return documents;
}

}  // namespace loco::data
