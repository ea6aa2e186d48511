// Encode and decode of whole blocks of the scaled wire formats (codec_kernels.h), once per Highway
// target: foreach_target.h includes this file again for each instruction set, and
// HWY_DYNAMIC_DISPATCH calls the best one the CPU supports.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "loco/comm/codec_kernels.cpp"
#include <hwy/foreach_target.h>  // must come before highway.h
#include <hwy/highway.h>
#include <hwy/aligned_allocator.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "loco/comm/codec_kernels.h"
#include "loco/core/error.h"

HWY_BEFORE_NAMESPACE();
namespace loco::comm::kernels {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using Df = hn::ScalableTag<float>;
using Di = hn::RebindToSigned<Df>;
using D8 = hn::Rebind<uint8_t, Di>;  // one byte per lane of Di
using Vf = hn::Vec<Df>;
using Vi = hn::Vec<Di>;

// A format with at most this many midpoints finds codes by comparing with each of them.
constexpr size_t kFewMidpoints = 15;

// How a format's codes are found: compared with every midpoint, searched from a table entry, or
// guessed (ScaledFormat::Guess). A template argument, so that each encode loop holds one.
enum class Search { kFew, kTable, kUniform, kE4M3 };

Search search_of(const ScaledFormat& format) {
  if (format.midpoints.size() <= kFewMidpoints) return Search::kFew;
  switch (format.guess) {
    case ScaledFormat::Guess::kUniform: return Search::kUniform;
    case ScaledFormat::Guess::kE4M3: return Search::kE4M3;
    case ScaledFormat::Guess::kTable: break;
  }
  return Search::kTable;
}

// The codes (sign included) of the values x of a block whose divisor is max(s, denormal min).
template <Search kSearch>
HWY_INLINE Vi codes_of(const ScaledFormat& format, Vf x, Vf divisor) {
  const Df df;
  const Di di;
  const Vf r = hn::Div(hn::Abs(x), divisor);  // in [0, 1], as the reference divides
  Vi code = hn::Zero(di);
  const auto& midpoints = format.midpoints;
  if constexpr (kSearch == Search::kFew) {
    // code = how many midpoints are strictly below r (a true mask lane is −1).
    for (const float m : midpoints) code = hn::Sub(code, hn::BitCast(di, hn::VecFromMask(df, hn::Lt(hn::Set(df, m), r))));
  } else if constexpr (kSearch == Search::kTable) {
    // Start from the table entry of r's exponent and leading mantissa bits, then step up while
    // the next midpoint is below r, every lane until none moves.
    // (NaN and Inf, which the caller refuses, would index past the table: the index is clamped.)
    const int32_t last = static_cast<int32_t>(midpoints.size());
    const Vi entry = hn::Min(hn::ShiftRight<ScaledFormat::kTableShift>(hn::BitCast(di, r)),
                             hn::Set(di, static_cast<int32_t>(format.first_code.size()) - 1));
    code = hn::GatherIndex(di, format.first_code.data(), entry);
    for (;;) {
      const Vi at = hn::Min(code, hn::Set(di, last - 1));
      const Vi below = hn::BitCast(di, hn::VecFromMask(df, hn::Lt(hn::GatherIndex(df, midpoints.data(), at), r)));
      const Vi step = hn::And(below, hn::VecFromMask(di, hn::Lt(code, hn::Set(di, last))));
      if (hn::AllFalse(di, hn::Ne(step, hn::Zero(di)))) break;
      code = hn::Sub(code, step);
    }
  } else {
    // A guess: r's position in units of the levels' spacing, rounded. Away from the midpoints the
    // guess is the code (the float error of r and of the table's midpoints is below 2^-15 of a
    // spacing); a lane within 2^-10 of a spacing of a midpoint may be off by one, and when any lane
    // is, the two midpoints around the guess settle it from the table: down when the midpoint
    // below is not below r, up when the one above is. Both are gathered from the guess at once
    // (after a step down, the midpoint above is the one below, which is not below r).
    const int32_t last = static_cast<int32_t>(midpoints.size());
    const Vf half = hn::Set(df, 0.5f), band = hn::Set(df, 1.0f / 1024);
    // t's fraction within 2^-10 of one half.
    auto near_half = [&](Vf t) { return hn::Lt(hn::Abs(hn::Sub(hn::Sub(t, hn::Trunc(t)), half)), band); };
    hn::Mask<Df> near;
    if constexpr (kSearch == Search::kUniform) {
      const Vf t = hn::Mul(r, hn::Set(df, static_cast<float>(last)));
      code = hn::ConvertTo(di, hn::Add(t, half));
      near = near_half(t);
    } else {  // kE4M3: exponent e = E − 120, the top 3 mantissa bits and the next one to round; below 2^-6, m · 2^-9
      const Vf v = hn::Mul(r, hn::Set(df, 448.0f));
      const Vi bits = hn::BitCast(di, v);
      const Vi exponent = hn::ShiftRight<23>(bits);
      const Vi doubled = hn::Or(hn::ShiftLeft<4>(hn::Sub(exponent, hn::Set(di, 120))), hn::And(hn::ShiftRight<19>(bits), hn::Set(di, 15)));
      const Vi normal = hn::ShiftRight<1>(hn::Add(doubled, hn::Set(di, 1)));
      const Vf units = hn::Mul(v, hn::Set(df, 512.0f));
      const auto is_normal = hn::Gt(exponent, hn::Set(di, 120));
      code = hn::IfThenElse(is_normal, normal, hn::ConvertTo(di, hn::Add(units, half)));
      // A normal value is near a midpoint when the mantissa bits below the top 3 are near 1000…0.
      const Vi from_half = hn::Abs(hn::Sub(hn::And(bits, hn::Set(di, 0xFFFFF)), hn::Set(di, 0x80000)));
      const auto near_normal = hn::RebindMask(df, hn::And(is_normal, hn::Lt(from_half, hn::Set(di, 0x400))));
      near = hn::Or(near_normal, hn::AndNot(hn::RebindMask(df, is_normal), near_half(units)));
    }
    code = hn::Min(hn::Max(code, hn::Zero(di)), hn::Set(di, last));  // also tames NaN and Inf
    if (!hn::AllFalse(df, near)) {
      const Vi one = hn::Set(di, 1);
      const Vf below = hn::GatherIndex(df, midpoints.data(), hn::Max(hn::Sub(code, one), hn::Zero(di)));
      const Vf above = hn::GatherIndex(df, midpoints.data(), hn::Min(code, hn::Set(di, last - 1)));
      const auto down = hn::And(hn::Gt(code, hn::Zero(di)), hn::RebindMask(di, hn::Ge(below, r)));
      const auto up = hn::And(hn::Lt(code, hn::Set(di, last)), hn::RebindMask(di, hn::Lt(above, r)));
      code = hn::IfThenElse(down, hn::Sub(code, one), hn::IfThenElse(up, hn::Add(code, one), code));
    }
  }
  // The sign bit for negative values whose code is not zero (−0 and values that round to 0 stay 0).
  const Vi negative = hn::And(hn::BitCast(di, hn::VecFromMask(df, hn::Lt(x, hn::Zero(df)))),
                              hn::VecFromMask(di, hn::Gt(code, hn::Zero(di))));
  return hn::Or(code, hn::And(negative, hn::Set(di, int32_t{1} << (format.bits - 1))));
}

// levels[code without sign] · scale, negated when the sign bit is set.
HWY_INLINE Vf values_of(const ScaledFormat& format, Vi code, Vf scale) {
  const Df df;
  const Di di;
  const int32_t sign_bit = int32_t{1} << (format.bits - 1);
  const Vf value = hn::Mul(hn::GatherIndex(df, format.levels.data(), hn::And(code, hn::Set(di, sign_bit - 1))), scale);
  const auto negative = hn::RebindMask(df, hn::Ne(hn::And(code, hn::Set(di, sign_bit)), hn::Zero(di)));
  return hn::IfThenElse(negative, hn::Neg(value), value);
}

template <Search kSearch>
bool encode_with(const ScaledFormat& format, const float* HWY_RESTRICT in, int64_t first, int64_t last,
                 uint8_t* HWY_RESTRICT scales, uint8_t* HWY_RESTRICT codes) {
  const Df df;
  const D8 d8;
  const size_t n = hn::Lanes(df);
  auto bad = hn::FirstN(df, 0);  // lanes that have seen NaN or Inf: none yet
  for (int64_t b = first; b < last; ++b) {
    const float* x = in + b * kBlock;
    Vf largest = hn::Zero(df);
    for (size_t i = 0; i < kBlock; i += n) {
      const Vf v = hn::LoadU(df, x + i);
      bad = hn::Or(bad, hn::Not(hn::IsFinite(v)));
      largest = hn::Max(largest, hn::Abs(v));
    }
    const float scale = hn::GetLane(hn::MaxOfLanes(df, largest));
    std::memcpy(scales + 4 * b, &scale, 4);
    const Vf divisor = hn::Set(df, std::max(scale, std::numeric_limits<float>::denorm_min()));
    if (format.bits == 8) {
      uint8_t* out = codes + b * kBlock;
      for (size_t i = 0; i < kBlock; i += n) hn::StoreU(hn::DemoteTo(d8, codes_of<kSearch>(format, hn::LoadU(df, x + i), divisor)), d8, out + i);
    } else {
      uint8_t* out = codes + b * kBlock / 2;
      for (size_t i = 0; i < kBlock; i += 2 * n) {
        Vf even, odd;
        hn::LoadInterleaved2(df, x + i, even, odd);
        const Vi packed = hn::Or(codes_of<kSearch>(format, even, divisor), hn::ShiftLeft<4>(codes_of<kSearch>(format, odd, divisor)));
        hn::StoreU(hn::DemoteTo(d8, packed), d8, out + i / 2);
      }
    }
  }
  return hn::AllFalse(df, bad);
}

bool EncodeBlocks(const ScaledFormat& format, const float* HWY_RESTRICT in, int64_t first, int64_t last,
                  uint8_t* HWY_RESTRICT scales, uint8_t* HWY_RESTRICT codes) {
  switch (search_of(format)) {
    case Search::kFew: return encode_with<Search::kFew>(format, in, first, last, scales, codes);
    case Search::kTable: return encode_with<Search::kTable>(format, in, first, last, scales, codes);
    case Search::kUniform: return encode_with<Search::kUniform>(format, in, first, last, scales, codes);
    case Search::kE4M3: return encode_with<Search::kE4M3>(format, in, first, last, scales, codes);
  }
  return false;
}

void DecodeAddBlocks(const ScaledFormat& format, const uint8_t* HWY_RESTRICT scales, const uint8_t* HWY_RESTRICT codes,
                     int64_t first, int64_t last, float* HWY_RESTRICT out) {
  const Df df;
  const Di di;
  const D8 d8;
  const size_t n = hn::Lanes(df);
  for (int64_t b = first; b < last; ++b) {
    float scale_value;
    std::memcpy(&scale_value, scales + 4 * b, 4);
    const Vf scale = hn::Set(df, scale_value);
    float* o = out + b * kBlock;
    if (format.bits == 8) {
      const uint8_t* in = codes + b * kBlock;
      for (size_t i = 0; i < kBlock; i += n) {
        const Vi code = hn::PromoteTo(di, hn::LoadU(d8, in + i));
        hn::StoreU(hn::Add(hn::LoadU(df, o + i), values_of(format, code, scale)), df, o + i);
      }
    } else {
      const uint8_t* in = codes + b * kBlock / 2;
      for (size_t i = 0; i < kBlock; i += 2 * n) {
        const Vi bytes = hn::PromoteTo(di, hn::LoadU(d8, in + i / 2));
        Vf even, odd;
        hn::LoadInterleaved2(df, o + i, even, odd);
        even = hn::Add(even, values_of(format, hn::And(bytes, hn::Set(di, 0xF)), scale));
        odd = hn::Add(odd, values_of(format, hn::ShiftRight<4>(bytes), scale));
        hn::StoreInterleaved2(even, odd, df, o + i);
      }
    }
  }
}

int64_t CountNotFinite(const float* HWY_RESTRICT in, int64_t count) {
  const Df df;
  const auto lanes = static_cast<int64_t>(hn::Lanes(df));
  int64_t not_finite = 0, i = 0;
  for (; i + lanes <= count; i += lanes) {
    not_finite += static_cast<int64_t>(hn::CountTrue(df, hn::Not(hn::IsFinite(hn::LoadU(df, in + i)))));
  }
  for (; i < count; ++i) not_finite += std::isfinite(in[i]) ? 0 : 1;
  return not_finite;
}

const char* TargetName() { return hwy::TargetName(HWY_TARGET); }

// A lane-wide odd-even transposition sort of `k` rows (k passes of compare-exchanges, each a Min
// and a Max over whole vectors), then the mean of sorted rows [cut, cut + keep), for every whole
// vector of columns; returns the columns done.
int64_t CombineSorted(const float* HWY_RESTRICT terms, int64_t k, int64_t n, int64_t cut, int64_t keep, float* HWY_RESTRICT out) {
  const Df df;
  const auto lanes = static_cast<int64_t>(hn::Lanes(df));
  auto buffer = hwy::AllocateAligned<float>(static_cast<size_t>(k * lanes));  // on the heap: vectors may be wide
  float* HWY_RESTRICT rows = buffer.get();
  const auto scale = hn::Set(df, 1.0f / static_cast<float>(keep));
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    for (int64_t j = 0; j < k; ++j) hn::Store(hn::LoadU(df, terms + j * n + i), df, rows + j * lanes);
    for (int64_t pass = 0; pass < k; ++pass) {
      for (int64_t j = pass % 2; j + 1 < k; j += 2) {
        const auto a = hn::Load(df, rows + j * lanes), b = hn::Load(df, rows + (j + 1) * lanes);
        hn::Store(hn::Min(a, b), df, rows + j * lanes);
        hn::Store(hn::Max(a, b), df, rows + (j + 1) * lanes);
      }
    }
    auto sum = hn::Zero(df);
    for (int64_t j = cut; j < cut + keep; ++j) sum = hn::Add(sum, hn::Load(df, rows + j * lanes));
    hn::StoreU(hn::Mul(sum, scale), df, out + i);
  }
  return i;
}

}  // namespace HWY_NAMESPACE
}  // namespace loco::comm::kernels
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace loco::comm::kernels {

HWY_EXPORT(EncodeBlocks);
HWY_EXPORT(DecodeAddBlocks);
HWY_EXPORT(CountNotFinite);
HWY_EXPORT(TargetName);
HWY_EXPORT(CombineSorted);

ScaledFormat::ScaledFormat(std::vector<float> levels_in, int bits_in, Guess guess_in)
    : levels(std::move(levels_in)), bits(bits_in), guess(guess_in) {
  for (size_t i = 0; i + 1 < levels.size(); ++i) midpoints.push_back((levels[i] + levels[i + 1]) / 2);
  const uint32_t last = std::bit_cast<uint32_t>(1.0f) >> kTableShift;
  for (uint32_t k = 0; k <= last; ++k) {
    const float low = std::bit_cast<float>(k << kTableShift);
    first_code.push_back(static_cast<int32_t>(std::lower_bound(midpoints.begin(), midpoints.end(), low) - midpoints.begin()));
  }
}

uint32_t ScaledFormat::code_of(float r) const {
  auto code = static_cast<uint32_t>(first_code[std::bit_cast<uint32_t>(r) >> kTableShift]);
  while (code < midpoints.size() && midpoints[code] < r) ++code;
  return code;
}

namespace {

bool whole(int64_t b, int64_t count) { return (b + 1) * kBlock <= count; }

// The reference: one value at a time. False when a value is NaN or Inf.
bool encode_block_scalar(const ScaledFormat& format, const float* in, int64_t count, int64_t b, uint8_t* scales,
                         uint8_t* codes) {
  const int64_t begin = b * kBlock, n = std::min(kBlock, count - begin);
  const float* x = in + begin;
  const uint32_t sign_bit = 1u << (format.bits - 1);
  float scale = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(x[i])) return false;
    scale = std::max(scale, std::fabs(x[i]));
  }
  std::memcpy(scales + 4 * b, &scale, 4);
  // |x| <= s, so the correctly rounded |x| / s is in [0, 1]; a zero block divides 0 by the tiny.
  const float divisor = std::max(scale, std::numeric_limits<float>::denorm_min());
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t magnitude = format.code_of(std::fabs(x[i]) / divisor);
    const auto code = static_cast<uint8_t>(x[i] < 0 && magnitude > 0 ? magnitude | sign_bit : magnitude);
    if (format.bits == 8) {
      codes[begin + i] = code;
    } else if (i % 2 == 0) {  // two codes a byte, the first in the low nibble; a block starts on a byte
      codes[(begin + i) / 2] = code;
    } else {
      codes[(begin + i) / 2] = static_cast<uint8_t>(codes[(begin + i) / 2] | (code << 4));
    }
  }
  return true;
}

void decode_add_block_scalar(const ScaledFormat& format, const uint8_t* scales, const uint8_t* codes, int64_t count,
                             int64_t b, float* out) {
  const int64_t begin = b * kBlock, end = std::min(begin + kBlock, count);
  const uint32_t sign_bit = 1u << (format.bits - 1);
  float scale;
  std::memcpy(&scale, scales + 4 * b, 4);
  for (int64_t i = begin; i < end; ++i) {
    const uint32_t code = format.bits == 8 ? codes[i] : (codes[i / 2] >> (4 * (i % 2))) & 0xF;
    const float value = format.levels[code & (sign_bit - 1)] * scale;
    out[i] += code & sign_bit ? -value : value;
  }
}

}  // namespace

bool encode_blocks(const ScaledFormat& format, const float* in, int64_t count, int64_t first, int64_t last,
                   uint8_t* scales, uint8_t* codes, Path path) {
  int64_t vector_last = first;
  bool finite = true;
  if (path == Path::kBest) {
    vector_last = last;
    while (vector_last > first && !whole(vector_last - 1, count)) --vector_last;
    finite = HWY_DYNAMIC_DISPATCH(EncodeBlocks)(format, in, first, vector_last, scales, codes);
  }
  for (int64_t b = vector_last; b < last && finite; ++b) finite = encode_block_scalar(format, in, count, b, scales, codes);
  return finite;
}

void decode_add_blocks(const ScaledFormat& format, const uint8_t* scales, const uint8_t* codes, int64_t count,
                       int64_t first, int64_t last, float* out, Path path) {
  int64_t vector_last = first;
  if (path == Path::kBest) {
    vector_last = last;
    while (vector_last > first && !whole(vector_last - 1, count)) --vector_last;
    HWY_DYNAMIC_DISPATCH(DecodeAddBlocks)(format, scales, codes, first, vector_last, out);
  }
  for (int64_t b = vector_last; b < last; ++b) decode_add_block_scalar(format, scales, codes, count, b, out);
}

int64_t count_not_finite(const float* in, int64_t count) { return HWY_DYNAMIC_DISPATCH(CountNotFinite)(in, count); }

void combine_sorted(const float* terms, int64_t k, int64_t n, int64_t cut, int64_t keep, float* out) {
  LOCO_CHECK(k >= 1 && k <= kMaxSortedTerms && cut >= 0 && keep >= 1 && cut + keep <= k, "combine_sorted of {} terms", k);
  int64_t i = HWY_DYNAMIC_DISPATCH(CombineSorted)(terms, k, n, cut, keep, out);
  std::vector<float> column(static_cast<size_t>(k));
  for (; i < n; ++i) {
    for (int64_t j = 0; j < k; ++j) column[static_cast<size_t>(j)] = terms[j * n + i];
    std::sort(column.begin(), column.end());
    float sum = 0;
    for (int64_t j = cut; j < cut + keep; ++j) sum += column[static_cast<size_t>(j)];
    out[i] = sum * (1.0f / static_cast<float>(keep));
  }
}

const char* vector_target() { return HWY_DYNAMIC_DISPATCH(TargetName)(); }

}  // namespace loco::comm::kernels
#endif  // HWY_ONCE
