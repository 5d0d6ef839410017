#!/usr/bin/env bash
# Long rows on a cluster against re-reading them, on one GPU: for softmax and rms_norm at four
# long-row shapes, the policy's re-read plan (ctas_per_program 1) and the cluster plans C x W
# (C groups of W workers) whose slices fit the private budget with at least two stripes, W = 512
# also with two resident groups an SM where the slice is at most 32 scalars (64 registers, no spills). One line per plan: kernel us, GB/s, copy GB/s, % of copy,
# the plan launched. Each point is checked against the float64 oracle first (~1.6 s a point,
# about 130 s in all). Usage: bench/cluster_probe.sh [path/to/tile]   (default build/ci/tile)
set -euo pipefail
TILE=${1:-build/ci/tile}
OPS=(--op softmax --op rms_norm)

# dtype shape plans...
run() {
  local dtype=$1 shape=$2
  shift 2
  for plan in "$@"; do
    "$TILE" bench --dtype "$dtype" --shape "$shape" "${OPS[@]}" --plan "$plan" | grep -v -E '^(device|op) ' ||
      echo "$dtype $shape $plan: FAILED"
  done
}

# Cluster plans at `cols` for elements of `vec` per access: the private budget (64) bounds a
# worker's slice from above, two stripes from below.
plans() {
  local cols=$1 vec=$2
  echo '{"ctas_per_program":1}'
  for C in 2 4 8 16; do
    for W in 256 512 1024; do
      local stripes=$(((cols + C * W * vec - 1) / (C * W * vec)))
      ((stripes * vec <= 64 && stripes >= 2)) || continue
      echo "{\"ctas_per_program\":$C,\"workers_per_program\":$W}"
      ((W == 512 && stripes * vec <= 32)) && echo "{\"ctas_per_program\":$C,\"workers_per_program\":$W,\"resident_groups\":2}"
    done
  done
  return 0
}

"$TILE" bench --dtype f32 --shape 1x1024 --op softmax | head -2
for case in "f32 256x262144 4" "f32 4096x16384 4" "bf16 2048x32768 8" "bf16 256x262144 8"; do
  read -r dtype shape vec <<<"$case"
  mapfile -t list < <(plans "${shape#*x}" "$vec")
  run "$dtype" "$shape" "${list[@]}"
done
