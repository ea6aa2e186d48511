// Errors of loco.
//
// Every message starts with the module it comes from, "[data] ...", and where it can, ends with a
// hint of what to do. Four kinds, kept apart on purpose:
//   - Error and its children: bad input or a bad environment (a malformed config, a corrupt file,
//     a missing folder). The user can fix these; the CLI prints them and exits non-zero.
//   - PeerError: a recoverable distributed failure (a peer died, a timeout). Caught where a
//     failure is recovered from, and nowhere else: the training loop (it saves the last consistent
//     state, runtime/worker/trainer.cpp); the elastic retry loops that convene a round again with
//     the workers left (algorithms/elastic_rounds.h, runtime/worker/elastic.cpp, and Streaming
//     DiLoCo's fragments, which keep the failure to report it when the fragment completes); the
//     elastic join loop, for RunStopping (a PeerError that means the run is stopping: a clean
//     end); and the CLI, which turns it into exit status 2.
//   - MembershipEnded: this worker's place in an elastic run ended under it (it was evicted, the
//     coordinator is gone, or the run continues from a checkpoint). Not a peer's failure: nothing
//     is retried or saved where it passes; it is caught in one place, where the worker joins.
//   - InternalError: a broken invariant, i.e. a bug in loco. Raised by LOCO_CHECK.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>
#include <string_view>

namespace loco {

class Error : public std::runtime_error {
 public:
  Error(std::string_view module, std::string_view message)
      : std::runtime_error(fmt::format("[{}] {}", module, message)), module_(module) {}
  const std::string& module() const { return module_; }

 private:
  std::string module_;
};

// A configuration key that is unknown, of the wrong type or out of range.
class ConfigError : public Error {
 public:
  using Error::Error;
};

// A file that is missing, truncated, corrupted or does not match what it is used with.
class DataError : public Error {
 public:
  using Error::Error;
};

// A recoverable failure of a remote peer (death, timeout, protocol violation).
class PeerError : public Error {
 public:
  using Error::Error;
};

// This worker's membership of an elastic run ended (see above); the algorithms define its kinds.
class MembershipEnded : public Error {
 public:
  using Error::Error;
};

// A broken invariant: a bug in loco, not in the user's input.
class InternalError : public Error {
 public:
  using Error::Error;
};

[[noreturn]] void fail_check(const char* condition, const char* file, int line, const std::string& message);

// From now on a crash (SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT) writes the signal and the stack
// of the thread that crashed to stderr before the process dies of that signal as it would have:
// a crash where no debugger runs (a lent GPU machine, a user's cluster) still says where it was.
void report_crashes();

}  // namespace loco

// LOCO_CHECK(cond, fmt, args...) throws InternalError when cond is false. For invariants only:
// user input is validated with explicit errors of the types above.
#define LOCO_CHECK(cond, ...)                                                    \
  do {                                                                           \
    if (!(cond)) ::loco::fail_check(#cond, __FILE__, __LINE__, fmt::format(__VA_ARGS__)); \
  } while (false)
