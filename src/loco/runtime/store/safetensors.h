// safetensors files (https://github.com/huggingface/safetensors): 8-byte little-endian header
// length N, N bytes of JSON header {name: {dtype, shape, data_offsets}, "__metadata__": {...}},
// then the raw little-endian tensor bytes. Python's `safetensors.torch.load_file` reads what this
// writes. loco adds "loco.xxh3" to the metadata (XXH3-64 of the data bytes) and verifies it on load.
#pragma once

#include <torch/types.h>
#include <torch/utils.h>

#include <filesystem>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace loco::runtime {

using NamedTensors = std::vector<std::pair<std::string, torch::Tensor>>;

struct SafetensorsFile {
  NamedTensors tensors;                         // in file order (sorted by data offset)
  std::map<std::string, std::string> metadata;  // "__metadata__", loco.xxh3 included
};

// Encodes `tensors` (any device; copied to CPU) into safetensors bytes. Supported dtypes: F64, F32,
// BF16, F16, I64, I32, I16, I8, U8, BOOL. Names must be unique (InternalError otherwise).
std::string encode_safetensors(const NamedTensors& tensors, std::map<std::string, std::string> metadata = {});
// Writes atomically. Throws Error naming the file (a full disk included).
void save_safetensors(const std::filesystem::path& path, const NamedTensors& tensors,
                      std::map<std::string, std::string> metadata = {});

// Decodes and verifies: header bounds, JSON, dtypes, shapes against byte ranges, ranges inside the
// file and not overlapping, and the loco.xxh3 checksum when present. `where` names the source in
// DataError messages.
SafetensorsFile decode_safetensors(const std::string& bytes, const std::string& where);
SafetensorsFile load_safetensors(const std::filesystem::path& path);
// The file `relative` under the run folder `root`, as load_safetensors, read without following a
// link below `root` and at most `max_bytes` long (read_file_beneath), and refused without a
// loco.xxh3 checksum (loco writes one into every file it saves): for files that come from other
// hosts through a shared folder, DiPaCo's modules, outer gradients, path states and routers.
SafetensorsFile load_checksummed_safetensors(const std::filesystem::path& root, const std::filesystem::path& relative,
                                             uint64_t max_bytes);

}  // namespace loco::runtime
