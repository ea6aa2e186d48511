// Running another program (npm, tar, gnuplot, groff): no shell, stdin from /dev/null, stdout and
// stderr into a log file (or stdout into a file of its own), bounded in time.
#pragma once

#include <chrono>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace loco {

struct CommandResult {
  int exit_code = 0;   // valid when signal == 0
  int signal = 0;      // the signal that killed it, or 0
  std::string output;  // stdout and stderr together (the tail); stderr alone with CommandStreams::stdout_file
};

// Where a command's output goes besides the log file.
struct CommandStreams {
  // When set, stdout is written to this file alone (whole, for the caller to read) and the log file
  // gets only stderr, so that a program's warnings never mix with the text it produces.
  std::filesystem::path stdout_file;
};

// `word` as a POSIX shell reads it back: as is when it holds only letters, digits and -_./=:,+@%,
// else in single quotes (a quote inside as '\''). For hints that are commands to paste.
std::string shell_word(std::string_view word);
// The command line as one string, for messages, each argument a shell_word.
std::string join_argv(const std::vector<std::string>& argv);

// Runs argv (found on the PATH) and waits at most `timeout` (then kills it). Throws Error from
// `module`, with `hint`, when the program cannot be started or times out. Safe to call from several
// threads at once, with different files.
CommandResult run_command(std::string_view module, std::chrono::seconds timeout, const std::vector<std::string>& argv,
                          const std::filesystem::path& log_file, std::string_view hint,
                          const CommandStreams& streams = {});

// Throws Error from `module` naming `what`, how it ended and its output, unless it exited 0.
void check_command_result(const CommandResult& result, std::string_view module, std::string_view what, std::string_view hint);

}  // namespace loco
