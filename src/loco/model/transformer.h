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

#include "loco/model/options.h"

namespace loco::model {

// RoPE's inverse frequencies, (head_dim / 2,) in float64, with the options' scaling.
torch::Tensor rope_inverse_frequencies(const ModelOptions& options);

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

struct LossParts {
  torch::Tensor loss;           // scalar to backpropagate: cross entropy + z_loss term
  torch::Tensor cross_entropy;  // scalar, nats/token
};

class TransformerImpl : public torch::nn::Module {
 public:
  // Initializes weights from `seed` with a private generator (no global RNG state is touched).
  TransformerImpl(const ModelOptions& options, uint64_t seed);

  // tokens (B, T) int64 with T <= context -> logits (B, T, vocab) in float32 (or the autocast dtype)
  torch::Tensor forward(const torch::Tensor& tokens);
  // The language-model loss of tokens (B, T) against targets (B, T): the values and gradients of
  // language_model_loss(forward(tokens), targets, z_loss), with the head and the loss computed
  // together by linear_cross_entropy, without the logits in float32 (what training on a GPU runs;
  // runtime::training_loss).
  LossParts loss(const torch::Tensor& tokens, const torch::Tensor& targets, double z_loss);
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

// logits (B, T, V), targets (B, T) int64. z_loss adds z_loss * mean(logsumexp(logits)^2)
// (PaLM; used in Streaming DiLoCo's setup). Computed in float32.
LossParts language_model_loss(const torch::Tensor& logits, const torch::Tensor& targets, double z_loss);

// language_model_loss(linear(hidden, weight), targets, z_loss) with its gradients, computed
// without the logits in float32: hidden (..., C), weight (V, C), targets (...) int64, where -100
// marks a target not scored. Rows are taken `chunk_rows` at a time (0: as many as keep one
// chunk's logits near 2^28 values); for each chunk the head's product runs in the compute dtype
// (bf16 under CUDA autocast, as the plain head would) and the gradient comes from the chunk's
// softmax, which the backward products read in that dtype. The loss: from a float32 log-softmax
// in float32; in bf16, the log of the bf16 softmax at each target (a relative error within 2^-9
// per token), so that no float32 copy of the logits is made.
// When gradients are wanted (grad mode on and hidden or weight requiring them), they are computed
// here, in the forward pass, and the backward pass only scales them: the logits of a chunk are
// freed before the next chunk's are made. On a GPU with GPT-2 small's vocabulary and batch this
// moves about 17 GB a step where the plain head and cross entropy move about 69 GB.
LossParts linear_cross_entropy(const torch::Tensor& hidden, const torch::Tensor& weight, const torch::Tensor& targets,
                               double z_loss, int64_t chunk_rows = 0);

}  // namespace loco::model
