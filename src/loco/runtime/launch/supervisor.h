// The one process supervisor behind `loco launch` (launcher.h for dense runs, dipaco_launch.h for
// DiPaCo): starts the run's worker processes with their output on pipes, hands their lines back
// as they come, reaps them, and stops them: a stop asks every child (SIGINT or SIGTERM) and kills
// (SIGKILL) whoever is still running after a grace period; a second Ctrl-C kills at once. No child
// outlives the launcher: each is told to stop (SIGTERM) if the launcher dies, and the supervisor
// kills and reaps any still running when it is destroyed. What a run does with a line or an exit
// (restart, stop the others, go on) is the caller's policy.
//
// Not thread-safe: one thread drives it.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace loco::runtime {

// 128 + the signal for a process killed by one.
int decode_status(int raw);
// A loco process's exit status in words (docs/failure-model.md, "Exit status"), as
// "status 137 (killed by SIGKILL: ...)", for the launcher's messages.
std::string describe_exit(int code);

struct ChildLine {
  int64_t rank = 0;
  bool is_stdout = true;  // stdout (a worker's JSON progress) or stderr
  std::string text;       // without its newline
};

// Where a child runs: inside a network namespace (an emulated island's, islands.h; -1: this
// process's) and in a CPU control group (the file it writes its pid into, cpu_shares.h; "": none),
// with these variables added to the environment it inherits (secrets: config/secrets.h).
struct Placement {
  int netns_fd = -1;
  std::string cpu_procs_file;
  std::vector<std::pair<std::string, std::string>> environment;
};

struct ChildExit {
  int64_t rank = 0;
  pid_t pid = -1;
  int code = 0;  // the exit status, or 128 + the signal that killed it
};

class Supervisor {
 public:
  using Clock = std::chrono::steady_clock;

  // `local_processes`: the children on this machine (LOCO_LOCAL_PROCESSES, their thread budget);
  // `grace`: how long a child may take to stop after it was asked, before it is killed.
  Supervisor(int64_t local_processes, Clock::duration grace);
  ~Supervisor();
  Supervisor(const Supervisor&) = delete;
  Supervisor& operator=(const Supervisor&) = delete;

  // Starts `argv` as worker `rank`, in its own process group (a Ctrl-C at the terminal reaches only
  // the launcher, which decides), placed where `where` says before it runs. Returns its pid.
  // Throws Error when it cannot.
  pid_t start(int64_t rank, const std::vector<std::string>& argv, const Placement& where = {});

  // Waits up to `wait` for output, then returns every complete line the children wrote, in order.
  std::vector<ChildLine> read(std::chrono::milliseconds wait);
  // The children that exited since the last call.
  std::vector<ChildExit> reap();
  // After every child exited: what they left in their pipes (an error message, often).
  std::vector<ChildLine> drain();

  // Asks every running child to stop with `sig` (SIGINT: finish the step and save; SIGTERM), and
  // arms the kill after the grace period (or `grace`; the earliest kill asked stands).
  void stop_all(int sig);
  void stop_all(int sig, Clock::duration grace);
  // SIGKILL to every running child, now.
  void kill_all();
  // Ctrl-C number `count` (1, 2, ...) since the start: the first stops the children (SIGINT), a
  // later one kills them. Returns true when `count` is a new one.
  bool interrupt(int count);
  // Kills the children still running once the grace after stop_all() has passed; true when it did.
  bool kill_when_overdue();

  int64_t alive() const;
  bool stopping() const { return stopping_; }
  int interrupts() const { return interrupts_; }
  // Each process started, in start order: its exit status (nullopt while it runs).
  std::vector<std::optional<int>> exit_codes() const;

 private:
  struct Child {
    int64_t rank = 0;
    pid_t pid = -1;
    int out_fd = -1, err_fd = -1;
    std::string out_buffer, err_buffer;
    std::optional<int> exit_code;
  };
  void close_pipes(Child& child);

  int64_t local_processes_;
  Clock::duration grace_;
  std::vector<Child> children_;
  std::optional<Clock::time_point> kill_at_;
  bool stopping_ = false;
  int interrupts_ = 0;
};

}  // namespace loco::runtime
