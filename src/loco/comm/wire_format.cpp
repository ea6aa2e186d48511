#include "loco/comm/wire_format.h"

namespace loco::comm {

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

}  // namespace loco::comm
