// Progress display of a long job. On a terminal: one redrawn line with a bar, step, loss, tokens/s
// and ETA. Otherwise (a pipe, a log file, CI): plain lines, one per update() call marked `log_line`.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

namespace loco::metrics {

class Progress {
 public:
  // `interactive`: draw a bar (pass is_terminal(stderr)). Output goes to `out` (stderr by default).
  Progress(int64_t first_step, int64_t total_steps, bool interactive, std::FILE* out = stderr);
  ~Progress();

  // Reports the state after step `step` (1-based count of steps done). On a terminal the bar is
  // redrawn at most 10 times a second; otherwise a line is printed when `log_line` is set.
  void update(int64_t step, double loss, double tokens_per_s, bool log_line);
  // Prints a message on its own line (above the bar on a terminal).
  void message(const std::string& text);
  // Ends the bar's line.
  void finish();

  static bool is_terminal(std::FILE* stream);

 private:
  std::string status_line(int64_t step, double loss, double tokens_per_s) const;
  int64_t first_step_, total_steps_;
  bool interactive_;
  std::FILE* out_;
  bool bar_drawn_ = false;
  std::chrono::steady_clock::time_point start_, last_draw_;
};

// "1h02m", "3m05s", "42s"
std::string format_duration(double seconds);

}  // namespace loco::metrics
