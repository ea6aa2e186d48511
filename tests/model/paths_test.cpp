// DiPaCo's plan of levels, modules and paths: which modules each path holds, which paths share a
// module, that a path's modules hold every parameter of a Transformer exactly once, and clear
// errors for levels that do not fit the model.
#include <gtest/gtest.h>

#include <map>
#include <set>

#include "loco/core/error.h"
#include "loco/model/paths.h"
#include "loco/model/transformer.h"
#include "test_util.h"

namespace loco::model {
namespace {

using testing_util::expect_error;

ModelOptions small(int64_t layers) {
  ModelOptions o;
  o.vocab_size = 64;
  o.context = 16;
  o.layers = layers;
  o.width = 32;
  o.heads = 4;
  return o;
}

PathOptions levels(const std::string& text, bool embed_path_specific = false) {
  PathOptions options;
  options.levels = PathOptions::parse_levels(text);
  options.embed_path_specific = embed_path_specific;
  return options;
}

std::vector<std::string> names_of(const PathPlan& plan, int64_t path) {
  std::vector<std::string> names;
  for (int64_t m : plan.modules_of(path)) names.push_back(plan.module(m).name);
  return names;
}

TEST(PathsTest, LevelsParseAndFormatBack) {
  const auto parsed = PathOptions::parse_levels(" 5:16, 5:16 ,2:path");
  ASSERT_EQ(parsed.size(), 3u);
  EXPECT_EQ(parsed[0], (LevelSpec{5, 16, false}));
  EXPECT_TRUE(parsed[2].path_specific);
  EXPECT_EQ(parsed[2].blocks, 2);
  EXPECT_EQ(PathOptions::format_levels(parsed), "5:16,5:16,2:path");
  EXPECT_TRUE(PathOptions::parse_levels("").empty());
  expect_error<ConfigError>([] { PathOptions::parse_levels("2x2"); }, "is not BLOCKS:MODULES");
  expect_error<ConfigError>([] { PathOptions::parse_levels("2:2,"); }, "is not BLOCKS:MODULES");
  expect_error<ConfigError>([] { PathOptions::parse_levels("0:2"); }, "BLOCKS must be a positive integer, got \"0\"");
  expect_error<ConfigError>([] { PathOptions::parse_levels("2:two"); }, "MODULES must be a positive integer, got \"two\"");
  expect_error<ConfigError>([] { PathOptions::parse_levels("2:-1"); }, "MODULES must be a positive integer");
}

// 2 levels x 2 modules on 4 blocks: path p chooses module p / 2 at level 1 and p % 2 at level 2.
TEST(PathsTest, TwoByTwoPathsChooseOneModulePerLevel) {
  const PathPlan plan(small(4), levels("2:2,2:2"));
  EXPECT_EQ(plan.paths(), 4);
  ASSERT_EQ(plan.modules().size(), 5u);
  EXPECT_EQ(names_of(plan, 0), (std::vector<std::string>{"embed", "L1.M0", "L2.M0"}));
  EXPECT_EQ(names_of(plan, 1), (std::vector<std::string>{"embed", "L1.M0", "L2.M1"}));
  EXPECT_EQ(names_of(plan, 2), (std::vector<std::string>{"embed", "L1.M1", "L2.M0"}));
  EXPECT_EQ(names_of(plan, 3), (std::vector<std::string>{"embed", "L1.M1", "L2.M1"}));
  EXPECT_EQ(plan.module(plan.find("embed")).paths, (std::vector<int64_t>{0, 1, 2, 3}));
  EXPECT_EQ(plan.module(plan.find("L1.M1")).paths, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(plan.module(plan.find("L2.M0")).paths, (std::vector<int64_t>{0, 2}));
  EXPECT_EQ(plan.module(plan.find("L1.M0")).groups, (std::vector<std::string>{"block.0", "block.1"}));
  EXPECT_EQ(plan.module(plan.find("L2.M1")).groups, (std::vector<std::string>{"block.2", "block.3"}));
  expect_error<DataError>([&] { plan.find("L3.M0"); }, "no module named 'L3.M0'");
}

// Every path's modules hold each parameter group of a real Transformer exactly once, and the
// counts from the closed form match the tensors.
TEST(PathsTest, APathsModulesHoldEveryParameterOnce) {
  for (const auto& [text, embed_path] : std::vector<std::pair<std::string, bool>>{
           {"2:2,2:2", false}, {"1:2,2:1,1:path", true}, {"4:3", false}, {"1:2,1:2,1:2,1:path", false}}) {
    const auto model = small(4);
    const PathPlan plan(model, levels(text, embed_path));
    Transformer transformer(model, 1);
    std::map<std::string, int64_t> group_numel;
    for (const auto& group : transformer->parameter_groups()) {
      for (const auto& p : group.parameters) group_numel[group.name] += p.numel();
    }
    for (int64_t path = 0; path < plan.paths(); ++path) {
      std::multiset<std::string> held;
      int64_t parameters = 0;
      for (int64_t m : plan.modules_of(path)) {
        const auto& module = plan.module(m);
        int64_t numel = 0;
        for (const auto& g : module.groups) held.insert(g), numel += group_numel.at(g);
        EXPECT_EQ(module.parameters, numel) << text << " " << module.name;
        EXPECT_TRUE(std::count(module.paths.begin(), module.paths.end(), path)) << text << " " << module.name;
        parameters += module.parameters;
      }
      EXPECT_EQ(held.size(), group_numel.size()) << text << " path " << path;
      for (const auto& [name, numel] : group_numel) EXPECT_EQ(held.count(name), 1u) << text << " " << name;
      EXPECT_EQ(parameters, plan.path_parameters()) << text;
    }
    EXPECT_EQ(plan.path_parameters(), parameter_count(model));
  }
}

TEST(PathsTest, PathSpecificModulesBelongToOnePathEach) {
  const PathPlan plan(small(4), levels("1:2,2:1,1:path", /*embed_path_specific=*/true));
  EXPECT_EQ(plan.paths(), 2);
  EXPECT_EQ(names_of(plan, 1), (std::vector<std::string>{"embed.P1", "L1.M1", "L2.M0", "L3.P1"}));
  EXPECT_EQ(plan.module(plan.find("L2.M0")).paths, (std::vector<int64_t>{0, 1}));  // K = 1: shared
  EXPECT_EQ(plan.module(plan.find("L3.P0")).paths, (std::vector<int64_t>{0}));
  EXPECT_EQ(plan.module(plan.find("embed.P0")).paths, (std::vector<int64_t>{0}));
  // A flat mixture: one level, every path its own blocks and embeddings: P whole models.
  const PathPlan flat(small(4), levels("4:4", true));
  EXPECT_EQ(flat.total_parameters(), 4 * flat.path_parameters());
}

// The paper's 16x16 on a 110M-parameter path, laid out as configs/dipaco-16x16.toml (blocks 0, 5, 6
// and 11 and the embeddings path-specific), plans without building anything, and its counts are the
// closed form's.
TEST(PathsTest, SixteenBySixteenPlansWithCounts) {
  ModelOptions base;
  base.vocab_size = 32000;
  base.context = 1024;
  base.layers = 12;
  base.width = 768;
  base.heads = 12;
  const PathPlan plan(base, levels("1:path,4:16,2:path,4:16,1:path", true));
  EXPECT_EQ(plan.paths(), 256);
  EXPECT_EQ(plan.modules().size(), 256u + 256 + 16 + 256 + 16 + 256);
  ModelOptions one = base;
  one.layers = 1;
  const int64_t outside = parameter_count(base) - 12 * (parameter_count(base) - parameter_count(one)) / 11;
  const int64_t block = (parameter_count(base) - outside) / 12;
  EXPECT_EQ(plan.path_parameters(), parameter_count(base));
  EXPECT_EQ(plan.total_parameters(), 256 * outside + 256 * 4 * block + 16 * 4 * block + 16 * 4 * block);
  EXPECT_EQ(plan.module(plan.find("L2.M3")).paths.size(), 16u);
  EXPECT_EQ(plan.module(plan.find("L3.P7")).paths, (std::vector<int64_t>{7}));
  const std::string text = plan.describe();
  EXPECT_NE(text.find("256 paths, 1056 modules"), std::string::npos) << text;
  EXPECT_NE(text.find("| 3 | blocks 5-6 | path-specific | 256 |"), std::string::npos) << text;
}

TEST(PathsTest, LevelsThatDoNotFitTheModelAreRefused) {
  expect_error<ConfigError>([] { PathPlan(small(4), levels("2:2,1:2")); }, "spans 3 blocks but the model has 4");
  expect_error<ConfigError>([] { PathPlan(small(4), levels("2:2,3:2")); }, "spans more blocks than the model's 4");
  expect_error<ConfigError>([] { PathPlan(small(4), levels("9223372036854775807:2,9223372036854775807:2")); },
                            "spans more blocks than the model's 4");
  expect_error<ConfigError>([] { PathPlan(small(4), levels("2:1,2:path")); }, "makes a single path");
  expect_error<ConfigError>([] { PathPlan(small(4), levels("1:256,1:256,2:2")); }, "makes more than 65536 paths");
}

}  // namespace
}  // namespace loco::model
