#!/usr/bin/env bash
# Builds the Python extension tile._tile on its own (python/CMakeLists.txt as a top-level
# project) against an already built libtile.so: what a GPU machine without nlohmann-json or
# gtest needs. Only the headers of include/tile/, src/backend/cuda/{driver,jit_module}.hpp and
# src/target/target.hpp (with the src/ headers it includes), <cuda.h>, nanobind for the chosen
# Python, and libtile.so are used.
#
#   scripts/build_python.sh                        # python3 on PATH, build/ci/libtile.so
#   PYTHON=/opt/torch/.venv/bin/python3 scripts/build_python.sh
#   TILE_LIBRARY=build/dev/libtile.so scripts/build_python.sh
#   TILE_GIT_COMMIT=<sha> scripts/build_python.sh  # names the tree's commit (wins over its .git)
#   BUILD_DIR=build/my-python scripts/build_python.sh
#   TILE_LIBRARY=build/cpu-only/libtile.so scripts/build_python.sh -DTILE_WITH_CUDA=OFF  # no CUDA headers
#   TILE_TORCH_EXTENSION=ON scripts/build_python.sh   # also tile._torch_C, against that Python's torch
#                                                     # (AUTO: where it imports torch; OFF: the default)
#
# The package lands in build/python-<major><minor>/tile/; put build/python-<major><minor> on
# PYTHONPATH. Extra arguments go to the CMake configure step.
set -euo pipefail
cd "$(dirname "$0")/.."

python=${PYTHON:-$(command -v python3)}
library=$(realpath -m "${TILE_LIBRARY:-build/ci/libtile.so}")
tag=$("$python" -c 'import sys; print(f"{sys.version_info[0]}{sys.version_info[1]}")')
build=${BUILD_DIR:-build/python-$tag}
export PATH="/usr/local/cuda/bin:$PATH"  # CUDAToolkit (for <cuda.h>) is found through nvcc

if [ ! -f "$library" ]; then
  echo "build_python: no libtile.so at $library (build it with: cmake --preset ci && cmake --build --preset ci)" >&2
  exit 1
fi
if ! "$python" -m nanobind --cmake_dir >/dev/null 2>&1; then
  echo "build_python: $python has no nanobind (pip install nanobind==3.1.0)" >&2
  exit 1
fi

generator=()
if command -v ninja >/dev/null; then generator=(-G Ninja); fi
# tile.build_info() reports the commit given as TILE_GIT_COMMIT, else the checkout's HEAD.
commit=()
if [ -n "${TILE_GIT_COMMIT:-}" ]; then commit=(-DTILE_GIT_COMMIT="$TILE_GIT_COMMIT"); fi
# The torch extension (python/cmake/torch_extension.cmake) is built only when asked.
torch_ext=(-DTILE_TORCH_EXTENSION="${TILE_TORCH_EXTENSION:-OFF}")

cmake -S python -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
  -DTILE_ROOT="$PWD" -DTILE_LIBRARY="$library" -DPython_EXECUTABLE="$python" "${commit[@]}" "${torch_ext[@]}" "$@"
cmake --build "$build" -j "$(nproc)"

cat <<EOF

build_python: built $(ls "$build"/tile/_tile*.so "$build"/tile/_torch_C*.so 2>/dev/null | tr '\n' ' ')
  against $library
Use it:
  PYTHONPATH=$PWD/$build $python -c 'import tile; print(tile.build_info())'
Test it (python.cpu: numpy on the CPU backend; python.gpu: torch on the GPU):
  ctest --test-dir $build --output-on-failure
  PYTHONPATH=$PWD/$build $python -m pytest -p no:cacheprovider tests/python -m gpu
EOF
