#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "loco/core/error.h"
#include "loco/core/files.h"
#include "loco/runtime/store/safetensors.h"
#include "test_util.h"

namespace loco::runtime {
namespace {

namespace fs = std::filesystem;
using testing_util::expect_error;

NamedTensors sample() {
  return {{"a.weight", torch::arange(12, torch::kFloat32).view({3, 4})},
          {"b", torch::tensor({1.5, -2.25}, torch::kFloat64)},
          {"c.ids", torch::tensor({7L, 8L, 9L})},
          {"d.half", torch::ones({2}, torch::kBFloat16)},
          {"empty", torch::zeros({0, 3})}};
}

TEST(Safetensors, RoundTripPreservesNamesDtypesShapesAndValues) {
  auto bytes = encode_safetensors(sample(), {{"format", "pt"}});
  auto file = decode_safetensors(bytes, "mem");
  ASSERT_EQ(file.tensors.size(), 5u);
  std::map<std::string, torch::Tensor> by_name(file.tensors.begin(), file.tensors.end());
  for (const auto& [name, t] : sample()) {
    ASSERT_TRUE(by_name.count(name)) << name;
    EXPECT_EQ(by_name[name].scalar_type(), t.scalar_type()) << name;
    EXPECT_TRUE(torch::equal(by_name[name], t)) << name;
  }
  EXPECT_EQ(file.metadata.at("format"), "pt");
  EXPECT_EQ(file.metadata.count("loco.xxh3"), 1u);
}

TEST(Safetensors, LayoutFollowsTheSpec) {
  auto bytes = encode_safetensors({{"x", torch::tensor({1.0f, 2.0f})}});
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = n << 8 | static_cast<unsigned char>(bytes[static_cast<size_t>(i)]);
  EXPECT_EQ(n % 8, 0u) << "data must start 8-byte aligned";
  EXPECT_EQ(bytes.size(), 8 + n + 8);
  const std::string header = bytes.substr(8, n);
  EXPECT_NE(header.find(R"("x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})"), std::string::npos) << header;
  float values[2];
  std::memcpy(values, bytes.data() + 8 + n, 8);
  EXPECT_EQ(values[0], 1.0f);
  EXPECT_EQ(values[1], 2.0f);
}

TEST(Safetensors, CorruptionIsDetected) {
  const auto good = encode_safetensors(sample());
  expect_error<DataError>([&] { decode_safetensors(good.substr(0, good.size() - 3), "f"); }, "f:");
  expect_error<DataError>([&] { decode_safetensors(good.substr(0, 5), "f"); }, "truncated");
  auto flipped = good;
  flipped[flipped.size() - 1] ^= 0x40;
  expect_error<DataError>([&] { decode_safetensors(flipped, "f"); }, "checksum mismatch");
  auto huge = good;
  for (int i = 0; i < 8; ++i) huge[static_cast<size_t>(i)] = static_cast<char>(0xff);
  expect_error<DataError>([&] { decode_safetensors(huge, "f"); }, "header length");
  auto not_json = good;
  not_json[8] = '!';
  expect_error<DataError>([&] { decode_safetensors(not_json, "f"); }, "not valid JSON");
}

// A file written one tensor at a time is byte for byte the one encode_safetensors makes.
TEST(Safetensors, AStreamedFileIsTheEncodedOne) {
  testing_util::TempDir dir;
  std::vector<TensorSource> sources;
  for (const auto& [name, t] : sample()) sources.push_back({name, t.scalar_type(), t.sizes().vec(), [t = t] { return t; }});
  const auto size = save_safetensors_streamed(dir.path() / "s.safetensors", sources, {{"format", "pt"}});
  const auto bytes = read_file(dir.path() / "s.safetensors", "test");
  EXPECT_EQ(bytes, encode_safetensors(sample(), {{"format", "pt"}}));
  EXPECT_EQ(size, bytes.size());
  // A tensor that is not what its header says is a bug, and leaves no file behind.
  sources[0].make = [] { return torch::zeros({3, 4}, torch::kFloat64); };
  EXPECT_THROW(save_safetensors_streamed(dir.path() / "t.safetensors", sources), InternalError);
  EXPECT_EQ(std::distance(fs::directory_iterator(dir.path()), fs::directory_iterator()), 1);
}

// A file that another writer rewrote with its tensors in bf16, keeping loco's metadata (as
// Python's safetensors does), is read: its loco.xxh3 is of the float32 bytes, and its entries no
// longer hash to its loco.layout. A file whose entries are loco's still has its data checked.
TEST(Safetensors, AFileRewrittenInAnotherDtypeKeepingLocosMetadataIsRead) {
  const NamedTensors original = {{"w", torch::randn({4, 3})}, {"b", torch::randn({3})}};
  const auto metadata = decode_safetensors(encode_safetensors(original), "original").metadata;
  ASSERT_EQ(metadata.count("loco.layout"), 1u);
  // What another writer makes: the same names in bf16, the metadata as it was.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  std::string data;
  for (const auto& [name, t] : original) {
    const auto half = t.to(torch::kBFloat16).contiguous();
    header[name] = {{"dtype", "BF16"}, {"shape", half.sizes().vec()}, {"data_offsets", {data.size(), data.size() + half.nbytes()}}};
    data.append(static_cast<const char*>(half.data_ptr()), half.nbytes());
  }
  header["__metadata__"] = metadata;
  const std::string json = header.dump();
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[static_cast<size_t>(i)] = static_cast<char>((json.size() >> (8 * i)) & 0xff);
  bytes += json + data;
  const auto read = decode_safetensors(bytes, "rewritten");
  EXPECT_FALSE(read.verified);
  // Where a file must be loco's own (a checkpoint, a DiPaCo module), such a file is refused.
  expect_error<DataError>([&] { require_verified(read, "rewritten"); }, "do not match its loco.layout");
  EXPECT_TRUE(decode_safetensors(encode_safetensors(original), "original").verified);
  ASSERT_EQ(read.tensors.size(), 2u);
  EXPECT_TRUE(torch::equal(read.tensors[0].second, original[0].second.to(torch::kBFloat16)));
  auto flipped = encode_safetensors(original);
  flipped[flipped.size() - 1] ^= 0x40;
  expect_error<DataError>([&] { decode_safetensors(flipped, "f"); }, "checksum mismatch");
}

TEST(Safetensors, HostileHeadersAreRejected) {
  auto make = [](const std::string& header, size_t data_bytes) {
    std::string out(8, '\0');
    for (int i = 0; i < 8; ++i) out[static_cast<size_t>(i)] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
    return out + header + std::string(data_bytes, '\0');
  };
  expect_error<DataError>([&] { decode_safetensors(make(R"({"x":{"dtype":"F32","shape":[4],"data_offsets":[0,8]}})", 8), "f"); }, "shape needs 16");
  expect_error<DataError>([&] { decode_safetensors(make(R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,800]}})", 8), "f"); }, "outside");
  expect_error<DataError>([&] { decode_safetensors(make(R"({"x":{"dtype":"Q7","shape":[2],"data_offsets":[0,8]}})", 8), "f"); }, "unsupported dtype");
  expect_error<DataError>([&] { decode_safetensors(make(R"({"x":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8), "f"); }, "negative");
  expect_error<DataError>([&] { decode_safetensors(make(R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"y":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12), "f"); }, "overlaps");
  expect_error<DataError>([&] { decode_safetensors(make(R"({"x":{"dtype":"F32"}})", 0), "f"); }, "malformed");
  expect_error<DataError>([&] { decode_safetensors(make(R"([1,2])", 0), "f"); }, "not a JSON object");
}

// fuzz/safetensors_fuzzer found dimensions given as floats going through an unchecked
// float-to-integer cast (undefined behaviour); reviewing the same lines, a shape whose byte count
// wraps around 2^64 matched an empty byte range, and torch::empty was asked for 2^62 x 4 floats.
TEST(Safetensors, ShapesThatOverflowOrAreNotIntegersAreRejected) {
  auto make = [](const std::string& header, size_t data_bytes) {
    std::string out(8, '\0');
    for (int i = 0; i < 8; ++i) out[static_cast<size_t>(i)] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
    return out + header + std::string(data_bytes, '\0');
  };
  expect_error<DataError>([&] { decode_safetensors(make(R"({"x":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,0]}})", 0), "f"); },
                          "more bytes than a file can hold");
  expect_error<DataError>([&] { decode_safetensors(make(R"({"x":{"dtype":"U8","shape":[9223372036854775808],"data_offsets":[0,0]}})", 0), "f"); },
                          "more bytes than a file can hold");
  expect_error<DataError>([&] { decode_safetensors(make(R"({"x":{"dtype":"F32","shape":[1e300],"data_offsets":[0,4]}})", 4), "f"); },
                          "shape that is not a list of non-negative integers");
  expect_error<DataError>([&] { decode_safetensors(make(R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4.0]}})", 4), "f"); },
                          "data_offsets that is not a list");
  // An empty tensor of a large shape is still fine.
  const auto empty = decode_safetensors(make(R"({"x":{"dtype":"F32","shape":[0,4611686018427387904],"data_offsets":[0,0]}})", 0), "f");
  ASSERT_EQ(empty.tensors.size(), 1u);
  EXPECT_EQ(empty.tensors[0].second.numel(), 0);
}

TEST(Safetensors, DuplicateNamesAreABug) {
  EXPECT_THROW(encode_safetensors({{"x", torch::ones({1})}, {"x", torch::ones({1})}}), InternalError);
}

}  // namespace
}  // namespace loco::runtime
