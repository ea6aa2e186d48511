// The inner loops of the scaled wire formats (fp8, e3m0, int8, int4; see encoding.h): encode and
// decode of whole blocks, vectorized with Google Highway and dispatched at run time to the widest
// instruction set the CPU has (SSE4, AVX2, AVX-512, NEON...). No torch here: this translation unit
// is compiled once per target.
//
// The vector path's output is byte-identical to the scalar reference's, which defines the format:
//   - a block's scale s is the largest |x|; each value's fraction r = |x| / max(s, denormal min)
//     is an IEEE division, as in the reference (no reciprocal);
//   - a code is the number of midpoints between levels strictly below r (nearest level, ties
//     toward zero), found by comparisons against the midpoints themselves, never by arithmetic
//     that could round differently;
//   - decode is levels[code] · s, negated for the sign bit, added to the output: one multiply and
//     one add, never fused (the file is compiled with -ffp-contract=off).
// The last block of a tensor, when partial, always takes the scalar path.
#pragma once

#include <cstdint>
#include <vector>

namespace loco::comm {

enum class Encoding;

namespace kernels {

inline constexpr int64_t kBlock = 256;  // = kEncodingBlock

// A scaled format: the non-negative levels a value's fraction of its block scale rounds to
// (ascending, from 0 to 1), and the bits of one code (sign bit included). `first_code[k]` is the
// code of the smallest float whose bits shifted right by kTableShift are k: a code search starts
// there and steps up (each entry spans a factor of 1 + 1/128: a step at most for every format).
struct ScaledFormat {
  // How the vector encoder of a format with many levels guesses a code to within one, before it
  // settles the code by comparing with the two midpoints around the guess (formats of up to 16
  // levels compare with every midpoint instead).
  enum class Guess {
    kTable,    // first_code[] of the fraction's bits (a gather, then steps)
    kUniform,  // levels k / L: round(r · L)
    kE4M3,     // levels E4M3 / 448: the E4M3 code of r · 448 with its mantissa cut to 3 bits
  };

  std::vector<float> levels;
  int bits = 8;
  Guess guess = Guess::kTable;
  std::vector<float> midpoints;
  std::vector<int32_t> first_code;

  static constexpr int kTableShift = 16;  // keeps the exponent and 7 mantissa bits of a float in [0, 1]

  ScaledFormat(std::vector<float> levels, int bits, Guess guess = Guess::kTable);

  // The code of a fraction r in [0, 1] (no sign): the number of midpoints strictly below r.
  uint32_t code_of(float r) const;
};

// The format of a scaled encoding; nullptr for fp32 and bf16 (defined in encoding.cpp).
const ScaledFormat* scaled_format(Encoding encoding);

enum class Path {
  kBest,    // the widest vector target this CPU supports (the scalar loop for a partial block)
  kScalar,  // the reference loop throughout: what tests compare the vector path against
};

// Encodes blocks [first, last) of the `count` values at `in`: block b's scale goes to
// scales + 4 b (fp32, little-endian), its codes to codes + b · 256 (8-bit formats) or b · 128
// (4-bit formats, two a byte, the first in the low nibble). Returns false when some value is NaN
// or Inf, which have no encoding (the output is then meaningless).
bool encode_blocks(const ScaledFormat& format, const float* in, int64_t count, int64_t first, int64_t last,
                   uint8_t* scales, uint8_t* codes, Path path = Path::kBest);

// out[i] += decode(codes)[i] for the values of blocks [first, last) of `count`.
void decode_add_blocks(const ScaledFormat& format, const uint8_t* scales, const uint8_t* codes, int64_t count,
                       int64_t first, int64_t last, float* out, Path path = Path::kBest);

// How many of the `count` values at `in` are NaN or Inf: one vector pass, no temporaries.
int64_t count_not_finite(const float* in, int64_t count);

// The robust combines' kernel (Combine, wire_format.h): `terms` holds k rows of n values, row-major;
// out[i] is the mean of column i's sorted values [cut, cut + keep) (finite values: the order of a
// NaN is not defined). k at most kMaxSortedTerms; a sorting network over whole vectors, then a
// scalar sort for the last columns.
inline constexpr int64_t kMaxSortedTerms = 64;
void combine_sorted(const float* terms, int64_t k, int64_t n, int64_t cut, int64_t keep, float* out);

// The name of the vector target kBest runs on this CPU ("AVX3", "AVX2", ...), for benchmarks.
const char* vector_target();

}  // namespace kernels
}  // namespace loco::comm
