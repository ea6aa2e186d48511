#include "loco/runtime/dipaco/evaluation.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <climits>
#include <cmath>

#include "loco/core/error.h"
#include "loco/core/files.h"
#include "loco/core/run_folder.h"
#include "loco/data/batcher.h"
#include "loco/model/precision.h"
#include "loco/model/transformer.h"
#include "loco/runtime/dipaco/route.h"
#include "loco/runtime/dipaco/run.h"
#include "loco/runtime/store/checkpoint.h"
#include "loco/runtime/store/modules.h"
#include "loco/runtime/worker/weights.h"
#include "loco/runtime/worker/worker.h"

namespace loco::runtime {

namespace fs = std::filesystem;

bool picks_version(uint64_t seed, int64_t document) {
  return held_out_for_router(seed ^ 0x9e3779b97f4a7c15ULL, document, 0.5);  // another draw than the router's
}

namespace {

// The versions of `path` that every module of it kept (dipaco.keep_every), the latest included.
std::vector<int64_t> kept_versions(const DipacoRun& run, Registry& registry, int64_t path) {
  int64_t latest = INT64_MAX;
  for (const auto& [module, version] : run.latest_versions(registry, path)) latest = std::min(latest, version);
  std::vector<int64_t> out;
  for (int64_t v = 0; v < latest; v += std::max<int64_t>(1, run.config().dipaco.keep_every)) {
    bool all = true;
    for (const auto& [module, version] : run.versions_of(path, v)) all = all && fs::exists(module_file(run.dir(), module, version));
    if (all) out.push_back(v);
  }
  out.push_back(latest);
  return out;
}

// Early stopping: each kept version of `path` scored on `documents`; the score takes the version
// with the lowest loss (the earliest of equals). Without enough tokens to score, the latest.
std::map<std::string, int64_t> pick_version(const DipacoRun& run, Registry& registry, int64_t path,
                                            const std::vector<int64_t>& documents, const torch::Device& device,
                                            PathScore& score) {
  const auto candidates = kept_versions(run, registry, path);
  score.version = candidates.back();
  const auto stream = run.stream_of(run.dataset().val(), documents);
  if (static_cast<int64_t>(stream.tokens.size()) <= run.config().model.context) return run.versions_of(path, score.version);
  const auto batches = data::evaluation_batches(stream.tokens, run.config().model.context, run.config().eval.windows,
                                                run.config().eval.batch_size, &stream.targets);
  double best = INFINITY;
  for (const auto version : candidates) {
    auto model = build_model(run.config());
    run.load_path(model, path, run.versions_of(path, version));
    model->to(device);
    const double loss = evaluate(model, batches, device).loss;
    score.picking[version] = loss;
    if (loss < best) best = loss, score.version = version;
  }
  return run.versions_of(path, score.version);
}

// Every pair of the models scored, by a paired bootstrap over the scored documents.
std::vector<Comparison> compare(const DipacoEvaluation& e) {
  if (e.documents.empty()) return {};
  std::vector<std::string> names{"dipaco"};
  for (const auto& b : e.baselines) names.push_back(b.checkpoint);
  std::vector<std::vector<double>> sums(names.size());
  std::vector<int64_t> tokens;
  for (const auto& d : e.documents) {
    tokens.push_back(d.tokens);
    for (size_t m = 0; m < names.size(); ++m) sums[m].push_back(d.loss_sums[m]);
  }
  std::vector<Comparison> out;
  for (size_t a = 0; a < names.size(); ++a) {
    for (size_t b = a + 1; b < names.size(); ++b) {
      out.push_back({names[a], names[b], metrics::paired_bootstrap(sums[a], sums[b], tokens, 2000, 1)});
    }
  }
  return out;
}

}  // namespace

std::map<std::string, int64_t> scored_versions(const DipacoRun& run, Registry& registry, int64_t path) {
  const auto file = RunFolder(run.dir()).dipaco_evaluation();
  if (!run.config().dipaco.early_stopping || !fs::exists(file)) return run.latest_versions(registry, path);
  try {
    const auto scores = nlohmann::json::parse(read_file(file, "dipaco"));
    for (const auto& p : scores.at("paths")) {
      if (p.at("path").get<int64_t>() == path && p.contains("version")) return run.versions_of(path, p.at("version").get<int64_t>());
    }
  } catch (const nlohmann::json::exception& e) {
    throw DataError("dipaco", fmt::format("{}: {}", file.string(), e.what()));
  }
  return run.latest_versions(registry, path);
}

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
  out.early_stopping = run.config().dipaco.early_stopping;
  const auto seed = static_cast<uint64_t>(run.config().train.seed);
  out.baselines.resize(dense.size());
  double weighted = 0;
  std::vector<double> dense_weighted(dense.size(), 0.0);
  for (size_t b = 0; b < dense.size(); ++b) {
    out.baselines[b].checkpoint = dense[b].name;
    dense[b].model->to(device);
  }
  const int64_t context = run.config().model.context, batch_size = run.config().eval.batch_size;
  for (int64_t p = 0; p < run.plan().paths(); ++p) {
    std::vector<int64_t> scored, picking;
    for (auto d : documents[static_cast<size_t>(p)]) (out.early_stopping && picks_version(seed, d) ? picking : scored).push_back(d);
    PathScore score{p, static_cast<int64_t>(scored.size()), 0, NAN};
    const auto versions = out.early_stopping ? pick_version(run, *registry, p, picking, device, score)
                                             : run.latest_versions(*registry, p);
    if (!out.early_stopping) score.version = versions.begin()->second;
    for (auto& b : out.baselines) b.paths.push_back(NAN);
    auto model = build_model(run.config());
    run.load_path(model, p, versions);
    model->to(device);
    double path_sum = 0;
    std::vector<double> dense_sums(dense.size(), 0.0);
    for (const auto d : scored) {
      const auto stream = run.stream_of(val, {d});
      if (stream.tokens.size() < 2) continue;
      const auto batches = data::covering_batches(stream.tokens, context, batch_size, &stream.targets);
      const auto result = evaluate(model, batches, device);
      if (result.tokens == 0) continue;  // all of it the router's tokens
      DocumentScore document{d, p, result.tokens, {result.loss * static_cast<double>(result.tokens)}};
      for (size_t b = 0; b < dense.size(); ++b) {
        const auto theirs = evaluate(dense[b].model, batches, device);
        document.loss_sums.push_back(theirs.loss * static_cast<double>(theirs.tokens));
        dense_sums[b] += document.loss_sums.back();
      }
      path_sum += document.loss_sums.front();
      score.tokens += result.tokens;
      out.documents.push_back(std::move(document));
    }
    if (score.tokens > 0) {
      score.loss = path_sum / static_cast<double>(score.tokens);
      weighted += path_sum;
      out.tokens += score.tokens;
      for (size_t b = 0; b < dense.size(); ++b) {
        out.baselines[b].paths.back() = dense_sums[b] / static_cast<double>(score.tokens);
        dense_weighted[b] += dense_sums[b];
      }
    }
    out.paths.push_back(score);
  }
  out.loss = out.tokens > 0 ? weighted / static_cast<double>(out.tokens) : NAN;
  for (size_t b = 0; b < dense.size(); ++b) {
    out.baselines[b].loss = out.tokens > 0 ? dense_weighted[b] / static_cast<double>(out.tokens) : NAN;
  }
  out.comparisons = compare(out);
  return out;
}

std::string describe(const DipacoEvaluation& e) {
  std::string out = e.early_stopping ? "\n| path | version | validation documents | tokens scored | val_loss |"
                                     : "\n| path | validation documents | tokens scored | val_loss |";
  std::string rule = e.early_stopping ? "|---|---|---|---|---|" : "|---|---|---|---|";
  for (const auto& b : e.baselines) {
    out += fmt::format(" {} |", b.checkpoint);
    rule += "---|";
  }
  out += "\n" + rule + "\n";
  auto loss = [](double x) { return std::isfinite(x) ? fmt::format("{:.4f}", x) : std::string("(too few tokens)"); };
  for (size_t p = 0; p < e.paths.size(); ++p) {
    out += fmt::format("| {} |", e.paths[p].path);
    if (e.early_stopping) out += fmt::format(" {} |", e.paths[p].version);
    out += fmt::format(" {} | {} | {} |", e.paths[p].documents, e.paths[p].tokens, loss(e.paths[p].loss));
    for (const auto& b : e.baselines) out += fmt::format(" {} |", loss(b.paths[p]));
    out += "\n";
  }
  out += fmt::format("| all |{} | {} | **{}** |", e.early_stopping ? " |" : "", e.tokens, loss(e.loss));
  for (const auto& b : e.baselines) out += fmt::format(" {} |", loss(b.loss));
  out += "\n\neach validation document is scored whole by the one path the router sends it to, its first data.route_tokens "
         "tokens (the router's) left out of the loss; baselines are scored on the same windows\n";
  if (e.early_stopping) {
    out += "early stopping: each path runs the kept version of its modules with the lowest loss on the other half of its "
           "validation documents, which are not scored here\n";
  }
  if (!e.comparisons.empty()) {
    out += fmt::format("\n| a | b | a - b (nat per token) | 95% interval |\n|---|---|---|---|\n");
    for (const auto& c : e.comparisons) {
      out += fmt::format("| {} | {} | {:+.4f} | [{:+.4f}, {:+.4f}] |\n", c.a, c.b, c.interval.difference, c.interval.low,
                         c.interval.high);
    }
    out += fmt::format("\npaired bootstrap over the {} scored documents ({} resamples): an interval that excludes 0 is a "
                       "difference the validation set can tell\n",
                       e.comparisons.front().interval.documents, e.comparisons.front().interval.resamples);
  }
  return out;
}

nlohmann::json to_json(const DipacoEvaluation& e) {
  auto number = [](double x) { return std::isfinite(x) ? nlohmann::json(x) : nlohmann::json(nullptr); };
  nlohmann::json paths = nlohmann::json::array();
  for (const auto& p : e.paths) {
    nlohmann::json row = {{"path", p.path}, {"documents", p.documents}, {"tokens", p.tokens}, {"val_loss", number(p.loss)}};
    if (e.early_stopping) {
      row["version"] = p.version;  // the version `loco generate` runs (scored_versions)
      nlohmann::json picking = nlohmann::json::object();
      for (const auto& [version, loss] : p.picking) picking[std::to_string(version)] = loss;
      row["picking_loss"] = picking;
    }
    paths.push_back(row);
  }
  nlohmann::json baselines = nlohmann::json::array();
  for (const auto& b : e.baselines) {
    nlohmann::json by_path = nlohmann::json::array();
    for (const auto x : b.paths) by_path.push_back(number(x));
    baselines.push_back({{"checkpoint", b.checkpoint}, {"val_loss", number(b.loss)}, {"paths", by_path}});
  }
  nlohmann::json documents = nlohmann::json::array();
  for (const auto& d : e.documents) {
    documents.push_back({{"document", d.document}, {"path", d.path}, {"tokens", d.tokens}, {"loss_sums", d.loss_sums}});
  }
  nlohmann::json comparisons = nlohmann::json::array();
  for (const auto& c : e.comparisons) {
    comparisons.push_back({{"a", c.a}, {"b", c.b}, {"difference", c.interval.difference}, {"low", c.interval.low},
                           {"high", c.interval.high}, {"documents", c.interval.documents},
                           {"resamples", c.interval.resamples}});
  }
  return {{"val_loss", number(e.loss)}, {"tokens", e.tokens}, {"early_stopping", e.early_stopping}, {"paths", paths},
          {"baselines", baselines}, {"documents", documents}, {"comparisons", comparisons},
          {"scoring", "every token of every scored validation document, routing tokens left out"}};
}

}  // namespace loco::runtime
