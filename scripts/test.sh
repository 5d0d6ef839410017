#!/usr/bin/env bash
# Sets up, builds with the `ci` preset, runs every test (GPU tests skip visibly without a GPU),
# builds and tests the `cpu-only` preset (TILE_WITH_CUDA=OFF: every test that needs no CUDA, and
# no CUDA header in any object of that build), builds the wheel and runs the CPU Python tests
# against it installed in a fresh venv (scripts/test_wheel.sh), and builds the docs with
# warnings as errors.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="/usr/local/cuda/bin:$PATH"
scripts/setup.sh
cmake --preset ci
cmake --build --preset ci
ctest --preset ci -j2
# The fuzz's summary line (seed, cases run, failures, coverage), which CTest keeps in its log.
grep -h "^fuzz: seed" build/ci/Testing/Temporary/LastTest*.log || echo "test: no fuzz summary in the CTest log" >&2
cmake --preset cpu-only
cmake --build --preset cpu-only
# Ninja's dependency log lists every header each object was compiled with.
if ninja -C build/cpu-only -t deps | grep -E "/(cuda|nvrtc)\.h$"; then
  echo "test: the cpu-only build (TILE_WITH_CUDA=OFF) included a CUDA header (above)" >&2
  exit 1
fi
ctest --preset cpu-only -j2
scripts/test_wheel.sh
.venv/bin/sphinx-build -W --keep-going -q -b html docs/source docs/_build/html
echo "docs: built docs/_build/html"
