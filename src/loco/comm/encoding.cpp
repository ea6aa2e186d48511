#include "loco/comm/encoding.h"

#include <cmath>
#include <limits>
#include <vector>

#include "loco/core/error.h"

namespace loco::comm {
namespace {

// A scaled format: the non-negative levels a value's fraction of its block scale rounds to
// (ascending, from 0 to 1), and the bits of one code (sign bit included).
struct Scaled {
  std::vector<float> levels;
  int bits = 8;
};

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

const Scaled* scaled_format(Encoding encoding) {
  static const Scaled fp8{fp8_e4m3_levels(), 8};
  static const Scaled e3m0{{0.f, 0x1p-6f, 0x1p-5f, 0x1p-4f, 0x1p-3f, 0x1p-2f, 0x1p-1f, 1.f}, 4};
  static const Scaled int8 = [] {
    Scaled s{{}, 8};
    for (int k = 0; k <= 127; ++k) s.levels.push_back(static_cast<float>(k / 127.0));
    return s;
  }();
  static const Scaled int4 = [] {
    Scaled s{{}, 4};
    for (int k = 0; k <= 7; ++k) s.levels.push_back(static_cast<float>(k / 7.0));
    return s;
  }();
  switch (encoding) {
    case Encoding::kFp8: return &fp8;
    case Encoding::kE3M0: return &e3m0;
    case Encoding::kInt8: return &int8;
    case Encoding::kInt4: return &int4;
    default: return nullptr;
  }
}

torch::Tensor tensor_of(const std::vector<float>& values) {
  return torch::from_blob(const_cast<float*>(values.data()), {static_cast<int64_t>(values.size())}, torch::kFloat32).clone();
}

int64_t blocks_of(int64_t count) { return (count + kEncodingBlock - 1) / kEncodingBlock; }

// Bytes of `t` (a contiguous CPU tensor) as a 1-D uint8 tensor, and back.
torch::Tensor as_bytes(const torch::Tensor& t) { return t.contiguous().view({-1}).view(torch::kUInt8); }
torch::Tensor from_bytes(const torch::Tensor& bytes, torch::ScalarType type) { return bytes.clone().view(type); }

void check_finite(const torch::Tensor& flat) {
  auto bad = torch::logical_not(torch::isfinite(flat));
  if (!bad.any().item<bool>()) return;
  const int64_t index = bad.nonzero()[0][0].item<int64_t>();
  throw DataError("comm", fmt::format("cannot encode value {} at index {} of {}: NaN and Inf have no encoding; an outer "
                                      "gradient that is not finite means training diverged (hint: lower optim.lr or "
                                      "outer.lr)", flat[index].item<float>(), index, flat.numel()));
}

torch::Tensor encode_scaled(const torch::Tensor& flat, const Scaled& format) {
  const int64_t count = flat.numel(), blocks = blocks_of(count);
  auto padded = torch::zeros({blocks * kEncodingBlock}, torch::kFloat32);
  padded.narrow(0, 0, count).copy_(flat);
  auto values = padded.view({blocks, kEncodingBlock});
  auto magnitude = values.abs();
  auto scale = std::get<0>(magnitude.max(1));  // (blocks) the largest magnitude of each block
  // |x| <= s, so the correctly rounded |x| / s is in [0, 1]; a zero block divides 0 by the tiny.
  auto ratio = magnitude / scale.clamp_min(std::numeric_limits<float>::denorm_min()).unsqueeze(1);
  auto levels = tensor_of(format.levels);
  auto midpoints = (levels.narrow(0, 0, levels.numel() - 1) + levels.narrow(0, 1, levels.numel() - 1)) / 2;
  auto codes = torch::bucketize(ratio, midpoints, /*out_int32=*/false, /*right=*/false);  // nearest, ties down
  auto negative = torch::logical_and(values < 0, codes > 0).to(torch::kInt64);
  codes = codes.bitwise_or(negative.bitwise_left_shift(format.bits - 1)).view({-1});

  torch::Tensor packed;
  if (format.bits == 8) {
    packed = codes.narrow(0, 0, count).to(torch::kUInt8);
  } else {
    auto pairs = codes.view({-1, 2});  // blocks * kEncodingBlock is even
    packed = pairs.select(1, 0).bitwise_or(pairs.select(1, 1).bitwise_left_shift(4)).to(torch::kUInt8);
    packed = packed.narrow(0, 0, (count + 1) / 2);
  }
  return torch::cat({as_bytes(scale), packed});
}

torch::Tensor decode_scaled(const torch::Tensor& encoded, const Scaled& format, int64_t count) {
  const int64_t blocks = blocks_of(count);
  auto scale = from_bytes(encoded.narrow(0, 0, 4 * blocks), torch::kFloat32);
  auto bytes = encoded.narrow(0, 4 * blocks, encoded.numel() - 4 * blocks).to(torch::kInt64);
  torch::Tensor codes;
  if (format.bits == 8) {
    codes = bytes;
  } else {
    codes = torch::stack({bytes.bitwise_and(0xF), bytes.bitwise_right_shift(4)}, 1).view({-1}).narrow(0, 0, count);
  }
  const int64_t sign_bit = int64_t{1} << (format.bits - 1);
  auto magnitude_codes = torch::zeros({blocks * kEncodingBlock}, torch::kInt64);
  magnitude_codes.narrow(0, 0, count).copy_(codes.bitwise_and(sign_bit - 1));
  auto negative = codes.bitwise_and(sign_bit).ne(0);
  auto values = tensor_of(format.levels).index_select(0, magnitude_codes).view({blocks, kEncodingBlock});
  values = (values * scale.unsqueeze(1)).view({-1}).narrow(0, 0, count);
  return torch::where(negative, -values, values);
}

}  // namespace

const char* to_string(Encoding encoding) {
  switch (encoding) {
    case Encoding::kFp32: return "fp32";
    case Encoding::kBf16: return "bf16";
    case Encoding::kFp8: return "fp8";
    case Encoding::kE3M0: return "e3m0";
    case Encoding::kInt8: return "int8";
    case Encoding::kInt4: return "int4";
  }
  return "?";
}

std::optional<Encoding> parse_encoding(const std::string& name) {
  for (auto e : {Encoding::kFp32, Encoding::kBf16, Encoding::kFp8, Encoding::kE3M0, Encoding::kInt8, Encoding::kInt4}) {
    if (name == to_string(e)) return e;
  }
  return std::nullopt;
}

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
  const auto* format = scaled_format(encoding);
  return 4 * blocks_of(count) + (format->bits == 8 ? count : (count + 1) / 2);
}

torch::Tensor encode(const torch::Tensor& values, Encoding encoding) {
  auto flat = values.detach().to(torch::kCPU, torch::kFloat32).contiguous().view({-1});
  check_finite(flat);
  switch (encoding) {
    case Encoding::kFp32: return as_bytes(flat.clone());
    case Encoding::kBf16: {
      // float → bfloat16 rounds to nearest even; clamp first so that the top of fp32's range
      // saturates at bf16's largest finite value instead of becoming Inf.
      const double largest = static_cast<double>(std::numeric_limits<c10::BFloat16>::max());
      return as_bytes(flat.clamp(-largest, largest).to(torch::kBFloat16));
    }
    default: return encode_scaled(flat, *scaled_format(encoding));
  }
}

torch::Tensor decode(const torch::Tensor& encoded, Encoding encoding, int64_t count) {
  LOCO_CHECK(encoded.scalar_type() == torch::kUInt8 && encoded.dim() == 1, "decode: encoded bytes must be 1-D uint8");
  LOCO_CHECK(encoded.numel() == encoded_bytes(encoding, count), "decode: {} bytes do not hold {} values of {} ({} bytes)",
             encoded.numel(), count, to_string(encoding), encoded_bytes(encoding, count));
  auto bytes = encoded.to(torch::kCPU).contiguous();
  switch (encoding) {
    case Encoding::kFp32: return from_bytes(bytes, torch::kFloat32);
    case Encoding::kBf16: return from_bytes(bytes, torch::kBFloat16).to(torch::kFloat32);
    default: return decode_scaled(bytes, *scaled_format(encoding), count);
  }
}

void decode_add(const torch::Tensor& encoded, Encoding encoding, torch::Tensor& out) {
  LOCO_CHECK(out.scalar_type() == torch::kFloat32 && out.is_contiguous() && out.device().is_cpu(),
             "decode_add: out must be a contiguous fp32 CPU tensor");
  out.view({-1}).add_(decode(encoded, encoding, out.numel()));
}

}  // namespace loco::comm
