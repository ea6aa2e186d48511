#include "loco/runtime/report/report_charts.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>

#include "loco/core/command.h"
#include "loco/core/error.h"
#include "loco/core/files.h"
#include "loco/core/run_folder.h"
#include "loco/metrics/events.h"
#include "loco/runtime/net/wire.h"
#include "loco/runtime/status/web_assets.h"

namespace loco::runtime {
namespace {

namespace fs = std::filesystem;

constexpr size_t kMaxPoints = 1000;  // per curve, in the HTML and the SVG files

// Every `stride`-th point, and the last, so that a curve has at most kMaxPoints.
template <class Point>
std::vector<Point> thinned(const std::vector<Point>& points) {
  if (points.size() <= kMaxPoints) return points;
  const size_t stride = (points.size() + kMaxPoints - 1) / kMaxPoints;
  std::vector<Point> out;
  for (size_t i = 0; i < points.size(); i += stride) out.push_back(points[i]);
  if ((points.size() - 1) % stride != 0) out.push_back(points.back());  // (by index: a point may hold NaN)
  return out;
}

// A web asset's text, made safe to inline in a <script> or <style> element.
std::string inline_asset(std::string_view path) {
  const auto* asset = find_web_asset(path);
  LOCO_CHECK(asset != nullptr, "a web asset is missing from the build");
  std::string text(asset->content);
  for (size_t at = 0; (at = text.find("</", at)) != std::string::npos; at += 3) text.replace(at, 2, "<\\/");
  return text;
}

std::string html_escape(std::string_view text) {
  std::string out;
  for (char c : text) {
    if (c == '&') out += "&amp;";
    else if (c == '<') out += "&lt;";
    else if (c == '>') out += "&gt;";
    else if (c == '"') out += "&quot;";
    else out += c;
  }
  return out;
}

// ---- gnuplot ------------------------------------------------------------------------------------

// A gnuplot single-quoted string: '' stands for a quote, and control characters become spaces (a
// line feed would end the string and start a command: run names come from folder names).
std::string gnuplot_string(std::string_view text) {
  std::string out = "'";
  for (char c : text) {
    const auto byte = static_cast<unsigned char>(c);
    if (c == '\'') out += "''";
    else if (byte < 0x20 || byte == 0x7f) out += ' ';
    else out += c;
  }
  return out + "'";
}

struct Series {
  std::string title;
  std::vector<std::array<double, 2>> points;
};

// One chart's gnuplot script: the data inline, every series a line.
std::string gnuplot_script(const fs::path& svg, const std::string& title, const std::string& xlabel, const std::string& ylabel,
                           const std::vector<Series>& series, bool log_x, bool steps, bool percent) {
  std::string script = fmt::format(
      "set terminal svg size 760,460 dynamic noenhanced font 'DejaVu Sans,11' background rgb 'white'\n"
      "set output {}\nset title {}\nset xlabel {}\nset ylabel {}\nset grid\nset key outside bottom center horizontal\n"
      "set border 3\nset tics nomirror\n",
      gnuplot_string(svg.string()), gnuplot_string(title), gnuplot_string(xlabel), gnuplot_string(ylabel));
  if (log_x) script += "set logscale x\nset format x '%.0s%c'\n";
  if (percent) script += "set yrange [0:100]\n";
  std::string plot;
  for (size_t i = 0; i < series.size(); ++i) {
    script += fmt::format("$s{} << EOD\n", i);
    for (const auto& [x, y] : series[i].points) script += fmt::format("{} {}\n", x, y);
    script += "EOD\n";
    // A sparse curve (a few evaluations) shows its points.
    const char* style = steps ? "steps" : series[i].points.size() <= 40 ? "linespoints pt 7 ps 0.6" : "lines";
    plot += fmt::format("{}$s{} using 1:2 with {} lw 2 title {}", i ? ", " : "", i, style, gnuplot_string(series[i].title));
  }
  return script + "plot " + plot + "\n";
}

}  // namespace

RunCurves read_run_curves(const fs::path& run, const RunReport& report) {
  RunCurves curves;
  curves.label = fmt::format("{} ({})", report.name, report.algorithm);
  double start = INFINITY, tokens_per_step = NAN;
  std::map<int64_t, std::pair<double, double>> span;           // per worker: first and last event
  std::map<int64_t, std::array<double, 3>> train;              // per step: loss sum, count, tokens of one worker
  std::vector<std::pair<double, double>> sent;                 // (time, bytes) of every sync
  std::vector<std::array<double, 3>> evals;                    // (time, step, val_loss)
  std::vector<std::tuple<double, int64_t, double>> utilization;  // (time, worker, value)
  for (const auto& [time, event] : metrics::read_events(RunFolder(run).metrics())) {
    if (!std::isfinite(time)) continue;
    start = std::min(start, time);
    const int64_t worker = metrics::worker_of(event).rank;
    if (worker >= 0) {
      auto [it, fresh] = span.try_emplace(worker, time, time);
      if (!fresh) it->second = {std::min(it->second.first, time), std::max(it->second.second, time)};
    }
    if (const auto* e = std::get_if<metrics::TrainEvent>(&event); e != nullptr && std::isfinite(e->loss)) {
      auto& t = train[e->step];
      t[0] += e->loss;
      t[1] += 1;
      t[2] = static_cast<double>(e->tokens);
      if (e->step > 0) tokens_per_step = t[2] / static_cast<double>(e->step);
      if (std::isfinite(e->utilization)) utilization.emplace_back(time, worker, e->utilization);
    } else if (const auto* s = std::get_if<metrics::SyncEvent>(&event)) {
      sent.emplace_back(time, static_cast<double>(s->bytes_sent));
    } else if (const auto* v = std::get_if<metrics::EvalEvent>(&event); v != nullptr && std::isfinite(v->val_loss)) {
      evals.push_back({time, static_cast<double>(v->step), v->val_loss});
    }
  }
  if (!std::isfinite(start)) return curves;
  const double workers = std::max<double>(1, static_cast<double>(report.workers));
  auto all_tokens = [&](double step) { return std::isfinite(tokens_per_step) ? step * tokens_per_step * workers : NAN; };
  for (const auto& [step, t] : train) {
    curves.train.push_back({static_cast<double>(step), all_tokens(static_cast<double>(step)), t[0] / t[1]});
  }
  std::sort(sent.begin(), sent.end());
  std::sort(evals.begin(), evals.end());
  double bytes = 0;
  size_t next = 0;
  for (const auto& [time, step, loss] : evals) {
    for (; next < sent.size() && sent[next].first <= time; ++next) bytes += sent[next].second;
    curves.val.push_back({step, all_tokens(step), bytes, time - start, loss});
  }
  std::vector<std::pair<double, int>> changes;
  for (const auto& [worker, s] : span) changes.emplace_back(s.first - start, +1), changes.emplace_back(s.second - start, -1);
  std::sort(changes.begin(), changes.end(), [](const auto& a, const auto& b) { return a.first < b.first || (a.first == b.first && a.second > b.second); });
  int running = 0;
  for (const auto& [t, change] : changes) {
    curves.membership.push_back({t, static_cast<double>(running)});
    running += change;
    curves.membership.push_back({t, static_cast<double>(running)});
  }
  std::sort(utilization.begin(), utilization.end());
  std::map<int64_t, double> latest;
  for (const auto& [time, worker, value] : utilization) {
    latest[worker] = value;
    double sum = 0;
    for (const auto& [w, v] : latest) sum += v;
    curves.utilization.push_back({time - start, sum / static_cast<double>(latest.size())});
  }
  curves.train = thinned(curves.train);
  curves.utilization = thinned(curves.utilization);
  return curves;
}

nlohmann::json to_json(const RunCurves& c) {
  auto points = [](const auto& list) {
    nlohmann::json out = nlohmann::json::array();
    for (const auto& p : list) {
      nlohmann::json point = nlohmann::json::array();
      for (double v : p) point.push_back(std::isfinite(v) ? nlohmann::json(v) : nlohmann::json());
      out.push_back(std::move(point));
    }
    return out;
  };
  return {{"label", c.label}, {"val", points(c.val)}, {"train", points(c.train)}, {"membership", points(c.membership)},
          {"utilization", points(c.utilization)}};
}

std::string report_html(const std::vector<RunReport>& reports, const std::vector<RunCurves>& curves) {
  nlohmann::json data = {{"reports", nlohmann::json::array()}, {"curves", nlohmann::json::array()}};
  std::string names;
  for (const auto& r : reports) {
    data["reports"].push_back(to_json(r));
    names += (names.empty() ? "" : ", ") + r.name;
  }
  for (const auto& c : curves) data["curves"].push_back(to_json(c));
  // Inside <script>, no "<" at all: "<!--" and "</script" would change how the page is parsed.
  std::string json = wire::to_wire(data);
  for (size_t at = 0; (at = json.find('<', at)) != std::string::npos; at += 6) json.replace(at, 1, "\\u003c");
  return fmt::format(R"(<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>loco report: {0}</title>
<style>
{1}
{2}
</style>
</head>
<body>
<header><h1>loco report</h1><p>{0}</p></header>
<main>
  <section><h2>Runs</h2><table id="runs"><thead></thead><tbody></tbody></table></section>
  <section class="charts">
    <figure><figcaption>Validation loss against tokens (all workers)</figcaption><div id="loss-tokens" class="chart"></div></figure>
    <figure><figcaption>Validation loss against bytes sent (all workers, log scale)</figcaption><div id="loss-bytes" class="chart"></div></figure>
    <figure><figcaption>Validation loss against wall time</figcaption><div id="loss-wall" class="chart"></div></figure>
    <figure><figcaption>Training loss against step (mean over the workers)</figcaption><div id="train-loss" class="chart"></div></figure>
    <figure><figcaption>Compute utilization over time (share of inner-step time computing, mean over the workers)</figcaption><div id="utilization" class="chart"></div></figure>
    <figure><figcaption>Workers running over time</figcaption><div id="membership" class="chart"></div></figure>
  </section>
</main>
<script type="application/json" id="report-data">{3}</script>
<script>{4}</script>
<script>{5}</script>
<script>{6}</script>
</body>
</html>
)", html_escape(names), inline_asset("/assets/uPlot.min.css"), inline_asset("/assets/loco.css"), json,
                     inline_asset("/assets/uPlot.min.js"), inline_asset("/assets/charts.js"), inline_asset("/assets/report.js"));
}

std::vector<fs::path> write_report_svgs(const std::vector<RunReport>& reports, const std::vector<RunCurves>& curves,
                                        const fs::path& dir) {
  (void)reports;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw Error("report", fmt::format("cannot create {}: {}", dir.string(), ec.message()));
  struct Chart {
    std::string file, title, xlabel, ylabel;
    std::function<std::vector<std::array<double, 2>>(const RunCurves&)> points;
    bool log_x = false, steps = false, percent = false;
  };
  auto pick = [](auto member, size_t x, size_t y, double scale = 1) {
    return [member, x, y, scale](const RunCurves& c) {
      std::vector<std::array<double, 2>> out;
      for (const auto& p : c.*member) {
        if (std::isfinite(p[x]) && std::isfinite(p[y])) out.push_back({p[x], p[y] * scale});
      }
      return out;
    };
  };
  const std::vector<Chart> charts = {
      {"loss-tokens", "Validation loss against tokens", "tokens (all workers)", "validation loss (nats)", pick(&RunCurves::val, 1, 4)},
      {"loss-bytes", "Validation loss against bytes sent", "bytes sent (all workers)", "validation loss (nats)",
       [](const RunCurves& c) {
         std::vector<std::array<double, 2>> out;
         for (const auto& p : c.val) {
           if (p[2] > 0 && std::isfinite(p[4])) out.push_back({p[2], p[4]});
         }
         return out;
       }, true},
      {"loss-wall", "Validation loss against wall time", "seconds since the start", "validation loss (nats)", pick(&RunCurves::val, 3, 4)},
      {"train-loss", "Training loss (mean over the workers)", "step", "training loss (nats)", pick(&RunCurves::train, 0, 2)},
      {"utilization", "Compute utilization (share of inner-step time computing)", "seconds since the start", "utilization (%)",
       pick(&RunCurves::utilization, 0, 1, 100), false, false, true},
      {"membership", "Workers running", "seconds since the start", "workers", pick(&RunCurves::membership, 0, 1), false, true}};
  std::vector<fs::path> written;
  for (const auto& chart : charts) {
    std::vector<Series> series;
    for (const auto& c : curves) {
      auto points = chart.points(c);
      if (!points.empty()) series.push_back({c.label, std::move(points)});
    }
    if (series.empty()) continue;  // no run has this curve (e.g. utilization before loco logged it)
    const auto svg = dir / (chart.file + ".svg"), script = dir / (chart.file + ".gp");
    write_file_atomic(script, gnuplot_script(svg, chart.title, chart.xlabel, chart.ylabel, series, chart.log_x, chart.steps,
                                             chart.percent), "report");
    const auto result = run_command("report", std::chrono::seconds(60), {"gnuplot", script.string()}, dir / "gnuplot.log",
                                    "install gnuplot (Debian: apt install gnuplot-nox; scripts/setup.sh does)");
    check_command_result(result, "report", fmt::format("gnuplot {}", script.string()),
                         "the script is kept beside the chart; gnuplot.log has its output");
    written.push_back(svg);
  }
  std::error_code ignored;
  fs::remove(dir / "gnuplot.log", ignored);
  return written;
}

}  // namespace loco::runtime
