// `loco report`'s count of what a sync took beyond its bytes, in round trips, over emulated links
// (the sync events' measured round trip, RUN/links.json's rates).
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>

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
}

}  // namespace
}  // namespace loco::runtime
