#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <stdexcept>
#include <vector>

#include "loco/metrics/bootstrap.h"

namespace loco::metrics {
namespace {

// Documents whose per-token loss under model b is under model a's by `effect` on average, with a
// per-document spread `spread`; each holds 50-500 scored tokens.
struct Scores {
  std::vector<double> a, b;
  std::vector<int64_t> tokens;
};
Scores documents(size_t n, double effect, double spread, uint64_t seed) {
  std::mt19937_64 draw(seed);
  std::uniform_int_distribution<int64_t> length(50, 500);
  std::normal_distribution<double> base(3.0, 0.5), noise(0.0, spread);
  Scores s;
  for (size_t i = 0; i < n; ++i) {
    const auto t = length(draw);
    const double loss_b = base(draw);
    s.tokens.push_back(t);
    s.b.push_back(loss_b * static_cast<double>(t));
    s.a.push_back((loss_b + effect + noise(draw)) * static_cast<double>(t));
  }
  return s;
}

TEST(PairedBootstrap, AConstantDifferenceHasNoWidth) {
  const auto s = documents(50, 0.1, 0.0, 7);
  const auto i = paired_bootstrap(s.a, s.b, s.tokens, 500, 3);
  EXPECT_NEAR(i.difference, 0.1, 1e-9);
  EXPECT_NEAR(i.low, 0.1, 1e-9);
  EXPECT_NEAR(i.high, 0.1, 1e-9);
  EXPECT_EQ(i.documents, 50);
  EXPECT_EQ(i.resamples, 500);
}

// A known difference of 0.05 nat with a spread of 0.3 over 400 documents: the interval holds the
// truth, excludes zero, is as wide as the normal approximation says (1.96 standard errors each
// side), and over 200 such test sets holds the truth about 95% of the time.
TEST(PairedBootstrap, TheIntervalHoldsAKnownDifferenceAtItsNominalRate) {
  const double effect = 0.05, spread = 0.3;
  const auto s = documents(400, effect, spread, 11);
  const auto i = paired_bootstrap(s.a, s.b, s.tokens, 2000, 5);
  EXPECT_LT(i.low, effect);
  EXPECT_GT(i.high, effect);
  EXPECT_GT(i.low, 0.0) << "a difference of 0.05 nat at this spread and size is far from zero";
  // Token-weighted mean of per-document noise: its standard error is spread * sqrt(sum t^2) / sum t.
  double t1 = 0, t2 = 0;
  for (auto t : s.tokens) t1 += static_cast<double>(t), t2 += static_cast<double>(t * t);
  const double half_width = 1.96 * spread * std::sqrt(t2) / t1;
  EXPECT_NEAR((i.high - i.low) / 2, half_width, 0.25 * half_width);

  int covered = 0;
  const int sets = 200;
  for (int k = 0; k < sets; ++k) {
    const auto t = documents(100, effect, spread, 1000 + static_cast<uint64_t>(k));
    const auto c = paired_bootstrap(t.a, t.b, t.tokens, 400, static_cast<uint64_t>(k));
    covered += c.low <= effect && effect <= c.high;
  }
  EXPECT_GE(covered, 176) << "a 95% interval held the truth in " << covered << " of " << sets;  // 88%
  EXPECT_LE(covered, 199) << "a 95% interval held the truth in " << covered << " of " << sets;
}

TEST(PairedBootstrap, NoDifferenceGivesAnIntervalAroundZero) {
  const auto s = documents(300, 0.0, 0.3, 13);
  const auto i = paired_bootstrap(s.a, s.b, s.tokens);
  EXPECT_LT(i.low, 0.0);
  EXPECT_GT(i.high, 0.0);
  EXPECT_NEAR(paired_bootstrap(s.b, s.a, s.tokens).difference, -i.difference, 1e-12) << "b - a is -(a - b)";
}

TEST(PairedBootstrap, RefusesScoresThatDoNotPair) {
  const std::vector<double> two{1, 2}, three{1, 2, 3};
  const std::vector<int64_t> tokens{1, 1}, none{0, 0};
  EXPECT_THROW(paired_bootstrap(two, three, tokens), std::invalid_argument);
  EXPECT_THROW(paired_bootstrap({}, {}, {}), std::invalid_argument);
  EXPECT_THROW(paired_bootstrap(two, two, none), std::invalid_argument);
  EXPECT_THROW(paired_bootstrap(two, two, tokens, 0), std::invalid_argument);
}

}  // namespace
}  // namespace loco::metrics
