// The model's options, with no torch: what a config names (the architecture and its sizes) and
// the closed-form figures of it, for code that describes a model without building one
// (transformer.h builds it).
#pragma once

#include <cstdint>

namespace loco::model {

enum class NormKind { kRMSNorm, kLayerNorm };
enum class PositionKind { kRope, kLearned };
enum class MlpKind { kGelu, kSwiGlu };
// Rotary scaling, as Hugging Face's rope_scaling: none; linear (every frequency divided by
// rope_factor); llama3 (Llama 3.1's: low frequencies divided by rope_factor, high ones kept, and a
// smooth blend between, set by the low/high frequency factors and the original context).
enum class RopeScaling { kNone, kLinear, kLlama3 };

struct ModelOptions {
  int64_t vocab_size = 4096;
  int64_t context = 128;     // maximum sequence length T
  int64_t layers = 4;
  int64_t width = 256;       // d_model
  int64_t heads = 4;         // width % heads == 0
  int64_t kv_heads = 0;      // key/value heads, dividing heads (grouped-query attention); 0 = heads
  double mlp_ratio = 4.0;    // MLP hidden width = round(mlp_ratio * width), unless mlp_hidden_size
  int64_t mlp_hidden_size = 0;  // the MLP's hidden width; 0 = from mlp_ratio
  bool tie_embeddings = true;   // the output head is the token embedding; else a matrix of its own ("head" group)
  bool attention_bias = false;  // biases on the query, key and value projections (Qwen2)
  NormKind norm = NormKind::kRMSNorm;
  PositionKind position = PositionKind::kRope;
  MlpKind mlp = MlpKind::kGelu;
  bool qk_norm = false;
  double init_std = 0.02;    // residual output projections use init_std / sqrt(2 * layers)
  double rope_base = 10000.0;  // Hugging Face's rope_theta
  RopeScaling rope_scaling = RopeScaling::kNone;
  double rope_factor = 1.0;              // linear, llama3
  double rope_low_freq_factor = 1.0;     // llama3
  double rope_high_freq_factor = 4.0;    // llama3
  int64_t rope_original_context = 8192;  // llama3: original_max_position_embeddings
  double norm_eps = 1e-5;

  int64_t head_dim() const { return width / heads; }
  int64_t key_value_heads() const { return kv_heads > 0 ? kv_heads : heads; }
  int64_t mlp_hidden() const;
  // Throws ConfigError("[model] ...") naming the offending option.
  void validate() const;
};

// Closed-form parameter count (a tied head counted once).
int64_t parameter_count(const ModelOptions& options);
// Approximate training FLOPs per token: 6 * (non-embedding matmul parameters + head) + attention.
double training_flops_per_token(const ModelOptions& options);

const char* to_string(NormKind);
const char* to_string(RopeScaling);
const char* to_string(PositionKind);
const char* to_string(MlpKind);

}  // namespace loco::model
