// loco under the launchers users' clusters have: a real Slurm (Debian's slurm-wlm, started by the
// test) running the batch script the docs show, and torchrun (Debian's python3-torch) starting the
// workers of a coordinator. Each run is the launch tests' tiny DiLoCo; it must end with every worker
// finished on the same parameters, each with its share of the host's cores.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <map>
#include <sstream>

#include "cli_util.h"
#include "loco/core/environment.h"
#include "slurm_cluster.h"

namespace loco {
namespace {

using namespace std::chrono_literals;
using testing_util::Child;
using testing_util::run_command;
namespace fs = std::filesystem;

std::string read_text(const fs::path& file) {
  std::ifstream in(file);
  std::stringstream all;
  all << in.rdbuf();
  return all.str();
}

// The run's events of one kind, by worker.
std::map<int64_t, nlohmann::json> events_by_worker(const fs::path& run, const std::string& kind) {
  std::map<int64_t, nlohmann::json> out;
  std::istringstream lines(read_text(run / "metrics.jsonl"));
  for (std::string line; std::getline(lines, line);) {
    const auto e = nlohmann::json::parse(line, nullptr, false);
    if (!e.is_discarded() && e.value("event", "") == kind) out[e.value("worker", int64_t{-1})] = e;
  }
  return out;
}

// Both workers finished, on the same parameters, each with half the cores (at least one).
void expect_two_workers_finished_together(const fs::path& run) {
  const auto starts = events_by_worker(run, "start"), summaries = events_by_worker(run, "summary");
  ASSERT_EQ(summaries.size(), 2u) << read_text(run / "metrics.jsonl");
  EXPECT_EQ(summaries.at(0)["global_hash"], summaries.at(1)["global_hash"]);
  EXPECT_FALSE(summaries.at(0)["interrupted"].get<bool>());
  EXPECT_GT(summaries.at(0)["rounds"].get<int64_t>(), 0);
  ASSERT_EQ(starts.size(), 2u);
  const int64_t share = std::max<int64_t>(1, usable_cores() / 2);
  for (const auto& [worker, start] : starts) EXPECT_EQ(start["threads"].get<int64_t>(), share) << "worker " << worker;
}

class ClusterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(testing_util::prepare_tiny_dataset(dir_.path(), data()));
    std::ofstream(config()) << testing_util::tiny_launch_config(2);
  }
  fs::path data() const { return dir_.path() / "data"; }
  fs::path config() const { return dir_.path() / "run.toml"; }
  fs::path run() const { return dir_.path() / "run"; }
  std::string log(const std::string& name) const { return (dir_.path() / (name + ".log")).string(); }

  testing_util::TempDir dir_;
};

// scripts/loco.sbatch, as docs/distributed.md shows it, submitted with sbatch to a one-node cluster
// with two tasks: a coordinator step and a worker step, ranks from SLURM_PROCID, each worker's
// threads the node's cores split between the step's two tasks there.
TEST_F(ClusterTest, SlurmRunsTheDocumentedBatchScript) {
  const auto script = testing_util::source_dir() / "scripts" / "loco.sbatch";
  EXPECT_NE(read_text(testing_util::source_dir() / "docs" / "distributed.md").find(read_text(script)), std::string::npos)
      << "docs/distributed.md does not show scripts/loco.sbatch as it is";

  if (::geteuid() != 0) GTEST_SKIP() << "slurmd launches a job's steps as root (CI runs as root)";
  testing_util::SlurmCluster cluster;
  ASSERT_TRUE(cluster.ok());
  const auto job = run_command(
      cluster.command({"/usr/bin/env", "LOCO=" + testing_util::loco_binary(), "LOCO_RUN_DIR=" + run().string(),
                       "/usr/bin/sbatch", "--wait", "--chdir=" + dir_.path().string(), "--nodes=1", "--ntasks=2",
                       "--ntasks-per-node=2", "--time=3", "--output=" + (dir_.path() / "job.out").string(), script.string(),
                       config().string(), "--data.dir=" + data().string()}),
      log("sbatch"), 200s);
  ASSERT_EQ(job.status, 0) << job.output << "\n--- job.out\n" << read_text(dir_.path() / "job.out") << cluster.logs();
  expect_two_workers_finished_together(run());
}

// torchrun starts the workers (--no_python); they find loco's coordinator through LOCO_COORDINATOR,
// while torchrun's own rendezvous store holds MASTER_PORT. A worker given only torchrun's variables
// says which one it needs.
TEST_F(ClusterTest, TorchrunStartsTheWorkersOfACoordinator) {
  const std::string torchrun = "/usr/bin/torchrun";
  ASSERT_TRUE(fs::exists(torchrun)) << torchrun << " is missing (scripts/setup.sh installs Debian's python3-torch)";
  const int port = testing_util::free_port();
  Child coordinator({testing_util::loco_binary(), "coordinator", "--config", config().string(), "--data.dir=" + data().string(),
                     "--run.dir=" + run().string(), "--port", std::to_string(port), "--bind", "127.0.0.1", "--workers", "2"},
                    log("coordinator"));
  // Debian 12's torchrun (1.13 on Python 3.11) fails on its default --redirects 0 (an enum that
  // Python 3.11 iterates differently); redirecting stdout (1), teed back (-t 1), avoids it. Its
  // rendezvous on a free port (--standalone's is always 29400).
  const auto workers = run_command({"/usr/bin/env", "LOCO_COORDINATOR=127.0.0.1:" + std::to_string(port), torchrun, "--nnodes=1",
                                    "--rdzv_backend=c10d", "--rdzv_endpoint=127.0.0.1:" + std::to_string(testing_util::free_port()),
                                    "--nproc_per_node=2", "-r", "1", "-t", "1", "--no_python", testing_util::loco_binary(), "worker",
                                    "--config", config().string(), "--data.dir=" + data().string(), "--run.dir=" + run().string()},
                                   log("torchrun"), 240s);
  ASSERT_EQ(workers.status, 0) << workers.output << "\n--- coordinator\n" << read_text(log("coordinator"));
  EXPECT_EQ(coordinator.wait(30s), 0) << read_text(log("coordinator"));
  expect_two_workers_finished_together(run());

  const auto lost = run_command({"/usr/bin/env", "-u", "LOCO_COORDINATOR", "MASTER_ADDR=127.0.0.1", "MASTER_PORT=29500",
                                 testing_util::loco_binary(), "worker", "--config", config().string()},
                                log("no-coordinator"), 60s);
  EXPECT_EQ(lost.status, 1);
  EXPECT_NE(lost.output.find("set LOCO_COORDINATOR=HOST:PORT (torchrun's MASTER_ADDR:MASTER_PORT is its own rendezvous store"),
            std::string::npos)
      << lost.output;
}

// Two workers started by hand on one host, with no variable saying how many share it (issue #50:
// each took every core): the coordinator tells each how many of the run's workers named this host,
// and they split its cores.
TEST_F(ClusterTest, WorkersStartedByHandOnOneHostSplitItsCores) {
  const int port = testing_util::free_port();
  Child coordinator({testing_util::loco_binary(), "coordinator", "--config", config().string(), "--data.dir=" + data().string(),
                     "--run.dir=" + run().string(), "--port", std::to_string(port), "--bind", "127.0.0.1", "--workers", "2"},
                    log("coordinator"));
  std::vector<std::unique_ptr<Child>> workers;
  for (int rank = 0; rank < 2; ++rank) {
    workers.push_back(std::make_unique<Child>(
        std::vector<std::string>{"/usr/bin/env", "-u", "LOCO_LOCAL_PROCESSES", "-u", "LOCAL_WORLD_SIZE", "-u", "SLURM_NTASKS_PER_NODE",
                                 "-u", "SLURM_STEP_TASKS_PER_NODE", "-u", "SLURM_CPUS_PER_TASK", testing_util::loco_binary(), "worker",
                                 "--coordinator", "127.0.0.1:" + std::to_string(port), "--config", config().string(),
                                 "--data.dir=" + data().string(), "--run.dir=" + run().string()},
        log("worker-" + std::to_string(rank))));
  }
  for (int rank = 0; rank < 2; ++rank) {
    ASSERT_EQ(workers[static_cast<size_t>(rank)]->wait(240s), 0) << read_text(log("worker-" + std::to_string(rank)));
  }
  EXPECT_EQ(coordinator.wait(30s), 0) << read_text(log("coordinator"));
  expect_two_workers_finished_together(run());
  EXPECT_NE(read_text(log("worker-0")).find("2 workers of this run on this host: each takes"), std::string::npos)
      << read_text(log("worker-0"));
}

}  // namespace
}  // namespace loco
