// Encodings of fp32 values for the wire: how Streaming DiLoCo sends outer gradients in fewer bits
// (Douillard et al. 2025, arXiv 2501.18512, section 2.3; docs/streaming.md).
//
//   fp32   4 bytes per value, exact
//   bf16   2 bytes: the top half of the fp32, rounded to nearest even; saturates at ±3.39e38
//   fp8    1 byte:  E4M3 (4 exponent bits, 3 mantissa bits, max 448), per-block scaled
//   e3m0   4 bits:  sign + 3 exponent bits, no mantissa: 0 or ±2^k·s for k in [-6, 0]
//   int8   1 byte:  sign-magnitude integer in [-127, 127], per-block scaled
//   int4   4 bits:  sign-magnitude integer in [-7, 7], per-block scaled
//
// The scaled formats split the values into blocks of kEncodingBlock and store each block's
// largest magnitude s as an fp32 before the codes, so that a value encodes as its fraction of s
// rounded to the nearest level (ties toward zero). The layout of an encoded buffer is
// [scales: fp32 x blocks][codes], little-endian; 4-bit codes pack two per byte, the first value
// in the low nibble. Decoding happens in fp32.
//
// NaN and Inf cannot be encoded: encode() refuses them with a DataError naming the first one
// (an outer gradient that is not finite means training diverged; sending it would corrupt every
// worker's θ). Zeros and fp32 denormals encode like any other value.
#pragma once

#include <torch/types.h>
#include <torch/utils.h>

#include <cstdint>
#include <optional>
#include <string>

#include "loco/comm/wire_format.h"

namespace loco::comm {

// Encodes `values` (fp32, any shape, any device; read as a flat array) into a 1-D uint8 CPU tensor
// of encoded_bytes(encoding, values.numel()). Throws DataError on NaN or Inf.
torch::Tensor encode(const torch::Tensor& values, Encoding encoding);

// out += decode(encoded): `out` is a contiguous fp32 CPU tensor of the encoded values' count.
// Throws InternalError when the encoded size does not match out's count.
void decode_add(const torch::Tensor& encoded, Encoding encoding, torch::Tensor& out);

// decode(encoded) as a new 1-D fp32 tensor of `count` values.
torch::Tensor decode(const torch::Tensor& encoded, Encoding encoding, int64_t count);

}  // namespace loco::comm
