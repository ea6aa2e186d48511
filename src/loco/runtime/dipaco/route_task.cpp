// A route task (worker.h): discriminative re-routing before a phase (Douillard et al. 2024, arXiv
// 2403.10616, section 2.2): the held-out documents labelled by the path that scores them best, a
// linear router fitted to those labels (data/routing.h), and the training documents re-sharded.
#include <nlohmann/json.hpp>

#include <cmath>
#include <set>

#include "loco/core/error.h"
#include "loco/core/files.h"
#include "loco/core/run_folder.h"
#include "loco/data/routing.h"
#include "loco/model/transformer.h"
#include "loco/runtime/dipaco/task_worker.h"
#include "loco/runtime/store/safetensors.h"
#include "loco/runtime/worker/weights.h"
#include "loco/runtime/worker/worker.h"

namespace loco::runtime::dipaco_tasks {

namespace fs = std::filesystem;

namespace {

// Each held-out document's loss on every path at `phase` (NaN where it is too short to score),
// its routing tokens left out. (H, P) float64.
torch::Tensor held_out_losses(const DipacoRun& run, const std::vector<int64_t>& held_out, int64_t phase,
                              const torch::Device& device) {
  const auto& config = run.config();
  const int64_t paths = run.plan().paths();
  auto losses = torch::full({static_cast<int64_t>(held_out.size()), paths}, NAN, torch::kFloat64);
  for (int64_t p = 0; p < paths; ++p) {
    auto model = build_model(config);
    run.load_path(model, p, run.versions_of(p, phase));
    model->to(device);
    for (size_t i = 0; i < held_out.size(); ++i) {
      const auto stream = run.stream_of(run.dataset().train(), {held_out[i]});
      if (static_cast<int64_t>(stream.tokens.size()) <= config.model.context) continue;  // too short to score
      const auto batches = data::evaluation_batches(stream.tokens, config.model.context, 4, 4, &stream.targets);
      const auto result = evaluate(model, batches, device);
      if (result.tokens > 0) losses[static_cast<int64_t>(i)][p] = result.loss;
    }
  }
  return losses;
}

// The training documents `trained` (their features (N, D)) to the paths the router scores
// highest, evenly (every path floor or ceil of an equal share, the surest documents first, as
// k-means's shards are), and with dipaco.top_n = n also to their next n - 1 best. By path.
std::vector<std::vector<int64_t>> shard_by_router(const data::LinearRouter& router, const torch::Tensor& features,
                                                  const std::vector<int64_t>& trained, int64_t paths, int64_t top_n) {
  const auto scores = router.scores(features);
  const auto primary = data::balanced_assignment(-torch::log_softmax(scores, 1));
  const auto order = std::get<1>(scores.sort(/*stable=*/true, 1, /*descending=*/true)).narrow(1, 0, top_n);
  std::vector<std::vector<int64_t>> members(static_cast<size_t>(paths));
  for (size_t j = 0; j < trained.size(); ++j) {
    members[static_cast<size_t>(primary[j])].push_back(trained[j]);
    int64_t more = top_n - 1;
    for (int64_t r = 0; r < top_n && more > 0; ++r) {
      const auto p = order[static_cast<int64_t>(j)][r].item<int64_t>();
      if (p == primary[j]) continue;
      members[static_cast<size_t>(p)].push_back(trained[j]);
      --more;
    }
  }
  for (int64_t p = 0; p < paths; ++p) {
    if (members[static_cast<size_t>(p)].empty()) {
      throw DataError("dipaco", fmt::format("re-routing left path {} without training documents", p));
    }
  }
  return members;
}

// Writes `folder` (router.safetensors, paths.json) whole, or leaves it when a duplicate of the
// task already did: it is written into a partial folder of this worker's and renamed last.
void write_routing(const fs::path& folder, const fs::path& partial, const data::LinearRouter& router,
                   const std::string& plan, const nlohmann::json& paths_json) {
  if (fs::exists(folder)) return;
  fs::remove_all(partial);
  fs::create_directories(partial);
  save_safetensors(partial / "router.safetensors",
                   {{"weight", router.weight}, {"bias", router.bias}, {"mean", router.mean}, {"scale", router.scale}},
                   {{"loco.routing", "linear"}, {"loco.plan", plan}});
  write_file_atomic(partial / "paths.json", paths_json.dump(1) + "\n", "dipaco");
  std::error_code ec;
  fs::rename(partial, folder, ec);
  if (ec && !fs::exists(folder)) throw Error("dipaco", fmt::format("cannot write {}: {}", folder.string(), ec.message()));
  fs::remove_all(partial, ec);
}

}  // namespace

// Discriminative re-routing before phase `task.phase` (every module is at that version): every
// path scores the held-out router documents, a linear router learns each one's best path from its
// features, its biases are tuned until the training documents spread over the paths as evenly as
// k-means spread them, and it re-shards the training documents (validation and prompts follow
// it at evaluation and inference).
void TaskWorker::run_route(const TaskKey& task) {
  const auto& config = run_.config();
  const auto routing = nlohmann::json::parse(read_file(RunFolder(run_.dir()).routing_paths(), "dipaco"));
  const auto held_out = routing.at("held_out").get<std::vector<int64_t>>();
  const int64_t paths = run_.plan().paths();
  const auto losses = held_out_losses(run_, held_out, task.phase, device_);
  const auto scored = losses.isfinite().all(1);
  if (scored.sum().item<int64_t>() == 0) {
    throw DataError("dipaco", "re-routing: no held-out document is long enough to score (more than model.context tokens); "
                              "hint: raise dipaco.router_fraction");
  }
  const auto labels = losses.index({scored}).argmin(1);
  std::vector<int64_t> labelled;
  for (size_t i = 0; i < held_out.size(); ++i) {
    if (scored[static_cast<int64_t>(i)].item<bool>()) labelled.push_back(held_out[i]);
  }
  const auto features = embed_documents(config, run_.dataset());  // (N, D): the initial model's, as routing reads
  const std::set<int64_t> held(held_out.begin(), held_out.end());
  std::vector<int64_t> trained;
  for (int64_t d = 0; d < static_cast<int64_t>(run_.dataset().train().documents.size()); ++d) {
    if (held.count(d) == 0) trained.push_back(d);
  }
  const auto trained_features = features.index_select(0, torch::tensor(trained, torch::kInt64));
  const auto router = data::fit_linear_router(features.index_select(0, torch::tensor(labelled, torch::kInt64)), labels,
                                              paths, trained_features);
  const auto members = shard_by_router(router, trained_features, trained, paths, config.dipaco.top_n);

  nlohmann::json by_path = nlohmann::json::array();
  for (int64_t p = 0; p < paths; ++p) by_path.push_back({{"path", p}, {"documents", members[static_cast<size_t>(p)]}});
  const std::vector<int64_t> label_list(labels.data_ptr<int64_t>(), labels.data_ptr<int64_t>() + labels.numel());
  nlohmann::json label_losses = nlohmann::json::array();  // each labelled document's loss on every path
  const auto scored_losses = losses.index({scored}).contiguous();
  for (int64_t i = 0; i < scored_losses.size(0); ++i) {
    const auto* row = scored_losses[i].data_ptr<double>();
    label_losses.push_back(std::vector<double>(row, row + paths));
  }
  const auto relative = RunFolder::rerouting_name(task.phase);
  write_routing(run_.dir() / relative, run_.dir() / fmt::format("{}.partial-{}", relative, file_safe(options_.name)), router,
                run_.plan().fingerprint(),
                {{"routing", "linear"}, {"phase", task.phase}, {"top_n", config.dipaco.top_n},
                 {"router_documents", labelled}, {"router_labels", label_list}, {"router_losses", label_losses},
                 {"paths", by_path}});
  db([&](Registry& r) { r.complete_route(task, options_.name, relative); });
  std::string sizes;
  for (int64_t p = 0; p < paths; ++p) sizes += fmt::format("{}{}", p == 0 ? "" : ", ", members[static_cast<size_t>(p)].size());
  say(fmt::format("re-routed before phase {}: {} held-out documents labelled by their best path, a linear router fitted; "
                  "training documents per path: {}", task.phase + 1, labelled.size(), sizes));
  log_.write(metrics::RouteTaskEvent{{-1, options_.name}, task.phase, static_cast<int64_t>(labelled.size()), sizes});
}

}  // namespace loco::runtime::dipaco_tasks
