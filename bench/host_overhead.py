"""Host time per call of tile's Python operators against torch eager, for torch CUDA tensors.

    PYTHONPATH=build/ci/python python3 bench/host_overhead.py [--ops softmax,rms_norm] [--dtype float32]
                                                              [--calls 200] [--repeats 25] [--out host.json]

One sample issues `calls` launches back to back, timed with time.perf_counter, then synchronizes
once outside the timed span: host microseconds per call, what the Python API costs the calling
thread. `calls` stays well under the launch queue's depth (about a thousand), so a GPU slower
than the host never blocks the loop; wall_us also counts the synchronize (about max(host, GPU)).
Each number is the median of `repeats` samples, with the garbage collector off while timing.

Variants: tile with out= given, tile allocating its output, torch eager with out= (softmax and
log_softmax only: the norms have no out=) and torch eager allocating. Shapes: the four seed
shapes and decode sizes (1, 8, 64 rows x 4096 and 16384 columns).

Needs torch with a CUDA device and the tile package (the folder holding tile/ on PYTHONPATH);
reads nothing else of bench/.
"""

import argparse
import gc
import json
import statistics
import sys
import time

OPS = ["softmax", "log_softmax", "rms_norm", "layer_norm"]
SEED_SHAPES = [(37, 1537), (256, 3072), (768, 6144), (1024, 4096)]
DECODE_SHAPES = [(rows, cols) for cols in (4096, 16384) for rows in (1, 8, 64)]
EPS = {"rms_norm": 1e-6, "layer_norm": 1e-5}


def fail(why):
    print(f"host_overhead: {why}", file=sys.stderr)
    sys.exit(2)


def variants(torch, tile, op, x, w, b, y):
    """name -> a no-argument callable issuing one launch."""
    F = torch.nn.functional
    cols = x.shape[-1]
    eps = EPS.get(op)
    if op in ("softmax", "log_softmax"):
        tile_fn, torch_fn = getattr(tile, op), getattr(torch, op)
        out = {"tile_out": lambda: tile_fn(x, out=y), "tile_alloc": lambda: tile_fn(x)}
        try:
            torch_fn(x, -1, out=y)
            out["torch_out"] = lambda: torch_fn(x, -1, out=y)
        except TypeError:  # builds without the public out= overload
            inner = getattr(torch, "_" + op)
            out["torch_out"] = lambda: inner(x, -1, False, out=y)
        out["torch_alloc"] = lambda: torch_fn(x, -1)
        return out
    if op == "rms_norm":
        return {"tile_out": lambda: tile.rms_norm(x, weight=w, eps=eps, out=y),
                "tile_alloc": lambda: tile.rms_norm(x, weight=w, eps=eps),
                "torch_alloc": lambda: F.rms_norm(x, (cols,), w, eps)}
    return {"tile_out": lambda: tile.layer_norm(x, weight=w, bias=b, eps=eps, out=y),
            "tile_alloc": lambda: tile.layer_norm(x, weight=w, bias=b, eps=eps),
            "torch_alloc": lambda: F.layer_norm(x, (cols,), w, b, eps)}


def measure(torch, fn, calls, repeats):
    """(host_us, wall_us) per call: medians over `repeats` samples of `calls` launches."""
    for _ in range(20):  # compile, load and settle the caches
        fn()
    torch.cuda.synchronize()
    host, wall = [], []
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        for _ in range(repeats):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            t1 = time.perf_counter()
            torch.cuda.synchronize()
            t2 = time.perf_counter()
            host.append((t1 - t0) / calls * 1e6)
            wall.append((t2 - t0) / calls * 1e6)
    finally:
        if gc_was_enabled:
            gc.enable()
    return statistics.median(host), statistics.median(wall)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ops", default=",".join(OPS), help="comma-separated operators (default: all four)")
    parser.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    parser.add_argument("--calls", type=int, default=200, help="launches per timed sample (default 200)")
    parser.add_argument("--repeats", type=int, default=25, help="samples per number; the median is kept")
    parser.add_argument("--out", help="also write the results as JSON to this file")
    args = parser.parse_args()
    ops = args.ops.split(",")
    for op in ops:
        if op not in OPS:
            fail(f"--ops: expected names from {', '.join(OPS)}, got {op!r}")

    try:
        import torch
    except ImportError as e:
        fail(f"needs torch with a CUDA device; torch is not importable ({e})")
    if not torch.cuda.is_available():
        fail("needs torch with a CUDA device; torch sees none")
    try:
        import tile
    except ImportError as e:
        fail(f"the tile package is not importable ({e}); put the folder holding tile/ on PYTHONPATH, "
             "e.g. PYTHONPATH=build/ci/python")

    dtype = getattr(torch, args.dtype)
    rows = []
    print(f"host us per call, median of {args.repeats} x {args.calls} calls, {args.dtype}, "
          f"{torch.cuda.get_device_name()}; wall (with the synchronize) in brackets")
    header = f"{'op':<12}{'shape':>14}" + "".join(f"{v:>22}" for v in
                                                  ("tile_out", "tile_alloc", "torch_out", "torch_alloc"))
    print(header)
    for op in ops:
        for shape in SEED_SHAPES + DECODE_SHAPES:
            g = torch.Generator(device="cuda").manual_seed(0)
            x = torch.randn(shape, generator=g, device="cuda").to(dtype)
            w = torch.randn(shape[-1], generator=g, device="cuda").to(dtype)
            b = torch.randn(shape[-1], generator=g, device="cuda").to(dtype)
            y = torch.empty_like(x)
            cells = {}
            for name, fn in variants(torch, tile, op, x, w, b, y).items():
                host_us, wall_us = measure(torch, fn, args.calls, args.repeats)
                cells[name] = f"{host_us:8.2f} [{wall_us:8.2f}]"
                rows.append({"op": op, "shape": list(shape), "variant": name, "host_us": round(host_us, 3),
                             "wall_us": round(wall_us, 3)})
            shape_s = "x".join(map(str, shape))
            print(f"{op:<12}{shape_s:>14}" + "".join(f"{cells.get(v, '-'):>22}" for v in
                                                   ("tile_out", "tile_alloc", "torch_out", "torch_alloc")))

    if args.out:
        result = {"what": "host microseconds per call (batched, time.perf_counter)", "dtype": args.dtype,
                  "calls": args.calls, "repeats": args.repeats, "device": torch.cuda.get_device_name(),
                  "torch": torch.__version__, "python": sys.version.split()[0], "tile": tile.build_info(),
                  "rows": rows}
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
