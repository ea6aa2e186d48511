#include "loco/runtime/worker/hugging_face.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

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
  [[noreturn]] void refuse(const std::string& why) const { throw ConfigError("hugging face", fmt::format("{}: {}", where_, why)); }

 private:
  [[noreturn]] void fail(const char* key, const char* kind) const {
    refuse(fmt::format("'{}' must be {}{}", key, kind, has(key) ? fmt::format(", got {}", json_[key].dump()) : " (missing)"));
  }
  nlohmann::json json_;
  std::string where_;
};

// config.json's rope_scaling into `o`: linear or llama3 (others are refused, naming them).
void read_rope_scaling(const nlohmann::json& json, const Fields& f, model::ModelOptions& o) {
  if (!f.has("rope_scaling")) return;
  if (!json["rope_scaling"].is_object()) f.refuse("'rope_scaling' must be an object");
  const Fields scaling(json["rope_scaling"], "its rope_scaling");
  const std::string type = scaling.text("rope_type", scaling.text("type", ""));
  if (type == "default") return;
  if (type != "linear" && type != "llama3") {
    f.refuse(fmt::format("rotary scaling '{}' is not supported (loco reads linear and llama3)", type));
  }
  o.rope_scaling = type == "linear" ? model::RopeScaling::kLinear : model::RopeScaling::kLlama3;
  o.rope_factor = scaling.number("factor", 1.0);
  if (o.rope_scaling == model::RopeScaling::kLlama3) {
    o.rope_low_freq_factor = scaling.number("low_freq_factor", 1.0);
    o.rope_high_freq_factor = scaling.number("high_freq_factor", 4.0);
    o.rope_original_context = scaling.integer("original_max_position_embeddings", 8192);
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
  model::ModelOptions o = base;
  o.rope_scaling = model::RopeScaling::kNone;
  read_rope_scaling(json, f, o);
  o.vocab_size = f.integer("vocab_size");
  o.width = f.integer("hidden_size");
  o.layers = f.integer("num_hidden_layers");
  o.heads = f.integer("num_attention_heads");
  const int64_t kv_heads = f.integer("num_key_value_heads", o.heads);
  o.kv_heads = kv_heads == o.heads ? 0 : kv_heads;
  o.mlp_hidden_size = f.integer("intermediate_size");
  o.norm_eps = f.number("rms_norm_eps", 1e-6);
  o.rope_base = f.number("rope_theta", 10000.0);
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
  if (f.has("sliding_window") && f.boolean("use_sliding_window", architecture != "Qwen2ForCausalLM") &&
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

void save_hugging_face_folder(const model::Transformer& model, const fs::path& out, SpecialTokenIds tokens) {
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
  for (const auto& item : model->named_parameters()) loco.emplace(item.key(), item.value().detach().to(torch::kCPU, torch::kFloat32));
  NamedTensors hf = {{"model.embed_tokens.weight", loco.at("tok_emb.weight")}, {"model.norm.weight", loco.at("final_norm.rms.weight")}};
  if (!o.tie_embeddings) hf.emplace_back("lm_head.weight", loco.at("lm_head.weight"));
  for (int64_t i = 0; i < o.layers; ++i) {
    const auto h = fmt::format("model.layers.{}.", i), b = fmt::format("blocks.{}.", i);
    const auto& qkv = loco.at(b + "attn.qkv.weight");
    hf.emplace_back(h + "self_attn.q_proj.weight", qkv.narrow(0, 0, q_rows).contiguous());
    hf.emplace_back(h + "self_attn.k_proj.weight", qkv.narrow(0, q_rows, kv_rows).contiguous());
    hf.emplace_back(h + "self_attn.v_proj.weight", qkv.narrow(0, q_rows + kv_rows, kv_rows).contiguous());
    if (o.attention_bias) {
      const auto& bias = loco.at(b + "attn.qkv.bias");
      hf.emplace_back(h + "self_attn.q_proj.bias", bias.narrow(0, 0, q_rows).contiguous());
      hf.emplace_back(h + "self_attn.k_proj.bias", bias.narrow(0, q_rows, kv_rows).contiguous());
      hf.emplace_back(h + "self_attn.v_proj.bias", bias.narrow(0, q_rows + kv_rows, kv_rows).contiguous());
    }
    hf.emplace_back(h + "self_attn.o_proj.weight", loco.at(b + "attn.proj.weight"));
    hf.emplace_back(h + "input_layernorm.weight", loco.at(b + "norm1.rms.weight"));
    hf.emplace_back(h + "post_attention_layernorm.weight", loco.at(b + "norm2.rms.weight"));
    hf.emplace_back(h + "mlp.gate_proj.weight", loco.at(b + "mlp.gate.weight"));
    hf.emplace_back(h + "mlp.up_proj.weight", loco.at(b + "mlp.up.weight"));
    hf.emplace_back(h + "mlp.down_proj.weight", loco.at(b + "mlp.down.weight"));
  }
  save_safetensors(out / "model.safetensors", hf, {{"format", "pt"}});
  const bool qwen2 = o.attention_bias;  // q/k/v biases: Qwen2's layout; else Llama's
  const nlohmann::json config = {
      {"architectures", nlohmann::json::array({qwen2 ? "Qwen2ForCausalLM" : "LlamaForCausalLM"})}, {"model_type", qwen2 ? "qwen2" : "llama"},
      {"vocab_size", o.vocab_size}, {"hidden_size", C}, {"num_hidden_layers", o.layers},
      {"num_attention_heads", o.heads}, {"num_key_value_heads", o.key_value_heads()}, {"head_dim", hd},
      {"intermediate_size", o.mlp_hidden()}, {"hidden_act", "silu"}, {"rms_norm_eps", o.norm_eps},
      {"rope_theta", o.rope_base}, {"max_position_embeddings", o.context}, {"tie_word_embeddings", o.tie_embeddings},
      {"attention_bias", false}, {"use_sliding_window", false}, {"torch_dtype", "float32"}};
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
