#include "loco/runtime/worker/weights.h"
#include "loco/runtime/worker/inference_model.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <tuple>

#include "loco/core/environment.h"
#include "loco/core/error.h"
#include "loco/core/hash.h"
#include "loco/data/tokenizer.h"
#include "loco/model/precision.h"
#include "loco/runtime/store/checkpoint.h"
#include "loco/runtime/worker/hugging_face.h"
#include "loco/model/transformer.h"

namespace loco::runtime {

int64_t configure_threads(int64_t threads) {
  if (threads <= 0) {
    // loco's or torchrun's count of processes splits the cores this task has (Slurm's, when it
    // gave some: e.g. torchrun started inside one Slurm task); Slurm's own count splits the node's.
    const auto env = read_environment();
    if (env.local_processes_from_launcher) threads = env.cpus_per_task.value_or(usable_cores()) / env.local_processes;
    else if (env.cpus_per_task) threads = *env.cpus_per_task;
    else threads = usable_cores() / env.local_processes;
    threads = std::max<int64_t>(1, threads);
  }
  // With the OpenMP build of OpenBLAS (scripts/setup.sh), BLAS calls share libtorch's OpenMP
  // threads, so this one setting governs both (docs/footguns.md).
  torch::set_num_threads(static_cast<int>(threads));
  return threads;
}

model::Transformer build_model(const RunConfig& config) {
  LOCO_CHECK(config.model.vocab_size > 0, "vocab_size must be resolved before building the model");
  return model::Transformer(config.model, static_cast<uint64_t>(config.train.seed));
}

NamedTensors model_weights(const model::Transformer& model) {
  NamedTensors out;
  for (const auto& item : model->named_parameters()) out.emplace_back(item.key(), item.value());
  return out;
}

void load_model_weights(model::Transformer& model, const NamedTensors& weights, const std::string& where) {
  std::map<std::string, torch::Tensor> by_name(weights.begin(), weights.end());
  torch::NoGradGuard no_grad;
  auto params = model->named_parameters();
  for (auto& item : params) {
    auto it = by_name.find(item.key());
    if (it == by_name.end()) throw DataError("checkpoint", fmt::format("{}: no weights for '{}'", where, item.key()));
    if (!it->second.sizes().equals(item.value().sizes())) {
      throw DataError("checkpoint", fmt::format("{}: '{}' has shape [{}], the model needs [{}]", where, item.key(),
                                                fmt::join(it->second.sizes(), ", "), fmt::join(item.value().sizes(), ", ")));
    }
    item.value().copy_(it->second);
    by_name.erase(it);
  }
  if (!by_name.empty()) {
    throw DataError("checkpoint", fmt::format("{}: weights '{}' do not belong to this model", where, by_name.begin()->first));
  }
}

EvalResult evaluate(model::Transformer& model, const std::vector<data::Batch>& batches, const torch::Device& device) {
  torch::NoGradGuard no_grad;
  const bool was_training = model->is_training();
  model->eval();
  double total = 0;
  int64_t tokens = 0;
  for (const auto& batch : batches) {
    // Targets a loss leaves out (DiPaCo's routing tokens) are not scored.
    const int64_t n = (batch.targets != data::kIgnoredTarget).sum().item<int64_t>();
    if (n == 0) continue;
    model::AutocastGuard autocast(device, true);
    auto logits = model->forward(batch.inputs.to(device));
    auto loss = model::language_model_loss(logits, batch.targets.to(device), 0.0).cross_entropy;
    total += loss.item<double>() * static_cast<double>(n);
    tokens += n;
  }
  if (was_training) model->train();
  EvalResult result;
  result.tokens = tokens;
  result.loss = tokens > 0 ? total / static_cast<double>(tokens) : NAN;
  result.ppl = std::exp(result.loss);
  return result;
}

EvalResult evaluate_parameters(model::Transformer& model, const std::vector<torch::Tensor>& parameters,
                               const std::vector<data::Batch>& batches, const torch::Device& device) {
  auto live = model->parameters();
  LOCO_CHECK(live.size() == parameters.size(), "{} parameters to evaluate for a model of {}", parameters.size(), live.size());
  std::vector<torch::Tensor> own;
  {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < live.size(); ++i) {
      own.push_back(live[i].detach().clone());
      live[i].copy_(parameters[i]);
    }
  }
  auto result = evaluate(model, batches, device);
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < live.size(); ++i) live[i].copy_(own[i]);
  return result;
}

// The dataset of a run that starts from a Hugging Face folder must have been tokenized by the
// folder's own tokenizer, where the folder holds one: its tokenizer.model or its tokenizer.json
// (either may be the one `loco prepare --tokenizer` read). A folder without one cannot be checked.
void check_folder_tokenizer(const RunConfig& config, uint64_t dataset_tokenizer) {
  const std::filesystem::path folder = config.train.init_from;
  std::vector<std::string> theirs;
  for (const char* name : {"tokenizer.model", "tokenizer.json"}) {
    std::error_code error;
    if (!std::filesystem::is_regular_file(folder / name, error)) continue;
    try {
      const uint64_t hash = data::Tokenizer::load(folder / name).hash();
      if (hash == dataset_tokenizer) return;
      theirs.push_back(fmt::format("{} {}", name, hex64(hash)));
    } catch (const DataError& e) {  // one loco cannot read; the other may be the dataset's
      theirs.push_back(fmt::format("{} unreadable: {}", name, e.what()));
    }
  }
  if (theirs.empty()) return;
  throw DataError("train", fmt::format("train.init_from = {}: the dataset {} was tokenized by tokenizer {}, not by the "
                                       "folder's ({}); its token ids would mean other tokens to this model; hint: loco "
                                       "prepare --tokenizer {} --out <a new dataset folder>",
                                       folder.string(), config.data.dir, hex64(dataset_tokenizer), fmt::join(theirs, ", "),
                                       folder.string()));
}

// A Hugging Face model folder as train.init_from: config.json must describe the config's model.
void load_hugging_face_weights(model::Transformer& model, const RunConfig& config) {
  const auto& folder = config.train.init_from;
  const auto described = read_hugging_face_config(folder, config.model);
  const auto& m = config.model;
  std::vector<std::tuple<const char*, std::string, std::string>> fields = {
      {"vocab_size", std::to_string(described.vocab_size), std::to_string(m.vocab_size)},
      {"width", std::to_string(described.width), std::to_string(m.width)},
      {"layers", std::to_string(described.layers), std::to_string(m.layers)},
      {"heads", std::to_string(described.heads), std::to_string(m.heads)},
      {"kv_heads", std::to_string(described.key_value_heads()), std::to_string(m.key_value_heads())},
      {"mlp_hidden", std::to_string(described.mlp_hidden()), std::to_string(m.mlp_hidden())},
      {"tie_embeddings", described.tie_embeddings ? "true" : "false", m.tie_embeddings ? "true" : "false"},
      {"attention_bias", described.attention_bias ? "true" : "false", m.attention_bias ? "true" : "false"},
      {"norm", model::to_string(described.norm), model::to_string(m.norm)},
      {"position", model::to_string(described.position), model::to_string(m.position)},
      {"mlp", model::to_string(described.mlp), model::to_string(m.mlp)},
      {"qk_norm", described.qk_norm ? "true" : "false", m.qk_norm ? "true" : "false"},
      {"norm_eps", fmt::format("{}", described.norm_eps), fmt::format("{}", m.norm_eps)},
      {"rope_theta", fmt::format("{}", described.rope_base), fmt::format("{}", m.rope_base)},
      {"rope_scaling", model::to_string(described.rope_scaling), model::to_string(m.rope_scaling)}};
  std::vector<std::tuple<const char*, std::string, std::string>> scaling;
  if (m.rope_scaling != model::RopeScaling::kNone) {
    scaling.emplace_back("rope_factor", fmt::format("{}", described.rope_factor), fmt::format("{}", m.rope_factor));
  }
  if (m.rope_scaling == model::RopeScaling::kLlama3) {
    scaling.emplace_back("rope_low_freq_factor", fmt::format("{}", described.rope_low_freq_factor),
                         fmt::format("{}", m.rope_low_freq_factor));
    scaling.emplace_back("rope_high_freq_factor", fmt::format("{}", described.rope_high_freq_factor),
                         fmt::format("{}", m.rope_high_freq_factor));
    scaling.emplace_back("rope_original_context", std::to_string(described.rope_original_context),
                         std::to_string(m.rope_original_context));
  }
  fields.insert(fields.end(), scaling.begin(), scaling.end());
  for (const auto& [name, theirs, ours] : fields) {
    if (theirs == ours) continue;
    throw ConfigError("train", fmt::format("train.init_from = {}: its config.json has model.{} = {}, this run's config {}; "
                                           "hint: set --model.{}={}", folder, name, theirs, ours, name, theirs));
  }
  load_model_weights(model, load_hugging_face_parameters(folder, described), folder);
}

int64_t load_initial_weights(model::Transformer& model, const RunConfig& config, uint64_t tokenizer_hash) {
  if (is_hugging_face_folder(config.train.init_from)) {
    check_folder_tokenizer(config, tokenizer_hash);
    load_hugging_face_weights(model, config);
    return hugging_face_positions(config.train.init_from);
  }
  auto source = load_checkpoint(config.train.init_from);
  if (source.state.tokenizer_hash != tokenizer_hash) {
    throw DataError("train", fmt::format("train.init_from = {}: that model was trained with tokenizer {}, the dataset {} "
                                         "uses {}", config.train.init_from, hex64(source.state.tokenizer_hash),
                                         config.data.dir, hex64(tokenizer_hash)));
  }
  load_model_weights(model, inference_weights(source), source.dir.string());
  return source.state.max_positions;
}

InferenceModel load_for_inference(const std::string& checkpoint, const std::string& data_dir, const torch::Device& device) {
  InferenceModel loaded;
  loaded.checkpoint = load_checkpoint(checkpoint);
  loaded.config = parse_config(loaded.checkpoint.state.config_toml, (loaded.checkpoint.dir / "state.json").string());
  if (!data_dir.empty()) loaded.config.data.dir = data_dir;
  loaded.model = build_model(loaded.config);
  load_model_weights(loaded.model, inference_weights(loaded.checkpoint), loaded.checkpoint.dir.string());
  loaded.model->to(device);
  loaded.model->eval();
  return loaded;
}

void check_same_tokenizer(uint64_t tokenizer_hash, const std::string& what, const Checkpoint& checkpoint) {
  if (tokenizer_hash == checkpoint.state.tokenizer_hash) return;
  throw DataError("cli", fmt::format("{} uses tokenizer {}, but the checkpoint {} was trained with tokenizer {}; hint: pass "
                                     "--data with the dataset it was trained on", what, hex64(tokenizer_hash),
                                     checkpoint.dir.string(), hex64(checkpoint.state.tokenizer_hash)));
}

}  // namespace loco::runtime
