#!/usr/bin/env bash
# Builds the wheel with pip (pyproject.toml), checks its binaries, installs it into a fresh virtual
# environment and runs the CPU Python tests (tests/python, not marked gpu) against the installed
# package, from a folder where the source tree's python/ is not importable.
#
#   scripts/test_wheel.sh            # python3, in build/wheel-test/
#   PYTHON=python3.12 scripts/test_wheel.sh
#   WORK_DIR=/tmp/tile-wheel scripts/test_wheel.sh
#   scripts/test_wheel.sh -Ccmake.define.TILE_WITH_CUDA=OFF   # arguments go to pip wheel
#
# Checks: the extension's only run path is $ORIGIN, libtile.so has none and neither links
# libnvrtc nor libcuda (both are loaded at run time), and `import tile` resolves to the venv.
# Needs what scripts/setup.sh installs, and PyPI for the build requirements, numpy and pytest.
set -euo pipefail
if [ "${1:-}" = --help ] || [ "${1:-}" = -h ]; then
  sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'
  exit 0
fi
cd "$(dirname "$0")/.."
root=$PWD
python=${PYTHON:-python3}
work=$(realpath -m "${WORK_DIR:-build/wheel-test}")
rm -rf "$work"
mkdir -p "$work/dist" "$work/run"

"$python" -m venv "$work/venv"
venv_python="$work/venv/bin/python"
"$venv_python" -m pip wheel -q --no-deps -w "$work/dist" "$@" .
wheel=$(ls "$work"/dist/tile-*.whl)
echo "test_wheel: built $wheel"
"$venv_python" -m pip install -q "$wheel[test]"

site=$("$venv_python" -c 'import sysconfig; print(sysconfig.get_paths()["platlib"])')
fail() { echo "test_wheel: $*" >&2; exit 1; }
for so in "$site"/tile/_tile*.so "$site"/tile/libtile.so; do
  [ -f "$so" ] || fail "missing $so"
  dynamic=$(readelf -d "$so")
  if grep -E "libnvrtc|libcuda" <<<"$dynamic"; then fail "$so links NVRTC or the driver (above)"; fi
  paths=$(grep -E "\((RPATH|RUNPATH)\)" <<<"$dynamic" | sed 's/.*\[\(.*\)\]/\1/' || true)
  case "$so" in
    */libtile.so) [ -z "$paths" ] || fail "$so has a run path: $paths" ;;
    *) [ "$paths" = '$ORIGIN' ] || fail "$so: expected the run path \$ORIGIN, got '$paths'" ;;
  esac
done

cd "$work/run"
"$venv_python" -c '
import sys, tile
assert tile.__file__.startswith(sys.prefix), f"tile imported from {tile.__file__}, not the venv"
print("test_wheel: tile", tile.build_info()["version"], "from", tile.__file__)'
PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 "$venv_python" -m pytest -p no:cacheprovider --import-mode=importlib \
  -q -ra -m "not gpu" "$root/tests/python"
