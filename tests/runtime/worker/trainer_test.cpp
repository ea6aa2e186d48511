#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "loco/algorithms/diloco.h"
#include "loco/core/error.h"
#include "loco/core/files.h"
#include "loco/runtime/store/checkpoint.h"
#include "loco/model/transformer.h"
#include "loco/runtime/worker/emulated_compute.h"
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

// Emulated compute (train.emulated_step_s): every parameter moves, by exactly the learning rates of
// the steps so far once every part has had its turn since, along a tile of the worker's direction.
TEST(EmulatedComputeTest, EveryParameterMovesByTheLearningRatesAlongItsWorkersDirection) {
  model::ModelOptions options;
  options.vocab_size = 64;
  options.context = 8;
  options.layers = 2;
  options.width = 768;  // 2 blocks of 768 wide: 14M parameters, an MLP matrix of more than two tiles
  options.heads = 4;
  options.mlp_ratio = 4;
  model::Transformer model(options, 1);
  std::vector<torch::Tensor> before;
  for (const auto& p : model->parameters()) before.push_back(p.detach().clone());
  EmulatedCompute worker0(model, 0.0, 7, /*gradients=*/false);
  const std::vector<double> lrs = {1e-3, 2e-3, 3e-3, 4e-3, 5e-3, 6e-3, 7e-3, 8e-3};
  ASSERT_EQ(lrs.size(), static_cast<size_t>(EmulatedCompute::kRotation));
  // Each step moves one part by the rates since it last moved: after steps with lr 0 for as many
  // steps again, every part has moved by all of them.
  for (double lr : lrs) {
    worker0.forward_backward();
    worker0.update(lr);
  }
  for (size_t i = 0; i < lrs.size(); ++i) worker0.update(0.0);
  const double moved = 36e-3;  // the sum of the rates
  // The direction: a tile of normal values repeated over each parameter, the same on every one.
  const auto params = model->parameters();
  int64_t total = 0;
  std::vector<torch::Tensor> directions;
  for (size_t i = 0; i < params.size(); ++i) {
    const auto step = (before[i] - params[i].detach()).view(-1) / moved;
    EXPECT_EQ(step.eq(0).sum().item<int64_t>(), 0) << "parameter " << i << " has values that never moved";
    directions.push_back(step);
    total += step.numel();
  }
  ASSERT_GT(total, EmulatedCompute::kTile * EmulatedCompute::kRotation) << "more tiles than the rotation has parts";
  const auto flat = directions.front().narrow(0, 0, std::min({directions.front().numel(), directions.back().numel(), int64_t{1000}}));
  EXPECT_NEAR(directions.back().narrow(0, 0, flat.numel()).sub(flat).abs().max().item<double>(), 0, 1e-3)
      << "every parameter starts the same tile";
  const auto all = torch::cat(directions);
  EXPECT_NEAR(all.mean().item<double>(), 0, 0.02);
  EXPECT_NEAR(all.std().item<double>(), 1, 0.05) << "a normal direction, about AdamW's step in size";

  // Another worker (seed) moves elsewhere; with DDP the direction is in the gradients.
  model::Transformer other(options, 1);
  EmulatedCompute worker1(other, 0.0, 8, /*gradients=*/true);
  for (const auto& p : other->parameters()) ASSERT_TRUE(p.grad().defined());
  const auto g0 = other->parameters().front().grad().view(-1).narrow(0, 0, flat.numel());
  EXPECT_GT(g0.sub(flat).abs().max().item<double>(), 0.5) << "each worker has a direction of its own";
  for (double lr : lrs) worker1.update(lr);
  for (size_t i = 0; i < lrs.size(); ++i) worker1.update(0.0);
  const auto first = other->parameters().front();
  torch::NoGradGuard no_grad;
  EXPECT_TRUE(torch::allclose(model::Transformer(options, 1)->parameters().front() - first, first.grad() * moved, 1e-4, 1e-6))
      << "with gradients each part moves along them";
}

// A training run whose compute is emulated takes the stated time a step, moves every parameter,
// and reports no loss: its train events hold none, it evaluates nothing and saves no checkpoint.
TEST_F(TrainerTest, EmulatedComputeTakesItsTimeMovesEveryParameterAndReportsNoLoss) {
  // Keeps the model to look at it after the run.
  class Keep : public algorithms::SyncStrategy {
   public:
    std::string name() const override { return "keep"; }
    algorithms::SyncReports on_start(model::Transformer& model, int64_t) override {
      model_ = model;
      for (const auto& p : model->parameters()) start_.push_back(p.detach().clone());
      return {};
    }
    model::Transformer model_{nullptr};
    std::vector<torch::Tensor> start_;
  };
  auto c = config("emulated");
  c.train.steps = 16;
  c.train.emulated_step_s = 0.05;
  Keep keep;
  const auto start = std::chrono::steady_clock::now();
  const auto summary = train(c, keep, {});
  EXPECT_GE(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 16 * 0.05 * 0.95);
  EXPECT_EQ(summary.steps, 16);
  EXPECT_TRUE(summary.losses.empty());
  EXPECT_TRUE(std::isnan(summary.val_loss));
  const auto params = keep.model_->parameters();
  ASSERT_EQ(params.size(), keep.start_.size());
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_EQ(params[i].detach().eq(keep.start_[i]).sum().item<int64_t>(), 0) << "parameter " << i << " did not move everywhere";
  }
  const fs::path run = c.run.dir;
  const auto trains = events(run, "train");
  ASSERT_EQ(trains.size(), 16u);
  for (const auto& e : trains) EXPECT_TRUE(e.at("loss").is_null()) << e.dump();
  EXPECT_TRUE(events(run, "eval").empty());
  EXPECT_TRUE(events(run, "checkpoint").empty());
  EXPECT_FALSE(fs::exists(run / "checkpoints") && !fs::is_empty(run / "checkpoints"));
  ASSERT_EQ(events(run, "summary").size(), 1u);
  EXPECT_TRUE(events(run, "summary")[0].at("val_loss").is_null());
}

// Elastic runs take emulated compute (their checkpoints are for restarts: the goodput under failures
// of docs/failure-model.md); DiPaCo does not.
TEST_F(TrainerTest, EmulatedComputeIsRefusedWhereItCannotRun) {
  auto c = config("emulated-elastic");
  c.train.emulated_step_s = 0.1;
  c.sync.algorithm = Algorithm::kDiLoCo;
  c.cluster.elastic = true;
  c.cluster.workers = 2;
  c.checkpoint.keep = 2;
  EXPECT_NO_THROW(validate(c));
  c.cluster.elastic = false;
  c.dipaco.levels = "2:2";
  expect_error<ConfigError>([&] { validate(c); }, "train.emulated_step_s (emulated compute) is not for DiPaCo");
}

}  // namespace
}  // namespace loco::runtime
