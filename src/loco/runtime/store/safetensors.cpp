#include "loco/runtime/store/safetensors.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
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

// One tensor's entry in a header.
struct Entry {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;
};

// XXH3-64 of the header's tensor entries (names, dtypes, shapes, offsets; in name order), written
// as "loco.layout" beside "loco.xxh3": a file whose entries no longer hash to it was rewritten by
// another writer that kept loco's metadata (converted to bf16, say), and its data checksum is of
// other bytes than these.
std::string layout_hash(std::vector<Entry> entries) {
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) { return a.name < b.name; });
  std::string text;
  for (const auto& e : entries) text += fmt::format("{} {} [{}] {} {}\n", e.name, e.dtype, fmt::join(e.shape, ","), e.begin, e.end);
  return hex64(hash64(text));
}

// The 8-byte length and the JSON header (padded to 8 bytes) for `entries`, with `metadata` and a
// loco.xxh3 of `checksum`.
std::string encode_header(const std::vector<Entry>& entries, std::map<std::string, std::string> metadata,
                          const std::string& checksum) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  std::set<std::string> names;
  for (const auto& e : entries) {
    LOCO_CHECK(names.insert(e.name).second, "duplicate tensor name '{}'", e.name);
    LOCO_CHECK(e.name != "__metadata__", "reserved tensor name");
    header[e.name] = {{"dtype", e.dtype}, {"shape", e.shape}, {"data_offsets", {e.begin, e.end}}};
  }
  metadata["loco.layout"] = layout_hash(entries);
  metadata["loco.xxh3"] = checksum;
  header["__metadata__"] = metadata;
  std::string json = header.dump();
  json.append((8 - json.size() % 8) % 8, ' ');  // align the data section to 8 bytes
  std::string out(8, '\0');
  const uint64_t n = json.size();
  for (int i = 0; i < 8; ++i) out[static_cast<size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + json;
}

// Entries for tensors of these dtypes and shapes, laid out one after another.
std::vector<Entry> lay_out(const std::vector<std::tuple<std::string, torch::ScalarType, std::vector<int64_t>>>& tensors) {
  std::vector<Entry> entries;
  uint64_t offset = 0;
  for (const auto& [name, dtype, shape] : tensors) {
    uint64_t bytes = c10::elementSize(dtype);
    for (const int64_t d : shape) bytes *= static_cast<uint64_t>(d);
    entries.push_back({name, dtype_name(dtype), shape, offset, offset + bytes});
    offset += bytes;
  }
  return entries;
}

}  // namespace

std::string encode_safetensors(const NamedTensors& tensors, std::map<std::string, std::string> metadata) {
  std::vector<torch::Tensor> contiguous;
  std::vector<std::tuple<std::string, torch::ScalarType, std::vector<int64_t>>> described;
  for (const auto& [name, tensor] : tensors) {
    contiguous.push_back(tensor.detach().to(torch::kCPU).contiguous());
    described.emplace_back(name, contiguous.back().scalar_type(), contiguous.back().sizes().vec());
  }
  const auto entries = lay_out(described);
  std::string data;
  data.reserve(entries.empty() ? 0 : entries.back().end);
  for (const auto& t : contiguous) data.append(static_cast<const char*>(t.data_ptr()), t.numel() * t.element_size());
  return encode_header(entries, std::move(metadata), hex64(hash64(data))) + data;
}

void save_safetensors(const std::filesystem::path& path, const NamedTensors& tensors, std::map<std::string, std::string> metadata) {
  write_file_atomic(path, encode_safetensors(tensors, std::move(metadata)), "checkpoint", Readers::kOwner);
}

uint64_t save_safetensors_streamed(const std::filesystem::path& path, const std::vector<TensorSource>& tensors,
                                   std::map<std::string, std::string> metadata, Readers readers) {
  std::vector<std::tuple<std::string, torch::ScalarType, std::vector<int64_t>>> described;
  for (const auto& t : tensors) described.emplace_back(t.name, t.dtype, t.shape);
  const auto entries = lay_out(described);
  // The checksum is known once every tensor is written: the header holds a placeholder of its
  // width until then.
  const std::string placeholder(16, '0');
  const std::string header = encode_header(entries, std::move(metadata), placeholder);
  const auto at = header.rfind(fmt::format("\"loco.xxh3\":\"{}\"", placeholder));
  LOCO_CHECK(at != std::string::npos, "no checksum placeholder in a safetensors header");
  AtomicFile file(path, "checkpoint", readers);
  file.write(header);
  Hasher hasher;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto tensor = tensors[i].make().detach().to(torch::kCPU).contiguous();
    LOCO_CHECK(tensor.scalar_type() == tensors[i].dtype && tensor.sizes().vec() == tensors[i].shape,
               "tensor '{}' is not the {} [{}] its header says", tensors[i].name, dtype_name(tensors[i].dtype),
               fmt::join(tensors[i].shape, ", "));
    const std::string_view bytes(static_cast<const char*>(tensor.data_ptr()), entries[i].end - entries[i].begin);
    hasher.update(bytes.data(), bytes.size());
    file.write(bytes);
  }
  file.overwrite(at + std::string("\"loco.xxh3\":\"").size(), hex64(hasher.digest()));
  file.commit();
  return file.size();
}

namespace {

// Whether a file's metadata has a loco.layout its tensor entries do not hash to: rewritten by
// another writer that kept loco's metadata, so that loco.xxh3 is of other bytes.
bool rewritten(const std::map<std::string, std::string>& metadata,
               const std::vector<std::tuple<uint64_t, uint64_t, std::string, torch::ScalarType, std::vector<int64_t>>>& found) {
  const auto layout = metadata.find("loco.layout");
  if (layout == metadata.end()) return false;
  std::vector<Entry> entries;
  for (const auto& [begin, end, name, dtype, shape] : found) entries.push_back({name, dtype_name(dtype), shape, begin, end});
  return layout_hash(entries) != layout->second;
}

}  // namespace

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
  if (auto it = file.metadata.find("loco.xxh3"); it != file.metadata.end() && !rewritten(file.metadata, entries)) {
    const uint64_t expected = parse_hex64(it->second, "checkpoint", where + ": loco.xxh3");
    if (hash64(data.data(), data.size()) != expected) throw fail("checksum mismatch: the tensor data is corrupted");
    file.verified = true;
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
  require_verified(file, path.string());
  return file;
}

void require_verified(const SafetensorsFile& file, const std::string& where) {
  if (!file.metadata.contains("loco.xxh3")) {
    throw DataError("checkpoint", fmt::format("{}: no loco.xxh3 checksum in its metadata; every file loco saves has one, "
                                              "so this one was not written by a loco run", where));
  }
  if (!file.verified) {
    throw DataError("checkpoint", fmt::format("{}: its tensor entries do not match its loco.layout: rewritten by another "
                                              "writer or damaged, so its checksum cannot be checked", where));
  }
}

}  // namespace loco::runtime
