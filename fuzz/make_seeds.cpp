// Writes the seed inputs of fuzz/corpus/ from loco's own writers, so that they stay valid when a
// format changes: `build-fuzz/fuzz/make_seeds fuzz/corpus` (scripts/fuzz.sh --seeds). Hand-made
// seeds (configs, JSONL) live next to these and are not touched.
#include <fmt/format.h>

#include <fstream>
#include <iostream>

#include "loco/core/files.h"
#include "loco/data/shard.h"
#include "loco/runtime/coordinator/membership.h"
#include "loco/runtime/store/safetensors.h"

namespace {

namespace fs = std::filesystem;
using namespace loco::runtime;
using namespace loco::runtime::protocol;

void write(const fs::path& file, const std::string& bytes) {
  fs::create_directories(file.parent_path());
  std::ofstream(file, std::ios::binary) << bytes;
  std::cout << file.string() << " (" << bytes.size() << " bytes)\n";
}

void protocol_seeds(const fs::path& dir) {
  DatasetIdentity dataset{0x1234abcd5678ef90, 4096, 460, 40, 1000000, 90000, {"adventure", "news"}};
  JoinRequest join;
  join.name = "host:1234";
  join.config_toml = "[run]\ndir = \"runs/x\"\n";
  join.dataset = dataset;
  join.resume = true;
  join.rank = 1;
  join.checkpoints = {{100, 0xdeadbeef}, {200, 0xfeedface}};
  join.shards_hash = 0x42;
  write(dir / "join_request.json", join.to_json().dump());
  JoinReply join_reply{2, 4, "run-1", 7, true, {1, 3}, 200};
  write(dir / "join_reply.json", join_reply.to_json().dump());
  Task task{5, TaskScope::kFragment, 1, 3, 2, {0, 10}, 50, 0, TaskReport::kRound};
  StartReply start{Phase::kRunning, {3}, 2, 100, "", task};
  write(dir / "start_reply.json", start.to_json().dump());
  DoneRequest done{1, EndStatus::kFailed, "boom", {{"steps", 10}, {"loss", 2.5}}, 3, 5};
  write(dir / "done_request.json", done.to_json().dump());
  write(dir / "heartbeat_request.json", HeartbeatRequest{3, 40}.to_json().dump());
  write(dir / "heartbeat_reply.json", HeartbeatReply{true, 2, false, false}.to_json().dump());
  RoundRequest round{3, 2, 1, 40, {0, 7}, {{1, {0, 5}}}};
  write(dir / "round_request.json", round.to_json().dump());
  RoundReply reply;
  reply.action = RoundAction::kGo;
  reply.round = 2, reply.epoch = 3, reply.rank = 0, reply.size = 2, reply.contributors = 2, reply.step = 40;
  reply.slots = {{3, {0, 7}}, {-1, {0, 5}}};
  reply.tasks = {task};
  reply.reason = "convened";
  write(dir / "round_reply.json", reply.to_json().dump());
  write(dir / "round_done.json", RoundDone{3, 2, 3, 40, 0x0123456789abcdef}.to_json().dump());
  write(dir / "task.json", task.to_json().dump());
  write(dir / "dataset_identity.json", dataset.to_json().dump());
}

// RUN/coordinator.json at several points of a 3-slot elastic run, as ElasticRun::persist writes it.
void coordinator_state_seeds(const fs::path& dir) {
  MembershipOptions options;
  options.slots = 3;
  options.total_steps = 1000;
  options.inner_steps = 10;
  MembershipTable table(options);
  auto now = MembershipTable::Clock::now();
  int seed = 0;
  auto save = [&](const char* phase) {
    const nlohmann::json state = {{"format_version", 1}, {"run_id", "run-1"}, {"phase", phase}, {"stopping", false},
                                  {"table", table.save()}};
    write(dir / fmt::format("state_{}.json", seed++), state.dump());
  };
  std::string why;
  const auto a = table.join("host-a:1", -1, now, why);
  const auto b = table.join("host-b:2", -1, now, why);
  save("waiting");
  table.start(now);
  save("running");
  for (int64_t round = 1; round <= 2; ++round) {
    RoundRequest request;
    request.round = round, request.step = round * 10, request.position = {0, static_cast<uint64_t>(round * 4)};
    request.member = a->member;
    RoundReply go = table.arrive(request, false, now);
    request.member = b->member;
    go = table.arrive(request, false, now);
    save("running");  // convened, no report yet
    table.round_done({a->member, round, go.epoch, round * 10, 0x1111}, now);
    save("running");
  }
  table.join("host-c:3", -1, now, why);
  save("running");
}

void safetensors_seeds(const fs::path& dir) {
  write(dir / "empty.safetensors", encode_safetensors({}));
  write(dir / "small.safetensors",
        encode_safetensors({{"w", torch::arange(6, torch::kFloat32).reshape({2, 3})},
                            {"b", torch::tensor({1, -2}, torch::kInt64)},
                            {"m", torch::tensor({true, false})},
                            {"h", torch::ones({1, 2}, torch::kBFloat16)}},
                           {{"step", "10"}}));
}

void shard_seeds(const fs::path& dir) {
  const fs::path tmp = fs::temp_directory_path() / "loco-make-seeds.tok";
  const std::vector<int32_t> tokens = {5, 17, 2, 300, 2, 1, 4095, 2};
  loco::data::write_shard(tmp, tokens, 4096, 0x1234abcd5678ef90);
  write(dir / "u16.tok", loco::read_file(tmp, "seeds"));
  loco::data::write_shard(tmp, tokens, 100000, 0x1234abcd5678ef90);
  write(dir / "u32.tok", loco::read_file(tmp, "seeds"));
  fs::remove(tmp);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: make_seeds CORPUS_DIR   (e.g. fuzz/corpus)\n";
    return 2;
  }
  const fs::path out = argv[1];
  protocol_seeds(out / "protocol_fuzzer");
  coordinator_state_seeds(out / "coordinator_state_fuzzer");
  safetensors_seeds(out / "safetensors_fuzzer");
  shard_seeds(out / "shard_fuzzer");
  return 0;
}
