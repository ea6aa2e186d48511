#include "loco/runtime/simulate/simulate.h"

#include <fmt/format.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

// The papers' own simulations (Douillard et al. 2025, table 4; Kale et al. 2025, table 5), as loco
// reproduces them: each row's setting in this simulator's terms, and the grid the papers read their
// bandwidths from (docs/slow-links.md).
namespace loco::runtime {

const std::vector<double> kPublishedTargets = {0.5, 0.8, 0.9, 0.95, 0.99};

const std::vector<PublishedRow>& published_simulation() {
  static const std::vector<PublishedRow> rows = {
      {"1B", 1e9, 24, 0.1, "Data-Parallel", "Douillard T4, Kale T5", {86.8, 152.6, 184.2, 222.3, 569.0}},
      {"1B", 1e9, 24, 0.1, "DiLoCo", "Douillard T4", {1.4, 6.2, 13.3, 23.3, 86.8}},
      {"1B", 1e9, 24, 0.1, "Streaming DiLoCo", "Douillard T4, Kale T5", {1.4, 5.2, 9.1, 16.0, 28.1}},
      {"1B", 1e9, 24, 0.1, "Streaming DiLoCo, 1-inner-step overlapped", "Douillard T4", {1.4, 4.3, 6.2, 9.1, 11.0}},
      {"1B", 1e9, 24, 0.1, "1-inner-step overlapped FP4, H=100", "Douillard T4, Kale T5", {0.4, 0.9, 1.7, 2.0, 3.0}},
      {"1B", 1e9, 24, 0.1, "1-inner-step overlapped FP4, H=30", "Kale T5", {2.4, 3.6, 4.3, 4.3, 4.3}},
      {"1B", 1e9, 24, 0.1, "1-outer-step overlapped FP4, H=30", "Kale T5", {1.1, 2.0, 2.0, 2.0, 2.4}},
      {"1B", 1e9, 24, 0.1, "1-outer-step overlapped FP4, H=100", "Kale T5", {0.1, 0.2, 0.2, 0.2, 0.2}},
      {"10B", 1e10, 48, 0.8, "Data-Parallel", "Douillard T4, Kale T5", {104.8, 222.3, 222.3, 268.3, 471.5}},
      {"10B", 1e10, 48, 0.8, "DiLoCo", "Douillard T4", {1.7, 7.5, 16.0, 33.9, 104.8}},
      {"10B", 1e10, 48, 0.8, "Streaming DiLoCo", "Douillard T4, Kale T5", {1.7, 5.2, 9.1, 13.3, 19.3}},
      {"10B", 1e10, 48, 0.8, "Streaming DiLoCo, 1-inner-step overlapped", "Douillard T4", {1.7, 3.6, 5.2, 6.2, 7.5}},
      {"10B", 1e10, 48, 0.8, "1-inner-step overlapped FP4, H=100", "Douillard T4, Kale T5", {0.4, 0.9, 1.4, 1.4, 1.7}},
      {"10B", 1e10, 48, 0.8, "1-inner-step overlapped FP4, H=30", "Kale T5", {1.4, 2.4, 2.4, 3.0, 3.0}},
      {"10B", 1e10, 48, 0.8, "1-outer-step overlapped FP4, H=30", "Kale T5", {0.7, 1.1, 1.4, 1.4, 1.4}},
      {"10B", 1e10, 48, 0.8, "1-outer-step overlapped FP4, H=100", "Kale T5", {0.1, 0.2, 0.2, 0.3, 0.3}},
      {"100B", 1e11, 108, 4.9, "Data-Parallel", "Douillard T4, Kale T5", {184.2, 323.8, 390.7, 390.7, 471.5}},
      {"100B", 1e11, 108, 4.9, "DiLoCo", "Douillard T4", {3.0, 11.0, 23.3, 49.4, 184.2}},
      {"100B", 1e11, 108, 4.9, "Streaming DiLoCo", "Douillard T4, Kale T5", {2.4, 6.2, 9.1, 11.0, 19.3}},
      {"100B", 1e11, 108, 4.9, "Streaming DiLoCo, 1-inner-step overlapped", "Douillard T4", {1.7, 3.6, 4.3, 5.2, 5.2}},
      {"100B", 1e11, 108, 4.9, "1-inner-step overlapped FP4, H=100", "Douillard T4, Kale T5", {0.5, 0.9, 1.1, 1.1, 1.4}},
      {"100B", 1e11, 108, 4.9, "1-inner-step overlapped FP4, H=30", "Kale T5", {0.9, 1.7, 2.0, 2.0, 2.0}},
      {"100B", 1e11, 108, 4.9, "1-outer-step overlapped FP4, H=30", "Kale T5", {0.5, 0.8, 0.9, 0.9, 0.9}},
      {"100B", 1e11, 108, 4.9, "1-outer-step overlapped FP4, H=100", "Kale T5", {0.2, 0.3, 0.3, 0.3, 0.4}},
  };
  return rows;
}

SimulationOptions published_options(const PublishedRow& row) {
  SimulationOptions o;
  o.parameters = row.parameters;
  o.layers = row.layers;
  o.step_s = row.step_s;
  o.workers = 2;
  o.overlap_backward = true;
  o.latency_s = 0;
  o.transport = SimulationOptions::Transport::kIdeal;
  o.final_sync = false;
  if (row.method == "Data-Parallel") {
    o.algorithm = SimulatedAlgorithm::kDdp;
    o.bits = 16;
    o.steps = 200;
    return o;
  }
  const bool fp4 = row.method.find("FP4") != std::string::npos;
  o.algorithm = row.method == "DiLoCo" ? SimulatedAlgorithm::kDiLoCo : SimulatedAlgorithm::kStreaming;
  o.inner_steps = row.method.find("H=30") != std::string::npos ? 30 : 100;
  // Fragments of 3 layers, however many that makes: 8, 16 and 36 (more than H = 30 at 100B, so
  // that some steps start two fragments' syncs).
  o.fragments = o.algorithm == SimulatedAlgorithm::kStreaming ? row.layers / 3 : 1;
  o.bits = fp4 ? 4 : 16;
  o.overlap_steps = row.method.find("1-inner") != std::string::npos ? 1 : 0;
  o.eager = row.method.starts_with("1-outer");
  o.steps = 20 * o.inner_steps;
  return o;
}

double on_published_grid(double gbits) {
  for (int i = 0; i < 50; ++i) {
    const double value = std::pow(10.0, -1 + 4.0 * i / 49);
    if (value >= gbits * (1 - 1e-9)) return value;
  }
  return std::numeric_limits<double>::infinity();
}

int published_grid_index(double gbits) {
  if (!std::isfinite(gbits)) return 50;
  return static_cast<int>(std::lround((std::log10(gbits) + 1) * 49 / 4));
}

std::string published_comparison_markdown() {
  std::string out = "| model | method | published in | 50% | 80% | 90% | 95% | 99% |\n|---|---|---|---|---|---|---|---|\n";
  for (const auto& row : published_simulation()) {
    std::string cells;
    for (size_t i = 0; i < kPublishedTargets.size(); ++i) {
      const double ours = bandwidth_for(published_options(row), kPublishedTargets[i]) / 1e9;
      const double on_grid = on_published_grid(ours);
      const int steps = published_grid_index(on_grid) - published_grid_index(row.gbits[i]);
      cells += fmt::format(" {:g} / {:.1f}{} |", row.gbits[i], on_grid, steps == 0 ? "" : fmt::format(" ({:+d})", steps));
    }
    out += fmt::format("| {} | {} | {} |{}\n", row.model, row.method, row.tables, cells);
  }
  return out + "\nGbit/s needed: published / this simulator (rounded up to the published grid); in parentheses, how many "
               "steps of the grid (21% each) ours lies above (+) or below (-) theirs\n";
}

}  // namespace loco::runtime
