// A path task (worker.h): train path P for one phase's inner steps from its modules' versions of
// that phase, and report one outer gradient per module (Douillard et al. 2024, arXiv 2403.10616,
// Algorithm 1: Δ_m = θ_m(phase) − θ_P after H inner steps), weighted by the path's tokens.
#include <fmt/ranges.h>

#include <cmath>

#include "loco/core/error.h"
#include "loco/core/run_folder.h"
#include "loco/metrics/progress.h"
#include "loco/model/transformer.h"
#include "loco/runtime/dipaco/task_worker.h"
#include "loco/runtime/store/safetensors.h"
#include "loco/runtime/worker/weights.h"

namespace loco::runtime::dipaco_tasks {

namespace fs = std::filesystem;

// The path's inner AdamW state left by its last completed task (phase − 1, or with a phase
// deadline an earlier one), loaded into `adamw`; its file, to remove once this phase completed.
std::optional<std::string> TaskWorker::load_inner_state(optim::AdamW& adamw, int64_t path, int64_t phase, int64_t& read) {
  if (phase == 0) return std::nullopt;
  // The path's inner optimizer state continues across phases, whichever worker ran the last one.
  const auto previous = db([&](Registry& r) { return r.latest_path_result(path, phase); });
  // Without a phase deadline every phase of a path completes; with one, a late task may have been
  // cancelled, and the path continues from the last state it completed.
  if ((!previous || previous->first != phase - 1) && run_.config().dipaco.phase_deadline_s <= 0) {
    throw DataError("dipaco", fmt::format("path {} phase {} has no recorded inner state", path, phase - 1));
  }
  if (!previous || previous->second.empty()) return std::nullopt;
  if (kept_inner_ && kept_inner_->file == previous->second) {  // this worker wrote it: nothing to read
    adamw.load_state(kept_inner_->tensors, kept_inner_->steps);
    return previous->second;
  }
  const auto file = load_checksummed_safetensors(run_.dir(), previous->second, run_.max_file_bytes());
  read += file_bytes(run_.dir() / previous->second);
  const auto steps = file.metadata.find("loco.inner_steps");
  if (steps == file.metadata.end()) {
    throw DataError("dipaco", fmt::format("{}: not a path's inner state (no loco.inner_steps)", previous->second));
  }
  adamw.load_state(file.tensors, std::strtoll(steps->second.c_str(), nullptr, 10));
  return previous->second;
}

// The path's sampler over its shard (the k-means one, or the re-routing's from its phase on), at
// the phase's position: a function of the phase, so a task issued again reads the same data.
// `weight`: the shard's tokens, the weight of the path's outer gradients.
data::WindowSampler TaskWorker::path_sampler(int64_t path, int64_t phase, double& weight) {
  const auto& config = run_.config();
  // After a re-routing the path trains on its new shard, from its start.
  const bool rerouted = layout_.reroute_phase > 0 && phase >= layout_.reroute_phase;
  if (rerouted && !rerouted_documents_) {
    const auto folder = db([&](Registry& r) { return r.task_result({TaskScope::kRoute, -1, "", layout_.reroute_phase}); });
    if (!folder) throw DataError("dipaco", fmt::format("phase {} has no re-routing recorded", layout_.reroute_phase));
    rerouted_documents_ = run_.path_documents(*folder);
  }
  const auto& shards = rerouted ? *rerouted_documents_ : documents_;
  const int64_t shard_phase = rerouted ? phase - layout_.reroute_phase : phase;
  const auto stream = run_.stream_of(run_.dataset().train(), shards.at(static_cast<size_t>(path)));
  weight = static_cast<double>(stream.tokens.size());
  data::WindowSampler sampler(stream.tokens, config.model.context, static_cast<uint64_t>(config.train.seed + path),
                              &stream.targets);
  const int64_t windows_per_step = config.train.batch_size * config.train.grad_accum;
  const auto taken = static_cast<uint64_t>(shard_phase * config.sync.inner_steps * windows_per_step);
  const auto per_epoch = static_cast<uint64_t>(sampler.windows_per_epoch());
  sampler.restore({taken / per_epoch, taken % per_epoch});
  return sampler;
}

// The phase's inner steps, from step `first` of the run's schedule; returns the sum of their
// losses. Gives the task up (Abandoned) when a stop is asked or its lease was lost.
double TaskWorker::train_steps(InnerStep& inner, data::WindowSampler& sampler, int64_t first, int64_t steps,
                               const LeaseKeeper& keeper) {
  double loss_sum = 0;
  for (int64_t step = first; step < first + steps; ++step) {
    if (stopping()) throw Abandoned{false};
    if (keeper.lost()) throw Abandoned{true};
    loss_sum += inner.step(sampler, step, inner.learning_rate(step));
  }
  return loss_sum;
}

void TaskWorker::run_path(const TaskKey& task, const LeaseKeeper& keeper) {
  const auto& config = run_.config();
  const int64_t path = task.path, phase = task.phase;
  auto model = build_model(config);
  const auto read_by_module = run_.load_path(model, path, run_.versions_of(path, phase));
  int64_t read = 0, written = 0;
  for (const auto& [name, bytes] : read_by_module) read += bytes;
  // θ_m of each module at the phase's start: the outer gradients are taken against them.
  std::vector<std::pair<const model::Module*, std::vector<torch::Tensor>>> start;
  for (auto index : run_.plan().modules_of(path)) {
    const auto& module = run_.plan().module(index);
    std::vector<torch::Tensor> copies;
    for (const auto& t : model::module_parameters(model, module).parameters) copies.push_back(t.detach().clone());
    start.emplace_back(&module, std::move(copies));
  }
  model->to(device_);
  model->train();
  auto adamw = make_inner_optimizer(model, config.optim.adamw);
  InnerStep inner(model, adamw, inner_step_options(config), device_, "the modules' published versions are intact");
  const auto previous_inner = load_inner_state(adamw, path, phase, read);
  const int64_t first = phase * config.sync.inner_steps;
  if (phase > 0 && !previous_inner) inner.rewarm_from(first);  // its moments start from zero (a phase deadline)
  double weight = 0;
  auto sampler = path_sampler(path, phase, weight);
  const int64_t steps = std::min(config.sync.inner_steps, config.train.steps - first);
  const auto compute_start = Clock::now();
  const double loss_sum = train_steps(inner, sampler, first, steps, keeper);
  const double compute_s = seconds_since(compute_start);

  // One outer gradient per module, Δ = θ_m − θ_p, and the inner state; then the task's end.
  const std::string who = file_safe(options_.name);
  std::vector<ModuleReport> reports;
  std::map<std::string, int64_t> written_by_module;
  model->to(torch::kCPU);
  for (const auto& [module, before] : start) {
    const auto group = model::module_parameters(model, *module);
    NamedTensors delta;
    for (size_t i = 0; i < group.names.size(); ++i) {
      delta.emplace_back(group.names[i], (before[i] - group.parameters[i].detach().to(torch::kFloat32)).contiguous());
    }
    const auto relative = RunFolder::outer_gradient_name(module->name, phase, path, who);
    save_safetensors(run_.dir() / relative, delta,
                     {{"loco.module", module->name}, {"loco.phase", std::to_string(phase)},
                      {"loco.path", std::to_string(path)}, {"loco.plan", run_.plan().fingerprint()}});
    written_by_module[module->name] = file_bytes(run_.dir() / relative);
    written += written_by_module[module->name];
    reports.push_back({module->name, phase, path, weight, relative});
  }
  const auto inner_file = RunFolder::inner_state_name(path, phase, who);
  save_safetensors(run_.dir() / inner_file, adamw.state(), {{"loco.inner_steps", std::to_string(adamw.steps())}});
  written += file_bytes(run_.dir() / inner_file);
  kept_inner_.reset();
  const auto late = db([&](Registry& r) {
    return r.complete_path(task, options_.name, reports, inner_file, unix_seconds(), config.dipaco.phase_deadline_s);
  });
  kept_inner_ = KeptInner{path, inner_file, adamw.state(), adamw.steps()};
  for (const auto& m : late) {  // not recorded: nothing will read them
    for (const auto& report : reports) {
      if (report.module == m) remove_file(run_.dir(), report.file);
    }
  }
  if (!late.empty()) {
    say(fmt::format("path {} phase {} reported after the phase deadline of {} closed: those modules stepped without it",
                    path, phase + 1, fmt::join(late, ", ")));
  }
  if (previous_inner) remove_file(run_.dir(), *previous_inner);  // the next phase continues from `inner_file`

  const double mean_loss = steps > 0 ? loss_sum / static_cast<double>(steps) : NAN;
  const int64_t step_tokens = steps * inner.tokens_per_step();
  ++summary_.path_tasks;
  summary_.inner_steps += steps;
  summary_.tokens += step_tokens;
  summary_.bytes_read += read;
  summary_.bytes_written += written;
  say(fmt::format("path {} phase {}/{}: {} steps, loss {:.4f}, {:.0f} tok/s; read {}, wrote {}", path, phase + 1,
                  run_.phases(), steps, mean_loss, static_cast<double>(step_tokens) / std::max(compute_s, 1e-9),
                  metrics::format_bytes(static_cast<double>(read)), metrics::format_bytes(static_cast<double>(written))));
  log_.write(metrics::PathTaskEvent{{-1, options_.name}, path, phase, steps, mean_loss, step_tokens, compute_s, read, written,
                                    read_by_module, written_by_module});
}

}  // namespace loco::runtime::dipaco_tasks
