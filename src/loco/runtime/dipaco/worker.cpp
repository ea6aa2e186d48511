#include "loco/runtime/dipaco/worker.h"

#include <sys/resource.h>
#include <unistd.h>

#include "loco/core/error.h"
#include "loco/core/run_folder.h"
#include "loco/model/precision.h"
#include "loco/runtime/dipaco/task_worker.h"
#include "loco/runtime/worker/weights.h"
#include "loco/runtime/worker/worker.h"

namespace loco::runtime {
namespace dipaco_tasks {

double unix_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}
double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

LeaseKeeper::LeaseKeeper(const RunConfig& config, TaskKey task, std::string worker, std::FILE* out)
    : task_(std::move(task)), worker_(std::move(worker)), lease_s_(config.dipaco.lease_s) {
  thread_ = std::thread([this, config, out] {
    std::unique_ptr<Registry> registry;
    std::unique_lock lock(mutex_);
    while (!done_) {
      wake_.wait_for(lock, std::chrono::duration<double>(lease_s_ / 4));
      if (done_) break;
      lock.unlock();
      try {
        if (!registry) registry = open_run_registry(config);
        if (!registry->renew(task_, worker_, unix_seconds(), lease_s_)) lost_ = true;
      } catch (const std::exception& e) {  // the database is away: the lease may run out; the end will tell
        registry.reset();
        std::fprintf(out, "%s: cannot renew the lease: %s\n", worker_.c_str(), e.what());
      } catch (...) {
        registry.reset();
      }
      lock.lock();
    }
  });
}

LeaseKeeper::~LeaseKeeper() {
  {
    std::lock_guard lock(mutex_);
    done_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

TaskWorker::TaskWorker(const RunConfig& config, const DipacoWorkerOptions& options)
    : options_(options), run_(DipacoRun::open(config)), log_(RunFolder(run_.dir()).metrics()) {
  // Through db(): a worker that starts while the database restarts waits for it like the others.
  auto layout = db([](Registry& r) { return r.layout(); });
  if (!layout) {
    throw DataError("dipaco", fmt::format("the run {} is not started (no layout in its registry); hint: `loco launch "
                                          "--config FILE` prepares and starts it", run_.dir().string()));
  }
  if (layout->plan != run_.plan().fingerprint() || layout->phases != run_.phases()) {
    throw DataError("dipaco", fmt::format("the run {} was started with plan {} and {} phases; this config makes plan {} "
                                          "and {} phases", run_.dir().string(), layout->plan, layout->phases,
                                          run_.plan().fingerprint(), run_.phases()));
  }
  layout_ = *layout;
  documents_ = run_.path_documents();
  device_ = model::resolve_device(run_.config().train.device);
  threads_ = configure_threads(run_.config().train.threads);
}

DipacoWorkerSummary TaskWorker::run() {
  const auto start = Clock::now();
  say(fmt::format("joined {} ({} paths, {} phases of {} inner steps; device {}, {} threads)", run_.dir().string(),
                  run_.plan().paths(), run_.phases(), run_.config().sync.inner_steps, device_.str(), threads_));
  int64_t tasks = 0;
  while (options_.max_tasks < 0 || tasks < options_.max_tasks) {
    if (stopping()) {
      summary_.interrupted = true;
      break;
    }
    const int64_t kept_path = kept_inner_ ? kept_inner_->path : -1;
    auto task = db([&](Registry& r) { return r.lease(options_.name, unix_seconds(), run_.config().dipaco.lease_s, kept_path); });
    if (!task) {
      if (db([](Registry& r) { return r.finished(); })) break;
      std::this_thread::sleep_for(std::chrono::duration<double>(options_.poll_s));
      continue;
    }
    ++tasks;
    const auto task_start = Clock::now();
    try {
      run_task(*task);
    } catch (const LeaseLost& e) {
      ++summary_.lost_tasks;
      say(fmt::format("dropped {}: {}", describe(*task), e.what()));
    } catch (const DataError& e) {
      // A task that lost its lease may find its inputs gone (the worker that completed it in its
      // place removed them): dropped like a lost lease. Held still, the error is real.
      if (db([&](Registry& r) { return r.holds(*task, options_.name); })) throw;
      ++summary_.lost_tasks;
      say(fmt::format("dropped {}: its lease ran out and another worker has it ({})", describe(*task), e.what()));
    } catch (const Abandoned& a) {
      if (a.lost) {
        ++summary_.lost_tasks;
        say(fmt::format("dropped {}: its lease ran out and another worker has it", describe(*task)));
      } else {
        db([&](Registry& r) { r.release(*task, options_.name); });
        say(fmt::format("stopped; {} is open again for another worker", describe(*task)));
      }
    }
    summary_.busy_s += seconds_since(task_start);
  }
  summary_.wall_s = seconds_since(start);
  rusage usage{};
  if (::getrusage(RUSAGE_SELF, &usage) == 0) summary_.peak_rss_bytes = static_cast<int64_t>(usage.ru_maxrss) * 1024;
  log_.write(metrics::WorkerSummaryEvent{{-1, options_.name}, summary_.path_tasks, summary_.step_tasks, summary_.lost_tasks,
                                         summary_.inner_steps, summary_.tokens, summary_.bytes_read, summary_.bytes_written,
                                         summary_.wall_s, summary_.busy_s, summary_.peak_rss_bytes, summary_.interrupted});
  return summary_;
}

void TaskWorker::run_task(const TaskKey& task) {
  LeaseKeeper keeper(run_.config(), task, options_.name, options_.out);
  switch (task.scope) {
    case TaskScope::kPath: run_path(task, keeper); break;
    case TaskScope::kModuleStep: run_step(task); break;
    case TaskScope::kRoute: run_route(task); break;
    case TaskScope::kModel:
    case TaskScope::kFragment: throw DataError("dipaco", fmt::format("the registry holds a task of a dense run: {}", describe(task)));
  }
}

void TaskWorker::say(const std::string& line) {
  fmt::print(options_.out, "{}: {}\n", options_.name, line);
  std::fflush(options_.out);
}

}  // namespace dipaco_tasks

DipacoWorkerSummary run_dipaco_worker(const RunConfig& config, const DipacoWorkerOptions& options) {
  DipacoWorkerOptions resolved = options;
  if (resolved.name.empty()) resolved.name = process_name(::getpid());
  return dipaco_tasks::TaskWorker(config, resolved).run();
}

}  // namespace loco::runtime
