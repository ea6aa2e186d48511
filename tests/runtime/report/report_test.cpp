// `loco report`'s count of what a sync took beyond its bytes, in round trips, over emulated links
// (the sync events' measured round trip, RUN/links.json's rates).
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>

#include "loco/core/error.h"
#include "loco/core/run_folder.h"
#include "loco/metrics/metrics_log.h"
#include "loco/runtime/report/report.h"
#include "test_util.h"

namespace loco::runtime {
namespace {

using testing_util::TempDir;

TEST(RoundTripsBeyond, IsTheTimeLeftAfterTheBytesInRoundTrips) {
  // 1 MB each way at 8 Mbit/s is 1 s of bytes; 1.3 s at a 0.1 s round trip leaves 3.
  EXPECT_NEAR(round_trips_beyond(1.3, 1e6, 0.5e6, 8e6, 0.1), 3.0, 1e-9);
  EXPECT_NEAR(round_trips_beyond(1.3, 0.5e6, 1e6, 8e6, 0.1), 3.0, 1e-9) << "the larger direction binds";
  EXPECT_NEAR(round_trips_beyond(0.25, 1e6, 1e6, 0, 0.1), 2.5, 1e-9) << "an unshaped link adds no byte term";
  EXPECT_TRUE(std::isnan(round_trips_beyond(1.0, 1e6, 1e6, 8e6, 0))) << "no measured round trip, no count";
}

// A finished two-worker run over links of 8 and 4 Mbit/s: each sync's count at its worker's rate,
// and the median over them; without RUN/links.json, none.
TEST(RoundTripsBeyond, TheReportTakesTheMedianOverTheRunsSyncs) {
  TempDir dir;
  const RunFolder run(dir.path() / "run");
  std::filesystem::create_directories(run.dir());
  std::ofstream(run.config()) << "[sync]\nalgorithm = \"diloco\"\n";
  {
    metrics::MetricsLog log(run.metrics());
    for (int64_t w : {0, 1}) log.write(metrics::StartEvent{{w, ""}, false, 2, 10, 1000, "cpu", "diloco", 5});
    // worker 0 at 8 Mbit/s: 1 s of bytes, then 1, 2 and 4 round trips of 0.1 s; worker 1 at
    // 4 Mbit/s: 0.5 MB is 1 s, then 3 round trips.
    const double seconds0[] = {1.1, 1.2, 1.4};
    for (int r = 0; r < 3; ++r) {
      log.write(metrics::SyncEvent{{0, ""}, r + 1, 5 * (r + 1), 2, 1000000, 1000000, seconds0[r], 0, "00", -1, "gather",
                                   1, -1, -1, 0.1});
    }
    log.write(metrics::SyncEvent{{1, ""}, 1, 5, 2, 500000, 500000, 1.3, 0, "00", -1, "gather", 1, -1, -1, 0.1});
    metrics::TrainSummary summary;
    summary.steps = 15;
    summary.val_loss = 5.0;
    for (int64_t w : {0, 1}) log.write(metrics::SummaryEvent{{w, ""}, 2, "diloco", summary});
  }
  EXPECT_TRUE(std::isnan(read_run_report(run.dir()).round_trips_beyond)) << "no links.json: not an emulated-link run";
  std::ofstream(run.links()) << R"({"workers": [{"rank": 0, "rate_bps": 8e6, "delay_s": 0.05},
                                                {"rank": 1, "rate_bps": 4e6, "delay_s": 0.05}]})";
  const auto report = read_run_report(run.dir());
  EXPECT_NEAR(report.round_trips_beyond, 2.5, 1e-6) << "the median of 1, 2, 3 and 4";
  EXPECT_NE(report_table({report}).find("2.50 RTT"), std::string::npos) << report_table({report});
  EXPECT_NEAR(report_from_json(to_json(report), "test").round_trips_beyond, 2.5, 1e-6);
  // Islands with neither rate nor delay (held only to a CPU share): their round trip is the
  // stack's own, and counting in it means nothing.
  std::ofstream(run.links()) << R"({"workers": [{"rank": 0, "rate_bps": 0, "delay_s": 0},
                                                {"rank": 1, "rate_bps": 0, "delay_s": 0}]})";
  EXPECT_TRUE(std::isnan(read_run_report(run.dir()).round_trips_beyond));
}

// Goodput against an ideal network: the same run's wall time without emulated links over this
// one's, for the run and each worker, and over the time in steps; a reference that is not the same
// run is refused. An emulated
// run (no loss) shows dashes for its loss.
TEST(Goodput, IsTheIdealRunsWallTimeOverThisOnes) {
  auto write_run = [](const std::filesystem::path& dir, std::vector<double> walls, double emulated) {
    const RunFolder run(dir);
    std::filesystem::create_directories(run.dir());
    std::ofstream(run.config()) << "[train]\nemulated_step_s = " << emulated << "\n[sync]\nalgorithm = \"diloco\"\n";
    metrics::MetricsLog log(run.metrics());
    for (int64_t w = 0; w < static_cast<int64_t>(walls.size()); ++w) {
      metrics::TrainSummary summary;
      summary.steps = 100;
      summary.wall_s = walls[static_cast<size_t>(w)];
      // 10 s of start-up, then its steps: 80% of their time computing.
      summary.compute_utilization = 0.8;
      summary.compute_s = 0.8 * (summary.wall_s - 10);
      summary.val_loss = NAN;
      log.write(metrics::SummaryEvent{{w, ""}, 2, "diloco", summary});
    }
  };
  TempDir dir;
  write_run(dir.path() / "shaped", {100, 80}, 0.5);
  write_run(dir.path() / "ideal", {90, 76}, 0.5);
  auto report = read_run_report(dir.path() / "shaped");
  EXPECT_TRUE(std::isnan(report.goodput));
  set_goodput(report, read_run_report(dir.path() / "ideal"));
  EXPECT_NEAR(report.goodput, 0.9, 1e-9) << "the slowest worker's wall times";
  ASSERT_EQ(report.worker_goodput.size(), 2u);
  EXPECT_NEAR(report.worker_goodput[1], 0.95, 1e-9);
  EXPECT_NEAR(report.steps_goodput, 80.0 / 90.0, 1e-9) << "over the time in steps: start-up left out";
  const auto table = report_table({report});
  EXPECT_NE(table.find("| 0.900 (steps 0.889) |"), std::string::npos) << table;
  EXPECT_NE(table.find("compute emulated, 0.5 s/step"), std::string::npos) << table;
  EXPECT_NE(table.find("| - | - |"), std::string::npos) << "no loss, no perplexity: " << table;
  const auto again = report_from_json(to_json(report), "test");
  EXPECT_NEAR(again.goodput, 0.9, 1e-9);
  EXPECT_NEAR(again.steps_goodput, 80.0 / 90.0, 1e-9);
  EXPECT_EQ(again.worker_goodput.size(), 2u);

  // Per sync, beyond its bytes and beyond the same sync over the ideal network: 2.3 s shaped, 1 s
  // of it bytes (1 MB at 8 Mbit/s), 1 s in the ideal run: 3 round trips of 0.1 s.
  for (const char* name : {"shaped", "ideal"}) {
    metrics::MetricsLog log(RunFolder(dir.path() / name).metrics());
    const double seconds = std::string(name) == "shaped" ? 2.3 : 1.0;
    log.write(metrics::SyncEvent{{0, ""}, 1, 5, 2, 1000000, 1000000, seconds, 0, "00", 0, "gather", 1, -1, -1, 0.1});
    log.write(metrics::SyncEvent{{1, ""}, 1, 5, 2, 1000000, 1000000, seconds, 0, "00", 0, "gather", 1, -1, -1, 0.1});
  }
  std::ofstream(RunFolder(dir.path() / "shaped").links()) << R"({"workers": [{"rank": 0, "rate_bps": 8e6, "delay_s": 0.05},
                                                                    {"rank": 1, "rate_bps": 8e6, "delay_s": 0.05}]})";
  auto synced = read_run_report(dir.path() / "shaped");
  EXPECT_NEAR(synced.round_trips_beyond, 13, 1e-6);
  set_goodput(synced, read_run_report(dir.path() / "ideal"));
  EXPECT_NEAR(synced.round_trips_beyond_ideal, 3, 1e-6);
  EXPECT_NE(report_table({synced}).find("13.00 RTT (3.00 beyond ideal)"), std::string::npos) << report_table({synced});

  write_run(dir.path() / "other", {50, 50, 50}, 0.5);
  testing_util::expect_error<DataError>([&] { set_goodput(report, read_run_report(dir.path() / "other")); },
                                        "not the same run");
}

}  // namespace
}  // namespace loco::runtime
