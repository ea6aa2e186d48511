// Golden parity with PyTorch: loco's model (loss and gradients), AdamW step, outer Nesterov step and
// Streaming DiLoCo merge against what PyTorch computed for the same inputs
// (tests/golden/fixtures, written by scripts/golden.py: the model from its equations in float64,
// the optimizers by torch.optim.AdamW and torch.optim.SGD(nesterov=True)). Every tensor must agree
// to 1e-5 relative (‖loco − torch‖ / ‖torch‖). And a Hugging Face model folder read by loco gives
// the logits PyTorch computed from the Llama equations for the same tensors.
#include <fmt/format.h>
#include <functional>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "loco/algorithms/streaming.h"
#include "loco/core/files.h"
#include "loco/model/transformer.h"
#include "loco/optim/adamw.h"
#include "loco/optim/outer.h"
#include "loco/runtime/store/safetensors.h"
#include "loco/runtime/worker/hugging_face.h"
#include "loco/runtime/worker/weights.h"
#include "test_util.h"

namespace loco {
namespace {

namespace fs = std::filesystem;
constexpr double kTolerance = 1e-5;

struct Fixture {
  std::map<std::string, torch::Tensor> tensors;
  std::map<std::string, std::string> metadata;
  const torch::Tensor& at(const std::string& name) const {
    auto it = tensors.find(name);
    if (it == tensors.end()) throw std::runtime_error("the fixture has no tensor " + name);
    return it->second;
  }
  double number(const std::string& key) const { return std::stod(metadata.at(key)); }
};

Fixture load(const std::string& name) {
  const auto file = runtime::load_safetensors(testing_util::source_dir() / "tests" / "golden" / "fixtures" / (name + ".safetensors"));
  Fixture f;
  for (const auto& [key, tensor] : file.tensors) f.tensors[key] = tensor;
  f.metadata = file.metadata;
  return f;
}

double relative_error(const torch::Tensor& ours, const torch::Tensor& theirs) {
  auto a = ours.detach().to(torch::kFloat64), b = theirs.to(torch::kFloat64);
  return (a - b).norm().item<double>() / std::max(b.norm().item<double>(), 1e-30);
}

model::ModelOptions options_of(const Fixture& f) {
  model::ModelOptions o;
  o.vocab_size = static_cast<int64_t>(f.number("vocab"));
  o.context = static_cast<int64_t>(f.number("context"));
  o.layers = static_cast<int64_t>(f.number("layers"));
  o.width = static_cast<int64_t>(f.number("width"));
  o.heads = static_cast<int64_t>(f.number("heads"));
  o.mlp_ratio = f.number("mlp_ratio");
  o.norm_eps = f.number("eps");
  o.rope_base = f.number("rope_base");
  o.norm = f.metadata.at("norm") == "rmsnorm" ? model::NormKind::kRMSNorm : model::NormKind::kLayerNorm;
  o.position = f.metadata.at("position") == "rope" ? model::PositionKind::kRope : model::PositionKind::kLearned;
  o.mlp = f.metadata.at("mlp") == "gelu" ? model::MlpKind::kGelu : model::MlpKind::kSwiGlu;
  o.qk_norm = f.metadata.at("qk_norm") == "True";
  if (f.metadata.count("architecture") && f.metadata.at("architecture") == "llama") {
    o.kv_heads = static_cast<int64_t>(f.number("kv_heads"));
    o.mlp_hidden_size = static_cast<int64_t>(f.number("mlp_hidden"));
    o.attention_bias = true;
    o.tie_embeddings = false;
  }
  return o;
}

class GoldenModel : public testing::TestWithParam<std::string> {};

TEST_P(GoldenModel, LossAndGradientsMatchPyTorch) {
  const auto f = load(GetParam());
  model::Transformer model(options_of(f), 7);
  int64_t loaded = 0;
  {
    torch::NoGradGuard no_grad;
    for (auto& item : model->named_parameters()) {
      item.value().copy_(f.at("param." + item.key()));
      ++loaded;
    }
  }
  int64_t fixture_params = 0;
  for (const auto& [key, _] : f.tensors) fixture_params += key.starts_with("param.") ? 1 : 0;
  ASSERT_EQ(loaded, fixture_params) << "loco's parameters and the fixture's differ in number";

  // The plain head and loss, then the fused ones that training uses (linear_cross_entropy).
  for (const bool fused : {false, true}) {
    SCOPED_TRACE(fused ? "model->loss" : "language_model_loss(model->forward)");
    model->zero_grad();
    auto parts = fused ? model->loss(f.at("tokens"), f.at("targets"), f.number("z_loss"))
                       : model::language_model_loss(model->forward(f.at("tokens")), f.at("targets"), f.number("z_loss"));
    parts.loss.backward();
    EXPECT_LT(relative_error(parts.loss, f.at("loss")[0]), kTolerance) << parts.loss.item<double>() << " vs " << f.at("loss")[0].item<double>();
    EXPECT_LT(relative_error(parts.cross_entropy, f.at("cross_entropy")[0]), kTolerance);
    for (const auto& item : model->named_parameters()) {
      ASSERT_TRUE(item.value().grad().defined()) << item.key();
      EXPECT_LT(relative_error(item.value().grad(), f.at("grad." + item.key())), kTolerance) << item.key();
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Variants, GoldenModel,
                         testing::Values("model_rmsnorm_rope_gelu", "model_layernorm_learned_swiglu_qknorm",
                                         "model_llama_gqa_bias_untied"),
                         [](const auto& info) { return info.param.substr(6); });

TEST(Golden, AdamWStepsMatchTorchOptimAdamW) {
  const auto f = load("adamw");
  auto matrix = f.at("matrix").clone().requires_grad_(true);
  auto vector = f.at("vector").clone().requires_grad_(true);
  optim::AdamWOptions o{f.number("beta1"), f.number("beta2"), f.number("eps"), f.number("weight_decay")};
  optim::AdamW adamw({{"matrix", matrix, true}, {"vector", vector, false}}, o);
  const auto lrs = f.at("lr");
  for (int64_t i = 0; i < lrs.size(0); ++i) {
    matrix.mutable_grad() = f.at(fmt::format("matrix.grad.{}", i)).clone();
    vector.mutable_grad() = f.at(fmt::format("vector.grad.{}", i)).clone();
    adamw.step(lrs[i].item<double>());
  }
  EXPECT_LT(relative_error(matrix, f.at("matrix.after")), kTolerance);
  EXPECT_LT(relative_error(vector, f.at("vector.after")), kTolerance);
}

TEST(Golden, OuterNesterovMatchesTorchSgdNesterov) {
  const auto f = load("nesterov");
  auto theta = f.at("theta").clone();
  optim::OuterOptions o = optim::default_outer_options(optim::OuterKind::kNesterov);
  o.lr = f.number("lr");
  o.momentum = f.number("momentum");
  optim::OuterOptimizer outer({"theta"}, {theta}, o);
  for (int i = 0; i < 3; ++i) outer.step({f.at(fmt::format("delta.{}", i))});
  EXPECT_LT(relative_error(theta, f.at("theta.after")), kTolerance);
}

// One worker, one fragment, H = 2, τ = 1, α from the fixture: the model is set to θ_m(2) before the
// step where the sync starts and to θ_m(3) before the step where it lands.
TEST(Golden, StreamingMergeMatchesPyTorch) {
  const auto f = load("merge");
  model::ModelOptions tiny;
  tiny.vocab_size = 4;
  tiny.context = 2;
  tiny.layers = 1;
  tiny.width = 2;
  tiny.heads = 1;
  model::Transformer model(tiny, 3);
  // The fixture's 10 values are spread over the model's first parameters; the rest stay as they are.
  auto place = [&](const torch::Tensor& values) {
    torch::NoGradGuard no_grad;
    int64_t at = 0;
    for (auto& p : model->parameters()) {
      const int64_t n = std::min(p.numel(), values.numel() - at);
      if (n <= 0) break;
      p.view(-1).narrow(0, 0, n).copy_(values.narrow(0, at, n));
      at += n;
    }
  };
  auto gather = [&](const std::vector<torch::Tensor>& tensors) {
    std::vector<torch::Tensor> flat;
    for (const auto& t : tensors) flat.push_back(t.detach().reshape(-1));
    return torch::cat(flat).narrow(0, 0, f.at("theta").numel());
  };
  place(f.at("theta"));
  algorithms::StreamingOptions o;
  o.inner_steps = 2;
  o.total_steps = 10;
  o.fragments = 1;
  o.overlap_steps = 1;
  o.merge_alpha = f.number("alpha");
  o.outer.lr = f.number("lr");
  o.outer.momentum = f.number("momentum");
  algorithms::StreamingDiLoCo sync(comm::Group::single(), o);
  sync.on_start(model, 0);
  algorithms::StepContext context{0, 8, &model};
  EXPECT_TRUE(sync.after_step(context).empty());
  place(f.at("model.at_start"));
  context.step = 1;
  EXPECT_TRUE(sync.after_step(context).empty());  // step 2: the sync starts
  place(f.at("model.at_merge"));
  context.step = 2;
  ASSERT_EQ(sync.after_step(context).size(), 1u);  // step 3: it lands, and the merge
  EXPECT_LT(relative_error(gather(*sync.evaluation_parameters()), f.at("theta.after")), kTolerance);
  EXPECT_LT(relative_error(gather(model->parameters()), f.at("model.after")), kTolerance);
}

// The logits of `options`' model with the parameters of the Hugging Face `folder`, on its reference
// tokens, and the reference's logits (float64).
std::pair<torch::Tensor, torch::Tensor> folder_logits(const fs::path& folder, const model::ModelOptions& options) {
  model::Transformer model(options, 1);
  runtime::load_model_weights(model, runtime::load_hugging_face_parameters(folder, options), folder.string());
  const auto reference = runtime::load_safetensors(folder / "reference.safetensors");
  std::map<std::string, torch::Tensor> expected(reference.tensors.begin(), reference.tensors.end());
  torch::NoGradGuard no_grad;
  return {model->forward(expected.at("tokens")).to(torch::kFloat64), expected.at("logits")};
}

// A Hugging Face folder in Qwen2's layout (config.json, two shards and their index; grouped-query
// attention, q/k/v biases, an untied head) read by loco: its logits are the reference's, computed
// in float64 from the Llama equations, to 1e-4 (float32 against float64).
TEST(HuggingFace, AFolderReadsIntoTheModelItDescribes) {
  const auto folder = testing_util::source_dir() / "tests" / "golden" / "fixtures" / "hf_qwen2";
  ASSERT_TRUE(runtime::is_hugging_face_folder(folder));
  model::ModelOptions base;
  base.context = 8;
  const auto options = runtime::read_hugging_face_config(folder, base);
  EXPECT_EQ(options.vocab_size, 64);
  EXPECT_EQ(options.key_value_heads(), 2);
  EXPECT_EQ(options.mlp_hidden(), 24);
  EXPECT_TRUE(options.attention_bias) << "Qwen2 has q/k/v biases";
  EXPECT_FALSE(options.tie_embeddings);
  const auto [logits, expected] = folder_logits(folder, options);
  EXPECT_LT((logits - expected).abs().max().item<double>(), 1e-4);
  EXPECT_LT(relative_error(logits, expected), 1e-5);
}

// Llama 3.1's rotary scaling (rope_scaling of type llama3) read from config.json: its frequencies
// in all three bands (kept, blended, divided) as the reference computes them; read without the
// scaling, the same parameters give other logits.
TEST(HuggingFace, RotaryScalingIsReadAndApplied) {
  const auto folder = testing_util::source_dir() / "tests" / "golden" / "fixtures" / "hf_qwen2_llama3_rope";
  model::ModelOptions base;
  base.context = 8;
  const auto options = runtime::read_hugging_face_config(folder, base);
  EXPECT_EQ(options.rope_scaling, model::RopeScaling::kLlama3);
  EXPECT_EQ(options.rope_factor, 8.0);
  EXPECT_EQ(options.rope_original_context, 64);
  const auto [logits, expected] = folder_logits(folder, options);
  EXPECT_LT((logits - expected).abs().max().item<double>(), 1e-4);
  auto unscaled = options;
  unscaled.rope_scaling = model::RopeScaling::kNone;
  const auto [wrong, same] = folder_logits(folder, unscaled);
  EXPECT_GT((wrong - same).abs().max().item<double>(), 1e-3) << "the scaling changes what the model computes";
  // Linear scaling divides every frequency by the factor.
  auto linear = options;
  linear.rope_scaling = model::RopeScaling::kLinear;
  EXPECT_TRUE(torch::allclose(model::rope_inverse_frequencies(linear) * 8, model::rope_inverse_frequencies(unscaled)));
}

// config.json as transformers 5 writes it: the rotary settings in rope_parameters (rope_theta and
// the scaling together, once or per layer type), no top-level rope_theta. Read, they give the
// same model as the older keys; where both forms are present and disagree, or the layer types
// differ, the folder is refused by name.
TEST(HuggingFace, RotaryParametersOfTransformersFiveAreRead) {
  const auto fixture = testing_util::source_dir() / "tests" / "golden" / "fixtures" / "hf_qwen2_llama3_rope";
  model::ModelOptions base;
  base.context = 8;
  const auto older = runtime::read_hugging_face_config(fixture, base);
  testing_util::TempDir dir;
  int folders = 0;
  // A copy of the fixture whose config.json is the fixture's changed by `edit`.
  auto folder_with = [&](const std::function<void(nlohmann::json&)>& edit) {
    const auto folder = dir.path() / std::to_string(folders++);
    fs::copy(fixture, folder);
    auto config = nlohmann::json::parse(read_file(folder / "config.json", "test"));
    edit(config);
    write_file_atomic(folder / "config.json", config.dump(2), "test");
    return folder;
  };
  const nlohmann::json parameters = {{"rope_type", "llama3"}, {"rope_theta", 10000.0}, {"factor", 8.0},
                                     {"low_freq_factor", 1.0}, {"high_freq_factor", 4.0},
                                     {"original_max_position_embeddings", 64}};
  auto transformers_5 = [&](const nlohmann::json& rope_parameters) {
    return folder_with([&](nlohmann::json& c) {
      c.erase("rope_theta");
      c.erase("rope_scaling");
      c["rope_parameters"] = rope_parameters;
    });
  };
  auto error_of = [&](const fs::path& folder) {
    try {
      runtime::read_hugging_face_config(folder, base);
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  for (const auto& form : {parameters, nlohmann::json{{"full_attention", parameters}, {"sliding_attention", parameters}}}) {
    SCOPED_TRACE(form.dump());
    const auto folder = transformers_5(form);
    const auto read = runtime::read_hugging_face_config(folder, base);
    EXPECT_EQ(read.rope_scaling, older.rope_scaling);
    EXPECT_EQ(read.rope_factor, older.rope_factor);
    EXPECT_EQ(read.rope_original_context, older.rope_original_context);
    EXPECT_EQ(read.rope_base, older.rope_base);
    EXPECT_EQ(older.rope_scaling, model::RopeScaling::kLlama3);
    const auto [logits, expected] = folder_logits(folder, read);
    EXPECT_LT((logits - expected).abs().max().item<double>(), 1e-4) << "the model the older keys describe";
  }
  const auto theta_only = transformers_5({{"rope_type", "default"}, {"rope_theta", 500000.0}});
  EXPECT_EQ(runtime::read_hugging_face_config(theta_only, base).rope_base, 500000.0);
  EXPECT_EQ(runtime::read_hugging_face_config(theta_only, base).rope_scaling, model::RopeScaling::kNone);

  auto other = parameters;
  other["rope_theta"] = 1000000.0;
  EXPECT_NE(error_of(transformers_5({{"full_attention", parameters}, {"sliding_attention", other}}))
                .find("rope_parameters differ between layer types (full_attention and sliding_attention)"),
            std::string::npos);
  EXPECT_NE(error_of(folder_with([&](nlohmann::json& c) { c["rope_parameters"] = other; }))
                .find("rope_parameters ({\"factor\""), std::string::npos)
      << "rope_theta 10000 at the top, 1000000 in rope_parameters";
  EXPECT_EQ(error_of(folder_with([&](nlohmann::json& c) { c["rope_parameters"] = parameters; })), "accepted")
      << "both forms, saying the same";
  EXPECT_EQ(error_of(folder_with([&](nlohmann::json& c) {
              c.erase("rope_scaling");
              c["rope_parameters"] = parameters;
            })),
            "accepted")
      << "the top-level rope_theta agrees; the scaling is in rope_parameters only";
  auto partial = parameters;
  partial["partial_rotary_factor"] = 0.5;
  EXPECT_NE(error_of(transformers_5(partial)).find("partial_rotary_factor 0.5: loco rotates every dimension"), std::string::npos);
  auto yarn = parameters;
  yarn["rope_type"] = "yarn";
  EXPECT_NE(error_of(transformers_5(yarn)).find("rotary scaling 'yarn' is not supported"), std::string::npos);
}

// Every field of config.json is read, checked, or one that changes nothing loco computes; any
// other is refused by name (before, a field loco does not model was ignored without a word).
TEST(HuggingFace, FieldsLocoDoesNotModelAreRefusedByName) {
  const auto fixture = testing_util::source_dir() / "tests" / "golden" / "fixtures" / "hf_qwen2";
  model::ModelOptions base;
  base.context = 8;
  testing_util::TempDir dir;
  int folders = 0;
  auto error_with = [&](const std::string& key, const nlohmann::json& value) {
    const auto folder = dir.path() / std::to_string(folders++);
    fs::copy(fixture, folder);
    auto config = nlohmann::json::parse(read_file(folder / "config.json", "test"));
    config[key] = value;
    write_file_atomic(folder / "config.json", config.dump(2), "test");
    try {
      runtime::read_hugging_face_config(folder, base);
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_NE(error_with("final_logit_softcapping", 30.0).find("loco does not model this field (final_logit_softcapping)"),
            std::string::npos);
  EXPECT_NE(error_with("attention_dropout", 0.1).find("attention_dropout 0.1: loco's attention has no dropout"),
            std::string::npos);
  EXPECT_NE(error_with("use_mrope", true).find("use_mrope"), std::string::npos);
  EXPECT_NE(error_with("rope_interleaved", true).find("rope_interleaved"), std::string::npos);
  EXPECT_NE(error_with("layer_types", {"full_attention", "sliding_attention"})
                .find("sees 4 tokens back (sliding_window), less than model.context 8"),
            std::string::npos)
      << "a sliding layer named by layer_types, with use_sliding_window false";
  EXPECT_NE(error_with("layer_types", {"full_attention", "linear_attention"}).find("layer type \"linear_attention\""),
            std::string::npos);
  for (const auto& [key, value] : std::vector<std::pair<std::string, nlohmann::json>>{
           {"transformers_version", "5.0.0"}, {"bos_token_id", 1}, {"attention_dropout", 0.0}, {"pretraining_tp", 1},
           {"layer_types", {"full_attention", "full_attention"}}, {"use_cache", true}, {"use_mrope", false},
           {"is_llama_config", true}, {"rope_interleaved", false}, {"_attn_implementation_autoset", true}}) {
    EXPECT_EQ(error_with(key, value), "accepted") << key;
  }
}

// train.init_from = a Hugging Face folder: a run whose [model] describes another model is refused,
// naming the option and the flag that fixes it, rotary settings and the norm's epsilon included
// (before they were compared, a checkpoint's rope_theta or rms_norm_eps was silently replaced).
TEST(HuggingFace, ARunWhoseModelDiffersFromTheFolderIsToldTheOptionAndTheFlag) {
  const auto folder = testing_util::source_dir() / "tests" / "golden" / "fixtures" / "hf_qwen2_llama3_rope";
  model::ModelOptions base;
  base.context = 8;
  runtime::RunConfig config;
  config.model = runtime::read_hugging_face_config(folder, base);
  config.train.init_from = folder.string();
  model::Transformer model(config.model, 1);
  EXPECT_NO_THROW(runtime::load_initial_weights(model, config, 0));
  const std::vector<std::pair<std::function<void(model::ModelOptions&)>, std::string>> changes = {
      {[](auto& o) { o.norm_eps = 1e-6; }, "model.norm_eps = 1e-05, this run's config 1e-06; hint: set --model.norm_eps=1e-05"},
      {[](auto& o) { o.rope_base = 500000; }, "hint: set --model.rope_theta=10000"},
      {[](auto& o) { o.rope_scaling = model::RopeScaling::kNone; }, "hint: set --model.rope_scaling=llama3"},
      {[](auto& o) { o.rope_factor = 4; }, "hint: set --model.rope_factor=8"},
      {[](auto& o) { o.rope_original_context = 128; }, "hint: set --model.rope_original_context=64"},
      {[](auto& o) { o.kv_heads = 0; }, "hint: set --model.kv_heads=2"}};
  for (const auto& [change, expected] : changes) {
    auto other = config;
    change(other.model);
    model::Transformer differs(other.model, 1);
    try {
      runtime::load_initial_weights(differs, other, 0);
      ADD_FAILURE() << "accepted; expected: " << expected;
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << e.what();
    }
  }
}

// A model written as a Hugging Face folder (loco export --hf) and read back computes the same
// logits, bit for bit; tied and untied heads, with and without biases. A GPT is refused.
TEST(HuggingFace, AnExportedModelReadsBackTheSame) {
  testing_util::TempDir dir;
  model::ModelOptions o;
  o.vocab_size = 50;
  o.context = 8;
  o.layers = 2;
  o.width = 16;
  o.heads = 4;
  o.mlp = model::MlpKind::kSwiGlu;
  o.mlp_hidden_size = 20;
  const auto tokens = torch::randint(0, o.vocab_size, {2, 8}, torch::kInt64);
  for (bool tied : {true, false}) {
    for (int64_t kv_heads : {0, 2}) {
      o.tie_embeddings = tied;
      o.kv_heads = kv_heads;
      o.attention_bias = kv_heads == 2;
      model::Transformer model(o, 5);
      {
        torch::NoGradGuard no_grad;
        for (auto& p : model->parameters()) p.add_(0.05 * torch::randn_like(p));  // norms and biases not at their start
      }
      const auto out = dir.path() / fmt::format("tied-{}-kv-{}", tied, kv_heads);
      runtime::save_hugging_face_folder(model, out);
      ASSERT_TRUE(runtime::is_hugging_face_folder(out));
      const auto read = runtime::read_hugging_face_config(out, o);
      EXPECT_EQ(read.tie_embeddings, tied);
      EXPECT_EQ(read.key_value_heads(), kv_heads == 0 ? 4 : 2);
      EXPECT_EQ(read.attention_bias, o.attention_bias);
      model::Transformer back(read, 9);
      runtime::load_model_weights(back, runtime::load_hugging_face_parameters(out, read), out.string());
      torch::NoGradGuard no_grad;
      EXPECT_TRUE(torch::equal(model->forward(tokens), back->forward(tokens))) << out;
    }
  }
  // In bf16 and in shards of at most 2 kB of parameters: the index names each tensor's shard, no
  // shard holds more, and every parameter reads back as the original rounded to bf16.
  {
    model::Transformer model(o, 6);
    const auto out = dir.path() / "bf16-shards";
    runtime::save_hugging_face_folder(model, out, {}, {torch::kBFloat16, 2048});
    ASSERT_TRUE(runtime::is_hugging_face_folder(out));
    EXPECT_FALSE(fs::exists(out / "model.safetensors"));
    const auto index = nlohmann::json::parse(read_file(out / "model.safetensors.index.json", "test"));
    std::map<std::string, int64_t> shard_bytes;
    int64_t total = 0;
    for (const auto& [name, file] : index.at("weight_map").items()) {
      const auto shard = runtime::load_safetensors(out / file.get<std::string>());
      for (const auto& [tensor, value] : shard.tensors) {
        if (tensor != name) continue;
        EXPECT_EQ(value.scalar_type(), torch::kBFloat16) << name;
        shard_bytes[file] += value.nbytes();
        total += value.nbytes();
      }
    }
    EXPECT_EQ(index.at("metadata").at("total_size").get<int64_t>(), total);
    EXPECT_GT(shard_bytes.size(), 3u);
    for (const auto& [file, bytes] : shard_bytes) {
      EXPECT_LE(bytes, 2048) << file;
    }
    EXPECT_EQ(nlohmann::json::parse(read_file(out / "config.json", "test")).at("torch_dtype"), "bfloat16");
    const auto read = runtime::read_hugging_face_config(out, o);
    std::map<std::string, torch::Tensor> original;
    for (const auto& item : model->named_parameters()) original.emplace(item.key(), item.value().detach());
    const auto loaded = runtime::load_hugging_face_parameters(out, read);
    ASSERT_EQ(loaded.size(), original.size());
    for (const auto& [name, value] : loaded) {
      EXPECT_TRUE(torch::equal(value, original.at(name).to(torch::kBFloat16).to(torch::kFloat32))) << name;
    }
  }
  // Rotary scaling and the norm's epsilon are written into config.json and read back.
  auto scaled = o;
  scaled.rope_scaling = model::RopeScaling::kLlama3;
  scaled.rope_factor = 4;
  scaled.rope_original_context = 16;
  scaled.norm_eps = 1e-6;
  scaled.rope_base = 500000;
  model::Transformer scaled_model(scaled, 3);
  runtime::save_hugging_face_folder(scaled_model, dir.path() / "scaled");
  const auto read_scaled = runtime::read_hugging_face_config(dir.path() / "scaled", o);
  EXPECT_EQ(read_scaled.rope_scaling, model::RopeScaling::kLlama3);
  EXPECT_EQ(read_scaled.rope_factor, 4);
  EXPECT_EQ(read_scaled.rope_original_context, 16);
  EXPECT_EQ(read_scaled.norm_eps, 1e-6);
  EXPECT_EQ(read_scaled.rope_base, 500000);

  auto gpt = o;
  gpt.mlp = model::MlpKind::kGelu;
  model::Transformer not_llama(gpt, 1);
  try {
    runtime::save_hugging_face_folder(not_llama, dir.path() / "gpt");
    ADD_FAILURE() << "a GELU model was exported";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("not of the Llama kind"), std::string::npos) << e.what();
  }
  model::Transformer llama(o, 1);
  EXPECT_THROW(runtime::save_hugging_face_folder(llama, dir.path() / "tied-true-kv-0"), ConfigError) << "not an empty folder";
}

// A bad folder is refused with the file and what is wrong in it.
TEST(HuggingFace, BadFoldersAreNamed) {
  const auto fixture = testing_util::source_dir() / "tests" / "golden" / "fixtures" / "hf_qwen2";
  model::ModelOptions base;
  base.context = 8;
  const auto options = runtime::read_hugging_face_config(fixture, base);
  testing_util::TempDir dir;
  auto copy = [&](const std::string& name) {
    const auto folder = dir.path() / name;
    fs::copy(fixture, folder);
    return folder;
  };
  auto error_of = [](const auto& call) {
    try {
      call();
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  auto edit_config = [](const fs::path& folder, const std::string& from, const std::string& to) {
    auto text = read_file(folder / "config.json", "test");
    ASSERT_NE(text.find(from), std::string::npos) << from;
    text.replace(text.find(from), from.size(), to);
    write_file_atomic(folder / "config.json", text, "test");
  };

  const auto missing = copy("missing-shard");
  fs::remove(missing / "model-00002-of-00002.safetensors");
  EXPECT_NE(error_of([&] { runtime::load_hugging_face_parameters(missing, options); })
                .find("the shard model-00002-of-00002.safetensors is missing"), std::string::npos);

  auto narrower = options;
  narrower.mlp_hidden_size = 16;
  EXPECT_NE(error_of([&] { runtime::load_hugging_face_parameters(fixture, narrower); })
                .find("'model.layers.0.mlp.gate_proj.weight' has shape [24, 16], the model config.json describes needs [16, 16]"),
            std::string::npos);

  const auto gpt2 = copy("gpt2");
  edit_config(gpt2, "Qwen2ForCausalLM", "GPT2LMHeadModel");
  EXPECT_NE(error_of([&] { runtime::read_hugging_face_config(gpt2, base); })
                .find("architecture 'GPT2LMHeadModel' is not one loco reads"), std::string::npos);

  const auto scaled = copy("scaled");
  edit_config(scaled, "\"rope_theta\"", "\"rope_scaling\": {\"type\": \"dynamic\", \"factor\": 2.0},\n  \"rope_theta\"");
  EXPECT_NE(error_of([&] { runtime::read_hugging_face_config(scaled, base); }).find("rotary scaling 'dynamic' is not supported"),
            std::string::npos);

  const auto windowed = copy("windowed");
  edit_config(windowed, "\"use_sliding_window\": false", "\"use_sliding_window\": true");
  EXPECT_NE(error_of([&] { runtime::read_hugging_face_config(windowed, base); })
                .find("sees 4 tokens back (sliding_window), less than model.context 8"), std::string::npos);
}

}  // namespace
}  // namespace loco
