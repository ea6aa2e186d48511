// A throwaway Slurm cluster of one node for tests, made of Debian's slurm-wlm daemons as a real
// cluster runs them: munged with a key of its own, slurmctld and slurmd, all in the foreground with
// their state, sockets and logs in a fresh folder, on free loopback ports. The node is this host
// under its own name (which must resolve: the jobs' tasks reach each other by it) and declares 8
// CPUs whatever the machine has (config_overrides), so that a job's tasks fit on a small machine.
// The destructor shuts Slurm down (scontrol shutdown, then signals) and stops munged; every wait is
// bounded, and the daemons end with the test's process if it is killed (setpriv --pdeathsig).
#pragma once

#include <gtest/gtest.h>
#include <netdb.h>
#include <pwd.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstring>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "process_util.h"

namespace loco::testing_util {

class SlurmCluster {
 public:
  SlurmCluster() {
    for (const char* tool : {"/usr/sbin/munged", "/usr/sbin/slurmctld", "/usr/sbin/slurmd", "/usr/bin/sbatch"}) {
      if (!std::filesystem::exists(tool)) {
        ADD_FAILURE() << tool << " is missing (scripts/setup.sh installs Debian's munge, slurmctld, slurmd and slurm-client)";
        return;
      }
    }
    char name[256] = {};
    ::gethostname(name, sizeof name - 1);
    node_ = std::string(name).substr(0, std::string(name).find('.'));
    if (::gethostbyname(node_.c_str()) == nullptr) {
      ADD_FAILURE() << "this host's name '" << node_ << "' does not resolve; a Slurm job's tasks reach each other by it";
      return;
    }
    remove_stale_clusters();
    // A short folder of its own: munge's socket path must fit in 108 bytes.
    std::string folder = std::string(kPrefix) + "XXXXXX";
    if (::mkdtemp(folder.data()) == nullptr) {
      ADD_FAILURE() << "mkdtemp: " << std::strerror(errno);
      return;
    }
    dir_ = folder;
    for (const char* sub : {"spool", "state"}) std::filesystem::create_directory(dir_ / sub);
    ok_ = start_munge() && start_slurm() && wait_until_idle();
  }
  ~SlurmCluster() {
    if (slurmctld_) {
      run({"/usr/bin/scancel", "--full", "--user", user()}, "scancel", std::chrono::seconds(20));
      run({"/usr/bin/scontrol", "shutdown"}, "shutdown", std::chrono::seconds(30));
      for (auto* process : {slurmd_.get(), slurmctld_.get()}) {
        if (process->wait(std::chrono::seconds(20)) < 0) process->signal(SIGTERM);
      }
    }
    if (munged_) munged_->signal(SIGTERM);
    for (auto* process : {slurmd_.get(), slurmctld_.get(), munged_.get()}) {
      if (process != nullptr) process->wait(std::chrono::seconds(10));
    }
    slurmd_.reset();  // SIGKILL and reap whatever is still there
    slurmctld_.reset();
    munged_.reset();
    std::error_code ec;
    if (!dir_.empty()) std::filesystem::remove_all(dir_, ec);
  }
  SlurmCluster(const SlurmCluster&) = delete;
  SlurmCluster& operator=(const SlurmCluster&) = delete;

  bool ok() const { return ok_; }
  const std::string& node() const { return node_; }
  const std::filesystem::path& dir() const { return dir_; }
  // argv under this cluster's configuration (SLURM_CONF), e.g. {"/usr/bin/sbatch", ...}.
  std::vector<std::string> command(std::vector<std::string> argv) const {
    argv.insert(argv.begin(), {"/usr/bin/env", "SLURM_CONF=" + (dir_ / "slurm.conf").string()});
    return argv;
  }
  // The jobs' states and what the daemons logged, for a failure's message.
  std::string logs() const {
    std::string out = "--- scontrol show job\n" + run_command(command({"/usr/bin/scontrol", "show", "job"}),
                                                          (dir_ / "jobs.out").string(), std::chrono::seconds(10)).output;
    for (const char* name : {"slurmctld.log", "slurmd.log", "munged.log"}) {
      std::ifstream in(dir_ / name);
      std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      out += std::string("--- ") + name + " (last 3000 bytes)\n" + text.substr(text.size() > 3000 ? text.size() - 3000 : 0);
    }
    return out;
  }

 private:
  static constexpr const char* kPrefix = "/tmp/loco-slurm-";
  // What a killed test left: its daemons ended with it (pdeathsig), but a job step's slurmstepd,
  // which slurmd had detached, waits for its controller forever. Such a process (it holds its
  // cluster's slurmd.log open) and the folder go when no slurmctld of that folder runs.
  static void remove_stale_clusters() {
    namespace fs = std::filesystem;
    std::error_code ec;
    for (const auto& folder : fs::directory_iterator("/tmp", ec)) {
      const auto path = folder.path().string();
      if (path.rfind(kPrefix, 0) != 0 || !processes_mentioning("--key-file=" + path + "/").empty()) continue;
      for (const auto& process : fs::directory_iterator("/proc", ec)) {
        std::error_code fd_error;
        for (const auto& fd : fs::directory_iterator(process.path() / "fd", fd_error)) {
          if (fs::read_symlink(fd.path(), fd_error).string().rfind(path + "/", 0) != 0) continue;
          const int pid = std::atoi(process.path().filename().c_str());
          if (pid > 0 && pid != ::getpid()) ::kill(pid, SIGKILL);
          break;
        }
      }
      fs::remove_all(folder.path(), ec);
    }
  }
  // Job ids of this cluster start anywhere in [1000, 101000): a job's id picks its coordinator's
  // port in scripts/loco.sbatch, and two clusters of concurrent tests must not pick the same.
  static int64_t first_job_id() { return 1000 + static_cast<int64_t>(std::random_device{}() % 100000); }
  static std::string user() {
    const passwd* entry = ::getpwuid(::geteuid());
    return entry != nullptr ? entry->pw_name : "root";
  }
  bool run(const std::vector<std::string>& argv, const std::string& what, std::chrono::seconds timeout) const {
    const auto result = run_command(command(argv), (dir_ / (what + ".out")).string(), timeout);
    if (result.status != 0) ADD_FAILURE() << what << " failed (status " << result.status << "): " << result.output;
    return result.status == 0;
  }
  // A daemon in the foreground that gets SIGTERM when the test's process ends, however it ends.
  std::unique_ptr<Child> daemon(const std::vector<std::string>& argv, const std::string& name) const {
    std::vector<std::string> full = {"/usr/bin/setpriv", "--pdeathsig", "TERM", "--"};
    const auto configured = command(argv);
    full.insert(full.end(), configured.begin(), configured.end());
    return std::make_unique<Child>(full, (dir_ / (name + ".out")).string());
  }
  bool start_munge() {
    const auto key = dir_ / "munge.key";
    {
      std::ofstream out(key, std::ios::binary);
      std::random_device random;
      for (int i = 0; i < 1024; ++i) out.put(static_cast<char>(random()));
    }
    std::filesystem::permissions(key, std::filesystem::perms::owner_read);
    const auto socket = dir_ / "munge.socket";
    munged_ = daemon({"/usr/sbin/munged", "--foreground", "--force", "--key-file=" + key.string(), "--socket=" + socket.string(),
                      "--pid-file=" + (dir_ / "munged.pid").string(), "--log-file=" + (dir_ / "munged.log").string(),
                      "--seed-file=" + (dir_ / "munged.seed").string()},
                     "munged");
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (!std::filesystem::exists(socket) && std::chrono::steady_clock::now() < deadline) {
      if (munged_->wait(std::chrono::seconds(0)) >= 0) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    if (!std::filesystem::exists(socket)) ADD_FAILURE() << "munged did not start within 20 s\n" << logs();
    return std::filesystem::exists(socket);
  }
  bool start_slurm() {
    const int controller_port = free_port();
    int node_port = free_port();
    while (node_port == controller_port) node_port = free_port();
    const auto d = dir_.string();
    std::ofstream(dir_ / "slurm.conf")
        << "ClusterName=loco-test\nSlurmctldHost=" << node_ << "(127.0.0.1)\nSlurmctldPort=" << controller_port
        << "\nSlurmdPort=" << node_port << "\nAuthType=auth/munge\nCredType=cred/munge\nAuthInfo=socket=" << d
        << "/munge.socket\nSlurmUser=" << user() << "\nSlurmdUser=" << user() << "\nStateSaveLocation=" << d
        << "/state\nSlurmdSpoolDir=" << d << "/spool\nSlurmctldPidFile=" << d << "/slurmctld.pid\nSlurmdPidFile=" << d
        << "/slurmd.pid\nSlurmctldLogFile=" << d << "/slurmctld.log\nSlurmdLogFile=" << d << "/slurmd.log\n"
        << "ProctrackType=proctrack/pgid\nTaskPlugin=task/none\nJobAcctGatherType=jobacct_gather/none\n"
        << "AccountingStorageType=accounting_storage/none\nJobCompType=jobcomp/none\nMpiDefault=none\n"
        << "SwitchType=switch/none\nSchedulerType=sched/builtin\nSelectType=select/cons_tres\nSelectTypeParameters=CR_CPU\n"
        << "SlurmdParameters=config_overrides\nReturnToService=2\nFirstJobId=" << first_job_id() << "\nNodeName=" << node_
        << " NodeAddr=127.0.0.1 CPUs=8 State=UNKNOWN\nPartitionName=loco Nodes=" << node_
        << " Default=YES MaxTime=10 State=UP OverSubscribe=YES\n";
    slurmctld_ = daemon({"/usr/sbin/slurmctld", "-D", "-i"}, "slurmctld");
    slurmd_ = daemon({"/usr/sbin/slurmd", "-D", "-N", node_}, "slurmd");
    return true;
  }
  // The node registered and took jobs (sinfo says idle), within 60 s.
  bool wait_until_idle() {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    std::string state;
    while (std::chrono::steady_clock::now() < deadline) {
      if (slurmctld_->wait(std::chrono::seconds(0)) >= 0 || slurmd_->wait(std::chrono::seconds(0)) >= 0) break;
      state = run_command(command({"/usr/bin/sinfo", "--noheader", "--format=%T"}), (dir_ / "sinfo.out").string(),
                          std::chrono::seconds(10)).output;
      if (state.rfind("idle", 0) == 0) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
    }
    ADD_FAILURE() << "the Slurm node did not become idle within 60 s (sinfo: '" << state << "')\n" << logs();
    return false;
  }

  std::filesystem::path dir_;
  std::string node_;
  bool ok_ = false;
  std::unique_ptr<Child> munged_, slurmctld_, slurmd_;
};

}  // namespace loco::testing_util
