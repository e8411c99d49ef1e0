#!/usr/bin/env bash
# The test command: installs dependencies, then
#   1. builds with the CUDA backend when nvcc is found (MEMFIT_CUDA=AUTO) and runs every test;
#   2. builds CPU-only with AddressSanitizer + UndefinedBehaviorSanitizer and runs them again.
# GPU tests (tests/gpu) are built in step 1 and skip, saying why, when no GPU is present.
# Both builds treat warnings in memfit's C++ as errors (MEMFIT_WERROR).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
jobs=${MEMFIT_JOBS:-$(nproc)}
export CTEST_OUTPUT_ON_FAILURE=1

echo "== build (MEMFIT_CUDA=AUTO, RelWithDebInfo)"
cmake -S . -B build -G Ninja -DMEMFIT_CUDA=AUTO -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMEMFIT_WERROR=ON
cmake --build build -j "$jobs"
ctest --test-dir build -j "$jobs" --timeout 900

echo "== build (CPU-only, address,undefined sanitizers)"
cmake -S . -B build-asan -G Ninja -DMEMFIT_CUDA=OFF -DCMAKE_BUILD_TYPE=Debug \
  -DMEMFIT_SANITIZE=address,undefined -DMEMFIT_BUILD_BENCH=OFF -DMEMFIT_WERROR=ON
cmake --build build-asan -j "$jobs"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:allocator_may_return_null=1 UBSAN_OPTIONS=print_stacktrace=1 \
  ctest --test-dir build-asan -j "$jobs" --timeout 1800
echo "== all tests passed"
