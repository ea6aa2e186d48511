#include "loco/metrics/progress.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <algorithm>
#include <cmath>

namespace loco::metrics {

Progress::Progress(int64_t first_step, int64_t total_steps, ProgressMode mode, std::FILE* out)
    : first_step_(first_step), total_steps_(total_steps), mode_(mode), out_(out),
      start_(std::chrono::steady_clock::now()), last_draw_() {}

Progress::Progress(int64_t first_step, int64_t total_steps, bool interactive, std::FILE* out)
    : Progress(first_step, total_steps, interactive ? ProgressMode::kBar : ProgressMode::kLines, out) {}

Progress::~Progress() { finish(); }

bool Progress::is_terminal(std::FILE* stream) { return ::isatty(::fileno(stream)) == 1; }

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const auto s = static_cast<int64_t>(std::llround(seconds));
  if (s >= 3600) return fmt::format("{}h{:02}m", s / 3600, (s % 3600) / 60);
  if (s >= 60) return fmt::format("{}m{:02}s", s / 60, s % 60);
  return fmt::format("{}s", s);
}

std::string format_bytes(double bytes) {
  const char* units[] = {"B", "kB", "MB", "GB", "TB"};
  int unit = 0;
  while (std::abs(bytes) >= 1000 && unit < 4) {
    bytes /= 1000;
    ++unit;
  }
  return unit == 0 ? fmt::format("{:.0f} B", bytes) : fmt::format("{:.{}f} {}", bytes, bytes < 10 ? 2 : 1, units[unit]);
}

void Progress::set_sync_totals(int64_t rounds, int64_t bytes_sent) {
  rounds_ = rounds;
  bytes_sent_ = bytes_sent;
}

std::string Progress::status_line(int64_t step, double loss, double tokens_per_s) const {
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const int64_t done = step - first_step_;
  const double eta = done > 0 ? elapsed / static_cast<double>(done) * static_cast<double>(total_steps_ - step) : NAN;
  std::string sync = rounds_ >= 0 ? fmt::format("  round {}, sent {}", rounds_, format_bytes(static_cast<double>(bytes_sent_))) : "";
  // No loss: the compute is emulated (train.emulated_step_s).
  const std::string shown = std::isnan(loss) ? "loss -" : fmt::format("loss {:.4f}", loss);
  return fmt::format("step {}/{}  {}  {:.0f} tok/s{}  elapsed {}  eta {}", step, total_steps_, shown, tokens_per_s, sync,
                     format_duration(elapsed), format_duration(eta));
}

std::string progress_line_json(const ProgressLine& line) {
  nlohmann::json j = nlohmann::json::object();
  if (line.progress) {
    const auto& p = *line.progress;
    nlohmann::json state = {{"step", p.step}, {"steps", p.steps}, {"loss", p.loss}, {"tokens_per_s", p.tokens_per_s}};
    if (p.round >= 0) {
      state["round"] = p.round;
      state["bytes_sent"] = p.bytes_sent;
    }
    j["progress"] = state;
  }
  if (line.message) j["message"] = *line.message;
  return j.dump();
}

std::optional<ProgressLine> parse_progress_line(std::string_view text) {
  if (text.empty() || text.front() != '{') return std::nullopt;
  const auto j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return std::nullopt;
  ProgressLine line;
  const auto progress = j.find("progress");
  if (progress != j.end() && progress->is_object()) {
    const auto number = [&](const char* key, double otherwise) {
      const auto it = progress->find(key);
      return it != progress->end() && it->is_number() ? it->get<double>() : otherwise;
    };
    const auto integer = [&](const char* key, int64_t otherwise) {
      const auto it = progress->find(key);
      return it != progress->end() && it->is_number_integer() ? it->get<int64_t>() : otherwise;
    };
    line.progress = ProgressReport{integer("step", 0), integer("steps", 0), number("loss", NAN),
                                   number("tokens_per_s", 0), integer("round", -1), integer("bytes_sent", 0)};
  }
  const auto message = j.find("message");
  if (message != j.end() && message->is_string()) line.message = message->get<std::string>();
  if (!line.progress && !line.message) return std::nullopt;
  return line;
}

void Progress::update(int64_t step, double loss, double tokens_per_s, bool log_line) {
  if (mode_ == ProgressMode::kJson) {
    if (!log_line) return;
    const ProgressReport report{step, total_steps_, loss, tokens_per_s, rounds_, rounds_ >= 0 ? bytes_sent_ : 0};
    fmt::print(out_, "{}\n", progress_line_json({report, std::nullopt}));
    std::fflush(out_);
    return;
  }
  if (mode_ == ProgressMode::kLines) {
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
  if (mode_ == ProgressMode::kJson) {
    fmt::print(out_, "{}\n", progress_line_json({std::nullopt, text}));
    std::fflush(out_);
    return;
  }
  if (mode_ == ProgressMode::kBar && bar_drawn_) fmt::print(out_, "\r\033[K");
  fmt::print(out_, "{}\n", text);
  bar_drawn_ = false;
  std::fflush(out_);
}

void Progress::finish() {
  if (mode_ == ProgressMode::kBar && bar_drawn_) {
    fmt::print(out_, "\n");
    std::fflush(out_);
  }
  bar_drawn_ = false;
}

}  // namespace loco::metrics
