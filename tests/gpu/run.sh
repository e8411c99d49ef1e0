#!/usr/bin/env bash
# Builds, checks and times everything GPU-only in one go, for when a GPU machine is at hand.
#
#   tests/gpu/run.sh            # from anywhere; works in the repository root
#   tests/gpu/run.sh --all      # also run the other test suites of the CUDA build
#
# Steps, each under `timeout`, all within one time budget (default 470 s, under 8 minutes):
# check the build dependencies (install missing ones with apt-get when apt is usable, else
# list them and exit 2); log nvidia-smi; configure a Release build with -DMEMFIT_CUDA=ON in
# build-gpu; build with -j16; run memfit_gpu_tests (every test binary built from tests/gpu);
# run the GPU benchmarks (bench binaries whose name contains gpu or cuda), if any; run the
# PyTorch anchor (bench/torch_gpu_step.py, when a python3 with torch and CUDA is there; skipped
# with the reason otherwise) and print memfit's GPT-2 steps beside it with the issue's targets
# (tokens/s >= PyTorch eager, peak <= PyTorch's, offload step <= 1.15x); and the attention
# anchor (bench/torch_sdpa.py: PyTorch's scaled_dot_product_attention beside memfit's flash
# attention from attention_gpu_bench, same conditions). Logs go to
# $OUT when set, else build-gpu/gpu-logs (one file per step). The last thing printed, and
# summary.txt in the log folder, is a table (step, result, seconds) followed by the details
# that explain it: failed test names, the first compiler errors, why no GPU was usable, and
# the figures the tests measured (their "figure: ..." lines).
#
# Exit status: 0 when everything ran and passed; 1 when a step failed or timed out, or when
# the GPU tests skipped for want of a usable device (set MEMFIT_GPU_ALLOW_NO_DEVICE=1 to
# accept that, e.g. to try this script on a machine without a GPU); 2 when dependencies are
# missing and cannot be installed. Whether a GPU is usable is decided by the tests themselves
# (the CUDA runtime), not by nvidia-smi, which is logged for information only.
#
# Environment: MEMFIT_JOBS (default 16), MEMFIT_GPU_BUILD_DIR (default build-gpu),
# MEMFIT_GPU_BUDGET_S (default 470: total seconds for everything; a larger one also lengthens
# each step's own limit in proportion, e.g. 3000 to try the script on a slow machine).
set -uo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 1
BUILD=${MEMFIT_GPU_BUILD_DIR:-build-gpu}
JOBS=${MEMFIT_JOBS:-16}
BUDGET_S=${MEMFIT_GPU_BUDGET_S:-470}
LOGS=${OUT:-$BUILD/gpu-logs}
RUN_ALL=0
[[ "${1:-}" == "--all" ]] && RUN_ALL=1
mkdir -p "$LOGS"
LOGS=$(cd "$LOGS" && pwd)
START=$(date +%s)

ROWS=()     # "name|result|seconds"
DETAILS=()  # lines printed under the table
FAILED=0

row() { ROWS+=("$1|$2|$3"); }
detail() { DETAILS+=("$1"); }
since() { echo $(($(date +%s) - $1)); }
remaining() { echo $((BUDGET_S - ($(date +%s) - START))); }
# step_timeout WANTED: WANTED seconds (scaled up alike when the budget is above the default
# 470 s, for a slower machine), or what is left of the budget if that is less; at least 1,
# because `timeout 0` would mean no limit at all.
step_timeout() {
  local t want=$1
  ((BUDGET_S > 470)) && want=$((want * BUDGET_S / 470))
  t=$(remaining)
  ((t > want)) && t=$want
  ((t < 1)) && t=1
  echo "$t"
}
# run_logged LOG WANTED CMD...: runs CMD under the step timeout (STEP_LIMIT seconds; killed 10 s
# after the polite signal if it ignores it), output to LOG; returns CMD's status, 124 or 137
# when it timed out.
STEP_LIMIT=0
run_logged() {
  local log=$1
  STEP_LIMIT=$(step_timeout "$2")
  shift 2
  timeout -k 10 "$STEP_LIMIT" "$@" >"$log" 2>&1
}
timed_out() { (($1 == 124 || $1 == 137)); }
print_table() {
  echo
  echo "== memfit GPU run: $(date -u +%FT%TZ), logs in $LOGS"
  printf '%-40s %-52s %7s\n' "step" "result" "seconds"
  printf '%-40s %-52s %7s\n' "----" "------" "-------"
  local r name result secs
  for r in "${ROWS[@]}"; do
    IFS='|' read -r name result secs <<<"$r"
    printf '%-40s %-52s %7s\n' "$name" "$result" "$secs"
  done
  if ((${#DETAILS[@]} > 0)); then
    echo
    printf '%s\n' "${DETAILS[@]}"
  fi
}
finish() {
  print_table | tee "$LOGS/summary.txt"
  exit "$1"
}

# ---- 1. dependencies ------------------------------------------------------------------------
DEPS_LOG=$LOGS/env.log
: >"$DEPS_LOG"
have_header() {  # have_header REL_PATH: found in a usual include directory
  local d
  for d in /usr/include /usr/local/include /usr/include/x86_64-linux-gnu /usr/include/aarch64-linux-gnu; do
    [[ -e "$d/$1" ]] && return 0
  done
  return 1
}
have_openblas() {
  compgen -G '/usr/lib/*/libopenblas.so*' >/dev/null || compgen -G '/usr/lib/*/openblas*/libopenblas.so*' >/dev/null ||
    compgen -G '/usr/local/lib/libopenblas.so*' >/dev/null || compgen -G '/usr/lib/libopenblas.so*' >/dev/null
}
cmake_new_enough() {
  command -v cmake >/dev/null || return 1
  local v major minor
  v=$(cmake --version | sed -nE '1s/.* ([0-9]+)\.([0-9]+).*/\1 \2/p')
  read -r major minor <<<"$v"
  ((major > 3 || (major == 3 && minor >= 25)))
}
# Google Benchmark is needed only when there is a GPU benchmark to build.
GPU_BENCH_SRCS=$(compgen -G 'bench/*gpu*_bench.cpp'; compgen -G 'bench/*cuda*_bench.cpp')
missing_deps() {
  local m=()
  cmake_new_enough || m+=(cmake)
  command -v ninja >/dev/null || m+=(ninja-build)
  command -v g++ >/dev/null || m+=(g++)
  have_header gtest/gtest.h || m+=(libgtest-dev)
  [[ -z "$GPU_BENCH_SRCS" ]] || have_header benchmark/benchmark.h || m+=(libbenchmark-dev)
  have_header yaml-cpp/yaml.h || m+=(libyaml-cpp-dev)
  have_header nlohmann/json.hpp || m+=(nlohmann-json3-dev)
  have_header CLI/CLI.hpp || m+=(libcli11-dev)
  have_openblas || m+=(libopenblas-dev)
  echo "${m[*]}"
}
t0=$(date +%s)
if ! command -v nvcc >/dev/null && [[ -x /usr/local/cuda/bin/nvcc ]]; then
  export PATH=/usr/local/cuda/bin:$PATH
fi
missing=$(missing_deps)
if [[ -n "$missing" ]]; then
  echo "missing: $missing" | tee -a "$DEPS_LOG"
  sudo=""
  [[ $(id -u) -ne 0 ]] && sudo=sudo
  if command -v apt-get >/dev/null && { [[ -z "$sudo" ]] || sudo -n true 2>/dev/null; }; then
    echo "installing with apt-get: $missing" | tee -a "$DEPS_LOG"
    # Short network timeouts: without a reachable mirror this fails in seconds, not minutes.
    # Word splitting of $missing is intended: one package per word.
    # shellcheck disable=SC2086
    { timeout -k 5 "$(step_timeout 90)" $sudo apt-get update \
        -o Acquire::http::Timeout=10 -o Acquire::Retries=0 &&
      DEBIAN_FRONTEND=noninteractive timeout -k 5 "$(step_timeout 180)" $sudo apt-get install -y \
        --no-install-recommends $missing; } >>"$DEPS_LOG" 2>&1
  else
    echo "apt-get is not usable here (not present, or neither root nor passwordless sudo)" | tee -a "$DEPS_LOG"
  fi
  missing=$(missing_deps)
  if [[ -n "$missing" ]]; then
    echo "still missing: $missing (Debian/Ubuntu package names); install them and rerun" | tee -a "$DEPS_LOG"
    row dependencies "MISSING: $missing" "$(since "$t0")"
    detail "install: apt-get install $missing   (log: $DEPS_LOG)"
    finish 2
  fi
fi
if ! command -v nvcc >/dev/null; then
  echo "nvcc not found (PATH, /usr/local/cuda/bin): install the CUDA toolkit" | tee -a "$DEPS_LOG"
  row dependencies "MISSING: nvcc (CUDA toolkit)" "$(since "$t0")"
  finish 2
fi
BENCH=ON
have_header benchmark/benchmark.h || BENCH=OFF  # no GPU benchmark needs it (see missing_deps)
nvcc_version=$(nvcc --version | sed -nE 's/.*release ([0-9.]+).*/\1/p' | head -1)
cmake_version=$(cmake --version | sed -nE '1s/.* ([0-9.]+).*/\1/p')
{ echo "cmake: $(cmake --version | head -1)"; echo "nvcc: $(nvcc --version | tail -1)"; echo "g++: $(g++ --version | head -1)"; } >>"$DEPS_LOG"
row dependencies "ok (cmake $cmake_version, nvcc ${nvcc_version:-?})" "$(since "$t0")"

# ---- 2. the GPU as nvidia-smi sees it (information; the tests decide) -----------------------
t0=$(date +%s)
SMI_GPU=""
{ echo; echo "== nvidia-smi"; } >>"$DEPS_LOG"
if command -v nvidia-smi >/dev/null && timeout -k 5 "$(step_timeout 30)" nvidia-smi >>"$DEPS_LOG" 2>&1; then
  SMI_GPU=$(timeout -k 5 15 nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -1)
  row nvidia-smi "${SMI_GPU:-ok (no GPU listed)}" "$(since "$t0")"
else
  row nvidia-smi "not available (see env.log)" "$(since "$t0")"
fi

# ---- 3. configure and build -----------------------------------------------------------------
CONFIGURE_LOG=$LOGS/configure.log
BUILD_LOG=$LOGS/build.log
t0=$(date +%s)
run_logged "$CONFIGURE_LOG" 120 cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DMEMFIT_CUDA=ON -DMEMFIT_BUILD_TESTS=ON -DMEMFIT_BUILD_BENCH=$BENCH
rc=$?
if ((rc != 0)); then
  tail -30 "$CONFIGURE_LOG"
  row configure "$(timed_out $rc && echo "TIMEOUT after ${STEP_LIMIT}s" || echo "FAIL (rc $rc)")" "$(since "$t0")"
  while IFS= read -r line; do detail "$line"; done < <(grep -E 'CMake Error|error' "$CONFIGURE_LOG" | head -10)
  finish 1
fi
row configure "ok (benchmarks $BENCH)" "$(since "$t0")"

# Targets: the GPU test binary, GPU/CUDA benchmarks, and with --all every test suite.
all_targets=$(cmake --build "$BUILD" --target help 2>/dev/null | sed -nE 's/^([A-Za-z0-9_]+): .*/\1/p')
# tests/gpu/*_isolated_test.cpp build alone as memfit_<file name> (tests/CMakeLists.txt).
gpu_isolated=$(for f in tests/gpu/*_isolated_test.cpp; do [[ -e "$f" ]] && echo "memfit_$(basename "$f" .cpp)"; done)
targets=$(grep -E '^memfit_gpu_tests$|^memfit_.*(gpu|cuda).*_tests$|(gpu|cuda).*_bench$' <<<"$all_targets")
targets="$targets $gpu_isolated"
((RUN_ALL)) && targets="$targets $(grep -E '^memfit_[a-z]+_tests$' <<<"$all_targets")"
# shellcheck disable=SC2086
targets=$(echo $targets | tr ' ' '\n' | sort -u | tr '\n' ' ')
if [[ -z "${targets// /}" ]]; then
  row build "FAIL: no memfit_gpu_tests target (no tests/gpu/*_test.cpp?)" 0
  finish 1
fi
t0=$(date +%s)
# shellcheck disable=SC2086
run_logged "$BUILD_LOG" 330 cmake --build "$BUILD" -j "$JOBS" --target $targets
rc=$?
if ((rc != 0)); then
  grep -E 'error|FAILED' "$BUILD_LOG" | head -30
  row build "$(timed_out $rc && echo "TIMEOUT after ${STEP_LIMIT}s" || echo "FAIL (rc $rc)")" "$(since "$t0")"
  while IFS= read -r line; do detail "$line"; done < <(grep -E 'error' "$BUILD_LOG" | head -10)
  finish 1
fi
row build "ok: $targets(-j$JOBS)" "$(since "$t0")"

# ---- 4. tests -------------------------------------------------------------------------------
gtest_count() {  # gtest_count LOG WORD: N from "[  WORD  ] N tests" (0 when absent)
  local n
  n=$(sed -nE "s/^\[ +$2 +\] ([0-9]+) tests?[.,].*/\1/p" "$1" | tail -1)
  echo "${n:-0}"
}
NO_DEVICE=""  # the runtime's reason, when the GPU tests skipped for want of a device
run_test_binary() {
  local bin=$1 name log rc passed skipped failed result why
  name=$(basename "$bin")
  log=$LOGS/$name.log
  if (($(remaining) <= 5)); then
    row "$name" "NOT RUN (time budget spent)" 0
    FAILED=1
    return
  fi
  t0=$(date +%s)
  run_logged "$log" 150 "$bin" --gtest_color=no
  rc=$?
  passed=$(gtest_count "$log" PASSED)
  skipped=$(gtest_count "$log" SKIPPED)
  failed=$(gtest_count "$log" FAILED)
  why=$(grep -m1 -oE 'no CUDA device: .*' "$log")
  if timed_out $rc; then
    result="TIMEOUT after ${STEP_LIMIT}s"
    FAILED=1
    detail "$name: last test started: $(grep -E '^\[ RUN' "$log" | tail -1)"
  elif ((rc != 0)); then
    result="FAIL ($failed failed, $passed passed, rc $rc)"
    FAILED=1
    while IFS= read -r line; do detail "$name: $line"; done < <(grep -E '^\[  FAILED  \] [A-Za-z]' "$log" | sort -u | head -20)
    ((failed == 0)) && detail "$name: exited with rc $rc; last test started: $(grep -E '^\[ RUN' "$log" | tail -1)"
  elif [[ -n "$why" ]]; then
    result="SKIPPED $skipped: no CUDA device ($passed passed)"
    NO_DEVICE=${why#no CUDA device: }
  else
    result="PASS ($passed passed, $skipped skipped)"
  fi
  row "$name" "$result" "$(since "$t0")"
}

test_bins=()
for b in "$BUILD"/tests/memfit_*_tests; do
  [[ -x "$b" ]] || continue
  n=$(basename "$b")
  if [[ "$n" == *gpu* || "$n" == *cuda* ]] || ((RUN_ALL)); then test_bins+=("$b"); fi
done
for n in $gpu_isolated; do
  [[ -x "$BUILD/tests/$n" ]] && test_bins+=("$BUILD/tests/$n")
done
if ((${#test_bins[@]} == 0)); then
  row tests "FAIL: no test binary in $BUILD/tests" 0
  FAILED=1
fi
for b in "${test_bins[@]}"; do run_test_binary "$b"; done

# ---- 5. benchmarks --------------------------------------------------------------------------
# Each GPU benchmark runs with no arguments (they are plain programs with a fixed work target;
# some take an optional size as their first argument). One that found no device prints a line
# with "no CUDA device" and exits 0: SKIPPED, as for the tests.
bench_limit() {  # seconds a benchmark may take: the GPT-2 steps need longer than a GEMM sweep
  case "$1" in
    gpu_step_bench) echo 300 ;;  # eight variants, offload ones with a CPU AdamW each step
    *) echo 120 ;;
  esac
}
benches=()
for b in "$BUILD"/bench/*; do
  n=$(basename "$b")
  [[ -f "$b" && -x "$b" && ( "$n" == *gpu* || "$n" == *cuda* ) ]] && benches+=("$b")
done
((${#benches[@]} == 0)) && row benchmarks "none (no gpu/cuda bench binary yet)" 0
for b in "${benches[@]}"; do
  n=$(basename "$b")
  if (($(remaining) <= 5)); then
    row "$n" "NOT RUN (time budget spent)" 0
    FAILED=1
    continue
  fi
  t0=$(date +%s)
  run_logged "$LOGS/$n.log" "$(bench_limit "$n")" "$b"
  rc=$?
  why=$(grep -m1 -oE 'no CUDA device: .*' "$LOGS/$n.log")
  if ((rc == 0)) && [[ -n "$why" ]]; then
    row "$n" "SKIPPED: no CUDA device" "$(since "$t0")"
    NO_DEVICE=${NO_DEVICE:-${why#no CUDA device: }}
  elif ((rc == 0)); then
    row "$n" ok "$(since "$t0")"
  else
    row "$n" "$(timed_out $rc && echo "TIMEOUT after ${STEP_LIMIT}s" || echo "FAIL (rc $rc)")" "$(since "$t0")"
    detail "$n: $(grep -vE '^\s*$' "$LOGS/$n.log" | tail -1)"
    FAILED=1
  fi
done

# ---- 5b. the PyTorch anchor: the same GPT-2 steps in PyTorch eager on the same GPU ----------
# Debian's python3 first (it has python3-torch), else the python3 on PATH. Skipped, saying why,
# when there is no python3, no torch, or torch without CUDA; that does not fail the run.
TORCH_JSON=""
MEMFIT_JSON=""
[[ -f "$LOGS/gpu_step_bench.log" ]] && MEMFIT_JSON=$(sed -n 's/^JSON //p' "$LOGS/gpu_step_bench.log" | tail -1)
PY=""
for p in /usr/bin/python3 python3; do
  if command -v "$p" >/dev/null && "$p" -c 'import torch' >/dev/null 2>&1; then PY=$p; break; fi
done
t0=$(date +%s)
if [[ -z "$MEMFIT_JSON" ]]; then
  row "torch anchor" "not run (no gpu_step_bench result to compare)" 0
elif [[ -z "$PY" ]]; then
  row "torch anchor" "SKIPPED: no python3 with torch" 0
elif (($(remaining) <= 20)); then
  row "torch anchor" "NOT RUN (time budget spent)" 0
else
  run_logged "$LOGS/torch_gpu_step.log" 180 "$PY" bench/torch_gpu_step.py
  rc=$?
  skip=$(grep -m1 '^SKIP' "$LOGS/torch_gpu_step.log")
  TORCH_JSON=$(sed -n 's/^JSON //p' "$LOGS/torch_gpu_step.log" | tail -1)
  if [[ -n "$skip" ]]; then
    row "torch anchor" "SKIPPED: ${skip#SKIP: }" "$(since "$t0")"
  elif ((rc == 0)) && [[ -n "$TORCH_JSON" ]]; then
    row "torch anchor" "ok ($PY)" "$(since "$t0")"
  else
    # The anchor is a reference, not a check of memfit: its failure is reported, not fatal.
    row "torch anchor" "$(timed_out $rc && echo "TIMEOUT after ${STEP_LIMIT}s" || echo "FAIL (rc $rc)")" "$(since "$t0")"
    detail "torch anchor: $(grep -vE '^\s*$' "$LOGS/torch_gpu_step.log" | tail -1)"
  fi
fi
# memfit beside PyTorch, with the issue's targets; any python3 does (json only).
if [[ -n "$MEMFIT_JSON" ]] && command -v python3 >/dev/null; then
  CMP_PY=${PY:-python3}
  printf '%s\n' "$MEMFIT_JSON" >"$LOGS/gpu_step.memfit.json"
  if [[ -n "$TORCH_JSON" ]]; then
    printf '%s\n' "$TORCH_JSON" >"$LOGS/gpu_step.torch.json"
  else
    echo '{}' >"$LOGS/gpu_step.torch.json"  # memfit's figures alone, against the targets
  fi
  if "$CMP_PY" bench/torch_gpu_step.py --compare "$LOGS/gpu_step.memfit.json" \
      "$LOGS/gpu_step.torch.json" >"$LOGS/gpu_step_compare.txt" 2>&1; then
    while IFS= read -r line; do detail "$line"; done <"$LOGS/gpu_step_compare.txt"
  else
    detail "comparison failed: $(tail -1 "$LOGS/gpu_step_compare.txt")"
  fi
fi

# ---- 5c. the attention anchor: PyTorch's scaled_dot_product_attention on the same shapes -----
# bench/torch_sdpa.py, given attention_gpu_bench's JSON line so it prints memfit flash's time
# beside PyTorch's (its "figure:" lines land in the summary). Skipped, saying why, as 5b.
ATTN_JSON=""
[[ -f "$LOGS/attention_gpu_bench.log" ]] && ATTN_JSON=$(sed -n 's/^JSON //p' "$LOGS/attention_gpu_bench.log" | tail -1)
t0=$(date +%s)
if [[ -z "$ATTN_JSON" ]]; then
  row "torch sdpa anchor" "not run (no attention_gpu_bench result to compare)" 0
elif [[ -z "$PY" ]]; then
  row "torch sdpa anchor" "SKIPPED: no python3 with torch" 0
elif (($(remaining) <= 20)); then
  row "torch sdpa anchor" "NOT RUN (time budget spent)" 0
else
  printf '%s\n' "$ATTN_JSON" >"$LOGS/attention.memfit.json"
  run_logged "$LOGS/torch_sdpa.log" 120 "$PY" bench/torch_sdpa.py --memfit "$LOGS/attention.memfit.json"
  rc=$?
  skip=$(grep -m1 '^SKIP' "$LOGS/torch_sdpa.log")
  if [[ -n "$skip" ]]; then
    row "torch sdpa anchor" "SKIPPED: ${skip#SKIP: }" "$(since "$t0")"
  elif ((rc == 0)); then
    row "torch sdpa anchor" "ok ($PY)" "$(since "$t0")"
  else
    # A reference, not a check of memfit: its failure is reported, not fatal.
    row "torch sdpa anchor" "$(timed_out $rc && echo "TIMEOUT after ${STEP_LIMIT}s" || echo "FAIL (rc $rc)")" "$(since "$t0")"
    detail "torch sdpa anchor: $(grep -vE '^\s*$' "$LOGS/torch_sdpa.log" | tail -1)"
  fi
fi

# ---- 6. verdict -----------------------------------------------------------------------------
row total "" "$(since "$START")"
if [[ -n "$NO_DEVICE" ]]; then
  detail "no usable GPU: the CUDA runtime says \"$NO_DEVICE\""
  [[ -n "$SMI_GPU" ]] && detail "  yet nvidia-smi lists: $SMI_GPU"
  if [[ "$NO_DEVICE" == *InsufficientDriver* ]]; then
    if [[ -d /usr/local/cuda/compat ]]; then
      detail "  the driver is older than CUDA ${nvcc_version:-?} needs; on a datacenter GPU try the forward-compatibility libraries: LD_LIBRARY_PATH=/usr/local/cuda/compat tests/gpu/run.sh"
    else
      detail "  the driver is older than CUDA ${nvcc_version:-?} needs: install a newer driver (or cuda-compat) and rerun"
    fi
  fi
  if [[ "${MEMFIT_GPU_ALLOW_NO_DEVICE:-0}" != 1 ]]; then
    detail "  the GPU tests only skipped; MEMFIT_GPU_ALLOW_NO_DEVICE=1 accepts that"
    FAILED=1
  fi
fi
while IFS= read -r line; do detail "$line"; done < <(grep -h '^figure: ' "$LOGS"/*.log 2>/dev/null)
finish "$FAILED"
