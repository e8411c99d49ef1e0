#!/usr/bin/env bash
# Data-parallel step time at N = 1 and N = 2 ranks (CPU backend, one core per rank), and the
# ratio between them, from one run of bench/data_parallel_bench (built in build/bench):
#
#   bench/data_parallel_bench.sh [--zero Z] [--batch B] [--steps S] ...   (args go to the bench)
#
# Both runs train the same global batch; N = 2 gives each rank half of it on its own core.
# Each run steps two trainers alternately, with and without the gradient sums overlapping the
# backward, and prints both step times and the share of the collectives hidden.
# The anchor is N = 1 on one core: "speedup" is N=1's step time over N=2's (2.0 would be
# perfect scaling; the collectives and the serial parts take the rest). Needs mpirun (Debian
# openmpi-bin) and a build with MPI.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${MEMFIT_BUILD_DIR:-build}/bench/data_parallel_bench
[ -x "$BIN" ] || { echo "data_parallel_bench.sh: $BIN not built" >&2; exit 2; }
one=$(OMP_NUM_THREADS=1 "$BIN" "$@")
two=$(OMP_NUM_THREADS=1 OMPI_MCA_btl_vader_single_copy_mechanism=none \
      mpirun --allow-run-as-root --oversubscribe -np 2 "$BIN" "$@")
echo "$one"
echo "$two"
s1=$(echo "$one" | sed -n 's/.*step_s=\([0-9.]*\).*/\1/p')
s2=$(echo "$two" | sed -n 's/.*step_s=\([0-9.]*\).*/\1/p')
awk -v a="$s1" -v b="$s2" 'BEGIN { printf "speedup N=2 over N=1: %.2fx (step %.3f s -> %.3f s; 2.00x is perfect scaling)\n", a / b, a, b }'
