#!/usr/bin/env bash
# The main job on the bundled default: installs dependencies, builds memfit (Release, CUDA
# parts when nvcc is found), and runs `memfit demo`: a GPT-2 (124M) training trace replayed
# through the caching allocator, the largest micro-batch under a 24 GiB budget, and a JSON
# report in out/demo.json. Extra arguments go to `memfit demo` (see `memfit demo --help`).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cmake -S . -B build-release -G Ninja -DMEMFIT_CUDA=AUTO -DCMAKE_BUILD_TYPE=Release \
  -DMEMFIT_BUILD_TESTS=OFF -DMEMFIT_BUILD_BENCH=OFF
cmake --build build-release -j "${MEMFIT_JOBS:-$(nproc)}" --target memfit_cli
mkdir -p out
build-release/memfit demo --budget 24GiB --out out/demo.json "$@"
