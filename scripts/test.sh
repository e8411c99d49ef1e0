#!/usr/bin/env bash
# The test command: installs dependencies, then
#   1. builds with the CUDA backend when nvcc is found (MEMFIT_CUDA=AUTO) and runs every test;
#   2. builds CPU-only with AddressSanitizer + UndefinedBehaviorSanitizer and runs them again;
#   3. builds the memory, core and policies tests CPU-only with ThreadSanitizer and runs the
#      threaded ones: worker streams, offload (copy streams, the CPU AdamW thread), the
#      allocator under threads. OpenMP at 1 thread (libgomp is not instrumented); no
#      suppressions;
#   4. fuzzes every reader of user files (scripts/fuzz.sh: clang, libFuzzer + ASan + UBSan),
#      MEMFIT_FUZZ_SECONDS (default 30) per harness; any finding fails.
# GPU tests (tests/gpu) are built in step 1 and skip, saying why, when no GPU is present.
# Both builds treat warnings in memfit's C++ as errors (MEMFIT_WERROR).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
jobs=${MEMFIT_JOBS:-$(nproc)}
export CTEST_OUTPUT_ON_FAILURE=1
# ctest runs $jobs tests at once, each with OpenMP's default team (every core): more threads
# than cores. libgomp's threads spin at every barrier by default, and a spinning thread holds
# the core its partner needs: two TrainerOom parts side by side took 95 s spinning and 3.6 s
# with passive waits on this 2-core machine. Waiting threads sleep instead.
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}

echo "== build (MEMFIT_CUDA=AUTO, RelWithDebInfo)"
cmake -S . -B build -G Ninja -DMEMFIT_CUDA=AUTO -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMEMFIT_WERROR=ON
cmake --build build -j "$jobs"
ctest --test-dir build -j "$jobs" --timeout 900

echo "== build (CPU-only, address,undefined sanitizers)"
# MPI off under the sanitizers: OpenMPI is not built with them (it ships suppression files for
# its own leak reports). The MPI communicator's tests run under mpirun in the build above; the
# local communicator's run here too.
cmake -S . -B build-asan -G Ninja -DMEMFIT_CUDA=OFF -DMEMFIT_MPI=OFF -DCMAKE_BUILD_TYPE=Debug \
  -DMEMFIT_SANITIZE=address,undefined -DMEMFIT_BUILD_BENCH=OFF -DMEMFIT_WERROR=ON
cmake --build build-asan -j "$jobs"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:allocator_may_return_null=1 UBSAN_OPTIONS=print_stacktrace=1 \
  ctest --test-dir build-asan -j "$jobs" --timeout 1800
echo "== build (CPU-only, thread sanitizer): worker streams, offload, allocator threads"
cmake -S . -B build-tsan -G Ninja -DMEMFIT_CUDA=OFF -DMEMFIT_MPI=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DMEMFIT_SANITIZE=thread -DMEMFIT_BUILD_BENCH=OFF -DMEMFIT_WERROR=ON
cmake --build build-tsan -j "$jobs" --target memfit_memory_tests memfit_core_tests memfit_policies_tests
OMP_NUM_THREADS=1 TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
  ctest --test-dir build-tsan -j "$jobs" --timeout 1800 --no-tests=error \
  -R 'WorkerStreams|Offload|CachingAllocatorThreads|PinnedHostProvider|TrainerOom.AFailedStep'
echo "== fuzz (clang, libFuzzer + ASan + UBSan): every reader ${MEMFIT_FUZZ_SECONDS:-30} s"
scripts/fuzz.sh "${MEMFIT_FUZZ_SECONDS:-30}"
echo "== all tests passed"
