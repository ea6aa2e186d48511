#include "loco/comm/encoding.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "loco/comm/codec_kernels.h"
#include "loco/core/error.h"

namespace loco::comm {
namespace {

using kernels::ScaledFormat;

std::vector<float> fp8_e4m3_levels() {
  // Codes 0..126 of E4M3 (127 is NaN): exponent e = code >> 3 (bias 7), mantissa m = code & 7;
  // e = 0 is subnormal, m · 2^-9. Divided by 448, the largest, so the levels end at 1.
  std::vector<float> out;
  for (int code = 0; code <= 126; ++code) {
    const int e = code >> 3, m = code & 7;
    const double value = e == 0 ? m * std::ldexp(1.0, -9) : (1.0 + m / 8.0) * std::ldexp(1.0, e - 7);
    out.push_back(static_cast<float>(value / 448.0));
  }
  return out;
}

std::vector<float> integer_levels(int largest) {
  std::vector<float> out;
  for (int k = 0; k <= largest; ++k) out.push_back(static_cast<float>(static_cast<double>(k) / largest));
  return out;
}

}  // namespace

const ScaledFormat* kernels::scaled_format(Encoding encoding) {
  static const ScaledFormat fp8{fp8_e4m3_levels(), 8, ScaledFormat::Guess::kE4M3};
  static const ScaledFormat e3m0{{0.f, 0x1p-6f, 0x1p-5f, 0x1p-4f, 0x1p-3f, 0x1p-2f, 0x1p-1f, 1.f}, 4};
  static const ScaledFormat int8{integer_levels(127), 8, ScaledFormat::Guess::kUniform};
  static const ScaledFormat int4{integer_levels(7), 4};
  switch (encoding) {
    case Encoding::kFp8: return &fp8;
    case Encoding::kE3M0: return &e3m0;
    case Encoding::kInt8: return &int8;
    case Encoding::kInt4: return &int4;
    default: return nullptr;
  }
}

namespace {

using kernels::scaled_format;

int64_t blocks_of(int64_t count) { return (count + kEncodingBlock - 1) / kEncodingBlock; }

// Bytes of `t` (a contiguous CPU tensor) as a 1-D uint8 tensor, and back.
torch::Tensor as_bytes(const torch::Tensor& t) { return t.contiguous().view({-1}).view(torch::kUInt8); }
torch::Tensor from_bytes(const torch::Tensor& bytes, torch::ScalarType type) { return bytes.clone().view(type); }

void check_finite(const torch::Tensor& flat) {
  if (kernels::count_not_finite(flat.data_ptr<float>(), flat.numel()) == 0) return;  // one vector pass
  auto bad = torch::logical_not(torch::isfinite(flat));
  const int64_t index = bad.nonzero()[0][0].item<int64_t>();
  throw DataError("comm", fmt::format("cannot encode value {} at index {} of {}: NaN and Inf have no encoding; an outer "
                                      "gradient that is not finite means training diverged (hint: lower optim.lr or "
                                      "outer.lr)", flat[index].item<float>(), index, flat.numel()));
}

int64_t encoded_bytes_scaled(const ScaledFormat& format, int64_t count) {
  return 4 * blocks_of(count) + (format.bits == 8 ? count : (count + 1) / 2);
}

// Blocks per task of at::parallel_for: the codecs are memory-bound beyond a few hundred KB.
constexpr int64_t kBlocksPerTask = 64;

torch::Tensor encode_scaled(const torch::Tensor& flat, const ScaledFormat& format) {
  const int64_t count = flat.numel(), blocks = blocks_of(count);
  auto encoded = torch::empty({encoded_bytes_scaled(format, count)}, torch::kUInt8);
  const float* in = flat.data_ptr<float>();
  uint8_t* scales = encoded.data_ptr<uint8_t>();
  uint8_t* codes = scales + 4 * blocks;
  std::atomic<bool> finite = true;
  at::parallel_for(0, blocks, kBlocksPerTask, [&](int64_t first, int64_t last) {
    if (!kernels::encode_blocks(format, in, count, first, last, scales, codes)) finite = false;
  });
  if (!finite) check_finite(flat);  // throws, naming the first value that is not
  return encoded;
}

// out[i] += decode(encoded)[i] for `count` values.
void decode_add_scaled(const torch::Tensor& encoded, const ScaledFormat& format, int64_t count, float* out) {
  const uint8_t* scales = encoded.data_ptr<uint8_t>();
  const uint8_t* codes = scales + 4 * blocks_of(count);
  at::parallel_for(0, blocks_of(count), kBlocksPerTask, [&](int64_t first, int64_t last) {
    kernels::decode_add_blocks(format, scales, codes, count, first, last, out);
  });
}

}  // namespace

EncodingBound encoding_bound(Encoding encoding) {
  switch (encoding) {
    case Encoding::kFp32: return {0, 0, 0};
    case Encoding::kBf16: return {0x1p-8, 0, 0x1p-134};             // half an ulp of an 8-bit significand
    case Encoding::kFp8: return {0x1p-4, 0x1p-10 / 448, 0x1p-150};  // half an ulp of 4 bits; half the subnormal step
    case Encoding::kE3M0: return {1.0 / 3, 0x1p-7, 0x1p-150};       // 1.5·2^k rounds to 2^k; below 2^-7 to zero
    case Encoding::kInt8: return {0, 0.5 / 127, 0x1p-150};
    case Encoding::kInt4: return {0, 0.5 / 7, 0x1p-150};
  }
  return {};
}

int64_t encoded_bytes(Encoding encoding, int64_t count) {
  switch (encoding) {
    case Encoding::kFp32: return 4 * count;
    case Encoding::kBf16: return 2 * count;
    default: break;
  }
  return encoded_bytes_scaled(*scaled_format(encoding), count);
}

torch::Tensor encode(const torch::Tensor& values, Encoding encoding) {
  auto flat = values.detach().to(torch::kCPU, torch::kFloat32).contiguous().view({-1});
  if (scaled_format(encoding) != nullptr) return encode_scaled(flat, *scaled_format(encoding));  // checks as it goes
  check_finite(flat);
  switch (encoding) {
    case Encoding::kFp32: return as_bytes(flat.clone());
    case Encoding::kBf16: {
      // float → bfloat16 rounds to nearest even; clamp first so that the top of fp32's range
      // saturates at bf16's largest finite value instead of becoming Inf.
      const double largest = static_cast<double>(std::numeric_limits<c10::BFloat16>::max());
      return as_bytes(flat.clamp(-largest, largest).to(torch::kBFloat16));
    }
    default: break;
  }
  throw InternalError("comm", fmt::format("encode: no encoder for encoding {}", static_cast<int>(encoding)));
}

namespace {

torch::Tensor checked_bytes(const torch::Tensor& encoded, Encoding encoding, int64_t count) {
  LOCO_CHECK(encoded.scalar_type() == torch::kUInt8 && encoded.dim() == 1, "decode: encoded bytes must be 1-D uint8");
  LOCO_CHECK(encoded.numel() == encoded_bytes(encoding, count), "decode: {} bytes do not hold {} values of {} ({} bytes)",
             encoded.numel(), count, to_string(encoding), encoded_bytes(encoding, count));
  return encoded.to(torch::kCPU).contiguous();
}

}  // namespace

torch::Tensor decode(const torch::Tensor& encoded, Encoding encoding, int64_t count) {
  auto bytes = checked_bytes(encoded, encoding, count);
  switch (encoding) {
    case Encoding::kFp32: return from_bytes(bytes, torch::kFloat32);
    case Encoding::kBf16: return from_bytes(bytes, torch::kBFloat16).to(torch::kFloat32);
    default: {
      auto out = torch::zeros({count}, torch::kFloat32);
      decode_add_scaled(bytes, *scaled_format(encoding), count, out.data_ptr<float>());
      return out;
    }
  }
}

void decode_add(const torch::Tensor& encoded, Encoding encoding, torch::Tensor& out) {
  LOCO_CHECK(out.scalar_type() == torch::kFloat32 && out.is_contiguous() && out.device().is_cpu(),
             "decode_add: out must be a contiguous fp32 CPU tensor");
  if (encoding == Encoding::kFp32 || encoding == Encoding::kBf16) {
    out.view({-1}).add_(decode(encoded, encoding, out.numel()));
    return;
  }
  auto bytes = checked_bytes(encoded, encoding, out.numel());
  decode_add_scaled(bytes, *scaled_format(encoding), out.numel(), out.data_ptr<float>());
}

}  // namespace loco::comm
