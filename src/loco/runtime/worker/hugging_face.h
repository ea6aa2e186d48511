// Models in Hugging Face's format (docs/hugging-face.md): a folder with config.json and its
// parameters in model.safetensors, or in shards listed by model.safetensors.index.json. Read for
// the Llama architecture and its kin (LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM),
// whose layers are loco's Transformer with its Llama options (RMSNorm, rotary embeddings,
// grouped-query attention, SwiGLU, q/k/v biases for Qwen2, a tied or untied head).
#pragma once

#include <filesystem>
#include <string>

#include "loco/model/options.h"
#include "loco/model/transformer_fwd.h"
#include "loco/runtime/store/safetensors.h"

namespace loco::runtime {

// Whether `folder` looks like a Hugging Face model folder: config.json beside model.safetensors or
// model.safetensors.index.json.
bool is_hugging_face_folder(const std::filesystem::path& folder);

// The model options config.json describes; `context` (loco's sequence length, at most the model's
// max_position_embeddings) and the defaults of the rest come from `base`. The rotary settings are
// read from rope_theta and rope_scaling or from transformers 5's rope_parameters. Throws
// ConfigError naming the file and the field: a missing folder or file, an architecture other than
// the Llama kind, an activation other than SiLU, rotary scaling other than linear and llama3 (or
// settings that differ between layer types or between the two forms), a sliding window shorter
// than the context, or a field loco neither reads nor knows to change nothing it computes.
model::ModelOptions read_hugging_face_config(const std::filesystem::path& folder, const model::ModelOptions& base);

// config.json's max_position_embeddings: the positions the folder's model was made for (0 when
// it says none), which an export of a model continued from it writes back.
int64_t hugging_face_positions(const std::filesystem::path& folder);

// The parameters of the folder's model under loco's names (the query, key and value projections
// fused into attn.qkv), in float32, each checked against `options`' shapes. Throws DataError naming
// the first missing shard, missing or unexpected tensor, or shape that differs.
NamedTensors load_hugging_face_parameters(const std::filesystem::path& folder, const model::ModelOptions& options);

// The tokenizer's special ids config.json records (-1: none).
struct SpecialTokenIds {
  int eos = -1;
  int bos = -1;
};

// How save_hugging_face_folder writes the parameters.
struct ExportOptions {
  torch::ScalarType dtype = torch::kFloat32;  // or torch::kBFloat16
  // A file holds at most this many bytes of parameters (transformers' default max_shard_size, 5 GB);
  // past it the folder has shards and model.safetensors.index.json.
  uint64_t shard_bytes = 5'000'000'000;
  // config.json's max_position_embeddings: the positions the model was made for where it came
  // from a folder or checkpoint that says (0: the model's context).
  int64_t max_positions = 0;
};

// Writes `model` as a Hugging Face folder `out` (created; it must not hold anything yet):
// config.json, LlamaForCausalLM (Qwen2ForCausalLM when it has q/k/v biases), and its parameters
// in `options.dtype`, in model.safetensors or in shards of at most `options.shard_bytes` with
// their index; written one tensor at a time, so that memory beyond the model holds one tensor.
// Throws ConfigError when the model is not of the Llama kind (rmsnorm, rope, swiglu, no qk_norm),
// naming what differs.
void save_hugging_face_folder(const model::Transformer& model, const std::filesystem::path& out,
                              SpecialTokenIds tokens = {}, const ExportOptions& options = {});

}  // namespace loco::runtime
