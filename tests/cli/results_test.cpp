// The committed benchmark results that docs/benchmarks.md's tables are read from hold what the
// tables claim: every comparison with its interval, per document and per path (issue #47).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "loco/core/files.h"
#include "test_util.h"

namespace loco {
namespace {

// bench/results/dipaco-tokenrich.json, as bench/dipaco-tokenrich.sh writes it: two seeds or more,
// each scoring DiPaCo and the dense models on the same documents, and every pair compared.
TEST(BenchResults, TheTokenRichDiPaCoResultsHoldEveryComparisonWithItsInterval) {
  const auto file = testing_util::source_dir() / "bench" / "results" / "dipaco-tokenrich.json";
  const auto results = nlohmann::json::parse(read_file(file, "test"));
  EXPECT_EQ(results.at("benchmark"), "bench/dipaco-tokenrich.sh");
  ASSERT_GE(results.at("seeds").size(), 2u) << "DiPaCo and dense DiLoCo-8 on two seeds";
  auto check_scores = [](const nlohmann::json& e, const std::string& what) {
    SCOPED_TRACE(what);
    const auto models = 1 + e.at("baselines").size();
    ASSERT_GE(models, 2u);
    EXPECT_EQ(e.at("comparisons").size(), models * (models - 1) / 2) << "every pair of models";
    std::set<int64_t> documents;
    double dipaco = 0;
    int64_t tokens = 0;
    for (const auto& d : e.at("documents")) {
      EXPECT_TRUE(documents.insert(d.at("document").get<int64_t>()).second);
      EXPECT_EQ(d.at("loss_sums").size(), models);
      dipaco += d.at("loss_sums")[0].get<double>();
      tokens += d.at("tokens").get<int64_t>();
    }
    EXPECT_GT(documents.size(), 100u) << "every validation document, not a sample";
    EXPECT_EQ(e.at("tokens").get<int64_t>(), tokens);
    EXPECT_NEAR(e.at("val_loss").get<double>(), dipaco / static_cast<double>(tokens), 1e-6);
    for (const auto& c : e.at("comparisons")) {
      const double low = c.at("low"), difference = c.at("difference"), high = c.at("high");
      EXPECT_TRUE(std::isfinite(low) && std::isfinite(high)) << c;
      EXPECT_LE(low, difference) << c;
      EXPECT_LE(difference, high) << c;
      EXPECT_EQ(c.at("documents").get<size_t>(), documents.size()) << c;
    }
  };
  for (const auto& [seed, e] : results.at("seeds").items()) {
    check_scores(e, "seed " + seed);
    bool against_diloco8 = false, against_wide = false;
    for (const auto& c : e.at("comparisons")) {
      if (c.at("a") != "dipaco") continue;
      const auto b = c.at("b").get<std::string>();
      against_diloco8 = against_diloco8 || b.find("diloco-8-s") != std::string::npos;
      against_wide = against_wide || b.find("diloco-8-wide") != std::string::npos;
    }
    EXPECT_TRUE(against_diloco8) << "seed " << seed << ": DiPaCo against dense DiLoCo-8";
    EXPECT_TRUE(against_wide) << "seed " << seed << ": DiPaCo against a dense model of all the modules' size";
  }
  if (results.contains("reroute")) check_scores(results.at("reroute"), "re-routed");
  // The layout without a path-specific embedding, against the one with it on the same documents.
  ASSERT_TRUE(results.contains("shared_embedding")) << "DiPaCo with one embedding shared by every path";
  const auto& shared = results.at("shared_embedding");
  check_scores(shared, "shared embedding");
  const auto& c = shared.at("against_path_embeddings");
  const double low = c.at("low"), difference = c.at("difference"), high = c.at("high");
  EXPECT_TRUE(std::isfinite(low) && low <= difference && difference <= high) << c;
  EXPECT_EQ(c.at("documents").get<size_t>(), shared.at("documents").size()) << c;
}

// bench/results/poison.json, as bench/poison.sh writes it (docs/failure-model.md, "A worker that
// sends harm"): for DiLoCo and Streaming DiLoCo, every screened run within 0.05 nat of the clean
// one, and the unscreened ones harmed (a far worse loss, or a run that stopped).
TEST(BenchResults, ThePoisonResultsShowScreeningHoldingAndItsAbsenceHarming) {
  const auto results = nlohmann::json::parse(read_file(testing_util::source_dir() / "bench" / "results" / "poison.json", "test"));
  EXPECT_EQ(results.at("workers"), 4);
  for (const std::string method : {"diloco", "streaming"}) {
    std::map<std::string, nlohmann::json> runs;
    for (const auto& r : results.at("runs")) {
      if (r.at("method") == method) runs[r.at("run").get<std::string>().substr(method.size() + 1)] = r;
    }
    ASSERT_EQ(runs.size(), 7u) << method;
    const double clean = runs.at("clean").at("val_loss").get<double>();
    for (const char* screened : {"x100-reject", "x100-median", "x100-trimmed", "nan"}) {
      const auto& r = runs.at(screened);
      ASSERT_EQ(r.at("status"), 0) << method << " " << screened;
      EXPECT_LT(std::abs(r.at("val_loss").get<double>() - clean), 0.05) << method << " " << screened;
    }
    EXPECT_GT(runs.at("x100-reject").at("rejected").get<int64_t>(), 0);
    EXPECT_GT(runs.at("x100").at("val_loss").get<double>(), clean + 1) << method << ": x100 unscreened";
    EXPECT_NE(runs.at("nan-kept").at("status"), 0) << method << ": a NaN let through stops the run";
  }
}

// docs/failure-model.md, "What it costs": the robust means on the emulated WAN benchmark
// (bench/wan-scale.sh, 300 Mbit/s and 50 ms, M = 4 and 16): each method over no link and over the
// link, the robust ones sending exactly the sum's bytes, their syncs and the loop's time measured.
TEST(BenchResults, TheRobustMeansCostsOnTheWanBenchmarkAreMeasured) {
  for (const int workers : {4, 16}) {
    const auto file = testing_util::source_dir() / "bench" / "results" / fmt::format("wan-scale-robust-m{}.json", workers);
    const auto results = nlohmann::json::parse(read_file(file, "test"));
    EXPECT_EQ(results.at("workers"), workers);
    std::map<std::string, nlohmann::json> shaped, ideal;
    for (const auto& r : results.at("runs")) {
      (r.at("link") == "ideal" ? ideal : shaped)[r.at("report").at("name").get<std::string>()] = r;
    }
    for (const char* name : {"streaming-t5-e3m0", "streaming-t5-e3m0-median", "streaming-t5-e3m0-trimmed"}) {
      ASSERT_TRUE(shaped.count(name) && ideal.count(name)) << workers << " " << name;
      const auto& report = shaped.at(name).at("report");
      EXPECT_TRUE(report.at("finished").get<bool>()) << workers << " " << name;
      EXPECT_EQ(shaped.at(name).at("link"), "300mbit");
      EXPECT_EQ(report.at("bytes_sent"), shaped.at("streaming-t5-e3m0").at("report").at("bytes_sent"))
          << workers << " " << name << ": a robust mean sends the sum's bytes";
      EXPECT_GT(report.at("steps_goodput").get<double>(), 0) << workers << " " << name;
      EXPECT_GT(shaped.at(name).at("simulated").at("measured").at("sync_median_s").get<double>(), 0);
    }
  }
}

// docs/async.md: with one worker at half speed, asynchronous DiLoCo keeps the fast workers' goodput
// at 0.95 or more and ends within 0.05 nat of synchronous DiLoCo at equal tokens; synchronous
// DiLoCo makes them wait; without the grace the asynchronous run falls behind.
TEST(BenchResults, TheAsyncResultsShowNoIslandWaitingAndNoLossBehind) {
  const auto results = nlohmann::json::parse(read_file(testing_util::source_dir() / "bench" / "results" / "async.json", "test"));
  EXPECT_EQ(results.at("workers"), 4);
  std::map<std::string, nlohmann::json> runs;
  for (const auto& r : results.at("runs")) runs[r.at("run").get<std::string>()] = r;
  ASSERT_EQ(runs.size(), 10u);
  const auto& async = runs.at("async-slow");
  EXPECT_GE(async.at("fast_goodput").get<double>(), 0.95);
  EXPECT_LT(async.at("vs_sync").get<double>(), 0.05);
  EXPECT_EQ(async.at("tokens"), runs.at("sync-equal").at("tokens")) << "equal tokens";
  EXPECT_LT(async.at("slow_steps").get<int64_t>(), 300) << "the slow worker took fewer of the run's steps";
  EXPECT_LT(runs.at("sync-slow").at("fast_goodput").get<double>(), 0.6) << "synchronous DiLoCo waits for the slow worker";
  EXPECT_GT(runs.at("async-slow-nograce").at("vs_sync").get<double>(), 0.2) << "each arrival alone falls behind";
  // Asynchronous Streaming DiLoCo: the fast workers do not wait, a quarter of the model an exchange,
  // within 0.05 nat of synchronous Streaming DiLoCo.
  const auto& streaming = runs.at("async-streaming-slow");
  EXPECT_GE(streaming.at("fast_goodput").get<double>(), 0.95);
  EXPECT_LT(streaming.at("vs_sync").get<double>() - runs.at("sync-streaming-equal").at("vs_sync").get<double>(), 0.05);
  EXPECT_LT(streaming.at("peak_step_bytes").get<int64_t>() * 3, async.at("peak_step_bytes").get<int64_t>());
}

}  // namespace
}  // namespace loco
