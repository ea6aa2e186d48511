#include "loco/runtime/dipaco/route.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cmath>

#include "loco/core/error.h"
#include "loco/core/files.h"
#include "loco/core/hash.h"
#include "loco/core/run_folder.h"
#include "loco/data/dataset.h"
#include "loco/data/routing.h"
#include "loco/model/paths.h"
#include "loco/runtime/store/safetensors.h"
#include "loco/runtime/worker/worker.h"

namespace loco::runtime {

std::string features_model(const RunConfig& config) {
  return config.train.init_from.empty() ? fmt::format("the random initialization of seed {}", config.train.seed)
                                        : fmt::format("the model in {}", std::filesystem::weakly_canonical(config.train.init_from).string());
}

bool held_out_for_router(uint64_t seed, int64_t document, double fraction) {
  Hasher hasher;
  hasher.update(&seed, sizeof seed);
  hasher.update(&document, sizeof document);
  return static_cast<double>(hasher.digest()) < fraction * 18446744073709551616.0;
}

namespace {

// Markdown: one row per path, one column per label, documents in each cell.
std::string cluster_table(const data::Dataset& dataset, const std::vector<std::vector<int64_t>>& routes, int64_t paths,
                          const std::vector<int64_t>& tokens) {
  const auto& labels = dataset.manifest().labels;
  const size_t columns = std::max<size_t>(1, labels.size());
  std::vector<std::vector<int64_t>> counts(static_cast<size_t>(paths), std::vector<int64_t>(columns, 0));
  const auto& documents = dataset.train().documents;
  for (size_t i = 0; i < routes.size(); ++i) {
    const size_t label = labels.empty() ? 0 : std::min<size_t>(documents[i].label, columns - 1);
    for (auto p : routes[i]) ++counts[static_cast<size_t>(p)][label];
  }
  std::string out = "| path | documents | tokens |";
  for (size_t l = 0; l < columns; ++l) out += fmt::format(" {} |", labels.empty() ? "documents" : labels[l]);
  out += "\n|---|---|---|";
  for (size_t l = 0; l < columns; ++l) out += "---|";
  out += "\n";
  for (int64_t p = 0; p < paths; ++p) {
    int64_t total = 0;
    for (auto c : counts[static_cast<size_t>(p)]) total += c;
    out += fmt::format("| {} | {} | {} |", p, total, tokens[static_cast<size_t>(p)]);
    for (auto c : counts[static_cast<size_t>(p)]) out += c == 0 ? " |" : fmt::format(" {} |", c);
    out += "\n";
  }
  return out;
}

}  // namespace

RouteSummary route_documents(const RunConfig& config) {
  const auto options = path_options(config);
  if (!options.enabled()) {
    throw ConfigError("route", "route: the config sets no dipaco.levels, so there are no paths to route documents to");
  }
  const auto dataset = data::Dataset::open(config.data.dir);
  const RunConfig resolved = resolve_for_dataset(config, dataset.manifest());
  const model::PathPlan plan(resolved.model, options);
  const int64_t paths = plan.paths();
  int64_t k = paths;
  if (config.dipaco.product_routing) {
    k = static_cast<int64_t>(std::llround(std::sqrt(static_cast<double>(paths))));
    if (k * k != paths) {
      throw ConfigError("route", fmt::format("dipaco.routing = \"product\" makes k * k paths, but dipaco.levels \"{}\" makes "
                                             "{}; hint: use \"kmeans\", or levels whose paths are a square (e.g. \"2:4,2:4\")",
                                             config.dipaco.levels, paths));
    }
  }
  RouteSummary summary;
  summary.dir = RunFolder(config.run.dir).routing();
  if (std::filesystem::exists(summary.dir)) {
    throw DataError("route", fmt::format("{} already holds a routing: a run's documents are routed once. Hint: delete the "
                                         "folder to route again", summary.dir.string()));
  }
  const auto all_features = embed_documents(resolved, dataset);
  const auto seed = static_cast<uint64_t>(config.train.seed);
  // With discriminative re-routing, a share of the documents is held out of training: the router's.
  std::vector<int64_t> trained, held_out;
  for (int64_t i = 0; i < all_features.size(0); ++i) {
    (config.dipaco.reroute_phase > 0 && held_out_for_router(seed, i, config.dipaco.router_fraction) ? held_out : trained)
        .push_back(i);
  }
  if (config.dipaco.reroute_phase > 0 && held_out.empty()) {
    throw DataError("route", fmt::format("dipaco.router_fraction = {} holds out none of the {} training documents; hint: raise "
                                         "it", config.dipaco.router_fraction, all_features.size(0)));
  }
  const auto features = all_features.index_select(0, torch::tensor(trained, torch::kInt64));
  const auto router = config.dipaco.product_routing ? data::fit_product_kmeans(features, k, seed)
                                                    : data::fit_balanced_kmeans(features, k, seed);

  const auto& documents = dataset.train().documents;
  summary.documents.assign(static_cast<size_t>(paths), 0);
  summary.tokens.assign(static_cast<size_t>(paths), 0);
  nlohmann::json by_path = nlohmann::json::array();
  std::vector<std::vector<int64_t>> members(static_cast<size_t>(paths));
  // Each document trains its balanced path and, with dipaco.top_n = n > 1, its next n - 1 nearest.
  if (config.dipaco.top_n > paths) {
    throw ConfigError("route", fmt::format("dipaco.top_n = {} but the plan has {} paths", config.dipaco.top_n, paths));
  }
  std::vector<std::vector<int64_t>> ranked;
  if (config.dipaco.top_n > 1) ranked = router.ranked(features, config.dipaco.top_n);
  std::vector<std::vector<int64_t>> routes(documents.size());  // by document; none for a held-out one
  for (size_t j = 0; j < router.assignment.size(); ++j) {
    auto& route = routes[static_cast<size_t>(trained[j])];
    route.push_back(router.assignment[j]);
    for (size_t r = 0; r < (ranked.empty() ? 0 : ranked[j].size()) && route.size() < static_cast<size_t>(config.dipaco.top_n); ++r) {
      if (ranked[j][r] != router.assignment[j]) route.push_back(ranked[j][r]);
    }
  }
  for (size_t i = 0; i < routes.size(); ++i) {
    for (auto p : routes[i]) {
      members[static_cast<size_t>(p)].push_back(static_cast<int64_t>(i));
      ++summary.documents[static_cast<size_t>(p)];
      summary.tokens[static_cast<size_t>(p)] += static_cast<int64_t>(documents[i].length);
    }
  }
  for (int64_t p = 0; p < paths; ++p) {
    by_path.push_back({{"path", p}, {"documents", members[static_cast<size_t>(p)]}, {"tokens", summary.tokens[static_cast<size_t>(p)]}});
  }
  summary.table = cluster_table(dataset, routes, paths, summary.tokens);

  // Written into a temporary folder and renamed last: a routing folder that exists is complete.
  const auto partial = std::filesystem::path(config.run.dir) / "routing.partial";
  std::filesystem::remove_all(partial);
  std::filesystem::create_directories(partial);
  NamedTensors centres;
  for (size_t part = 0; part < router.centres.size(); ++part) centres.emplace_back(fmt::format("centres.{}", part), router.centres[part]);
  // Unseen documents (validation, prompts) go where their nearest training document went.
  const auto evaluation = data::fit_neighbour_router(features, router.assignment);
  centres.insert(centres.end(), {{"evaluation.features", evaluation.features}, {"evaluation.paths", evaluation.paths}});
  save_safetensors(partial / "router.safetensors", centres,
                   {{"loco.routing", config.dipaco.product_routing ? "product" : "kmeans"},
                    {"loco.plan", plan.fingerprint()},
                    {"loco.tokenizer_hash", std::to_string(dataset.manifest().tokenizer_hash)},
                    {"loco.route_tokens", std::to_string(config.data.route_tokens)},
                    {"loco.features", features_model(config)}});
  write_file_atomic(partial / "paths.json",
                    nlohmann::json{{"routing", config.dipaco.product_routing ? "product" : "kmeans"},
                                   {"levels", config.dipaco.levels}, {"top_n", config.dipaco.top_n}, {"held_out", held_out},
                                   {"paths", by_path}}.dump(1) + "\n", "route");
  write_file_atomic(partial / "clusters.md", summary.table, "route");
  std::filesystem::rename(partial, summary.dir);
  return summary;
}

}  // namespace loco::runtime
