// loco export --hf --dtype bf16 at a real model's size: a Llama-layout model of 1.07 billion
// parameters (random weights, no training) written as bf16 shards with their index, tensor by
// tensor, and read back bit-exact. Its own binary, run alone (it holds about 8 GB at its peak).
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "loco/core/files.h"
#include "loco/core/hash.h"
#include "loco/model/transformer.h"
#include "loco/runtime/worker/hugging_face.h"
#include "test_util.h"

namespace loco {
namespace {

namespace fs = std::filesystem;

// A field of /proc/self/status, in bytes (VmRSS: resident now; VmHWM: the most resident since the
// last reset).
int64_t status_bytes(const std::string& field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field + ":", 0) == 0) return std::stoll(line.substr(field.size() + 1)) * 1024;
  }
  ADD_FAILURE() << "no " << field << " in /proc/self/status";
  return 0;
}

// The bf16 bytes of a tensor, hashed: what the round trip must keep exactly.
uint64_t bf16_hash(const torch::Tensor& t) {
  const auto half = t.to(torch::kBFloat16).contiguous();
  return hash64(half.data_ptr(), half.nbytes());
}

TEST(HuggingFaceAtScale, ABillionParametersExportAsBf16ShardsWithinOneTensorOfMemoryAndReadBackExactly) {
  model::ModelOptions o;
  o.vocab_size = 32000;
  o.context = 64;
  o.layers = 20;
  o.width = 2048;
  o.heads = 16;
  o.kv_heads = 8;
  o.norm = model::NormKind::kRMSNorm;
  o.position = model::PositionKind::kRope;
  o.mlp = model::MlpKind::kSwiGlu;
  o.mlp_hidden_size = 5632;
  o.tie_embeddings = false;
  ASSERT_GE(model::parameter_count(o), 1'000'000'000);
  testing_util::TempDir dir;
  const auto out = dir.path() / "hf";
  const uint64_t shard_bytes = 1'000'000'000;
  std::map<std::string, uint64_t> expected;
  int64_t largest = 0;
  {
    torch::NoGradGuard no_grad;
    model::Transformer model(o, 1);
    for (const auto& item : model->named_parameters()) {
      expected.emplace(item.key(), bf16_hash(item.value()));
      largest = std::max<int64_t>(largest, item.value().numel() * 2);
    }
    // The most resident memory while exporting, against what the model alone holds.
    const int64_t before = status_bytes("VmRSS");
    {
      std::ofstream reset("/proc/self/clear_refs");
      reset << "5";  // resets VmHWM to the current resident size
    }
    ASSERT_LE(status_bytes("VmHWM"), before + (16 << 20)) << "the peak was reset";
    runtime::save_hugging_face_folder(model, out, {}, {torch::kBFloat16, shard_bytes});
    const int64_t beyond = status_bytes("VmHWM") - before;
    std::cout << "[ export  ] " << model::parameter_count(o) << " parameters, model " << before / (1 << 20) << " MiB resident, "
              << beyond / (1 << 20) << " MiB more at the peak of the export; the largest tensor in bf16 "
              << largest / (1 << 20) << " MiB\n";
    EXPECT_LE(beyond, 2 * largest + (64 << 20)) << "beyond the model, one tensor at a time (and its copy)";
  }
  const auto index = nlohmann::json::parse(read_file(out / "model.safetensors.index.json", "test"));
  std::set<std::string> shards;
  for (const auto& [name, file] : index.at("weight_map").items()) shards.insert(file.get<std::string>());
  EXPECT_EQ(shards.size(), 3u) << "2.3 GB of bf16 parameters in shards of 1 GB";
  for (const auto& file : shards) EXPECT_LE(fs::file_size(out / file), shard_bytes + (1 << 20)) << file;

  const auto read = runtime::read_hugging_face_config(out, o);
  size_t checked = 0;
  for (const auto& [name, value] : runtime::load_hugging_face_parameters(out, read)) {
    ASSERT_EQ(expected.count(name), 1u) << name;
    EXPECT_EQ(bf16_hash(value), expected.at(name)) << name;
    ++checked;
  }
  EXPECT_EQ(checked, expected.size());
}

}  // namespace
}  // namespace loco
