#include <fmt/format.h>
#include <gtest/gtest.h>

#include <fstream>

#include "loco/core/error.h"
#include "loco/core/files.h"
#include "loco/runtime/store/checkpoint.h"
#include "test_util.h"

namespace loco::runtime {
namespace {

using testing_util::expect_error;
using testing_util::TempDir;

TrainingState state_at(int64_t step) {
  TrainingState s;
  s.step = step;
  s.tokens = step * 100;
  s.sampler = {2, static_cast<uint64_t>(step)};
  s.seed = 9;
  s.tokenizer_hash = 0x1234abcd;
  s.config_toml = "[train]\nsteps = 10\n";
  s.wall_s = 1.5;
  return s;
}

NamedTensors weights(float v) { return {{"w", torch::full({2, 2}, v)}, {"b", torch::full({2}, v)}}; }

TEST(Checkpoint, SaveLoadRoundTripAndLatest) {
  TempDir dir;
  CheckpointStore store(dir.path() / "checkpoints", 2);
  EXPECT_FALSE(store.latest().has_value());
  auto saved = store.save(state_at(5), weights(1), {{"w.exp_avg", torch::ones({2, 2})}}, {});
  EXPECT_EQ(saved.filename(), "step-00000005");
  ASSERT_TRUE(store.latest().has_value());
  EXPECT_EQ(*store.latest(), saved);

  for (const auto& path : {saved, dir.path() / "checkpoints", dir.path()}) {
    auto ckpt = load_checkpoint(path);
    EXPECT_EQ(ckpt.dir, saved);
    EXPECT_EQ(ckpt.state.step, 5);
    EXPECT_EQ(ckpt.state.tokens, 500);
    EXPECT_EQ(ckpt.state.sampler, (data::SamplerPosition{2, 5}));
    EXPECT_EQ(ckpt.state.seed, 9);
    EXPECT_EQ(ckpt.state.tokenizer_hash, 0x1234abcdu);
    EXPECT_EQ(ckpt.state.config_toml, "[train]\nsteps = 10\n");
    ASSERT_EQ(ckpt.model.size(), 2u);
    EXPECT_TRUE(torch::equal(ckpt.model[0].second, torch::full({2, 2}, 1.0f)));
    EXPECT_EQ(ckpt.optimizer.size(), 1u);
    EXPECT_TRUE(ckpt.sync.empty());
  }
}

TEST(Checkpoint, KeepsOnlyTheNewestAndNoTemporaries) {
  TempDir dir;
  CheckpointStore store(dir.path() / "checkpoints", 2);
  for (int64_t step : {1, 2, 3, 4}) store.save(state_at(step), weights(static_cast<float>(step)), {}, {});
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir.path() / "checkpoints")) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"latest", "step-00000003", "step-00000004"}));
  EXPECT_EQ(load_checkpoint(dir.path()).state.step, 4);
}

// The checkpoint an elastic run's coordinator told its members to continue from survives the saves
// of a member it had given up on (the chaos soak, seed 3385470866), until it is unpinned.
TEST(Checkpoint, APinnedCheckpointIsNotPruned) {
  TempDir dir;
  CheckpointStore store(dir.path() / "checkpoints", 1);
  store.save(state_at(2), weights(2), {}, {});
  store.pin(2);
  for (int64_t step : {3, 4}) store.save(state_at(step), weights(static_cast<float>(step)), {}, {});
  EXPECT_EQ(store.steps(), (std::vector<int64_t>{2, 4}));
  EXPECT_EQ(load_checkpoint(store.at(2)).state.step, 2);
  store.unpin();
  store.save(state_at(5), weights(5), {}, {});
  EXPECT_EQ(store.steps(), (std::vector<int64_t>{5}));
}

TEST(Checkpoint, TheRunSectionRoundTripsAndIsOptional) {
  TempDir dir;
  CheckpointStore store(dir.path() / "checkpoints", 3);
  auto state = state_at(7);
  state.run = RunProgress{4, {{0, 12}, {1, 3}, {0, 0}}};
  auto with = store.save(state, weights(1), {}, {});
  const auto loaded = load_checkpoint(with).state.run;
  ASSERT_TRUE(loaded.has_value());
  EXPECT_EQ(loaded->rounds, 4);
  ASSERT_EQ(loaded->shards.size(), 3u);
  EXPECT_EQ(loaded->shards[0], (data::SamplerPosition{0, 12}));
  EXPECT_EQ(loaded->shards[1], (data::SamplerPosition{1, 3}));
  EXPECT_EQ(loaded->shards[2], (data::SamplerPosition{0, 0}));
  EXPECT_NE(read_file(with / "state.json", "test").find("\"run\""), std::string::npos);

  auto without = store.save(state_at(8), weights(1), {}, {});
  EXPECT_FALSE(load_checkpoint(without).state.run.has_value()) << "only elastic runs write one";
  EXPECT_EQ(read_file(without / "state.json", "test").find("\"run\""), std::string::npos);

  // A malformed run section is named; state.json's size is not checksummed, so edit it in place.
  auto text = read_file(with / "state.json", "test");
  text.replace(text.find("\"rounds\": 4"), 12, "\"rounds\": \"x\"");
  write_file_atomic(with / "state.json", text, "test");
  expect_error<DataError>([&] { load_checkpoint(with); }, "state.json: malformed");
}

// A fixed run's copy to a worker that holds no checkpoint: one message carries every part and the
// state; the receiver saves it marked as copied, and a damaged message is refused by name.
TEST(Checkpoint, ACheckpointTravelsAsOneMessageAndIsSavedAsACopy) {
  TempDir dir;
  CheckpointStore from(dir.path() / "from", 2), to(dir.path() / "to", 2);
  auto state = state_at(12);
  state.global_hash = 0xfeed;
  const auto original = load_checkpoint(from.save(state, weights(1), {{"w.exp_avg", torch::ones({2, 2})}}, weights(3)));
  const auto bytes = encode_checkpoint(original);
  auto copy = decode_checkpoint(bytes, "worker 0's copy");
  EXPECT_EQ(copy.state.step, 12);
  EXPECT_EQ(copy.state.global_hash, 0xfeedu);
  EXPECT_EQ(copy.state.sampler, state.sampler);
  EXPECT_EQ(copy.state.config_toml, state.config_toml);
  EXPECT_FALSE(copy.state.copied_from.has_value());
  ASSERT_EQ(copy.model.size(), 2u);
  EXPECT_EQ(copy.model[1].first, "b");
  EXPECT_TRUE(torch::equal(copy.model[0].second, original.model[0].second));
  ASSERT_EQ(copy.optimizer.size(), 1u);
  EXPECT_EQ(copy.optimizer[0].first, "w.exp_avg");
  ASSERT_EQ(copy.sync.size(), 2u);
  EXPECT_TRUE(torch::equal(copy.sync[0].second, torch::full({2, 2}, 3.0f)));

  copy.state.copied_from = 0;
  const auto saved = load_checkpoint(to.save(copy.state, copy.model, copy.optimizer, copy.sync, false));
  EXPECT_EQ(saved.state.copied_from, 0);
  EXPECT_EQ(saved.state.global_hash, 0xfeedu);
  EXPECT_FALSE(load_checkpoint(from.latest().value()).state.copied_from.has_value()) << "only a copy says so";

  auto damaged = bytes;
  damaged[damaged.size() - 3] ^= 0x40;
  expect_error<DataError>([&] { decode_checkpoint(damaged, "worker 0's copy"); }, "worker 0's copy");
  expect_error<DataError>([&] { decode_checkpoint(bytes.substr(0, bytes.size() / 2), "worker 0's copy"); }, "worker 0's copy");
}

TEST(Checkpoint, CorruptOrTruncatedFilesAreNamed) {
  TempDir dir;
  CheckpointStore store(dir.path() / "checkpoints", 2);
  auto saved = store.save(state_at(3), weights(2), {}, {});
  const auto model_file = saved / "model.safetensors";
  std::string bytes = read_file(model_file, "test");

  auto flipped = bytes;
  flipped[flipped.size() - 2] ^= 1;
  write_file_atomic(model_file, flipped, "test");
  expect_error<DataError>([&] { load_checkpoint(saved); }, "model.safetensors: checksum mismatch");

  write_file_atomic(model_file, bytes.substr(0, bytes.size() / 2), "test");
  expect_error<DataError>([&] { load_checkpoint(saved); }, "model.safetensors");

  // No more is read than state.json says, and no link inside the checkpoint is followed (a file
  // linked to /dev/zero was read without end; issue #49).
  write_file_atomic(model_file, bytes + std::string(1 << 20, 'x'), "test");
  expect_error<DataError>([&] { load_checkpoint(saved); }, fmt::format("more than the {} a file", bytes.size()));
  TempDir outside;
  write_file_atomic(outside.path() / "model.safetensors", bytes, "test");
  fs::remove(model_file);
  fs::create_symlink(outside.path() / "model.safetensors", model_file);
  expect_error<DataError>([&] { load_checkpoint(saved); }, "links inside the run folder are not followed");
  fs::remove(model_file);
  fs::create_symlink("/dev/zero", model_file);
  expect_error<DataError>([&] { load_checkpoint(saved); }, "links inside the run folder are not followed");
  write_file_atomic(dir.path() / "checkpoints" / "latest.real", "step-00000003\n", "test");
  fs::remove(dir.path() / "checkpoints" / "latest");
  fs::create_symlink(dir.path() / "checkpoints" / "latest.real", dir.path() / "checkpoints" / "latest");
  expect_error<DataError>([&] { store.latest(); }, "latest: cannot open");

  fs::remove(model_file);
  expect_error<DataError>([&] { load_checkpoint(saved); }, "model.safetensors: no such file");

  write_file_atomic(saved / "state.json", "{not json", "test");
  expect_error<DataError>([&] { load_checkpoint(saved); }, "state.json: malformed");
}

TEST(Checkpoint, MissingPathsAreExplained) {
  TempDir dir;
  expect_error<DataError>([&] { load_checkpoint(dir.path() / "nope"); }, "no such checkpoint or run folder");
  expect_error<DataError>([&] { load_checkpoint(dir.path()); }, "neither a checkpoint");
}

TEST(Checkpoint, FailedWriteLeavesThePreviousCheckpointIntact) {
  TempDir dir;
  CheckpointStore store(dir.path() / "checkpoints", 2);
  store.save(state_at(1), weights(1), {}, {});
  // A tensor safetensors cannot hold makes the second save fail midway (after some files exist).
  NamedTensors bad = {{"z", torch::zeros({1}, torch::kComplexFloat)}};
  EXPECT_THROW(store.save(state_at(2), weights(2), {}, bad), InternalError);
  EXPECT_EQ(load_checkpoint(dir.path()).state.step, 1);
  for (const auto& e : fs::directory_iterator(dir.path() / "checkpoints")) {
    EXPECT_FALSE(e.path().filename().string().starts_with(".")) << "temporary left behind: " << e.path();
  }
}

}  // namespace
}  // namespace loco::runtime
