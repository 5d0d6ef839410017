#!/usr/bin/env bash
# Sets up, builds with the `ci` preset, runs every test (GPU tests skip visibly without a GPU),
# builds the wheel and runs the CPU Python tests against it installed in a fresh venv
# (scripts/test_wheel.sh), and builds the docs with warnings as errors.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="/usr/local/cuda/bin:$PATH"
scripts/setup.sh
cmake --preset ci
cmake --build --preset ci
ctest --preset ci -j2
scripts/test_wheel.sh
.venv/bin/sphinx-build -W --keep-going -q -b html docs/source docs/_build/html
echo "docs: built docs/_build/html"
