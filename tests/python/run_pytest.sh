#!/bin/sh
# CTest entry for the Python tests: run_pytest.sh <python> <cpu|errors|gpu> <folder holding tile/>.
# TILE_PYTHON and TILE_PYTHONPATH override the interpreter and the folder, e.g. on a GPU machine
# where the extension was built for another Python by scripts/build_python.sh.
python=${TILE_PYTHON:-$1}
mode=$2
package_dir=${TILE_PYTHONPATH:-$3}
# CTest runs each test in a folder of its own, so a relative folder would name another place.
case ${TILE_PYTHONPATH:-/} in
  /*) ;;
  *) echo "python.$mode: TILE_PYTHONPATH must be an absolute path (CTest runs each test in its own folder), got '$TILE_PYTHONPATH'" >&2
     exit 1 ;;
esac
if [ ! -x "$python" ]; then
  if [ "$mode" = gpu ]; then
    echo "[  SKIPPED ] python.gpu: no Python interpreter at '$python' (set TILE_PYTHON and TILE_PYTHONPATH)"
    exit 0
  fi
  echo "python.$mode: no Python interpreter at '$python'" >&2
  exit 1
fi
exec "$python" "$(dirname "$0")/run_pytest.py" "$mode" "$package_dir"
