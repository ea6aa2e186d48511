// Which refused requests the coordinator logs (net/refusal_log.h): one line per address per
// interval with its count, a bound on lines in all however many addresses send, and a bound on the
// addresses remembered.
#include "loco/runtime/net/refusal_log.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

namespace loco::runtime {
namespace {

using namespace std::chrono_literals;
using Clock = RefusalLog::Clock;

TEST(RefusalLog, OneLinePerAddressPerIntervalWithTheCountSinceTheLast) {
  RefusalLog log(10s, 20, 100);
  const auto t0 = Clock::now();
  auto first = log.admit("10.0.0.1", t0);
  ASSERT_TRUE(first);
  EXPECT_EQ(first->from_address, 1);
  for (int i = 1; i <= 5; ++i) EXPECT_FALSE(log.admit("10.0.0.1", t0 + i * 1s)) << "within the interval";
  EXPECT_TRUE(log.admit("10.0.0.2", t0 + 1s)) << "another address has its own line";
  auto later = log.admit("10.0.0.1", t0 + 11s);
  ASSERT_TRUE(later);
  EXPECT_EQ(later->from_address, 6) << "the five held back, and this one";
}

// Many sources at once (a flood from a botnet, or 4,096 addresses of a /20): at most `lines` lines
// an interval; what was not logged is told in the next interval's lines.
TEST(RefusalLog, ManyAddressesCannotFloodTheLog) {
  RefusalLog log(10s, 20, 100'000);
  const auto t0 = Clock::now();
  int logged = 0;
  for (int i = 0; i < 5000; ++i) logged += log.admit(fmt::format("10.0.{}.{}", i / 256, i % 256), t0 + i * 1ms) ? 1 : 0;
  EXPECT_EQ(logged, 20);
  // The next interval: again only 20 lines (the first 20 addresses', one refusal each); the
  // addresses held back keep their counts for their own next line.
  logged = 0;
  int64_t told = 0;
  for (int i = 0; i < 5000; ++i) {
    if (auto line = log.admit(fmt::format("10.0.{}.{}", i / 256, i % 256), t0 + 20s + i * 1ms)) {
      ++logged;
      told += line->from_address;
    }
  }
  EXPECT_EQ(logged, 20);
  EXPECT_EQ(told, 20);
  auto held = log.admit("10.0.0.100", t0 + 40s);
  ASSERT_TRUE(held);
  EXPECT_EQ(held->from_address, 3) << "one refusal in each interval, told at last";
}

TEST(RefusalLog, RemembersABoundedNumberOfAddressesAndCountsTheRest) {
  RefusalLog log(10s, 1'000'000, 50);
  const auto t0 = Clock::now();
  for (int i = 0; i < 50; ++i) ASSERT_TRUE(log.admit(fmt::format("10.1.0.{}", i), t0));
  for (int i = 0; i < 30; ++i) EXPECT_FALSE(log.admit(fmt::format("10.2.0.{}", i), t0 + 1s)) << "the table is full";
  // Once the first 50 are an interval old they are forgotten, and the next line tells the 30.
  auto line = log.admit("10.3.0.1", t0 + 12s);
  ASSERT_TRUE(line);
  EXPECT_EQ(line->from_address, 1);
  EXPECT_EQ(line->elsewhere, 30);
}

}  // namespace
}  // namespace loco::runtime
