#!/usr/bin/env python3
"""Two builds of Tile, kernel against kernel: the GPU duration of the default plan's kernel of
`tile run` for build A and build B, per operator x dtype x shape, measured by Nsight Compute
(`gpu__time_duration.sum`, clocks left as they are, caches flushed before each profiled
kernel). Back-to-back event timing of small calls (bench/ab_compare.py) also measures the host
path of `tile::run` where a kernel lasts a few microseconds; this measures the kernel alone.

Order per point: A, B, then for the norms (the operators being compared) B, A again; the
reported time of a build is the median of its runs. Every run's output is checked against the
float64 oracle by `tile run` (a point whose check fails stops the script).

    python3 bench/kernel_ab.py --a OLD_DIR --b NEW_DIR --shape 37x1537 --shape 1024x4096 --out ab.json

OLD_DIR and NEW_DIR each hold a `tile` binary and its libtile.so; `ncu` must be on PATH.
"""
import argparse
import csv
import io
import json
import os
import statistics
import subprocess
import sys

OPS = ["softmax", "log_softmax", "rms_norm", "layer_norm"]


def duration_us(build, op, dtype, shape):
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = os.path.abspath(build) + ":" + env.get("LD_LIBRARY_PATH", "")
    cmd = ["ncu", "--clock-control", "none", "--cache-control", "all", "--metrics", "gpu__time_duration.sum",
           "--csv", "--print-units", "base", "--kernel-name", "regex:^tile_", os.path.join(build, "tile"), "run",
           "--op", op, "--shape", shape, "--dtype", dtype, "--backend", "cuda", "--show", "check"]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    rows = [r for r in csv.reader(io.StringIO(p.stdout)) if len(r) > 5]
    values = []
    if rows:
        head = rows[0]
        name, value = head.index("Metric Name"), head.index("Metric Value")
        values = [float(r[value].replace(",", "")) for r in rows[1:] if r[name] == "gpu__time_duration.sum"]
    if p.returncode != 0 or not values or "oracle (float64): PASS" not in p.stdout:
        sys.exit(f"kernel_ab: {' '.join(cmd)} failed ({p.returncode}):\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
    return values[0] / 1e3  # ns -> us


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--a", required=True, help="build A: a folder with tile and libtile.so")
    ap.add_argument("--b", required=True, help="build B")
    ap.add_argument("--shape", action="append", required=True, help="RxC, repeatable")
    ap.add_argument("--op", action="append", choices=OPS, help="repeatable (default: all four)")
    ap.add_argument("--dtype", action="append", choices=["f32", "bf16", "f16"], help="repeatable (default: f32, bf16)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    doc = {"method": __doc__.split("\n\n")[0], "a": args.a, "b": args.b, "points": {}}
    for shape in args.shape:
        for dtype in args.dtype or ["f32", "bf16"]:
            for op in args.op or OPS:
                a = [duration_us(args.a, op, dtype, shape)]
                b = [duration_us(args.b, op, dtype, shape)]
                if "norm" in op:
                    b.append(duration_us(args.b, op, dtype, shape))
                    a.append(duration_us(args.a, op, dtype, shape))
                speed = statistics.median(a) / statistics.median(b)
                key = f"{op} {dtype} {shape}"
                doc["points"][key] = {"a_us": a, "b_us": b, "speedup": speed}
                print(f"{key:32s} A {' '.join(f'{v:7.2f}' for v in a):16s} B {' '.join(f'{v:7.2f}' for v in b):16s} "
                      f"B/A speed {speed:.3f}", flush=True)
    speeds = [p["speedup"] for p in doc["points"].values()]
    doc["geomean_speedup"] = statistics.geometric_mean(speeds)
    print(f"geometric mean speed-up B/A {doc['geomean_speedup']:.3f}, min {min(speeds):.3f}, max {max(speeds):.3f} "
          f"over {len(speeds)} points")
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1:])
