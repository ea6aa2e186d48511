#include "command.h"

#include <fmt/format.h>

#include <csignal>

#include "loco/core/command.h"
#include "loco/core/environment.h"
#include "loco/core/error.h"
#include "loco/core/run_folder.h"

namespace loco::cli {
namespace {

std::atomic<bool> g_stop{false};
std::atomic<int> g_interrupts{0};

void on_stop(int) {
  g_stop.store(true);
  std::signal(SIGINT, SIG_DFL);
  std::signal(SIGTERM, SIG_DFL);
}

void on_interrupt(int) { g_interrupts.fetch_add(1); }

void install(void (*handler)(int)) {
  std::signal(SIGINT, handler);
  std::signal(SIGTERM, handler);
}

}  // namespace

void install_stop_handler() { install(on_stop); }
const std::atomic<bool>& stop_requested() { return g_stop; }
void install_interrupt_counter() { install(on_interrupt); }
const std::atomic<int>& interrupts() { return g_interrupts; }
void ignore_broken_pipes() { std::signal(SIGPIPE, SIG_IGN); }

std::vector<std::string> collect_overrides(const std::vector<std::string>& extras) {
  std::vector<std::string> out;
  for (size_t i = 0; i < extras.size(); ++i) {
    std::string arg = extras[i];
    if (!arg.starts_with("--") || arg.find('.') == std::string::npos) {
      throw ConfigError("cli", fmt::format("unexpected argument '{}'; config overrides look like --section.key=value "
                                           "(e.g. --train.steps=100)", arg));
    }
    arg = arg.substr(2);
    if (arg.find('=') == std::string::npos) {
      if (i + 1 >= extras.size()) throw ConfigError("cli", fmt::format("--{} needs a value", arg));
      arg += "=" + extras[++i];
    }
    out.push_back(arg);
  }
  return out;
}

int Command::check() const {
  std::string config_file;
  if (const auto* option = cmd->get_option_no_throw("--config"); option != nullptr && option->count() > 0) {
    config_file = option->as<std::string>();
  }
  const auto overrides = cmd->get_allow_extras() ? collect_overrides(cmd->remaining()) : std::vector<std::string>{};
  if (!config_file.empty()) {
    runtime::load_config(config_file, overrides);
  } else {
    runtime::RunConfig config;
    for (const auto& o : overrides) runtime::apply_override(config, o);
  }
  fmt::print("check: `loco {}` parses{}\n", cmd->get_name(), config_file.empty() ? "" : ", and its config loads");
  return 0;
}

std::string run_config_file(const std::string& given, bool resume, const std::vector<std::string>& overrides,
                            const std::string& command) {
  if (!given.empty()) return given;
  std::string run_dir;
  for (const auto& o : overrides) {
    if (o.starts_with("run.dir=")) run_dir = o.substr(8);
  }
  if (!resume || run_dir.empty()) {
    throw ConfigError("cli", fmt::format("--config is required: a TOML run config (docs/configuration.md); to continue a "
                                         "run, `loco {} --resume --run.dir=RUN` reads the config RUN started with",
                                         command));
  }
  const auto saved = RunFolder(run_dir).config();
  if (!std::filesystem::exists(saved)) {
    throw ConfigError("cli", fmt::format("--resume --run.dir={}: {} does not exist, so no run was started there (or it "
                                         "never got as far as its first worker); pass --config",
                                         run_dir, saved.string()));
  }
  return saved.string();
}

std::string resume_command(const std::string& command, const std::string& run_dir) {
  return fmt::format("loco {} --resume --run.dir={}", command, shell_word(run_dir));
}

runtime::RunConfig load_config_with(const std::string& file, CLI::App* cmd, std::vector<std::string> more) {
  auto overrides = collect_overrides(cmd->remaining());
  overrides.insert(overrides.end(), more.begin(), more.end());
  return runtime::load_config(file, overrides);
}

metrics::ProgressMode progress_mode(const std::string& name) {
  if (name == "json") return metrics::ProgressMode::kJson;
  if (name == "lines") return metrics::ProgressMode::kLines;
  if (name == "bar") return metrics::ProgressMode::kBar;
  return metrics::Progress::is_terminal(stderr) ? metrics::ProgressMode::kBar : metrics::ProgressMode::kLines;
}

std::filesystem::path default_cache_dir() {
  const auto env = read_environment();
  if (env.cache_dir) return *env.cache_dir;
  if (env.home) return *env.home / ".cache" / "loco";
  return ".loco-cache";
}

void print_warnings(const runtime::RunConfig& config) {
  for (const auto& warning : runtime::config_warnings(config)) fmt::print(stderr, "warning: {}\n", warning);
}

}  // namespace loco::cli
