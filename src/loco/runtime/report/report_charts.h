// Pictures of finished runs, `loco report RUN... --html FILE --svg DIR` (docs/status-page.md): loss
// against tokens, bytes communicated and wall time, training loss against step, compute utilization
// and membership over time, every run overlaid. The HTML is one self-contained file (uPlot, its
// script and the data inlined: it opens offline from disk); the SVG files are drawn by gnuplot.
#pragma once

#include <nlohmann/json.hpp>

#include <array>
#include <filesystem>
#include <string>
#include <vector>

#include "loco/runtime/report/report.h"

namespace loco::runtime {

// A run's curves, read from its metrics.jsonl.
struct RunCurves {
  std::string label;  // the run's name and algorithm
  // The validation loss of the global parameters at each evaluation: (step, tokens trained on by all
  // workers, bytes sent by all workers by then, seconds since the run started, val_loss).
  std::vector<std::array<double, 5>> val;
  // The training loss, the mean over the workers that logged the step: (step, tokens, loss).
  std::vector<std::array<double, 3>> train;
  // Workers running over time: (seconds since the start, count), a step function (a worker runs
  // from its first event to its last).
  std::vector<std::array<double, 2>> membership;
  // Each worker's share of its inner-step time spent computing, at each logged step (runs of loco
  // that log it): (seconds since the start, the mean over the workers that logged by then).
  std::vector<std::array<double, 2>> utilization;
};

// Throws DataError naming the file when the run's metrics cannot be read.
RunCurves read_run_curves(const std::filesystem::path& run, const RunReport& report);
nlohmann::json to_json(const RunCurves& curves);

// The self-contained HTML report of `reports` and their curves (the same order).
std::string report_html(const std::vector<RunReport>& reports, const std::vector<RunCurves>& curves);

// Writes DIR/{loss-tokens,loss-bytes,loss-wall,train-loss,utilization,membership}.svg with gnuplot
// (Debian's gnuplot-nox; scripts/setup.sh installs it), and their gnuplot scripts beside them.
// Returns the files written. Throws Error with a hint when gnuplot is missing or fails.
std::vector<std::filesystem::path> write_report_svgs(const std::vector<RunReport>& reports,
                                                     const std::vector<RunCurves>& curves, const std::filesystem::path& dir);

}  // namespace loco::runtime
