#!/usr/bin/env bash
# The main job on the bundled defaults: installs dependencies, builds memfit (Release, CUDA
# parts when nvcc is found), and runs `memfit train --budget` with no policy flag: memfit
# plans the bundled gpt-tiny (4.8M parameters, byte-level) into 64 MiB on the CPU backend
# (its f32 weights, gradients and Adam moments alone take 74 MiB, so only plans that offload
# the optimizer fit): for every activation dtype, checkpoint solver and optimizer
# offload, the largest micro-batch whose dry-run peak fits; prints the recommended plan and
# why, trains it for 8 steps on the bundled corpus (data/corpus.txt, memfit's own
# documentation), prints the predicted peak beside the measured one and writes the summary,
# plan included, to out/train.json. Extra arguments go to `memfit train` (later ones win; a
# policy flag such as --dtype turns planning off; see `memfit train --help`).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cmake -S . -B build-release -G Ninja -DMEMFIT_CUDA=AUTO -DCMAKE_BUILD_TYPE=Release \
  -DMEMFIT_BUILD_TESTS=OFF -DMEMFIT_BUILD_BENCH=OFF
cmake --build build-release -j "${MEMFIT_JOBS:-$(nproc)}" --target memfit_cli
mkdir -p out
build-release/memfit train --model gpt-tiny --data data/corpus.txt --steps 8 --budget 64MiB \
  --summary-json out/train.json --report out/report "$@"
