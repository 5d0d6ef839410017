#!/usr/bin/env python3
"""Bandwidth of Tile and its peers over row lengths N, with a same-run device-copy line.

For each operator, dtype and N the input holds about --input-mib MiB (rows = bytes / (N *
element size)). Every implementation's output is checked against a float64 oracle (torch in
float64 on the GPU, from the stored inputs) before it is timed. A time is the median of
--batches CUDA-event-timed batches of back-to-back launches, each about --batch-ms long; the
copy line is a device-to-device copy of the same number of bytes (read + written), timed the
same way in the same process. Bytes = input read once + output written once + weight and bias.

    python bench/sweep.py --out bench/results/sweep.json

A run past --deadline-s stops before its next (dtype, N) (the file says complete: false); the
same command with --resume adds the missing points.

Small shapes (the seed shapes, decode-sized calls) take a few microseconds, less than a launch
costs the host, so back-to-back launches time the host's launch rate. For them:

    python bench/sweep.py --shapes 37x1537 1024x4096 1x4096 --graph --out bench/results/seed.json

--shapes gives rows x N instead of --ns and --input-mib; --graph times every implementation, the
copy line and an empty-kernel line (a one-element fill) as CUDA graphs of one batch's launches
replayed, the GPU time per launch without the host's launch path. An implementation that cannot
be captured in a graph is recorded with the error, not timed another way.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import sys
import time
import zlib
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import peers  # noqa: E402
import regret  # noqa: E402

import tile  # noqa: E402

OPS = ["softmax", "log_softmax", "rms_norm", "layer_norm"]
DTYPES = {"bf16": torch.bfloat16, "f32": torch.float32}
NS = [256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072, 262144]
TOL = {"f32": (2e-5, 1e-6), "bf16": (8e-3, 1e-4)}


def reference(op, x, w, b, eps):
    x64 = x.double()
    if op == "softmax":
        return torch.softmax(x64, -1)
    if op == "log_softmax":
        return torch.log_softmax(x64, -1)
    if op == "rms_norm":
        return x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + eps) * w.double()
    mean = x64.mean(-1, keepdim=True)
    var = (x64 - mean).pow(2).mean(-1, keepdim=True)
    return (x64 - mean) * torch.rsqrt(var + eps) * w.double() + b.double()


def rows_for(dtype, n, input_mib):
    """Rows of an input of about input_mib MiB."""
    es = torch.tensor([], dtype=DTYPES[dtype]).element_size()
    return max(1, int(input_mib * 2**20 / (n * es)))


def inputs(dtype, n, input_mib, gen, rows=None):
    """(rows, x, weight, bias) of about input_mib MiB (or of the rows given): x ~ N(0, 1), weight
    1 + 0.5 N(0, 1), bias 0.5 N(0, 1)."""
    tdt = DTYPES[dtype]
    rows = rows or rows_for(dtype, n, input_mib)
    x = torch.randn(rows, n, device="cuda", dtype=torch.float32, generator=gen).to(tdt)
    w = (1 + 0.5 * torch.randn(n, device="cuda", generator=gen)).to(tdt)
    b = (0.5 * torch.randn(n, device="cuda", generator=gen)).to(tdt)
    return rows, x, w, b


def tile_kwargs(op, out, w, b, eps):
    """Keyword arguments of tile.<op> / tile.run for one call writing `out`."""
    kw = {"out": out}
    if op in ("rms_norm", "layer_norm"):
        kw.update(weight=w, eps=eps)
    if op == "layer_norm":
        kw["bias"] = b
    return kw


def check(y, ref, dtype, extra_tol=None):
    """y against the float64 ref: |y - ref| <= rtol |ref| + atol max|ref of its row|, plus
    extra_tol where given (the training sweep's bound on rounding errors of results computed by
    cancellation, such as a backward pass or a sum over the rows)."""
    rtol, atol = TOL[dtype]
    err = (y.double() - ref).abs()
    row_max = ref.abs().amax(-1, keepdim=True)
    tol = rtol * ref.abs() + atol * row_max
    if extra_tol is not None:
        tol = tol + extra_tol
    bad = (err > tol) | (y.isnan() != ref.isnan())
    return {"passed": not bool(bad.any()), "mismatches": int(bad.sum()), "max_abs_error": float(err.nan_to_num().max())}


def time_ms(fn, batch_ms, batches, graph=False):
    """Median ms per call of `batches` batches of k back-to-back calls, each about batch_ms long;
    with graph, each batch is one replay of a CUDA graph holding the k calls."""
    if graph:
        return time_graph_ms(fn, batch_ms, batches)
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    k = max(1, int(batch_ms / max(median_batch_ms(fn, 1, 1), 1e-3)))

    def batch():
        for _ in range(k):
            fn()
    return median_batch_ms(batch, k, batches), k


def median_batch_ms(batch, k, batches):
    """The median over `batches` CUDA-event-timed runs of batch() (k calls each) of ms per call."""
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    per = []
    for _ in range(batches):
        start.record()
        batch()
        stop.record()
        stop.synchronize()
        per.append(start.elapsed_time(stop) / k)
    per.sort()
    return per[len(per) // 2]


def time_graph_ms(fn, batch_ms, batches):
    """time_ms's batches as replays of a CUDA graph of k calls (the GPU time per call without the
    host's launch path). k is sized from a graph of 20 calls."""
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the capture, as torch.cuda.graphs asks
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()

    def capture(k):
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(k):
                fn()
        return g

    probe = capture(20)
    probe.replay()
    torch.cuda.synchronize()
    k = max(1, min(5000, int(batch_ms / max(median_batch_ms(probe.replay, 20, 1), 1e-4))))
    del probe
    g = capture(k)
    g.replay()
    return median_batch_ms(g.replay, k, batches), k


def empty_line(batch_ms, batches, graph):
    """The floor of a launch: a fill of one element, timed like every implementation."""
    e = torch.empty(1, device="cuda")
    ms, _ = time_ms(lambda: e.fill_(0.0), batch_ms, batches, graph)
    return {"ms": ms}


def first_call(fn):
    """fn's first result and its wall time in seconds (a compile, autotune or load included)."""
    t0 = time.perf_counter()
    y = fn()
    torch.cuda.synchronize()
    return y, time.perf_counter() - t0


def copy_line(nbytes, batch_ms, batches, graph=False):
    """The roofline: a device-to-device copy of nbytes / 2 bytes (nbytes read + written), timed
    like every implementation."""
    src = torch.empty(nbytes // 2, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms, _ = time_ms(lambda: dst.copy_(src), batch_ms, batches, graph)
    return {"ms": ms, "gbs": nbytes / ms / 1e6}


def time_checked(entry, fn, oracle, nbytes, copy_ms, batch_ms, batches, graph=False):
    """Records the oracle's verdict in entry and, only if it passed, fn's time."""
    entry["oracle"] = oracle
    if not oracle["passed"]:
        entry["error"] = "failed the float64 oracle; not timed"
        return
    ms, k = time_ms(fn, batch_ms, batches, graph)
    entry.update(ms=ms, launches_per_batch=k, gbs=nbytes / ms / 1e6, pct_of_copy=100 * copy_ms / ms)


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ops", nargs="+", default=OPS, choices=OPS)
    ap.add_argument("--dtypes", nargs="+", default=list(DTYPES), choices=list(DTYPES))
    ap.add_argument("--ns", nargs="+", type=int, default=NS)
    ap.add_argument("--shapes", nargs="+", type=shape_arg, default=None, metavar="ROWSxN",
                    help="rows x N to time instead of --ns and --input-mib (seed shapes, decode sizes)")
    ap.add_argument("--graph", action="store_true",
                    help="time CUDA graphs of each batch's launches, and add an empty-kernel line")
    ap.add_argument("--peers", nargs="+", default=list(peers.PEERS), choices=list(peers.PEERS))
    ap.add_argument("--input-mib", type=float, default=512)
    ap.add_argument("--batch-ms", type=float, default=20)
    ap.add_argument("--batches", type=int, default=7)
    ap.add_argument("--resume", action="store_true", help="keep the points already in --out and add the others")
    ap.add_argument("--deadline-s", type=float, default=None,
                    help="start no case (dtype, rows, N) after this many seconds; exit 3 with the file incomplete")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("sweep.py: needs a CUDA device")

    # A case is (dtype, rows, N); a point is one operator of a case.
    cases = [(d, r, n) for d in args.dtypes for (r, n) in
             (args.shapes or [(rows_for(d, n, args.input_mib), n) for n in args.ns])]
    points = resumed(args, {(op, d, n, r) for op in args.ops for (d, r, n) in cases}, key=point_key)
    have = {point_key(p) for p in points}
    gen = torch.Generator(device="cuda")
    total = len(args.ops) * len(cases)
    done = len(points)
    start = time.monotonic()
    for dtype, rows, n in cases:
        es = torch.tensor([], dtype=DTYPES[dtype]).element_size()
        if all((op, dtype, n, rows) in have for op in args.ops):
            continue
        if past_deadline(args, start, points, total):
            return 3
        # Each case alike, resumed or not (the N-only seed keeps earlier runs' inputs).
        gen.manual_seed(zlib.crc32(f"{dtype} {n}".encode() if not args.shapes else f"{dtype} {rows}x{n}".encode()))
        rows, x, w, b = inputs(dtype, n, args.input_mib, gen, rows)
        out = torch.empty_like(x)
        empty = empty_line(args.batch_ms, args.batches, args.graph) if args.graph else None
        for op in args.ops:
            if (op, dtype, n, rows) in have:
                continue
            done += 1
            eps = peers.EPS.get(op, 0.0)
            nbytes = 2 * x.numel() * es + (n * es if op in ("rms_norm", "layer_norm") else 0) + \
                (n * es if op == "layer_norm" else 0)
            ref = reference(op, x, w, b, eps)
            copy = copy_line(nbytes, args.batch_ms, args.batches, args.graph)
            copy_ms = copy["ms"]
            point = {"op": op, "dtype": dtype, "n": n, "rows": rows, "bytes": nbytes, "copy": copy, "impls": {}}
            if empty is not None:
                point["empty"] = empty
            impls = {"tile": None, **{p: None for p in args.peers}}
            for name in impls:
                entry = {}
                try:
                    out.fill_(float("nan"))
                    if name == "tile":
                        kw = tile_kwargs(op, out, w, b, eps)
                        rec = tile.run(op, x, **kw)
                        fn = lambda kw=kw: getattr(tile, op)(x, **kw)  # noqa: E731
                        entry["plan"] = rec["plan"]
                        y = out
                    else:
                        fn, note = peers.make(name, op, x, w, b, eps, out)
                        # The first call compiles (torch.compile), autotunes or JIT-compiles
                        # (QuACK, Triton): timed apart and reported, never in the numbers.
                        y, entry["first_call_s"] = first_call(fn)
                        entry["note"] = note
                        y = out if y is None else y
                    torch.cuda.synchronize()
                    time_checked(entry, fn, check(y, ref, dtype), nbytes, copy_ms, args.batch_ms, args.batches,
                                 args.graph)
                except peers.Unsupported as e:
                    entry["unsupported"] = str(e)
                except Exception as e:  # a peer failing is recorded, never silently dropped
                    entry["error"] = f"{type(e).__name__}: {e}"
                point["impls"][name] = entry
            points.append(point)
            write(args, points, partial=True)  # a run cut short keeps every finished point
            line = " ".join(f"{k}={v.get('pct_of_copy', float('nan')):.0f}%" for k, v in point["impls"].items())
            floor = f"; empty {empty['ms'] * 1e3:.2f} us, tile {point['impls']['tile'].get('ms', float('nan')) * 1e3:.2f} us" \
                if empty is not None else ""
            print(f"[{done}/{total}] {op} {dtype} N={n} rows={rows}: copy {point['copy']['gbs']:.0f} GB/s; {line}{floor}",
                  flush=True)
        del x, w, b, out
        torch.cuda.empty_cache()

    order = {(op, d, n, r): i for i, (op, (d, r, n)) in enumerate((op, c) for c in cases for op in args.ops)}
    points.sort(key=lambda p: order[point_key(p)])
    write(args, points, partial=False)
    print(f"wrote {args.out}")
    return 0


def shape_arg(text):
    """ROWSxN as (rows, N), both positive."""
    try:
        rows, n = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected ROWSxN such as 37x1537, got {text!r}") from None
    if rows < 1 or n < 1:
        raise argparse.ArgumentTypeError(f"expected positive rows and N, got {text!r}")
    return rows, n


def point_key(p):
    """A forward point's identity: (op, dtype, N, rows)."""
    return p.get("op"), p.get("dtype"), p.get("n"), p.get("rows")


def resumed(args, keys, key=lambda p: (p.get("op"), p.get("dtype"), p.get("n"))):
    """With --resume, the points of args.out that this run plans (keys: key(point) of each)."""
    if not (getattr(args, "resume", False) and args.out.exists()):
        return []
    old = json.loads(args.out.read_text())
    if not isinstance(old, dict) or old.get("schema") != "tile-sweep/1" or not isinstance(old.get("points"), list):
        raise SystemExit(f"--resume: {args.out} is not a tile-sweep/1 document")
    points = [p for p in old["points"] if key(p) in keys]
    print(f"resuming: {len(points)} of {len(keys)} points already in {args.out}", flush=True)
    return points


def past_deadline(args, start, points, total, method=__doc__, extra=None):
    """True (after writing the points so far) once the run is past --deadline-s."""
    return regret.past_deadline(args, start, lambda partial: write(args, points, partial, method, extra),
                                total - len(points))


def write(args, points, partial, method=__doc__, extra=None):
    """The tile-sweep/1 document (bench/SCHEMA.md) of the points so far, replaced atomically;
    extra: further top-level fields (the training sweep's kind and byte formulas)."""
    doc = {"schema": "tile-sweep/1", "created": dt.datetime.now(dt.timezone.utc).isoformat(),
           "gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "python": platform.python_version(),
           "tile": tile.build_info(), "method": method.strip(), "config": vars(args) | {"out": str(args.out)},
           "complete": not partial, **(extra or {}), "points": points}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=1, default=str))
    os.replace(tmp, args.out)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
