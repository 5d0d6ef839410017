#!/usr/bin/env bash
# Installs the benchmark peers QuACK and Liger-Kernel (with the CUTLASS DSL and its libraries)
# from wheels downloaded beforehand, on a machine without an index (the GPU machine). Wheels
# are never committed; how they are fetched and split is in docs/source/performance/tile/training.md.
#
#   bench/install_peers.sh [--target DIR] [--no-import-check] FOLDER...
#
# FOLDER...: folders holding the wheels, the parts of a wheel split with `split` (NAME.whl.part-00,
# NAME.whl.part-01, ...) and an MD5SUMS file (md5sum's format) naming every wheel and part; the
# parts may be spread over several folders. The parts are joined in name order, every file in
# MD5SUMS must be present (after joining) and match, and then every wheel is installed with
# `pip install --no-index --no-deps --target DIR` (default /tmp/site) by $PYTHON (default
# python3). The CUTLASS DSL wheel's .pth file is not read from a --target folder, so the script
# ends by printing the PYTHONPATH to use: DIR and DIR/nvidia_cutlass_dsl/dsl_packages.
# PEERS_PIP_ARGS adds arguments to pip (e.g. `--python-version 3.12 --only-binary=:all:` to try
# the install on another Python); --no-import-check skips importing quack and liger_kernel.
set -euo pipefail

target=/tmp/site
import_check=1
folders=()
while [ $# -gt 0 ]; do
  case "$1" in
    --target) target=${2:?install_peers: --target needs a folder}; shift 2 ;;
    --target=*) target=${1#--target=}; shift ;;
    --no-import-check) import_check=0; shift ;;
    -h|--help) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "install_peers: unknown option $1" >&2; exit 2 ;;
    *) folders+=("$1"); shift ;;
  esac
done
if [ ${#folders[@]} -eq 0 ]; then
  echo "install_peers: give at least one folder of wheels (see --help)" >&2
  exit 2
fi
python=${PYTHON:-python3}

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT

# Gather everything into one folder; two folders may both carry MD5SUMS, but not two different ones.
for f in "${folders[@]}"; do
  [ -d "$f" ] || { echo "install_peers: $f is not a folder" >&2; exit 1; }
  shopt -s nullglob
  for p in "$f"/*.whl "$f"/*.whl.part-*; do cp "$p" "$stage/"; done
  shopt -u nullglob
  if [ -f "$f/MD5SUMS" ]; then
    if [ -f "$stage/MD5SUMS" ] && ! cmp -s "$f/MD5SUMS" "$stage/MD5SUMS"; then
      echo "install_peers: $f/MD5SUMS differs from the MD5SUMS of an earlier folder" >&2
      exit 1
    fi
    cp "$f/MD5SUMS" "$stage/MD5SUMS"
  fi
done
[ -f "$stage/MD5SUMS" ] || { echo "install_peers: no MD5SUMS in ${folders[*]}" >&2; exit 1; }

cd "$stage"
# The parts present first, so a damaged part is named as such; then the joined wheels.
if grep -q '\.whl\.part-' MD5SUMS; then
  grep '\.whl\.part-' MD5SUMS | md5sum --quiet --ignore-missing -c - ||
    { echo "install_peers: a part does not match its md5" >&2; exit 1; }
fi
for whl in $(ls -- *.whl.part-* 2>/dev/null | sed 's/\.part-[^.]*$//' | sort -u); do
  parts=$(ls -- "$whl".part-* | sort)
  cat $parts > "$whl"
  echo "install_peers: joined $whl from" $parts
  rm -f -- $parts
done
missing=0
while read -r _ name; do
  case "$name" in *.whl) [ -f "$name" ] || { echo "install_peers: missing wheel $name" >&2; missing=1; } ;; esac
done < MD5SUMS
[ $missing -eq 0 ] || exit 1
grep -v '\.whl\.part-' MD5SUMS | md5sum -c - ||
  { echo "install_peers: a wheel does not match its md5 (a part missing or damaged?)" >&2; exit 1; }

mkdir -p "$target"
# shellcheck disable=SC2086  # PEERS_PIP_ARGS is a list of words on purpose
"$python" -m pip install --no-index --no-deps --disable-pip-version-check --target "$target" ${PEERS_PIP_ARGS:-} ./*.whl
cd - >/dev/null

pythonpath="$target:$target/nvidia_cutlass_dsl/dsl_packages"
if [ $import_check -eq 1 ]; then
  PYTHONPATH="$pythonpath${PYTHONPATH:+:$PYTHONPATH}" "$python" -c '
import importlib.metadata as md
import liger_kernel, quack
print("install_peers: quack", quack.__version__, "liger-kernel", md.version("liger-kernel"),
      "nvidia-cutlass-dsl", md.version("nvidia-cutlass-dsl"))'
fi
echo "export PYTHONPATH=$pythonpath\${PYTHONPATH:+:\$PYTHONPATH}"
