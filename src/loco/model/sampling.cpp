#include "loco/model/sampling.h"

#include <ATen/CPUGeneratorImpl.h>

#include "loco/core/error.h"
#include "loco/model/transformer.h"

namespace loco::model {

std::vector<int32_t> generate(Transformer& model, const std::vector<int32_t>& prompt, const SampleOptions& options) {
  if (options.temperature < 0) throw ConfigError("generate", fmt::format("temperature must be >= 0, got {}", options.temperature));
  if (options.top_k < 0) throw ConfigError("generate", fmt::format("top_k must be >= 0, got {}", options.top_k));
  if (options.max_new_tokens < 0) throw ConfigError("generate", "max_new_tokens must be >= 0");
  LOCO_CHECK(!prompt.empty(), "generate needs at least one prompt token");

  torch::NoGradGuard no_grad;
  const bool was_training = model->is_training();
  model->eval();
  const auto device = model->tok_emb->weight.device();
  const int64_t context = model->options().context;
  auto generator = at::detail::createCPUGenerator(options.seed);

  std::vector<int64_t> window(prompt.begin(), prompt.end());
  std::vector<int32_t> out;
  for (int64_t i = 0; i < options.max_new_tokens; ++i) {
    const int64_t start = std::max<int64_t>(0, static_cast<int64_t>(window.size()) - context);
    auto input = torch::tensor(std::vector<int64_t>(window.begin() + start, window.end()), torch::kInt64)
                     .view({1, -1})
                     .to(device);
    auto logits = model->forward(input).select(1, input.size(1) - 1).squeeze(0).to(torch::kCPU, torch::kFloat32);  // (V)
    int64_t next;
    if (options.temperature == 0) {
      next = logits.argmax().item<int64_t>();
    } else {
      logits = logits / options.temperature;
      if (options.top_k > 0 && options.top_k < logits.size(0)) {
        auto kth = std::get<0>(logits.topk(options.top_k)).min();
        logits = logits.masked_fill(logits < kth, -std::numeric_limits<float>::infinity());
      }
      auto probs = torch::softmax(logits, -1);
      next = torch::multinomial(probs, 1, /*replacement=*/false, generator).item<int64_t>();
    }
    window.push_back(next);
    out.push_back(static_cast<int32_t>(next));
    if (next == options.stop_token) break;
  }
  if (was_training) model->train();
  return out;
}

}  // namespace loco::model
