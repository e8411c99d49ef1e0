// MPI_COMM_WORLD as the MPI-bootstrapped communicators stand on it (mpi_communicator.h for CPU
// ranks, nccl_communicator.h for CUDA ranks): one place that starts MPI, reads this rank, says
// MPI's errors and makes a failing rank stop the others. Built only with MPI (MEMFIT_HAVE_MPI).
//
//   const MpiWorld w = mpi_world();    // MPI_Init_thread once per process; rank and size
//   mpi_check(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier", w.rank);
//
// mpi_world(): MPI_Init_thread (MPI_THREAD_SERIALIZED: any thread may call MPI, one at a time;
// the MPI communicator's collectives that overlap the backward run on a thread of their own)
// unless the program already did, with MPI_Finalize at exit; `serialized` says whether MPI
// gave that level (a program that initialized MPI itself may have asked for less); errors
// return (MPI_ERRORS_RETURN) instead of aborting; with two or more ranks MPI_Abort becomes
// stop_all_ranks() (core/comm/rank_failure.h).
// mpi_check(): CommError (memory/error.h) "<call> failed on rank <r>: <MPI's message>".
#pragma once

#include <string>

namespace memfit {

struct MpiWorld {
  int rank = 0;
  int size = 1;
  bool serialized = false;  // MPI_THREAD_SERIALIZED or more
};
MpiWorld mpi_world();

std::string mpi_message(int code);  // MPI's text for a return code
void mpi_check(int code, const std::string& call, int rank);

}  // namespace memfit
