#include "loco/core/error.h"

#include <csignal>
#include <cstring>
#include <execinfo.h>
#include <unistd.h>

namespace loco {

void fail_check(const char* condition, const char* file, int line, const std::string& message) {
  throw InternalError("bug", fmt::format("check failed: {} ({}:{}): {}", condition, file, line, message));
}

namespace {

// Only async-signal-safe calls: write(2), backtrace_symbols_fd (backtrace() is primed in
// report_crashes(), so that it loads libgcc before any crash).
void on_crash(int signal) {
  const char* name = strsignal(signal);
  const char* lines[] = {"\nloco: crashed (", name != nullptr ? name : "signal", "); the stack:\n"};
  for (const char* line : lines) (void)!::write(STDERR_FILENO, line, std::strlen(line));
  void* frames[64];
  const int depth = ::backtrace(frames, 64);
  ::backtrace_symbols_fd(frames, depth, STDERR_FILENO);
  std::signal(signal, SIG_DFL);  // then die of it, with the status and core dump it would have had
  std::raise(signal);
}

}  // namespace

void report_crashes() {
  void* frame[1];
  (void)::backtrace(frame, 1);
  for (int signal : {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT}) {
    struct sigaction action {};
    action.sa_handler = on_crash;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESETHAND | SA_NODEFER;
    sigaction(signal, &action, nullptr);
  }
}

}  // namespace loco
