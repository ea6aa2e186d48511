// The robust combines of an all-reduce (Combine, wire_format.h) with ranks as threads on
// 127.0.0.1: value by value the median or trimmed mean of the counted ranks' terms, in closed form,
// bit-identical on every rank, for both direct algorithms and with an encoding; a rank weighted 0
// left out whatever it holds.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <limits>

#include "comm/rank_threads.h"
#include "loco/comm/codec_kernels.h"
#include "loco/comm/group.h"

namespace loco::comm {
namespace {

using testing_util::run_ranks;
using namespace std::chrono_literals;

// Five ranks; rank r holds (r + 1) + i/1000 at value i, except rank 4 (1000 + i) and rank 2, weighted
// 0 (NaN at value 7). The counted terms at value i are 1, 2, 4 and 1000, each + i/1000.
std::vector<torch::Tensor> combined(Combine combine, ReduceAlgorithm algorithm, Encoding encoding, const std::string& prefix) {
  constexpr int64_t kSize = 5, kCount = 2'000;
  auto store = std::make_shared<MemoryKeyValueStore>();
  auto results = run_ranks<torch::Tensor>(kSize, [&](int64_t rank) {
    GroupOptions o;
    o.rank = rank;
    o.size = kSize;
    o.timeout = 10s;
    o.prefix = prefix;
    auto group = Group::connect(store, o);
    auto t = torch::arange(kCount, torch::kFloat32) / 1000 + (rank == 4 ? 1000.0 : static_cast<double>(rank + 1));
    if (rank == 2) t[7] = std::numeric_limits<float>::quiet_NaN();
    Tally tally;
    tally.mine = {rank == 2 ? 0.0 : 1.0};
    tally.weights = [](const std::vector<std::vector<double>>& all) {
      std::vector<double> w;
      for (const auto& row : all) w.push_back(row[0] / 4);
      return w;
    };
    ReduceOptions options{encoding, algorithm};
    options.combine = combine;
    options.piece_bytes = 1024;  // several pieces
    group.all_reduce_sum(t, options, &tally);
    return t;
  });
  std::vector<torch::Tensor> out;
  for (auto& r : results) {
    EXPECT_FALSE(r.error) << r.message();
    if (r.value) out.push_back(*r.value);
  }
  return out;
}

// The kernel (a sorting network over whole vectors, a scalar sort for the last columns) against
// torch's sort, for every count of terms up to 17 and a column count that is no multiple of a vector.
TEST(Combine, TheKernelIsTheMeanOfTheMiddleOfTheSortedTerms) {
  torch::manual_seed(3);
  for (int64_t k = 1; k <= 17; ++k) {
    const auto terms = torch::randn({k, 1'003});
    const auto sorted = std::get<0>(terms.sort(0));
    for (int64_t cut = 0; cut < k; ++cut) {
      for (const int64_t keep : {int64_t{1}, k - 2 * cut}) {
        if (keep < 1 || cut + keep > k) continue;
        auto out = torch::empty({1'003});
        kernels::combine_sorted(terms.data_ptr<float>(), k, 1'003, cut, keep, out.data_ptr<float>());
        EXPECT_TRUE(torch::allclose(out, sorted.narrow(0, cut, keep).mean(0), 1e-6, 1e-6)) << k << " " << cut << " " << keep;
      }
    }
  }
}

TEST(Combine, MedianAndTrimmedMeanLeaveTheFarRankOut) {
  const auto expected = torch::arange(2'000, torch::kFloat32) / 1000 + 3.0;  // (2 + 4) / 2, and the mean of 2 and 4
  for (const auto algorithm : {ReduceAlgorithm::kGather, ReduceAlgorithm::kScatter}) {
    for (const auto combine : {Combine::kMedian, Combine::kTrimmedMean}) {
      for (const auto encoding : {Encoding::kFp32, Encoding::kBf16}) {
        const auto what = fmt::format("{} {} {}", to_string(combine), to_string(algorithm), to_string(encoding));
        const auto out = combined(combine, algorithm, encoding, what);
        ASSERT_EQ(out.size(), 5u) << what;
        // fp32: exact; bf16: each term and the result rounded (8 bits of mantissa).
        const double tolerance = encoding == Encoding::kFp32 ? 1e-6 : 0.05;
        EXPECT_TRUE(torch::allclose(out[0], expected, 0, tolerance))
            << what << ": largest error " << (out[0] - expected).abs().max().item<double>();
        for (const auto& t : out) EXPECT_TRUE(torch::equal(t, out[0])) << what << ": every rank holds the same";
      }
    }
  }
  // The sum of the same terms, for contrast: the far rank moves it by 250.
  const auto sum = combined(Combine::kSum, ReduceAlgorithm::kScatter, Encoding::kFp32, "sum");
  ASSERT_EQ(sum.size(), 5u);
  EXPECT_NEAR(sum[0][0].item<double>(), (1 + 2 + 4 + 1000) / 4.0, 1e-4);
}

}  // namespace
}  // namespace loco::comm
