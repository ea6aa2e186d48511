// safetensors files (runtime/store/safetensors.h): checkpoints and initial weights, which may come
// from elsewhere (train.init_from). decode_safetensors must accept the bytes or throw DataError;
// what it accepts must encode and decode again to the same tensors.
#include "fuzz.h"
#include "loco/runtime/store/safetensors.h"

using loco::fuzz::finding;
using loco::runtime::decode_safetensors;
using loco::runtime::encode_safetensors;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  loco::fuzz::expect_refusal("decode_safetensors", [&] {
    const auto file = decode_safetensors(loco::fuzz::bytes_of(data, size), "fuzz.safetensors");
    auto metadata = file.metadata;
    metadata.erase("loco.xxh3");  // encode writes the checksum of what it encodes
    loco::runtime::SafetensorsFile again;
    try {
      again = decode_safetensors(encode_safetensors(file.tensors, metadata), "encoded");
    } catch (const std::exception& e) {
      finding(std::string("its own encoding is refused: ") + e.what());
    }
    if (again.tensors.size() != file.tensors.size()) finding("encode/decode changed the number of tensors");
    for (size_t i = 0; i < file.tensors.size(); ++i) {
      const auto& [name, tensor] = file.tensors[i];
      const auto& [name2, tensor2] = again.tensors[i];
      if (name != name2 || tensor.sizes() != tensor2.sizes() || tensor.scalar_type() != tensor2.scalar_type() ||
          (tensor.numel() > 0 && std::memcmp(tensor.data_ptr(), tensor2.data_ptr(), tensor.nbytes()) != 0)) {
        finding("encode/decode changed tensor '" + name + "'");
      }
    }
  });
  return 0;
}
