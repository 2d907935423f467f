#!/usr/bin/env bash
# Installs what sluice needs on Debian 12 (apt) and configures the build in build/.
# Idempotent: installs only missing packages, reconfigures only when needed.
#
#   bash scripts/setup.sh            # build + test dependencies, configure build/
#   bash scripts/setup.sh --fuzz     # also clang-14 + libFuzzer (for scripts/fuzz.sh)
#   bash scripts/setup.sh --no-torch # skip libtorch (no `sluice train` / `sluice profile`)
#
# The default set includes Debian's libtorch (CPU, c10d/Gloo: libgloo-dev is needed to compile
# against ProcessGroupGloo.hpp, libopenblas0-openmp makes it 13-22x faster than the reference
# BLAS) and chromium (the HTML report's browser test renders pages headless). The Python module
# (python/, docs/python.md) needs pybind11 and pytest; its sluice.torch tests need python3-torch
# (CPU, Gloo), which comes with the torch set; `pip install .` offline (the slow python_packaging
# test) needs python3-venv, python3-pip, python3-setuptools and python3-wheel.
set -euo pipefail
cd "$(dirname "$0")/.."

pkgs=(cmake ninja-build g++ ccache pkg-config
      nlohmann-json3-dev libcli11-dev libfmt-dev
      libgtest-dev libgmock-dev libbenchmark-dev chromium
      pybind11-dev python3-pybind11 python3-numpy python3-pytest
      python3-venv python3-pip python3-setuptools python3-wheel)
torch=1
for arg in "$@"; do
  case "$arg" in
    --fuzz) pkgs+=(clang-14 libfuzzer-14-dev libclang-rt-14-dev) ;;
    --no-torch) torch=0 ;;
    *) echo "setup.sh: unknown option '$arg' (allowed: --fuzz, --no-torch)" >&2; exit 2 ;;
  esac
done
if ((torch)); then
  pkgs+=(libtorch-dev libgloo-dev libopenblas0-openmp python3-torch)
fi

missing=()
for p in "${pkgs[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if ((${#missing[@]})); then
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  echo "setup.sh: installing ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" >/dev/null
fi

if [ ! -f build/build.ninja ]; then
  torch_flag=ON
  if ((!torch)); then torch_flag=OFF; fi
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DPython_EXECUTABLE=/usr/bin/python3 -DSLUICE_TORCH=$torch_flag >/dev/null
fi
echo "setup.sh: ready (build directory: build/)"
