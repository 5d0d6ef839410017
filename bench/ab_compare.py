#!/usr/bin/env python3
"""Two builds of Tile, timed in one run: `tile bench` of build A and of build B over the same
shapes, in ABBA order across rounds (A B, then B A, ...), on one GPU.

Each `tile bench` line is one operator x dtype x shape: the default plan's median per-launch
time over 7 event-timed batches, its bandwidth and a same-bytes device copy timed the same way
in the same process; every output is checked against the float64 oracle before it is timed.
This script keeps every round's numbers and reports, per point, the median time of each build
and the speed-up B over A (A's time / B's time), plus both builds' share of the copy.

    python3 bench/ab_compare.py --a OLD_DIR --b NEW_DIR --rounds 2 --shape 37x1537 ... --out ab.json

OLD_DIR and NEW_DIR each hold a `tile` binary and its libtile.so (put first on
LD_LIBRARY_PATH, so a binary built elsewhere loads its own library).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time


def run_bench(build_dir, shapes, ops=(), dtypes=()):
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = os.path.abspath(build_dir) + ":" + env.get("LD_LIBRARY_PATH", "")
    cmd = [os.path.join(build_dir, "tile"), "bench"]
    for s in shapes:
        cmd += ["--shape", s]
    for o in ops:
        cmd += ["--op", o]
    for d in dtypes:
        cmd += ["--dtype", d]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"ab_compare: {' '.join(cmd)} failed ({out.returncode}):\n{out.stdout}\n{out.stderr}")
    points = {}
    device = ""
    for line in out.stdout.splitlines():
        if line.startswith("device "):
            device = line
        parts = line.split()
        if len(parts) >= 8 and parts[0] in ("softmax", "log_softmax", "rms_norm", "layer_norm"):
            key = f"{parts[0]} {parts[1]} {parts[2]}"
            points[key] = {"us": float(parts[3]), "gbs": float(parts[4]), "copy_gbs": float(parts[5]),
                           "pct_copy": float(parts[6].rstrip("%")), "plan": " ".join(parts[7:])}
    if not points:
        sys.exit(f"ab_compare: no results from {build_dir}:\n{out.stdout}\n{out.stderr}")
    return device, points


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--a", required=True, help="folder with build A's tile and libtile.so (the baseline)")
    ap.add_argument("--b", required=True, help="folder with build B's tile and libtile.so")
    ap.add_argument("--rounds", type=int, default=2, help="ABBA rounds (each runs both builds once)")
    ap.add_argument("--shape", action="append", required=True, help="RxC, repeatable")
    ap.add_argument("--op", action="append", default=[], help="an operator to time, repeatable (default: all four)")
    ap.add_argument("--dtype", action="append", default=[], help="an input dtype, repeatable (default: f32 and bf16)")
    ap.add_argument("--out", required=True, help="JSON file for every round's numbers and the summary")
    args = ap.parse_args()

    runs = {"a": [], "b": []}
    device = ""
    for r in range(args.rounds):
        order = ["a", "b"] if r % 2 == 0 else ["b", "a"]
        for which in order:
            t0 = time.time()
            device, points = run_bench(getattr(args, which), args.shape, args.op, args.dtype)
            runs[which].append(points)
            with open(args.out, "w") as f:  # every finished run is kept, even if a later one is cut short
                json.dump({"device": device, "shapes": args.shape, "rounds": args.rounds, "runs": runs,
                           "complete": False}, f, indent=1)
            print(f"round {r + 1}/{args.rounds}: build {which.upper()} done in {time.time() - t0:.0f} s", flush=True)

    summary = []
    print(f"{'point':34s} {'A us':>9s} {'B us':>9s} {'B/A speed':>9s} {'A %copy':>8s} {'B %copy':>8s}")
    for key in runs["a"][0]:
        a_us = statistics.median(p[key]["us"] for p in runs["a"])
        b_us = statistics.median(p[key]["us"] for p in runs["b"])
        a_pct = statistics.median(p[key]["pct_copy"] for p in runs["a"])
        b_pct = statistics.median(p[key]["pct_copy"] for p in runs["b"])
        summary.append({"point": key, "a_us": a_us, "b_us": b_us, "speedup": a_us / b_us, "a_pct_copy": a_pct,
                        "b_pct_copy": b_pct, "a_plan": runs["a"][0][key]["plan"], "b_plan": runs["b"][0][key]["plan"]})
        print(f"{key:34s} {a_us:9.2f} {b_us:9.2f} {a_us / b_us:9.3f} {a_pct:7.1f}% {b_pct:7.1f}%")
    speedups = [s["speedup"] for s in summary]
    geo = statistics.geometric_mean(speedups)
    print(f"geometric mean speed-up B/A {geo:.3f}, min {min(speedups):.3f}, max {max(speedups):.3f} "
          f"over {len(speedups)} points")
    with open(args.out, "w") as f:
        json.dump({"device": device, "shapes": args.shape, "rounds": args.rounds, "runs": runs, "summary": summary,
                   "geomean_speedup": geo, "complete": True}, f, indent=1)


if __name__ == "__main__":
    main()
