// The launchers' child processes (launcher.cpp, dipaco_launch.cpp): started with their output on
// pipes, read line by line, their exit statuses decoded.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>
#include <cmath>

namespace loco::runtime {

struct WorkerProcess {
  int64_t rank = 0;
  pid_t pid = -1;
  int out_fd = -1, err_fd = -1;       // its stdout (JSON progress) and stderr
  std::string out_buffer, err_buffer;
  std::optional<int> exit_code;
  // Its latest progress.
  int64_t step = 0, steps = 0, round = -1, bytes_sent = 0;
  double loss = NAN, tokens_per_s = 0;
};

// 128 + the signal for a process killed by one.
int decode_status(int raw);

// Starts `argv` with stdout and stderr on pipes, in its own process group (so a Ctrl-C at the
// terminal reaches only the launcher, which decides), told to stop if the launcher dies; with
// `netns_fd` >= 0, inside that network namespace (an emulated island, islands.h).
WorkerProcess spawn(int64_t rank, const std::vector<std::string>& argv, int64_t local_processes, int netns_fd = -1);

// Splits complete lines off `buffer` after appending what `fd` has; returns false at end of file.
bool read_lines(int fd, std::string& buffer, std::vector<std::string>& lines);

}  // namespace loco::runtime
