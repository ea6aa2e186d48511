#include "loco/runtime/launch/supervisor.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "loco/core/error.h"

namespace loco::runtime {
namespace {

// Splits complete lines off `buffer` after appending what `fd` has; false at end of file (the
// unfinished last line, if any, is returned then).
bool read_lines(int fd, std::string& buffer, std::vector<std::string>& lines) {
  char chunk[65536];
  const ssize_t n = ::read(fd, chunk, sizeof chunk);
  if (n <= 0) {
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return true;
    if (!buffer.empty()) lines.push_back(std::move(buffer));
    buffer.clear();
    return false;
  }
  buffer.append(chunk, static_cast<size_t>(n));
  size_t start = 0;
  for (size_t end; (end = buffer.find('\n', start)) != std::string::npos; start = end + 1) {
    lines.push_back(buffer.substr(start, end - start));
  }
  buffer.erase(0, start);
  return true;
}

}  // namespace

int decode_status(int raw) {
  if (WIFEXITED(raw)) return WEXITSTATUS(raw);
  if (WIFSIGNALED(raw)) return 128 + WTERMSIG(raw);
  return -1;
}

std::string describe_exit(int code) {
  switch (code) {
    case 0: return "status 0 (finished)";
    case 1: return "status 1 (bad input or environment: its error is above)";
    case 2: return "status 2 (a peer or the coordinator failed: its error is above)";
    case 3: return "status 3 (a bug in loco: its error is above)";
    case 130: return "status 130 (interrupted: it saved its state)";
    case 128 + SIGKILL:
      return "status 137 (killed by SIGKILL: by hand, by a scheduler, or by the kernel's out-of-memory killer, which `dmesg` "
             "names; it saved nothing since its last checkpoint)";
    case 128 + SIGSEGV: return "status 139 (killed by SIGSEGV: a crash, a bug in loco or a library)";
    case 128 + SIGABRT: return "status 134 (aborted: a crash, a bug in loco or a library)";
    case 128 + SIGTERM: return "status 143 (terminated by SIGTERM before it could save its state)";
    default: break;
  }
  if (code > 128 && code < 128 + 65) return fmt::format("status {} (killed by signal {}: {})", code, code - 128, strsignal(code - 128));
  return fmt::format("status {}", code);
}

Supervisor::Supervisor(int64_t local_processes, Clock::duration grace) : local_processes_(local_processes), grace_(grace) {}

Supervisor::~Supervisor() {
  kill_all();
  for (auto& child : children_) {
    if (!child.exit_code) ::waitpid(child.pid, nullptr, 0);
    close_pipes(child);
  }
}

pid_t Supervisor::start(int64_t rank, const std::vector<std::string>& argv, const Placement& where) {
  int out_pipe[2], err_pipe[2];
  if (::pipe2(out_pipe, O_CLOEXEC) != 0) {
    throw Error("launch", fmt::format("cannot create pipes for worker {}: {}", rank, std::strerror(errno)));
  }
  if (::pipe2(err_pipe, O_CLOEXEC) != 0) {
    ::close(out_pipe[0]);
    ::close(out_pipe[1]);
    throw Error("launch", fmt::format("cannot create pipes for worker {}: {}", rank, std::strerror(errno)));
  }
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) throw Error("launch", fmt::format("cannot start worker {}: {}", rank, std::strerror(errno)));
  if (pid == 0) {
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != parent) ::_exit(1);  // the launcher died before prctl took effect
    if (where.netns_fd >= 0 && ::setns(where.netns_fd, CLONE_NEWNET) != 0) {
      fmt::print(stderr, "cannot enter worker {}'s island: {}\n", rank, std::strerror(errno));
      ::_exit(126);
    }
    if (!where.cpu_procs_file.empty()) {
      const auto pid = std::to_string(::getpid());
      const int fd = ::open(where.cpu_procs_file.c_str(), O_WRONLY | O_CLOEXEC);
      if (fd < 0 || ::write(fd, pid.data(), pid.size()) != static_cast<ssize_t>(pid.size())) {
        fmt::print(stderr, "cannot take worker {}'s CPU share ({}): {}\n", rank, where.cpu_procs_file, std::strerror(errno));
        ::_exit(126);
      }
      ::close(fd);
    }
    ::dup2(out_pipe[1], 1);
    ::dup2(err_pipe[1], 2);
    ::setenv("LOCO_LOCAL_PROCESSES", std::to_string(local_processes_).c_str(), 1);
    for (const auto& [name, value] : where.environment) ::setenv(name.c_str(), value.c_str(), 1);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execv(args[0], args.data());
    fmt::print(stderr, "cannot run {}: {}\n", argv[0], std::strerror(errno));
    ::_exit(127);
  }
  ::close(out_pipe[1]);
  ::close(err_pipe[1]);
  children_.push_back({rank, pid, out_pipe[0], err_pipe[0], {}, {}, std::nullopt});
  return pid;
}

std::vector<ChildLine> Supervisor::read(std::chrono::milliseconds wait) {
  std::vector<pollfd> fds;
  std::vector<std::pair<size_t, bool>> owners;  // (child, is stdout)
  for (size_t i = 0; i < children_.size(); ++i) {
    if (children_[i].out_fd >= 0) fds.push_back({children_[i].out_fd, POLLIN, 0}), owners.emplace_back(i, true);
    if (children_[i].err_fd >= 0) fds.push_back({children_[i].err_fd, POLLIN, 0}), owners.emplace_back(i, false);
  }
  std::vector<ChildLine> out;
  if (fds.empty()) {
    ::poll(nullptr, 0, static_cast<int>(wait.count()));
    return out;
  }
  ::poll(fds.data(), fds.size(), static_cast<int>(wait.count()));
  for (size_t f = 0; f < fds.size(); ++f) {
    if (!(fds[f].revents & (POLLIN | POLLHUP | POLLERR))) continue;
    auto& child = children_[owners[f].first];
    const bool is_out = owners[f].second;
    int& fd = is_out ? child.out_fd : child.err_fd;
    std::vector<std::string> lines;
    if (!read_lines(fd, is_out ? child.out_buffer : child.err_buffer, lines)) {
      ::close(fd);
      fd = -1;
    }
    for (auto& text : lines) out.push_back({child.rank, is_out, std::move(text)});
  }
  return out;
}

std::vector<ChildExit> Supervisor::reap() {
  std::vector<ChildExit> out;
  for (auto& child : children_) {
    int raw = 0;
    if (child.exit_code || ::waitpid(child.pid, &raw, WNOHANG) != child.pid) continue;
    child.exit_code = decode_status(raw);
    out.push_back({child.rank, child.pid, *child.exit_code});
  }
  return out;
}

std::vector<ChildLine> Supervisor::drain() {
  std::vector<ChildLine> out;
  for (auto& child : children_) {
    for (const bool is_out : {true, false}) {
      int& fd = is_out ? child.out_fd : child.err_fd;
      std::vector<std::string> lines;
      while (fd >= 0 && read_lines(fd, is_out ? child.out_buffer : child.err_buffer, lines)) {
      }
      for (auto& text : lines) out.push_back({child.rank, is_out, std::move(text)});
    }
    close_pipes(child);
  }
  return out;
}

void Supervisor::stop_all(int sig) { stop_all(sig, grace_); }

void Supervisor::stop_all(int sig, Clock::duration grace) {
  stopping_ = true;
  for (const auto& child : children_) {
    if (!child.exit_code) ::kill(child.pid, sig);
  }
  const auto at = Clock::now() + grace;
  kill_at_ = kill_at_ ? std::min(*kill_at_, at) : at;
}

void Supervisor::kill_all() {
  for (const auto& child : children_) {
    if (!child.exit_code) ::kill(child.pid, SIGKILL);
  }
  kill_at_.reset();
}

bool Supervisor::interrupt(int count) {
  if (count <= interrupts_) return false;
  interrupts_ = count;
  if (count == 1) {
    stop_all(SIGINT);
  } else {
    stopping_ = true;
    kill_all();
  }
  return true;
}

bool Supervisor::kill_when_overdue() {
  if (!kill_at_ || Clock::now() <= *kill_at_ || alive() == 0) return false;
  kill_all();
  return true;
}

int64_t Supervisor::alive() const {
  return std::count_if(children_.begin(), children_.end(), [](const Child& c) { return !c.exit_code; });
}

std::vector<std::optional<int>> Supervisor::exit_codes() const {
  std::vector<std::optional<int>> out;
  for (const auto& child : children_) out.push_back(child.exit_code);
  return out;
}

void Supervisor::close_pipes(Child& child) {
  for (int* fd : {&child.out_fd, &child.err_fd}) {
    if (*fd >= 0) ::close(*fd);
    *fd = -1;
  }
}

}  // namespace loco::runtime
