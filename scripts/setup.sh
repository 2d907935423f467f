#!/usr/bin/env bash
# Installs what sluice needs on Debian 12 (apt) and configures the build in build/.
# Idempotent: installs only missing packages, reconfigures only when needed.
#
#   bash scripts/setup.sh            # build + test dependencies, configure build/
#   bash scripts/setup.sh --fuzz     # also clang-14 + libFuzzer (for scripts/fuzz.sh)
set -euo pipefail
cd "$(dirname "$0")/.."

pkgs=(cmake ninja-build g++ ccache pkg-config
      nlohmann-json3-dev libcli11-dev libfmt-dev
      libgtest-dev libgmock-dev libbenchmark-dev)
for arg in "$@"; do
  case "$arg" in
    --fuzz) pkgs+=(clang-14 libfuzzer-14-dev libclang-rt-14-dev) ;;
    *) echo "setup.sh: unknown option '$arg' (allowed: --fuzz)" >&2; exit 2 ;;
  esac
done

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
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DPython_EXECUTABLE=/usr/bin/python3 >/dev/null
fi
echo "setup.sh: ready (build directory: build/)"
