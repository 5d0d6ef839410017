#!/usr/bin/env bash
# Sets up, builds with the `ci` preset, runs every test (GPU tests skip visibly without a GPU)
# and builds the docs with warnings as errors.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="/usr/local/cuda/bin:$PATH"
scripts/setup.sh
cmake --preset ci
cmake --build --preset ci
ctest --preset ci -j2
.venv/bin/sphinx-build -W --keep-going -q -b html docs/source docs/_build/html
echo "docs: built docs/_build/html"
