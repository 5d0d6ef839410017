#!/bin/sh
# repeat_cpu.sh PYTHON PACKAGE_DIR OUT_DIR: the runner end to end on the CPU backend (timings
# meaningless there; rounds, oracle, schema and provenance real), then the audit of its run.
set -e
python=${TILE_PYTHON:-$1}; package_dir=${TILE_PYTHONPATH:-$2}; out=$3
root="$(cd "$(dirname "$0")/../.." && pwd)"
rm -rf "$out"
PYTHONPATH="$package_dir" "$python" "$root/bench/repeat.py" --backend cpu \
  --case softmax:37x1537:f32 --case rms_norm:64x1000:f16 --case layer_norm:33x257:f32 \
  --variant reference='{"programs_per_group":1,"workers_per_program":64}' \
  --variant candidate='{"programs_per_group":2,"workers_per_program":64}' \
  --variant policy=policy \
  --rounds 2 --samples 3 --warmup-ms 5 --target-ms 2 --out "$out"
"$python" "$root/bench/audit.py" "$out/run.json" --require-sources
