#include "core/comm/mpi_world.h"

#include <mpi.h>

#include <cstdlib>

#include "core/comm/rank_failure.h"
#include "memory/error.h"

namespace memfit {
namespace {

void finalize_at_exit() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

void abort_world(int code) { MPI_Abort(MPI_COMM_WORLD, code); }

}  // namespace

std::string mpi_message(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) return "code " + std::to_string(code);
  return std::string(text, static_cast<std::size_t>(len));
}

void mpi_check(int code, const std::string& call, int rank) {
  if (code != MPI_SUCCESS) {
    throw CommError(call + " failed on rank " + std::to_string(rank) + ": " + mpi_message(code));
  }
}

MpiWorld mpi_world() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    // OpenMPI: a rank waiting in a collective yields its core instead of spinning (unless the
    // user chose otherwise). The collectives the communicator's thread runs beside the backward
    // share the rank's core with it, and a spinning wait there took the compute's time:
    // gpt-tiny's overlapped step measured 0.147 s spinning against 0.120 s yielding
    // (bench/data_parallel_bench.sh). Other MPI libraries ignore the variable.
    setenv("OMPI_MCA_mpi_yield_when_idle", "1", /*overwrite=*/0);
    int provided = 0;
    mpi_check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided),
              "MPI_Init_thread", -1);
    std::atexit(finalize_at_exit);
  }
  int level = MPI_THREAD_SINGLE;
  mpi_check(MPI_Query_thread(&level), "MPI_Query_thread", -1);
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MpiWorld w;
  mpi_check(MPI_Comm_rank(MPI_COMM_WORLD, &w.rank), "MPI_Comm_rank", -1);
  mpi_check(MPI_Comm_size(MPI_COMM_WORLD, &w.size), "MPI_Comm_size", w.rank);
  w.serialized = level >= MPI_THREAD_SERIALIZED;
  // A rank that fails from now on must not leave the others waiting in a collective.
  if (w.size > 1) set_stop_all_ranks(&abort_world);
  return w;
}

}  // namespace memfit
