#!/bin/sh
# CTest packaging.consumer: installs a build tree into a scratch prefix with cmake --install,
# checks what the installed package asks of its consumers, then configures, builds and runs
# tests/packaging/consumer/ against it through find_package(tile).
#   consumer_test.sh <build dir> <scratch dir> <cmake> <generator> <C++ compiler>
set -eu
build=$1 work=$2 cmake=$3 generator=$4 cxx=$5
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$work"
mkdir -p "$work"

"$cmake" --install "$build" --prefix "$work/prefix" >"$work/install.log"
config_dir=$(dirname "$(find "$work/prefix" -name tileConfig.cmake)")
# The interface is libtile.so, include/tile and C++20: the private dependencies stay private.
if grep -n -E "nlohmann_json|OpenSSL|CUDA::|$build" "$config_dir"/tileTargets*.cmake; then
  echo "packaging.consumer: the exported tile::tile names a private dependency or a build path (above)" >&2
  exit 1
fi
# tile_WITH_CUDA tells a consumer whether the CUDA backend was built (TILE_WITH_CUDA of the build).
case $(sed -n 's/^TILE_WITH_CUDA:BOOL=//p' "$build/CMakeCache.txt" | tr a-z A-Z) in
  ON | 1 | TRUE | YES | Y) with_cuda=ON ;;
  *) with_cuda=OFF ;;
esac
if ! grep -q "^set(tile_WITH_CUDA $with_cuda)$" "$config_dir/tileConfig.cmake"; then
  echo "packaging.consumer: tileConfig.cmake does not set tile_WITH_CUDA to $with_cuda" >&2
  exit 1
fi
library=$(find "$work/prefix" -name libtile.so)
if readelf -d "$library" | grep -E "libnvrtc|libcuda|RPATH|RUNPATH"; then
  echo "packaging.consumer: $library links NVRTC or the driver, or carries a run path (above)" >&2
  exit 1
fi

"$cmake" -S "$here/consumer" -B "$work/build" -G "$generator" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_PREFIX_PATH="$work/prefix" >"$work/configure.log"
"$cmake" --build "$work/build"
"$work/build/tile_consumer"
