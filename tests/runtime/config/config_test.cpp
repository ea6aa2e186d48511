#include <gtest/gtest.h>

#include <cstdlib>

#include "loco/core/error.h"
#include "loco/core/files.h"
#include "loco/runtime/config/config.h"
#include "loco/runtime/config/secrets.h"
#include "test_util.h"

namespace loco::runtime {
namespace {

using testing_util::expect_error;

TEST(Config, ParsesSectionsAndKeepsDefaults) {
  auto c = parse_config(R"(
[model]
layers = 6
width = 384
norm = "layernorm"
qk_norm = true
[optim]
lr = 1          # an integer is accepted for a float key
[train]
steps = 50
)", "test.toml");
  EXPECT_EQ(c.model.layers, 6);
  EXPECT_EQ(c.model.width, 384);
  EXPECT_EQ(c.model.norm, model::NormKind::kLayerNorm);
  EXPECT_TRUE(c.model.qk_norm);
  EXPECT_DOUBLE_EQ(c.optim.lr, 1.0);
  EXPECT_EQ(c.train.steps, 50);
  EXPECT_EQ(c.train.batch_size, RunConfig{}.train.batch_size);
  c.outer.optimizer = optim::OuterKind::kAdam;
  EXPECT_DOUBLE_EQ(outer_options(c).eps, 0.1) << "outer Adam is stable only with a large epsilon (DiLoCo paper)";
  EXPECT_DOUBLE_EQ(outer_options(c).lr, 0.1);
}

// Eager updates have outer defaults of their own (bench/eager.sh), and a config that steps harder
// than the sweep found stable is warned about, not refused.
TEST(Config, EagerUpdatesHaveTheirOwnOuterDefaultsAndAWarningBeyondThem) {
  auto c = parse_config("[sync]\nalgorithm = \"diloco\"\neager = true\n", "eager.toml");
  EXPECT_DOUBLE_EQ(outer_options(c).lr, kEagerOuterLr);
  EXPECT_DOUBLE_EQ(outer_options(c).momentum, kEagerOuterMomentum);
  EXPECT_TRUE(config_warnings(c).empty());
  c.sync.eager = false;  // synchronous DiLoCo keeps Nesterov's published 0.7 / 0.9, unwarned
  EXPECT_DOUBLE_EQ(outer_options(c).lr, 0.7);
  EXPECT_DOUBLE_EQ(outer_options(c).momentum, 0.9);
  EXPECT_TRUE(config_warnings(c).empty());
  c.sync.eager = true;  // eager with DiLoCo's Nesterov: a step of 7 (it oscillated at M = 4)
  c.outer.lr = 0.7;
  c.outer.momentum = 0.9;
  const auto warnings = config_warnings(c);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("sync.eager with outer lr 0.7 and momentum 0.9 takes steps of lr / (1 - momentum) = 7"),
            std::string::npos) << warnings[0];
  c.outer.optimizer = optim::OuterKind::kAdam;  // Adam's steps are not lr / (1 - momentum)
  EXPECT_TRUE(config_warnings(c).empty());
}

TEST(Config, UnknownKeyIsNamedWithSuggestionAndLine) {
  expect_error<ConfigError>([] { parse_config("[train]\nstesp = 3\n", "f.toml"); }, "unknown key 'train.stesp' (f.toml:2); did you mean 'train.steps'?");
  expect_error<ConfigError>([] { parse_config("[nonsense]\nx = 3\n", "f.toml"); }, "unknown key 'nonsense.x'");
}

TEST(Config, WrongTypeIsNamed) {
  expect_error<ConfigError>([] { parse_config("[train]\nsteps = \"ten\"\n", "f.toml"); }, "train.steps (f.toml:2): expected an integer, got a TOML string");
  expect_error<ConfigError>([] { parse_config("[train]\nsteps = 1.5\n", "f.toml"); }, "train.steps");
  expect_error<ConfigError>([] { parse_config("[model]\nqk_norm = 1\n", "f.toml"); }, "model.qk_norm");
  expect_error<ConfigError>([] { parse_config("[model]\nnorm = \"batchnorm\"\n", "f.toml"); }, "model.norm must be one of rmsnorm, layernorm");
}

TEST(Config, OutOfRangeIsNamed) {
  expect_error<ConfigError>([] { parse_config("[train]\nbatch_size = 0\n", "f.toml"); }, "train.batch_size must be >= 1, got 0");
  expect_error<ConfigError>([] { parse_config("[optim]\nlr = -1.0\n", "f.toml"); }, "optim.lr must be > 0");
  expect_error<ConfigError>([] { parse_config("[optim]\nmin_lr_ratio = 2.0\n", "f.toml"); }, "optim.min_lr_ratio must be in [0, 1]");
  expect_error<ConfigError>([] { parse_config("[model]\nwidth = 30\nheads = 4\n", "f.toml"); }, "model.heads (4) must divide model.width (30)");
  expect_error<ConfigError>([] { parse_config("[train]\ndevice = \"tpu\"\n", "f.toml"); }, "train.device");
}

TEST(Config, MalformedTomlNamesFileAndLine) {
  expect_error<ConfigError>([] { parse_config("[train\nsteps = 3\n", "bad.toml"); }, "bad.toml:1:");
}

TEST(Config, OverridesAreTypedAndValidated) {
  RunConfig c;
  apply_override(c, "train.steps=77");
  apply_override(c, "optim.lr=5e-4");
  apply_override(c, "model.qk_norm=true");
  apply_override(c, "model.mlp=swiglu");
  apply_override(c, "run.dir=/tmp/x");
  EXPECT_EQ(c.train.steps, 77);
  EXPECT_DOUBLE_EQ(c.optim.lr, 5e-4);
  EXPECT_TRUE(c.model.qk_norm);
  EXPECT_EQ(c.model.mlp, model::MlpKind::kSwiGlu);
  EXPECT_EQ(c.run.dir, "/tmp/x");
  expect_error<ConfigError>([&] { apply_override(c, "train.steps=7x"); }, "train.steps expects an integer, got '7x'");
  expect_error<ConfigError>([&] { apply_override(c, "train.step=7"); }, "did you mean 'train.steps'");
  expect_error<ConfigError>([&] { apply_override(c, "train.steps"); }, "--section.key=value");
  apply_override(c, "train.steps=0");
  expect_error<ConfigError>([&] { validate(c); }, "train.steps must be >= 1");
}

// An out-of-range override of a key whose default is resolved late (the outer optimizer's) is
// refused, not silently replaced by the default (issue #48: --outer.lr=-0.5 trained with 0.7).
TEST(Config, OutOfRangeOverridesAreRefusedBeforeDefaultsAreFilledIn) {
  testing_util::TempDir tmp;
  write_file_atomic(tmp.path() / "run.toml", "[train]\nsteps = 10\n", "test");
  expect_error<ConfigError>([&] { load_config(tmp.path() / "run.toml", {"outer.lr=-0.5"}); }, "outer.lr must be >= 0, got -0.5");
  expect_error<ConfigError>([&] { load_config(tmp.path() / "run.toml", {"outer.momentum=-0.5"}); },
                            "outer.momentum must be in [0, 1), or -1 for the optimizer's default; got -0.5");
  const auto resolved = load_config(tmp.path() / "run.toml", {"outer.lr=0", "outer.momentum=-1"});
  EXPECT_DOUBLE_EQ(resolved.outer.lr, 0.7);  // the defaults' own markers still mean the defaults
  EXPECT_DOUBLE_EQ(resolved.outer.momentum, 0.9);
}

// Found by fuzz/config_fuzzer: an override of bytes that are not UTF-8 was taken, and the saved
// config.toml then read back as another config (its writer drops what TOML cannot hold).
TEST(Config, StringOverridesMustBeUtf8SoTheSavedConfigReadsBack) {
  RunConfig c;
  expect_error<ConfigError>([&] { apply_override(c, "data.dir=\xC2"); }, "data.dir expects UTF-8 text");
  apply_override(c, "data.dir=donn\xC3\xA9" "es");
  EXPECT_EQ(c.data.dir, "donn\xC3\xA9" "es");
  EXPECT_EQ(differences(c, parse_config(to_toml(c), "saved")), std::vector<std::string>{});
}

TEST(Config, ElasticRunsNameWhatTheyCannotDo) {
  RunConfig c;
  apply_override(c, "cluster.workers=4");
  apply_override(c, "cluster.elastic=true");
  for (const char* algorithm : {"diloco", "streaming"}) {
    apply_override(c, std::string("sync.algorithm=") + algorithm);
    EXPECT_NO_THROW(validate(c)) << algorithm;
  }
  apply_override(c, "sync.algorithm=ddp");
  expect_error<ConfigError>([&] { validate(c); }, "cluster.elastic = true needs sync.algorithm = \"diloco\" or \"streaming\"");

  // Streaming: one fragment on the wire at a time, and rounds end by steps.
  apply_override(c, "sync.algorithm=streaming");
  apply_override(c, "sync.inner_steps=8");
  apply_override(c, "sync.fragments=2");
  apply_override(c, "sync.overlap_steps=4");
  expect_error<ConfigError>([&] { validate(c); }, "sync.overlap_steps * sync.fragments < sync.inner_steps");
  apply_override(c, "sync.overlap_steps=3");
  EXPECT_NO_THROW(validate(c));
  apply_override(c, "sync.round_seconds=2");
  expect_error<ConfigError>([&] { validate(c); }, "is for sync.algorithm = \"diloco\"");

  apply_override(c, "sync.algorithm=diloco");
  apply_override(c, "sync.weighting=uniform");
  expect_error<ConfigError>([&] { validate(c); }, "needs sync.weighting = \"tokens\"");
  apply_override(c, "sync.weighting=tokens");
  EXPECT_NO_THROW(validate(c));
  apply_override(c, "cluster.elastic=false");
  expect_error<ConfigError>([&] { validate(c); }, "sync.round_seconds (time-budgeted rounds) needs cluster.elastic = true");

  apply_override(c, "sync.round_seconds=0");
  apply_override(c, "cluster.elastic=true");
  apply_override(c, "cluster.min_workers=5");
  expect_error<ConfigError>([&] { validate(c); }, "cluster.min_workers = 5 exceeds cluster.workers = 4");
  apply_override(c, "cluster.min_workers=2");
  apply_override(c, "cluster.heartbeat_s=2");
  apply_override(c, "cluster.dead_after_s=3");
  expect_error<ConfigError>([&] { validate(c); }, "must be at least twice cluster.heartbeat_s");
}

// Asynchronous DiLoCo: what it does not offer yet is refused by name, its options reach the outer state.
TEST(Config, AsynchronousDiLoCoNamesWhatItCannotDo) {
  RunConfig c;
  apply_override(c, "cluster.workers=4");
  apply_override(c, "sync.algorithm=diloco");
  apply_override(c, "sync.async=true");
  EXPECT_NO_THROW(validate(c));
  const std::vector<std::pair<const char*, const char*>> refused = {
      {"sync.algorithm=ddp", "is for sync.algorithm = \"diloco\" or \"streaming\""},
      {"sync.algorithm=streaming", "set sync.overlap_steps = 0"},
      {"sync.eager=true", "and sync.eager are two ways of not waiting"},
      {"sync.robust_mean=median", "there is no mean to make robust"},
      {"sync.exchange=e3m0", "sends fp32 outer gradients for now"},
      {"outer.optimizer=sgd", "steps with delayed Nesterov"},
  };
  for (const auto& [override, why] : refused) {
    RunConfig bad = c;
    apply_override(bad, override);
    expect_error<ConfigError>([&] { validate(bad); }, why);
  }
  RunConfig streaming = c;  // Streaming DiLoCo's fragments, one exchanged at a time
  for (const char* o : {"sync.algorithm=streaming", "sync.fragments=2", "sync.overlap_steps=0"}) apply_override(streaming, o);
  EXPECT_NO_THROW(validate(streaming));
  RunConfig elastic = c;  // elastic membership: slots that change hands (async_elastic_run.h)
  apply_override(elastic, "cluster.elastic=true");
  apply_override(elastic, "cluster.min_workers=2");
  EXPECT_NO_THROW(validate(elastic));
  apply_override(elastic, "sync.round_seconds=5");
  expect_error<ConfigError>([&] { validate(elastic); }, "shares the steps by speed itself");
  apply_override(c, "sync.async_delay=2");
  apply_override(c, "sync.async_grace=0.5");
  apply_override(c, "sync.reject_ratio=10");
  resolve_defaults(c);
  const auto o = async_options(c);
  EXPECT_EQ(o.workers, 4);
  EXPECT_EQ(o.delay_or_default(), 2);
  EXPECT_EQ(o.staleness_or_default(), 16);
  EXPECT_DOUBLE_EQ(o.grace, 0.5);
  EXPECT_DOUBLE_EQ(o.screening.reject_ratio, 10);
  EXPECT_DOUBLE_EQ(o.lr, 0.7);
  EXPECT_DOUBLE_EQ(o.momentum, 0.9);
  expect_error<ConfigError>([] { parse_config("[sync]\nasync_grace = -1.0\n", "f.toml"); }, "sync.async_grace must be in [0, 10]");
}

// Shards of unequal size by design (label, kmeans) weigh outer gradients by shard size; iid shards
// and time-budgeted rounds by the tokens of the round; an explicit choice stands.
TEST(Config, AutoWeightingFollowsTheShardPolicy) {
  RunConfig c;
  EXPECT_EQ(c.sync.weighting, WeightingChoice::kAuto);
  EXPECT_EQ(weighting(c), algorithms::Weighting::kTokens);
  apply_override(c, "data.shard=label");
  EXPECT_EQ(weighting(c), algorithms::Weighting::kShard);
  EXPECT_EQ(diloco_options(c, 1234).shard_tokens, 1234);
  apply_override(c, "data.shard=kmeans");
  EXPECT_EQ(streaming_options(c, 99).weighting, algorithms::Weighting::kShard);
  apply_override(c, "sync.round_seconds=2");
  EXPECT_EQ(weighting(c), algorithms::Weighting::kTokens);
  apply_override(c, "sync.weighting=uniform");
  EXPECT_EQ(weighting(c), algorithms::Weighting::kUniform);
  apply_override(c, "sync.round_seconds=0");
  apply_override(c, "data.shard=iid");
  apply_override(c, "sync.weighting=shard");
  EXPECT_EQ(weighting(c), algorithms::Weighting::kShard);
}

// An encoded exchange is DiLoCo's too (Streaming DiLoCo with one fragment, no overlap, no merge);
// DDP sends fp32 gradients and ignores it, so a streaming config can be run as DDP as it is.
TEST(Config, ExchangeAppliesToDiLoCoAndIsIgnoredByDdp) {
  RunConfig c;
  c.cluster.workers = 4;
  apply_override(c, "sync.algorithm=diloco");
  apply_override(c, "sync.exchange=e3m0");
  EXPECT_NO_THROW(validate(c));
  EXPECT_EQ(diloco_options(c).as_streaming().exchange, comm::Encoding::kE3M0);
  apply_override(c, "sync.algorithm=ddp");
  EXPECT_NO_THROW(validate(c));
}

TEST(Config, DipacoLevelsParseValidateAndRoundTrip) {
  auto c = parse_config("[model]\nlayers = 4\n[dipaco]\nlevels = \"2:2, 2:path\"\nembed = \"path\"\n", "t.toml");
  const auto options = path_options(c);
  ASSERT_EQ(options.levels.size(), 2u);
  EXPECT_TRUE(options.levels[1].path_specific);
  EXPECT_TRUE(options.embed_path_specific);
  EXPECT_EQ(path_options(parse_config(to_toml(c), "again")).levels, options.levels);
  expect_error<ConfigError>([&] { check_trainable(c); }, "start it with `loco launch --config FILE`");
  EXPECT_NO_THROW(check_trainable(parse_config("", "dense.toml")));
  expect_error<ConfigError>([] { parse_config("[model]\nlayers = 4\n[dipaco]\nlevels = \"3:2\"\n", "t.toml"); },
                            "spans 3 blocks but the model has 4");
  expect_error<ConfigError>([] { parse_config("[dipaco]\nembed = \"each\"\n", "t.toml"); }, "dipaco.embed");
}

TEST(Config, LoadMissingFileNamesIt) {
  expect_error<DataError>([] { load_config("/nonexistent/run.toml", {}); }, "/nonexistent/run.toml");
}

TEST(Config, TomlRoundTripAndDifferences) {
  RunConfig c;
  apply_override(c, "model.layers=3");
  apply_override(c, "optim.lr=0.00123");
  apply_override(c, "model.position=learned");
  RunConfig back = parse_config(to_toml(c), "roundtrip");
  EXPECT_TRUE(differences(c, back).empty()) << to_toml(c);
  apply_override(back, "train.steps=9");
  apply_override(back, "model.layers=4");
  auto all = differences(c, back);
  ASSERT_EQ(all.size(), 2u);
  auto model_only = differences(c, back, {"model."});
  ASSERT_EQ(model_only.size(), 1u);
  EXPECT_EQ(model_only[0], "model.layers: 3 -> 4");
}

TEST(Config, ReferenceListsEveryKey) {
  const auto ref = reference_markdown();
  for (const char* key : {"run.dir", "data.dir", "model.layers", "optim.lr", "train.steps", "eval.every", "checkpoint.keep"}) {
    EXPECT_NE(ref.find(std::string("`") + key + "`"), std::string::npos) << key;
  }
}

// A launcher passes secret overrides to its workers through their environment (config/secrets.h),
// and a worker reads them back from there.
TEST(Config, SecretOverridesLeaveTheCommandLineForTheEnvironment) {
  std::vector<std::string> overrides = {"train.steps=10", "cluster.join_token=abc=def", "dipaco.database=host=db password=pw",
                                        "run.dir=runs/x"};
  const auto environment = take_secret_overrides(overrides);
  EXPECT_EQ(overrides, (std::vector<std::string>{"train.steps=10", "run.dir=runs/x"}));
  const std::vector<std::pair<std::string, std::string>> expected = {{"LOCO_JOIN_TOKEN", "abc=def"},
                                                                     {"LOCO_DIPACO_DATABASE", "host=db password=pw"}};
  EXPECT_EQ(environment, expected);
  EXPECT_FALSE(secret_variable("train.steps"));
  EXPECT_EQ(secret_variable("cluster.join_token"), "LOCO_JOIN_TOKEN");

  testing_util::TempDir dir;
  const auto file = dir.path() / "run.toml";
  write_file_atomic(file, "[train]\nsteps = 5\n", "test");
  ASSERT_EQ(::setenv("LOCO_DIPACO_DATABASE", "host=db password=pw", 1), 0);
  EXPECT_EQ(load_config(file, {}).dipaco.database, "host=db password=pw");
  EXPECT_EQ(load_config(file, {"dipaco.database=host=other"}).dipaco.database, "host=other") << "the key itself comes first";
  ::unsetenv("LOCO_DIPACO_DATABASE");
  EXPECT_EQ(load_config(file, {}).dipaco.database, "");
  // A malformed secret is refused without being shown; another key's bad value is shown.
  const std::string secret = "s3cret\xff-token-value";
  try {
    load_config(file, {"cluster.join_token=" + secret});
    ADD_FAILURE() << "a non-UTF-8 token was taken";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("cluster.join_token expects UTF-8 text"), std::string::npos) << e.what();
    EXPECT_EQ(std::string(e.what()).find("s3cret"), std::string::npos) << e.what();
  }
  expect_error<ConfigError>([&] { load_config(file, {"run.dir=runs\xff"}); }, "got 'runs");
}

}  // namespace
}  // namespace loco::runtime
