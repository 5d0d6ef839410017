#!/usr/bin/env python3
"""Bandwidth of Tile's training operators and their peers, with a same-run device-copy line.

Operators: softmax_backward, rms_norm_backward, layer_norm_backward, fused_add_rms_norm (the
forward) and cross_entropy_fwd_bwd (the loss of every row and the gradient of their sum, in one
call where the implementation has the fused in-place form). For the first four, each dtype and
N, the rows are chosen so that one rows x N input holds about --input-mib MiB; cross-entropy has
--ce-rows rows of bf16 logits at each vocabulary size (N = vocabulary). Every implementation's
outputs are checked against float64 references computed by torch on the GPU from the same
inputs before it is timed (bench/sweep.py's tolerances, widened by a bound on the rounding
errors of results computed by cancellation: MAG_RTOL x the output's formula over absolute
values). A time is the median of --batches CUDA-event-timed batches of back-to-back calls, each
about --batch-ms long, the whole call included (a second kernel folding weight-gradient
partials, allocations, host synchronisation). The copy line is a device-to-device copy of the
same number of bytes, timed the same way in the same process. Bytes = every tensor read once +
every output written once (BYTES, recorded in the result; partial sums an implementation keeps
are not counted). The first call of each implementation (compile, autotune, JIT) is timed
apart and reported.

    python bench/train_sweep.py --out bench/results/train-sweep-h200.json
    python bench/train_sweep.py --quick --out /tmp/train-quick.json     # 3 points, small inputs

A run past --deadline-s stops before its next point (the file says complete: false); the same
command with --resume adds the missing points.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
import types
import zlib
from pathlib import Path

OPS = ["softmax_backward", "rms_norm_backward", "layer_norm_backward", "fused_add_rms_norm", "cross_entropy_fwd_bwd"]
DTYPES = ["bf16", "f32"]
ELEMENT_SIZE = {"bf16": 2, "f32": 4}
NS = [1024, 4096, 8192, 16384, 32768, 65536, 131072, 262144]
VOCABS = [32000, 50257, 128256, 151936, 262144]
PEERS = ["torch_eager", "torch_compile", "liger", "quack"]
KIND = "training"
DEVICE = "cuda"  # where inputs are made (a module variable so a CPU dry run can change it)

# Bytes each operator must move, R rows of N elements of es bytes: (formula, function).
BYTES = {
    "softmax_backward": ("3·R·N·es: y and dy read, dx written",
                         lambda r, n, es: 3 * r * n * es),
    "rms_norm_backward": ("3·R·N·es + 2·N·es + 4·R: dy and x read, dx written; weight read, dweight written; "
                          "rstd (fp32) read",
                          lambda r, n, es: 3 * r * n * es + 2 * n * es + 4 * r),
    "layer_norm_backward": ("3·R·N·es + 3·N·es + 8·R: dy and x read, dx written; weight read, dweight and dbias "
                            "written; mean and rstd (fp32) read",
                            lambda r, n, es: 3 * r * n * es + 3 * n * es + 8 * r),
    "fused_add_rms_norm": ("4·R·N·es + N·es: x and residual read, y and residual_out written; weight read",
                           lambda r, n, es: 4 * r * n * es + n * es),
    "cross_entropy_fwd_bwd": ("2·R·N·es + 12·R: logits read, dlogits written (N = vocabulary); int64 target read, "
                              "fp32 loss written",
                              lambda r, n, es: 2 * r * n * es + 12 * r),
}
OUTPUTS = {"softmax_backward": ["dx"], "rms_norm_backward": ["dx", "dweight"],
           "layer_norm_backward": ["dx", "dweight", "dbias"], "fused_add_rms_norm": ["y", "residual_out"],
           "cross_entropy_fwd_bwd": ["loss", "dlogits"],
           # Cases without peers, for bench/train_regret.py: make_case and references cover them too.
           "log_softmax_backward": ["dx"], "fused_add_rms_norm_backward": ["dx", "dresidual", "dweight"]}
# The oracle's bound adds MAG_RTOL x the output's formula over absolute values: one rounding of
# every term to the dtype (bf16: 2^-8, the unit roundoff); for f32, the sums' float32 rounding.
MAG_RTOL = {"bf16": 2.0**-8, "f32": 2e-5}
# --quick: one small point per operator, of these three by default.
QUICK = {"softmax_backward": ("f32", 8192), "rms_norm_backward": ("bf16", 4096),
         "layer_norm_backward": ("f32", 8192), "fused_add_rms_norm": ("bf16", 4096),
         "cross_entropy_fwd_bwd": ("bf16", 32000)}
QUICK_OPS = ["rms_norm_backward", "fused_add_rms_norm", "cross_entropy_fwd_bwd"]
QUICK_SIZES = {"input_mib": 32, "ce_rows": 512, "batch_ms": 5, "batches": 3}


def rows_for(op, dtype, n, input_mib, ce_rows):
    if op == "cross_entropy_fwd_bwd":
        return ce_rows
    return max(1, int(input_mib * 2**20 / (n * ELEMENT_SIZE[dtype])))


def nbytes(op, dtype, rows, n):
    return BYTES[op][1](rows, n, ELEMENT_SIZE[dtype])


def planned(args):
    """The (op, dtype, n) points of this run, in run order."""
    if args.quick:
        return [(op, *QUICK[op]) for op in args.ops]
    pts = []
    for op in args.ops:
        if op == "cross_entropy_fwd_bwd":
            pts += [(op, "bf16", v) for v in args.vocabs]
        else:
            pts += [(op, d, n) for d in args.dtypes for n in args.ns]
    return pts


# --------------------------------------------------------------------------------------------
# The document's training fields, checked without torch (a run checks its own file before
# writing it; tests/bench/test_train_sweep.py checks synthetic ones).


def validate(doc):
    """The problems of a training tile-sweep/1 document, as messages (empty: valid). Beyond what
    bench/plot_sweep.py's reader checks: the kind, the byte formulas, each point's bytes
    recomputed from its op, dtype, rows and N, and each entry holding exactly one of a time that
    passed the oracle, an error or a refusal."""
    out = []
    if not isinstance(doc, dict):
        return ["the document is not an object"]
    if doc.get("schema") != "tile-sweep/1":
        out.append(f"schema is {doc.get('schema')!r}, expected 'tile-sweep/1'")
    if doc.get("kind") != KIND:
        out.append(f"kind is {doc.get('kind')!r}, expected {KIND!r}")
    formulas = doc.get("bytes_formulas")
    if not isinstance(formulas, dict) or not formulas:
        out.append("bytes_formulas missing or empty")
        formulas = {}
    for op, text in formulas.items():
        if op not in BYTES or text != BYTES[op][0]:
            out.append(f"bytes_formulas.{op} is not the formula of bench/train_sweep.py ({text!r})")
    points = doc.get("points")
    if not isinstance(points, list):
        return out + ["points is not a list"]
    seen = set()
    for i, p in enumerate(points):
        where = f"points[{i}]"
        if not isinstance(p, dict):
            out.append(f"{where}: not an object")
            continue
        op, dtype, n, rows = p.get("op"), p.get("dtype"), p.get("n"), p.get("rows")
        if op not in BYTES or dtype not in ELEMENT_SIZE or not isinstance(n, int) or not isinstance(rows, int):
            out.append(f"{where}: op, dtype, n or rows missing or unknown ({op!r}, {dtype!r}, {n!r}, {rows!r})")
            continue
        where = f"{where} ({op} {dtype} N={n})"
        if (op, dtype, n) in seen:
            out.append(f"{where}: a second point for the same op, dtype and N")
        seen.add((op, dtype, n))
        if op not in formulas:
            out.append(f"{where}: no byte formula for {op}")
        if p.get("bytes") != nbytes(op, dtype, rows, n):
            out.append(f"{where}: bytes = {p.get('bytes')!r}, the formula gives {nbytes(op, dtype, rows, n)}")
        copy = p.get("copy")
        if not (isinstance(copy, dict) and _pos(copy.get("ms")) and _pos(copy.get("gbs"))):
            out.append(f"{where}: copy.ms / copy.gbs missing or not positive")
        impls = p.get("impls")
        if p.get("bytes_formula") != BYTES[op][0]:
            out.append(f"{where}: bytes_formula is not the formula of {op}")
        if not isinstance(impls, dict) or "tile" not in impls:
            out.append(f"{where}: impls missing or without tile")
            continue
        for name, e in impls.items():
            kinds = [k for k in ("ms", "error", "unsupported") if k in e] if isinstance(e, dict) else []
            if len(kinds) != 1:
                out.append(f"{where}: impls.{name} holds {kinds or 'nothing'}, expected exactly one of ms, error, "
                           "unsupported")
                continue
            if kinds == ["ms"]:
                o = e.get("oracle")
                if not (_pos(e["ms"]) and isinstance(o, dict) and o.get("passed") is True):
                    out.append(f"{where}: impls.{name} has a time without a passed oracle or a positive ms")
                elif set(o.get("outputs", {})) != set(OUTPUTS[op]):
                    out.append(f"{where}: impls.{name}.oracle.outputs checks {sorted(o.get('outputs', {}))}, "
                               f"expected {OUTPUTS[op]}")
    return out


def _pos(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0


# --------------------------------------------------------------------------------------------
# Inputs, references and the run (torch from here on).


def make_case(op, dtype, n, rows, gen):
    """The inputs of one point: x, dy, residual ~ N(0, 1), weight 1 + 0.5 N(0, 1), bias 0.5 N(0, 1),
    y = softmax(N(0, 1)) (log_softmax for log_softmax_backward) rounded to the dtype, rstd and
    mean of x in float32, logits N(0, 4), targets uniform; fused_add_rms_norm_backward: x is the
    forward's residual_out, and dresidual_out ~ N(0, 1)."""
    import torch
    tdt = {"bf16": torch.bfloat16, "f32": torch.float32}[dtype]

    def randn(*shape, scale=1.0, shift=0.0):
        return (shift + scale * torch.randn(*shape, device=DEVICE, generator=gen)).to(tdt)

    c = types.SimpleNamespace()
    if op == "cross_entropy_fwd_bwd":
        c.logits = randn(rows, n, scale=2.0)
        c.target = torch.randint(0, n, (rows,), device=DEVICE, generator=gen)
        return c
    c.x = randn(rows, n)
    if op in ("softmax_backward", "log_softmax_backward"):
        c.y = (torch.softmax if op == "softmax_backward" else torch.log_softmax)(c.x.float(), -1).to(tdt)
        c.dy = randn(rows, n)
        del c.x
        return c
    c.weight = randn(n, scale=0.5, shift=1.0)
    if op == "fused_add_rms_norm":
        c.residual = randn(rows, n)
        return c
    c.dy = randn(rows, n)
    x64 = c.x.double()
    if op in ("rms_norm_backward", "fused_add_rms_norm_backward"):
        c.rstd = torch.rsqrt(x64.pow(2).mean(-1) + 1e-6).float()
        if op == "fused_add_rms_norm_backward":
            c.dresidual_out = randn(rows, n)
    else:
        c.bias = randn(n, scale=0.5)
        c.mean = x64.mean(-1).float()
        c.rstd = torch.rsqrt((x64 - x64.mean(-1, keepdim=True)).pow(2).mean(-1) + 1e-5).float()
    return c


def references(op, c):
    """[(reference, magnitude)] per output in float64: magnitude is the output's formula over
    absolute values, the scale of the rounding errors of a result computed by cancellation."""
    import torch
    if op == "softmax_backward":
        y, dy = c.y.double(), c.dy.double()
        s = (y * dy).sum(-1, keepdim=True)
        return [(y * (dy - s), y.abs() * (dy.abs() + (y * dy).abs().sum(-1, keepdim=True)))]
    if op == "log_softmax_backward":
        p, dy = c.y.double().exp(), c.dy.double()
        return [(dy - p * dy.sum(-1, keepdim=True), dy.abs() + p * dy.abs().sum(-1, keepdim=True))]
    if op == "cross_entropy_fwd_bwd":
        z = c.logits.double()
        lse = torch.logsumexp(z, -1)
        zt = z.gather(1, c.target[:, None])[:, 0]
        p = torch.exp(z - lse[:, None])
        del z  # 4096 x 262144 in float64 is 8 GiB: no more copies than needed
        t = c.target[:, None]
        mag = p.clone().scatter_add_(1, t, torch.ones_like(t, dtype=p.dtype))
        return [(lse - zt, lse.abs() + zt.abs()), (p.scatter_add_(1, t, -torch.ones_like(t, dtype=p.dtype)), mag)]
    x, w = c.x.double(), c.weight.double()
    n = x.shape[-1]
    if op == "fused_add_rms_norm":
        r = c.residual.double()
        h = x + r
        rstd = torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
        return [(h * rstd * w, (x.abs() + r.abs()) * rstd * w.abs()), (h, x.abs() + r.abs())]
    dy, rstd = c.dy.double(), c.rstd.double()[:, None]
    g = dy * w
    if op in ("rms_norm_backward", "fused_add_rms_norm_backward"):
        xhat, axhat = x * rstd, x.abs() * rstd
        dx = rstd * (g - xhat * (g * xhat).sum(-1, keepdim=True) / n)
        mdx = rstd * (g.abs() + axhat * (g * xhat).abs().sum(-1, keepdim=True) / n)
        dweight = ((dy * xhat).sum(0), (dy.abs() * axhat).sum(0))
        if op == "rms_norm_backward":
            return [(dx, mdx), dweight]
        # dx and dresidual are both rms_norm_backward's dx + dresidual_out, in their dtypes.
        dr = c.dresidual_out.double()
        dh = (dx + dr, mdx + dr.abs())
        return [dh, dh, dweight]
    mean = c.mean.double()[:, None]
    xhat, axhat = (x - mean) * rstd, (x.abs() + mean.abs()) * rstd
    dx = rstd * (g - (g.sum(-1, keepdim=True) + xhat * (g * xhat).sum(-1, keepdim=True)) / n)
    mdx = rstd * (g.abs() + (g.abs().sum(-1, keepdim=True) + axhat * (g.abs() * axhat).sum(-1, keepdim=True)) / n)
    return [(dx, mdx), ((dy * xhat).sum(0), (dy.abs() * axhat).sum(0)), (dy.sum(0), dy.abs().sum(0))]


def check_outputs(sweep, op, outs, refs, dtype):
    """The oracle's verdict over every output (bench/sweep.py's check, one output at a time)."""
    outs = tuple(outs)
    if len(outs) != len(refs):
        return {"passed": False, "mismatches": -1, "max_abs_error": float("nan"),
                "outputs": {}, "why": f"{len(outs)} outputs, expected {len(refs)} ({', '.join(OUTPUTS[op])})"}
    res = {}
    for name, y, (ref, mag) in zip(OUTPUTS[op], outs, refs):
        y = None if y is None else y.detach()
        if y is None or tuple(y.shape) != tuple(ref.shape):
            res[name] = {"passed": False, "mismatches": -1, "max_abs_error": float("nan"),
                         "why": f"shape {None if y is None else tuple(y.shape)}, expected {tuple(ref.shape)}"}
            continue
        flat = (lambda t: t.reshape(1, -1)) if y.dim() == 1 else (lambda t: t)
        res[name] = sweep.check(flat(y), flat(ref), dtype, MAG_RTOL[dtype] * flat(mag))
    return {"passed": all(r["passed"] for r in res.values()),
            "mismatches": sum(max(r["mismatches"], 0) for r in res.values()),
            "max_abs_error": max(r["max_abs_error"] for r in res.values()), "outputs": res}


def tile_kernels(events):
    return [{k: e.get(k) for k in ("op", "kernel", "plan", "compile_ms", "cache_origin")} for e in events]


def run_point(sweep, train_peers, tile_log, op, dtype, n, args, gen):
    import torch
    rows = rows_for(op, dtype, n, args.input_mib, args.ce_rows)
    total = nbytes(op, dtype, rows, n)
    case = make_case(op, dtype, n, rows, gen)
    refs = references(op, case)
    copy = sweep.copy_line(total, args.batch_ms, args.batches)
    point = {"op": op, "dtype": dtype, "n": n, "rows": rows, "bytes": total, "bytes_formula": BYTES[op][0],
             "copy": copy, "impls": {}}
    for name in ["tile"] + args.peers:
        entry = {}
        try:
            fn, entry["note"] = train_peers.make(name, op, case)
            # The first call compiles, autotunes or JIT-compiles: timed apart, never in the numbers.
            with tile_log.collect() as events:
                outs, entry["first_call_s"] = sweep.first_call(fn)
            if name == "tile":
                entry["kernels"] = tile_kernels(events)
                entry["plan"] = events[0]["plan"] if events else None
            oracle = check_outputs(sweep, op, outs, refs, dtype)
            del outs
            sweep.time_checked(entry, fn, oracle, total, copy["ms"], args.batch_ms, args.batches)
        except train_peers.Unsupported as e:
            entry = {"unsupported": str(e)}
        except Exception as e:  # a peer failing is recorded, never silently dropped
            entry.pop("ms", None)
            entry["error"] = f"{type(e).__name__}: {e}"
        fn = None
        point["impls"][name] = entry
        torch.cuda.synchronize()
    del case, refs
    torch.cuda.empty_cache()
    return point


def parse(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ops", nargs="+", choices=OPS, help=f"default: all; with --quick: {' '.join(QUICK_OPS)}")
    ap.add_argument("--dtypes", nargs="+", default=DTYPES, choices=DTYPES, help="dtypes of the first four operators")
    ap.add_argument("--ns", nargs="+", type=int, default=NS, help="row lengths of the first four operators")
    ap.add_argument("--vocabs", nargs="+", type=int, default=VOCABS, help="cross-entropy vocabulary sizes (bf16)")
    ap.add_argument("--peers", nargs="+", default=PEERS, choices=PEERS)
    ap.add_argument("--input-mib", type=float, default=256, help="size of one rows x N input (default 256)")
    ap.add_argument("--ce-rows", type=int, default=4096, help="cross-entropy rows (default 4096)")
    ap.add_argument("--batch-ms", type=float, default=10, help="length of one timed batch (default 10)")
    ap.add_argument("--batches", type=int, default=5, help="timed batches per implementation (default 5)")
    ap.add_argument("--quick", action="store_true",
                    help=f"one small point per operator ({', '.join(f'{o} {d} N={n}' for o, (d, n) in QUICK.items())}), "
                         f"{QUICK_SIZES['input_mib']} MiB inputs, {QUICK_SIZES['ce_rows']} cross-entropy rows, "
                         f"{QUICK_SIZES['batches']} batches of {QUICK_SIZES['batch_ms']} ms: a smoke test")
    ap.add_argument("--resume", action="store_true", help="keep the points already in --out and add the others")
    ap.add_argument("--deadline-s", type=float, default=None,
                    help="start no point after this many seconds; exit 3 with the file incomplete")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    if args.ops is None:
        args.ops = QUICK_OPS if args.quick else OPS
    if args.quick:
        for k, v in QUICK_SIZES.items():
            setattr(args, k, v)
    return args


def main(argv):
    args = parse(argv)
    import torch
    if not torch.cuda.is_available():
        raise SystemExit("train_sweep.py: needs a CUDA device")
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import sweep
    import train_peers
    from tile import _log as tile_log  # the kernels (and plans) a call compiled or loaded

    todo = planned(args)
    if args.resume and args.out.exists():
        problems = validate(json.loads(args.out.read_text()))
        if problems:
            raise SystemExit(f"train_sweep.py: --resume: {args.out} is not a valid training sweep: {problems[0]}")
    points = sweep.resumed(args, set(todo))
    done = {(p["op"], p["dtype"], p["n"]) for p in points}
    extra = {"kind": KIND, "bytes_formulas": {op: BYTES[op][0] for op in args.ops}}

    def save(partial):
        sweep.write(args, points, partial, method=__doc__, extra=extra)

    gen = torch.Generator(device="cuda").manual_seed(20261130)
    start = time.monotonic()
    for i, (op, dtype, n) in enumerate(todo, 1):
        if (op, dtype, n) in done:
            continue
        if sweep.past_deadline(args, start, points, len(todo), method=__doc__, extra=extra):
            return 3
        gen.manual_seed(zlib.crc32(f"{op} {dtype} {n}".encode()))  # each point's inputs, whatever ran before
        t0 = time.monotonic()
        point = run_point(sweep, train_peers, tile_log, op, dtype, n, args, gen)
        point["wall_s"] = round(time.monotonic() - t0, 2)
        points.append(point)
        problems = validate({"schema": "tile-sweep/1", **extra, "points": points})
        if problems:
            raise SystemExit(f"train_sweep.py: internal error, the document would be invalid: {problems[0]}")
        save(partial=True)  # a run cut short keeps every finished point
        cells = []
        for k, v in point["impls"].items():
            cells.append(f"{k}={v['pct_of_copy']:.0f}%" if "pct_of_copy" in v else
                         f"{k}=n/a" if "unsupported" in v else f"{k}=ERROR")
        print(f"[{i}/{len(todo)}] {op} {dtype} N={n} rows={point['rows']}: copy {point['copy']['gbs']:.0f} GB/s; "
              f"{' '.join(cells)} ({point['wall_s']:.1f} s)", flush=True)
    points.sort(key=lambda p: todo.index((p["op"], p["dtype"], p["n"])))
    save(partial=False)
    print(f"wrote {args.out} ({len(points)} points, {time.monotonic() - start:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
