// A step task (worker.h): module M's outer step of a phase, from version phase to phase + 1: the
// weighted average of the outer gradients its paths reported, through its outer optimizer
// (algorithms/dipaco.h; Douillard et al. 2024, arXiv 2403.10616, Algorithm 1).
#include "loco/algorithms/dipaco.h"
#include "loco/core/error.h"
#include "loco/runtime/dipaco/task_worker.h"
#include "loco/runtime/store/modules.h"
#include "loco/runtime/store/safetensors.h"

namespace loco::runtime::dipaco_tasks {

namespace fs = std::filesystem;

// Module `task.module`'s outer step of phase `task.phase`: from version phase to phase + 1.
void TaskWorker::run_step(const TaskKey& task) {
  const auto& module = run_.plan().module(run_.plan().find(task.module));
  const auto saved = load_module(run_.dir(), module.name, task.phase, run_.plan().fingerprint(), run_.max_file_bytes());
  int64_t read = file_bytes(module_file(run_.dir(), module.name, task.phase)) +
                 file_bytes(module_outer_file(run_.dir(), module.name, task.phase));
  std::vector<std::string> names;
  std::vector<torch::Tensor> parameters;
  for (const auto& [name, tensor] : saved.parameters) {
    names.push_back(name);
    parameters.push_back(tensor.clone());
  }
  algorithms::ModuleState state(module.name, names, parameters, outer_options(run_.config()));
  state.load_optimizer_state(saved.outer_state);
  if (state.version() != task.phase) {
    throw DataError("dipaco", fmt::format("module {} v{} holds an outer optimizer of {} steps", module.name, task.phase,
                                          state.version()));
  }
  std::vector<algorithms::PathReport> reports;
  std::vector<std::string> consumed;
  for (const auto& report : db([&](Registry& r) { return r.reports(module.name, task.phase); })) {
    const auto file = load_checksummed_safetensors(run_.dir(), report.file, run_.max_file_bytes());
    read += file_bytes(run_.dir() / report.file);
    algorithms::PathReport path_report{report.path, report.weight, {}};
    for (size_t i = 0; i < names.size(); ++i) {
      if (i >= file.tensors.size() || file.tensors[i].first != names[i]) {
        throw DataError("dipaco", fmt::format("{}: the outer gradient does not hold module {}'s tensor {}", report.file,
                                              module.name, names[i]));
      }
      path_report.outer_gradient.push_back(file.tensors[i].second);
    }
    reports.push_back(std::move(path_report));
    consumed.push_back(report.file);
  }
  // Screening (docs/failure-model.md): the sync's keys, over the paths through the module.
  const auto& sync = run_.config().sync;
  algorithms::ScreenedSync screened;
  state.step(reports, run_.config().dipaco.outer_rescale,
             {sync.reject_ratio, sync.clip_norm, comm::Combine::kSum, 1, sync.reject_not_finite}, &screened);
  ModuleVersion next{module.name, task.phase + 1, run_.plan().fingerprint(), {}, state.optimizer().state()};
  for (size_t i = 0; i < names.size(); ++i) next.parameters.emplace_back(names[i], state.parameters()[i]);
  save_module(run_.dir(), next);
  const auto file = module_file(run_.dir(), module.name, next.version);
  const int64_t written = file_bytes(file) + file_bytes(module_outer_file(run_.dir(), module.name, next.version));
  db([&](Registry& r) { r.complete_step(task, options_.name, fs::relative(file, run_.dir()).string()); });
  // What the step consumed: the phase's outer gradients, and the version before the previous one
  // (no task reads it any more: every path through the module has reported past it), unless it
  // is one that dipaco.keep_every keeps for early stopping.
  for (const auto& report : consumed) remove_file(run_.dir(), report);
  const int64_t keep = run_.config().dipaco.keep_every;
  const bool kept = keep > 0 && (task.phase - 1) % keep == 0;
  // No step reads an outer state older than this one's; early stopping needs the parameters only.
  if (task.phase >= 1) remove_file(run_.dir(), module_outer_file(run_.dir(), module.name, task.phase - 1).lexically_relative(run_.dir()));
  if (task.phase >= 1 && !kept && !db([&](Registry& r) { return r.version_needed(module.name, task.phase - 1); })) {
    remove_file(run_.dir(), module_file(run_.dir(), module.name, task.phase - 1).lexically_relative(run_.dir()));
  }
  ++summary_.step_tasks;
  summary_.bytes_read += read;
  summary_.bytes_written += written;
  say(fmt::format("module {} v{} from {} path(s){}", module.name, next.version, reports.size(),
                  screened.why.empty() ? "" : fmt::format(" ({} left out: {})", screened.rejected, screened.why)));
  log_.write(metrics::StepTaskEvent{{-1, options_.name}, module.name, next.version, static_cast<int64_t>(reports.size()), read,
                                    written, screened.rejected, screened.why});
}

}  // namespace loco::runtime::dipaco_tasks
