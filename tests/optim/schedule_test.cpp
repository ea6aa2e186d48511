#include <gtest/gtest.h>

#include <cmath>

#include "loco/core/error.h"
#include "loco/optim/schedule.h"

namespace loco::optim {
namespace {

TEST(Schedule, WarmupThenCosineToMinimum) {
  ScheduleOptions o{1.0, 10, 110, 0.1};
  EXPECT_DOUBLE_EQ(learning_rate(o, 0), 0.1);
  EXPECT_DOUBLE_EQ(learning_rate(o, 9), 1.0);
  EXPECT_DOUBLE_EQ(learning_rate(o, 10), 1.0);
  EXPECT_NEAR(learning_rate(o, 60), 0.1 + 0.9 * 0.5, 1e-12);  // halfway through the decay
  EXPECT_NEAR(learning_rate(o, 110), 0.1, 1e-12);
  EXPECT_NEAR(learning_rate(o, 500), 0.1, 1e-12);
  for (int64_t s = 11; s < 110; ++s) EXPECT_LE(learning_rate(o, s), learning_rate(o, s - 1));
}

TEST(Schedule, NoWarmup) {
  ScheduleOptions o{2.0, 0, 100, 0.0};
  EXPECT_DOUBLE_EQ(learning_rate(o, 0), 2.0);
  EXPECT_NEAR(learning_rate(o, 100), 0.0, 1e-12);
}

TEST(Schedule, RewarmupRampsAJoinerUpToTheSchedule) {
  EXPECT_DOUBLE_EQ(rewarmup_factor(0, 20), 1.0 / 20);
  EXPECT_DOUBLE_EQ(rewarmup_factor(9, 20), 0.5);
  EXPECT_DOUBLE_EQ(rewarmup_factor(19, 20), 1.0);
  EXPECT_DOUBLE_EQ(rewarmup_factor(500, 20), 1.0);
  EXPECT_DOUBLE_EQ(rewarmup_factor(0, 0), 1.0) << "0 turns it off";
}

TEST(Schedule, Validated) {
  EXPECT_THROW((ScheduleOptions{0.0, 1, 10, 0.1}.validate()), ConfigError);
  EXPECT_THROW((ScheduleOptions{1.0, -1, 10, 0.1}.validate()), ConfigError);
  EXPECT_THROW((ScheduleOptions{1.0, 1, 10, 1.5}.validate()), ConfigError);
}

}  // namespace
}  // namespace loco::optim
