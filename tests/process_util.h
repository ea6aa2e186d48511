// Running the loco binary from tests: capture output and exit status, or start it in the background
// and signal it. Every wait is bounded.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

namespace loco::testing_util {

struct CommandResult {
  int status = -1;     // exit code, or 128 + signal
  std::string output;  // stdout and stderr together
};

inline int decode_status(int raw) {
  if (WIFEXITED(raw)) return WEXITSTATUS(raw);
  if (WIFSIGNALED(raw)) return 128 + WTERMSIG(raw);
  return -1;
}

class Child {
 public:
  // Starts argv[0] with its output redirected to `log_path`.
  Child(const std::vector<std::string>& argv, const std::string& log_path) {
    pid_ = ::fork();
    if (pid_ == 0) {
      int fd = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      ::dup2(fd, 1);
      ::dup2(fd, 2);
      std::vector<char*> args;
      for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
      args.push_back(nullptr);
      ::execv(args[0], args.data());
      ::_exit(127);
    }
  }
  ~Child() {
    if (pid_ > 0 && !done_) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  pid_t pid() const { return pid_; }
  void signal(int sig) const { ::kill(pid_, sig); }
  // Exit status, or -1 if still running after `timeout` (the child is then killed).
  int wait(std::chrono::seconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      int raw = 0;
      if (::waitpid(pid_, &raw, WNOHANG) == pid_) {
        done_ = true;
        return decode_status(raw);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return -1;
  }

 private:
  pid_t pid_ = -1;
  bool done_ = false;
};

// Runs to completion (bounded by `timeout`), capturing stdout and stderr.
inline CommandResult run_command(const std::vector<std::string>& argv, const std::string& log_path,
                                 std::chrono::seconds timeout = std::chrono::seconds(300)) {
  Child child(argv, log_path);
  CommandResult result;
  result.status = child.wait(timeout);
  if (FILE* f = std::fopen(log_path.c_str(), "r")) {
    char buffer[4096];
    size_t n;
    while ((n = std::fread(buffer, 1, sizeof buffer, f)) > 0) result.output.append(buffer, n);
    std::fclose(f);
  }
  return result;
}

}  // namespace loco::testing_util
