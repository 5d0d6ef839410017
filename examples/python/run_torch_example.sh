#!/bin/sh
# CTest entry for the torch examples (llama_train.py, llama_decode.py):
#   run_torch_example.sh <python> <folder holding tile/> <cpu|gpu|gpu2> <script> [arguments...]
# Prints "[  SKIPPED ]" (CTest's skip pattern) and succeeds where the interpreter lacks torch or
# transformers (CI has neither), or, for gpu / gpu2, where torch sees fewer than 1 / 2 GPUs.
# gpu2 runs the script under torchrun with two processes. TILE_PYTHON and TILE_PYTHONPATH
# override the interpreter and the folder, as for the Python tests.
python=${TILE_PYTHON:-$1}
export PYTHONPATH="${TILE_PYTHONPATH:-$2}"
# CTest runs each test in a folder of its own, so a relative folder would name another place.
case ${TILE_PYTHONPATH:-/} in
  /*) ;;
  *) echo "$(basename "$4" .py): TILE_PYTHONPATH must be an absolute path (CTest runs each test in its own folder), got '$TILE_PYTHONPATH'" >&2
     exit 1 ;;
esac
need=$3
script=$4
shift 4
name=$(basename "$script" .py)
if ! why=$("$python" -c 'import torch, transformers' 2>&1); then
  echo "[  SKIPPED ] $name: torch and transformers are not importable by $python ($(echo "$why" | tail -n 1))"
  exit 0
fi
gpus=$("$python" -c 'import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)')
case $need in
  gpu) if [ "$gpus" -lt 1 ]; then echo "[  SKIPPED ] $name: torch sees no CUDA device"; exit 0; fi ;;
  gpu2) if [ "$gpus" -lt 2 ]; then echo "[  SKIPPED ] $name: needs 2 GPUs, torch sees $gpus"; exit 0; fi
        exec "$python" -m torch.distributed.run --standalone --nproc_per_node=2 "$script" "$@" ;;
esac
exec "$python" "$script" "$@"
