// Running the loco binary from tests: capture output and exit status, or start it in the background
// and signal it. Every wait is bounded.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
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
  // Starts argv[0] with its output redirected to `log_path`; in the network namespace `netns_fd`
  // (an emulated island's, runtime/launch/islands.h) when one is given.
  Child(const std::vector<std::string>& argv, const std::string& log_path, int netns_fd = -1) {
    pid_ = ::fork();
    if (pid_ == 0) {
      if (netns_fd >= 0 && ::setns(netns_fd, CLONE_NEWNET) != 0) ::_exit(126);
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
  // Exit status, or -1 if still running after `timeout` (0: just look).
  int wait(std::chrono::seconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      int raw = 0;
      if (done_) return status_;
      if (::waitpid(pid_, &raw, WNOHANG) == pid_) {
        done_ = true;
        status_ = decode_status(raw);
        return status_;
      }
      if (std::chrono::steady_clock::now() >= deadline) return -1;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }

 private:
  pid_t pid_ = -1;
  bool done_ = false;
  int status_ = -1;
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

// A port nothing listens on right now.
inline int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address);
  socklen_t length = sizeof address;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length);
  ::close(fd);
  return ntohs(address.sin_port);
}

// A TCP connection to 127.0.0.1:port (blocking), from `from` when given, or -1.
inline int connect_loopback(int port, const char* from = nullptr) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  if (from != nullptr) {  // another loopback address (127.0.0.0/8) as the source
    const int late = 1;  // its port chosen at connect(): ports in TIME_WAIT are reused, as without bind()
    ::setsockopt(fd, IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, &late, sizeof late);
    sockaddr_in source{};
    source.sin_family = AF_INET;
    if (::inet_pton(AF_INET, from, &source.sin_addr) != 1 ||
        ::bind(fd, reinterpret_cast<sockaddr*>(&source), sizeof source) != 0) {
      ::close(fd);
      return -1;
    }
  }
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// Processes whose command line mentions `fragment` (to prove that none outlives a run).
inline std::vector<pid_t> processes_mentioning(const std::string& fragment) {
  std::vector<pid_t> out;
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    const std::string name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream in(entry.path() / "cmdline");
    std::string cmdline((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::replace(cmdline.begin(), cmdline.end(), '\0', ' ');
    if (cmdline.find(fragment) != std::string::npos && std::stoi(name) != ::getpid()) out.push_back(std::stoi(name));
  }
  return out;
}

// What each of `pids` is and where it waits (its command line, state and each thread's kernel wait
// channel), to say why a process outlived its test.
inline std::string describe_processes(const std::vector<pid_t>& pids) {
  std::string out;
  auto read = [](const std::filesystem::path& file) {
    std::ifstream in(file);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::replace(text.begin(), text.end(), '\0', ' ');
    return text;
  };
  for (const pid_t pid : pids) {
    const auto dir = std::filesystem::path("/proc") / std::to_string(pid);
    out += "pid " + std::to_string(pid) + ": " + read(dir / "cmdline").substr(0, 300) + "\n  stat: " + read(dir / "stat").substr(0, 120);
    std::error_code ec;
    for (const auto& task : std::filesystem::directory_iterator(dir / "task", ec)) {
      out += "\n  thread " + task.path().filename().string() + " " + read(task.path() / "comm") + " waits in " + read(task.path() / "wchan");
    }
    out += "\n";
  }
  return out;
}

}  // namespace loco::testing_util
