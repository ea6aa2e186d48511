// loco report | simulate | link-check: finished runs, predicted runs, and emulated links.
#include <fmt/format.h>

#include <cmath>

#include "command.h"
#include "loco/comm/encoding.h"
#include "loco/core/error.h"
#include "loco/core/files.h"
#include "loco/core/run_folder.h"
#include "loco/runtime/launch/link_check.h"
#include "loco/runtime/launch/islands.h"
#include "loco/runtime/report/report.h"
#include "loco/runtime/report/report_charts.h"
#include "loco/runtime/simulate/simulate.h"

namespace loco::cli {
namespace {

namespace fs = std::filesystem;

class Report : public Command {
 public:
  explicit Report(CLI::App& app) {
    cmd = app.add_subcommand("report", "Compare runs: one Markdown table of their results and traffic");
    cmd->add_option("runs", runs_, "run folders, or JSON files of reports (--json)")->required();
    cmd->add_flag("--json", json_, "print the reports as JSON instead of a table (to keep them as baselines)");
    cmd->add_option("--baseline", baselines_, "compare the first run with these runs: run folders or JSON files of "
                                              "reports (repeatable)");
    cmd->add_option("--html", html_, "also write one self-contained HTML file of the runs' charts, overlaid (opens offline)");
    cmd->add_option("--svg", svg_, "also write the charts as SVG files into this folder (drawn by gnuplot)");
    cmd->add_option("--ideal", ideal_, "a folder of the same runs over an ideal network (no emulated link), each under "
                                       "its run's folder name: adds each run's goodput, the ideal run's wall time over its own")
        ->check(CLI::ExistingDirectory);
  }
  int run() override {
    std::vector<runtime::RunReport> reports;
    std::vector<runtime::RunCurves> curves;  // the same order; a JSON file's reports have none
    for (const auto& r : runs_) {
      for (auto& report : runtime::read_reports(r)) {
        if (!ideal_.empty()) runtime::set_goodput(report, runtime::read_run_report(fs::path(ideal_) / report.name));
        if (!html_.empty() || !svg_.empty()) {
          curves.push_back(fs::is_directory(r) ? runtime::read_run_curves(r, report) : runtime::RunCurves{});
          if (curves.back().label.empty()) curves.back().label = fmt::format("{} ({})", report.name, report.algorithm);
        }
        reports.push_back(std::move(report));
      }
    }
    if (!html_.empty()) {
      write_file_atomic(html_, runtime::report_html(reports, curves), "report");
      fmt::print(stderr, "report: wrote {}\n", html_);
    }
    if (!svg_.empty()) {
      for (const auto& file : runtime::write_report_svgs(reports, curves, svg_)) fmt::print(stderr, "report: wrote {}\n", file.string());
    }
    if (json_) {
      auto array = nlohmann::json::array();
      for (const auto& r : reports) array.push_back(runtime::to_json(r));
      fmt::print("{}\n", array.dump(2));
      return 0;
    }
    std::vector<runtime::RunReport> against;
    for (const auto& b : baselines_) {
      for (auto& report : runtime::read_reports(b)) against.push_back(std::move(report));
    }
    fmt::print("{}", runtime::report_table(reports));
    for (const auto& r : runs_) {
      if (!fs::is_directory(r)) continue;
      if (auto section = runtime::dipaco_report(r); !section.empty()) fmt::print("\n{}", section);
    }
    if (!against.empty()) fmt::print("\n{}", runtime::compare_with_baselines(reports.front(), against));
    return 0;
  }

 private:
  std::string html_, svg_, ideal_;
  std::vector<std::string> runs_, baselines_;
  bool json_ = false;
};

class Simulate : public Command {
 public:
  explicit Simulate(CLI::App& app) {
    cmd = app.add_subcommand("simulate", "Predict a run's compute utilization and wall time over a link, and the bandwidth "
                                         "each utilization needs (override any config key with --section.key=value)");
    auto* source = cmd->add_option_group("source", "what to simulate");
    source->add_option("--config", config_file_, "TOML run config: its model, workers, algorithm, steps and [link]");
    source->add_option("--from-run", request_.run_dir, "a finished run: its config, and its measured step time (to compare "
                                                       "the prediction with what it measured)");
    source->add_flag("--published", published_, "compare this simulator with the published simulations (Douillard et "
                                                "al. 2025, Table 4; Kale et al. 2025, Table 5): Gbit/s for 50..99% "
                                                "utilization, theirs and ours");
    source->require_option(1);
    cmd->add_option("--link", request_.link, "the link: rate=RATE,delay=DELAY (default: the config's [link])");
    cmd->add_option("--step-time", request_.step_s, "seconds of compute per inner step (default: a --from-run's measured "
                                                    "one)")->check(CLI::PositiveNumber);
    cmd->add_option("--flops", request_.flops, "or the device's achieved FLOP/s: step time = 6 x parameters x tokens per "
                                               "step / FLOP/s")->check(CLI::PositiveNumber);
    cmd->add_option("--params", request_.params, "the model's parameters instead of the config's (e.g. 1e9)")
        ->check(CLI::PositiveNumber);
    cmd->add_option("--layers", request_.layers, "the model's layers instead of the config's")
        ->check(CLI::Range(int64_t{1}, int64_t{100000}));
    cmd->add_option("--target", targets_, "also print the bandwidth for this compute utilization (0..1]")
        ->check(CLI::Range(1e-6, 1.0));
    cmd->add_flag("--overlap-backward", request_.overlap_backward, "let exchanges overlap the backward pass (the papers' "
                                                                   "simulators; loco does not)");
    cmd->add_flag("--steady-state", request_.steady_state, "leave out the run's end (its final syncs)");
    cmd->add_option("--fit", request_.fit_run, "a finished run of the same setup over no emulated link: this machine's own "
                                               "costs of a sync (the exchange's compute, the training thread's share) and "
                                               "the time outside the training loop, measured there and added to the "
                                               "prediction, which then gives the run's wall time too");
    cmd->add_flag("--json", json_, "print the options, the prediction and (with --from-run) the measurement as one JSON "
                                   "object");
    cmd->allow_extras();
  }
  int run() override {
    if (published_) {
      fmt::print("{}", runtime::published_comparison_markdown());
      return 0;
    }
    const fs::path file = request_.run_dir.empty() ? fs::path(config_file_) : RunFolder(request_.run_dir).config();
    const auto prepared = runtime::prepare_simulation(load_config_with(file.string(), cmd), request_);
    std::vector<double> all = {0.5, 0.8, 0.9, 0.95, 0.99};
    all.insert(all.end(), targets_.begin(), targets_.end());
    if (json_) {
      fmt::print("{}\n", runtime::simulation_json(prepared, all).dump());
      return 0;
    }
    fmt::print("{}", runtime::describe_simulation(prepared, all));
    return 0;
  }

 private:
  std::string config_file_;
  runtime::SimulationRequest request_;
  std::vector<double> targets_;
  bool json_ = false, published_ = false;
};

class LinkCheck : public Command {
 public:
  explicit LinkCheck(CLI::App& app) {
    cmd = app.add_subcommand("link-check", "Emulate islands joined by --link (as `loco launch --link` would) and measure "
                                           "the round trip and the rate across them, one flow or several at once (needs root)");
    cmd->add_option("--link", link_, "the link: rate=RATE,delay=DELAY, e.g. rate=100mbit,delay=50ms")->required();
    cmd->add_option("--bytes", bytes_, "bytes of the bulk transfer (default: about 4 s at the rate, 64 MB unshaped)")
        ->check(CLI::Range(int64_t{4096}, int64_t{1} << 40));
    cmd->add_option("--pings", pings_, "round trips timed (the median is shown)")->check(CLI::Range(1, 100000));
    cmd->add_option("--flows", flows_, "transfers at once, each from island i to island i + 1 among this many islands "
                                       "(the relay carries them side by side)")->check(CLI::Range(1, 64));
    cmd->add_option("--ranks", ranks_, "also time an all-reduce among this many islands (threads of this process, each "
                                       "on its own island)")->check(CLI::Range(2, 64));
    cmd->add_option("--values", check_.values, "fp32 values of that all-reduce")->check(CLI::Range(int64_t{1}, int64_t{1} << 30));
    cmd->add_option("--exchange", exchange_, "its wire encoding: fp32, bf16, fp8, e3m0, int8, int4, or gloo-ring (fp32 by "
                                             "Gloo's own ring all-reduce, loco's transport before its direct algorithms)");
    cmd->add_option("--algorithm", algorithm_, "auto, gather, scatter or ring")
        ->check(CLI::IsMember({"auto", "gather", "scatter", "ring"}));
    cmd->add_option("--rounds", check_.rounds, "timed all-reduces (the median is shown)")->check(CLI::Range(1, 1000));
  }
  int run() override {
    const auto spec = runtime::LinkSpec::parse(link_);
    if (bytes_ == 0) bytes_ = spec.rate_bps > 0 ? static_cast<int64_t>(spec.rate_bps / 8 * 4) : int64_t{64} << 20;
    if (ranks_ > 0) runtime::set_exchange(check_, exchange_, algorithm_);  // bad options refused before the islands are made
    const auto islands_count = static_cast<size_t>(std::max(flows_, 2));
    runtime::Islands islands(std::vector<runtime::LinkSpec>(islands_count, spec));
    fmt::print("{}\n", islands.describe());
    std::vector<std::pair<size_t, size_t>> pairs{{1, 0}};
    if (flows_ > 1) {
      pairs.clear();
      for (size_t i = 0; i < islands_count; ++i) pairs.emplace_back(i, (i + 1) % islands_count);
    }
    const auto measured = runtime::measure_links(islands, pairs, bytes_, pings_);
    double total_bps = 0;
    for (size_t i = 0; i < measured.size(); ++i) {
      const auto& m = measured[i];
      total_bps += m.rate_bps;
      fmt::print("{}round trip {:.2f} ms (median of {}; expected {:.2f} ms and the stack's own), rate {:.2f} Mbit/s over {} "
                 "(expected {})\n",
                 flows_ > 1 ? fmt::format("flow {} -> {}: ", pairs[i].first, pairs[i].second) : "", m.round_trip_s * 1e3,
                 pings_, spec.delay_s * 2e3, m.rate_bps / 1e6, metrics::format_bytes(static_cast<double>(bytes_)),
                 spec.rate_bps > 0 ? fmt::format("{:.2f} Mbit/s", spec.rate_bps / 1e6) : "not shaped");
    }
    if (flows_ > 1) fmt::print("{} flows at once: {:.2f} Mbit/s in all\n", flows_, total_bps / 1e6);
    fmt::print("the relay carried {} frames, dropped {}; a frame waited in its socket at most {:.2f} ms (held from its "
               "arrival all the same) and left at most {:.2f} ms after it was due\n",
               islands.frames_relayed(), islands.frames_dropped(), islands.relay_backlog_s() * 1e3,
               islands.relay_late_s() * 1e3);
    if (ranks_ == 0) return 0;
    const auto& m = measured.front();
    runtime::Islands group_islands(std::vector<runtime::LinkSpec>(static_cast<size_t>(ranks_), spec));
    const auto e = runtime::measure_exchange(group_islands, check_);
    // What the bytes alone take at the measured rate: the rest is the transport's latency.
    const double wire_s = static_cast<double>(e.bytes_sent) * 8 / m.rate_bps;
    fmt::print("all-reduce of {} values in {} among {} islands: {} {:.1f} ms (median of {}), rank 0 sent {}: {:.1f} ms at "
               "the measured rate + {:.2f} round trips of {:.1f} ms (the group measured {:.1f} ms)\n",
               check_.values, exchange_, ranks_, e.route, e.median_s * 1e3, check_.rounds,
               metrics::format_bytes(static_cast<double>(e.bytes_sent)), wire_s * 1e3, (e.median_s - wire_s) / m.round_trip_s,
               m.round_trip_s * 1e3, e.round_trip_s * 1e3);
    fmt::print("there the relay carried {} frames ({} each on average), dropped {}; a frame waited in its socket at most {:.2f} ms and left at "
               "most {:.2f} ms after it was due\n", group_islands.frames_relayed(),
               metrics::format_bytes(static_cast<double>(group_islands.bytes_relayed()) /
                                     static_cast<double>(std::max<int64_t>(1, group_islands.frames_relayed()))),
               group_islands.frames_dropped(),
               group_islands.relay_backlog_s() * 1e3, group_islands.relay_late_s() * 1e3);
    return 0;
  }

 private:
  std::string link_;
  int64_t bytes_ = 0;
  int pings_ = 20, flows_ = 1;
  int64_t ranks_ = 0;
  runtime::ExchangeCheck check_;
  std::string exchange_ = "e3m0", algorithm_ = "auto";
};

}  // namespace

void add_tool_commands(CLI::App& app, Commands& commands) {
  commands.push_back(std::make_unique<Report>(app));
  commands.push_back(std::make_unique<Simulate>(app));
  commands.push_back(std::make_unique<LinkCheck>(app));
}

}  // namespace loco::cli
