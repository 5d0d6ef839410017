#!/usr/bin/env bash
# The packing experiment on the GPU machine (protocol.md): run.sh gate|pilots|replay|all.
# Needs build/ci (cmake --preset ci && cmake --build --preset ci) and the Python extension
# (scripts/build_python.sh). PYTHON and TILE_PYTHONPATH choose the interpreter and the
# extension's folder.
set -euo pipefail
cd "$(dirname "$0")/../.."
stage=${1:-all}
py=${PYTHON:-python3}
export TILE_PYTHON=$py
export TILE_PYTHONPATH=${TILE_PYTHONPATH:-$PWD/build/python-$($py -c 'import sys; print(f"{sys.version_info[0]}{sys.version_info[1]}")')}
export PYTHONPATH=$TILE_PYTHONPATH${PYTHONPATH:+:$PYTHONPATH}
out=experiments/packing

common='"workers_per_program":256,"vector_elems":4,"stripe_unroll":1,"caching":"registers","private_budget":64,"barrier_scope":"group"'
reference="reference={\"programs_per_group\":1,$common}"
candidate="candidate={\"programs_per_group\":2,$common}"
cases=()
for op in softmax rms_norm layer_norm; do
  for shape in 37x1537 256x3072 768x6144 1024x4096; do cases+=(--case "$op:$shape:f32"); done
done

if [ "$stage" = gate ] || [ "$stage" = all ]; then
  echo "== gate: every CTest test on these binaries"
  ctest --test-dir build/ci -j4 --output-on-failure
fi
if [ "$stage" = pilots ] || [ "$stage" = all ]; then
  for v in "$reference" "$candidate"; do
    name=${v%%=*}
    echo "== pilot: $name (correctness-checked; timings unused)"
    rm -rf "$out/$name"
    $py bench/repeat.py "${cases[@]}" --variant "$v" --no-torch --rounds 1 --samples 1 \
      --warmup-ms 10 --target-ms 2 --out "$out/$name"
  done
fi
if [ "$stage" = replay ] || [ "$stage" = all ]; then
  echo "== replay: four counterbalanced fresh-JIT rounds"
  rm -rf "$out/replay"
  $py bench/repeat.py "${cases[@]}" --variant "$reference" --variant "$candidate" \
    --rounds 4 --samples 9 --target-ms 30 --warmup-ms 200 \
    --expect-sources "$out/reference/sources" --expect-sources "$out/candidate/sources" --out "$out/replay"
  $py bench/audit.py "$out/replay/run.json" --require-sources | tee "$out/replay/audit.txt"
fi
