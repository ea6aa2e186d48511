// The wire encodings' names and sizes, with no torch: what a config names and what a plan of the
// bytes on the wire needs (encoding.h encodes and decodes).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace loco::comm {

enum class Encoding { kFp32, kBf16, kFp8, kE3M0, kInt8, kInt4 };

const char* to_string(Encoding encoding);
std::optional<Encoding> parse_encoding(const std::string& name);

// How an all-reduce's terms become its result (Group::all_reduce_sum, group.h). kSum: Σ_q w_q·x_q. The robust ones take, value by value,
// the median (the mean of the two middle ones for an even count) or the trimmed mean (the `trim`
// largest and smallest left out; the median when that leaves none) of the terms of the ranks whose
// weight is not 0, unweighted, times the sum of their weights (1, for weights that make an average):
// a rank whose values are far off moves the result by little, whatever it sends. They need every
// term at one place: kScatter's owners or every rank of kGather (kRing is not used with them); the
// bytes on the wire are kSum's.
enum class Combine { kSum, kMedian, kTrimmedMean };
const char* to_string(Combine combine);

// Values per scale in the scaled formats (fp8, e3m0, int8, int4).
inline constexpr int64_t kEncodingBlock = 256;

// The round-trip error bound of an encoding: for every value x of a block whose largest
// magnitude is s,  |x − decode(encode(x))| <= relative·|x| + absolute·s + floor, where floor is
// the resolution of the denormals the result lands in (2^-134 for bf16; 2^-150, half fp32's
// smallest denormal, for the scaled formats' fp32 arithmetic).
struct EncodingBound {
  double relative = 0;
  double absolute = 0;
  double floor = 0;
};
EncodingBound encoding_bound(Encoding encoding);

// Bytes of encode()'s output for `count` values.
int64_t encoded_bytes(Encoding encoding, int64_t count);

}  // namespace loco::comm
