// `loco report RUN...`: one Markdown table comparing finished runs, read from their config.toml
// and metrics.jsonl (what the benchmark scripts print); the same reports as JSON, to keep measured
// baselines; and a run compared with baselines (what the main job ends with).
#pragma once

#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

namespace loco::runtime {

// One sync of a run, as its worker logged it (not kept in JSON reports).
struct SyncTiming {
  int64_t worker = 0, step = 0, fragment = -1;
  double seconds = 0, bytes = 0;    // the exchange's time; the larger of its bytes sent and received
  double round_trip_s = 0;          // its group's measured round trip (0: not measured)
  double rate_bps = NAN;            // its worker's link rate (RUN/links.json; 0 = not shaped, NaN = no links)
};

struct RunReport {
  std::string name;                 // the run folder's name
  std::string algorithm;
  int64_t workers = 0, inner_steps = 0, steps = 0, tokens = 0, rounds = 0;
  double val_loss = 0, val_ppl = 0;  // worker 0's (the global parameters); `local`: the replicas' mean
  double bytes_sent = 0, bytes_received = 0;  // per worker (the most any worker moved), all sessions
  double wall_s = 0;
  bool finished = false;            // every worker's last summary was not interrupted
  // From summaries that carry them (runs of loco before these existed show "-"): the most bytes a
  // worker sent during one inner step, its seconds waiting for communication (the most of any
  // worker), and the mean compute utilization of the workers' last sessions.
  double peak_step_bytes = NAN, stall_s = NAN, compute_utilization = NAN;
  // End to end: each worker's time computing over its whole wall time (its last session's), by
  // rank, and their mean for the run (NaN / empty: runs from before loco measured it).
  double end_to_end_utilization = NAN;
  std::vector<double> worker_utilization;
  // With several workers: what DDP would send per worker in the same run, every step a ring
  // all-reduce of the fp32 gradients, 2(M − 1)/M × 4 bytes × parameters.
  double ddp_bytes = NAN;
  // Over emulated links (`loco launch --link`, RUN/links.json): the median over the run's syncs
  // of what each took beyond its bytes at its worker's link rate, in the round trips its group
  // measured (round_trips_beyond); NaN without links or measured round trips.
  double round_trips_beyond = NAN;
  // Each worker's wall time (its last session's), by rank; the slowest worker's time in its inner
  // steps (sync hooks included; start-up, and the evaluation and checkpoints after, left out).
  std::vector<double> worker_wall_s;
  double steps_s = NAN;
  // Against the same run over an ideal network (set_goodput): its wall time over this one's, for
  // the run (the slowest worker's) and for each worker; NaN / empty without a reference.
  double goodput = NAN;
  std::vector<double> worker_goodput;
  // The same over the time in steps: what the link costs, start-up left out (it does not grow with
  // the run, and dominates a run of a few DDP steps).
  double steps_goodput = NAN;
  // Also against the ideal run: the median over syncs of what each took beyond its bytes and beyond
  // the same sync (worker, step, fragment) over the ideal network, in round trips: what the link
  // itself added past its bytes, the compute of the exchange (encoding, summing) left out.
  double round_trips_beyond_ideal = NAN;
  std::vector<SyncTiming> syncs;
  // train.emulated_step_s of the run: > 0 when its compute was emulated (no loss).
  double emulated_step_s = 0;
};

// Sets `run`'s goodput against `ideal`, the same run (binary, config, CPU shares, seed) over no
// emulated link: ideal wall time / this run's, for the run and for each worker; and
// round_trips_beyond_ideal. Throws DataError when the two are not the same run (algorithm,
// workers or steps differ).
void set_goodput(RunReport& run, const RunReport& ideal);

// What one sync took beyond moving its bytes, in round trips: (seconds − max(sent, received) ×
// 8 / rate) / round trip. The link carries both directions at `rate_bps` at once; 0 = not shaped
// (no byte term). NaN when the round trip is not known (0).
double round_trips_beyond(double seconds, double bytes_sent, double bytes_received, double rate_bps, double round_trip_s);

nlohmann::json to_json(const RunReport& report);
// Throws DataError naming `where` when a field is missing or of the wrong type.
RunReport report_from_json(const nlohmann::json& json, const std::string& where);

// A DiPaCo run's own section (empty for other runs): its paths against the corpus's labels
// (RUN/routing/clusters.md: what the router learned) and each path's score once it finished.
std::string dipaco_report(const std::filesystem::path& run);

// Reads one run folder (a DiPaCo run's too: its bytes are those written to and read from the
// shared store). Throws DataError naming the file when it holds no run.
RunReport read_run_report(const std::filesystem::path& run);
// A run folder's report, or every report in a JSON file (an array, as `loco report --json` writes).
std::vector<RunReport> read_reports(const std::filesystem::path& path);
// The Markdown table of `reports`.
std::string report_table(const std::vector<RunReport>& reports);
// Lines comparing `run` with each baseline: its loss against theirs (nats and percent) and its bytes
// against theirs, and the bytes DDP would have sent for it.
std::string compare_with_baselines(const RunReport& run, const std::vector<RunReport>& baselines);

}  // namespace loco::runtime
