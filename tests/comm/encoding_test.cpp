// Wire encodings: every format's round trip stays within its documented bound on ordinary values,
// zeros, denormals and the top of fp32's range; NaN and Inf are refused; sizes are as documented.
#include <gtest/gtest.h>
#include <hwy/targets.h>

#include <cstring>
#include <limits>
#include <vector>

#include "loco/comm/codec_kernels.h"
#include "loco/comm/encoding.h"
#include "loco/core/error.h"

namespace loco::comm {
namespace {

const Encoding kAll[] = {Encoding::kFp32, Encoding::kBf16, Encoding::kFp8,
                         Encoding::kE3M0, Encoding::kInt8, Encoding::kInt4};

// Checks |x − decode(encode(x))| <= relative·|x| + absolute·s + floor for every value, s its block's
// largest magnitude, with a few fp32 roundings of slack. Returns the largest error seen, as a
// fraction of the allowed one.
double check_round_trip(const torch::Tensor& x, Encoding encoding) {
  auto encoded = encode(x, encoding);
  EXPECT_EQ(encoded.numel(), encoded_bytes(encoding, x.numel())) << to_string(encoding);
  auto y = decode(encoded, encoding, x.numel()).to(torch::kFloat64);
  auto xd = x.to(torch::kFloat64).view({-1});
  const int64_t n = xd.numel(), blocks = (n + kEncodingBlock - 1) / kEncodingBlock;
  auto padded = torch::zeros({blocks * kEncodingBlock}, torch::kFloat64);
  padded.narrow(0, 0, n).copy_(xd.abs());
  auto block_max = std::get<0>(padded.view({blocks, kEncodingBlock}).max(1)).repeat_interleave(kEncodingBlock).narrow(0, 0, n);
  const auto bound = encoding_bound(encoding);
  const double slack = 0x1p-21;
  auto allowed = xd.abs() * (bound.relative + slack) + block_max * (bound.absolute + slack) + bound.floor + 1e-300;
  auto error = (xd - y).abs();
  EXPECT_TRUE(torch::isfinite(y).all().item<bool>()) << to_string(encoding);
  const double worst = (error / allowed).max().item<double>();
  EXPECT_LE(worst, 1.0) << to_string(encoding) << ": error beyond the documented bound";
  return worst;
}

TEST(EncodingTest, RoundTripsWithinTheBoundAtEveryScale) {
  torch::manual_seed(7);
  for (double scale : {1e-30, 1e-3, 1.0, 1e30}) {
    // Odd length: a partial last block and, for 4-bit codes, a half-filled last byte.
    auto x = torch::randn({3001}, torch::kFloat32) * scale;
    for (auto e : kAll) {
      const double worst = check_round_trip(x, e);
      if (e != Encoding::kFp32) {
        EXPECT_GT(worst, 0.05) << to_string(e) << " at scale " << scale << ": the bound is far too loose to mean much";
      }
    }
  }
}

TEST(EncodingTest, Fp32IsExactAndZerosStayZero) {
  auto x = torch::randn({1000}, torch::kFloat32);
  EXPECT_TRUE(torch::equal(decode(encode(x, Encoding::kFp32), Encoding::kFp32, 1000), x));
  auto zeros = torch::zeros({700}, torch::kFloat32);
  for (auto e : kAll) EXPECT_TRUE(torch::equal(decode(encode(zeros, e), e, 700), zeros)) << to_string(e);
}

TEST(EncodingTest, DenormalsAndTheTopOfTheRange) {
  const float tiny = std::numeric_limits<float>::denorm_min();
  const float big = std::numeric_limits<float>::max();
  // A block of denormals only, a block mixing denormals with normal values, a block at fp32's top.
  auto denormals = torch::arange(1, 257, torch::kFloat32) * tiny;
  auto mixed = torch::cat({torch::arange(1, 129, torch::kFloat32) * tiny, torch::randn({128})});
  auto huge = torch::cat({torch::full({100}, big), torch::full({100}, -big), torch::randn({56}) * 1e37f});
  for (auto e : kAll) {
    check_round_trip(denormals, e);
    check_round_trip(mixed, e);
    check_round_trip(huge, e);
  }
  // Scaled formats keep the largest magnitude of each block exactly: it is the scale.
  for (auto e : {Encoding::kFp8, Encoding::kE3M0, Encoding::kInt8, Encoding::kInt4}) {
    EXPECT_EQ(decode(encode(huge, e), e, 256)[0].item<float>(), big) << to_string(e);
    EXPECT_EQ(decode(encode(denormals, e), e, 256)[255].item<float>(), 256 * tiny) << to_string(e);
  }
}

TEST(EncodingTest, KnownCodes) {
  // e3m0: fractions of the block's largest magnitude round to 0 or a power of two in [2^-6, 1].
  auto x = torch::tensor({8.0f, -4.0f, 5.9f, 6.1f, 0.06f, -0.07f, 0.2f});
  auto y = decode(encode(x, Encoding::kE3M0), Encoding::kE3M0, x.numel());
  EXPECT_TRUE(torch::equal(y, torch::tensor({8.0f, -4.0f, 4.0f, 8.0f, 0.0f, -0.125f, 0.25f}))) << y;
  // int4: multiples of s/7.
  auto z = torch::tensor({7.0f, 3.0f, -2.4f, 0.4f});
  EXPECT_TRUE(torch::allclose(decode(encode(z, Encoding::kInt4), Encoding::kInt4, 4), torch::tensor({7.0f, 3.0f, -2.0f, 0.0f})));
  // fp8: with s = 448 the values themselves, to 3 mantissa bits.
  auto f = torch::tensor({448.0f, 1.05f, 1.07f, 1.25f});
  EXPECT_TRUE(torch::equal(decode(encode(f, Encoding::kFp8), Encoding::kFp8, 4), torch::tensor({448.0f, 1.0f, 1.125f, 1.25f})));
}

// The vector kernels write the same bytes as the scalar reference and decode to the same bits, on
// every Highway target this CPU runs (AVX-512, AVX2, SSE4, the portable fallback...), on values
// chosen to catch rounding differences: exact midpoints between levels and their neighbours, a
// sweep of fp32 bit patterns in [0, 1], denormals, −0, every scale, and a partial last block.
TEST(EncodingTest, VectorCodecsMatchTheScalarReferenceByteForByte) {
  std::vector<std::pair<std::string, torch::Tensor>> cases;
  torch::manual_seed(11);
  for (double scale : {1e-38, 1e-3, 1.0, 1e30}) cases.emplace_back(fmt::format("gaussian {}", scale), torch::randn({100'003}) * scale);
  auto special = torch::tensor({0.0f, -0.0f, std::numeric_limits<float>::denorm_min(), -std::numeric_limits<float>::min(),
                                std::numeric_limits<float>::max(), -std::numeric_limits<float>::max(), 1.0f, -1.0f});
  cases.emplace_back("special", special.repeat({40}));
  cases.emplace_back("zeros", torch::zeros({1024}));
  // Every 61st float bit pattern from 0 up to 1, each block led by 1.0 so that r = |x| exactly.
  std::vector<float> sweep;
  for (uint32_t bits = 0; bits <= 0x3F800000u; bits += 61) {
    if (sweep.size() % kernels::kBlock == 0) sweep.push_back(1.0f);
    float v;
    std::memcpy(&v, &bits, 4);
    sweep.push_back(sweep.size() % 3 == 0 ? -v : v);
  }
  cases.emplace_back("bit sweep", torch::tensor(sweep));
  const auto targets = hwy::SupportedAndGeneratedTargets();
  ASSERT_FALSE(targets.empty());
  for (const int64_t target : targets) {
    hwy::SetSupportedTargetsForTest(target);
    ASSERT_STREQ(kernels::vector_target(), hwy::TargetName(target));
    for (auto encoding : {Encoding::kFp8, Encoding::kE3M0, Encoding::kInt8, Encoding::kInt4}) {
      const auto& format = *kernels::scaled_format(encoding);
      // Each midpoint, and the floats either side of it, in blocks whose scale is exactly 1.
      std::vector<float> ties;
      for (float m : format.midpoints) {
        for (float v : {std::nextafter(m, 0.0f), m, std::nextafter(m, 2.0f)}) {
          if (ties.size() % kernels::kBlock == 0) ties.push_back(-1.0f);
          ties.push_back(v);
          ties.push_back(-v);
        }
      }
      auto all = cases;
      all.emplace_back("midpoints", torch::tensor(ties));
      for (const auto& [name, values] : all) {
        const int64_t count = values.numel(), blocks = (count + kEncodingBlock - 1) / kEncodingBlock;
        const float* in = values.data_ptr<float>();
        const int64_t bytes = encoded_bytes(encoding, count);
        std::vector<uint8_t> best(static_cast<size_t>(bytes)), reference(static_cast<size_t>(bytes));
        kernels::encode_blocks(format, in, count, 0, blocks, best.data(), best.data() + 4 * blocks);
        kernels::encode_blocks(format, in, count, 0, blocks, reference.data(), reference.data() + 4 * blocks,
                               kernels::Path::kScalar);
        ASSERT_EQ(best, reference) << kernels::vector_target() << ", " << to_string(encoding) << ", " << name;
        auto base = torch::randn({count});
        auto out_best = base.clone(), out_reference = base.clone();
        kernels::decode_add_blocks(format, best.data(), best.data() + 4 * blocks, count, 0, blocks, out_best.data_ptr<float>());
        kernels::decode_add_blocks(format, best.data(), best.data() + 4 * blocks, count, 0, blocks,
                                   out_reference.data_ptr<float>(), kernels::Path::kScalar);
        ASSERT_EQ(std::memcmp(out_best.data_ptr<float>(), out_reference.data_ptr<float>(), static_cast<size_t>(count) * 4), 0)
            << kernels::vector_target() << ", " << to_string(encoding) << ", " << name;
      }
    }
  }
  hwy::SetSupportedTargetsForTest(0);
  std::printf("checked on %zu targets, the best here %s\n", targets.size(), kernels::vector_target());
}

// The formats whose vector encoder guesses a code and settles it with the two midpoints around
// the guess (int8, fp8) are right only if the guess is never off by more than one: checked for
// every fp32 value in [0, 1], each in a block whose scale is 1 so that it is its own fraction.
TEST(EncodingTest, GuessedCodesAreExactForEveryFractionInZeroToOne) {
  constexpr int64_t kBlocks = 4096, kPerBlock = kernels::kBlock - 1;
  std::vector<float> values(static_cast<size_t>(kBlocks * kernels::kBlock));
  std::vector<uint8_t> best(static_cast<size_t>(kBlocks * (4 + kernels::kBlock))), reference(best.size());
  for (auto encoding : {Encoding::kFp8, Encoding::kInt8}) {
    const auto& format = *kernels::scaled_format(encoding);
    ASSERT_NE(format.guess, kernels::ScaledFormat::Guess::kTable) << to_string(encoding);
    for (uint64_t bits = 0; bits <= 0x3F800000u;) {
      for (int64_t b = 0; b < kBlocks; ++b) {
        float* block = values.data() + b * kernels::kBlock;
        block[0] = 1.0f;
        for (int64_t i = 1; i <= kPerBlock; ++i, ++bits) {
          const auto pattern = static_cast<uint32_t>(std::min<uint64_t>(bits, 0x3F800000u));
          std::memcpy(block + i, &pattern, 4);
        }
      }
      const int64_t count = kBlocks * kernels::kBlock;
      kernels::encode_blocks(format, values.data(), count, 0, kBlocks, best.data(), best.data() + 4 * kBlocks);
      kernels::encode_blocks(format, values.data(), count, 0, kBlocks, reference.data(), reference.data() + 4 * kBlocks,
                             kernels::Path::kScalar);
      ASSERT_EQ(best, reference) << to_string(encoding) << ", fractions below bit pattern " << bits;
    }
  }
}

TEST(EncodingTest, NanAndInfAreRefusedWithTheirIndex) {
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    auto x = torch::ones({600});
    x[517] = bad;
    for (auto e : kAll) {
      try {
        encode(x, e);
        ADD_FAILURE() << to_string(e) << " encoded " << bad;
      } catch (const DataError& error) {
        EXPECT_NE(std::string(error.what()).find("index 517"), std::string::npos) << error.what();
      }
    }
  }
}

// The all-reduce's collective check counts NaN and Inf with a vector pass: every position, in the
// vector body and the scalar tail, and every kind of non-finite value is counted, finite extremes
// (the largest float, denormals, -0) are not.
TEST(EncodingTest, NotFiniteValuesAreCountedWherever) {
  const float kInf = std::numeric_limits<float>::infinity();
  for (int64_t count : {0, 1, 15, 16, 17, 131}) {
    std::vector<float> x(static_cast<size_t>(count), 1.0f);
    if (count >= 3) x[0] = std::numeric_limits<float>::max(), x[1] = -0.0f, x[2] = std::numeric_limits<float>::denorm_min();
    EXPECT_EQ(kernels::count_not_finite(x.data(), count), 0);
    for (int64_t i = 0; i < count; ++i) {
      for (float bad : {std::numeric_limits<float>::quiet_NaN(), kInf, -kInf}) {
        auto y = x;
        y[static_cast<size_t>(i)] = bad;
        ASSERT_EQ(kernels::count_not_finite(y.data(), count), 1) << "count " << count << " index " << i << " " << bad;
      }
    }
    if (count > 0) {
      std::vector<float> all(static_cast<size_t>(count), std::numeric_limits<float>::quiet_NaN());
      EXPECT_EQ(kernels::count_not_finite(all.data(), count), count);
    }
  }
}

TEST(EncodingTest, SizesAndNames) {
  for (int64_t n : {1, 2, 255, 256, 257, 1001}) {
    for (auto e : kAll) {
      EXPECT_EQ(encode(torch::randn({n}), e).numel(), encoded_bytes(e, n)) << to_string(e) << " n " << n;
      EXPECT_EQ(parse_encoding(to_string(e)), e);
    }
  }
  EXPECT_FALSE(parse_encoding("fp4").has_value());
  // 4-bit codes with one fp32 scale per 256 values: 7.76x fewer bytes than fp32.
  const double ratio = static_cast<double>(encoded_bytes(Encoding::kFp32, 1 << 20)) /
                       static_cast<double>(encoded_bytes(Encoding::kE3M0, 1 << 20));
  EXPECT_NEAR(ratio, 8.0 * 128 / 132, 1e-9);
  EXPECT_THROW(decode(torch::zeros({10}, torch::kUInt8), Encoding::kInt8, 10), InternalError);
}

}  // namespace
}  // namespace loco::comm
