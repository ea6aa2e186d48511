#include "loco/runtime/store/safetensors.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>
#include <limits>
#include <set>

#include "loco/core/error.h"
#include "loco/core/files.h"
#include "loco/core/hash.h"

namespace loco::runtime {
namespace {

constexpr uint64_t kMaxHeaderBytes = 100u << 20;  // the reference implementation's limit

const std::vector<std::pair<torch::ScalarType, std::string>>& dtype_table() {
  static const std::vector<std::pair<torch::ScalarType, std::string>> table = {
      {torch::kFloat64, "F64"}, {torch::kFloat32, "F32"}, {torch::kBFloat16, "BF16"}, {torch::kFloat16, "F16"},
      {torch::kInt64, "I64"},   {torch::kInt32, "I32"},   {torch::kInt16, "I16"},     {torch::kInt8, "I8"},
      {torch::kUInt8, "U8"},    {torch::kBool, "BOOL"}};
  return table;
}

std::string dtype_name(torch::ScalarType type) {
  for (const auto& [t, name] : dtype_table()) {
    if (t == type) return name;
  }
  LOCO_CHECK(false, "safetensors cannot store dtype {}", c10::toString(type));
  return {};
}

}  // namespace

std::string encode_safetensors(const NamedTensors& tensors, std::map<std::string, std::string> metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  std::set<std::string> names;
  std::vector<torch::Tensor> contiguous;
  uint64_t offset = 0;
  for (const auto& [name, tensor] : tensors) {
    LOCO_CHECK(names.insert(name).second, "duplicate tensor name '{}'", name);
    LOCO_CHECK(name != "__metadata__", "reserved tensor name");
    auto cpu = tensor.detach().to(torch::kCPU).contiguous();
    const uint64_t bytes = static_cast<uint64_t>(cpu.numel()) * cpu.element_size();
    header[name] = {{"dtype", dtype_name(cpu.scalar_type())},
                    {"shape", cpu.sizes().vec()},
                    {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
    contiguous.push_back(std::move(cpu));
  }
  std::string data;
  data.reserve(offset);
  for (const auto& t : contiguous) data.append(static_cast<const char*>(t.data_ptr()), t.numel() * t.element_size());
  metadata["loco.xxh3"] = hex64(hash64(data));
  header["__metadata__"] = metadata;
  std::string json = header.dump();
  json.append((8 - json.size() % 8) % 8, ' ');  // align the data section to 8 bytes
  std::string out(8, '\0');
  uint64_t n = json.size();
  for (int i = 0; i < 8; ++i) out[static_cast<size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xff);
  out += json;
  out += data;
  return out;
}

void save_safetensors(const std::filesystem::path& path, const NamedTensors& tensors, std::map<std::string, std::string> metadata) {
  write_file_atomic(path, encode_safetensors(tensors, std::move(metadata)), "checkpoint", Readers::kOwner);
}

SafetensorsFile decode_safetensors(const std::string& bytes, const std::string& where) {
  auto fail = [&](const std::string& what) { return DataError("checkpoint", fmt::format("{}: {}", where, what)); };
  if (bytes.size() < 8) throw fail(fmt::format("truncated: {} bytes, a safetensors file has at least 8", bytes.size()));
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = n << 8 | static_cast<unsigned char>(bytes[static_cast<size_t>(i)]);
  if (n > kMaxHeaderBytes || n > bytes.size() - 8) {
    throw fail(fmt::format("header length {} does not fit the file of {} bytes (truncated or not safetensors)", n, bytes.size()));
  }
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(bytes.begin() + 8, bytes.begin() + 8 + static_cast<std::ptrdiff_t>(n));
  } catch (const nlohmann::json::exception& e) {
    throw fail(fmt::format("header is not valid JSON: {}", e.what()));
  }
  if (!header.is_object()) throw fail("header is not a JSON object");
  const std::string_view data(bytes.data() + 8 + n, bytes.size() - 8 - n);

  SafetensorsFile file;
  std::vector<std::tuple<uint64_t, uint64_t, std::string, torch::ScalarType, std::vector<int64_t>>> entries;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) throw fail("__metadata__ is not an object");
      for (const auto& [k, v] : entry.items()) {
        if (!v.is_string()) throw fail(fmt::format("metadata '{}' is not a string", k));
        file.metadata[k] = v.get<std::string>();
      }
      continue;
    }
    try {
      const std::string dtype = entry.at("dtype").get<std::string>();
      auto it = std::find_if(dtype_table().begin(), dtype_table().end(), [&](const auto& p) { return p.second == dtype; });
      if (it == dtype_table().end()) throw fail(fmt::format("tensor '{}' has unsupported dtype '{}'", name, dtype));
      // Only non-negative JSON integers: nlohmann's get<> converts a float with an unchecked cast.
      // (Arguments, not captures: clang before 16 cannot capture a structured binding.)
      const auto naturals = [&fail](const nlohmann::json& list, const std::string& tensor, const char* key) {
        if (!list.is_array() || !std::all_of(list.begin(), list.end(), [](const auto& v) { return v.is_number_unsigned(); })) {
          throw fail(fmt::format("tensor '{}' has a {} that is not a list of non-negative integers", tensor, key));
        }
        return list.get<std::vector<uint64_t>>();
      };
      const auto dims = naturals(entry.at("shape"), name, "shape");
      const auto offsets = naturals(entry.at("data_offsets"), name, "data_offsets");
      if (offsets.size() != 2 || offsets[0] > offsets[1] || offsets[1] > data.size()) {
        throw fail(fmt::format("tensor '{}' has data_offsets outside the {} data bytes (truncated?)", name, data.size()));
      }
      // The byte count must not wrap around: a shape of 2^62 x 4 floats would "fit" in 0 bytes,
      // and torch::empty would then be asked for the whole shape.
      uint64_t expected = c10::elementSize(it->first);
      std::vector<int64_t> shape;
      for (uint64_t d : dims) {
        if (d > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) || __builtin_mul_overflow(expected, d, &expected)) {
          throw fail(fmt::format("tensor '{}' has a shape of more bytes than a file can hold", name));
        }
        shape.push_back(static_cast<int64_t>(d));
      }
      if (offsets[1] - offsets[0] != expected) {
        throw fail(fmt::format("tensor '{}' has {} bytes, its shape needs {}", name, offsets[1] - offsets[0], expected));
      }
      entries.emplace_back(offsets[0], offsets[1], name, it->first, shape);
    } catch (const nlohmann::json::exception& e) {
      throw fail(fmt::format("tensor '{}' has a malformed entry: {}", name, e.what()));
    }
  }
  std::sort(entries.begin(), entries.end());
  uint64_t covered = 0;
  for (const auto& [begin, end, name, dtype, shape] : entries) {
    if (begin != covered) throw fail(fmt::format("tensor '{}' overlaps another or leaves a hole in the data", name));
    covered = end;
  }
  if (covered != data.size()) throw fail(fmt::format("{} data bytes but the tensors cover {}", data.size(), covered));
  if (auto it = file.metadata.find("loco.xxh3"); it != file.metadata.end()) {
    const uint64_t expected = parse_hex64(it->second, "checkpoint", where + ": loco.xxh3");
    if (hash64(data.data(), data.size()) != expected) throw fail("checksum mismatch: the tensor data is corrupted");
  }
  for (const auto& [begin, end, name, dtype, shape] : entries) {
    auto tensor = torch::empty(shape, torch::TensorOptions().dtype(dtype));
    if (end > begin) std::memcpy(tensor.data_ptr(), data.data() + begin, end - begin);
    file.tensors.emplace_back(name, std::move(tensor));
  }
  return file;
}

SafetensorsFile load_safetensors(const std::filesystem::path& path) {
  return decode_safetensors(read_file(path, "checkpoint"), path.string());
}

SafetensorsFile load_checksummed_safetensors(const std::filesystem::path& root, const std::filesystem::path& relative,
                                             uint64_t max_bytes) {
  const auto path = root / relative;
  auto file = decode_safetensors(read_file_beneath(root, relative, "checkpoint", max_bytes), path.string());
  if (!file.metadata.contains("loco.xxh3")) {
    throw DataError("checkpoint", fmt::format("{}: no loco.xxh3 checksum in its metadata; every file loco saves has one, "
                                              "so this one was not written by a loco run", path.string()));
  }
  return file;
}

}  // namespace loco::runtime
