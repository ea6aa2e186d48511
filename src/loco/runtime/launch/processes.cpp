#include "loco/runtime/launch/processes.h"

#include <fcntl.h>
#include <sched.h>
#include <fmt/format.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "loco/core/error.h"

namespace loco::runtime {

int decode_status(int raw) {
  if (WIFEXITED(raw)) return WEXITSTATUS(raw);
  if (WIFSIGNALED(raw)) return 128 + WTERMSIG(raw);
  return -1;
}

WorkerProcess spawn(int64_t rank, const std::vector<std::string>& argv, int64_t local_processes, int netns_fd) {
  int out_pipe[2], err_pipe[2];
  if (::pipe2(out_pipe, O_CLOEXEC) != 0 || ::pipe2(err_pipe, O_CLOEXEC) != 0) {
    throw Error("launch", fmt::format("cannot create pipes for worker {}: {}", rank, std::strerror(errno)));
  }
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) throw Error("launch", fmt::format("cannot start worker {}: {}", rank, std::strerror(errno)));
  if (pid == 0) {
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != parent) ::_exit(1);  // the launcher died before prctl took effect
    if (netns_fd >= 0 && ::setns(netns_fd, CLONE_NEWNET) != 0) {
      fmt::print(stderr, "cannot enter worker {}'s island: {}\n", rank, std::strerror(errno));
      ::_exit(126);
    }
    ::dup2(out_pipe[1], 1);
    ::dup2(err_pipe[1], 2);
    ::setenv("LOCO_LOCAL_PROCESSES", std::to_string(local_processes).c_str(), 1);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execv(args[0], args.data());
    fmt::print(stderr, "cannot run {}: {}\n", argv[0], std::strerror(errno));
    ::_exit(127);
  }
  ::close(out_pipe[1]);
  ::close(err_pipe[1]);
  WorkerProcess w;
  w.rank = rank;
  w.pid = pid;
  w.out_fd = out_pipe[0];
  w.err_fd = err_pipe[0];
  return w;
}

bool read_lines(int fd, std::string& buffer, std::vector<std::string>& lines) {
  char chunk[65536];
  const ssize_t n = ::read(fd, chunk, sizeof chunk);
  if (n <= 0) {
    if (!buffer.empty()) lines.push_back(std::move(buffer));
    buffer.clear();
    return n < 0 && (errno == EAGAIN || errno == EINTR);
  }
  buffer.append(chunk, static_cast<size_t>(n));
  size_t start = 0;
  for (size_t end; (end = buffer.find('\n', start)) != std::string::npos; start = end + 1) {
    lines.push_back(buffer.substr(start, end - start));
  }
  buffer.erase(0, start);
  return true;
}

}  // namespace loco::runtime
