// `loco report RUN...`: one Markdown table comparing finished runs, read from their config.toml
// and metrics.jsonl (what the benchmark scripts print).
#pragma once

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

namespace loco::runtime {

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
};

// Reads one run folder. Throws DataError naming the file when it holds no run.
RunReport read_run_report(const std::filesystem::path& run);
// The Markdown table of `reports`.
std::string report_table(const std::vector<RunReport>& reports);

}  // namespace loco::runtime
