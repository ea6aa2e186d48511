// Progress display of a long job, in one of three forms:
//   kBar   on a terminal: one redrawn line with a bar, step, loss, tokens/s and ETA;
//   kLines otherwise (a pipe, a log file, CI): plain lines, one per update() marked `log_line`;
//   kJson  for `loco launch`, which merges its workers' progress: one JSON object per line,
//          {"progress": {...}} for updates and {"message": "..."} for messages.
#pragma once

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <string_view>

namespace loco::metrics {

enum class ProgressMode { kBar, kLines, kJson };

// kJson's lines, typed: written by Progress, read back by `loco launch` (parse_progress_line).
struct ProgressReport {
  int64_t step = 0, steps = 0;
  double loss = NAN, tokens_per_s = 0;
  int64_t round = -1, bytes_sent = 0;  // round -1: no synchronization yet (bytes_sent not shown)
};
struct ProgressLine {
  std::optional<ProgressReport> progress;  // {"progress": {...}}
  std::optional<std::string> message;      // {"message": "..."}
};
std::string progress_line_json(const ProgressLine& line);
// nullopt for a line that is not one of these (a worker's other output).
std::optional<ProgressLine> parse_progress_line(std::string_view text);

class Progress {
 public:
  Progress(int64_t first_step, int64_t total_steps, ProgressMode mode, std::FILE* out = stderr);
  // interactive: kBar, else kLines.
  Progress(int64_t first_step, int64_t total_steps, bool interactive, std::FILE* out = stderr);
  ~Progress();

  // Reports the state after step `step` (1-based count of steps done). As a bar it is redrawn at
  // most 10 times a second; as lines or JSON one is printed when `log_line` is set.
  void update(int64_t step, double loss, double tokens_per_s, bool log_line);
  // Synchronization totals shown from now on ("round 3, sent 75.2 MB"); rounds < 0 hides them.
  void set_sync_totals(int64_t rounds, int64_t bytes_sent);
  // Prints a message on its own line (above the bar on a terminal).
  void message(const std::string& text);
  // Ends the bar's line.
  void finish();

  static bool is_terminal(std::FILE* stream);

 private:
  std::string status_line(int64_t step, double loss, double tokens_per_s) const;
  int64_t first_step_, total_steps_;
  ProgressMode mode_;
  std::FILE* out_;
  bool bar_drawn_ = false;
  int64_t rounds_ = -1, bytes_sent_ = 0;
  std::chrono::steady_clock::time_point start_, last_draw_;
};

// "1h02m", "3m05s", "42s"
std::string format_duration(double seconds);
// "812 B", "75.2 kB", "1.31 GB" (powers of 1000)
std::string format_bytes(double bytes);

}  // namespace loco::metrics
