// The coordinator's view of a run for people (docs/status-page.md): every worker process with its
// state, host, step, tokens/s, compute utilization and bytes sent; each worker's training loss and
// the validation loss of the global parameters; bytes per round; and the run's events as a timeline.
// It is fed by the workers' telemetry (POST /v1/telemetry, runtime/worker/telemetry.h), the
// coordinator's own events, and the launcher's word on the processes it started and saw exit. It is
// read as JSON (GET /v1/status, which the page polls) and in Prometheus' text format (GET /metrics).
//
// A worker's state: joining (started or joined, no report yet), training, syncing, evaluating,
// checkpointing, waiting (a DiPaCo worker with no task due) (what it last reported), stalled (no report for `stalled_after`), finished or
// stopped (its summary came), dead (its process exited with a failure, or the membership declared
// it failed), replaced (dead, and another process has since taken its rank).
//
// Times are seconds since the Unix epoch (the workers' events carry theirs). Thread-safe.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <array>
#include <cmath>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "loco/metrics/events.h"

namespace loco::runtime {

struct DashboardOptions {
  double stalled_after_s = 10;  // no report for this long: stalled
  size_t max_points = 2000;     // per curve; older points are thinned (every other one dropped) beyond
  size_t max_events = 500;      // in the timeline; the oldest go first
  size_t max_refusals = 20;     // of those, refused requests at most: a stranger's flood displaces only its own
  size_t max_workers = 4096;    // processes listed; beyond, the oldest that ended makes room
};

class Dashboard {
 public:
  explicit Dashboard(DashboardOptions options = {});

  // A worker's report: the body of POST /v1/telemetry. Throws protocol::ProtocolError naming the
  // field when it is malformed; nothing of it is applied then. A batch whose "seq" was applied
  // already (sent again after its answer was lost) only counts as a sign of life.
  void report(const nlohmann::json& body, double now);
  // The launcher started the process `pid` on `host` as worker `rank` / saw it exit with `status`,
  // `failed` unless it ended cleanly or as asked.
  void process_started(int64_t rank, const std::string& host, int64_t pid, double now);
  void process_exited(const std::string& host, int64_t pid, int status, bool failed, double now);
  // One of the coordinator's own events (joins, failures, epochs, stops), for the timeline.
  void note(const std::string& text, double now);
  // A refused request, for the timeline: the oldest refusal makes room for it past max_refusals,
  // so that refusals never push the run's own events out.
  void note_refusal(const std::string& text, double now);

  // Everything, as GET /v1/status answers; `run` is the coordinator's state (GET /v1/state).
  nlohmann::json status(const nlohmann::json& run, double now) const;
  // The Prometheus text exposition format (version 0.0.4).
  std::string prometheus(const nlohmann::json& run, double now) const;

 private:
  struct Worker {
    int64_t rank = -1, member = -1, pid = 0;
    std::string name, host, activity = "joining";
    double started = 0, last_seen = 0;  // last_seen 0: never reported
    int64_t session = 0, last_seq = -1;  // its telemetry sender, and the last batch of it applied
    int64_t step = 0, tokens = 0, bytes_sent = 0, rounds = 0, dropped = 0;
    double tokens_per_s = 0, loss = NAN, utilization = NAN;
    std::optional<int> exit_status;
    bool failed = false;  // its process exited with a failure
    std::optional<std::string> ended;  // "finished" or "stopped": its summary came
    std::optional<double> end_time;
    std::vector<std::array<double, 4>> losses;  // (time, step, tokens, loss)
  };
  struct Round {
    double time = 0;
    int64_t bytes = 0, reports = 0;
    int64_t rejected = 0;  // outer gradients screening left out of it
  };

  // The row of a process, added when new; nullptr when the table is full of live processes.
  Worker* worker_for(const std::string& host, int64_t pid, double now);
  void apply(Worker& w, const metrics::TimedEvent& event);
  void add_event(double time, std::string who, std::string text, bool failure);
  std::string state_of(const Worker& w, size_t index, const nlohmann::json& run, double now) const;
  // {"workers": every process's row, "counts": processes per state, "telemetry_dropped"}; under the lock.
  nlohmann::json rows_locked(const nlohmann::json& run, double now) const;
  nlohmann::json worker_json(const Worker& w, size_t index, const nlohmann::json& run, double now) const;

  const DashboardOptions options_;
  mutable std::mutex mutex_;
  double created_ = 0;
  std::vector<Worker> workers_;        // in order of appearance
  std::vector<std::array<double, 5>> val_;  // (time, step, tokens, val_loss, bytes sent by all so far)
  std::map<int64_t, Round> rounds_;    // by round number: bytes sent by all workers
  std::deque<nlohmann::json> events_;  // the timeline
  int64_t dropped_ = 0;                // telemetry events lost by workers whose coordinator was unreachable
  int64_t rejected_ = 0;               // outer gradients screening left out, over the run
};

}  // namespace loco::runtime
