#include "loco/core/command.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <thread>

#include "loco/core/error.h"
#include "loco/core/files.h"

extern char** environ;

namespace loco {

std::string shell_word(std::string_view word) {
  const bool plain = !word.empty() && std::all_of(word.begin(), word.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) != 0 || std::string_view("-_./=:,+@%").find(c) != std::string_view::npos;
  });
  if (plain) return std::string(word);
  std::string out = "'";
  for (const char c : word) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

std::string join_argv(const std::vector<std::string>& argv) {
  std::string out;
  for (const auto& a : argv) out += (out.empty() ? "" : " ") + shell_word(a);
  return out;
}

CommandResult run_command(std::string_view module, std::chrono::seconds timeout, const std::vector<std::string>& argv,
                          const std::filesystem::path& log_file, std::string_view hint,
                          const CommandStreams& streams) {
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);

  // The output files are opened here, never through a link planted at their names, so that a
  // refusal names the file (in the child it would read as the tool failing to start).
  auto open_output = [&](const std::filesystem::path& file) {
    const int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0) {
      throw Error(module, fmt::format("cannot open {} for `{}`'s output: {}", file.string(), join_argv(argv),
                                      errno == ELOOP ? "it is a symbolic link, which loco does not follow" : std::strerror(errno)));
    }
    return fd;
  };
  const int out = open_output(streams.stdout_file.empty() ? log_file : streams.stdout_file);
  int err = out;
  if (!streams.stdout_file.empty()) {
    try {
      err = open_output(log_file);
    } catch (...) {
      ::close(out);
      throw;
    }
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, out, 1);  // (dup2 leaves the copies open in the tool)
  posix_spawn_file_actions_adddup2(&actions, err, 2);
  pid_t pid = 0;
  int rc = posix_spawnp(&pid, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  ::close(out);
  if (err != out) ::close(err);
  if (rc != 0) {
    throw Error(module, fmt::format("cannot run `{}`: {}. hint: {}", join_argv(argv), std::strerror(rc), hint));
  }

  auto deadline = std::chrono::steady_clock::now() + timeout;
  int status = 0;
  while (true) {
    pid_t done = ::waitpid(pid, &status, WNOHANG);
    if (done == pid) break;
    if (done < 0 && errno != EINTR) {
      throw InternalError(module, fmt::format("waitpid for `{}` failed: {}", join_argv(argv), std::strerror(errno)));
    }
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      throw Error(module, fmt::format("`{}` did not finish within {} s. hint: {}", join_argv(argv), timeout.count(), hint));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }

  CommandResult result;
  if (WIFSIGNALED(status)) {
    result.signal = WTERMSIG(status);
  } else {
    result.exit_code = WEXITSTATUS(status);
  }
  std::error_code ec;
  if (std::filesystem::exists(log_file, ec)) {
    std::string out = read_file(log_file, module);
    constexpr size_t kTail = 2000;
    if (out.size() > kTail) out = "..." + out.substr(out.size() - kTail);
    while (!out.empty() && std::isspace(static_cast<unsigned char>(out.back()))) out.pop_back();
    result.output = out;
  }
  return result;
}

void check_command_result(const CommandResult& result, std::string_view module, std::string_view what, std::string_view hint) {
  if (result.signal == 0 && result.exit_code == 0) return;
  std::string how =
      result.signal != 0 ? fmt::format("killed by signal {}", result.signal) : fmt::format("exit {}", result.exit_code);
  throw Error(module, fmt::format("{} failed ({}): {}\nhint: {}", what, how,
                                  result.output.empty() ? std::string("(no output)") : result.output, hint));
}

}  // namespace loco
