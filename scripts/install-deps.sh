#!/usr/bin/env bash
# Installs memfit's build and test dependencies from Debian packages (see DESIGN.md,
# "Dependencies"). Needs root or sudo. The CUDA toolkit is not installed here: when nvcc and
# the toolkit are present, the build uses them (MEMFIT_CUDA=AUTO).
set -euo pipefail
pkgs=(build-essential cmake ninja-build ccache pkg-config python3
      libgtest-dev libgmock-dev libbenchmark-dev
      libyaml-cpp-dev nlohmann-json3-dev libcli11-dev libomp-dev
      libopenblas-dev libopenblas-openmp-dev  # BLAS on the OpenMP team the rest uses
      libdnnl-dev                              # oneDNN: native 16-bit CPU matmul
      libopenmpi-dev openmpi-bin               # multi-rank CPU runs (core/comm, mpirun)
      clang libclang-rt-dev)  # clang + libFuzzer: scripts/fuzz.sh
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#pkgs[@]} packages present"
  exit 0
fi
sudo=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "install-deps: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
  sudo=sudo
fi
echo "install-deps: installing ${missing[*]}"
$sudo apt-get update
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y --no-install-recommends "${missing[@]}"
