#include "loco/model/transformer.h"

#include <ATen/CPUGeneratorImpl.h>
#include <fmt/ranges.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/version.h>

#include <algorithm>
#include <cmath>

#include "loco/core/error.h"
#include "loco/model/paths.h"
#include "loco/model/precision.h"

namespace loco::model {

// Hugging Face's _compute_default/linear/llama3_rope_parameters (transformers' modeling_rope_utils).
torch::Tensor rope_inverse_frequencies(const ModelOptions& o) {
  const int64_t half = o.head_dim() / 2;
  auto inv_freq = torch::pow(o.rope_base, -torch::arange(0, half, torch::kFloat64) / static_cast<double>(half));
  if (o.rope_scaling == RopeScaling::kLinear) return inv_freq / o.rope_factor;
  if (o.rope_scaling == RopeScaling::kNone) return inv_freq;
  const double original = static_cast<double>(o.rope_original_context);
  const double low_wavelength = original / o.rope_low_freq_factor, high_wavelength = original / o.rope_high_freq_factor;
  const auto wavelength = 2 * M_PI / inv_freq;
  auto scaled = torch::where(wavelength > low_wavelength, inv_freq / o.rope_factor, inv_freq);
  const auto smooth = (original / wavelength - o.rope_low_freq_factor) / (o.rope_high_freq_factor - o.rope_low_freq_factor);
  const auto smoothed = (1 - smooth) * scaled / o.rope_factor + smooth * scaled;
  const auto medium = (wavelength >= high_wavelength).logical_and(wavelength <= low_wavelength);
  return torch::where(medium, smoothed, scaled);
}

// ---------------------------------------------------------------------------------------------

RMSNormImpl::RMSNormImpl(int64_t dim, double eps) : eps_(eps) {
  weight = register_parameter("weight", torch::ones({dim}));
}

torch::Tensor RMSNormImpl::forward(const torch::Tensor& x) {
  // Normalize in float32 even under autocast: the mean of squares is precision-sensitive.
  auto xf = x.to(torch::kFloat32);
  auto normed = xf * torch::rsqrt(xf.pow(2).mean(-1, /*keepdim=*/true) + eps_);
  return (normed * weight).to(x.scalar_type());
}

NormImpl::NormImpl(NormKind kind, int64_t dim, double eps) {
  if (kind == NormKind::kRMSNorm) {
    rms_ = register_module("rms", RMSNorm(dim, eps));
  } else {
    layer_ = register_module("ln", torch::nn::LayerNorm(torch::nn::LayerNormOptions({dim}).eps(eps)));
  }
}

torch::Tensor NormImpl::forward(const torch::Tensor& x) { return rms_ ? rms_->forward(x) : layer_->forward(x); }

namespace {

// Rotary position embedding (Su et al. 2021), "rotate half" form.
// x (B, H, T, hd), cos/sin (T, hd/2) -> (B, H, T, hd)
torch::Tensor apply_rope(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin) {
  const int64_t half = x.size(-1) / 2;
  auto x1 = x.narrow(-1, 0, half);
  auto x2 = x.narrow(-1, half, half);
  auto c = cos.to(x.scalar_type());
  auto s = sin.to(x.scalar_type());
  return torch::cat({x1 * c - x2 * s, x2 * c + x1 * s}, -1);
}

torch::Tensor causal_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v) {
#if TORCH_VERSION_MAJOR >= 2
  return at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, /*dropout_p=*/0.0, /*is_causal=*/true);
#else
  const int64_t T = q.size(-2);
  auto scores = torch::matmul(q, k.transpose(-2, -1)) * (1.0 / std::sqrt(static_cast<double>(q.size(-1))));
  auto future = torch::ones({T, T}, torch::TensorOptions().dtype(torch::kBool).device(q.device())).triu(1);
  scores = scores.masked_fill(future, -std::numeric_limits<float>::infinity());
  return torch::matmul(torch::softmax(scores, -1), v);
#endif
}

}  // namespace

AttentionImpl::AttentionImpl(const ModelOptions& o)
    : heads_(o.heads), kv_heads_(o.key_value_heads()), head_dim_(o.head_dim()) {
  const int64_t rows = (heads_ + 2 * kv_heads_) * head_dim_;
  qkv = register_module("qkv", torch::nn::Linear(torch::nn::LinearOptions(o.width, rows).bias(o.attention_bias)));
  proj = register_module("proj", torch::nn::Linear(torch::nn::LinearOptions(o.width, o.width).bias(false)));
  if (o.qk_norm) {
    q_norm_ = register_module("q_norm", RMSNorm(head_dim_, o.norm_eps));
    k_norm_ = register_module("k_norm", RMSNorm(head_dim_, o.norm_eps));
  }
}

torch::Tensor AttentionImpl::forward(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin) {
  const int64_t B = x.size(0), T = x.size(1), C = x.size(2);
  auto parts = qkv->forward(x).view({B, T, heads_ + 2 * kv_heads_, head_dim_}).transpose(1, 2);  // (B, H+2KV, T, hd)
  auto q = parts.narrow(1, 0, heads_);
  auto k = parts.narrow(1, heads_, kv_heads_), v = parts.narrow(1, heads_ + kv_heads_, kv_heads_);
  if (q_norm_) {
    q = q_norm_->forward(q);
    k = k_norm_->forward(k);
  }
  if (cos.defined()) {
    q = apply_rope(q, cos, sin);
    k = apply_rope(k, cos, sin);
  }
  if (kv_heads_ != heads_) {  // each key/value head serves heads / kv_heads query heads in a row
    k = k.repeat_interleave(heads_ / kv_heads_, 1);
    v = v.repeat_interleave(heads_ / kv_heads_, 1);
  }
  auto y = causal_attention(q, k, v);                // (B, H, T, hd)
  y = y.transpose(1, 2).contiguous().view({B, T, C});
  return proj->forward(y);
}

MlpImpl::MlpImpl(const ModelOptions& o) : kind_(o.mlp) {
  const int64_t hidden = o.mlp_hidden();
  up = register_module("up", torch::nn::Linear(torch::nn::LinearOptions(o.width, hidden).bias(false)));
  if (kind_ == MlpKind::kSwiGlu) {
    gate = register_module("gate", torch::nn::Linear(torch::nn::LinearOptions(o.width, hidden).bias(false)));
  }
  down = register_module("down", torch::nn::Linear(torch::nn::LinearOptions(hidden, o.width).bias(false)));
}

torch::Tensor MlpImpl::forward(const torch::Tensor& x) {
  if (kind_ == MlpKind::kSwiGlu) return down->forward(torch::silu(gate->forward(x)) * up->forward(x));
  return down->forward(torch::gelu(up->forward(x), "tanh"));
}

BlockImpl::BlockImpl(const ModelOptions& o) {
  norm1 = register_module("norm1", Norm(o.norm, o.width, o.norm_eps));
  attn = register_module("attn", Attention(o));
  norm2 = register_module("norm2", Norm(o.norm, o.width, o.norm_eps));
  mlp = register_module("mlp", Mlp(o));
}

torch::Tensor BlockImpl::forward(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin) {
  auto h = x + attn->forward(norm1->forward(x), cos, sin);
  return h + mlp->forward(norm2->forward(h));
}

// ---------------------------------------------------------------------------------------------

TransformerImpl::TransformerImpl(const ModelOptions& options, uint64_t seed) : options_(options) {
  options_.validate();
  const auto& o = options_;
  tok_emb = register_module("tok_emb", torch::nn::Embedding(o.vocab_size, o.width));
  if (o.position == PositionKind::kLearned) {
    pos_emb = register_module("pos_emb", torch::nn::Embedding(o.context, o.width));
  } else {
    auto angles = torch::outer(torch::arange(0, o.context, torch::kFloat64), rope_inverse_frequencies(o));  // (context, head_dim / 2)
    rope_cos_ = register_buffer("rope_cos", angles.cos().to(torch::kFloat32));
    rope_sin_ = register_buffer("rope_sin", angles.sin().to(torch::kFloat32));
  }
  blocks = register_module("blocks", torch::nn::ModuleList());
  for (int64_t i = 0; i < o.layers; ++i) blocks->push_back(Block(o));
  final_norm = register_module("final_norm", Norm(o.norm, o.width, o.norm_eps));
  if (!o.tie_embeddings) {
    const auto head = torch::nn::LinearOptions(o.width, o.vocab_size).bias(false);
    lm_head = register_module("lm_head", torch::nn::Linear(head));
  }
  initialize(seed);
}

void TransformerImpl::initialize(uint64_t seed) {
  // GPT-2 initialization: N(0, std) for matrices, residual output projections scaled by
  // 1/sqrt(2 * layers) so the residual stream's variance does not grow with depth.
  torch::NoGradGuard no_grad;
  auto generator = at::detail::createCPUGenerator(seed);
  const double std = options_.init_std;
  const double residual_std = std / std::sqrt(2.0 * static_cast<double>(options_.layers));
  for (auto& item : named_parameters()) {
    const std::string& name = item.key();
    auto& p = item.value();
    if (p.dim() < 2) {  // norm weights stay 1, biases 0
      if (name.ends_with(".bias")) p.zero_();
      continue;
    }
    const bool residual = name.ends_with("attn.proj.weight") || name.ends_with("mlp.down.weight");
    p.normal_(0.0, residual ? residual_std : std, generator);
  }
}

torch::Tensor TransformerImpl::forward(const torch::Tensor& tokens) {
  return torch::nn::functional::linear(hidden(tokens), lm_head ? lm_head->weight : tok_emb->weight);  // (B, T, vocab)
}

LossParts TransformerImpl::loss(const torch::Tensor& tokens, const torch::Tensor& targets, double z_loss) {
  return linear_cross_entropy(hidden(tokens), lm_head ? lm_head->weight : tok_emb->weight, targets, z_loss);
}

torch::Tensor TransformerImpl::hidden(const torch::Tensor& tokens) {
  LOCO_CHECK(tokens.dim() == 2, "tokens must be (B, T), got {} dims", tokens.dim());
  const int64_t T = tokens.size(1);
  LOCO_CHECK(T <= options_.context, "sequence length {} exceeds the context {}", T, options_.context);
  auto x = tok_emb->forward(tokens);  // (B, T, C)
  torch::Tensor cos, sin;
  if (pos_emb) {
    x = x + pos_emb->forward(torch::arange(T, tokens.options()));
  } else {
    cos = rope_cos_.narrow(0, 0, T);
    sin = rope_sin_.narrow(0, 0, T);
  }
  for (const auto& block : *blocks) x = block->as<BlockImpl>()->forward(x, cos, sin);
  return final_norm->forward(x);  // (B, T, C)
}

std::vector<ParameterGroup> TransformerImpl::parameter_groups() const {
  std::vector<ParameterGroup> groups;
  groups.push_back({"embed", {}, {}});
  for (int64_t i = 0; i < options_.layers; ++i) groups.push_back({fmt::format("block.{}", i), {}, {}});
  groups.push_back({"head", {}, {}});
  for (const auto& item : named_parameters()) {
    const std::string& name = item.key();
    size_t index = 0;
    if (name.starts_with("tok_emb.") || name.starts_with("pos_emb.")) {
      index = 0;
    } else if (name.starts_with("blocks.")) {
      index = 1 + std::stoul(name.substr(7, name.find('.', 7) - 7));
    } else if (name.starts_with("final_norm.") || name.starts_with("lm_head.")) {
      index = groups.size() - 1;
    } else {
      LOCO_CHECK(false, "parameter '{}' belongs to no group", name);
    }
    groups[index].names.push_back(name);
    groups[index].parameters.push_back(item.value());
  }
  return groups;
}

std::vector<torch::Tensor> TransformerImpl::block_parameters(const std::vector<int64_t>& indices) const {
  std::vector<torch::Tensor> out;
  auto groups = parameter_groups();
  for (int64_t i : indices) {
    LOCO_CHECK(i >= 0 && i < options_.layers, "block index {} out of range [0, {})", i, options_.layers);
    auto& group = groups[static_cast<size_t>(1 + i)];
    out.insert(out.end(), group.parameters.begin(), group.parameters.end());
  }
  return out;
}

std::vector<torch::Tensor> TransformerImpl::non_block_parameters() const {
  auto groups = parameter_groups();
  std::vector<torch::Tensor> out = groups.front().parameters;
  out.insert(out.end(), groups.back().parameters.begin(), groups.back().parameters.end());
  return out;
}

LossParts language_model_loss(const torch::Tensor& logits, const torch::Tensor& targets, double z_loss) {
  auto flat = logits.reshape({-1, logits.size(-1)}).to(torch::kFloat32);  // (B*T, V)
  auto ce = torch::nn::functional::cross_entropy(flat, targets.reshape({-1}));
  if (z_loss <= 0) return {ce, ce};
  auto z = torch::logsumexp(flat, -1);
  return {ce + z_loss * z.pow(2).mean(), ce};
}

namespace {

constexpr int64_t kNotScored = -100;  // cross_entropy's ignore_index (data::kIgnoredTarget)

struct HeadLoss {
  torch::Tensor loss, cross_entropy;       // float32 scalars
  torch::Tensor grad_hidden, grad_weight;  // float32, when asked for: d loss / d hidden and / d weight
};

// linear_cross_entropy's work: hidden (N, C), weight (V, C), targets (N,) int64.
HeadLoss head_loss(const torch::Tensor& hidden, const torch::Tensor& weight, const torch::Tensor& targets, double z_loss,
                   bool gradients, int64_t chunk_rows) {
  torch::NoGradGuard no_grad;
  const auto compute = hidden.is_cuda() && cuda_autocast_enabled() ? torch::kBFloat16 : hidden.scalar_type();
  // Autocast would run the softmaxes below on float32 copies of the logits; dtypes are chosen here.
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  const auto h = hidden.to(compute), w = weight.to(compute);
  const int64_t n = h.size(0), width = h.size(1), vocab = w.size(0);
  const auto f32 = hidden.options().dtype(torch::kFloat32);
  const auto scored = targets != kNotScored;
  // Each scored row's share of the mean (NaN everywhere when no row is scored, as cross_entropy).
  const auto row_weight = scored.to(torch::kFloat32) / scored.sum().to(torch::kFloat32);
  const auto safe_targets = targets.masked_fill(scored.logical_not(), 0).unsqueeze(1);  // (N, 1)
  if (chunk_rows <= 0) chunk_rows = std::max<int64_t>(1, (int64_t{1} << 28) / vocab);

  HeadLoss out;
  auto ce = torch::zeros({}, f32), z_sum = torch::zeros({}, f32);
  if (gradients) {
    out.grad_hidden = torch::empty({n, width}, f32);
    out.grad_weight = torch::zeros({vocab, width}, f32);
  }
  for (int64_t start = 0; start < n; start += chunk_rows) {
    const int64_t rows = std::min(chunk_rows, n - start);
    const auto hc = h.narrow(0, start, rows), tc = safe_targets.narrow(0, start, rows);
    const auto wc = row_weight.narrow(0, start, rows);
    auto logits = torch::mm(hc, w.t());  // (rows, V), compute dtype
    torch::Tensor target_log_prob, probs;  // (rows,) float32; the softmax in bf16
    if (logits.scalar_type() == torch::kFloat32) {
      target_log_prob = torch::log_softmax(logits, 1).gather(1, tc).squeeze(1);
    } else {
      // In bf16 the softmax (accumulated in float32, written in bf16) serves the gradient, and
      // the loss is the log of its value at the target: within 2^-9 relatively per token, and
      // no float32 copy of the logits.
      probs = torch::softmax(logits, 1);
      target_log_prob = probs.gather(1, tc).squeeze(1).to(torch::kFloat32).log();
    }
    ce -= (target_log_prob * wc).sum();
    torch::Tensor lse;  // z-loss only: logsumexp of each row
    if (z_loss > 0) {
      lse = logits.gather(1, tc).squeeze(1).to(torch::kFloat32) - target_log_prob;
      z_sum += lse.pow(2).sum();
    }
    if (!gradients) continue;

    auto g = probs.defined() ? probs : torch::softmax(logits, 1);  // compute dtype, accumulated in float32
    logits = torch::Tensor();
    probs = torch::Tensor();
    auto scaled_hidden = hc;
    torch::Tensor row_scale;
    if (z_loss > 0) {
      // d loss / d logits = softmax * (w + 2 z lse / N) - onehot * w, for row weight w.
      g.mul_((wc + (2 * z_loss / static_cast<double>(n)) * lse).unsqueeze(1).to(g.scalar_type()));
      g.scatter_add_(1, tc, (-wc).unsqueeze(1).to(g.scalar_type()));
    } else {
      // d loss / d logits = (softmax - onehot) * w: the row weights go to the products' small side.
      g.scatter_add_(1, tc, torch::full({rows, 1}, -1.0, g.options()));
      row_scale = wc.unsqueeze(1);
      scaled_hidden = (hc.to(torch::kFloat32) * row_scale).to(compute);
    }
    auto grad_rows = torch::mm(g, w);  // (rows, C)
    out.grad_hidden.narrow(0, start, rows).copy_(row_scale.defined() ? grad_rows * row_scale : grad_rows);
    out.grad_weight.add_(torch::mm(g.t(), scaled_hidden));
  }
  out.cross_entropy = ce;
  out.loss = z_loss > 0 ? ce + z_loss * z_sum / static_cast<double>(n) : ce.clone();
  return out;
}

// The head and loss as one autograd node whose gradients were computed with the loss.
class LinearCrossEntropy : public torch::autograd::Function<LinearCrossEntropy> {
 public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& hidden,
                                                const torch::Tensor& weight, const torch::Tensor& targets, double z_loss,
                                                int64_t chunk_rows) {
    auto result = head_loss(hidden, weight, targets, z_loss, /*gradients=*/true, chunk_rows);
    ctx->saved_data["grad_hidden"] = result.grad_hidden.to(hidden.scalar_type());
    ctx->saved_data["grad_weight"] = result.grad_weight.to(weight.scalar_type());
    ctx->mark_non_differentiable({result.cross_entropy});
    return {result.loss, result.cross_entropy};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    const auto& scale = grad_outputs[0];
    if (!scale.defined()) return {torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
    return {ctx->saved_data["grad_hidden"].toTensor() * scale, ctx->saved_data["grad_weight"].toTensor() * scale,
            torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

LossParts linear_cross_entropy(const torch::Tensor& hidden, const torch::Tensor& weight, const torch::Tensor& targets,
                               double z_loss, int64_t chunk_rows) {
  LOCO_CHECK(weight.dim() == 2 && hidden.size(-1) == weight.size(1), "hidden of width {} and a head of shape {}",
             hidden.size(-1), fmt::join(weight.sizes(), "x"));
  LOCO_CHECK(targets.numel() * hidden.size(-1) == hidden.numel(), "{} targets for {} rows of hidden states",
             targets.numel(), hidden.numel() / hidden.size(-1));
  const auto rows = hidden.reshape({-1, hidden.size(-1)});
  const auto flat_targets = targets.reshape({-1}).to(torch::kInt64);
  if (!torch::GradMode::is_enabled() || !(rows.requires_grad() || weight.requires_grad())) {
    auto result = head_loss(rows, weight, flat_targets, z_loss, /*gradients=*/false, chunk_rows);
    return {result.loss, result.cross_entropy};
  }
  auto outputs = LinearCrossEntropy::apply(rows, weight, flat_targets, z_loss, chunk_rows);
  return {outputs[0], outputs[1]};
}

// paths.h: a module of a path model is the union of its parameter groups.
ParameterGroup module_parameters(const Transformer& path_model, const Module& module) {
  ParameterGroup out{module.name, {}, {}};
  for (auto& group : path_model->parameter_groups()) {
    if (std::find(module.groups.begin(), module.groups.end(), group.name) == module.groups.end()) continue;
    out.names.insert(out.names.end(), group.names.begin(), group.names.end());
    out.parameters.insert(out.parameters.end(), group.parameters.begin(), group.parameters.end());
  }
  LOCO_CHECK(!out.names.empty(), "module {} holds no parameter of this model", module.name);
  return out;
}

}  // namespace loco::model
