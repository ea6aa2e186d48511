// DiPaCo's module files: a module saved from one path model loads, bit for bit, into another path
// through it; a file from another plan, module or version, a missing or corrupt file and an unsafe
// name are refused by name, and an older version is never touched by a newer save.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "loco/core/error.h"
#include "loco/core/files.h"
#include "loco/model/paths.h"
#include "loco/model/transformer.h"
#include "loco/runtime/store/modules.h"
#include "test_util.h"

namespace loco::runtime {
namespace {

constexpr uint64_t kAnySize = uint64_t{1} << 32;  // module files' size bound (DipacoRun::max_file_bytes)

using testing_util::expect_error;
using testing_util::TempDir;

model::ModelOptions small() {
  model::ModelOptions o;
  o.vocab_size = 64;
  o.context = 16;
  o.layers = 2;
  o.width = 32;
  o.heads = 4;
  return o;
}

model::PathPlan two_by_two() {
  model::PathOptions levels;
  levels.levels = model::PathOptions::parse_levels("1:2,1:2");
  return model::PathPlan(small(), levels);
}

ModuleVersion version_of(const model::PathPlan& plan, const model::Transformer& path_model, const std::string& name,
                         int64_t version) {
  ModuleVersion out{name, version, plan.fingerprint(), {}, {}};
  const auto group = model::module_parameters(path_model, plan.module(plan.find(name)));
  for (size_t i = 0; i < group.names.size(); ++i) out.parameters.emplace_back(group.names[i], group.parameters[i].detach().clone());
  out.outer_state.emplace_back("steps", torch::tensor(version, torch::kInt64));
  return out;
}

TEST(ModulesTest, AModuleSavedFromOnePathLoadsIntoAnotherPathThroughIt) {
  TempDir dir;
  const auto plan = two_by_two();
  model::Transformer path0(small(), 1), path1(small(), 2);  // paths 0 and 1 share "embed" and "L1.M0"
  for (const auto& name : {"embed", "L1.M0"}) save_module(dir.path(), version_of(plan, path0, name, 3));
  torch::NoGradGuard no_grad;
  for (const auto& name : {"embed", "L1.M0"}) {
    const auto loaded = load_module(dir.path(), name, 3, plan.fingerprint(), kAnySize);
    const auto target = model::module_parameters(path1, plan.module(plan.find(name)));
    ASSERT_EQ(loaded.parameters.size(), target.names.size()) << name;
    for (size_t i = 0; i < target.names.size(); ++i) {
      EXPECT_EQ(loaded.parameters[i].first, target.names[i]);
      target.parameters[i].copy_(loaded.parameters[i].second);
    }
    EXPECT_EQ(loaded.outer_state.at(0).second.item<int64_t>(), 3);
  }
  // Path 1 now holds path 0's embed and level-1 module, bit for bit, and keeps its own level 2.
  const auto a = path0->named_parameters(), b = path1->named_parameters();
  EXPECT_TRUE(torch::equal(a["tok_emb.weight"], b["tok_emb.weight"]));
  EXPECT_TRUE(torch::equal(a["blocks.0.attn.qkv.weight"], b["blocks.0.attn.qkv.weight"]));
  EXPECT_FALSE(torch::equal(a["blocks.1.attn.qkv.weight"], b["blocks.1.attn.qkv.weight"]));
  EXPECT_EQ(module_file(dir.path(), "L1.M0", 3), dir.path() / "modules" / "L1.M0" / "v3.safetensors");
}

// The outer state is a file of its own: a path task reads the parameters alone (fewer bytes
// through the shared store), the module's step reads both; a missing outer file is named; a
// version written by an older loco, both in one file, still loads.
TEST(ModulesTest, TheOuterStateIsAFileOfItsOwnThatPathsNeverRead) {
  TempDir dir;
  const auto plan = two_by_two();
  model::Transformer path0(small(), 1);
  save_module(dir.path(), version_of(plan, path0, "L1.M0", 2));
  const auto outer = module_outer_file(dir.path(), "L1.M0", 2);
  EXPECT_EQ(outer, dir.path() / "modules" / "L1.M0" / "v2.outer.safetensors");
  ASSERT_TRUE(std::filesystem::exists(outer));
  const auto both = load_module(dir.path(), "L1.M0", 2, plan.fingerprint(), kAnySize);
  EXPECT_EQ(both.outer_state.at(0).second.item<int64_t>(), 2);
  std::filesystem::remove(outer);
  const auto parameters = load_module(dir.path(), "L1.M0", 2, plan.fingerprint(), kAnySize, /*with_outer_state=*/false);
  EXPECT_TRUE(parameters.outer_state.empty());
  ASSERT_EQ(parameters.parameters.size(), both.parameters.size());
  for (size_t i = 0; i < both.parameters.size(); ++i) EXPECT_TRUE(torch::equal(parameters.parameters[i].second, both.parameters[i].second));
  expect_error<DataError>([&] { load_module(dir.path(), "L1.M0", 2, plan.fingerprint(), kAnySize); }, "v2.outer.safetensors: module L1.M0 version 2 was never saved");
  // An older run's file: parameters and outer state together.
  NamedTensors together;
  for (const auto& [name, tensor] : both.parameters) together.emplace_back("param." + name, tensor);
  together.emplace_back("outer.steps", torch::tensor(int64_t{2}));
  save_safetensors(module_file(dir.path(), "L1.M0", 2), together,
                   {{"loco.module", "L1.M0"}, {"loco.module_version", "2"}, {"loco.plan", plan.fingerprint()}});
  EXPECT_EQ(load_module(dir.path(), "L1.M0", 2, plan.fingerprint(), kAnySize).outer_state.at(0).second.item<int64_t>(), 2);
}

TEST(ModulesTest, FilesThatDoNotMatchAreRefusedByName) {
  TempDir dir;
  const auto plan = two_by_two();
  model::Transformer path0(small(), 1);
  save_module(dir.path(), version_of(plan, path0, "L2.M1", 1));
  save_module(dir.path(), version_of(plan, path0, "L2.M1", 2));
  const auto v1 = read_file(module_file(dir.path(), "L2.M1", 1), "test");

  model::PathOptions other;
  other.levels = model::PathOptions::parse_levels("1:3,1:2");
  const model::PathPlan another(small(), other);
  expect_error<DataError>([&] { load_module(dir.path(), "L2.M1", 1, another.fingerprint(), kAnySize); }, "module of another plan or model");
  expect_error<DataError>([&] { load_module(dir.path(), "L2.M1", 7, plan.fingerprint(), kAnySize); }, "was never saved");
  // A file copied over another version's name says what it holds.
  std::filesystem::copy_file(module_file(dir.path(), "L2.M1", 1), module_file(dir.path(), "L2.M1", 5));
  expect_error<DataError>([&] { load_module(dir.path(), "L2.M1", 5, plan.fingerprint(), kAnySize); }, "holds module L2.M1 version 1, not L2.M1 version 5");
  expect_error<DataError>([&] { module_file(dir.path(), "../L2.M1", 1); }, "not a safe file name");
  expect_error<DataError>([&] { module_file(dir.path(), "L2.M1", -1); }, "negative");
  // A flipped byte in the data fails the checksum; the other version is intact.
  auto corrupt = read_file(module_file(dir.path(), "L2.M1", 2), "test");
  corrupt[corrupt.size() - 3] ^= 0x40;
  std::ofstream(module_file(dir.path(), "L2.M1", 2), std::ios::binary) << corrupt;
  EXPECT_THROW(load_module(dir.path(), "L2.M1", 2, plan.fingerprint(), kAnySize), DataError);
  EXPECT_EQ(read_file(module_file(dir.path(), "L2.M1", 1), "test"), v1);
  EXPECT_NO_THROW(load_module(dir.path(), "L2.M1", 1, plan.fingerprint(), kAnySize));
  // The same module with its checksum taken out of the header: a file no loco run wrote (module
  // files come from other hosts through a shared folder) is refused.
  uint64_t header_size = 0;
  std::memcpy(&header_size, v1.data(), 8);
  auto header = nlohmann::json::parse(v1.substr(8, header_size));
  ASSERT_EQ(header["__metadata__"].erase("loco.xxh3"), 1u);
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  const uint64_t new_size = text.size();
  std::string stripped(reinterpret_cast<const char*>(&new_size), 8);
  stripped += text + v1.substr(8 + header_size);
  TempDir other_dir;
  std::filesystem::create_directories(module_file(other_dir.path(), "L2.M1", 1).parent_path());
  std::ofstream(module_file(other_dir.path(), "L2.M1", 1), std::ios::binary) << stripped;
  expect_error<DataError>([&] { load_module(other_dir.path(), "L2.M1", 1, plan.fingerprint(), kAnySize); }, "no loco.xxh3 checksum");

  // A version's file replaced by a link (here to a genuine copy outside the run) is not followed,
  // and one larger than the bound is refused unread (issue #49).
  TempDir outside;
  std::filesystem::copy_file(module_file(dir.path(), "L2.M1", 1), outside.path() / "v1");
  std::filesystem::remove(module_file(dir.path(), "L2.M1", 1));
  std::filesystem::create_symlink(outside.path() / "v1", module_file(dir.path(), "L2.M1", 1));
  expect_error<DataError>([&] { load_module(dir.path(), "L2.M1", 1, plan.fingerprint(), kAnySize); },
                          "links inside the run folder are not followed");
  std::filesystem::remove(module_file(dir.path(), "L2.M1", 1));
  std::filesystem::copy_file(outside.path() / "v1", module_file(dir.path(), "L2.M1", 1));
  EXPECT_NO_THROW(load_module(dir.path(), "L2.M1", 1, plan.fingerprint(), kAnySize));
  expect_error<DataError>([&] { load_module(dir.path(), "L2.M1", 1, plan.fingerprint(), 1000); }, "more than the 1000");
}

}  // namespace
}  // namespace loco::runtime
