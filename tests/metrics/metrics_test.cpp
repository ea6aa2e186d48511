#include <gtest/gtest.h>

#include <cstdio>
#include <nlohmann/json.hpp>

#include "loco/core/files.h"
#include "loco/metrics/metrics_log.h"
#include "loco/metrics/progress.h"
#include "test_util.h"

namespace loco::metrics {
namespace {

TEST(MetricsLog, OneObjectPerLineWithEventFirst) {
  testing_util::TempDir dir;
  const auto path = dir.path() / "metrics.jsonl";
  {
    MetricsLog log(path);
    log.write("train", {{"step", 1}, {"loss", 2.5}});
    log.write("eval", {{"step", 1}, {"val_loss", 3.0}});
  }
  const std::string text = read_file(path, "test");
  ASSERT_EQ(std::count(text.begin(), text.end(), '\n'), 2);
  const auto first = text.substr(0, text.find('\n'));
  EXPECT_EQ(first.rfind("{\"event\":\"train\",\"time\":", 0), 0u) << first;
  auto j = nlohmann::json::parse(first);
  EXPECT_EQ(j["step"], 1);
  EXPECT_DOUBLE_EQ(j["loss"].get<double>(), 2.5);
  EXPECT_GT(j["time"].get<double>(), 1.7e9);
}

TEST(MetricsLog, DefaultConstructedDiscards) {
  MetricsLog log;
  EXPECT_NO_THROW(log.write("train", {{"step", 1}}));
}

TEST(Progress, PlainLinesOnlyWhenAskedWithoutATerminal) {
  testing_util::TempDir dir;
  const auto path = dir.path() / "progress.txt";
  {
    std::FILE* out = std::fopen(path.c_str(), "w");
    Progress progress(0, 10, /*interactive=*/false, out);
    progress.update(1, 4.0, 100, false);
    progress.update(2, 3.5, 100, true);
    progress.message("hello");
    progress.finish();
    std::fclose(out);
  }
  const std::string text = read_file(path, "test");
  EXPECT_EQ(text.find("step 1/"), std::string::npos) << text;
  EXPECT_NE(text.find("step 2/10  loss 3.5000  100 tok/s"), std::string::npos) << text;
  EXPECT_NE(text.find("hello\n"), std::string::npos);
  EXPECT_EQ(text.find('\r'), std::string::npos) << "no terminal control codes in plain mode";
}

TEST(Progress, BarOnATerminal) {
  testing_util::TempDir dir;
  const auto path = dir.path() / "bar.txt";
  {
    std::FILE* out = std::fopen(path.c_str(), "w");
    Progress progress(0, 4, /*interactive=*/true, out);
    progress.update(2, 3.0, 50, false);
    progress.finish();
    std::fclose(out);
  }
  const std::string text = read_file(path, "test");
  EXPECT_NE(text.find("\r\033[K[############............]  50%  step 2/4"), std::string::npos) << text;
  EXPECT_NE(text.find("eta "), std::string::npos);
}

TEST(FormatDuration, HumanUnits) {
  EXPECT_EQ(format_duration(42), "42s");
  EXPECT_EQ(format_duration(185), "3m05s");
  EXPECT_EQ(format_duration(3720), "1h02m");
  EXPECT_EQ(format_duration(-1), "?");
}

}  // namespace
}  // namespace loco::metrics
