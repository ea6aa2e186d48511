// Inside a DiPaCo worker (worker.h): the loop over leased tasks (worker.cpp) and each kind of task
// (path_task.cpp, step_task.cpp, route_task.cpp), as one object per worker. Not for other folders.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "loco/data/batcher.h"
#include "loco/metrics/metrics_log.h"
#include "loco/optim/adamw.h"
#include "loco/runtime/dipaco/run.h"
#include "loco/runtime/dipaco/worker.h"
#include "loco/runtime/worker/inner_step.h"

namespace loco::runtime::dipaco_tasks {

using Clock = std::chrono::steady_clock;

double unix_seconds();
double seconds_since(Clock::time_point start);

// Renews a task's lease from its own thread and connection while the task runs.
class LeaseKeeper {
 public:
  LeaseKeeper(const RunConfig& config, TaskKey task, std::string worker, std::FILE* out);
  ~LeaseKeeper();
  LeaseKeeper(const LeaseKeeper&) = delete;
  LeaseKeeper& operator=(const LeaseKeeper&) = delete;
  bool lost() const { return lost_; }

 private:
  TaskKey task_;
  std::string worker_;
  double lease_s_;
  std::atomic<bool> lost_ = false;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool done_ = false;
  std::thread thread_;
};

// A task given up before its end (a stop was asked, or its lease was lost).
struct Abandoned {
  bool lost = false;
};

class TaskWorker {
 public:
  // Throws DataError when the run is not started, or was started with another plan.
  TaskWorker(const RunConfig& config, const DipacoWorkerOptions& options);
  DipacoWorkerSummary run();

 private:
  bool stopping() const { return options_.stop != nullptr && options_.stop->load(); }
  void say(const std::string& line);
  void run_task(const TaskKey& task);

  // Runs `request` on the registry; when the database is unavailable (a server restarting), on a
  // new connection, again, for up to cluster.coordinator_timeout_s. A request that committed but
  // whose answer was lost is safe to repeat: a second lease only delays a task by its lease, a
  // second completion is refused as a lost lease (the work was recorded the first time).
  template <class F>
  auto db(F&& request) -> decltype(request(std::declval<Registry&>())) {
    const auto start = Clock::now();
    for (int attempt = 0;; ++attempt) {
      try {
        if (!registry_) registry_ = open_run_registry(run_.config());
        return request(*registry_);
      } catch (const DatabaseUnavailable& e) {
        registry_.reset();
        if (seconds_since(start) > run_.config().cluster.coordinator_timeout_s || stopping()) throw;
        if (attempt == 0) {
          say(fmt::format("the registry is unavailable ({}); trying again for up to {:g} s (cluster.coordinator_timeout_s)",
                          e.what(), run_.config().cluster.coordinator_timeout_s));
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(500));
      }
    }
  }

  // path_task.cpp
  void run_path(const TaskKey& task, const LeaseKeeper& keeper);
  std::optional<std::string> load_inner_state(optim::AdamW& adamw, int64_t path, int64_t phase, int64_t& read);
  data::WindowSampler path_sampler(int64_t path, int64_t phase, double& weight);
  double train_steps(InnerStep& inner, data::WindowSampler& sampler, int64_t first, int64_t steps, const LeaseKeeper& keeper);
  // step_task.cpp
  void run_step(const TaskKey& task);
  // route_task.cpp
  void run_route(const TaskKey& task);

  DipacoWorkerOptions options_;
  DipacoRun run_;
  std::unique_ptr<Registry> registry_;
  metrics::MetricsLog log_;
  std::vector<std::vector<int64_t>> documents_;                          // k-means's shards
  std::optional<std::vector<std::vector<int64_t>>> rerouted_documents_;  // the re-routing's, once read
  RunLayout layout_;
  torch::Device device_ = torch::kCPU;
  int64_t threads_ = 1;
  DipacoWorkerSummary summary_;
  // The inner state of the last path task this worker completed, as written to `file`: the queue
  // offers this worker that path's next phase first, which then continues from memory.
  struct KeptInner {
    int64_t path = -1;
    std::string file;
    std::vector<std::pair<std::string, torch::Tensor>> tensors;
    int64_t steps = 0;
  };
  std::optional<KeptInner> kept_inner_;
};

}  // namespace loco::runtime::dipaco_tasks
