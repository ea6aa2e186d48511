// The status page as a person sees it: a real `loco launch`, the page opened in headless Chromium
// (tests/web/status_page.mjs, through playwright-core), every worker and a loss curve on it, one
// worker killed with SIGKILL and marked dead within seconds. Screenshots are kept in
// build/test-artifacts/status-page/.
#include <gtest/gtest.h>

#include <fstream>
#include <set>
#include <nlohmann/json.hpp>

#include "cli_util.h"
#include "process_util.h"
#include "test_util.h"

namespace loco {
namespace {

namespace fs = std::filesystem;
using testing_util::Child;
using testing_util::run_command;
using testing_util::TempDir;
using namespace std::chrono_literals;

// The browser the tests drive: $LOCO_CHROMIUM or Debian's chromium.
std::string browser() {
  const char* configured = std::getenv("LOCO_CHROMIUM");
  return configured != nullptr ? configured : "/usr/bin/chromium";
}

// Skips (saying why) only when there is no browser; a missing driver or node is a failure.
#define LOCO_REQUIRE_BROWSER()                                                                                            \
  do {                                                                                                               \
    if (!fs::exists(browser())) {                                                                                    \
      GTEST_SKIP() << "no browser at " << browser() << ": install Debian's chromium (scripts/setup.sh does) or set " \
                      "LOCO_CHROMIUM";                                                                               \
    }                                                                                                                \
    ASSERT_TRUE(fs::exists((testing_util::build_dir() / "web-test") / "node_modules/playwright-core"))                          \
        << "playwright-core is not installed in " << (testing_util::build_dir() / "web-test").string() << " (npm failed at configure time?)";             \
  } while (0)

std::string slurp(const fs::path& path) {
  std::ifstream in(path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

fs::path artifacts(const std::string& name) {
  const fs::path dir = (testing_util::build_dir() / "test-artifacts") / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

// `loco launch --config DIR/CONFIG` on a free port while tests/web/status_page.mjs looks at its page
// with `flags`, then Ctrl-C. Checks that both ended well and that the launch printed the page's
// address; returns what the page showed (OUT/result.json).
nlohmann::json watch_launch(const TempDir& dir, const std::string& config, const fs::path& out, const std::vector<std::string>& flags) {
  const int port = testing_util::free_port();
  Child launcher({testing_util::loco_binary(), "launch", "--config", (dir.path() / config).string(), "--data.dir=" + (dir.path() / "data").string(),
                  "--run.dir=" + (dir.path() / "run").string(), "--port", std::to_string(port)},
                 (dir.path() / "launch.log").string());
  std::vector<std::string> argv = {"/usr/bin/env", "node", ((testing_util::build_dir() / "web-test") / "status_page.mjs").string(),
                                   fmt::format("http://127.0.0.1:{}/", port), out.string()};
  argv.insert(argv.end(), flags.begin(), flags.end());
  const auto page = run_command(argv, (out / "node.log").string(), 180s);
  launcher.signal(SIGINT);
  const int launch_status = launcher.wait(60s);
  const auto log = slurp(dir.path() / "launch.log");
  EXPECT_EQ(page.status, 0) << page.output << "\nlaunch log:\n" << log;
  EXPECT_NE(launch_status, -1) << "the launcher did not stop on Ctrl-C";
  EXPECT_NE(log.find(fmt::format("status page: http://127.0.0.1:{}/", port)), std::string::npos)
      << "loco launch prints the page's address";
  return page.status == 0 ? nlohmann::json::parse(slurp(out / "result.json")) : nlohmann::json();
}

TEST(StatusPage, ShowsWorkersAndLossAndMarksAKilledWorkerDead) {
  LOCO_REQUIRE_BROWSER();
  TempDir dir;
  ASSERT_NO_FATAL_FAILURE(testing_util::prepare_tiny_dataset(dir.path(), dir.path() / "data"));
  // An elastic run goes on when a worker dies, so that the page can show it dead; long enough to
  // outlast the test, which stops it.
  auto config = testing_util::tiny_launch_config(3, "elastic = true\n");
  config.replace(config.find("steps = 40"), 10, "steps = 100000");
  std::ofstream(dir.path() / "run.toml") << config;
  const auto out = artifacts("status-page");
  const auto result = watch_launch(dir, "run.toml", out, {"--kill", "--workers=3"});
  ASSERT_FALSE(result.is_null());
  ASSERT_EQ(result["rows"].size(), 3u) << result.dump(1);
  std::set<int> ranks;
  for (const auto& row : result["rows"]) ranks.insert(row["rank"].get<int>());
  EXPECT_EQ(ranks, (std::set<int>{0, 1, 2}));
  EXPECT_GE(result["loss_points"].get<int>(), 2) << "a loss curve is drawn";
  EXPECT_LT(result["dead_after_s"].get<double>(), 5.0) << "the killed worker is marked dead within seconds";
  int dead = 0;
  for (const auto& row : result["after_kill"]) dead += row["state"] == "dead" || row["state"] == "replaced";
  EXPECT_EQ(dead, 1);
  EXPECT_FALSE(result["failures"].empty()) << "the failure is on the timeline";
  EXPECT_TRUE(result["errors"].empty()) << "the page logged errors: " << result["errors"].dump(1);
  EXPECT_TRUE(fs::exists(out / "status-page.png"));
  EXPECT_TRUE(fs::exists(out / "status-page-after-kill.png"));
}

// A DiPaCo launch has no coordinator: the launcher serves the page itself, with the registry's task
// queue and every module's version.
TEST(StatusPage, ShowsADipacoRunsTaskQueueAndModules) {
  LOCO_REQUIRE_BROWSER();
  TempDir dir;
  ASSERT_NO_FATAL_FAILURE(testing_util::prepare_tiny_dataset(dir.path(), dir.path() / "data"));
  // 4 paths through 5 modules, 20 phases: long enough to be seen, stopped by the test.
  std::ofstream(dir.path() / "dipaco.toml") << R"([model]
context = 32
layers = 2
width = 32
heads = 2
[train]
steps = 200
batch_size = 4
threads = 1
device = "cpu"
[sync]
inner_steps = 10
[eval]
windows = 8
[cluster]
workers = 2
[dipaco]
levels = "1:2,1:2"
lease_s = 60
)";
  const auto result = watch_launch(dir, "dipaco.toml", artifacts("status-page-dipaco"), {"--dipaco", "--workers=2"});
  ASSERT_FALSE(result.is_null());
  EXPECT_EQ(result["rows"].size(), 2u) << result.dump(1);
  ASSERT_EQ(result["modules"].size(), 5u) << "every module of the plan: " << result.dump(1);
  for (const auto& m : result["modules"]) EXPECT_NE(m[1].get<std::string>().find(" of 20"), std::string::npos) << m.dump();
  EXPECT_NE(result["tasks"].get<std::string>().find("done "), std::string::npos) << result["tasks"];
  EXPECT_TRUE(result["errors"].empty()) << result["errors"].dump(1);
}

// `loco report --html --svg` on two finished runs (DiLoCo and DDP): the HTML opens from disk in the
// browser with the network cut off, and every chart holds both runs' curves; gnuplot's SVG files
// hold them too.
TEST(Report, HtmlAndSvgChartsOfRunsOverlaid) {
  LOCO_REQUIRE_BROWSER();
  TempDir dir;
  ASSERT_NO_FATAL_FAILURE(testing_util::prepare_tiny_dataset(dir.path(), dir.path() / "data"));
  std::ofstream(dir.path() / "run.toml") << testing_util::tiny_launch_config(2);
  for (const std::string algorithm : {"diloco", "ddp"}) {
    const auto r = run_command({testing_util::loco_binary(), "launch", "--config", (dir.path() / "run.toml").string(),
                                "--data.dir=" + (dir.path() / "data").string(), "--run.dir=" + (dir.path() / algorithm).string(),
                                "--sync.algorithm=" + algorithm},
                               (dir.path() / (algorithm + ".log")).string(), 240s);
    ASSERT_EQ(r.status, 0) << r.output;
  }
  const auto out = artifacts("report");
  const auto report = run_command({testing_util::loco_binary(), "report", (dir.path() / "diloco").string(), (dir.path() / "ddp").string(),
                                   "--html", (out / "report.html").string(), "--svg", (out / "svg").string()},
                                  (dir.path() / "report.log").string(), 120s);
  ASSERT_EQ(report.status, 0) << report.output;
  EXPECT_NE(report.output.find("| diloco | diloco |"), std::string::npos) << "the table is still printed: " << report.output;

  const auto page = run_command({"/usr/bin/env", "node", ((testing_util::build_dir() / "web-test") / "report_page.mjs").string(),
                                 (out / "report.html").string(), out.string()},
                                (out / "node.log").string(), 120s);
  ASSERT_EQ(page.status, 0) << page.output;
  const auto result = nlohmann::json::parse(slurp(out / "result.json"));
  EXPECT_TRUE(result["requests"].empty()) << "the report loads nothing beyond itself: " << result["requests"].dump();
  EXPECT_TRUE(result["errors"].empty()) << result["errors"].dump(1);
  ASSERT_EQ(result["rows"].size(), 2u);
  for (const char* chart : {"loss-tokens", "loss-bytes", "loss-wall", "train-loss", "utilization", "membership"}) {
    const auto& c = result["charts"][chart];
    ASSERT_TRUE(c.is_object()) << chart << " is not drawn: " << result["charts"].dump(1);
    EXPECT_EQ(c["series"].size(), 2u) << chart << ": both runs overlaid";
    EXPECT_GE(c["points"].get<int>(), 4) << chart << " has no data";
  }
  EXPECT_TRUE(fs::exists(out / "report.png"));
  for (const char* chart : {"loss-tokens", "loss-bytes", "loss-wall", "train-loss", "utilization", "membership"}) {
    const auto svg = slurp(out / "svg" / (std::string(chart) + ".svg"));
    ASSERT_FALSE(svg.empty()) << chart << ".svg was not written";
    EXPECT_NE(svg.find("<svg"), std::string::npos);
    EXPECT_NE(svg.find("diloco (diloco)"), std::string::npos) << chart << ".svg has no DiLoCo curve";
    EXPECT_NE(svg.find("ddp (ddp)"), std::string::npos) << chart << ".svg has no DDP curve";
    EXPECT_NE(svg.find("<path"), std::string::npos) << chart << ".svg draws nothing";
  }

  // A run folder's name is a title in gnuplot's script: a line feed in it must not start a command.
  const auto hostile = dir.path() / "x'\nsystem(\"touch PWNED\")\n#";
  fs::copy(dir.path() / "ddp", hostile, fs::copy_options::recursive);
  const auto svg_dir = dir.path() / "hostile-svg";
  const auto named = run_command({testing_util::loco_binary(), "report", hostile.string(), "--svg", svg_dir.string(), "--html",
                                  (dir.path() / "hostile.html").string()},
                                 (dir.path() / "hostile.log").string(), 60s);
  EXPECT_EQ(named.status, 0) << named.output;
  EXPECT_FALSE(fs::exists(svg_dir / "PWNED")) << "gnuplot ran a command from a folder name";
  EXPECT_FALSE(fs::exists(fs::current_path() / "PWNED")) << "gnuplot ran a command from a folder name";

  // Without gnuplot, --svg says what to install; the HTML needs nothing.
  const auto without = run_command({"/usr/bin/env", "PATH=/nonexistent", testing_util::loco_binary(), "report", (dir.path() / "ddp").string(),
                                    "--svg", (dir.path() / "svg").string()},
                                   (dir.path() / "without.log").string(), 60s);
  EXPECT_EQ(without.status, 1) << without.output;
  EXPECT_NE(without.output.find("cannot run `gnuplot"), std::string::npos) << without.output;
  EXPECT_NE(without.output.find("apt install gnuplot-nox"), std::string::npos) << without.output;
}

}  // namespace
}  // namespace loco
