#include "loco/runtime/dipaco/run.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cctype>

#include "loco/core/error.h"
#include "loco/core/files.h"
#include "loco/core/run_folder.h"
#include "loco/data/routing.h"
#include "loco/model/transformer.h"
#include "loco/optim/outer.h"
#include "loco/runtime/dipaco/route.h"
#include "loco/runtime/store/modules.h"
#include "loco/runtime/store/safetensors.h"
#include "loco/runtime/worker/weights.h"

namespace loco::runtime {

namespace fs = std::filesystem;

int64_t file_bytes(const fs::path& file) {
  std::error_code ec;
  const auto size = fs::file_size(file, ec);
  return ec ? 0 : static_cast<int64_t>(size);
}

void remove_file(const fs::path& run_dir, const fs::path& relative) { remove_file_beneath(run_dir, relative); }

uint64_t DipacoRun::max_file_bytes() const {
  return 3 * 4 * static_cast<uint64_t>(model::parameter_count(config_.model)) + (uint64_t{16} << 20);
}

// A worker's name as a file name's part: letters, digits, '.', '-', '_' (others become '_').
std::string file_safe(const std::string& name) {
  std::string out = name;
  for (auto& c : out) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '-' && c != '_') c = '_';
  }
  return out;
}

std::unique_ptr<Registry> open_run_registry(const RunConfig& config) {
  if (!config.dipaco.database.empty()) return open_postgres_registry(config.dipaco.database);
  return open_sqlite_registry(RunFolder(config.run.dir).dipaco_registry());
}

int64_t dipaco_phases(const RunConfig& config) {
  return (config.train.steps + config.sync.inner_steps - 1) / config.sync.inner_steps;
}

RunLayout prepare_dipaco_run(const RunConfig& config, std::FILE* out) {
  if (!path_options(config).enabled()) {
    throw ConfigError("dipaco", "the config sets no dipaco.levels: there are no paths to train");
  }
  if (!fs::exists(RunFolder(config.run.dir).routing())) {
    fmt::print(out, "routing the training documents to paths (as `loco route`)...\n");
    const auto routed = route_documents(config);
    fmt::print(out, "{}\n", routed.table);
  }
  const auto run = DipacoRun::open(config);
  auto registry = open_run_registry(config);
  if (config.dipaco.reroute_phase >= run.phases()) {
    throw ConfigError("dipaco", fmt::format("dipaco.reroute_phase = {} but the run has {} phases (train.steps / "
                                            "sync.inner_steps)", config.dipaco.reroute_phase, run.phases()));
  }
  if (config.dipaco.reroute_phase > 0 &&
      nlohmann::json::parse(read_file(RunFolder(run.dir()).routing_paths(), "dipaco"))
          .value("held_out", std::vector<int64_t>{})
          .empty()) {
    throw DataError("dipaco", fmt::format("{}/routing was routed without held-out router documents, which "
                                          "dipaco.reroute_phase needs; hint: route into a fresh run folder",
                                          run.dir().string()));
  }
  RunLayout layout{run.plan().fingerprint(), run.phases(), {}, config.dipaco.reroute_phase};
  for (int64_t p = 0; p < run.plan().paths(); ++p) {
    auto& names = layout.path_modules.emplace_back();
    for (auto index : run.plan().modules_of(p)) names.push_back(run.plan().module(index).name);
  }
  if (registry->layout()) {
    registry->start(layout);  // refuses another plan or number of phases
    return layout;
  }
  write_file_atomic(RunFolder(run.dir()).config(), to_toml(run.config()), "dipaco");
  // Version 0 of every module, from the initial model (every path starts from the same one).
  auto initial = build_model(run.config());
  if (!run.config().train.init_from.empty()) {
    layout.max_positions = load_initial_weights(initial, run.config(), run.dataset().manifest().tokenizer_hash);
  }
  for (const auto& module : run.plan().modules()) {
    if (registry->latest_version(module.name)) continue;
    const auto group = model::module_parameters(initial, module);
    ModuleVersion v0{module.name, 0, run.plan().fingerprint(), {}, {}};
    std::vector<torch::Tensor> copies;
    for (size_t i = 0; i < group.names.size(); ++i) {
      copies.push_back(group.parameters[i].detach().clone());
      v0.parameters.emplace_back(group.names[i], copies.back());
    }
    v0.outer_state = optim::OuterOptimizer(group.names, copies, outer_options(run.config())).state();
    save_module(run.dir(), v0);
    registry->publish_module(module.name, 0, fs::relative(module_file(run.dir(), module.name, 0), run.dir()).string());
  }
  registry->start(layout);
  fmt::print(out, "started {}: {} paths through {} modules, {} phases of {} inner steps\n", run.dir().string(),
             run.plan().paths(), run.plan().modules().size(), run.phases(), run.config().sync.inner_steps);
  return layout;
}

DipacoRun::DipacoRun(RunConfig config, data::Dataset dataset, model::PathPlan plan)
    : config_(std::move(config)), dataset_(std::move(dataset)), plan_(std::move(plan)), dir_(config_.run.dir),
      phases_(dipaco_phases(config_)) {}

DipacoRun DipacoRun::open(const RunConfig& given) {
  auto dataset = data::Dataset::open(given.data.dir);
  auto config = resolve_for_dataset(given, dataset.manifest());
  model::PathPlan plan(config.model, path_options(config));
  return DipacoRun(std::move(config), std::move(dataset), std::move(plan));
}

std::vector<std::vector<int64_t>> DipacoRun::path_documents(const std::string& routing) const {
  const auto file = dir_ / routing / "paths.json";
  nlohmann::json saved;
  try {
    saved = nlohmann::json::parse(read_file(file, "dipaco"));
    std::vector<std::vector<int64_t>> out;
    const auto documents = static_cast<int64_t>(dataset_.train().documents.size());
    for (const auto& entry : saved.at("paths")) {
      auto& docs = out.emplace_back(entry.at("documents").get<std::vector<int64_t>>());
      for (auto d : docs) {
        if (d < 0 || d >= documents) throw DataError("dipaco", fmt::format("document {} is not in the training split", d));
      }
    }
    if (static_cast<int64_t>(out.size()) != plan_.paths()) {
      throw DataError("dipaco", fmt::format("it routes to {} paths, the plan has {}", out.size(), plan_.paths()));
    }
    return out;
  } catch (const nlohmann::json::exception& e) {
    throw DataError("dipaco", fmt::format("{} is malformed: {}", file.string(), e.what()));
  } catch (const DataError& e) {
    throw DataError("dipaco", fmt::format("{}: {} (another run's routing? route again into a fresh run folder)",
                                          file.string(), e.what()));
  }
}

DipacoRun::Stream DipacoRun::stream_of(const data::Split& split, const std::vector<int64_t>& documents) const {
  Stream out;
  for (auto d : documents) {
    const auto& doc = split.documents[static_cast<size_t>(d)];
    const auto begin = split.tokens.begin() + static_cast<int64_t>(doc.offset);
    out.tokens.insert(out.tokens.end(), begin, begin + doc.length);
    const int64_t routed = std::min<int64_t>(config_.data.route_tokens, doc.length);
    out.targets.insert(out.targets.end(), static_cast<size_t>(routed), data::kIgnoredTarget);
    out.targets.insert(out.targets.end(), begin + routed, begin + doc.length);
  }
  return out;
}

std::map<std::string, int64_t> DipacoRun::load_path(model::Transformer& model, int64_t path,
                                                    const std::map<std::string, int64_t>& versions) const {
  std::map<std::string, int64_t> bytes;
  torch::NoGradGuard no_grad;
  for (auto index : plan_.modules_of(path)) {
    const auto& module = plan_.module(index);
    const int64_t version = versions.at(module.name);
    const auto saved = load_module(dir_, module.name, version, plan_.fingerprint(), max_file_bytes(), /*with_outer_state=*/false);
    bytes[module.name] = file_bytes(module_file(dir_, module.name, version));
    const auto group = model::module_parameters(model, module);
    if (saved.parameters.size() != group.names.size()) {
      throw DataError("dipaco", fmt::format("module {} v{} holds {} tensors, the path model's module {}", module.name,
                                            version, saved.parameters.size(), group.names.size()));
    }
    for (size_t i = 0; i < group.names.size(); ++i) {
      const auto& [name, tensor] = saved.parameters[i];
      if (name != group.names[i] || !tensor.sizes().equals(group.parameters[i].sizes())) {
        throw DataError("dipaco", fmt::format("module {} v{}: tensor {} is not the model's {}", module.name, version, name,
                                              group.names[i]));
      }
      group.parameters[i].copy_(tensor);
    }
  }
  return bytes;
}

std::map<std::string, int64_t> DipacoRun::versions_of(int64_t path, int64_t version) const {
  std::map<std::string, int64_t> versions;
  for (auto index : plan_.modules_of(path)) versions[plan_.module(index).name] = version;
  return versions;
}

std::map<std::string, int64_t> DipacoRun::latest_versions(Registry& registry, int64_t path) const {
  std::map<std::string, int64_t> versions;
  for (auto index : plan_.modules_of(path)) {
    const auto& name = plan_.module(index).name;
    auto latest = registry.latest_version(name);
    if (!latest) throw DataError("dipaco", fmt::format("module {} has no published version", name));
    versions[name] = *latest;
  }
  return versions;
}

PathRouter DipacoRun::load_router(Registry& registry) const {
  std::string folder = RunFolder::routing_name();
  const auto layout = registry.layout();
  if (layout && layout->reroute_phase > 0) {
    if (auto done = registry.task_result({TaskScope::kRoute, -1, "", layout->reroute_phase})) folder = *done;
  }
  const auto file = load_checksummed_safetensors(dir_, fs::path(folder) / "router.safetensors", max_file_bytes());
  if (file.metadata.count("loco.plan") == 0 || file.metadata.at("loco.plan") != plan_.fingerprint()) {
    throw DataError("dipaco", fmt::format("{}/{} routes for another plan", dir_.string(), folder));
  }
  // Documents are routed by the features of the model the routing read; another model's would
  // send them elsewhere (routings written before this was recorded are not checked).
  if (const auto read = file.metadata.find("loco.features"); read != file.metadata.end() && read->second != features_model(config_)) {
    throw DataError("dipaco", fmt::format("{}/{} routes by the features of {}, but this config's are {}; hint: give the run's "
                                          "train.init_from (e.g. --train.init_from=...)", dir_.string(), folder, read->second,
                                          features_model(config_)));
  }
  std::map<std::string, torch::Tensor> t(file.tensors.begin(), file.tensors.end());
  if (file.metadata.count("loco.routing") && file.metadata.at("loco.routing") == "linear") {
    data::LinearRouter router{t.at("weight"), t.at("bias"), t.at("mean"), t.at("scale")};
    return [router](const torch::Tensor& features) { return router.route(features); };
  }
  // After k-means: the path of the nearest training document (data/routing.h); a routing written
  // before loco kept the documents routes to the nearest centre.
  if (t.count("evaluation.features") && t.count("evaluation.paths")) {
    data::NeighbourRouter router{t.at("evaluation.features"), t.at("evaluation.paths")};
    return [router](const torch::Tensor& features) { return router.route(features); };
  }
  data::KMeansRouter router;
  for (const auto& [name, centres] : file.tensors) {
    if (name.starts_with("centres.")) router.centres.push_back(centres);
  }
  if (router.centres.empty()) throw DataError("dipaco", fmt::format("{}/{}/router.safetensors holds no router", dir_.string(), folder));
  router.k = router.centres.at(0).size(0);
  return [router](const torch::Tensor& features) { return router.route(features); };
}

}  // namespace loco::runtime
