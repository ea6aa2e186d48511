#include "loco/runtime/coordinator/run.h"

#include <fmt/ranges.h>

#include <random>

#include "loco/core/files.h"
#include "loco/core/hash.h"
#include "loco/core/run_folder.h"
#include "loco/runtime/store/checkpoint.h"

namespace loco::runtime {
namespace {

std::string random_run_id() {
  std::random_device device;
  return hex64((static_cast<uint64_t>(device()) << 32) ^ device());
}

// Whether the newest complete checkpoint under `checkpoints` is of `last_step` (or later).
bool finished_checkpoints(const std::filesystem::path& checkpoints, int64_t last_step) {
  const auto steps = CheckpointStore(checkpoints, 1).steps();
  return !steps.empty() && steps.back() >= last_step;
}

}  // namespace

RunStatus::RunStatus() : run_id_(random_run_id()) {}

void RunStatus::enter(protocol::Phase next) {
  LOCO_CHECK(protocol::legal_transition(phase_, next), "the run cannot go from {} to {}", protocol::to_string(phase_),
             protocol::to_string(next));
  phase_ = next;
}

bool RunStatus::fail(const std::string& why) {
  if (ended()) return false;
  enter(protocol::Phase::kFailed);
  reason_ = why;
  return true;
}

void RunStatus::stop(const std::string& why) {
  stopping_ = true;
  if (reason_.empty()) reason_ = why;
}

void refuse_join_when_over(const RunStatus& status) {
  if (status.ended()) {
    const auto why = fmt::format("the run is {}{}", protocol::to_string(status.phase()),
                                 status.phase() == protocol::Phase::kFailed ? ": " + status.reason() : "");
    if (status.phase() == protocol::Phase::kFinished) throw Completed(why);
    throw Refusal(why);
  }
  if (status.stopping()) throw Refusal("the run is stopping");
}

std::optional<FinishedRun> finished_run(const RunConfig& config, bool one_process) {
  if (config.sync.async) return std::nullopt;
  const RunFolder run(config.run.dir);
  if (config.cluster.elastic) {
    const auto file = run.coordinator_state();
    std::error_code error;
    if (!std::filesystem::exists(file, error)) return std::nullopt;
    try {  // a malformed file is no record: the coordinator reads it again and names what is wrong
      const auto saved = nlohmann::json::parse(read_file_beneath(run.dir(), file.filename(), "coordinator", kMaxRunTextBytes));
      // A stopped run ends "finished" too once every member left: it is not, unless its last
      // step's global checkpoint is there (an emulated run saves none, and its record is the file).
      const bool complete = config.train.emulated_step_s > 0 || finished_checkpoints(run.checkpoints(), config.train.steps);
      if (saved.is_object() && saved.value("phase", "") == protocol::to_string(protocol::Phase::kFinished) &&
          !saved.value("stopping", false) && complete) {
        return FinishedRun{fmt::format("{} records it finished", file.string()), run.checkpoints()};
      }
    } catch (const std::exception&) {
    }
    return std::nullopt;
  }
  if (one_process) {
    if (!finished_checkpoints(run.checkpoints(), config.train.steps)) return std::nullopt;
    return FinishedRun{fmt::format("{} holds the checkpoint of its last step, {}", run.checkpoints().string(),
                                   config.train.steps), run.checkpoints()};
  }
  for (int64_t rank = 0; rank < config.cluster.workers; ++rank) {
    if (!finished_checkpoints(run.worker_checkpoints(rank), config.train.steps)) return std::nullopt;
  }
  const auto each = run.workers() / "RANK" / "checkpoints";
  return FinishedRun{fmt::format("each of its {} workers' checkpoints, {}, holds its last step, {}", config.cluster.workers,
                                 each.string(), config.train.steps), each};
}

std::string describe(const FinishedRun& finished, const RunConfig& config) {
  return fmt::format("the run in {} finished already ({}): nothing is left to train and nothing was changed; its report: "
                     "loco report {}; its checkpoints: {}; to train on, start a new run in another --run.dir",
                     config.run.dir, finished.record, config.run.dir, finished.checkpoints.string());
}

void RunIdentity::check(const protocol::JoinRequest& request, const RunConfig& theirs) {
  auto changed_keys = differences_except(config_, theirs, kPerWorkerKeys);
  if (!changed_keys.empty()) {
    throw Refusal(fmt::format("{}'s config differs from the run's (run -> worker): {}", request.name,
                              fmt::join(changed_keys, "; ")));
  }
  if (!dataset_) {
    dataset_ = request.dataset;  // the first worker's dataset is the run's
  } else if (auto diff = dataset_->differences(request.dataset); !diff.empty()) {
    throw Refusal(fmt::format("{}'s dataset differs from the run's: {}; every worker needs the same prepared dataset",
                              request.name, fmt::join(diff, "; ")));
  }
}

}  // namespace loco::runtime
