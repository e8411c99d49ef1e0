#!/usr/bin/env bash
# Builds, checks and times everything GPU-only in one go, for when a GPU machine is at hand.
#
#   tests/gpu/run.sh            # from anywhere; works in the repository root
#   tests/gpu/run.sh --all      # also run the other test suites of the CUDA build
#
# Steps (each under `timeout`; the whole run stays under 8 minutes): check the build
# dependencies (install the missing ones with apt-get when apt is usable, else list them and
# exit 2); configure a Release build with -DMEMFIT_CUDA=ON in build-gpu; build with -j16;
# log nvidia-smi; run memfit_gpu_tests and every other test binary built from tests/gpu;
# run the GPU benchmarks (bench binaries whose name contains gpu or cuda), if any. Logs go to
# $OUT when set, else build-gpu/gpu-logs (one file per step; few files on purpose). The last
# thing printed is a table: name, result, seconds.
#
# Exit status: 0 when everything ran and passed; 1 when a step failed or timed out, or when
# no GPU was usable (the GPU tests would only have skipped; set MEMFIT_GPU_ALLOW_NO_DEVICE=1
# to accept that, e.g. to try this script on a machine without a GPU); 2 when dependencies
# are missing and cannot be installed.
#
# Environment: MEMFIT_JOBS (default 16), MEMFIT_GPU_BUILD_DIR (default build-gpu),
# MEMFIT_GPU_BUDGET_S (default 470: total seconds for everything, kept under 8 minutes).
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

ROWS=()      # "name|result|seconds"
FAILED=0

row() { ROWS+=("$1|$2|$3"); }
remaining() { echo $((BUDGET_S - ($(date +%s) - START))); }
# step_timeout WANTED: WANTED seconds, or what is left of the budget if that is less.
step_timeout() {
  local left
  left=$(remaining)
  ((left < $1)) && echo "$left" || echo "$1"
}
print_table() {
  echo
  echo "== memfit GPU run: $(date -u +%FT%TZ), logs in $LOGS"
  printf '%-44s %-40s %8s\n' "name" "result" "seconds"
  printf '%-44s %-40s %8s\n' "----" "------" "-------"
  local r name result secs
  for r in "${ROWS[@]}"; do
    IFS='|' read -r name result secs <<<"$r"
    printf '%-44s %-40s %8s\n' "$name" "$result" "$secs"
  done
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
  local v
  v=$(cmake --version | sed -nE '1s/.* ([0-9]+)\.([0-9]+).*/\1 \2/p')
  read -r major minor <<<"$v"
  ((major > 3 || (major == 3 && minor >= 25)))
}
missing_deps() {
  local m=()
  cmake_new_enough || m+=(cmake)
  command -v ninja >/dev/null || m+=(ninja-build)
  command -v g++ >/dev/null || m+=(g++)
  have_header gtest/gtest.h || m+=(libgtest-dev)
  have_header benchmark/benchmark.h || m+=(libbenchmark-dev)
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
    # Word splitting of $missing is intended: one package per word.
    # shellcheck disable=SC2086
    { timeout "$(step_timeout 120)" $sudo apt-get update &&
      DEBIAN_FRONTEND=noninteractive timeout "$(step_timeout 180)" $sudo apt-get install -y \
        --no-install-recommends $missing; } >>"$DEPS_LOG" 2>&1
  else
    echo "apt-get is not usable here (not present, or neither root nor passwordless sudo)" | tee -a "$DEPS_LOG"
  fi
  missing=$(missing_deps)
  if [[ -n "$missing" ]]; then
    echo "still missing: $missing (Debian/Ubuntu package names); install them and rerun" | tee -a "$DEPS_LOG"
    row dependencies "MISSING: $missing" $(($(date +%s) - t0))
    finish 2
  fi
fi
if ! command -v nvcc >/dev/null; then
  echo "nvcc not found (PATH, /usr/local/cuda/bin): install the CUDA toolkit" | tee -a "$DEPS_LOG"
  row dependencies "MISSING: nvcc (CUDA toolkit)" $(($(date +%s) - t0))
  finish 2
fi
{ echo "cmake: $(cmake --version | head -1)"; echo "nvcc: $(nvcc --version | tail -1)"; } >>"$DEPS_LOG"
row dependencies ok $(($(date +%s) - t0))

# ---- 2. the GPU, as the driver sees it ------------------------------------------------------
t0=$(date +%s)
NO_GPU=0
{ echo; echo "== nvidia-smi"; } >>"$DEPS_LOG"
if command -v nvidia-smi >/dev/null && timeout "$(step_timeout 30)" nvidia-smi >>"$DEPS_LOG" 2>&1; then
  gpu=$(timeout 15 nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -1)
  row nvidia-smi "ok: ${gpu:-?}" $(($(date +%s) - t0))
else
  NO_GPU=1
  echo "nvidia-smi missing or failed: no usable GPU" | tee -a "$DEPS_LOG"
  row nvidia-smi "NO GPU" $(($(date +%s) - t0))
fi

# ---- 3. configure and build -----------------------------------------------------------------
BUILD_LOG=$LOGS/build.log
t0=$(date +%s)
timeout "$(step_timeout 120)" cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DMEMFIT_CUDA=ON -DMEMFIT_BUILD_TESTS=ON -DMEMFIT_BUILD_BENCH=ON >"$BUILD_LOG" 2>&1
rc=$?
if ((rc != 0)); then
  tail -30 "$BUILD_LOG"
  row configure "$( ((rc == 124)) && echo TIMEOUT || echo "FAIL (rc $rc)")" $(($(date +%s) - t0))
  finish 1
fi
row configure ok $(($(date +%s) - t0))

# Targets: the GPU test binaries, GPU/CUDA benchmarks, and with --all every test suite.
targets=$(cmake --build "$BUILD" --target help 2>/dev/null | sed -nE 's/^([A-Za-z0-9_]+): .*/\1/p' |
  grep -E '^memfit_gpu_tests$|^memfit_.*(gpu|cuda).*_tests$|(gpu|cuda).*_bench$' | sort -u)
if ((RUN_ALL)); then
  targets="$targets $(cmake --build "$BUILD" --target help 2>/dev/null | sed -nE 's/^(memfit_[a-z]+_tests): .*/\1/p')"
fi
# shellcheck disable=SC2086
targets=$(echo $targets | tr ' ' '\n' | sort -u | tr '\n' ' ')
t0=$(date +%s)
if [[ -z "${targets// /}" ]]; then
  row build "FAIL: no memfit_gpu_tests target (no tests/gpu/*_test.cpp?)" 0
  finish 1
fi
# shellcheck disable=SC2086
timeout "$(step_timeout 330)" cmake --build "$BUILD" -j "$JOBS" --target $targets >>"$BUILD_LOG" 2>&1
rc=$?
if ((rc != 0)); then
  grep -E 'error|FAILED' "$BUILD_LOG" | head -30
  row "build ($targets)" "$( ((rc == 124)) && echo TIMEOUT || echo "FAIL (rc $rc)")" $(($(date +%s) - t0))
  finish 1
fi
row build "ok ($(echo "$targets" | wc -w) targets, -j$JOBS)" $(($(date +%s) - t0))

# ---- 4. tests -------------------------------------------------------------------------------
gtest_count() {  # gtest_count LOG WORD: N from "[  WORD  ] N tests" (0 when absent)
  local n
  n=$(sed -nE "s/^\[ +$2 +\] ([0-9]+) tests?[.,].*/\1/p" "$1" | tail -1)
  echo "${n:-0}"
}
run_test_binary() {
  local bin=$1 name log t rc passed skipped failed result
  name=$(basename "$bin")
  log=$LOGS/$name.log
  t=$(step_timeout 150)
  if ((t <= 5)); then
    row "$name" "NOT RUN (time budget spent)" 0
    FAILED=1
    return
  fi
  t0=$(date +%s)
  timeout "$t" "$bin" --gtest_color=no >"$log" 2>&1
  rc=$?
  passed=$(gtest_count "$log" PASSED)
  skipped=$(gtest_count "$log" SKIPPED)
  failed=$(gtest_count "$log" FAILED)
  if ((rc == 124)); then
    result="TIMEOUT after ${t}s"
    FAILED=1
  elif ((rc != 0)); then
    result="FAIL ($failed failed, $passed passed)"
    FAILED=1
    grep -E '^\[  FAILED  \] [A-Za-z]' "$log" | sort -u | head -20
  elif ((skipped > 0 && NO_GPU == 0)) && [[ "$name" == *gpu* ]]; then
    # nvidia-smi saw a GPU but the tests did not: a driver/runtime mismatch to look at.
    result="FAIL: $skipped skipped with a GPU present"
    FAILED=1
    grep -m1 'no CUDA device' "$log"
  else
    result="PASS ($passed passed, $skipped skipped)"
  fi
  row "$name" "$result" $(($(date +%s) - t0))
}

gpu_bins=()
for b in "$BUILD"/tests/memfit_*_tests; do
  [[ -x "$b" ]] || continue
  n=$(basename "$b")
  if [[ "$n" == *gpu* || "$n" == *cuda* ]] || ((RUN_ALL)); then gpu_bins+=("$b"); fi
done
if ((${#gpu_bins[@]} == 0)); then
  row tests "FAIL: no test binary in $BUILD/tests" 0
  FAILED=1
fi
for b in "${gpu_bins[@]}"; do run_test_binary "$b"; done

# ---- 5. benchmarks --------------------------------------------------------------------------
benches=()
for b in "$BUILD"/bench/*; do
  n=$(basename "$b")
  [[ -f "$b" && -x "$b" && ( "$n" == *gpu* || "$n" == *cuda* ) ]] && benches+=("$b")
done
if ((${#benches[@]} == 0)); then
  row benchmarks "none (no gpu/cuda bench binary yet)" 0
fi
for b in "${benches[@]}"; do
  n=$(basename "$b")
  t=$(step_timeout 120)
  if ((t <= 5)); then
    row "$n" "NOT RUN (time budget spent)" 0
    FAILED=1
    continue
  fi
  t0=$(date +%s)
  timeout "$t" "$b" --benchmark_color=false >"$LOGS/$n.log" 2>&1
  rc=$?
  if ((rc == 0)); then
    row "$n" ok $(($(date +%s) - t0))
  else
    row "$n" "$( ((rc == 124)) && echo "TIMEOUT after ${t}s" || echo "FAIL (rc $rc)")" $(($(date +%s) - t0))
    FAILED=1
  fi
done

# ---- 6. verdict -----------------------------------------------------------------------------
row total "" $(($(date +%s) - START))
if ((NO_GPU)) && [[ "${MEMFIT_GPU_ALLOW_NO_DEVICE:-0}" != 1 ]]; then
  echo "no usable GPU: the GPU tests only skipped (MEMFIT_GPU_ALLOW_NO_DEVICE=1 accepts this)"
  FAILED=1
fi
finish "$FAILED"
