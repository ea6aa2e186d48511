// loco eval | generate: a dense checkpoint, or a DiPaCo run routed to one path. loco export: a
// dense checkpoint, or one DiPaCo path, as a Hugging Face folder.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <optional>

#include "command.h"
#include "loco/core/error.h"
#include "loco/core/files.h"
#include "loco/data/batcher.h"
#include "loco/data/dataset.h"
#include "loco/data/tokenizer.h"
#include "loco/model/paths.h"
#include "loco/model/precision.h"
#include "loco/model/sampling.h"
#include "loco/runtime/dipaco/evaluation.h"
#include "loco/runtime/dipaco/inference.h"
#include "loco/runtime/dipaco/run.h"
#include "loco/runtime/worker/hugging_face.h"
#include "loco/runtime/worker/inference_model.h"
#include "loco/runtime/worker/weights.h"

namespace loco::cli {
namespace {

namespace fs = std::filesystem;

// What eval and generate share: a dense checkpoint (--checkpoint) or a DiPaCo run (--config).
class InferenceCommand : public Command {
 protected:
  void add_source_options() {
    auto* checkpoint = cmd->add_option("--checkpoint", checkpoint_path_, "checkpoint folder, or a run folder (its latest)");
    auto* config = cmd->add_option("--config", config_file_, "a DiPaCo run's config: route to one path and run only it");
    checkpoint->excludes(config);
    cmd->allow_extras();
  }
  // The DiPaCo run's config (with --section.key=value overrides), or nothing: a dense checkpoint.
  std::optional<runtime::RunConfig> dipaco_config() {
    if (config_file_.empty()) {
      if (checkpoint_path_.empty()) throw ConfigError("cli", "pass --checkpoint (a dense model) or --config (a DiPaCo run)");
      if (!cmd->remaining().empty()) {
        throw ConfigError("cli", fmt::format("unexpected arguments: {}", fmt::join(cmd->remaining(), " ")));
      }
      return std::nullopt;
    }
    auto config = load_config_with(config_file_, cmd);
    if (!data_dir_.empty()) config.data.dir = data_dir_;
    if (!runtime::path_options(config).enabled()) {
      throw ConfigError("cli", fmt::format("{} sets no dipaco.levels; hint: pass --checkpoint for a dense model", config_file_));
    }
    return config;
  }
  std::string checkpoint_path_, config_file_, data_dir_;
};

class Eval : public InferenceCommand {
 public:
  explicit Eval(CLI::App& app) {
    cmd = app.add_subcommand("eval", "Validation loss and perplexity of a checkpoint");
    add_source_options();
    cmd->add_option("--data", data_dir_, "dataset folder (default: the one the model was trained on)");
    cmd->add_option("--windows", windows_, "validation windows (default: the run's eval.windows); a DiPaCo run scores every token of its documents and "
                                 "reads these only to pick versions (dipaco.early_stopping)");
    cmd->add_option("--against", against_, "DiPaCo: dense checkpoints or run folders scored on the same routed windows");
    cmd->add_option("--json", json_, "DiPaCo: also write the scores, by path and by document, and the paired intervals "
                                     "between every two models to this file");
  }
  int run() override {
    if (auto config = dipaco_config()) return run_dipaco(*config);
    if (!against_.empty()) throw ConfigError("cli", "--against compares dense models with a DiPaCo run: pass --config");
    if (!json_.empty()) throw ConfigError("cli", "--json writes a DiPaCo run's scores: pass --config");
    const auto device = model::resolve_device("auto");
    auto loaded = runtime::load_for_inference(checkpoint_path_, data_dir_, device);
    const auto dataset = data::Dataset::open(loaded.config.data.dir);
    runtime::check_same_tokenizer(dataset.manifest().tokenizer_hash, "the dataset " + dataset.dir().string(), loaded.checkpoint);
    runtime::configure_threads(0);
    const auto batches = data::evaluation_batches(dataset.val().tokens, loaded.config.model.context,
                                                  windows_ > 0 ? windows_ : loaded.config.eval.windows,
                                                  loaded.config.eval.batch_size);
    const auto result = runtime::evaluate(loaded.model, batches, device);
    fmt::print("checkpoint {} (step {}) on {}: val_loss {:.4f}  val_ppl {:.2f}  ({} tokens); val_unigram_entropy {:.4f}\n",
               loaded.checkpoint.dir.string(), loaded.checkpoint.state.step, dataset.dir().string(), result.loss,
               result.ppl, result.tokens, dataset.manifest().val_unigram_entropy);
    return 0;
  }

 private:
  int run_dipaco(runtime::RunConfig config) {
    if (windows_ > 0) config.eval.windows = windows_;
    runtime::configure_threads(0);
    const auto evaluation = runtime::evaluate_dipaco(config, against_);
    fmt::print("{}", runtime::describe(evaluation));
    if (!json_.empty()) {
      write_file_atomic(json_, runtime::to_json(evaluation).dump(1) + "\n", "eval");
      fmt::print("eval: wrote {}\n", json_);
    }
    return 0;
  }
  int64_t windows_ = 0;
  std::vector<std::string> against_;
  std::string json_;
};

class Generate : public InferenceCommand {
 public:
  explicit Generate(CLI::App& app) {
    cmd = app.add_subcommand("generate", "Sample text from a checkpoint");
    add_source_options();
    cmd->add_option("--prompt", prompt_, "text to continue")->capture_default_str();
    cmd->add_option("--max-new-tokens", sample_.max_new_tokens, "tokens to generate")->capture_default_str()
        ->check(CLI::Range(int64_t{0}, int64_t{1} << 20));
    cmd->add_option("--temperature", sample_.temperature, "0 = greedy")->capture_default_str()->check(CLI::Range(0.0, 100.0));
    cmd->add_option("--top-k", sample_.top_k, "sample among the k most likely tokens; 0 = all")->capture_default_str()
        ->check(CLI::Range(int64_t{0}, int64_t{1} << 30));
    cmd->add_option("--seed", sample_.seed, "sampling seed")->capture_default_str();
    cmd->add_option("--data", data_dir_, "dataset folder holding the tokenizer (default: the training one)");
    cmd->add_option("--reroute-every", reroute_every_, "DiPaCo: route again every N generated tokens, on the latest "
                                                       "data.route_tokens tokens (0 = one path throughout)")
        ->check(CLI::Range(int64_t{0}, int64_t{1} << 20));
  }
  int run() override {
    if (auto config = dipaco_config()) return run_dipaco(*config);
    if (reroute_every_ > 0) throw ConfigError("cli", "--reroute-every re-routes a DiPaCo run's paths: pass --config");
    const auto device = model::resolve_device("auto");
    auto loaded = runtime::load_for_inference(checkpoint_path_, data_dir_, device);
    const auto tokenizer = data::Dataset::open_tokenizer(loaded.config.data.dir);
    const auto tokenizer_file = fs::path(loaded.config.data.dir) / tokenizer.file_name();
    runtime::check_same_tokenizer(tokenizer.hash(), tokenizer_file.string(), loaded.checkpoint);
    runtime::configure_threads(0);
    auto ids = tokenizer.encode_prompt(prompt_);
    sample_.stop_token = tokenizer.eos_id();
    auto out = model::generate(loaded.model, ids, sample_);
    if (!out.empty() && out.back() == tokenizer.eos_id()) out.pop_back();
    ids.insert(ids.end(), out.begin(), out.end());
    fmt::print("{}\n", tokenizer.decode_text(ids));
    return 0;
  }

 private:
  // DiPaCo: the router picks one path for the prompt, and only that path's modules are loaded
  // (again every --reroute-every tokens: runtime/dipaco/inference.h).
  int run_dipaco(const runtime::RunConfig& config) {
    const auto tokenizer = data::Dataset::open_tokenizer(config.data.dir);
    runtime::configure_threads(0);
    auto ids = tokenizer.encode_prompt(prompt_);
    sample_.stop_token = tokenizer.eos_id();
    runtime::PathInference paths(config);
    const auto made = paths.generate(ids, sample_, reroute_every_, model::resolve_device("auto"));
    for (const auto& [after, path] : made.paths) {
      if (after == 0) {
        fmt::print(stderr, "the router sends the prompt to path {} of the DiPaCo run {}; only its modules are loaded\n",
                   path, config.run.dir);
      } else {
        fmt::print(stderr, "after {} tokens the router sends the text to path {}\n", after, path);
      }
    }
    fmt::print("{}\n", tokenizer.decode_text(made.tokens));
    return 0;
  }
  int64_t reroute_every_ = 0;
  std::string prompt_ = "The";
  model::SampleOptions sample_;
};

class Export : public InferenceCommand {
 public:
  explicit Export(CLI::App& app) {
    cmd = app.add_subcommand("export", "Write a checkpoint's model (its global parameters), or a DiPaCo run's path, as "
                                       "a Hugging Face folder");
    add_source_options();
    cmd->add_option("--path", path_, "with --config: the DiPaCo path to write (its modules as evaluation runs them)")
        ->check(CLI::Range(int64_t{0}, int64_t{1} << 20));
    cmd->add_option("--hf", out_, "the folder to write: config.json, model.safetensors and the dataset's tokenizer (it "
                                  "must not exist, or be empty)")->required();
    cmd->add_option("--dtype", dtype_, "the parameters' type in the folder: fp32 (exact) or bf16 (half the size, as "
                                       "most published models are)")
        ->capture_default_str()->check(CLI::IsMember({"fp32", "bf16"}));
    cmd->add_option("--shard-size", export_.shard_bytes, "the most bytes of parameters a file holds; past it, shards "
                                                         "and model.safetensors.index.json (e.g. 5GB, 500MB)")
        ->transform(CLI::AsSizeValue(true))->default_str("5GB");
  }
  int run() override {
    if (auto config = dipaco_config()) {
      if (path_ < 0) throw ConfigError("cli", "--config exports one path of a DiPaCo run: pass --path N");
      const auto layout = runtime::open_run_registry(*config)->layout();
      const auto paths = layout ? static_cast<int64_t>(layout->path_modules.size()) : 0;
      if (path_ >= paths) {
        throw ConfigError("cli", fmt::format("--path {}: the DiPaCo run {} has {} paths", path_, config->run.dir, paths));
      }
      runtime::PathInference inference(*config);
      write(inference.model(path_, torch::kCPU), config->data.dir, std::nullopt,
            fmt::format("path {} of the DiPaCo run {}", path_, config->run.dir), layout->max_positions);
      return 0;
    }
    if (path_ >= 0) throw ConfigError("cli", "--path names a path of a DiPaCo run: pass --config");
    auto loaded = runtime::load_for_inference(checkpoint_path_, "", torch::kCPU);
    write(loaded.model, loaded.config.data.dir, loaded.checkpoint,
          fmt::format("{} (step {} of {})", loaded.checkpoint.dir.string(), loaded.checkpoint.state.step,
                      loaded.config.run.dir));
    return 0;
  }

 private:
  // Writes `model` and, when the dataset in `data_dir` is still there, its tokenizer (checked
  // against `checkpoint`'s when there is one). max_position_embeddings: the checkpoint's
  // positions, else `max_positions`, else (0) the model's context.
  void write(const model::Transformer& model, const std::string& data_dir,
             const std::optional<runtime::Checkpoint>& checkpoint, const std::string& what, int64_t max_positions = 0) const {
    std::optional<data::Tokenizer> tokenizer;
    std::error_code error;
    if (fs::exists(fs::path(data_dir) / "manifest.json", error)) {
      tokenizer = data::Dataset::open_tokenizer(data_dir);
      if (checkpoint) {
        runtime::check_same_tokenizer(tokenizer->hash(), (fs::path(data_dir) / tokenizer->file_name()).string(), *checkpoint);
      }
    }
    auto options = export_;
    options.dtype = dtype_ == "bf16" ? torch::kBFloat16 : torch::kFloat32;
    options.max_positions = checkpoint ? checkpoint->state.max_positions : max_positions;
    runtime::save_hugging_face_folder(model, out_,
                                      tokenizer ? runtime::SpecialTokenIds{tokenizer->eos_id(), tokenizer->bos_id()}
                                                : runtime::SpecialTokenIds{},
                                      options);
    if (tokenizer) tokenizer->save_hugging_face(out_);
    const bool sharded = fs::exists(fs::path(out_) / "model.safetensors.index.json", error);
    fmt::print("wrote {} as a Hugging Face folder {}: config.json, {} in {}{}\n", what, out_,
               sharded ? "shards with model.safetensors.index.json" : "model.safetensors", dtype_,
               tokenizer ? fmt::format(", {} and tokenizer_config.json", tokenizer->file_name())
                         : fmt::format("; no tokenizer: the dataset {} is gone", data_dir));
  }
  int64_t path_ = -1;
  std::string out_;
  std::string dtype_ = "fp32";
  runtime::ExportOptions export_;
};

}  // namespace

void add_inference_commands(CLI::App& app, Commands& commands) {
  commands.push_back(std::make_unique<Eval>(app));
  commands.push_back(std::make_unique<Generate>(app));
  commands.push_back(std::make_unique<Export>(app));
}

}  // namespace loco::cli
