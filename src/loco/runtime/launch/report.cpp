#include "loco/runtime/launch/report.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <fstream>
#include <map>

#include "loco/core/error.h"
#include "loco/core/files.h"
#include "loco/metrics/progress.h"
#include "loco/runtime/config/config.h"

namespace loco::runtime {

RunReport read_run_report(const std::filesystem::path& run) {
  RunReport r;
  r.name = run.filename().string();
  if (r.name.empty()) r.name = run.parent_path().filename().string();
  const auto config = parse_config(read_file(run / "config.toml", "report"), (run / "config.toml").string());
  r.algorithm = to_string(config.sync.algorithm);
  if (config.sync.algorithm == Algorithm::kStreaming) {
    r.algorithm = fmt::format("streaming P={} τ={} α={} {}", config.sync.fragments, config.sync.overlap_steps,
                              config.sync.merge_alpha, comm::to_string(config.sync.exchange));
  }
  const bool outer = config.sync.algorithm == Algorithm::kDiLoCo || config.sync.algorithm == Algorithm::kStreaming;
  r.inner_steps = outer ? config.sync.inner_steps : 1;
  const auto metrics_path = run / "metrics.jsonl";
  std::ifstream in(metrics_path);
  if (!in) throw DataError("report", fmt::format("{}: cannot read it", metrics_path.string()));
  std::map<int64_t, nlohmann::json> last_summary;
  std::map<int64_t, std::pair<double, double>> bytes;  // per worker, summed over every sync event
  std::map<int64_t, int64_t> rounds;
  std::map<int64_t, double> peak, stall;  // per worker, over every session
  for (std::string line; std::getline(in, line);) {
    nlohmann::json event;
    try {
      event = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception&) {
      continue;  // a line cut short by a killed process
    }
    const std::string kind = event.value("event", "");
    const int64_t worker = event.value("worker", int64_t{0});
    if (kind == "summary") {
      last_summary[worker] = event;
      if (event.contains("peak_step_bytes")) peak[worker] = std::max(peak[worker], event.value("peak_step_bytes", 0.0));
    }
    if (kind == "sync") {
      bytes[worker].first += event.value("bytes_sent", 0.0);
      bytes[worker].second += event.value("bytes_received", 0.0);
      rounds[worker] = std::max(rounds[worker], event.value("round", int64_t{0}));
      if (event.contains("stall_s")) stall[worker] += event.value("stall_s", 0.0);
    }
  }
  if (last_summary.empty()) throw DataError("report", fmt::format("{}: no summary yet (is the run finished?)", metrics_path.string()));
  r.workers = static_cast<int64_t>(last_summary.size());
  r.finished = true;
  double loss_sum = 0, ppl_sum = 0, utilization_sum = 0;
  int64_t utilization_count = 0;
  for (const auto& [worker, s] : last_summary) {
    if (s.contains("compute_utilization")) {
      utilization_sum += s.value("compute_utilization", 0.0);
      ++utilization_count;
    }
    r.finished = r.finished && !s.value("interrupted", false);
    r.tokens += s.value("tokens", int64_t{0});
    r.wall_s = std::max(r.wall_s, s.value("wall_s", 0.0));
    r.steps = std::max(r.steps, s.value("steps", int64_t{0}));
    if (s.contains("val_loss") && s["val_loss"].is_number()) {
      loss_sum += s["val_loss"].get<double>();
      ppl_sum += s["val_ppl"].get<double>();
    }
  }
  const auto& first = last_summary.begin()->second;
  if (config.sync.algorithm == Algorithm::kLocal) {
    r.val_loss = loss_sum / static_cast<double>(r.workers);
    r.val_ppl = ppl_sum / static_cast<double>(r.workers);
  } else {
    r.val_loss = first.contains("val_loss") && first["val_loss"].is_number() ? first["val_loss"].get<double>() : NAN;
    r.val_ppl = first.contains("val_ppl") && first["val_ppl"].is_number() ? first["val_ppl"].get<double>() : NAN;
  }
  if (utilization_count > 0) r.compute_utilization = utilization_sum / static_cast<double>(utilization_count);
  for (const auto& [worker, p] : peak) r.peak_step_bytes = std::isnan(r.peak_step_bytes) ? p : std::max(r.peak_step_bytes, p);
  for (const auto& [worker, t] : stall) r.stall_s = std::isnan(r.stall_s) ? t : std::max(r.stall_s, t);
  for (const auto& [worker, b] : bytes) {
    r.bytes_sent = std::max(r.bytes_sent, b.first);
    r.bytes_received = std::max(r.bytes_received, b.second);
    r.rounds = std::max(r.rounds, rounds[worker]);
  }
  return r;
}

std::string report_table(const std::vector<RunReport>& reports) {
  std::string out =
      "| run | algorithm | workers | H | steps/worker | tokens (all) | val_loss | val_ppl | rounds | sent/worker | "
      "received/worker | peak sent/step | stall | compute util. | wall |\n"
      "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  auto or_dash = [](double value, auto&& format) { return std::isnan(value) ? std::string("-") : format(value); };
  for (const auto& r : reports) {
    const bool outer = r.algorithm == "diloco" || r.algorithm.starts_with("streaming");
    out += fmt::format("| {}{} | {} | {} | {} | {} | {} | {:.4f} | {:.1f} | {} | {} | {} | {} | {} | {} | {} |\n", r.name,
                       r.finished ? "" : " (unfinished)", r.algorithm, r.workers, outer ? std::to_string(r.inner_steps) : "-",
                       r.steps, r.tokens, r.val_loss, r.val_ppl, r.rounds, metrics::format_bytes(r.bytes_sent),
                       metrics::format_bytes(r.bytes_received),
                       or_dash(r.peak_step_bytes, [](double v) { return metrics::format_bytes(v); }),
                       or_dash(r.stall_s, [](double v) { return fmt::format("{:.1f} s", v); }),
                       or_dash(r.compute_utilization, [](double v) { return fmt::format("{:.1f}%", 100 * v); }),
                       metrics::format_duration(r.wall_s));
  }
  return out;
}

}  // namespace loco::runtime
