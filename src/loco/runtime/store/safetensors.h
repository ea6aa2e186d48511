// safetensors files (https://github.com/huggingface/safetensors): 8-byte little-endian header
// length N, N bytes of JSON header {name: {dtype, shape, data_offsets}, "__metadata__": {...}},
// then the raw little-endian tensor bytes. Python's `safetensors.torch.load_file` reads what this
// writes. loco adds "loco.xxh3" to the metadata (XXH3-64 of the data bytes) and verifies it on load,
// and "loco.layout" (XXH3-64 of the tensor entries): a file another writer rewrote keeping loco's
// metadata (its tensors converted to bf16, say) no longer matches its layout, and its data is not
// checked against a checksum of other bytes.
#pragma once

#include <torch/types.h>
#include <torch/utils.h>

#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "loco/core/files.h"

namespace loco::runtime {

using NamedTensors = std::vector<std::pair<std::string, torch::Tensor>>;

struct SafetensorsFile {
  NamedTensors tensors;                         // in file order (sorted by data offset)
  std::map<std::string, std::string> metadata;  // "__metadata__", loco.xxh3 included
  // Whether loco.xxh3 was checked against the data: false for a file without one, or one whose
  // entries no longer hash to its loco.layout (rewritten by another writer, or damaged).
  bool verified = false;
};

// Throws DataError naming `where` unless `file` is as loco wrote it: its checksum present and
// verified. For loco's own files (checkpoints, DiPaCo's shared files), which no other writer makes.
void require_verified(const SafetensorsFile& file, const std::string& where);

// Encodes `tensors` (any device; copied to CPU) into safetensors bytes. Supported dtypes: F64, F32,
// BF16, F16, I64, I32, I16, I8, U8, BOOL. Names must be unique (InternalError otherwise).
std::string encode_safetensors(const NamedTensors& tensors, std::map<std::string, std::string> metadata = {});
// Writes atomically. Throws Error naming the file (a full disk included).
void save_safetensors(const std::filesystem::path& path, const NamedTensors& tensors,
                      std::map<std::string, std::string> metadata = {});

// One tensor of a file written by save_safetensors_streamed: its name, dtype and shape, and how to
// make it (called once, when its bytes are due).
struct TensorSource {
  std::string name;
  torch::ScalarType dtype;
  std::vector<int64_t> shape;
  std::function<torch::Tensor()> make;
};

// Writes a file of `tensors` made one at a time, so that at most one of them is in memory beyond
// what `make` reads (a model's shard larger than memory should hold twice); atomically, with the
// same checksum as save_safetensors. Returns the file's size. Throws Error naming the file.
uint64_t save_safetensors_streamed(const std::filesystem::path& path, const std::vector<TensorSource>& tensors,
                                   std::map<std::string, std::string> metadata = {}, Readers readers = Readers::kOwner);

// Decodes and verifies: header bounds, JSON, dtypes, shapes against byte ranges, ranges inside the
// file and not overlapping, and the loco.xxh3 checksum when present and the entries still hash to
// loco.layout (`verified` says whether it was checked). `where` names the source in
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
