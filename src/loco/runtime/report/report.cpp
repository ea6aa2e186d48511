#include "loco/runtime/report/report.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <tuple>
#include <utility>
#include <vector>

#include "loco/core/error.h"
#include "loco/core/files.h"
#include "loco/core/run_folder.h"
#include "loco/metrics/events.h"
#include "loco/metrics/progress.h"
#include "loco/optim/outer.h"
#include "loco/runtime/config/config.h"

namespace loco::runtime {

double round_trips_beyond(double seconds, double bytes_sent, double bytes_received, double rate_bps, double round_trip_s) {
  if (round_trip_s <= 0) return NAN;
  const double bytes_s = rate_bps > 0 ? std::max(bytes_sent, bytes_received) * 8 / rate_bps : 0.0;
  return (seconds - bytes_s) / round_trip_s;
}

namespace {

// Each worker's link rate from `links` (RUN/links.json, which `loco launch --link` writes); empty
// without that file. A link with neither rate nor delay (an island held only to a CPU share, as
// the ideal runs of `CPU=... bench/wan-scale.sh` are) has no round trip to count in: NaN.
std::map<int64_t, double> link_rates(const fs::path& links) {
  std::map<int64_t, double> rate;
  if (!fs::exists(links)) return rate;
  try {
    const auto j = nlohmann::json::parse(read_file(links, "report"));
    for (const auto& w : j.at("workers")) {
      const double bps = w.at("rate_bps").get<double>();
      rate[w.at("rank").get<int64_t>()] = bps <= 0 && w.value("delay_s", 0.0) <= 0 ? NAN : bps;
    }
  } catch (const nlohmann::json::exception& e) {
    throw DataError("report", fmt::format("{}: not a list of links ({})", links.string(), e.what()));
  }
  return rate;
}

double median(std::vector<double> values) {
  if (values.empty()) return NAN;
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

using SyncKey = std::tuple<int64_t, int64_t, int64_t>;  // worker, step, fragment

// round_trips_beyond's median over the syncs with a link rate and a measured round trip; NaN
// without any. With `baseline` (the same syncs' seconds in another run), what each took beyond
// its bytes and beyond its baseline; syncs without one are left out.
double median_round_trips_beyond(const std::vector<SyncTiming>& syncs, const std::map<SyncKey, double>* baseline = nullptr) {
  std::vector<double> beyond;
  for (const auto& s : syncs) {
    if (std::isnan(s.rate_bps) || s.round_trip_s <= 0) continue;
    double seconds = s.seconds;
    if (baseline != nullptr) {
      const auto same = baseline->find({s.worker, s.step, s.fragment});
      if (same == baseline->end()) continue;
      seconds -= same->second;
    }
    beyond.push_back(round_trips_beyond(seconds, s.bytes, s.bytes, s.rate_bps, s.round_trip_s));
  }
  return median(beyond);
}

// A DiPaCo run (docs/dipaco.md): its workers' task events and summaries, and its scores
// (RUN/dipaco-eval.json, written when the run finished). Bytes are those of the shared store: a
// worker "sends" what it writes (outer gradients, inner states, module versions) and "receives"
// what it reads.
RunReport read_dipaco_report(const std::filesystem::path& run, const RunConfig& config, RunReport r) {
  r.algorithm = fmt::format("dipaco {}", config.dipaco.levels);
  r.inner_steps = config.sync.inner_steps;
  r.steps = config.train.steps;
  r.rounds = (config.train.steps + config.sync.inner_steps - 1) / config.sync.inner_steps;
  std::map<std::string, std::pair<double, double>> bytes;  // per worker: written, read
  std::map<std::string, double> wall;
  for (const auto& [time, event] : metrics::read_events(RunFolder(run).metrics())) {
    const auto worker = metrics::worker_of(event).label();
    if (const auto* e = std::get_if<metrics::PathTaskEvent>(&event)) {
      r.tokens += e->tokens;
      bytes[worker].first += static_cast<double>(e->bytes_written);
      bytes[worker].second += static_cast<double>(e->bytes_read);
    } else if (const auto* e = std::get_if<metrics::StepTaskEvent>(&event)) {
      bytes[worker].first += static_cast<double>(e->bytes_written);
      bytes[worker].second += static_cast<double>(e->bytes_read);
    } else if (const auto* e = std::get_if<metrics::WorkerSummaryEvent>(&event)) {
      wall[worker] += e->wall_s;
    }
  }
  r.workers = static_cast<int64_t>(bytes.size());
  for (const auto& [worker, b] : bytes) {
    r.bytes_sent = std::max(r.bytes_sent, b.first);
    r.bytes_received = std::max(r.bytes_received, b.second);
  }
  for (const auto& [worker, seconds] : wall) r.wall_s = std::max(r.wall_s, seconds);
  const auto scores = RunFolder(run).dipaco_evaluation();
  r.finished = std::filesystem::exists(scores);
  r.val_loss = r.val_ppl = NAN;
  if (r.finished) {
    try {
      const auto json = nlohmann::json::parse(read_file(scores, "report"));
      r.val_loss = json.at("val_loss").get<double>();
      r.val_ppl = std::exp(r.val_loss);
    } catch (const nlohmann::json::exception& e) {
      throw DataError("report", fmt::format("{}: {}", scores.string(), e.what()));
    }
  }
  return r;
}

}  // namespace

std::string dipaco_report(const std::filesystem::path& run) {
  const auto clusters = RunFolder(run).routing_clusters();
  if (!std::filesystem::exists(clusters)) return "";
  std::string out = fmt::format("{}: DiPaCo's paths against the corpus's labels (documents routed to each, {})\n\n",
                                run.string(), clusters.string());
  out += read_file(clusters, "report");
  const auto scores = RunFolder(run).dipaco_evaluation();
  if (std::filesystem::exists(scores)) {
    try {
      const auto json = nlohmann::json::parse(read_file(scores, "report"));
      out += "\n| path | validation documents | tokens scored | val_loss |\n|---|---|---|---|\n";
      for (const auto& p : json.at("paths")) {
        out += fmt::format("| {} | {} | {} | {} |\n", p.at("path").get<int64_t>(), p.at("documents").get<int64_t>(),
                           p.at("tokens").get<int64_t>(),
                           p.at("val_loss").is_number() ? fmt::format("{:.4f}", p.at("val_loss").get<double>()) : "-");
      }
    } catch (const nlohmann::json::exception& e) {
      throw DataError("report", fmt::format("{}: {}", scores.string(), e.what()));
    }
  }
  return out;
}

RunReport read_run_report(const std::filesystem::path& run) {
  RunReport r;
  r.name = run.filename().string();
  if (r.name.empty()) r.name = run.parent_path().filename().string();
  const auto config_file = RunFolder(run).config();
  const auto config = parse_config(read_file(config_file, "report"), config_file.string());
  if (!config.dipaco.levels.empty()) return read_dipaco_report(run, config, r);
  r.algorithm = to_string(config.sync.algorithm);
  if (config.sync.algorithm == Algorithm::kStreaming) {
    r.algorithm = fmt::format("streaming P={} τ={} α={} {}", config.sync.fragments, config.sync.overlap_steps,
                              config.sync.merge_alpha, comm::to_string(config.sync.exchange));
  } else if (config.sync.algorithm == Algorithm::kDiLoCo && config.sync.exchange != comm::Encoding::kFp32) {
    r.algorithm = fmt::format("diloco {}", comm::to_string(config.sync.exchange));
  }
  if (config.sync.eager) r.algorithm += fmt::format(" eager {}", optim::to_string(config.outer.optimizer));
  r.emulated_step_s = config.train.emulated_step_s;
  if (r.emulated_step_s > 0) r.algorithm += fmt::format(" (compute emulated, {:g} s/step)", r.emulated_step_s);
  const bool outer = config.sync.algorithm == Algorithm::kDiLoCo || config.sync.algorithm == Algorithm::kStreaming;
  r.inner_steps = outer ? config.sync.inner_steps : 1;
  const auto metrics_path = RunFolder(run).metrics();
  std::map<int64_t, metrics::TrainSummary> last_summary;
  std::map<int64_t, std::pair<double, double>> bytes;  // per worker, summed over every sync event
  std::map<int64_t, int64_t> rounds;
  std::map<int64_t, double> peak, stall;  // per worker, over every session
  const auto rates = link_rates(RunFolder(run).links());
  double parameters = NAN;
  for (const auto& [time, event] : metrics::read_events(metrics_path)) {
    const int64_t worker = std::max<int64_t>(0, metrics::worker_of(event).rank);
    if (const auto* e = std::get_if<metrics::StartEvent>(&event); e != nullptr && !e->resumed) parameters = static_cast<double>(e->parameters);
    if (const auto* e = std::get_if<metrics::SummaryEvent>(&event)) {
      last_summary[worker] = e->summary;
      peak[worker] = std::max(peak[worker], static_cast<double>(e->summary.peak_step_bytes));
    }
    if (const auto* e = std::get_if<metrics::SyncEvent>(&event)) {
      bytes[worker].first += static_cast<double>(e->bytes_sent);
      bytes[worker].second += static_cast<double>(e->bytes_received);
      rounds[worker] = std::max(rounds[worker], e->round);
      if (std::isfinite(e->stall_s)) stall[worker] += e->stall_s;
      const auto rate = rates.find(worker);
      r.syncs.push_back({worker, e->step, e->fragment, e->seconds,
                         static_cast<double>(std::max(e->bytes_sent, e->bytes_received)), e->round_trip_s,
                         rate != rates.end() ? rate->second : NAN});
    }
  }
  r.round_trips_beyond = median_round_trips_beyond(r.syncs);
  if (last_summary.empty()) throw DataError("report", fmt::format("{}: no summary yet (is the run finished?)", metrics_path.string()));
  r.workers = static_cast<int64_t>(last_summary.size());
  r.finished = true;
  double loss_sum = 0, ppl_sum = 0, utilization_sum = 0;
  for (const auto& [worker, s] : last_summary) {
    r.worker_utilization.push_back(s.end_to_end_utilization);
    r.worker_wall_s.push_back(s.wall_s);
    if (s.compute_utilization > 0) {
      const double steps_s = s.compute_s / s.compute_utilization;
      r.steps_s = std::isnan(r.steps_s) ? steps_s : std::max(r.steps_s, steps_s);
    }
    utilization_sum += s.compute_utilization;
    r.finished = r.finished && !s.interrupted;
    r.tokens += s.tokens;
    r.wall_s = std::max(r.wall_s, s.wall_s);
    r.steps = std::max(r.steps, s.steps);
    if (std::isfinite(s.val_loss)) {
      loss_sum += s.val_loss;
      ppl_sum += s.val_ppl;
    }
  }
  const auto& first = last_summary.begin()->second;
  if (config.sync.algorithm == Algorithm::kLocal) {
    r.val_loss = loss_sum / static_cast<double>(r.workers);
    r.val_ppl = ppl_sum / static_cast<double>(r.workers);
  } else {
    r.val_loss = first.val_loss;
    r.val_ppl = first.val_ppl;
  }
  r.compute_utilization = utilization_sum / static_cast<double>(r.workers);
  double sum = 0;
  for (double u : r.worker_utilization) sum += u;
  r.end_to_end_utilization = sum / static_cast<double>(r.worker_utilization.size());
  for (const auto& [worker, p] : peak) r.peak_step_bytes = std::isnan(r.peak_step_bytes) ? p : std::max(r.peak_step_bytes, p);
  for (const auto& [worker, t] : stall) r.stall_s = std::isnan(r.stall_s) ? t : std::max(r.stall_s, t);
  for (const auto& [worker, b] : bytes) {
    r.bytes_sent = std::max(r.bytes_sent, b.first);
    r.bytes_received = std::max(r.bytes_received, b.second);
    r.rounds = std::max(r.rounds, rounds[worker]);
  }
  if (r.workers > 1) {
    const double m = static_cast<double>(r.workers);
    r.ddp_bytes = static_cast<double>(r.steps) * 2 * (m - 1) / m * 4 * parameters;
  }
  return r;
}

nlohmann::json to_json(const RunReport& r) {
  auto number = [](double v) { return std::isnan(v) ? nlohmann::json(nullptr) : nlohmann::json(v); };
  return {{"name", r.name}, {"algorithm", r.algorithm}, {"workers", r.workers}, {"inner_steps", r.inner_steps},
          {"steps", r.steps}, {"tokens", r.tokens}, {"rounds", r.rounds}, {"val_loss", number(r.val_loss)},
          {"val_ppl", number(r.val_ppl)}, {"bytes_sent", r.bytes_sent}, {"bytes_received", r.bytes_received},
          {"wall_s", r.wall_s}, {"finished", r.finished}, {"peak_step_bytes", number(r.peak_step_bytes)},
          {"stall_s", number(r.stall_s)}, {"compute_utilization", number(r.compute_utilization)},
          {"end_to_end_utilization", number(r.end_to_end_utilization)}, {"worker_utilization", r.worker_utilization},
          {"ddp_bytes", number(r.ddp_bytes)}, {"round_trips_beyond", number(r.round_trips_beyond)},
          {"worker_wall_s", r.worker_wall_s}, {"goodput", number(r.goodput)}, {"worker_goodput", r.worker_goodput},
          {"round_trips_beyond_ideal", number(r.round_trips_beyond_ideal)}, {"steps_s", number(r.steps_s)},
          {"steps_goodput", number(r.steps_goodput)},
          {"emulated_step_s", r.emulated_step_s}};
}

void set_goodput(RunReport& run, const RunReport& ideal) {
  if (run.algorithm != ideal.algorithm || run.workers != ideal.workers || run.steps != ideal.steps) {
    throw DataError("report", fmt::format("{} ({}, {} workers, {} steps) is not the same run as its ideal-network reference "
                                          "{} ({}, {} workers, {} steps)", run.name, run.algorithm, run.workers, run.steps,
                                          ideal.name, ideal.algorithm, ideal.workers, ideal.steps));
  }
  run.goodput = run.wall_s > 0 ? ideal.wall_s / run.wall_s : NAN;
  run.steps_goodput = run.steps_s > 0 ? ideal.steps_s / run.steps_s : NAN;
  run.worker_goodput.clear();
  for (size_t i = 0; i < run.worker_wall_s.size() && i < ideal.worker_wall_s.size(); ++i) {
    run.worker_goodput.push_back(run.worker_wall_s[i] > 0 ? ideal.worker_wall_s[i] / run.worker_wall_s[i] : NAN);
  }
  std::map<SyncKey, double> ideal_seconds;
  for (const auto& s : ideal.syncs) ideal_seconds[{s.worker, s.step, s.fragment}] = s.seconds;
  run.round_trips_beyond_ideal = median_round_trips_beyond(run.syncs, &ideal_seconds);
}

RunReport report_from_json(const nlohmann::json& j, const std::string& where) {
  auto number = [&](const char* key) {
    if (!j.contains(key)) throw DataError("report", fmt::format("{}: a report has no \"{}\"", where, key));
    const auto& v = j.at(key);
    if (v.is_null()) return static_cast<double>(NAN);
    if (!v.is_number()) throw DataError("report", fmt::format("{}: \"{}\" is not a number", where, key));
    return v.get<double>();
  };
  auto text = [&](const char* key) {
    if (!j.contains(key) || !j.at(key).is_string()) {
      throw DataError("report", fmt::format("{}: a report has no text \"{}\"", where, key));
    }
    return j.at(key).get<std::string>();
  };
  RunReport r;
  r.name = text("name");
  r.algorithm = text("algorithm");
  r.workers = static_cast<int64_t>(number("workers"));
  r.inner_steps = static_cast<int64_t>(number("inner_steps"));
  r.steps = static_cast<int64_t>(number("steps"));
  r.tokens = static_cast<int64_t>(number("tokens"));
  r.rounds = static_cast<int64_t>(number("rounds"));
  r.val_loss = number("val_loss");
  r.val_ppl = number("val_ppl");
  r.bytes_sent = number("bytes_sent");
  r.bytes_received = number("bytes_received");
  r.wall_s = number("wall_s");
  r.finished = j.value("finished", false);
  r.peak_step_bytes = number("peak_step_bytes");
  r.stall_s = number("stall_s");
  r.compute_utilization = number("compute_utilization");
  r.ddp_bytes = number("ddp_bytes");
  if (j.contains("round_trips_beyond")) r.round_trips_beyond = number("round_trips_beyond");  // newer reports only
  // Reports saved before loco measured it end to end have neither field.
  if (j.contains("end_to_end_utilization")) r.end_to_end_utilization = number("end_to_end_utilization");
  // Newer reports only: goodput against an ideal network, and emulated compute.
  if (j.contains("goodput")) r.goodput = number("goodput");
  if (j.contains("round_trips_beyond_ideal")) r.round_trips_beyond_ideal = number("round_trips_beyond_ideal");
  if (j.contains("steps_s")) r.steps_s = number("steps_s");
  if (j.contains("steps_goodput")) r.steps_goodput = number("steps_goodput");
  if (j.contains("emulated_step_s")) r.emulated_step_s = number("emulated_step_s");
  auto numbers = [&](const char* key, std::vector<double>& out) {
    if (!j.contains(key) || !j.at(key).is_array()) return;
    for (const auto& v : j.at(key)) {
      if (!v.is_number() && !v.is_null()) throw DataError("report", fmt::format("{}: \"{}\" holds a non-number", where, key));
      out.push_back(v.is_null() ? NAN : v.get<double>());
    }
  };
  numbers("worker_wall_s", r.worker_wall_s);
  numbers("worker_goodput", r.worker_goodput);
  if (j.contains("worker_utilization") && j.at("worker_utilization").is_array()) {
    for (const auto& v : j.at("worker_utilization")) {
      if (!v.is_number()) throw DataError("report", fmt::format("{}: \"worker_utilization\" holds a non-number", where));
      r.worker_utilization.push_back(v.get<double>());
    }
  }
  return r;
}

std::vector<RunReport> read_reports(const std::filesystem::path& path) {
  if (std::filesystem::is_directory(path)) return {read_run_report(path)};
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(read_file(path, "report"));
  } catch (const nlohmann::json::exception& e) {
    throw DataError("report", fmt::format("{}: not JSON ({})", path.string(), e.what()));
  }
  if (!j.is_array()) throw DataError("report", fmt::format("{}: expected an array of reports", path.string()));
  std::vector<RunReport> out;
  for (const auto& item : j) out.push_back(report_from_json(item, path.string()));
  return out;
}

std::string compare_with_baselines(const RunReport& run, const std::vector<RunReport>& baselines) {
  std::string out;
  for (const auto& b : baselines) {
    const double below = b.val_loss - run.val_loss;
    out += fmt::format("{} against {} ({}, {} worker{}): val_loss {:.4f} vs {:.4f}, {:.3f} nat {} ({:+.1f}%)", run.name,
                       b.name, b.algorithm, b.workers, b.workers == 1 ? "" : "s", run.val_loss, b.val_loss,
                       std::abs(below), below >= 0 ? "below" : "above", 100 * (run.val_loss / b.val_loss - 1));
    if (b.bytes_sent > 0 && run.bytes_sent > 0) {
      out += fmt::format("; sent {} per worker vs {} ({:.0f}x fewer)", metrics::format_bytes(run.bytes_sent),
                         metrics::format_bytes(b.bytes_sent), b.bytes_sent / run.bytes_sent);
    }
    out += "\n";
  }
  if (!std::isnan(run.ddp_bytes)) {
    out += fmt::format("{}: DDP would have sent {} per worker for this run ({} steps of fp32 gradients){}\n", run.name,
                       metrics::format_bytes(run.ddp_bytes), run.steps,
                       run.bytes_sent > 0 ? fmt::format(", {:.0f}x what it sent", run.ddp_bytes / run.bytes_sent) : "");
  }
  return out;
}

std::string report_table(const std::vector<RunReport>& reports) {
  std::string out =
      "| run | algorithm | workers | H | steps/worker | tokens (all) | val_loss | val_ppl | rounds | sent/worker | "
      "received/worker | peak sent/step | stall | sync beyond bytes | compute util. | compute, end to end | goodput | wall |\n"
      "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  auto or_dash = [](double value, auto&& format) { return std::isnan(value) ? std::string("-") : format(value); };
  for (const auto& r : reports) {
    const bool outer = r.algorithm.starts_with("diloco") || r.algorithm.starts_with("streaming");
    out += fmt::format("| {}{} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n", r.name,
                       r.finished ? "" : " (unfinished)", r.algorithm, r.workers, outer ? std::to_string(r.inner_steps) : "-",
                       r.steps, r.tokens, or_dash(r.val_loss, [](double v) { return fmt::format("{:.4f}", v); }),
                       or_dash(r.val_ppl, [](double v) { return fmt::format("{:.1f}", v); }), r.rounds,
                       metrics::format_bytes(r.bytes_sent),
                       metrics::format_bytes(r.bytes_received),
                       or_dash(r.peak_step_bytes, [](double v) { return metrics::format_bytes(v); }),
                       or_dash(r.stall_s, [](double v) { return fmt::format("{:.1f} s", v); }),
                       or_dash(r.round_trips_beyond, [&](double v) {
                         // With an ideal reference: also beyond the same sync's time there.
                         return std::isnan(r.round_trips_beyond_ideal)
                                    ? fmt::format("{:.2f} RTT", v)
                                    : fmt::format("{:.2f} RTT ({:.2f} beyond ideal)", v, r.round_trips_beyond_ideal);
                       }),
                       or_dash(r.compute_utilization, [](double v) { return fmt::format("{:.1f}%", 100 * v); }),
                       or_dash(r.end_to_end_utilization, [](double v) { return fmt::format("{:.1f}%", 100 * v); }),
                       or_dash(r.goodput, [&](double v) {
                         return std::isnan(r.steps_goodput) ? fmt::format("{:.3f}", v)
                                                            : fmt::format("{:.3f} (steps {:.3f})", v, r.steps_goodput);
                       }),
                       metrics::format_duration(r.wall_s));
  }
  return out;
}

}  // namespace loco::runtime
