#include "loco/runtime/worker/hugging_face.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "loco/core/error.h"
#include "loco/core/files.h"
#include "loco/model/transformer.h"

namespace loco::runtime {
namespace {

namespace fs = std::filesystem;

const std::set<std::string> kArchitectures = {"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM"};

nlohmann::json read_json(const fs::path& path) {
  try {
    return nlohmann::json::parse(read_file(path, "hugging face"));
  } catch (const nlohmann::json::exception& e) {
    throw ConfigError("hugging face", fmt::format("{}: not valid JSON: {}", path.string(), e.what()));
  }
}

// config.json's fields, each read with its type checked.
class Fields {
 public:
  Fields(nlohmann::json json, std::string where) : json_(std::move(json)), where_(std::move(where)) {}

  bool has(const char* key) const { return json_.contains(key) && !json_[key].is_null(); }
  int64_t integer(const char* key, std::optional<int64_t> fallback = std::nullopt) const {
    if (!has(key) && fallback) return *fallback;
    if (!has(key) || !json_[key].is_number_integer() || json_[key].get<int64_t>() < 0) fail(key, "a count");
    return json_[key].get<int64_t>();
  }
  double number(const char* key, double fallback) const {
    if (!has(key)) return fallback;
    if (!json_[key].is_number()) fail(key, "a number");
    return json_[key].get<double>();
  }
  bool boolean(const char* key, bool fallback) const {
    if (!has(key)) return fallback;
    if (!json_[key].is_boolean()) fail(key, "true or false");
    return json_[key].get<bool>();
  }
  std::string text(const char* key, const std::string& fallback) const {
    if (!has(key)) return fallback;
    if (!json_[key].is_string()) fail(key, "a string");
    return json_[key].get<std::string>();
  }
  const std::string& where() const { return where_; }
  [[noreturn]] void refuse(const std::string& why) const { throw ConfigError("hugging face", fmt::format("{}: {}", where_, why)); }

 private:
  [[noreturn]] void fail(const char* key, const char* kind) const {
    refuse(fmt::format("'{}' must be {}{}", key, kind, has(key) ? fmt::format(", got {}", json_[key].dump()) : " (missing)"));
  }
  nlohmann::json json_;
  std::string where_;
};

// One object of rotary settings (rope_scaling, or transformers 5's rope_parameters) into `o`:
// default, linear or llama3 (others are refused, naming them); rope_theta and
// partial_rotary_factor where the object holds them (rope_parameters does).
void read_rotary_object(const nlohmann::json& json, const Fields& f, const char* key, model::ModelOptions& o) {
  if (!json.is_object()) f.refuse(fmt::format("'{}' must be an object", key));
  const Fields rotary(json, fmt::format("{}'s {}", f.where(), key));
  const std::string type = rotary.text("rope_type", rotary.text("type", "default"));
  if (type != "default" && type != "linear" && type != "llama3") {
    f.refuse(fmt::format("{}: rotary scaling '{}' is not supported (loco reads default, linear and llama3)", key, type));
  }
  if (rotary.number("partial_rotary_factor", 1.0) != 1.0) {
    f.refuse(fmt::format("{}: partial_rotary_factor {}: loco rotates every dimension of a head", key,
                         rotary.number("partial_rotary_factor", 1.0)));
  }
  o.rope_base = rotary.number("rope_theta", o.rope_base);
  o.rope_scaling = type == "default"  ? model::RopeScaling::kNone
                   : type == "linear" ? model::RopeScaling::kLinear
                                      : model::RopeScaling::kLlama3;
  if (type == "default") return;
  o.rope_factor = rotary.number("factor", 1.0);
  if (o.rope_scaling == model::RopeScaling::kLlama3) {
    o.rope_low_freq_factor = rotary.number("low_freq_factor", 1.0);
    o.rope_high_freq_factor = rotary.number("high_freq_factor", 4.0);
    o.rope_original_context = rotary.integer("original_max_position_embeddings", 8192);
  }
}

// Whether two models' rotary scaling is the same (their rope_theta aside).
bool same_scaling(const model::ModelOptions& a, const model::ModelOptions& b) {
  return a.rope_scaling == b.rope_scaling &&
         (a.rope_scaling == model::RopeScaling::kNone ||
          (a.rope_factor == b.rope_factor && a.rope_low_freq_factor == b.rope_low_freq_factor &&
           a.rope_high_freq_factor == b.rope_high_freq_factor && a.rope_original_context == b.rope_original_context));
}

// The rotary settings into `o`, as any writer puts them: rope_theta and rope_scaling at the top
// (transformers 4), or rope_parameters (transformers 5), which holds rope_theta and the scaling
// together, once or per layer type ({"full_attention": {...}, "sliding_attention": {...}}). Where
// a file holds both forms they must agree; settings that differ between layer types are refused
// (loco's layers share one rotary embedding).
void read_rotary(const nlohmann::json& json, const Fields& f, model::ModelOptions& o) {
  o.rope_base = f.number("rope_theta", 10000.0);
  o.rope_scaling = model::RopeScaling::kNone;
  if (f.number("partial_rotary_factor", 1.0) != 1.0) {
    f.refuse(fmt::format("partial_rotary_factor {}: loco rotates every dimension of a head", f.number("partial_rotary_factor", 1.0)));
  }
  if (f.has("rope_scaling")) read_rotary_object(json["rope_scaling"], f, "rope_scaling", o);
  if (!f.has("rope_parameters")) return;
  const auto& parameters = json["rope_parameters"];
  if (!parameters.is_object()) f.refuse("'rope_parameters' must be an object");
  const nlohmann::json* settings = &parameters;
  if (!parameters.empty() && std::all_of(parameters.begin(), parameters.end(), [](const auto& v) { return v.is_object(); })) {
    settings = &parameters.begin().value();  // one object per layer type: they must all be the same
    for (const auto& [layer_type, each] : parameters.items()) {
      if (each != *settings) {
        f.refuse(fmt::format("rope_parameters differ between layer types ({} and {}): loco's layers share one rotary "
                             "embedding", parameters.begin().key(), layer_type));
      }
    }
  }
  model::ModelOptions from_parameters = o;
  from_parameters.rope_scaling = model::RopeScaling::kNone;
  read_rotary_object(*settings, f, "rope_parameters", from_parameters);
  const bool theta_differs = f.has("rope_theta") && o.rope_base != from_parameters.rope_base;
  const bool scaling_differs = f.has("rope_scaling") && !same_scaling(o, from_parameters);
  if (theta_differs || scaling_differs) {
    f.refuse(fmt::format("rope_parameters ({}) and the top-level rope_theta/rope_scaling say different things: "
                         "which one the model was trained with is unclear", settings->dump()));
  }
  o = from_parameters;
}

// config.json's fields that loco neither reads nor may ignore, refused by name: every key of the
// file is one loco reads (read_hugging_face_config), describes what the model computes in a way
// loco checks, or is one of Hugging Face's bookkeeping, generation or token-id keys that do not
// change what the model computes.
void refuse_unknown_fields(const nlohmann::json& json, const Fields& f) {
  static const std::set<std::string> kKnown = {
      // read
      "architectures", "hidden_act", "mlp_bias", "rope_theta", "rope_scaling", "rope_parameters", "partial_rotary_factor",
      "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "intermediate_size",
      "rms_norm_eps", "tie_word_embeddings", "attention_bias", "head_dim", "max_position_embeddings", "sliding_window",
      "use_sliding_window", "max_window_layers", "layer_types", "attention_dropout", "pretraining_tp", "use_mrope",
      "rope_interleaved",
      // what the model computes is the same whatever they say
      "model_type", "torch_dtype", "dtype", "transformers_version", "_name_or_path", "initializer_range", "use_cache",
      "bos_token_id", "eos_token_id", "pad_token_id", "sep_token_id", "decoder_start_token_id", "tokenizer_class",
      "return_dict", "output_attentions", "output_hidden_states", "torchscript", "use_bfloat16", "is_encoder_decoder",
      "is_decoder", "add_cross_attention", "tie_encoder_decoder", "chunk_size_feed_forward", "id2label", "label2id",
      "problem_type", "finetuning_task", "task_specific_params", "prefix", "cross_attention_hidden_size",
      "is_llama_config", "transformers.js_config", "_attn_implementation_autoset", "unsloth_version", "unsloth_fixed",
      // generation settings older writers kept in config.json
      "max_length", "min_length", "do_sample", "early_stopping", "num_beams", "num_beam_groups", "diversity_penalty",
      "temperature", "top_k", "top_p", "typical_p", "repetition_penalty", "length_penalty", "no_repeat_ngram_size",
      "encoder_no_repeat_ngram_size", "bad_words_ids", "num_return_sequences", "output_scores",
      "return_dict_in_generate", "forced_bos_token_id", "forced_eos_token_id", "remove_invalid_values",
      "exponential_decay_length_penalty", "suppress_tokens", "begin_suppress_tokens", "tf_legacy_loss", "pruned_heads"};
  std::vector<std::string> unknown;
  for (const auto& [key, value] : json.items()) {
    if (kKnown.count(key) == 0) unknown.push_back(key);
  }
  if (!unknown.empty()) {
    f.refuse(fmt::format("loco does not model {} ({}): it cannot tell what they change; hint: if they change nothing "
                         "the model computes, remove them from config.json",
                         unknown.size() == 1 ? "this field" : "these fields", fmt::join(unknown, ", ")));
  }
  if (f.boolean("use_mrope", false)) f.refuse("use_mrope: loco's rotary embedding has one set of positions, not Qwen2-VL's three");
  if (f.boolean("rope_interleaved", false)) {
    f.refuse("rope_interleaved: loco rotates a head's two halves against each other, not interleaved pairs");
  }
  if (f.number("attention_dropout", 0.0) != 0.0) {
    f.refuse(fmt::format("attention_dropout {}: loco's attention has no dropout", f.number("attention_dropout", 0.0)));
  }
  if (f.has("layer_types")) {
    if (!json["layer_types"].is_array()) f.refuse("'layer_types' must be a list");
    for (const auto& type : json["layer_types"]) {
      // A sliding layer is checked by its window (read_hugging_face_config refuses one shorter than the context).
      if (type != "full_attention" && type != "sliding_attention") {
        f.refuse(fmt::format("layer type {}: loco's layers are attention layers (full_attention, sliding_attention)", type.dump()));
      }
    }
  }
}

std::string architecture_of(const nlohmann::json& json) {
  if (!json.contains("architectures") || !json["architectures"].is_array() || json["architectures"].size() != 1 ||
      !json["architectures"][0].is_string()) {
    return "";
  }
  return json["architectures"][0].get<std::string>();
}

// A tensor name of the index: a plain file name in the folder.
bool plain_file_name(const std::string& name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos &&
         name.find('\\') == std::string::npos && name.find('\0') == std::string::npos;
}

// Every tensor of the folder, by its Hugging Face name.
std::map<std::string, torch::Tensor> read_tensors(const fs::path& folder) {
  std::set<std::string> files;
  const auto index = folder / "model.safetensors.index.json";
  if (fs::exists(index)) {
    const auto json = read_json(index);
    if (!json.contains("weight_map") || !json["weight_map"].is_object() || json["weight_map"].empty()) {
      throw DataError("hugging face", fmt::format("{}: no 'weight_map' of tensor names to shard files", index.string()));
    }
    for (const auto& [name, file] : json["weight_map"].items()) {
      if (!file.is_string() || !plain_file_name(file.get<std::string>())) {
        throw DataError("hugging face", fmt::format("{}: tensor '{}' is in {}, not a file of the folder", index.string(),
                                                    name, file.dump()));
      }
      files.insert(file.get<std::string>());
    }
  } else {
    files.insert("model.safetensors");
  }
  std::map<std::string, torch::Tensor> tensors;
  for (const auto& file : files) {
    const auto path = folder / file;
    if (!fs::exists(path)) {
      throw DataError("hugging face", fmt::format("{}: the shard {} is missing", folder.string(), file));
    }
    for (auto& [name, tensor] : load_safetensors(path).tensors) {
      if (!tensors.emplace(name, tensor).second) {
        throw DataError("hugging face", fmt::format("{}: tensor '{}' is in two shards", folder.string(), name));
      }
    }
  }
  return tensors;
}

// `tensors` into `out`: model.safetensors when they fit `shard_bytes`, else shards of at most that
// (a tensor larger than it alone in its shard), model-0000i-of-0000n.safetensors, and
// model.safetensors.index.json mapping each tensor to its shard, as transformers writes them.
void write_shards(const fs::path& out, const std::vector<TensorSource>& tensors, uint64_t shard_bytes) {
  std::vector<std::vector<TensorSource>> shards(1);
  uint64_t in_shard = 0, total = 0;
  for (const auto& t : tensors) {
    uint64_t bytes = c10::elementSize(t.dtype);
    for (const int64_t d : t.shape) bytes *= static_cast<uint64_t>(d);
    if (in_shard > 0 && in_shard + bytes > shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(t);
    in_shard += bytes;
    total += bytes;
  }
  const std::map<std::string, std::string> metadata = {{"format", "pt"}};
  if (shards.size() == 1) {
    save_safetensors_streamed(out / "model.safetensors", shards[0], metadata, Readers::kEveryone);
    return;
  }
  nlohmann::ordered_json weight_map = nlohmann::ordered_json::object();
  for (size_t i = 0; i < shards.size(); ++i) {
    const auto file = fmt::format("model-{:05}-of-{:05}.safetensors", i + 1, shards.size());
    save_safetensors_streamed(out / file, shards[i], metadata, Readers::kEveryone);
    for (const auto& t : shards[i]) weight_map[t.name] = file;
  }
  const nlohmann::ordered_json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
  write_file_atomic(out / "model.safetensors.index.json", index.dump(2) + "\n", "hugging face");
}

}  // namespace

bool is_hugging_face_folder(const fs::path& folder) {
  std::error_code error;
  return fs::is_regular_file(folder / "config.json", error) &&
         (fs::is_regular_file(folder / "model.safetensors", error) ||
          fs::is_regular_file(folder / "model.safetensors.index.json", error));
}

model::ModelOptions read_hugging_face_config(const fs::path& folder, const model::ModelOptions& base) {
  const auto path = folder / "config.json";
  if (!fs::is_regular_file(path)) {
    throw ConfigError("hugging face", fmt::format("{} has no config.json: not a Hugging Face model folder", folder.string()));
  }
  const auto json = read_json(path);
  const Fields f(json, path.string());
  const auto architecture = architecture_of(json);
  if (kArchitectures.count(architecture) == 0) {
    f.refuse(fmt::format("architecture '{}' is not one loco reads ({})", architecture, fmt::join(kArchitectures, ", ")));
  }
  if (f.text("hidden_act", "silu") != "silu") f.refuse(fmt::format("activation '{}': loco's SwiGLU uses silu", f.text("hidden_act", "")));
  if (f.boolean("mlp_bias", false)) f.refuse("biases in the MLP (mlp_bias) are not supported");
  refuse_unknown_fields(json, f);
  model::ModelOptions o = base;
  read_rotary(json, f, o);
  o.vocab_size = f.integer("vocab_size");
  o.width = f.integer("hidden_size");
  o.layers = f.integer("num_hidden_layers");
  o.heads = f.integer("num_attention_heads");
  const int64_t kv_heads = f.integer("num_key_value_heads", o.heads);
  o.kv_heads = kv_heads == o.heads ? 0 : kv_heads;
  o.mlp_hidden_size = f.integer("intermediate_size");
  o.norm_eps = f.number("rms_norm_eps", 1e-6);
  o.tie_embeddings = f.boolean("tie_word_embeddings", false);
  // Qwen2's projections of queries, keys and values have biases; Llama's attention_bias would put
  // one on the output projection too, which loco's model has not.
  o.attention_bias = architecture == "Qwen2ForCausalLM";
  if (!o.attention_bias && f.boolean("attention_bias", false)) f.refuse("biases in the attention (attention_bias) are not supported");
  o.norm = model::NormKind::kRMSNorm;
  o.position = model::PositionKind::kRope;
  o.mlp = model::MlpKind::kSwiGlu;
  o.qk_norm = false;
  if (o.heads > 0 && f.has("head_dim") && f.integer("head_dim") != o.width / o.heads) {
    f.refuse(fmt::format("head_dim {} is not hidden_size / num_attention_heads = {}", f.integer("head_dim"), o.width / o.heads));
  }
  const int64_t positions = f.integer("max_position_embeddings", o.context);
  if (o.context > positions) {
    f.refuse(fmt::format("model.context {} is longer than the model's max_position_embeddings {}", o.context, positions));
  }
  // Some layers attend through a window where use_sliding_window says so (Mistral's default) or
  // layer_types names sliding layers (transformers 5).
  const bool sliding_layers = f.has("layer_types") && std::any_of(json["layer_types"].begin(), json["layer_types"].end(),
                                                                  [](const auto& type) { return type == "sliding_attention"; });
  if (f.has("sliding_window") && (f.boolean("use_sliding_window", architecture != "Qwen2ForCausalLM") || sliding_layers) &&
      f.integer("sliding_window") < o.context) {
    f.refuse(fmt::format("its attention sees {} tokens back (sliding_window), less than model.context {}",
                         f.integer("sliding_window"), o.context));
  }
  try {
    o.validate();
  } catch (const ConfigError& e) {
    f.refuse(e.what());
  }
  return o;
}

void save_hugging_face_folder(const model::Transformer& model, const fs::path& out, SpecialTokenIds tokens,
                              const ExportOptions& options) {
  if (options.dtype != torch::kFloat32 && options.dtype != torch::kBFloat16) {
    throw ConfigError("hugging face", "export writes float32 or bfloat16 parameters");
  }
  const auto& o = model->options();
  if (o.norm != model::NormKind::kRMSNorm || o.position != model::PositionKind::kRope || o.mlp != model::MlpKind::kSwiGlu ||
      o.qk_norm) {
    throw ConfigError("hugging face", fmt::format("this model ({}, {} positions, {}{}) is not of the Llama kind: "
                                                  "Hugging Face's format needs rmsnorm, rope and swiglu, without qk_norm; "
                                                  "hint: train with --model.norm=rmsnorm --model.position=rope "
                                                  "--model.mlp=swiglu --model.qk_norm=false (configs/llama-example.toml)",
                                                  model::to_string(o.norm), model::to_string(o.position),
                                                  model::to_string(o.mlp), o.qk_norm ? ", qk_norm" : ""));
  }
  std::error_code error;
  if (fs::exists(out, error) && !fs::is_empty(out, error)) {
    throw ConfigError("hugging face", fmt::format("{} exists and is not empty: choose a new folder", out.string()));
  }
  fs::create_directories(out, error);
  if (error) throw Error("hugging face", fmt::format("cannot create {}: {}", out.string(), error.message()));
  const int64_t C = o.width, hd = o.head_dim(), q_rows = o.heads * hd, kv_rows = o.key_value_heads() * hd;
  std::map<std::string, torch::Tensor> loco;
  for (const auto& item : model->named_parameters()) loco.emplace(item.key(), item.value().detach());
  // Each tensor made when its shard is written (a slice of the fused q/k/v, in the export's dtype):
  // beyond the model, memory holds one tensor at a time.
  std::vector<TensorSource> hf;
  auto add = [&](std::string name, const std::string& of, int64_t first_row = 0, int64_t rows = -1) {
    const auto& whole = loco.at(of);
    auto shape = whole.sizes().vec();
    if (rows >= 0) shape[0] = rows;
    const auto dtype = options.dtype;
    hf.push_back({std::move(name), dtype, shape, [&whole, first_row, rows, dtype] {
                    auto t = rows >= 0 ? whole.narrow(0, first_row, rows) : whole;
                    return t.to(torch::kCPU, dtype).contiguous();
                  }});
  };
  add("model.embed_tokens.weight", "tok_emb.weight");
  for (int64_t i = 0; i < o.layers; ++i) {
    const auto h = fmt::format("model.layers.{}.", i), b = fmt::format("blocks.{}.", i);
    add(h + "self_attn.q_proj.weight", b + "attn.qkv.weight", 0, q_rows);
    add(h + "self_attn.k_proj.weight", b + "attn.qkv.weight", q_rows, kv_rows);
    add(h + "self_attn.v_proj.weight", b + "attn.qkv.weight", q_rows + kv_rows, kv_rows);
    if (o.attention_bias) {
      add(h + "self_attn.q_proj.bias", b + "attn.qkv.bias", 0, q_rows);
      add(h + "self_attn.k_proj.bias", b + "attn.qkv.bias", q_rows, kv_rows);
      add(h + "self_attn.v_proj.bias", b + "attn.qkv.bias", q_rows + kv_rows, kv_rows);
    }
    add(h + "self_attn.o_proj.weight", b + "attn.proj.weight");
    add(h + "input_layernorm.weight", b + "norm1.rms.weight");
    add(h + "post_attention_layernorm.weight", b + "norm2.rms.weight");
    add(h + "mlp.gate_proj.weight", b + "mlp.gate.weight");
    add(h + "mlp.up_proj.weight", b + "mlp.up.weight");
    add(h + "mlp.down_proj.weight", b + "mlp.down.weight");
  }
  add("model.norm.weight", "final_norm.rms.weight");
  if (!o.tie_embeddings) add("lm_head.weight", "lm_head.weight");
  try {
    write_shards(out, hf, options.shard_bytes);
  } catch (...) {
    // The folder was empty: what this call wrote goes, so that the export can be run again.
    for (const auto& entry : fs::directory_iterator(out, error)) fs::remove(entry.path(), error);
    throw;
  }
  const bool qwen2 = o.attention_bias;  // q/k/v biases: Qwen2's layout; else Llama's
  const nlohmann::json config = {
      {"architectures", nlohmann::json::array({qwen2 ? "Qwen2ForCausalLM" : "LlamaForCausalLM"})}, {"model_type", qwen2 ? "qwen2" : "llama"},
      {"vocab_size", o.vocab_size}, {"hidden_size", C}, {"num_hidden_layers", o.layers},
      {"num_attention_heads", o.heads}, {"num_key_value_heads", o.key_value_heads()}, {"head_dim", hd},
      {"intermediate_size", o.mlp_hidden()}, {"hidden_act", "silu"}, {"rms_norm_eps", o.norm_eps},
      {"rope_theta", o.rope_base}, {"max_position_embeddings", std::max(o.context, options.max_positions)},
      {"tie_word_embeddings", o.tie_embeddings},
      {"attention_bias", false}, {"use_sliding_window", false},
      {"torch_dtype", options.dtype == torch::kBFloat16 ? "bfloat16" : "float32"}};
  nlohmann::json with_tokens = config;
  if (o.rope_scaling == model::RopeScaling::kLinear) {
    with_tokens["rope_scaling"] = {{"rope_type", "linear"}, {"factor", o.rope_factor}};
  } else if (o.rope_scaling == model::RopeScaling::kLlama3) {
    with_tokens["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", o.rope_factor},
                                   {"low_freq_factor", o.rope_low_freq_factor}, {"high_freq_factor", o.rope_high_freq_factor},
                                   {"original_max_position_embeddings", o.rope_original_context}};
  }
  if (tokens.eos >= 0) with_tokens["eos_token_id"] = tokens.eos;
  if (tokens.bos >= 0) with_tokens["bos_token_id"] = tokens.bos;
  write_file_atomic(out / "config.json", with_tokens.dump(2) + "\n", "hugging face");
}

int64_t hugging_face_positions(const fs::path& folder) {
  const auto path = folder / "config.json";
  const Fields f(read_json(path), path.string());
  return f.integer("max_position_embeddings", 0);
}

NamedTensors load_hugging_face_parameters(const fs::path& folder, const model::ModelOptions& o) {
  auto tensors = read_tensors(folder);
  const int64_t C = o.width, hd = o.head_dim(), q_rows = o.heads * hd, kv_rows = o.key_value_heads() * hd;
  const int64_t V = o.vocab_size, hidden = o.mlp_hidden();
  auto take = [&](const std::string& name, std::vector<int64_t> shape) {
    auto it = tensors.find(name);
    if (it == tensors.end()) throw DataError("hugging face", fmt::format("{}: no tensor '{}'", folder.string(), name));
    auto tensor = it->second;
    tensors.erase(it);
    if (!tensor.sizes().equals(shape)) {
      throw DataError("hugging face", fmt::format("{}: '{}' has shape [{}], the model config.json describes needs [{}]",
                                                  folder.string(), name, fmt::join(tensor.sizes(), ", "), fmt::join(shape, ", ")));
    }
    return tensor.to(torch::kFloat32);
  };
  NamedTensors out;
  out.emplace_back("tok_emb.weight", take("model.embed_tokens.weight", {V, C}));
  for (int64_t i = 0; i < o.layers; ++i) {
    const auto hf = fmt::format("model.layers.{}.", i), loco = fmt::format("blocks.{}.", i);
    out.emplace_back(loco + "norm1.rms.weight", take(hf + "input_layernorm.weight", {C}));
    auto q = take(hf + "self_attn.q_proj.weight", {q_rows, C});
    auto k = take(hf + "self_attn.k_proj.weight", {kv_rows, C});
    auto v = take(hf + "self_attn.v_proj.weight", {kv_rows, C});
    out.emplace_back(loco + "attn.qkv.weight", torch::cat({q, k, v}));
    if (o.attention_bias) {
      auto bq = take(hf + "self_attn.q_proj.bias", {q_rows});
      auto bk = take(hf + "self_attn.k_proj.bias", {kv_rows});
      auto bv = take(hf + "self_attn.v_proj.bias", {kv_rows});
      out.emplace_back(loco + "attn.qkv.bias", torch::cat({bq, bk, bv}));
    }
    out.emplace_back(loco + "attn.proj.weight", take(hf + "self_attn.o_proj.weight", {C, q_rows}));
    out.emplace_back(loco + "norm2.rms.weight", take(hf + "post_attention_layernorm.weight", {C}));
    out.emplace_back(loco + "mlp.gate.weight", take(hf + "mlp.gate_proj.weight", {hidden, C}));
    out.emplace_back(loco + "mlp.up.weight", take(hf + "mlp.up_proj.weight", {hidden, C}));
    out.emplace_back(loco + "mlp.down.weight", take(hf + "mlp.down_proj.weight", {C, hidden}));
  }
  out.emplace_back("final_norm.rms.weight", take("model.norm.weight", {C}));
  if (!o.tie_embeddings) {
    out.emplace_back("lm_head.weight", take("lm_head.weight", {V, C}));
  } else {
    tensors.erase("lm_head.weight");  // some tied checkpoints store the head anyway: it is the embedding
  }
  for (const auto& [name, tensor] : tensors) {
    if (name.ends_with("rotary_emb.inv_freq")) continue;  // a buffer older checkpoints saved, computed again here
    throw DataError("hugging face", fmt::format("{}: tensor '{}' is not a part of the model config.json describes",
                                                folder.string(), name));
  }
  return out;
}

}  // namespace loco::runtime
