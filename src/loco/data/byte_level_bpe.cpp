#include "loco/data/byte_level_bpe.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <utf8proc.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <map>
#include <mutex>
#include <queue>
#include <unordered_map>
#include <utility>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "loco/core/error.h"
#include "loco/data/added_tokens.h"
#include "loco/data/corpus.h"
#include "loco/data/text.h"

namespace loco::data {
namespace {

using detail::AddedToken;
using detail::AddedTokens;
using detail::Section;
using detail::split_added;

using json = nlohmann::json;
// GPT-2's pre-tokenizer, which ByteLevel applies when use_regex is true (the default).
constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr size_t kMaxCachedPiece = 256;   // bytes; longer pieces are rare and not worth keeping
constexpr size_t kMaxCacheEntries = 1 << 16;
constexpr int32_t kMaxTokenId = 1 << 22;  // a vocabulary of 4M tokens is none a model has; a larger id is a bad file

// GPT-2's table of printable characters standing for bytes (bytes_to_unicode): the printable
// Latin-1 bytes stand for themselves, the other 68 for U+0100 onwards, in byte order.
std::array<char32_t, 256> byte_characters() {
  std::array<char32_t, 256> chars{};
  char32_t next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    chars[b] = printable ? static_cast<char32_t>(b) : next++;
  }
  return chars;
}

std::vector<char32_t> code_points(std::string_view text, std::string_view where) {
  std::vector<char32_t> out;
  const auto* p = reinterpret_cast<const utf8proc_uint8_t*>(text.data());
  utf8proc_ssize_t left = static_cast<utf8proc_ssize_t>(text.size());
  while (left > 0) {
    utf8proc_int32_t cp = 0;
    const utf8proc_ssize_t n = utf8proc_iterate(p, left, &cp);
    if (n <= 0) throw DataError(kModule, fmt::format("{}: text that is not UTF-8", where));
    out.push_back(static_cast<char32_t>(cp));
    p += n;
    left -= n;
  }
  return out;
}

struct CompiledRegex {
  pcre2_code* code = nullptr;
  ~CompiledRegex() { pcre2_code_free(code); }
};

// `pattern` with \s and \S spelled as Unicode's White_Space: PCRE2's \s also takes U+180E, which
// Oniguruma's (and so tokenizers') does not.
std::string with_white_space_property(std::string_view pattern) {
  std::string out;
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] != '\\' || i + 1 == pattern.size()) {
      out += pattern[i];
      continue;
    }
    const char next = pattern[++i];
    out += next == 's' ? "\\p{White_Space}" : next == 'S' ? "\\P{White_Space}" : std::string{'\\', next};
  }
  return out;
}

std::shared_ptr<CompiledRegex> compile(std::string_view pattern, bool literal, std::string_view where) {
  int error = 0;
  PCRE2_SIZE offset = 0;
  const uint32_t options = literal ? PCRE2_UTF | PCRE2_LITERAL : PCRE2_UTF | PCRE2_UCP;  // LITERAL refuses UCP
  const std::string source = literal ? std::string(pattern) : with_white_space_property(pattern);
  auto regex = std::make_shared<CompiledRegex>();
  regex->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(source.data()), source.size(), options, &error, &offset,
                              nullptr);
  if (regex->code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof message);
    throw DataError(kModule, fmt::format("{}: the pre-tokenizer's pattern {} does not compile at offset {}: {}", where,
                                         pattern, offset, reinterpret_cast<char*>(message)));
  }
  pcre2_jit_compile(regex->code, PCRE2_JIT_COMPLETE);  // best effort: the interpreter gives the same matches
  return regex;
}

enum class StepKind { kByteLevel, kSplit, kDigits };

// What a Split keeps of the text around its pattern's matches: every gap and every match, each a
// piece (Isolated; inverted the same, as tokenizers has it); the gaps only (Removed); or the
// matches only (Removed, inverted: what the pattern does not match is removed, as GPT-4o-style
// files split).
enum class SplitKeeps { kBoth, kGaps, kMatches };

struct PreTokenizerStep {
  StepKind kind = StepKind::kByteLevel;
  bool add_prefix_space = false;        // ByteLevel
  SplitKeeps keeps = SplitKeeps::kBoth; // Split
  bool individual_digits = false;       // Digits
  std::shared_ptr<CompiledRegex> regex; // ByteLevel with use_regex, Split
};

// Appends the pieces of `text` around the matches of `regex`, and the matches, as `keeps` says.
void split_on(const std::string& text, const CompiledRegex& regex, SplitKeeps keeps, std::vector<std::string>& out) {
  std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> match(
      pcre2_match_data_create_from_pattern(regex.code, nullptr), &pcre2_match_data_free);
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t last = 0, from = 0;
  while (from <= text.size()) {
    // The text was checked once (encode()); checking it again at every match made splitting quadratic.
    const int rc = pcre2_match(regex.code, subject, text.size(), from, PCRE2_NO_UTF_CHECK, match.get(), nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(rc, message, sizeof message);
      throw DataError(kModule, fmt::format("pre-tokenizing text: {}", reinterpret_cast<char*>(message)));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(match.get());
    if (ov[1] == ov[0]) {  // an empty match splits nothing: look again one character on
      from = ov[0] + 1;
      while (from < text.size() && (static_cast<unsigned char>(text[from]) & 0xC0) == 0x80) ++from;
      continue;
    }
    if (ov[0] > last && keeps != SplitKeeps::kMatches) out.push_back(text.substr(last, ov[0] - last));
    if (keeps != SplitKeeps::kGaps) out.push_back(text.substr(ov[0], ov[1] - ov[0]));
    last = from = ov[1];
  }
  if (last < text.size() && keeps != SplitKeeps::kMatches) out.push_back(text.substr(last));
}

// Digits: runs of numbers (each alone when `individual`) and of the rest. A number is what Rust's
// char::is_numeric says (Unicode Nd, Nl, No), as in tokenizers.
void split_digits(const std::string& text, bool individual, std::vector<std::string>& out) {
  auto numeric = [](utf8proc_int32_t cp) {
    const utf8proc_category_t c = utf8proc_category(cp);
    return c == UTF8PROC_CATEGORY_ND || c == UTF8PROC_CATEGORY_NL || c == UTF8PROC_CATEGORY_NO;
  };
  const auto* bytes = reinterpret_cast<const utf8proc_uint8_t*>(text.data());
  const auto size = static_cast<utf8proc_ssize_t>(text.size());
  utf8proc_ssize_t start = 0;
  int kind = -1;  // of the run under way: 1 numeric, 0 not
  for (utf8proc_ssize_t i = 0; i < size;) {
    utf8proc_int32_t cp = 0;
    const utf8proc_ssize_t n = std::max<utf8proc_ssize_t>(1, utf8proc_iterate(bytes + i, size - i, &cp));
    const int here = numeric(cp) ? 1 : 0;
    if (kind >= 0 && (here != kind || (here == 1 && individual))) {
      out.push_back(text.substr(static_cast<size_t>(start), static_cast<size_t>(i - start)));
      start = i;
    }
    kind = here;
    i += n;
  }
  if (start < size) out.push_back(text.substr(static_cast<size_t>(start)));
}

bool flag(const json& object, const char* key, bool fallback) {
  auto it = object.find(key);
  return it == object.end() || it->is_null() ? fallback : it->get<bool>();
}

void read_normalizer(const json& n, std::vector<int>& out, std::string_view where) {
  if (n.is_null()) return;
  const std::string type = n.value("type", "");
  static const std::map<std::string, int> kForms = {{"NFC", UTF8PROC_COMPOSE},
                                                     {"NFD", UTF8PROC_DECOMPOSE},
                                                     {"NFKC", UTF8PROC_COMPOSE | UTF8PROC_COMPAT},
                                                     {"NFKD", UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT}};
  if (type == "Sequence") {
    for (const json& each : n.at("normalizers")) read_normalizer(each, out, where);
  } else if (auto form = kForms.find(type); form != kForms.end()) {
    out.push_back(UTF8PROC_STABLE | form->second);
  } else {
    throw DataError(kModule, fmt::format("{}: normalizer \"{}\" is not supported (loco reads NFC, NFD, NFKC, NFKD "
                                         "and Sequence)", where, type));
  }
}

void read_pre_tokenizer(const json& p, std::vector<PreTokenizerStep>& out, std::string_view where) {
  const std::string type = p.value("type", "");
  PreTokenizerStep step;
  if (type == "Sequence") {
    for (const json& each : p.at("pretokenizers")) read_pre_tokenizer(each, out, where);
    return;
  } else if (type == "ByteLevel") {
    step.kind = StepKind::kByteLevel;
    step.add_prefix_space = flag(p, "add_prefix_space", false);
    if (flag(p, "use_regex", true)) step.regex = compile(kGpt2Pattern, false, where);
  } else if (type == "Split") {
    step.kind = StepKind::kSplit;
    const std::string behavior = p.value("behavior", "Isolated");
    if (behavior != "Isolated" && behavior != "Removed") {
      throw DataError(kModule, fmt::format("{}: a Split pre-tokenizer with behavior {} is not supported (loco reads "
                                           "Isolated and Removed)", where, behavior));
    }
    const bool invert = flag(p, "invert", false);
    step.keeps = behavior == "Isolated" ? SplitKeeps::kBoth : invert ? SplitKeeps::kMatches : SplitKeeps::kGaps;
    const json& pattern = p.at("pattern");
    const bool literal = pattern.contains("String");
    step.regex = compile(pattern.at(literal ? "String" : "Regex").get<std::string>(), literal, where);
  } else if (type == "Digits") {
    step.kind = StepKind::kDigits;
    step.individual_digits = flag(p, "individual_digits", false);
  } else {
    throw DataError(kModule, fmt::format("{}: pre-tokenizer \"{}\" is not supported (loco reads ByteLevel, Split, "
                                         "Digits and Sequence)", where, type));
  }
  out.push_back(std::move(step));
}

}  // namespace

struct ByteLevelBpe::Impl {
  std::unordered_map<std::string, int32_t> ids_by_bytes;  // vocabulary entries, by the bytes they stand for
  std::unordered_map<std::string, int32_t> ids_by_text;   // ... and added tokens, as the file writes them
  std::vector<std::optional<std::string>> bytes_of_id;
  std::array<int32_t, 256> byte_ids{};                    // -1: a byte the vocabulary lacks
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges;  // (left, right) -> (rank, merged id)
  std::vector<int> normalizers;                           // utf8proc options, applied in turn
  std::vector<PreTokenizerStep> steps;
  AddedTokens raw_added, normalized_added;
  std::optional<int32_t> unk;
  bool fuse_unk = false;
  bool ignore_merges = false;
  mutable std::mutex cache_mutex;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache;

  void read_model(const json& model, std::string_view where);
  void read_added_tokens(const json& added);
  void define(int32_t id, std::string bytes);
  std::string normalize(const std::string& text) const;
  std::vector<std::string> pre_tokenize(const std::string& text) const;
  void bpe(const std::string& piece, std::vector<int32_t>& out) const;
  void merge(const std::string& piece, std::vector<int32_t>& out) const;
};

void ByteLevelBpe::Impl::define(int32_t id, std::string bytes) {
  if (id < 0 || id >= kMaxTokenId) {
    throw DataError(kModule, fmt::format("token id {} is outside [0, {})", id, kMaxTokenId));
  }
  if (static_cast<size_t>(id) >= bytes_of_id.size()) bytes_of_id.resize(static_cast<size_t>(id) + 1);
  bytes_of_id[static_cast<size_t>(id)] = std::move(bytes);
}

void ByteLevelBpe::Impl::read_model(const json& model, std::string_view where) {
  if (model.value("type", "BPE") != "BPE") {
    throw DataError(kModule, fmt::format("{}: model \"{}\" is not BPE", where, model.value("type", "")));
  }
  auto text = [&](const char* key) {
    auto it = model.find(key);
    return it == model.end() || it->is_null() ? std::string() : it->get<std::string>();
  };
  const bool dropout = model.contains("dropout") && !model["dropout"].is_null() && model["dropout"].get<double>() > 0;
  if (dropout || flag(model, "byte_fallback", false) || !text("continuing_subword_prefix").empty() ||
      !text("end_of_word_suffix").empty()) {
    throw DataError(kModule, fmt::format("{}: a BPE with dropout, byte fallback or subword affixes is not the "
                                         "byte-level BPE loco reads", where));
  }
  ignore_merges = flag(model, "ignore_merges", false);
  fuse_unk = flag(model, "fuse_unk", false);
  const std::array<char32_t, 256> chars = byte_characters();
  std::unordered_map<char32_t, char> byte_of;
  for (int b = 0; b < 256; ++b) byte_of[chars[b]] = static_cast<char>(b);
  byte_ids.fill(-1);
  for (const auto& [text, id_json] : model.at("vocab").items()) {
    if (!id_json.is_number_integer()) throw DataError(kModule, fmt::format("{}: the id of \"{}\" is not an integer", where, text));
    const int32_t id = id_json.get<int32_t>();
    ids_by_text[text] = id;
    std::string bytes;
    bool byte_level = true;
    for (char32_t cp : code_points(text, where)) {
      auto it = byte_of.find(cp);
      if (it == byte_of.end()) byte_level = false;
      else bytes.push_back(it->second);
    }
    if (!byte_level) {
      define(id, text);  // can only be decoded (a special token written into the vocabulary)
      continue;
    }
    if (bytes.size() == 1) byte_ids[static_cast<unsigned char>(bytes[0])] = id;
    ids_by_bytes[bytes] = id;
    define(id, std::move(bytes));
  }
  const json& list = model.at("merges");
  for (size_t rank = 0; rank < list.size(); ++rank) {
    std::string left, right;
    if (list[rank].is_array()) {
      left = list[rank].at(0).get<std::string>();
      right = list[rank].at(1).get<std::string>();
    } else {
      const std::string line = list[rank].get<std::string>();
      const size_t space = line.find(' ');
      if (space == std::string::npos || line.find(' ', space + 1) != std::string::npos) {
        throw DataError(kModule, fmt::format("{}: merge {} \"{}\" is not two tokens", where, rank, line));
      }
      left = line.substr(0, space);
      right = line.substr(space + 1);
    }
    int32_t ids[3];
    const std::string* parts[3] = {&left, &right, nullptr};
    const std::string merged = left + right;
    parts[2] = &merged;
    for (int i = 0; i < 3; ++i) {
      auto it = ids_by_text.find(*parts[i]);
      if (it == ids_by_text.end()) {
        throw DataError(kModule, fmt::format("{}: merge {} ({} {}) needs \"{}\", which is not in the vocabulary",
                                             where, rank, left, right, *parts[i]));
      }
      ids[i] = it->second;
    }
    // A pair listed twice takes its last rank, as tokenizers' map of merges does.
    merges[(static_cast<uint64_t>(static_cast<uint32_t>(ids[0])) << 32) | static_cast<uint32_t>(ids[1])] =
        std::pair{static_cast<int32_t>(rank), ids[2]};
  }
  if (model.contains("unk_token") && model["unk_token"].is_string()) {
    auto it = ids_by_text.find(model["unk_token"].get<std::string>());
    if (it != ids_by_text.end()) unk = it->second;
  }
}

void ByteLevelBpe::Impl::read_added_tokens(const json& added) {
  for (const json& t : added) {
    if (flag(t, "single_word", false)) {
      throw DataError(kModule, fmt::format("added token \"{}\" is single_word, which loco does not read",
                                           t.at("content").get<std::string>()));
    }
    AddedToken token{t.at("content").get<std::string>(), t.at("id").get<int32_t>(), flag(t, "lstrip", false),
                     flag(t, "rstrip", false)};
    const bool special = flag(t, "special", false);
    define(token.id, token.content);
    ids_by_text[token.content] = token.id;
    if (flag(t, "normalized", !special) && !normalizers.empty()) {
      token.content = normalize(token.content);
      normalized_added.add(std::move(token));
    } else {
      raw_added.add(std::move(token));
    }
  }
}

std::string ByteLevelBpe::Impl::normalize(const std::string& text) const {
  std::string out = text;
  for (int options : normalizers) {
    utf8proc_uint8_t* mapped = nullptr;
    const utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(out.data()),
                                            static_cast<utf8proc_ssize_t>(out.size()), &mapped,
                                            static_cast<utf8proc_option_t>(options));
    if (n < 0) throw DataError(kModule, fmt::format("normalizing text: {}", utf8proc_errmsg(n)));
    out.assign(reinterpret_cast<char*>(mapped), static_cast<size_t>(n));
    std::free(mapped);
  }
  return out;
}

std::vector<std::string> ByteLevelBpe::Impl::pre_tokenize(const std::string& text) const {
  std::vector<std::string> pieces{text}, next;
  for (const PreTokenizerStep& step : steps) {
    next.clear();
    for (std::string& piece : pieces) {
      if (step.kind == StepKind::kDigits) {
        split_digits(piece, step.individual_digits, next);
        continue;
      }
      if (step.kind == StepKind::kByteLevel && step.add_prefix_space && piece.rfind(' ', 0) != 0) piece.insert(0, " ");
      if (step.regex) {
        split_on(piece, *step.regex, step.keeps, next);
      } else {
        next.push_back(std::move(piece));
      }
    }
    pieces.swap(next);
  }
  return pieces;
}

// BPE on one piece: merges the adjacent pair of lowest rank, the leftmost among equals, until none
// is left. Symbols form a list over the piece; the queue holds candidate pairs, checked when popped.
void ByteLevelBpe::Impl::merge(const std::string& piece, std::vector<int32_t>& out) const {
  struct Symbol {
    int32_t id;
    int prev, next;
    size_t len;
    bool frozen;  // a byte the vocabulary lacks: it merges with nothing
  };
  std::vector<Symbol> symbols;
  for (unsigned char b : piece) {
    // A missing byte is unk, or nothing without one (as tokenizers.js; never so in a byte-level vocabulary).
    const bool missing = byte_ids[b] < 0;
    const int index = static_cast<int>(symbols.size());
    symbols.push_back({missing ? unk.value_or(-1) : byte_ids[b], index - 1, index + 1, 1, missing});
  }
  if (symbols.empty()) return;
  symbols.back().next = -1;
  using Candidate = std::tuple<int32_t, int, int32_t, size_t, size_t>;  // rank, left, merged id, lengths
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> queue;
  auto consider = [&](int left) {
    if (left < 0 || symbols[left].next < 0) return;
    const Symbol& a = symbols[left];
    const Symbol& b = symbols[a.next];
    if (a.frozen || b.frozen) return;
    auto it = merges.find((static_cast<uint64_t>(static_cast<uint32_t>(a.id)) << 32) | static_cast<uint32_t>(b.id));
    if (it != merges.end()) queue.emplace(it->second.first, left, it->second.second, a.len, b.len);
  };
  for (int i = 0; i + 1 < static_cast<int>(symbols.size()); ++i) consider(i);
  while (!queue.empty()) {
    const auto [rank, left, merged, left_len, right_len] = queue.top();
    queue.pop();
    Symbol& a = symbols[left];
    if (a.len != left_len || a.next < 0 || symbols[a.next].len != right_len) continue;  // stale
    Symbol& b = symbols[a.next];
    a.id = merged;
    a.len += b.len;
    b.len = 0;
    a.next = b.next;
    if (a.next >= 0) symbols[a.next].prev = left;
    consider(a.prev);
    consider(left);
  }
  for (int i = 0; i >= 0; i = symbols[i].next) {
    if (symbols[i].id < 0) continue;
    if (fuse_unk && symbols[i].frozen && !out.empty() && i > 0 && symbols[symbols[i].prev].frozen) continue;
    out.push_back(symbols[i].id);
  }
}

void ByteLevelBpe::Impl::bpe(const std::string& piece, std::vector<int32_t>& out) const {
  if (piece.empty()) return;
  if (ignore_merges) {
    auto it = ids_by_bytes.find(piece);
    if (it != ids_by_bytes.end()) {
      out.push_back(it->second);
      return;
    }
  }
  const bool cacheable = piece.size() <= kMaxCachedPiece;
  if (cacheable) {
    std::lock_guard lock(cache_mutex);
    auto it = cache.find(piece);
    if (it != cache.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<int32_t> ids;
  merge(piece, ids);
  out.insert(out.end(), ids.begin(), ids.end());
  if (cacheable) {
    std::lock_guard lock(cache_mutex);
    if (cache.size() >= kMaxCacheEntries) cache.clear();
    cache.emplace(piece, std::move(ids));
  }
}

ByteLevelBpe::ByteLevelBpe(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ByteLevelBpe::~ByteLevelBpe() = default;

std::unique_ptr<ByteLevelBpe> ByteLevelBpe::parse(std::string_view json_text, std::string_view where) {
  auto impl = std::make_unique<Impl>();
  try {
    const json root = json::parse(json_text);
    read_normalizer(root.value("normalizer", json()), impl->normalizers, where);
    const json& pre = root.value("pre_tokenizer", json());
    if (!pre.is_null()) read_pre_tokenizer(pre, impl->steps, where);
    const bool byte_level = std::any_of(impl->steps.begin(), impl->steps.end(),
                                        [](const PreTokenizerStep& s) { return s.kind == StepKind::kByteLevel; });
    if (!byte_level) {
      throw DataError(kModule, fmt::format("{}: not a byte-level BPE (its pre-tokenizer has no ByteLevel step); loco "
                                           "reads a SentencePiece model from tokenizer.model instead", where));
    }
    // tokenizers runs the steps after ByteLevel on its printable stand-ins for bytes, loco on the text.
    if (impl->steps.back().kind != StepKind::kByteLevel) {
      throw DataError(kModule, fmt::format("{}: a pre-tokenizer step after ByteLevel is not supported", where));
    }
    impl->read_model(root.at("model"), where);
    impl->read_added_tokens(root.value("added_tokens", json::array()));
  } catch (const json::exception& e) {
    throw DataError(kModule, fmt::format("{}: not a tokenizer.json loco can read: {}", where, e.what()));
  }
  return std::unique_ptr<ByteLevelBpe>(new ByteLevelBpe(std::move(impl)));
}

std::vector<int32_t> ByteLevelBpe::encode(std::string_view text) const {
  check_utf8(text, "the text to encode");  // once: the regexes then skip their own check
  std::vector<int32_t> out;
  for (const Section& section : split_added(std::string(text), impl_->raw_added)) {
    if (section.token != nullptr) {
      out.push_back(section.token->id);
      continue;
    }
    if (section.text.empty()) continue;
    for (const Section& sub : split_added(impl_->normalize(section.text), impl_->normalized_added)) {
      if (sub.token != nullptr) {
        out.push_back(sub.token->id);
        continue;
      }
      if (sub.text.empty()) continue;  // all white space, stripped beside an added token
      for (const std::string& piece : impl_->pre_tokenize(sub.text)) impl_->bpe(piece, out);
    }
  }
  return out;
}

std::string ByteLevelBpe::decode(const std::vector<int32_t>& ids) const {
  std::string out;
  for (int32_t id : ids) {
    if (id < 0 || static_cast<size_t>(id) >= impl_->bytes_of_id.size() || !impl_->bytes_of_id[id]) {
      throw Error(kModule, fmt::format("cannot decode token id {}: not in the vocabulary", id));
    }
    out += *impl_->bytes_of_id[id];
  }
  return out;
}

int ByteLevelBpe::vocab_size() const { return static_cast<int>(impl_->bytes_of_id.size()); }

std::optional<int32_t> ByteLevelBpe::id_of(std::string_view token) const {
  auto it = impl_->ids_by_text.find(std::string(token));
  if (it == impl_->ids_by_text.end()) return std::nullopt;
  return it->second;
}

}  // namespace loco::data
