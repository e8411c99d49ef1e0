// Failing one rank of a multi-rank run: the other ranks would wait in their next collective
// for a rank that is gone, forever. stop_all_ranks() ends the whole launch instead: under MPI
// (an MpiCommunicator of two or more ranks was made in this process) it calls MPI_Abort, and
// mpirun stops every rank within its own kill timeout; a process of one rank returns from it
// and exits as it would have. A rank that dies outright (a signal, the OOM killer) is mpirun's
// to notice: it ends the other ranks the same way.
//
//   } catch (const std::exception& e) {
//     std::fprintf(stderr, "%s: %s\n", rank_label().c_str(), e.what());   // "rank 1 of 2"
//     stop_all_ranks(2);                                                 // no return under MPI
//   }
//
// State files are written whole or not at all (profiler/atomic_file.h), so an abort in the
// middle of a save leaves every earlier file as it was.
#pragma once

#include <string>

namespace memfit {

// What a communicator registers to stop every rank (MPI_Abort); nullptr unregisters.
using StopAllRanks = void (*)(int code);
void set_stop_all_ranks(StopAllRanks stop);

// Ends every rank of the launch with exit status `code` when a multi-rank communicator is
// registered (does not return then); returns otherwise.
void stop_all_ranks(int code);

// "rank R of N" under a multi-rank launch (core/comm/communicator.h's launch_info), "" for one
// process: for messages that must say which rank failed.
std::string rank_label();

}  // namespace memfit
