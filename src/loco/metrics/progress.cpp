#include "loco/metrics/progress.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>

namespace loco::metrics {

Progress::Progress(int64_t first_step, int64_t total_steps, bool interactive, std::FILE* out)
    : first_step_(first_step), total_steps_(total_steps), interactive_(interactive), out_(out),
      start_(std::chrono::steady_clock::now()), last_draw_() {}

Progress::~Progress() { finish(); }

bool Progress::is_terminal(std::FILE* stream) { return ::isatty(::fileno(stream)) == 1; }

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const auto s = static_cast<int64_t>(std::llround(seconds));
  if (s >= 3600) return fmt::format("{}h{:02}m", s / 3600, (s % 3600) / 60);
  if (s >= 60) return fmt::format("{}m{:02}s", s / 60, s % 60);
  return fmt::format("{}s", s);
}

std::string Progress::status_line(int64_t step, double loss, double tokens_per_s) const {
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const int64_t done = step - first_step_;
  const double eta = done > 0 ? elapsed / static_cast<double>(done) * static_cast<double>(total_steps_ - step) : NAN;
  return fmt::format("step {}/{}  loss {:.4f}  {:.0f} tok/s  elapsed {}  eta {}", step, total_steps_, loss,
                     tokens_per_s, format_duration(elapsed), format_duration(eta));
}

void Progress::update(int64_t step, double loss, double tokens_per_s, bool log_line) {
  if (!interactive_) {
    if (log_line) fmt::print(out_, "{}\n", status_line(step, loss, tokens_per_s));
    std::fflush(out_);
    return;
  }
  const auto now = std::chrono::steady_clock::now();
  if (bar_drawn_ && step < total_steps_ && now - last_draw_ < std::chrono::milliseconds(100)) return;
  last_draw_ = now;
  constexpr int kWidth = 24;
  const double fraction = total_steps_ > 0 ? std::clamp(static_cast<double>(step) / static_cast<double>(total_steps_), 0.0, 1.0) : 1.0;
  const int filled = static_cast<int>(fraction * kWidth);
  fmt::print(out_, "\r\033[K[{}{}] {:3.0f}%  {}", std::string(static_cast<size_t>(filled), '#'),
             std::string(static_cast<size_t>(kWidth - filled), '.'), fraction * 100, status_line(step, loss, tokens_per_s));
  std::fflush(out_);
  bar_drawn_ = true;
}

void Progress::message(const std::string& text) {
  if (interactive_ && bar_drawn_) fmt::print(out_, "\r\033[K");
  fmt::print(out_, "{}\n", text);
  bar_drawn_ = false;
  std::fflush(out_);
}

void Progress::finish() {
  if (interactive_ && bar_drawn_) {
    fmt::print(out_, "\n");
    std::fflush(out_);
  }
  bar_drawn_ = false;
}

}  // namespace loco::metrics
