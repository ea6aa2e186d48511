#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "loco/algorithms/diloco.h"
#include "loco/core/error.h"
#include "loco/core/files.h"
#include "loco/runtime/store/checkpoint.h"
#include "loco/runtime/worker/trainer.h"
#include "test_util.h"
#include "tiny_corpus.h"

namespace loco::runtime {
namespace {

using testing_util::expect_error;
using testing_util::TempDir;

class TrainerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    data_ = testing_util::prepare_tiny_dataset(dir_->path());
  }
  static void TearDownTestSuite() { delete dir_; }

  RunConfig config(const std::string& run) const {
    RunConfig c;
    c.run.dir = (dir_->path() / run).string();
    c.data.dir = data_.string();
    c.model.context = 32;
    c.model.layers = 2;
    c.model.width = 32;
    c.model.heads = 2;
    c.optim.lr = 3e-3;
    c.optim.warmup_steps = 5;
    c.train.steps = 30;
    c.train.batch_size = 4;
    c.train.threads = 1;
    c.train.device = "cpu";
    c.train.log_every = 1;
    c.eval.every = 10;
    c.eval.windows = 16;
    c.eval.batch_size = 8;
    c.checkpoint.every = 10;
    return c;
  }

  static std::vector<nlohmann::json> events(const fs::path& run, const std::string& kind) {
    std::vector<nlohmann::json> out;
    std::ifstream in(run / "metrics.jsonl");
    for (std::string line; std::getline(in, line);) {
      auto j = nlohmann::json::parse(line);
      if (j.at("event") == kind) out.push_back(j);
    }
    return out;
  }

  static TempDir* dir_;
  static fs::path data_;
};
TempDir* TrainerTest::dir_ = nullptr;
fs::path TrainerTest::data_;

TEST_F(TrainerTest, LearnsAndWritesRunFolder) {
  auto c = config("learns");
  c.train.steps = 60;
  algorithms::NoSync sync;
  auto summary = train(c, sync, {});
  EXPECT_EQ(summary.steps, 60);
  EXPECT_EQ(summary.tokens, 60 * 4 * 32);
  ASSERT_EQ(summary.losses.size(), 60u);
  EXPECT_LT(summary.losses.back(), summary.losses.front() - 1.0) << "training must reduce the loss";
  EXPECT_LT(summary.val_loss, summary.val_unigram_entropy) << "the model must beat the unigram baseline";

  const fs::path run = c.run.dir;
  EXPECT_TRUE(fs::exists(run / "config.toml"));
  auto saved = parse_config(read_file(run / "config.toml", "test"), "config.toml");
  EXPECT_EQ(saved.model.vocab_size, 320) << "the resolved config records the dataset's vocabulary";
  auto train_events = events(run, "train");
  ASSERT_EQ(train_events.size(), 60u);
  for (const char* key : {"step", "loss", "lr", "tokens", "tokens_per_s"}) EXPECT_TRUE(train_events[0].contains(key)) << key;
  auto evals = events(run, "eval");
  ASSERT_EQ(evals.size(), 6u);
  EXPECT_NEAR(evals.back()["val_ppl"].get<double>(), std::exp(evals.back()["val_loss"].get<double>()), 1e-6);
  auto summaries = events(run, "summary");
  ASSERT_EQ(summaries.size(), 1u);
  for (const char* key : {"steps", "tokens", "val_loss", "wall_s"}) EXPECT_TRUE(summaries[0].contains(key)) << key;
  EXPECT_EQ(load_checkpoint(run).state.step, 60);
}

TEST_F(TrainerTest, ResumeIsBitExact) {
  algorithms::NoSync sync;
  auto full = train(config("full"), sync, {});

  // Stop after 10 steps (as a SIGINT would), then resume in a fresh trainer.
  auto partial_config = config("partial");
  std::atomic<bool> stop{false};
  partial_config.train.log_every = 1;
  TrainOptions first;
  first.stop = &stop;
  struct StopAt : algorithms::SyncStrategy {
    std::atomic<bool>* flag;
    std::string name() const override { return "stop-at-12"; }
    algorithms::SyncReports after_step(algorithms::StepContext& ctx) override {
      if (ctx.step == 11) flag->store(true);
      return {};
    }
  } stopper;
  stopper.flag = &stop;
  auto head = train(partial_config, stopper, first);
  EXPECT_TRUE(head.interrupted);
  ASSERT_EQ(head.steps, 12);

  TrainOptions again;
  again.resume = true;
  auto tail = train(partial_config, sync, again);
  EXPECT_EQ(tail.first_step, 12);
  EXPECT_EQ(tail.steps, 30);
  std::vector<double> stitched = head.losses;
  stitched.insert(stitched.end(), tail.losses.begin(), tail.losses.end());
  ASSERT_EQ(stitched.size(), full.losses.size());
  for (size_t i = 0; i < stitched.size(); ++i) EXPECT_EQ(stitched[i], full.losses[i]) << "step " << i;
  EXPECT_EQ(tail.val_loss, full.val_loss);

  auto a = load_checkpoint(config("full").run.dir), b = load_checkpoint(partial_config.run.dir);
  ASSERT_EQ(a.model.size(), b.model.size());
  for (size_t i = 0; i < a.model.size(); ++i) EXPECT_TRUE(torch::equal(a.model[i].second, b.model[i].second)) << a.model[i].first;
}

TEST_F(TrainerTest, RefusesToOverwriteARun) {
  auto c = config("twice");
  c.train.steps = 2;
  algorithms::NoSync sync;
  train(c, sync, {});
  expect_error<ConfigError>([&] { train(c, sync, {}); }, "already holds a run; pass --resume");
}

TEST_F(TrainerTest, ResumeChecksConfigAndCheckpoint) {
  algorithms::NoSync sync;
  TrainOptions resume;
  resume.resume = true;
  expect_error<DataError>([&] { train(config("never-started"), sync, resume); }, "has no checkpoint to resume from");

  auto c = config("changed");
  c.train.steps = 3;
  train(c, sync, {});
  c.model.layers = 3;
  c.train.steps = 6;
  expect_error<ConfigError>([&] { train(c, sync, resume); }, "model.layers: 2 -> 3");
}

TEST_F(TrainerTest, BadInputStopsBeforeAnyStep) {
  algorithms::NoSync sync;
  auto c = config("bad-vocab");
  c.model.vocab_size = 999;
  expect_error<ConfigError>([&] { train(c, sync, {}); }, "model.vocab_size = 999");
  EXPECT_FALSE(fs::exists(fs::path(c.run.dir) / "metrics.jsonl"));
  c = config("bad-data");
  c.data.dir = (dir_->path() / "no-such-dataset").string();
  expect_error<DataError>([&] { train(c, sync, {}); }, "no-such-dataset");
}

TEST_F(TrainerTest, GradientAccumulationMatchesALargerBatch) {
  // Two micro-batches of 4 see the same windows as one batch of 8, so the losses agree to rounding.
  algorithms::NoSync sync;
  auto big = config("accum-big");
  big.train.steps = 5;
  big.train.batch_size = 8;
  auto small = config("accum-small");
  small.train.steps = 5;
  small.train.batch_size = 4;
  small.train.grad_accum = 2;
  auto a = train(big, sync, {});
  auto b = train(small, sync, {});
  for (size_t i = 0; i < a.losses.size(); ++i) EXPECT_NEAR(a.losses[i], b.losses[i], 1e-4) << "step " << i;
}

// train.init_from starts from another run's (global) parameters, with fresh optimizer state.
TEST_F(TrainerTest, InitFromWarmStartsFromACheckpoint) {
  algorithms::NoSync sync;
  auto first = train(config("warm-source"), sync, {});
  auto c = config("warm");
  c.train.steps = 2;
  c.train.init_from = config("warm-source").run.dir;
  auto warm = train(c, sync, {});
  auto cold = config("cold");
  cold.train.steps = 2;
  auto fresh = train(cold, sync, {});
  EXPECT_LT(warm.losses.front(), fresh.losses.front() - 0.5) << "the warm start begins where the source ended";
  EXPECT_NEAR(warm.losses.front(), first.losses.back(), 0.5);
  auto missing = config("warm-missing");
  missing.train.init_from = (dir_->path() / "no-such-run").string();
  expect_error<DataError>([&] { train(missing, sync, {}); }, "no-such-run");
}

// DiLoCo with one worker, H = 1 and the outer step SGD(lr 1, no momentum) sets θ to the worker's
// parameters after every inner step: it is plain training.
TEST_F(TrainerTest, OneWorkerDiLoCoWithFedAvgEveryStepIsPlainTraining) {
  algorithms::NoSync none;
  auto plain = train(config("plain"), none, {});
  auto c = config("fedavg");
  c.sync.algorithm = Algorithm::kDiLoCo;
  c.sync.inner_steps = 1;
  c.outer.optimizer = optim::OuterKind::kSgd;
  resolve_defaults(c);
  ASSERT_EQ(outer_options(c).lr, 1.0);
  ASSERT_EQ(outer_options(c).momentum, 0.0);
  algorithms::DiLoCo diloco(comm::Group::single(), diloco_options(c));
  auto fedavg = train(c, diloco, {});
  EXPECT_EQ(fedavg.rounds, 30);
  ASSERT_EQ(fedavg.losses.size(), plain.losses.size());
  for (size_t i = 0; i < plain.losses.size(); ++i) EXPECT_EQ(fedavg.losses[i], plain.losses[i]) << "step " << i;
  EXPECT_EQ(fedavg.val_loss, plain.val_loss);
}

}  // namespace
}  // namespace loco::runtime
