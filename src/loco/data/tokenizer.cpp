#include "loco/data/tokenizer.h"

#include <algorithm>
#include <optional>
#include <utility>

#include <nlohmann/json.hpp>

#include "loco/core/error.h"
#include "loco/core/files.h"
#include "loco/core/hash.h"
#include "loco/data/sampling.h"
#include "loco/data/spm/spm_library.h"
#include "loco/data/text.h"

namespace loco::data {
namespace {

// SentencePiece silently skips training lines longer than max_sentence_length; we cut long lines
// (unwrapped paragraphs) into pieces below it instead, at a space where there is one.
constexpr size_t kMaxLineBytes = 4096;
constexpr size_t kMaxSentenceLength = 8192;

// Takes ownership of a malloc()ed buffer from libloco_spm.so and frees it there.
template <typename T>
struct SpmBuffer {
  T* data = nullptr;
  ~SpmBuffer() {
    if (data) detail::spm_library().free(data);
  }
};

std::string take_error(char* error) {
  SpmBuffer<char> owned{error};
  return error ? std::string(error) : std::string("unknown SentencePiece error");
}

bool is_blank(std::string_view s) {
  return std::all_of(s.begin(), s.end(),
                     [](char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\f' || c == '\v'; });
}

// Appends the lines of `text` to `out`, long ones cut into pieces of at most kMaxLineBytes.
void append_lines(std::string_view text, std::vector<std::string_view>& out) {
  while (!text.empty()) {
    size_t end = text.find('\n');
    std::string_view line = text.substr(0, end);
    text = end == std::string_view::npos ? std::string_view() : text.substr(end + 1);
    while (line.size() > kMaxLineBytes) {
      size_t cut = line.rfind(' ', kMaxLineBytes);
      if (cut == std::string_view::npos || cut == 0) {
        cut = kMaxLineBytes;  // no space: cut at a character boundary, never inside a UTF-8 sequence
        while (cut > 0 && (static_cast<unsigned char>(line[cut]) & 0xC0) == 0x80) --cut;
        if (cut == 0) cut = kMaxLineBytes;  // not UTF-8 at all (callers validate; never loop forever)
      }
      if (!is_blank(line.substr(0, cut))) out.push_back(line.substr(0, cut));
      line.remove_prefix(cut);
    }
    if (!is_blank(line)) out.push_back(line);
  }
}

struct NamedToken {
  std::string name;
  int id = -1;
};

// The `which` ("eos", "bos") token of the byte-level BPE `json_file`: tokenizer_config.json's
// <which>_token (a string, or an object with its content; null: none) beside it, else config.json's
// <which>_token_id (a number, or a list whose first it takes). {"", -1} when neither names one.
NamedToken special_token(const fs::path& json_file, const std::string& which, const ByteLevelBpe& bpe) {
  const fs::path dir = json_file.parent_path();
  std::error_code error;
  try {
    if (fs::exists(dir / "tokenizer_config.json", error)) {
      const auto config = nlohmann::json::parse(read_file(dir / "tokenizer_config.json", kModule));
      auto it = config.find(which + "_token");
      if (it != config.end() && it->is_null()) return {};  // "none", said where the tokenizer's settings are
      if (it != config.end()) {
        const std::string name = it->is_string() ? it->get<std::string>() : it->at("content").get<std::string>();
        const auto id = bpe.id_of(name);
        if (!id) {
          throw DataError(kModule, fmt::format("{}: {}_token \"{}\" is not a token of {}", (dir / "tokenizer_config.json").string(),
                                               which, name, json_file.string()));
        }
        return {name, *id};
      }
    }
    if (fs::exists(dir / "config.json", error)) {
      const auto config = nlohmann::json::parse(read_file(dir / "config.json", kModule));
      auto it = config.find(which + "_token_id");
      if (it != config.end() && !it->is_null()) {
        const int id = it->is_array() ? it->at(0).get<int>() : it->get<int>();
        const std::string name = id >= 0 && id < bpe.vocab_size() ? bpe.decode({id}) : std::string();
        if (name.empty() || bpe.id_of(name) != id) {
          throw DataError(kModule, fmt::format("{}: {}_token_id {} is not a token of {} that loco can name",
                                               (dir / "config.json").string(), which, id, json_file.string()));
        }
        return {name, id};
      }
    }
  } catch (const nlohmann::json::exception& e) {
    throw DataError(kModule, fmt::format("{}: reading its {} token: {}", dir.string(), which, e.what()));
  }
  return {};
}

}  // namespace

// A loaded SentencePiece model inside libloco_spm.so.
class Tokenizer::Processor {
 public:
  explicit Processor(loco_spm* handle) : handle_(handle) {}
  ~Processor() { detail::spm_library().destroy(handle_); }
  Processor(const Processor&) = delete;
  Processor& operator=(const Processor&) = delete;
  const loco_spm* handle() const { return handle_; }

 private:
  loco_spm* handle_;
};

Tokenizer::Tokenizer() = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

Tokenizer Tokenizer::train(const std::vector<std::string_view>& texts, const TokenizerTrainOptions& options) {
  if (options.vocab_size < 4) {
    throw ConfigError(kModule, fmt::format("tokenizer vocab_size = {} is too small", options.vocab_size));
  }
  if (options.num_threads < 1) {
    throw ConfigError(kModule, fmt::format("tokenizer num_threads = {} must be >= 1", options.num_threads));
  }
  if (options.max_sentences < 1) throw ConfigError(kModule, "tokenizer max_sentences must be >= 1");
  if (!(options.character_coverage > 0 && options.character_coverage <= 1)) {
    throw ConfigError(kModule, fmt::format("tokenizer character_coverage = {} must be in (0, 1]", options.character_coverage));
  }

  std::vector<std::string_view> lines;
  for (std::string_view text : texts) append_lines(text, lines);
  if (lines.empty()) throw DataError(kModule, "cannot train a tokenizer: the training text is empty");
  // Sample the lines ourselves: SentencePiece's own shuffle draws from a process-wide seed.
  if (lines.size() > options.max_sentences) {
    std::vector<uint64_t> order = detail::permutation(lines.size(), options.seed);
    order.resize(options.max_sentences);
    std::sort(order.begin(), order.end());
    std::vector<std::string_view> sampled;
    sampled.reserve(order.size());
    for (uint64_t i : order) sampled.push_back(lines[i]);
    lines = std::move(sampled);
  }

  const std::pair<const char*, std::string> kwargs[] = {
      {"model_type", "bpe"},
      {"vocab_size", std::to_string(options.vocab_size)},
      {"unk_id", "0"},
      {"bos_id", "1"},
      {"eos_id", "2"},
      {"pad_id", "-1"},
      {"byte_fallback", "true"},  // unseen characters become byte pieces, never <unk>
      {"character_coverage", fmt::format("{}", options.character_coverage)},
      {"hard_vocab_limit", "true"},  // exactly vocab_size pieces, or an error
      {"num_threads", std::to_string(options.num_threads)},
      {"input_sentence_size", "0"},  // all of them: already sampled above, deterministically
      {"shuffle_input_sentence", "false"},
      {"max_sentence_length", std::to_string(kMaxSentenceLength)},
      {"minloglevel", "2"},  // SentencePiece's INFO and WARNING chatter; failures come back as a status
  };
  std::vector<const char*> keys, values;
  for (const auto& [key, value] : kwargs) {
    keys.push_back(key);
    values.push_back(value.c_str());
  }
  std::vector<const char*> line_data;
  std::vector<size_t> line_sizes;
  line_data.reserve(lines.size());
  line_sizes.reserve(lines.size());
  for (std::string_view line : lines) {
    line_data.push_back(line.data());
    line_sizes.push_back(line.size());
  }

  const detail::SpmLibrary& spm = detail::spm_library();
  SpmBuffer<char> model;
  size_t model_size = 0;
  char* error = nullptr;
  if (spm.train(line_data.data(), line_sizes.data(), lines.size(), keys.data(), values.data(), keys.size(), &model.data,
                &model_size, &error) != 0) {
    throw Error(kModule, fmt::format("training the SentencePiece tokenizer (vocab {}, character coverage {}) on {} lines "
                                     "failed: {}. hint: a vocabulary needs at least 259 + (distinct characters kept) "
                                     "entries and enough text to learn the merges; lower the vocab size, use a larger "
                                     "corpus, or keep fewer characters (a character coverage below 1, such as 0.999 or 0.995: "
                                     "the rarest become byte pieces)",
                                     options.vocab_size, options.character_coverage, lines.size(), take_error(error)));
  }
  return from_serialized(std::string(model.data, model_size), "trained tokenizer");
}

namespace {

// The tokenizer_config.json beside a tokenizer file, as it is (empty when there is none): carried
// through datasets and exports unchanged (its chat template, padding token and the rest).
std::string settings_beside(const fs::path& model_file) {
  const fs::path file = model_file.parent_path() / "tokenizer_config.json";
  std::error_code error;
  if (!fs::is_regular_file(file, error)) return {};
  std::string text = read_file(file, kModule);
  try {
    if (!nlohmann::json::parse(text).is_object()) throw DataError(kModule, fmt::format("{}: not a JSON object", file.string()));
  } catch (const nlohmann::json::exception& e) {
    throw DataError(kModule, fmt::format("{}: not valid JSON: {}", file.string(), e.what()));
  }
  return text;
}

}  // namespace

Tokenizer Tokenizer::load(const fs::path& model_file) {
  auto tokenizer = model_file.extension() == ".json" ? load_byte_level(model_file)
                                                     : from_serialized(read_file(model_file, kModule), model_file.string());
  tokenizer.settings_ = settings_beside(model_file);
  tokenizer.read_bos_rule(model_file.string());
  return tokenizer;
}

namespace {

// The special token a tokenizer.json's post-processor puts before every text: a TemplateProcessing
// (alone or in a Sequence of processors) whose "single" template starts with a SpecialToken. Its
// id (the template's special_tokens entry), or -1 when it puts none.
int template_prefix(const nlohmann::json& post, const ByteLevelBpe& bpe) {
  if (!post.is_object()) return -1;
  const std::string type = post.value("type", "");
  if (type == "Sequence" && post.contains("processors") && post["processors"].is_array()) {
    for (const auto& each : post["processors"]) {
      if (const int id = template_prefix(each, bpe); id >= 0) return id;
    }
    return -1;
  }
  if (type != "TemplateProcessing" || !post.contains("single") || !post["single"].is_array() || post["single"].empty() ||
      !post["single"][0].contains("SpecialToken")) {
    return -1;
  }
  const std::string name = post["single"][0]["SpecialToken"].at("id").get<std::string>();
  const auto special = post.value("special_tokens", nlohmann::json::object());
  if (special.contains(name) && special[name].contains("ids") && special[name]["ids"].size() == 1) {
    return special[name]["ids"][0].get<int>();
  }
  const auto id = bpe.id_of(name);
  if (!id) throw DataError(kModule, fmt::format("its post-processor starts every text with \"{}\", not a token of it", name));
  return *id;
}

}  // namespace

void Tokenizer::read_bos_rule(std::string_view where) {
  std::optional<bool> add_bos;
  if (!settings_.empty()) {
    const auto settings = nlohmann::json::parse(settings_);
    if (settings.contains("add_bos_token") && settings["add_bos_token"].is_boolean()) add_bos = settings["add_bos_token"].get<bool>();
  }
  int template_bos = -1;
  if (bpe_) {
    try {
      const auto file = nlohmann::json::parse(serialized_);
      if (file.contains("post_processor")) template_bos = template_prefix(file["post_processor"], *bpe_);
    } catch (const nlohmann::json::exception& e) {
      throw DataError(kModule, fmt::format("{}: a malformed post_processor: {}", where, e.what()));
    } catch (const DataError& e) {
      throw DataError(kModule, fmt::format("{}: {}", where, e.what()));
    }
  }
  bos_per_document_ = add_bos.value_or(template_bos >= 0);
  if (bos_per_document_ && bos_id_ < 0) bos_id_ = template_bos;
  if (bos_per_document_ && bos_id_ < 0) {
    throw DataError(kModule, fmt::format("{}: add_bos_token is set but no bos token is named", where));
  }
}

Tokenizer Tokenizer::load_model_tokenizer(const fs::path& path) {
  std::error_code error;
  if (!fs::is_directory(path, error)) {
    if (!fs::exists(path, error)) throw DataError(kModule, fmt::format("the tokenizer {} does not exist", path.string()));
    return load(path);
  }
  if (fs::exists(path / "tokenizer.model", error)) return load(path / "tokenizer.model");
  if (fs::exists(path / "tokenizer.json", error)) return load(path / "tokenizer.json");
  throw DataError(kModule, fmt::format("{} holds neither a tokenizer.model nor a tokenizer.json", path.string()));
}

int model_vocab_size(const fs::path& path, int tokenizer_vocab) {
  std::error_code error;
  const fs::path config = (fs::is_directory(path, error) ? path : path.parent_path()) / "config.json";
  if (!fs::exists(config, error)) return tokenizer_vocab;
  try {
    const auto parsed = nlohmann::json::parse(read_file(config, kModule));
    return std::max(parsed.value("vocab_size", 0), tokenizer_vocab);
  } catch (const nlohmann::json::exception& e) {
    throw DataError(kModule, fmt::format("{}: {}", config.string(), e.what()));
  }
}

Tokenizer Tokenizer::load_byte_level(const fs::path& json_file) {
  Tokenizer tokenizer;
  tokenizer.serialized_ = read_file(json_file, kModule);
  tokenizer.bpe_ = ByteLevelBpe::parse(tokenizer.serialized_, json_file.string());
  const NamedToken eos = special_token(json_file, "eos", *tokenizer.bpe_);
  const NamedToken bos = special_token(json_file, "bos", *tokenizer.bpe_);
  if (eos.id < 0) {
    throw DataError(kModule, fmt::format("{}: no end-of-text token is named: neither tokenizer_config.json (eos_token) "
                                         "nor config.json (eos_token_id) beside it names one",
                                         json_file.string()));
  }
  tokenizer.eos_token_ = eos.name;
  tokenizer.bos_token_ = bos.name;
  tokenizer.eos_id_ = eos.id;
  tokenizer.bos_id_ = bos.id;
  tokenizer.hash_ = hash64(tokenizer.serialized_ + '\n' + eos.name + '\n' + bos.name);
  return tokenizer;
}

Tokenizer Tokenizer::from_serialized(std::string serialized_model, std::string_view where) {
  const detail::SpmLibrary& spm = detail::spm_library();
  loco_spm* handle = nullptr;
  char* error = nullptr;
  if (spm.load(serialized_model.data(), serialized_model.size(), &handle, &error) != 0) {
    throw DataError(kModule, fmt::format("{}: not a SentencePiece model: {}", where, take_error(error)));
  }
  Tokenizer tokenizer;
  tokenizer.processor_ = std::make_unique<Processor>(handle);
  int vocab = 0, unk = 0, bos = 0, eos = 0;
  spm.info(handle, &vocab, &unk, &bos, &eos);
  if (unk != 0 || bos != 1 || eos != 2) {
    throw DataError(kModule, fmt::format("{}: special token ids are unk={} bos={} eos={}, loco needs 0, 1, 2. "
                                         "hint: use a tokenizer written by loco prepare",
                                         where, unk, bos, eos));
  }
  tokenizer.hash_ = hash64(serialized_model);
  tokenizer.serialized_ = std::move(serialized_model);
  return tokenizer;
}

void Tokenizer::save(const fs::path& model_file) const {
  write_file_atomic(model_file, serialized_, kModule);
  const fs::path settings = model_file.parent_path() / "tokenizer_config.json";
  if (!settings_.empty()) return write_file_atomic(settings, settings_, kModule);
  if (!bpe_) return;
  nlohmann::json config = {{"tokenizer_class", "PreTrainedTokenizerFast"}, {"eos_token", eos_token_}};
  config["bos_token"] = bos_token_.empty() ? nlohmann::json() : nlohmann::json(bos_token_);
  write_file_atomic(settings, config.dump(2) + "\n", kModule);
}

void Tokenizer::save_hugging_face(const fs::path& folder) const {
  save(folder / file_name());
  if (bpe_ || !settings_.empty()) return;  // save() wrote its tokenizer_config.json
  const nlohmann::json config = {{"tokenizer_class", "LlamaTokenizer"}, {"unk_token", "<unk>"}, {"bos_token", "<s>"},
                                 {"eos_token", "</s>"}, {"add_bos_token", false}, {"add_eos_token", false}};
  write_file_atomic(folder / "tokenizer_config.json", config.dump(2) + "\n", kModule);
}

std::vector<int32_t> Tokenizer::encode(std::string_view text) const {
  if (bpe_) return bpe_->encode(text);
  SpmBuffer<int32_t> ids;
  size_t count = 0;
  char* error = nullptr;
  if (detail::spm_library().encode(processor_->handle(), text.data(), text.size(), &ids.data, &count, &error) != 0) {
    throw Error(kModule, fmt::format("tokenizer encode failed: {}", take_error(error)));
  }
  return std::vector<int32_t>(ids.data, ids.data + count);
}

std::vector<int32_t> Tokenizer::encode_prompt(std::string_view text) const {
  auto ids = encode(text);
  if (bos_per_document_) {
    ids.insert(ids.begin(), bos_id_);
  } else if (ids.empty()) {
    ids.push_back(eos_id_);
  }
  return ids;
}

std::string Tokenizer::decode_text(const std::vector<int32_t>& ids) const {
  if (bos_per_document_ && !ids.empty() && ids.front() == bos_id_) return decode({ids.begin() + 1, ids.end()});
  return decode(ids);
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids) const {
  if (bpe_) return bpe_->decode(ids);
  const int vocab = vocab_size();
  for (int32_t id : ids) {
    if (id < 0 || id >= vocab) {
      throw Error(kModule, fmt::format("cannot decode token id {}: outside the vocabulary [0, {})", id, vocab));
    }
  }
  SpmBuffer<char> text;
  size_t size = 0;
  char* error = nullptr;
  if (detail::spm_library().decode(processor_->handle(), ids.data(), ids.size(), &text.data, &size, &error) != 0) {
    throw Error(kModule, fmt::format("tokenizer decode failed: {}", take_error(error)));
  }
  return std::string(text.data, size);
}

int Tokenizer::vocab_size() const {
  if (bpe_) return bpe_->vocab_size();
  int vocab = 0, unk = 0, bos = 0, eos = 0;
  detail::spm_library().info(processor_->handle(), &vocab, &unk, &bos, &eos);
  return vocab;
}

}  // namespace loco::data
