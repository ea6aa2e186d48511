// Decoder-only transformer language model (GPT-style), built for synchronization by parts.
//
//   tokens (B, T) -> tok_emb (+ pos_emb) -> N x Block -> final norm -> tied head -> logits (B, T, V)
//   Block: x + Attention(Norm(x)), then x + MLP(Norm(x))   (pre-norm)
//
// Parameters are addressable by part (see parameter_groups()): "embed" (token and learned position
// embeddings; the LM head is tied to the token embedding), "block.<i>" for each block i, and "head"
// (the final norm). Streaming DiLoCo fragments and DiPaCo modules are unions of these groups.
//
// Options named by the config: RMSNorm or LayerNorm, RoPE or learned positions, GELU or SwiGLU MLP,
// QK-norm (RMSNorm of queries and keys per head), grouped-query attention (fewer key/value heads),
// biases on the query/key/value projections, and an output head of its own rather than tied to the
// token embedding; with RMSNorm, RoPE and SwiGLU these make the Llama (and Qwen2) architecture. No
// dropout: runs are deterministic on CPU.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <vector>

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

// RoPE's inverse frequencies, (head_dim / 2,) in float64, with the options' scaling.
torch::Tensor rope_inverse_frequencies(const ModelOptions& options);

const char* to_string(NormKind);
const char* to_string(RopeScaling);
const char* to_string(PositionKind);
const char* to_string(MlpKind);

class RMSNormImpl : public torch::nn::Module {
 public:
  RMSNormImpl(int64_t dim, double eps);
  torch::Tensor forward(const torch::Tensor& x);  // (..., dim) -> (..., dim)
  torch::Tensor weight;

 private:
  double eps_;
};
TORCH_MODULE(RMSNorm);

// RMSNorm or LayerNorm behind one module, chosen by NormKind.
class NormImpl : public torch::nn::Module {
 public:
  NormImpl(NormKind kind, int64_t dim, double eps);
  torch::Tensor forward(const torch::Tensor& x);

 private:
  RMSNorm rms_{nullptr};
  torch::nn::LayerNorm layer_{nullptr};
};
TORCH_MODULE(Norm);

class AttentionImpl : public torch::nn::Module {
 public:
  explicit AttentionImpl(const ModelOptions& options);
  // x (B, T, C); cos/sin (T, head_dim/2) for RoPE or undefined -> (B, T, C)
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin);
  // Rows: the queries of every head, then the keys, then the values of every key/value head.
  torch::nn::Linear qkv{nullptr}, proj{nullptr};

 private:
  int64_t heads_, kv_heads_, head_dim_;
  RMSNorm q_norm_{nullptr}, k_norm_{nullptr};
};
TORCH_MODULE(Attention);

class MlpImpl : public torch::nn::Module {
 public:
  explicit MlpImpl(const ModelOptions& options);
  torch::Tensor forward(const torch::Tensor& x);  // (B, T, C) -> (B, T, C)
  torch::nn::Linear up{nullptr}, gate{nullptr}, down{nullptr};  // gate only for SwiGLU

 private:
  MlpKind kind_;
};
TORCH_MODULE(Mlp);

class BlockImpl : public torch::nn::Module {
 public:
  explicit BlockImpl(const ModelOptions& options);
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin);

  Norm norm1{nullptr}, norm2{nullptr};
  Attention attn{nullptr};
  Mlp mlp{nullptr};
};
TORCH_MODULE(Block);

// A named group of parameters: one synchronizable part of the model.
struct ParameterGroup {
  std::string name;                        // "embed", "block.<i>" or "head"
  std::vector<std::string> names;          // full parameter names, as in named_parameters()
  std::vector<torch::Tensor> parameters;   // the live tensors (same order as names)
};

class TransformerImpl : public torch::nn::Module {
 public:
  // Initializes weights from `seed` with a private generator (no global RNG state is touched).
  TransformerImpl(const ModelOptions& options, uint64_t seed);

  // tokens (B, T) int64 with T <= context -> logits (B, T, vocab) in float32 (or the autocast dtype)
  torch::Tensor forward(const torch::Tensor& tokens);
  // tokens (B, T) -> the last block's output after the final norm, (B, T, width): what the tied
  // head reads, and what DiPaCo-style routing embeds documents with.
  torch::Tensor hidden(const torch::Tensor& tokens);

  const ModelOptions& options() const { return options_; }
  int64_t num_blocks() const { return options_.layers; }

  // Every parameter exactly once, in a fixed order: embed, block.0 .. block.N-1, head.
  std::vector<ParameterGroup> parameter_groups() const;
  // The parameters of blocks `indices` (e.g. {0, 3, 6}: a strided fragment), in order.
  std::vector<torch::Tensor> block_parameters(const std::vector<int64_t>& indices) const;
  // Embeddings and final norm: everything outside the blocks.
  std::vector<torch::Tensor> non_block_parameters() const;

  torch::nn::Embedding tok_emb{nullptr};
  torch::nn::Embedding pos_emb{nullptr};  // learned positions only
  torch::nn::Linear lm_head{nullptr};     // only when the head is not tied to tok_emb
  torch::nn::ModuleList blocks{nullptr};
  Norm final_norm{nullptr};

 private:
  void initialize(uint64_t seed);
  ModelOptions options_;
  torch::Tensor rope_cos_, rope_sin_;  // (context, head_dim/2), buffers for RoPE
};
TORCH_MODULE(Transformer);

struct LossParts {
  torch::Tensor loss;           // scalar to backpropagate: cross entropy + z_loss term
  torch::Tensor cross_entropy;  // scalar, nats/token
};

// logits (B, T, V), targets (B, T) int64. z_loss adds z_loss * mean(logsumexp(logits)^2)
// (PaLM; used in Streaming DiLoCo's setup). Computed in float32.
LossParts language_model_loss(const torch::Tensor& logits, const torch::Tensor& targets, double z_loss);

}  // namespace loco::model
