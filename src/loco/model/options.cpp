#include "loco/model/options.h"

#include <fmt/format.h>

#include <cmath>
#include <string>

#include "loco/core/error.h"

namespace loco::model {

int64_t ModelOptions::mlp_hidden() const {
  if (mlp_hidden_size > 0) return mlp_hidden_size;
  return static_cast<int64_t>(std::llround(mlp_ratio * static_cast<double>(width)));
}

void ModelOptions::validate() const {
  auto require = [](bool ok, const std::string& message) {
    if (!ok) throw ConfigError("model", message);
  };
  require(vocab_size >= 3, fmt::format("vocab_size must be >= 3 (unk, bos, eos), got {}", vocab_size));
  require(context >= 1, fmt::format("context must be >= 1, got {}", context));
  require(layers >= 1, fmt::format("layers must be >= 1, got {}", layers));
  require(width >= 1, fmt::format("width must be >= 1, got {}", width));
  require(heads >= 1 && width % heads == 0,
          fmt::format("heads must divide width: width {} is not a multiple of heads {}", width, heads));
  require(kv_heads >= 0 && heads % key_value_heads() == 0,
          fmt::format("kv_heads must divide heads: heads {} is not a multiple of kv_heads {}", heads, kv_heads));
  require(mlp_hidden_size >= 0, fmt::format("mlp_hidden must be >= 0 (0 = from mlp_ratio), got {}", mlp_hidden_size));
  require(position != PositionKind::kRope || head_dim() % 2 == 0,
          fmt::format("RoPE needs an even head dimension, got width/heads = {}", head_dim()));
  require(mlp_ratio > 0 && mlp_hidden() >= 1, fmt::format("mlp_ratio must be > 0, got {}", mlp_ratio));
  require(init_std > 0, fmt::format("init_std must be > 0, got {}", init_std));
  require(rope_base > 1, fmt::format("rope_base must be > 1, got {}", rope_base));
  require(norm_eps > 0, fmt::format("norm_eps must be > 0, got {}", norm_eps));
  require(rope_scaling == RopeScaling::kNone || rope_factor >= 1,
          fmt::format("rope_factor must be >= 1 with rope_scaling, got {}", rope_factor));
  require(rope_scaling != RopeScaling::kLlama3 || (rope_high_freq_factor > rope_low_freq_factor && rope_low_freq_factor > 0 &&
                                                    rope_original_context > 0),
          "rope_scaling = llama3 needs 0 < rope_low_freq_factor < rope_high_freq_factor and rope_original_context > 0");
}

int64_t parameter_count(const ModelOptions& o) {
  const int64_t d = o.width;
  const int64_t norm = o.norm == NormKind::kLayerNorm ? 2 * d : d;  // LayerNorm has a bias
  const int64_t embed = o.vocab_size * d + (o.position == PositionKind::kLearned ? o.context * d : 0);
  const int64_t kv = 2 * o.key_value_heads() * o.head_dim();  // key and value rows
  const int64_t attention = (d + kv) * d + (o.attention_bias ? d + kv : 0) + d * d + (o.qk_norm ? 2 * o.head_dim() : 0);
  const int64_t mlp = (o.mlp == MlpKind::kSwiGlu ? 3 : 2) * d * o.mlp_hidden();
  const int64_t head = o.tie_embeddings ? 0 : o.vocab_size * d;
  return embed + o.layers * (2 * norm + attention + mlp) + norm + head;
}

double training_flops_per_token(const ModelOptions& o) {
  const double d = static_cast<double>(o.width);
  const double kv = 2.0 * static_cast<double>(o.key_value_heads() * o.head_dim());
  const double matmul_params =
      static_cast<double>(o.layers) * ((2 * d + kv) * d + (o.mlp == MlpKind::kSwiGlu ? 3 : 2) * d * o.mlp_hidden()) +
      static_cast<double>(o.vocab_size) * d;  // the head (tied or not) is a matmul too
  // 6 FLOPs per matmul parameter per token (forward + backward), plus attention scores and
  // values: 12 * layers * T * d (PaLM, appendix B; causal masking is not discounted).
  return 6 * matmul_params + 12.0 * static_cast<double>(o.layers * o.context) * d;
}

const char* to_string(NormKind k) { return k == NormKind::kRMSNorm ? "rmsnorm" : "layernorm"; }
const char* to_string(RopeScaling k) {
  return k == RopeScaling::kNone ? "none" : k == RopeScaling::kLinear ? "linear" : "llama3";
}

const char* to_string(PositionKind k) { return k == PositionKind::kRope ? "rope" : "learned"; }
const char* to_string(MlpKind k) { return k == MlpKind::kGelu ? "gelu" : "swiglu"; }

}  // namespace loco::model
