// A run folder's layout (run.dir): every path loco writes or reads under it, named once. The
// processes of a run share the folder (on one host) or each keep the part they write (across hosts:
// docs/failure-model.md); this says where each part lives, not who writes it.
//
//   lock                   held (flock) by the process that drives the run: its pid, host and command
//   config.toml            the run's config, as the first process resolved it
//   metrics.jsonl          every process's events (metrics/events.h)
//   join_token             the generated secret workers join with (runtime/net/auth.h)
//   coordinator.json       an elastic coordinator's membership table
//   outer.safetensors      an asynchronous DiLoCo run's outer state, the coordinator's
//   shards.json            which documents each worker reads (a fixed run's rank 0)
//   checkpoints/           the run's checkpoints: one process's, or an elastic run's global ones
//   workers/<rank>/checkpoints/   each worker's own, in a fixed distributed run
//   slots/<slot>/          an elastic run's inner state of each slot
//   dipaco.sqlite          a DiPaCo run's registry (or PostgreSQL: dipaco.database)
//   routing/, routing/phase<p>/   its routing of the documents to paths (paths.json, router.safetensors,
//                          clusters.md): the first, and each re-routing's
//   modules/<module>/v<n>.safetensors   each module's versions (θ and outer state)
//   reports/<module>/phase<p>/P<path>-<who>.safetensors   a path task's outer gradient of a module
//   paths/P<path>/inner-<phase>-<who>.safetensors   a path's inner AdamW state
//   dipaco-eval.json       the final evaluation of the paths (early stopping reads it)
// DiPaCo's registry records its files by their names relative to the folder (the *_name functions).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <utility>

namespace loco {

class RunFolder {
 public:
  explicit RunFolder(std::filesystem::path dir) : dir_(std::move(dir)) {}

  const std::filesystem::path& dir() const { return dir_; }
  // Whether the folder exists and holds nothing but its join token (and lock): what a launch that
  // failed before any process wrote to it leaves (a missing dataset, a busy port). A retry may use it.
  bool unstarted() const;
  // Refuses (ConfigError of `module`) a folder that a new run must not write into: a file, or a folder
  // that holds a run. A missing or empty folder, or one a failed start left (unstarted), is taken.
  void check_new_run(std::string_view module) const;
  std::filesystem::path lock() const { return dir_ / "lock"; }
  std::filesystem::path config() const { return dir_ / "config.toml"; }
  std::filesystem::path metrics() const { return dir_ / "metrics.jsonl"; }
  std::filesystem::path join_token() const { return dir_ / "join_token"; }
  std::filesystem::path coordinator_state() const { return dir_ / "coordinator.json"; }
  std::filesystem::path outer_state() const { return dir_ / "outer.safetensors"; }
  std::filesystem::path shards() const { return dir_ / "shards.json"; }
  // `loco launch --link`: each worker's emulated link, for `loco report`.
  std::filesystem::path links() const { return dir_ / "links.json"; }
  std::filesystem::path checkpoints() const { return dir_ / "checkpoints"; }
  std::filesystem::path workers() const { return dir_ / "workers"; }
  std::filesystem::path worker_dir(int64_t rank) const { return workers() / std::to_string(rank); }
  std::filesystem::path worker_checkpoints(int64_t rank) const { return worker_dir(rank) / "checkpoints"; }
  std::filesystem::path slots() const { return dir_ / "slots"; }
  std::filesystem::path slot_state(int64_t slot) const { return slots() / std::to_string(slot); }
  std::filesystem::path dipaco_registry() const { return dir_ / "dipaco.sqlite"; }
  std::filesystem::path dipaco_evaluation() const { return dir_ / "dipaco-eval.json"; }
  // `module` must be a plain file name (store/modules.cpp checks).
  std::filesystem::path module_version(const std::string& module, int64_t version) const {
    return dir_ / "modules" / module / ("v" + std::to_string(version) + ".safetensors");
  }
  static std::string routing_name() { return "routing"; }
  static std::string rerouting_name(int64_t phase) { return routing_name() + "/phase" + std::to_string(phase); }
  static std::string outer_gradient_name(const std::string& module, int64_t phase, int64_t path, const std::string& who) {
    return "reports/" + module + "/phase" + std::to_string(phase) + "/P" + std::to_string(path) + "-" + who + ".safetensors";
  }
  static std::string inner_state_name(int64_t path, int64_t phase, const std::string& who) {
    return "paths/P" + std::to_string(path) + "/inner-" + std::to_string(phase) + "-" + who + ".safetensors";
  }
  std::filesystem::path routing() const { return dir_ / routing_name(); }
  std::filesystem::path routing_paths() const { return routing() / "paths.json"; }
  std::filesystem::path routing_clusters() const { return routing() / "clusters.md"; }

 private:
  std::filesystem::path dir_;
};

// The run folder's owner: the process that drives a run (`loco train`, `loco launch`, `loco
// coordinator`) holds an exclusive lock on RUN/lock for as long as it runs, so that a second one
// pointed at the same folder is refused instead of writing into it alongside. The kernel releases
// the lock when its holder exits, however it exits (a SIGKILL included): a stale file never blocks.
// The file names its holder (pid, host, command) for the refusal. Workers started by a launcher
// do not take it (their launcher holds it); nor do DiPaCo's path workers, which share a run by design.
class RunLock {
 public:
  // Creates the folder if needed and takes the lock; throws ConfigError of `module`, naming the
  // holder, when another process holds it, and Error when the file cannot be made.
  static RunLock acquire(const std::filesystem::path& dir, std::string_view module, std::string_view command);
  RunLock(RunLock&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  RunLock& operator=(RunLock&&) = delete;
  RunLock(const RunLock&) = delete;
  ~RunLock();

 private:
  explicit RunLock(int fd) : fd_(fd) {}
  int fd_ = -1;
};

}  // namespace loco
