"""Host time per call of tile's Python operators against torch eager, for torch CUDA tensors.

    PYTHONPATH=build/ci/python python3 bench/host_overhead.py [--ops softmax,rms_norm] [--dtype float32]
                                                              [--calls 200] [--repeats 25] [--out host.json]

One sample issues `calls` launches back to back, timed with time.perf_counter, then synchronizes
once outside the timed span: host microseconds per call, what the Python API costs the calling
thread. `calls` stays well under the launch queue's depth (about a thousand), so a GPU slower
than the host never blocks the loop; wall_us also counts the synchronize (about max(host, GPU)).
Each number is the median of `repeats` samples, with the garbage collector off while timing; the
variants of a shape take turns, one sample each per round, so that drift over the run falls on
all of them alike.

Variants: tile with out= given and tile allocating its output (taken in eager when no input
requires grad), tile through its custom op (torch.ops.tile.*, the path of torch.compile and of
tensor subclasses), tile with x requiring grad (the forward's host time, its autograd node
included), tile's training step (x, and the norms' weight and bias, requiring grad: forward, then
backward with a fixed output gradient; several kernels a step, the gradients' accumulation into
.grad included, so on large
shapes the GPU may bound a sample), tile's backward alone (tile_bwd: one backward pass through a
retained graph, the forward run once before timing; the backward operators' host time, the
accumulation into .grad included), torch eager with out= (softmax and log_softmax only: the
norms have no out=), torch eager allocating, with x requiring grad, its training step and its
backward alone.
tile_* take the package's default path: through tile._torch_C (C++ entry, C++ autograd node)
where that extension is loaded (build_info()["torch_extension"] == "loaded"), else the Python
paths (the direct launch of tile/__init__.py, the eager torch.autograd.Function). Where it is
loaded, tile_*_py time the same calls with it switched off, so one run reports both. Shapes:
the four seed shapes and decode sizes (1, 8, 64 rows x 4096 and 16384 columns). cross_entropy
(rows of logits, a class per row, the mean loss; no out= on either side) has no tile_out and no
torch_out.

Needs torch with a CUDA device and the tile package (the folder holding tile/ on PYTHONPATH);
reads nothing else of bench/.
"""

import argparse
import gc
import json
import statistics
import sys
import time

OPS = ["softmax", "log_softmax", "rms_norm", "layer_norm", "cross_entropy"]
SEED_SHAPES = [(37, 1537), (256, 3072), (768, 6144), (1024, 4096)]
DECODE_SHAPES = [(rows, cols) for cols in (4096, 16384) for rows in (1, 8, 64)]
EPS = {"rms_norm": 1e-6, "layer_norm": 1e-5}


def fail(why):
    print(f"host_overhead: {why}", file=sys.stderr)
    sys.exit(2)


VARIANTS = ("tile_out", "tile_alloc", "tile_op", "tile_grad", "tile_step", "tile_bwd", "tile_out_py", "tile_alloc_py",
            "tile_grad_py", "tile_step_py", "tile_bwd_py", "torch_out", "torch_alloc", "torch_grad", "torch_step",
            "torch_bwd")
# Timed with tile._torch_C switched off (tile._ext = None): the Python paths.
PYTHON_PATHS = ("tile_out_py", "tile_alloc_py", "tile_grad_py", "tile_step_py", "tile_bwd_py")


def variants(torch, tile, op, x, w, b, y):
    """name -> a no-argument callable issuing one launch (with x requiring grad: the forward;
    a step: the forward and its backward)."""
    out = _variants(torch, tile, op, x, w, b, y)
    xg = x.detach().requires_grad_()
    F, cols = torch.nn.functional, x.shape[-1]
    if op == "cross_entropy":
        # The loss (mean over the rows) of every logits row; a step is the loss and its backward.
        target = _targets(torch, x)
        tile_fwd, torch_fwd = lambda: tile.cross_entropy(xg, target), lambda: F.cross_entropy(xg, target)
        dy = None
    else:
        # A training step's: the weight and bias require grad too (their gradients are summed
        # over the rows, on both sides).
        dy, wg, bg = torch.randn_like(x), w.detach().requires_grad_(), b.detach().requires_grad_()
        tile_fwd = {"softmax": lambda: tile.softmax(xg), "log_softmax": lambda: tile.log_softmax(xg),
                    "rms_norm": lambda: tile.rms_norm(xg, weight=wg, eps=EPS.get(op)),
                    "layer_norm": lambda: tile.layer_norm(xg, weight=wg, bias=bg, eps=EPS.get(op))}[op]
        torch_fwd = {"softmax": lambda: torch.softmax(xg, -1), "log_softmax": lambda: torch.log_softmax(xg, -1),
                     "rms_norm": lambda: F.rms_norm(xg, (cols,), wg, EPS.get(op)),
                     "layer_norm": lambda: F.layer_norm(xg, (cols,), wg, bg, EPS.get(op))}[op]
    out["tile_step"] = lambda: tile_fwd().backward(dy)
    out["torch_step"] = lambda: torch_fwd().backward(dy)
    out["tile_bwd"] = _backward_only(tile_fwd, dy)
    out["torch_bwd"] = _backward_only(torch_fwd, dy)
    for name in PYTHON_PATHS:
        if name[:-len("_py")] in out:
            out[name] = out[name[:-len("_py")]]
    # Made on first call, so that the _py variant records its node with the extension off.
    out["tile_bwd_py"] = _backward_only(tile_fwd, dy)
    return out


def _backward_only(forward, dy):
    """The backward alone, again and again through one retained graph: the forward runs once,
    on the first call (outside the timed samples: measure() warms up), then each call is one
    backward pass (its kernels and the gradient's accumulation into x.grad)."""
    graph = []

    def call():
        if not graph:
            graph.append(forward())
        graph[0].backward(dy, retain_graph=True)
    return call


def _targets(torch, x):
    """A class index per row of x (int64), from a fixed seed."""
    g = torch.Generator(device=x.device).manual_seed(1)
    return torch.randint(0, x.shape[-1], x.shape[:-1], generator=g, device=x.device)


def _variants(torch, tile, op, x, w, b, y):
    F = torch.nn.functional
    ops = torch.ops.tile
    cols = x.shape[-1]
    eps = EPS.get(op)
    xg = x.detach().requires_grad_()
    if op == "cross_entropy":  # no out= on either side; torch's is the causal-LM loss call
        target = _targets(torch, x)
        return {"tile_alloc": lambda: tile.cross_entropy(x, target),
                "tile_op": lambda: ops.cross_entropy(x, target, -100, "mean", 0.0, 0.0, None),
                "tile_grad": lambda: tile.cross_entropy(xg, target),
                "torch_alloc": lambda: F.cross_entropy(x, target),
                "torch_grad": lambda: F.cross_entropy(xg, target)}
    if op in ("softmax", "log_softmax"):
        tile_fn, torch_fn, op_fn = getattr(tile, op), getattr(torch, op), getattr(ops, op)
        out = {"tile_out": lambda: tile_fn(x, out=y), "tile_alloc": lambda: tile_fn(x), "tile_op": lambda: op_fn(x),
               "tile_grad": lambda: tile_fn(xg)}
        try:
            torch_fn(x, -1, out=y)
            out["torch_out"] = lambda: torch_fn(x, -1, out=y)
        except TypeError:  # builds without the public out= overload
            inner = getattr(torch, "_" + op)
            out["torch_out"] = lambda: inner(x, -1, False, out=y)
        out["torch_alloc"] = lambda: torch_fn(x, -1)
        out["torch_grad"] = lambda: torch_fn(xg, -1)
        return out
    if op == "rms_norm":
        return {"tile_out": lambda: tile.rms_norm(x, weight=w, eps=eps, out=y),
                "tile_alloc": lambda: tile.rms_norm(x, weight=w, eps=eps),
                "tile_op": lambda: ops.rms_norm(x, w, eps),
                "tile_grad": lambda: tile.rms_norm(xg, weight=w, eps=eps),
                "torch_alloc": lambda: F.rms_norm(x, (cols,), w, eps),
                "torch_grad": lambda: F.rms_norm(xg, (cols,), w, eps)}
    return {"tile_out": lambda: tile.layer_norm(x, weight=w, bias=b, eps=eps, out=y),
            "tile_alloc": lambda: tile.layer_norm(x, weight=w, bias=b, eps=eps),
            "tile_op": lambda: ops.layer_norm(x, w, b, eps),
            "tile_grad": lambda: tile.layer_norm(xg, weight=w, bias=b, eps=eps),
            "torch_alloc": lambda: F.layer_norm(x, (cols,), w, b, eps),
            "torch_grad": lambda: F.layer_norm(xg, (cols,), w, b, eps)}


def measure(fns, calls, repeats, sync, switch):
    """name -> (host_us, wall_us) per call: medians over `repeats` samples of `calls` launches.
    The variants take turns, one sample each per round, so that a drift of the machine over the
    run (clocks, the allocator, other tenants) falls on all of them alike rather than on
    whichever was timed in that stretch; `switch(name)` sets the path before each sample."""
    for name, fn in fns.items():
        switch(name)
        for _ in range(20):  # compile, load and settle the caches
            fn()
    sync()
    samples = {name: ([], []) for name in fns}
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        for _ in range(repeats):
            for name, fn in fns.items():
                switch(name)
                sync()
                t0 = time.perf_counter()
                for _ in range(calls):
                    fn()
                t1 = time.perf_counter()
                sync()
                t2 = time.perf_counter()
                samples[name][0].append((t1 - t0) / calls * 1e6)
                samples[name][1].append((t2 - t0) / calls * 1e6)
    finally:
        if gc_was_enabled:
            gc.enable()
    return {name: (statistics.median(h), statistics.median(w)) for name, (h, w) in samples.items()}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ops", default=",".join(OPS), help="comma-separated operators (default: all five)")
    parser.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    parser.add_argument("--calls", type=int, default=200, help="launches per timed sample (default 200)")
    parser.add_argument("--repeats", type=int, default=25, help="samples per number; the median is kept")
    parser.add_argument("--out", help="also write the results as JSON to this file")
    parser.add_argument("--shapes", help="comma-separated RxC shapes instead of the seed and decode shapes")
    parser.add_argument("--stub-launch", action="store_true",
                        help="with --device cpu: tile's launch returns its outputs without running the kernel, so "
                             "that tile's columns time only the Python side of a call (routing, checks, autograd)")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                        help="cpu: a smoke run of the script (the CPU backend executes the kernel within the call, "
                             "so its times are not host overhead)")
    args = parser.parse_args()
    shapes = SEED_SHAPES + DECODE_SHAPES
    if args.shapes:
        try:
            shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
        except ValueError:
            fail(f"--shapes: expected comma-separated RxC, got {args.shapes!r}")
    ops = args.ops.split(",")
    for op in ops:
        if op not in OPS:
            fail(f"--ops: expected names from {', '.join(OPS)}, got {op!r}")

    try:
        import torch
    except ImportError as e:
        fail(f"needs torch with a CUDA device; torch is not importable ({e})")
    if args.stub_launch and args.device != "cpu":
        fail("--stub-launch needs --device cpu")
    if args.device == "cuda" and not torch.cuda.is_available():
        fail("needs torch with a CUDA device; torch sees none")
    device = args.device
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    device_name = torch.cuda.get_device_name() if device == "cuda" else "cpu (smoke run)"
    try:
        import tile
    except ImportError as e:
        fail(f"the tile package is not importable ({e}); put the folder holding tile/ on PYTHONPATH, "
             "e.g. PYTHONPATH=build/ci/python")

    extension = tile._ext                       # tile._torch_C where loaded, else None
    if args.stub_launch:
        device_name = "cpu (launch stubbed: the Python side only)"
        extension = tile._ext = None            # it launches in C++: the stub would not see its calls

        def stub(op, x, out, weight, bias, eps, plan, stream, dtype, record, stats=()):
            y = torch.empty_like(x) if out is None else out
            return (y, *(torch.empty(x.shape[:-1]) for _ in stats)) if stats else y
        tile._launch = stub     # both the direct path and the ops' implementations call it

    dtype = getattr(torch, args.dtype)
    rows = []
    print(f"host us per call, median of {args.repeats} x {args.calls} calls, {args.dtype}, "
          f"{device_name}; wall (with the synchronize) in brackets")
    header = f"{'op':<12}{'shape':>14}" + "".join(f"{v:>22}" for v in VARIANTS)
    print(header)
    for op in ops:
        for shape in shapes:
            g = torch.Generator(device=device).manual_seed(0)
            x = torch.randn(shape, generator=g, device=device).to(dtype)
            w = torch.randn(shape[-1], generator=g, device=device).to(dtype)
            b = torch.randn(shape[-1], generator=g, device=device).to(dtype)
            y = torch.empty_like(x)
            cells = {}
            # Without the extension, tile_*_py are the same calls as tile_*: not timed twice.
            fns = {name: fn for name, fn in variants(torch, tile, op, x, w, b, y).items()
                   if not (name in PYTHON_PATHS and extension is None)}

            def switch(name):
                tile._ext = None if name in PYTHON_PATHS else extension
            try:
                times = measure(fns, args.calls, args.repeats, sync, switch)
            finally:
                tile._ext = extension
            for name, (host_us, wall_us) in times.items():
                cells[name] = f"{host_us:8.2f} [{wall_us:8.2f}]"
                rows.append({"op": op, "shape": list(shape), "variant": name, "host_us": round(host_us, 3),
                             "wall_us": round(wall_us, 3)})
            shape_s = "x".join(map(str, shape))
            print(f"{op:<12}{shape_s:>14}" + "".join(f"{cells.get(v, '-'):>22}" for v in VARIANTS))

    if args.out:
        result = {"what": "host microseconds per call (batched, time.perf_counter)", "dtype": args.dtype,
                  "torch_extension": tile.build_info().get("torch_extension", "not in this version"),
                  "calls": args.calls, "repeats": args.repeats, "device": device_name,
                  "torch": torch.__version__, "python": sys.version.split()[0], "tile": tile.build_info(),
                  "rows": rows}
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
