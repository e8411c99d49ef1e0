#!/usr/bin/env bash
# The main job on the bundled defaults: installs dependencies, builds memfit (Release, CUDA
# parts when nvcc is found), and runs `memfit train`: the bundled gpt-tiny (4.8M parameters,
# byte-level) trains 10 steps on the bundled corpus (data/corpus.txt, memfit's own
# documentation) on the CPU backend under a 128 MiB budget that plain f32 (about 230 MiB)
# does not fit, with bf16 weights/activations and every block checkpointed. It prints the
# predicted peak (a dry run of the same step on the meta backend) beside the measured one and
# writes the summary to out/train.json. Extra arguments go to `memfit train` (later ones win;
# see `memfit train --help`).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cmake -S . -B build-release -G Ninja -DMEMFIT_CUDA=AUTO -DCMAKE_BUILD_TYPE=Release \
  -DMEMFIT_BUILD_TESTS=OFF -DMEMFIT_BUILD_BENCH=OFF
cmake --build build-release -j "${MEMFIT_JOBS:-$(nproc)}" --target memfit_cli
mkdir -p out
build-release/memfit train --model gpt-tiny --data data/corpus.txt --steps 10 --batch 8 \
  --dtype bf16 --checkpoint all --budget 128MiB --predict --summary-json out/train.json "$@"
