#include "loco/runtime/dipaco/evaluation.h"

#include <fmt/format.h>

#include <cmath>

#include "loco/core/error.h"
#include "loco/data/batcher.h"
#include "loco/model/precision.h"
#include "loco/runtime/dipaco/run.h"
#include "loco/runtime/store/checkpoint.h"
#include "loco/runtime/worker/weights.h"
#include "loco/runtime/worker/worker.h"

namespace loco::runtime {

DipacoEvaluation evaluate_dipaco(const RunConfig& config, const std::vector<std::string>& baselines) {
  const auto run = DipacoRun::open(config);
  auto registry = open_run_registry(config);
  const auto route = run.load_router(*registry);
  const auto& val = run.dataset().val();
  const auto routes = route(embed_documents(run.config(), run.dataset(), val));
  std::vector<std::vector<int64_t>> documents(static_cast<size_t>(run.plan().paths()));
  for (size_t d = 0; d < routes.size(); ++d) documents[static_cast<size_t>(routes[d])].push_back(static_cast<int64_t>(d));

  // The dense models to compare, each scored on the same windows.
  struct Baseline {
    std::string name;
    model::Transformer model{nullptr};
  };
  std::vector<Baseline> dense;
  for (const auto& path : baselines) {
    const auto checkpoint = load_checkpoint(path);
    if (checkpoint.state.tokenizer_hash != run.dataset().manifest().tokenizer_hash) {
      throw DataError("dipaco", fmt::format("baseline {} was trained with another tokenizer than {}", path, run.config().data.dir));
    }
    const auto theirs = parse_config(checkpoint.state.config_toml, (checkpoint.dir / "state.json").string());
    Baseline b{path, build_model(theirs)};
    load_model_weights(b.model, inference_weights(checkpoint), checkpoint.dir.string());
    dense.push_back(std::move(b));
  }

  const auto device = model::resolve_device(run.config().train.device);
  DipacoEvaluation out;
  out.baselines.resize(dense.size());
  double weighted = 0;
  std::vector<double> dense_weighted(dense.size(), 0.0);
  for (size_t b = 0; b < dense.size(); ++b) {
    out.baselines[b].checkpoint = dense[b].name;
    dense[b].model->to(device);
  }
  for (int64_t p = 0; p < run.plan().paths(); ++p) {
    PathScore score{p, static_cast<int64_t>(documents[static_cast<size_t>(p)].size()), 0, NAN};
    const auto stream = run.stream_of(val, documents[static_cast<size_t>(p)]);
    for (auto& b : out.baselines) b.paths.push_back(NAN);
    if (static_cast<int64_t>(stream.tokens.size()) > run.config().model.context) {
      auto model = build_model(run.config());
      run.load_path(model, p, run.latest_versions(*registry, p));
      model->to(device);
      const auto batches = data::evaluation_batches(stream.tokens, run.config().model.context, run.config().eval.windows,
                                                    run.config().eval.batch_size, &stream.targets);
      const auto result = evaluate(model, batches, device);
      score.loss = result.loss;
      score.tokens = result.tokens;
      weighted += result.loss * static_cast<double>(result.tokens);
      out.tokens += result.tokens;
      for (size_t b = 0; b < dense.size(); ++b) {
        const auto theirs = evaluate(dense[b].model, batches, device);
        out.baselines[b].paths.back() = theirs.loss;
        dense_weighted[b] += theirs.loss * static_cast<double>(theirs.tokens);
      }
    }
    out.paths.push_back(score);
  }
  out.loss = out.tokens > 0 ? weighted / static_cast<double>(out.tokens) : NAN;
  for (size_t b = 0; b < dense.size(); ++b) {
    out.baselines[b].loss = out.tokens > 0 ? dense_weighted[b] / static_cast<double>(out.tokens) : NAN;
  }
  return out;
}

std::string describe(const DipacoEvaluation& e) {
  std::string out = "\n| path | validation documents | tokens scored | val_loss |";
  std::string rule = "|---|---|---|---|";
  for (const auto& b : e.baselines) {
    out += fmt::format(" {} |", b.checkpoint);
    rule += "---|";
  }
  out += "\n" + rule + "\n";
  auto loss = [](double x) { return std::isfinite(x) ? fmt::format("{:.4f}", x) : std::string("(too few tokens)"); };
  for (size_t p = 0; p < e.paths.size(); ++p) {
    out += fmt::format("| {} | {} | {} | {} |", e.paths[p].path, e.paths[p].documents, e.paths[p].tokens, loss(e.paths[p].loss));
    for (const auto& b : e.baselines) out += fmt::format(" {} |", loss(b.paths[p]));
    out += "\n";
  }
  out += fmt::format("| all | | {} | **{}** |", e.tokens, loss(e.loss));
  for (const auto& b : e.baselines) out += fmt::format(" {} |", loss(b.loss));
  return out + "\n\neach validation document is scored by the one path the router sends it to, its first data.route_tokens "
               "tokens (the router's) left out of the loss; baselines are scored on the same windows\n";
}

}  // namespace loco::runtime
