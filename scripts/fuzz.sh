#!/usr/bin/env bash
# Fuzz every reader of user files for a fixed time each, and fail on any finding.
#   scripts/fuzz.sh [SECONDS_PER_HARNESS]        (default 45)
# Configures build-fuzz (clang, -DMEMFIT_FUZZ=ON: libFuzzer + ASan + UBSan, CPU only), builds
# the harnesses (fuzz_all) and the memfit program, generates the seed corpus
# (fuzz/make_corpus.sh), then runs each harness with -timeout=1 -malloc_limit_mb=512
# -rss_limit_mb=2048 and its dictionary. Any crash, sanitizer report, leak, uncaught exception,
# timeout (> 1 s per input), allocation over 512 MiB (an input asking for an impossible size)
# or a process over 2 GiB fails the script. (The process limit was 512 MiB: a run at 9k
# inputs/s crossed it with 26 MiB live, the rest ASan's quarantine and libFuzzer's own
# tables, and blamed an empty input. 2 GiB is libFuzzer's default.) The input is left in
# build-fuzz/findings/<harness>/ — add it under fuzz/regressions/<harness>/ with a short
# descriptive name once fixed (ctest replays those in every build). Ends with a table: harness, execs/s, total
# execs, crashes. Environment: MEMFIT_FUZZ_JOBS (build parallelism, default 2),
# CC/CXX (default clang/clang++). -O1 with line tables only: libFuzzer's advice, and the
# sanitized build compiles in half the time of -O2 -g.
set -euo pipefail
seconds=${1:-45}
[[ $seconds =~ ^[1-9][0-9]*$ ]] || { echo "usage: scripts/fuzz.sh [SECONDS_PER_HARNESS >= 1]" >&2; exit 2; }
root=$(cd "$(dirname "$0")/.." && pwd)
build=$root/build-fuzz
jobs=${MEMFIT_FUZZ_JOBS:-2}
start=$(date +%s)
mkdir -p "$build"

CC=${CC:-clang} CXX=${CXX:-clang++} cmake -S "$root" -B "$build" -G Ninja -DMEMFIT_CUDA=OFF -DMEMFIT_MPI=OFF \
  -DMEMFIT_FUZZ=ON -DMEMFIT_WERROR=ON -DMEMFIT_SHARED=OFF -DMEMFIT_BUILD_TESTS=OFF \
  -DMEMFIT_BUILD_BENCH=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -gline-tables-only -DNDEBUG" \
  "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O1 -gline-tables-only -DNDEBUG" > "$build/configure.log" 2>&1 ||
  { cat "$build/configure.log"; exit 1; }
cmake --build "$build" -j "$jobs" --target fuzz_all memfit_cli
built=$(date +%s)

# The seed corpus: the program runs under ASan too; leaks there are not the harnesses' concern.
ASAN_OPTIONS=detect_leaks=0 "$root/fuzz/make_corpus.sh" "$build" "$build/corpus"

# Per reader: the largest input worth mutating (a config is a few KB; pickles and states are
# seeded by files memfit writes, and a mutation of a prefix still exercises their headers).
declare -A max_len=([model_yaml]=4096 [device_yaml]=4096 [plan_yaml]=8192 [plan_json]=8192
                    [hf_config]=4096 [pickle]=131072 [alloc_trace]=8192 [train_state]=65536)
readers=(model_yaml device_yaml plan_yaml plan_json hf_config pickle alloc_trace train_state)
rm -rf "$build/findings" "$build/logs"
mkdir -p "$build/findings" "$build/logs"
failed=0
declare -A rate total crashes
for r in "${readers[@]}"; do
  mkdir -p "$build/findings/$r" "$build/work/$r"
  log=$build/logs/$r.log
  echo "== fuzz_$r: $seconds s"
  set +e
  ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=0 \
  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    "$build/fuzz/fuzz_$r" "$build/work/$r" "$build/corpus/$r" \
      -max_total_time="$seconds" -timeout=1 -rss_limit_mb=2048 -malloc_limit_mb=512 \
      -max_len="${max_len[$r]}" -dict="$root/fuzz/$r.dict" -print_final_stats=1 \
      -artifact_prefix="$build/findings/$r/" > "$log" 2>&1
  rc=$?
  set -e
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  secs=$(sed -n 's/^stat::.*//; s/^Done \([0-9]*\) runs in \([0-9]*\) second.*/\2/p' "$log" | tail -1)
  total[$r]=${execs:-0}
  rate[$r]=$(( ${execs:-0} / ${secs:-$seconds} ))
  crashes[$r]=$(find "$build/findings/$r" -type f | wc -l)
  if [[ $rc -ne 0 || ${crashes[$r]} -ne 0 ]]; then
    failed=1
    echo "fuzz_$r FAILED (exit $rc): inputs in $build/findings/$r; log $log"
    grep -m 20 -E "ERROR|SUMMARY|runtime error|memfit fuzz|Test unit written" "$log" || tail -20 "$log"
  fi
done

end=$(date +%s)
echo
printf '%-14s %10s %12s %8s\n' harness execs/s "total execs" crashes
for r in "${readers[@]}"; do
  printf '%-14s %10s %12s %8s\n' "fuzz_$r" "${rate[$r]}" "${total[$r]}" "${crashes[$r]}"
done
echo "configure + build $((built - start)) s; total $((end - start)) s"
if [[ $failed -ne 0 ]]; then
  echo "scripts/fuzz.sh: FAILED: see build-fuzz/findings/ and build-fuzz/logs/" >&2
  exit 1
fi
echo "scripts/fuzz.sh: no findings"
