// What every `loco` subcommand shares: the Command interface main.cpp dispatches to, the signal
// flags (the only process-global state, and it lives here, not in the library), config overrides
// from the command line, and the progress mode.
//
// Each command family is one file that adds its commands to the app:
//   data_commands.cpp       prepare, tokenize, config, plan, route
//   train_commands.cpp      train, launch, worker, path-worker, coordinator
//   inference_commands.cpp  eval, generate
//   tool_commands.cpp       report, simulate, link-check
#pragma once

#include <CLI/CLI.hpp>

#include <atomic>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "loco/metrics/progress.h"
#include "loco/runtime/config/config.h"

namespace loco::cli {

// One subcommand: its constructor declares the options on `cmd`, run() does the work and returns
// the exit status (0 done, 1 bad input, 2 a peer failed, 3 a bug, 130 interrupted).
class Command {
 public:
  virtual ~Command() = default;
  virtual int run() = 0;
  // With LOCO_CHECK_ONLY set, instead of run(): the command line parsed, its --config (if any)
  // loaded with its --section.key=value overrides and validated, and nothing else done. What the
  // docs-commands test runs every command of the README and docs/ through.
  int check() const;
  bool parsed() const { return cmd != nullptr && cmd->parsed(); }

 protected:
  CLI::App* cmd = nullptr;
};

using Commands = std::vector<std::unique_ptr<Command>>;

void add_data_commands(CLI::App& app, Commands& commands);
void add_train_commands(CLI::App& app, Commands& commands);
void add_inference_commands(CLI::App& app, Commands& commands);
void add_tool_commands(CLI::App& app, Commands& commands);

// A stop asked by SIGINT or SIGTERM: the first one lets the step finish and checkpoint; a second
// one terminates (the default action is restored).
void install_stop_handler();
const std::atomic<bool>& stop_requested();
// `loco launch` counts them instead: the launcher stops its workers on the first, kills on the second.
void install_interrupt_counter();
const std::atomic<int>& interrupts();
// A process that talks to peers (a worker, a coordinator, a launcher) ignores SIGPIPE: a write to
// a peer that died fails with EPIPE, which becomes the peer's failure (PeerError), instead of
// killing the process. (Its children inherit it: an ignored signal stays ignored across exec.)
void ignore_broken_pipes();

// "--section.key=value" or "--section.key value" -> "section.key=value". Throws ConfigError on
// anything else.
std::vector<std::string> collect_overrides(const std::vector<std::string>& extras);

// The run config a training command reads: `given` (--config), or without it, when resuming with
// a run.dir among `overrides`, that run's own RUN/config.toml (what its first process resolved).
// Throws ConfigError naming what to pass otherwise.
std::string run_config_file(const std::string& given, bool resume, const std::vector<std::string>& overrides,
                            const std::string& command);
// The command that continues the run in `run_dir` (for hints): `loco COMMAND --resume --run.dir=R`.
std::string resume_command(const std::string& command, const std::string& run_dir);

// The config file with the command line's overrides (its extras), as every command loads it.
runtime::RunConfig load_config_with(const std::string& file, CLI::App* cmd, std::vector<std::string> more = {});

// auto, bar, lines or json; auto: a bar on a terminal, else lines.
metrics::ProgressMode progress_mode(const std::string& name);

// Where npm packages are cached: $LOCO_CACHE, ~/.cache/loco, or .loco-cache.
std::filesystem::path default_cache_dir();

// The config's warnings (config_warnings), on stderr.
void print_warnings(const runtime::RunConfig& config);

}  // namespace loco::cli
