#!/usr/bin/env bash
# Installs what building and testing Tile needs on a Debian or Ubuntu machine that already has
# the CUDA toolkit (nvcc, NVRTC) under /usr/local/cuda, and a Python environment for the docs.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(cmake ninja-build g++ libgtest-dev nlohmann-json3-dev libcli11-dev libssl-dev python3 python3-dev python3-venv)
missing=()
for p in "${packages[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  SUDO=$([ "$(id -u)" = 0 ] && echo "" || echo sudo)
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi
# TILE_WITH_CUDA=OFF: for the cpu-only preset alone, which needs no CUDA toolkit.
if [ "${TILE_WITH_CUDA:-ON}" != OFF ] && [ ! -x /usr/local/cuda/bin/nvcc ] && ! command -v nvcc >/dev/null; then
  echo "setup: the CUDA toolkit (nvcc, NVRTC) is required under /usr/local/cuda" \
       "(TILE_WITH_CUDA=OFF scripts/setup.sh sets up the cpu-only preset alone)" >&2
  exit 1
fi

if [ ! -x .venv/bin/sphinx-build ] || ! .venv/bin/python -c "import nanobind, numpy, pytest" 2>/dev/null; then
  echo "setup: creating .venv with the documentation tools"
  python3 -m venv .venv
  .venv/bin/pip install -q -r requirements-dev.txt
fi
