// loco: train language models across poorly connected machines (docs/architecture.md). This file
// dispatches: each command family is in a file of its own (command.h lists them), and the work is
// in the runtime, where tests reach it without a process.
//
// Exit status (docs/failure-model.md, "Exit status"): 0 done, 1 bad input or environment (a
// command line that does not parse included), 2 a peer or the coordinator failed, 3 a bug, 130
// interrupted (state saved).
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <c10/util/Exception.h>

#include "command.h"
#include "loco/comm/group.h"
#include "loco/core/allocator.h"
#include "loco/core/environment.h"
#include "loco/core/error.h"

namespace {

// Runs `command`, turning what it throws into the exit status above.
template <class F>
int exit_status_of(F&& command) {
  try {
    return command();
  } catch (const loco::PeerError& e) {
    // A peer or the coordinator failed or could not be reached: not the user's input.
    fmt::print(stderr, "error: {}\n", e.what());
    return 2;
  } catch (const loco::InternalError& e) {
    fmt::print(stderr, "error: {} (a bug in loco: please report it)\n", e.what());
    return 3;
  } catch (const loco::Error& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 1;
  } catch (const c10::Error& e) {
    fmt::print(stderr, "error: [torch] {}\n", e.what_without_backtrace());
    return 3;
  } catch (const std::exception& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 3;
  }
}

}  // namespace

int main(int argc, char** argv) {
  loco::keep_freed_memory();  // a training step's tensors stay mapped between steps (core/allocator.h)
  loco::report_crashes();
  loco::comm::turn_off_flight_recorder();  // before any thread starts (comm/group.h)
  CLI::App app{"loco: low-communication training of language models (DiLoCo family)", "loco"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "loco 0.1.0");
  loco::cli::Commands commands;
  loco::cli::add_data_commands(app, commands);
  loco::cli::add_train_commands(app, commands);
  loco::cli::add_inference_commands(app, commands);
  loco::cli::add_tool_commands(app, commands);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 1;  // --help and --version are not errors; every parse error is bad input
  }
  const bool check_only = loco::read_environment().check_only;
  return exit_status_of([&] {
    for (auto& command : commands) {
      if (command->parsed()) return check_only ? command->check() : command->run();
    }
    return 0;
  });
}
