#include "loco/runtime/dipaco/inference.h"

#include "loco/model/transformer.h"
#include "loco/runtime/dipaco/evaluation.h"
#include "loco/runtime/dipaco/run.h"
#include "loco/runtime/worker/weights.h"
#include "loco/runtime/worker/worker.h"

namespace loco::runtime {

struct PathInference::Impl {
  DipacoRun run;
  std::unique_ptr<Registry> registry;
  PathRouter router;
  std::map<int64_t, model::Transformer> models;
};

PathInference::PathInference(const RunConfig& config) {
  auto run = DipacoRun::open(config);
  auto registry = open_run_registry(config);
  auto router = run.load_router(*registry);
  impl_.reset(new Impl{std::move(run), std::move(registry), std::move(router), {}});
}

PathInference::~PathInference() = default;

int64_t PathInference::route(const std::vector<int32_t>& tokens, bool latest) {
  const auto length = static_cast<int64_t>(tokens.size());
  const int64_t start = latest ? std::max<int64_t>(0, length - impl_->run.config().data.route_tokens) : 0;
  data::Split split;
  split.tokens.assign(tokens.begin() + start, tokens.end());
  split.documents.push_back({0, static_cast<uint32_t>(split.tokens.size()), 0});
  return impl_->router(embed_documents(impl_->run.config(), impl_->run.dataset(), split)).at(0);
}

model::Transformer& PathInference::model(int64_t path, const torch::Device& device) {
  auto it = impl_->models.find(path);
  if (it == impl_->models.end()) {
    auto model = build_model(impl_->run.config());
    impl_->run.load_path(model, path, scored_versions(impl_->run, *impl_->registry, path));
    model->to(device);
    model->eval();
    it = impl_->models.emplace(path, std::move(model)).first;
  }
  return it->second;
}

PathGeneration PathInference::generate(std::vector<int32_t> tokens, const model::SampleOptions& sample,
                                       int64_t reroute_every, const torch::Device& device) {
  PathGeneration out;
  int64_t path = route(tokens);
  out.paths.emplace_back(0, path);
  const int64_t total = sample.max_new_tokens;
  for (int64_t made = 0, chunk = 0; made < total; ++chunk) {
    auto options = sample;
    options.max_new_tokens = reroute_every > 0 ? std::min(reroute_every, total - made) : total - made;
    options.seed = sample.seed + static_cast<uint64_t>(chunk);
    auto more = model::generate(model(path, device), tokens, options);
    made += static_cast<int64_t>(more.size());
    const bool ended = more.empty() || more.back() == sample.stop_token;
    if (!more.empty() && more.back() == sample.stop_token) more.pop_back();
    tokens.insert(tokens.end(), more.begin(), more.end());
    if (ended || reroute_every == 0 || made >= total) break;
    const int64_t next = route(tokens, /*latest=*/true);
    if (next != path) out.paths.emplace_back(made, next);
    path = next;
  }
  out.tokens = std::move(tokens);
  return out;
}

}  // namespace loco::runtime
