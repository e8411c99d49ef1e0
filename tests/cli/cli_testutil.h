// Helpers for the CLI tests: run the built `memfit` program and read what it wrote.
#pragma once

#include <string>
#include <vector>

namespace memfit::clitest {

struct ProgramRun {
  int exit_code;       // -1 when the program did not exit normally (or could not start)
  std::string output;  // stdout, and stderr unless left out
};

// The build's own program; MEMFIT_BINARY_DIR overrides, to test another build or an install.
std::string memfit_binary();
// `memfit <args>` through the shell; stderr_too = false keeps stdout alone (JSON must parse).
ProgramRun run_memfit(const std::string& args, bool stderr_too = true);
// `mpirun -np <ranks> memfit <args>` (one OpenMP thread per rank, as root too), with stderr;
// {-2, why} when this build has no MPI (mpi_available() false).
ProgramRun run_memfit_ranks(int ranks, const std::string& args);
bool mpi_available();
// The shell command run_memfit_ranks runs (stderr not redirected); "" without MPI.
std::string memfit_ranks_command(int ranks, const std::string& args);
// One mpirun of several programs (MPMD): rank r runs `memfit <per_rank[r]>`; `before` is put
// in front of the whole command line (e.g. "timeout 120 "). {-2, why} without MPI.
ProgramRun run_memfit_mpmd(const std::vector<std::string>& per_rank, const std::string& before = "");
std::string read_file(const std::string& path);  // "" when it cannot be read
bool contains(const std::string& haystack, const std::string& needle);

}  // namespace memfit::clitest
