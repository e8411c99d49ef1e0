// The memfit program. Subcommands register themselves in cli/commands.h order.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <exception>

int main(int argc, char** argv) {
  CLI::App app{"memfit: fit neural-network training into a memory budget"};
  app.set_version_flag("--version", "memfit 0.1.0");
  app.require_subcommand(0, 1);
  CLI11_PARSE(app, argc, argv);
  if (app.get_subcommands().empty()) std::printf("%s", app.help().c_str());
  return 0;
}
