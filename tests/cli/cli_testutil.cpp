#include "tests/cli/cli_testutil.h"

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

namespace memfit::clitest {

std::string memfit_binary() {
  const char* dir = std::getenv("MEMFIT_BINARY_DIR");
  return std::string(dir ? dir : MEMFIT_TEST_BINARY_DIR) + "/memfit";
}

namespace {

ProgramRun run_shell(const std::string& cmd) {
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return {-1, "popen failed"};
  std::string out;
  std::array<char, 4096> buf;
  while (std::fgets(buf.data(), buf.size(), p) != nullptr) out += buf.data();
  const int status = pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

// One CPU rates file for every run (tests/CMakeLists.txt measures it first, as cli_cpu_rates).
std::string cache_env() { return "MEMFIT_CACHE_DIR='" + std::string(MEMFIT_TEST_CACHE_DIR) + "' "; }

}  // namespace

ProgramRun run_memfit(const std::string& args, bool stderr_too) {
  return run_shell(cache_env() + memfit_binary() + " " + args +
                   (stderr_too ? " 2>&1" : " 2>/dev/null"));
}

bool mpi_available() {
#ifdef MEMFIT_TEST_MPIEXEC
  return true;
#else
  return false;
#endif
}

#ifdef MEMFIT_TEST_MPIEXEC
// As tests/CMakeLists.txt runs the *_mpi_test binaries: ranks share the cores, and shared
// memory transfers need no cross-memory attach (containers that deny ptrace refuse it).
std::string mpirun_prefix() {
  return "env " + cache_env() + "OMP_NUM_THREADS=1 OMPI_MCA_btl_vader_single_copy_mechanism=none " +
         MEMFIT_TEST_MPIEXEC + " --allow-run-as-root --oversubscribe ";
}
#endif

std::string memfit_ranks_command(int ranks, const std::string& args) {
#ifdef MEMFIT_TEST_MPIEXEC
  return mpirun_prefix() + "-np " + std::to_string(ranks) + " " + memfit_binary() + " " + args;
#else
  (void)ranks, (void)args;
  return "";
#endif
}

ProgramRun run_memfit_ranks(int ranks, const std::string& args) {
#ifdef MEMFIT_TEST_MPIEXEC
  return run_shell(memfit_ranks_command(ranks, args) + " 2>&1");
#else
  (void)ranks, (void)args;
  return {-2, "this build has no MPI"};
#endif
}

ProgramRun run_memfit_mpmd(const std::vector<std::string>& per_rank, const std::string& before) {
#ifdef MEMFIT_TEST_MPIEXEC
  std::string apps;
  for (const std::string& a : per_rank) {
    apps += (apps.empty() ? "" : " : ") + std::string("-np 1 ") + memfit_binary() + " " + a;
  }
  return run_shell(before + mpirun_prefix() + apps + " 2>&1");
#else
  (void)per_rank, (void)before;
  return {-2, "this build has no MPI"};
#endif
}

std::string read_file(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

}  // namespace memfit::clitest
