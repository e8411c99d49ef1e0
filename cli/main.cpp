// The memfit program: one subcommand per file in cli/. User errors (memfit::Error) print
// their message (control characters escaped: cli/terminal_text.h) and exit 2; anything else
// is a bug and exits 3. In a multi-rank run the message names the rank, and the failing rank
// stops every rank (core/comm/rank_failure.h) instead of leaving them in a collective.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>
#include <string>

#include "cli/devices_command.h"
#include "cli/plan_command.h"
#include "cli/profile_command.h"
#include "cli/replay_command.h"
#include "cli/terminal_text.h"
#include "cli/train_command.h"
#include "core/comm/rank_failure.h"
#include "memory/error.h"

namespace {

// "rank 1 of 2: " under mpirun with several ranks, else "".
std::string rank_prefix() {
  const std::string r = memfit::rank_label();
  return r.empty() ? r : r + ": ";
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"memfit: fit neural-network training into a memory budget"};
  app.set_version_flag("--version", "memfit 0.1.0");
  app.require_subcommand(1);
  // A flag CLI11 refuses reads like every other error (and is escaped like them).
  app.failure_message([](const CLI::App*, const CLI::Error& e) {
    return "memfit: error: " + memfit::cli::shown(e.what()) +
           "\nRun with --help for more information.\n";
  });
  int exit_code = 0;
  memfit::cli::add_train_command(app, exit_code);
  memfit::cli::add_plan_command(app, exit_code);
  memfit::cli::add_devices_command(app, exit_code);
  memfit::cli::add_profile_command(app, exit_code);
  memfit::cli::add_replay_command(app, exit_code);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help prints and succeeds; any other parse error is bad input, exit 2 as memfit::Error.
    return app.exit(e) == 0 ? 0 : 2;
  } catch (const memfit::Error& e) {
    std::fprintf(stderr, "memfit: %serror: %s\n", rank_prefix().c_str(),
                 memfit::cli::shown(e.what()).c_str());
    memfit::stop_all_ranks(2);  // the other ranks of a multi-rank run must not wait for this one
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "memfit: %sinternal error: %s\n", rank_prefix().c_str(),
                 memfit::cli::shown(e.what()).c_str());
    memfit::stop_all_ranks(3);
    return 3;
  }
  return exit_code;
}
