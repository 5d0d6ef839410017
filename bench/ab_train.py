#!/usr/bin/env python3
"""Two builds of Tile's training operators against each other, in one session on one GPU.

bench/train_sweep.py runs once per build and round, each run in a process of its own whose
PYTHONPATH holds that build's `tile` package (--a, --b), in ABBA order over --rounds pairs (A B,
B A, A B, ...), so a drift of the machine over the session falls on both builds alike. Every
run measures the same points with the same seeds and checks every output against the float64
references before timing it (train_sweep's method, its docstring). Per point the result gives
each build's median time over its runs, the spread of its runs, B's speed-up (A's time / B's)
and the percent of the same-run copy of each, and the torch eager peer where it ran.

    python bench/ab_train.py --a build/py-base --b build/python-312 --rounds 2 --out ab.json \\
        --markdown ab.md -- --ops layer_norm_backward --ns 1024 4096 --peers torch_eager

Arguments after `--` go to every train_sweep run. A run that fails stops the comparison (its
output is printed); the file is written after every run, so what was measured is kept.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def key(point: dict) -> tuple:
    return (point["op"], point["dtype"], point["n"])


def run_sweep(pythonpath: str, sweep_args: list[str], out: Path) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (pythonpath, env.get("PYTHONPATH", "")) if p)
    cmd = [sys.executable, str(HERE / "train_sweep.py"), "--out", str(out), *sweep_args]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.stdout.write(proc.stdout[-4000:])
        sys.stderr.write(proc.stderr[-4000:])
        raise SystemExit(f"ab_train: train_sweep failed (exit {proc.returncode}) for PYTHONPATH={pythonpath}")
    return json.loads(out.read_text())


def abba(rounds: int) -> list[str]:
    """The builds in run order: A B, then B A, then A B, ..."""
    return [b for i in range(rounds) for b in (("A", "B") if i % 2 == 0 else ("B", "A"))]


def summarise(runs: list[dict]) -> list[dict]:
    """Per point: each build's median ms and runs, B's speed-up and percent of copy."""
    times: dict[tuple, dict[str, list]] = {}
    for run in runs:
        for point in run["result"]["points"]:
            tile = point["impls"].get("tile", {})
            if "ms" not in tile:
                continue
            entry = times.setdefault(key(point), {"A": [], "B": [], "copy": [], "eager": []})
            entry[run["build"]].append(tile["ms"])
            entry["copy"].append(point["copy"]["ms"])
            eager = point["impls"].get("torch_eager", {})
            if "ms" in eager:
                entry["eager"].append(eager["ms"])
    rows = []
    for (op, dtype, n), t in sorted(times.items()):
        if not t["A"] or not t["B"]:
            continue
        a, b, copy = statistics.median(t["A"]), statistics.median(t["B"]), statistics.median(t["copy"])
        rows.append({
            "op": op, "dtype": dtype, "n": n,
            "a_ms": a, "b_ms": b, "a_runs_ms": t["A"], "b_runs_ms": t["B"],
            "speedup": a / b,
            "a_pct_of_copy": 100 * copy / a, "b_pct_of_copy": 100 * copy / b,
            "eager_ms": statistics.median(t["eager"]) if t["eager"] else None,
        })
    return rows


def markdown(rows: list[dict], meta: dict) -> str:
    lines = [f"A: {meta['a']}, B: {meta['b']}; {meta['rounds']} rounds (ABBA), medians of each build's runs.", "",
             "| operator | dtype | N | A µs | B µs | A / B | A % of copy | B % of copy | B / torch eager |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        eager = f"{r['eager_ms'] / r['b_ms']:.2f}×" if r["eager_ms"] else "—"
        lines.append(f"| {r['op']} | {r['dtype']} | {r['n']} | {1000 * r['a_ms']:.1f} | {1000 * r['b_ms']:.1f} | "
                     f"{r['speedup']:.3f} | {r['a_pct_of_copy']:.1f} | {r['b_pct_of_copy']:.1f} | {eager} |")
    if rows:
        geo = 1.0
        for r in rows:
            geo *= r["speedup"]
        geo **= 1 / len(rows)
        lines += ["", f"Geometric mean of A / B over {len(rows)} points: {geo:.3f}; "
                      f"range {min(r['speedup'] for r in rows):.3f}–{max(r['speedup'] for r in rows):.3f}."]
    return "\n".join(lines) + "\n"


def main() -> int:
    argv = sys.argv[1:]
    sweep_args: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, sweep_args = argv[:cut], argv[cut + 1:]
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--a", required=True, help="PYTHONPATH entry holding build A's tile package (the baseline)")
    ap.add_argument("--b", required=True, help="PYTHONPATH entry holding build B's tile package")
    ap.add_argument("--rounds", type=int, default=2, help="pairs of runs, ABBA order (default 2)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--markdown", type=Path, help="also write the table")
    args = ap.parse_args(argv)
    if args.rounds < 1:
        ap.error(f"--rounds: expected at least 1, got {args.rounds}")
    meta = {"a": args.a, "b": args.b, "rounds": args.rounds, "sweep_args": sweep_args,
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    runs: list[dict] = []
    order = abba(args.rounds)
    with tempfile.TemporaryDirectory() as tmp:
        for i, build in enumerate(order):
            path = args.a if build == "A" else args.b
            print(f"ab_train: run {i + 1}/{len(order)}, build {build} ({path})", flush=True)
            result = run_sweep(path, sweep_args, Path(tmp) / f"run{i}.json")
            runs.append({"build": build, "pythonpath": path, "result": result})
            rows = summarise(runs)
            args.out.write_text(json.dumps({"schema": "tile-ab-train/1", **meta, "complete": i + 1 == len(order),
                                            "points": rows, "runs": runs}, indent=1))
    table = markdown(summarise(runs), meta)
    print(table)
    if args.markdown:
        args.markdown.write_text(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
