#!/usr/bin/env python3
"""The analytic policy's regret for the training operators: its plan timed against a family of
plans around it, as bench/regret.py does for the forward operators.

Operators (Tile's programs, tile.builtin(name)): softmax_backward, log_softmax_backward,
rms_norm_backward, layer_norm_backward, fused_add_rms_norm (the forward),
fused_add_rms_norm_backward and cross_entropy_fused (the per-row loss, reduction "none", and the
gradient of their sum written over the logits). Shapes and inputs are bench/train_sweep.py's:
for each dtype and N the rows hold about --input-mib MiB in one rows x N input; cross-entropy
has --ce-rows rows of bf16 logits for each vocabulary size N; the inputs come from
train_sweep.make_case with the same seed per point.

Each call passes the operands the public function (tile.rms_norm_backward, ...) passes to its
program, every output given. Candidates are plan requests that fix some fields and let the
policy fill the rest (with V the policy's vector width and the row's input bytes those of
every row input): the policy's plan; widths giving 1, 2, 4, 8 or 16 stripes (rounded up to
whole warps, at most 1024), and for widths of at most 256 workers 2, 4, 8 or 16 programs a
group; sub-warp programs of 4-32 workers, 8-32 a group, for rows of at most 32 vectors; where
the row's input is 16 KiB or more, re-reading with 256, 512 or 1024 workers and an unroll of
2 or 4 (also loading the next iteration ahead, row_prefetch "next", where the row takes more
than one), and register caching with 1024 workers and a budget of 128 scalars; the other caching
than the policy's (re-reading at its width, or register caching with a budget of 128 scalars,
the width and a cluster left to the policy); where it is more than 32 KiB (the
policy re-reads), rows split over a cluster of 2, 4, 8 or 16 groups of 256, 512 or 1024
workers caching the row (where at most half the workers of a stripe have no vector) and, for a
program without a reduction over the rows, the row staged in shared memory (caching "shared") on
one group or a cluster of 2-16, the rest left to the policy, and the row re-read over a cluster
of 8 or 16 groups of 256 or 512 workers, two or four resident an SM (up to 1024 threads); and for a
program reducing over the rows (whose cluster groups loop over row blocks) where the row's input
is 16 KiB or more, those of at most four stripes, also at two and four resident groups an SM
(up to 1024 threads); where the program reduces over the rows (dweight, dbias;
cross-entropy's summed losses, absent here), half, twice and four times the policy's grid
limit, the groups that loop over the rows (where it changes the grid), else grids of 256 and 512
groups looping over row blocks (where the rows are more), and for a register-cached
row the other row_prefetch, prefetching with a budget of 128 scalars (so at half and twice the
grid limit, and at the widths giving 1, 2 or 4 stripes), and for 16-bit row inputs the packed
register cache, prefetching or not; and where the call has a second phase (a workspace of
partials), 128, 256, 512 or 1024 workers folding the partials. --family clusters keeps the policy's
plan and the cluster candidates only (a quick run). Rows of an odd stride that the policy reads in
scalar accesses also get the head peeled (row_head "peel"), at the policy's mapping and re-read on
512 or 1024 workers with an unroll of 2 or 4.
Candidates are resolved with tile.builtin(name).plan() and deduplicated; a request the
validation refuses is recorded as rejected with its message.
Every plan is run with its outputs poisoned (NaN; the logits restored before a cross-entropy
call) and checked against train_sweep's float64 references on the GPU (its bound, the forward
sweep's plus the rounding of results computed by cancellation) before it is timed; a time is
the median of --batches CUDA-event-timed batches of back-to-back calls of about --batch-ms
each. Regret = the policy's time / the fastest candidate's time - 1.

    python bench/train_regret.py --out /tmp/train-regret.json --markdown /tmp/train-regret.md
    python bench/train_regret.py --list-candidates --ops rms_norm_backward --ns 4096   # no GPU

A run past --deadline-s stops before its next point (the file says complete: false); the same
command with --resume adds the missing points. --list-candidates resolves every point's family
on the CPU with numpy arrays (float16 standing in for bfloat16: the policy and the validation
read element sizes only) and prints it; nothing runs.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import types
import zlib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import regret  # noqa: E402
import train_sweep  # noqa: E402

OPS = ["softmax_backward", "log_softmax_backward", "rms_norm_backward", "layer_norm_backward", "fused_add_rms_norm",
       "fused_add_rms_norm_backward", "cross_entropy_fused"]
# train_sweep's name of each operator's inputs, references and outputs.
CASE = {op: op for op in OPS} | {"cross_entropy_fused": "cross_entropy_fwd_bwd"}
EPS = 1e-6  # fused_add_rms_norm's, as train_sweep's callers pass it
KIND = "training"

# Each case's inputs as train_sweep.make_case makes them: (rows, N) in the dtype, (N,) in the
# dtype, float32 per row, int64 per row. The dry run allocates these; a GPU run checks make_case
# against them.
ROW, COL, STAT, TARGET = "row", "col", "stat", "target"
INPUTS = {
    "softmax_backward": {"y": ROW, "dy": ROW},
    "log_softmax_backward": {"y": ROW, "dy": ROW},
    "rms_norm_backward": {"x": ROW, "weight": COL, "dy": ROW, "rstd": STAT},
    "layer_norm_backward": {"x": ROW, "weight": COL, "dy": ROW, "bias": COL, "mean": STAT, "rstd": STAT},
    "fused_add_rms_norm": {"x": ROW, "weight": COL, "residual": ROW},
    "fused_add_rms_norm_backward": {"x": ROW, "weight": COL, "dy": ROW, "rstd": STAT, "dresidual_out": ROW},
    "cross_entropy_fwd_bwd": {"logits": ROW, "target": TARGET},
}
# The input each output is allocated like (its shape, dtype and device), as the public function
# allocates it; None: float32, one per row. dlogits is written over a copy of the logits.
LIKE = {"dx": "dy", "dweight": "weight", "dbias": "bias", "y": "x", "residual_out": "residual", "dresidual": "x",
        "loss": None, "dlogits": "logits"}
REGISTER_ROW_BYTES = 32 * 1024  # the policy's longest row cached in registers (src/plan/policy.cpp)


def planned(args):
    """The (op, dtype, n) points of this run, in run order (train_sweep.planned's)."""
    pts = []
    for op in args.ops:
        if op == "cross_entropy_fused":
            pts += [(op, "bf16", v) for v in args.vocabs]
        else:
            pts += [(op, d, n) for d in args.dtypes for n in args.ns]
    return pts


def rows_for(op, dtype, n, args):
    return train_sweep.rows_for(CASE[op], dtype, n, args.input_mib, args.ce_rows)


# --------------------------------------------------------------------------------------------
# Operands and candidates: numpy arrays on the CPU (the dry run) or torch tensors on the GPU.


def _zeros(shape, dtype):
    import numpy as np
    # calloc'ed: a page is allocated only when written, and plan resolution writes none.
    return np.zeros(shape, {"bf16": np.float16, "f32": np.float32, "i64": np.int64}[dtype])


def empty_case(op, dtype, n, rows):
    """The inputs of a point as numpy arrays, unwritten: what plan resolution reads (shapes,
    dtypes, strides, alignment), float16 standing in for bfloat16."""
    kinds = {ROW: ((rows, n), dtype), COL: ((n,), dtype), STAT: ((rows,), "f32"), TARGET: ((rows,), "i64")}
    return types.SimpleNamespace(**{name: _zeros(*kinds[kind]) for name, kind in INPUTS[CASE[op]].items()})


def check_layout(op, c, rows, n, dtype):
    """make_case's inputs are INPUTS' (names, shapes, dtypes), so the dry run resolves the plans a
    GPU run resolves."""
    import torch
    tdt = {"bf16": torch.bfloat16, "f32": torch.float32}[dtype]
    want = {ROW: ((rows, n), tdt), COL: ((n,), tdt), STAT: ((rows,), torch.float32), TARGET: ((rows,), torch.int64)}
    got = {name: (tuple(a.shape), a.dtype) for name, a in vars(c).items()}
    expected = {name: want[kind] for name, kind in INPUTS[CASE[op]].items()}
    if got != expected:
        raise SystemExit(f"train_regret.py: internal error, make_case({CASE[op]}) gave {got}, INPUTS says {expected}")


def _empty_like(a, per_row=False):
    """An unwritten array like a (per_row: float32, one per row of a), with a's framework and device."""
    shape = tuple(a.shape[:-1]) if per_row else tuple(a.shape)
    if type(a).__module__.startswith("torch"):
        import torch
        return torch.empty(shape, dtype=torch.float32 if per_row else a.dtype, device=a.device)
    import numpy as np
    return np.zeros(shape, np.float32 if per_row else a.dtype)


def new_outputs(op, c):
    """The outputs of a call, named as train_sweep.OUTPUTS lists them."""
    rows_like = next(getattr(c, k) for k, kind in INPUTS[CASE[op]].items() if kind == ROW)
    return types.SimpleNamespace(**{name: _empty_like(rows_like, per_row=True) if LIKE[name] is None
                                    else _empty_like(getattr(c, LIKE[name]))
                                    for name in train_sweep.OUTPUTS[CASE[op]]})


def operands(op, c, o):
    """The operands of op's program, by name, for inputs c and outputs o: those the public function
    passes (tests/python/test_train_regret.py compares them), every output given."""
    if op in ("softmax_backward", "log_softmax_backward"):
        return {"y": c.y, "dy": c.dy, "dx": o.dx}
    if op == "rms_norm_backward":
        return {"dy": c.dy, "x": c.x, "weight": c.weight, "rstd": c.rstd, "dx": o.dx, "dweight": o.dweight}
    if op == "layer_norm_backward":
        return {"dy": c.dy, "x": c.x, "weight": c.weight, "mean": c.mean, "rstd": c.rstd, "dx": o.dx,
                "dweight": o.dweight, "dbias": o.dbias}
    if op == "fused_add_rms_norm":
        return {"x": c.x, "residual": c.residual, "weight": c.weight, "eps": EPS, "y": o.y,
                "residual_out": o.residual_out, "rstd": None}
    if op == "fused_add_rms_norm_backward":
        return {"dy": c.dy, "dresidual_out": c.dresidual_out, "residual_out": c.x, "weight": c.weight,
                "rstd": c.rstd, "dx": o.dx, "dresidual": o.dresidual, "dweight": o.dweight}
    # reduction "none": the per-row loss; dlogits over the logits (the call's default)
    return {"logits": o.dlogits, "target": c.target, "dlogits": o.dlogits, "loss": o.loss, "lse": None,
            "loss_sum": None, "loss_mean": None, "ignore_index": -100, "z_loss": 0.0}


def row_inputs(program, ops):
    """The row inputs present in the call."""
    return [ops[d.name] for d in program.operands if d.role == "row_in" and ops.get(d.name) is not None]


def row_input_bytes(program, ops):
    """Bytes of every row input present in one column (what a register-cached row holds)."""
    return sum(a.itemsize for a in row_inputs(program, ops))


def cluster_candidates(n, policy, row_bytes):
    """Rows split over a cluster (the module's docstring says which)."""
    v = policy["vector_elems"]
    reduces_rows = policy["grid_limit"] > 0
    if n * row_bytes <= (REGISTER_ROW_BYTES // 2 if reduces_rows else REGISTER_ROW_BYTES):
        return []
    out = []
    if not reduces_rows:
        # The row staged in shared memory over a cluster (width and stripes left to the policy),
        # as QuACK holds long rows.
        out += [{"ctas_per_program": c, "caching": "shared"} for c in (1, 2, 4, 8, 16)]
    for c in (2, 4, 8, 16):
        for w in (256, 512, 1024):
            if c * w * v > 2 * n or (reduces_rows and 4 * c * w * v < n):
                continue
            out.append({"ctas_per_program": c, "workers_per_program": w, "caching": "registers"})
            if reduces_rows:
                out += [{"ctas_per_program": c, "workers_per_program": w, "caching": "registers",
                         "resident_groups": g} for g in (2, 4) if g * w <= 1024]
                # The next row block loaded during this one, within twice the budget.
                out += [{"ctas_per_program": c, "workers_per_program": w, "caching": "registers",
                         "row_prefetch": "next", "private_budget": 128, "resident_groups": g}
                        for g in (1, 2, 4) if g * w <= 1024 and c * w * v * 2 >= n]
    # The row re-read over a cluster: its groups hold fewer rows in flight than one group a row,
    # so the second pass may find its row in L2, and no slice limits the groups an SM.
    out += [{"ctas_per_program": c, "workers_per_program": w, "caching": "reread", "resident_groups": g}
            for c in (8, 16) for w in (256, 512) for g in (2, 4) if g * w <= 1024 and c * w * v <= 2 * n]
    return out


def candidates(n, rows, policy, row_bytes, second_phase, all_16bit=False, family="all"):
    """Plan requests around the policy's plan (None), for rows of n elements of row_bytes input
    bytes a column; second_phase: the call folds partials of a reduction over the rows in a
    second kernel (its workspace is not empty); all_16bit: every row input is 16-bit. The
    module's docstring says which."""
    if family == "clusters":
        return [None] + cluster_candidates(n, policy, row_bytes)
    v = policy["vector_elems"]
    vectors = -(-n // v)
    reduces_rows = policy["grid_limit"] > 0
    prefetching = reduces_rows and policy["caching"] == "registers"
    out = [None]
    for stripes in (1, 2, 4, 8, 16):
        w = 32 * -(-vectors // (32 * stripes))  # ceil(vectors / stripes), rounded up to whole warps
        if w > 1024 or (stripes > 1 and vectors < 32 * stripes):
            continue
        out.append({"workers_per_program": w})
        if prefetching and stripes <= 4:
            out.append({"workers_per_program": w, "row_prefetch": "next", "private_budget": 128})
        if w <= 256:
            out += [{"workers_per_program": w, "programs_per_group": p} for p in (2, 4, 8, 16) if w * p <= 1024]
    if vectors <= 32:
        out += [{"workers_per_program": w, "programs_per_group": p} for w in (4, 8, 16, 32) for p in (8, 16, 32)
                if w <= vectors and w * p <= 1024]
    if n * row_bytes >= REGISTER_ROW_BYTES // 2:  # rows near the register bound get both cachings
        out += [{"workers_per_program": w, "caching": "reread", "stripe_unroll": u} for w in (256, 512, 1024)
                for u in (2, 4)]
        # The next iteration loaded ahead, where the row takes more than one.
        out += [{"workers_per_program": w, "caching": "reread", "stripe_unroll": u, "row_prefetch": "next"}
                for w in (256, 512, 1024) for u in (2, 4) if w * v * u < n]
        out.append({"workers_per_program": 1024, "caching": "registers", "private_budget": 128})
    # The other caching at the policy's width (a long row asking for registers may get a cluster)
    out.append({"caching": "reread"} if policy["caching"] == "registers" else
               {"caching": "registers", "private_budget": 128})
    out += cluster_candidates(n, policy, row_bytes)
    if policy["row_head"] == "as_is" and policy["vector_elems"] == 1 and n * row_bytes >= 1024:
        # Rows of an odd stride in scalar accesses: the head peeled, at the policy's mapping and
        # re-read on wider groups (refused where the program has per-column accumulators).
        out += [{"row_head": "peel"}] + [{"row_head": "peel", "caching": "reread", "workers_per_program": w,
                                          "stripe_unroll": u} for w in (512, 1024) for u in (2, 4)]
    blocks = -(-rows // policy["programs_per_group"])
    if reduces_rows:
        g0 = policy["grid_limit"]
        out += [{"grid_limit": g} for g in (g0 // 2, 2 * g0, 4 * g0) if g >= 1 and min(g, blocks) != min(g0, blocks)]
    else:
        # One row block a group: also groups looping over row blocks (where that changes the grid).
        out += [{"grid_limit": g} for g in (256, 512) if g < blocks]
    if prefetching:
        # Loads of the next row block during this one (row_prefetch), within the policy's budget
        # or twice it, and at half and twice the grid.
        other = "none" if policy["row_prefetch"] == "next" else "next"
        out += [{"row_prefetch": other}, {"row_prefetch": "next", "private_budget": 128}]
        out += [{"row_prefetch": "next", "private_budget": 128, "grid_limit": g} for g in (g0 // 2, 2 * g0) if g >= 1]
        if all_16bit and policy["vector_elems"] % 2 == 0:
            # The slice kept as loaded (two 16-bit elements a register), prefetching or not.
            out += [{"cache_format": "packed"}, {"cache_format": "packed", "row_prefetch": "next", "private_budget": 128}]
    if second_phase:
        out += [{"finish_workers": f} for f in (128, 256, 512, 1024) if f != policy["finish_workers"]]
    return out


def family(program, ops, rows, n, which="all"):
    """The candidates of one call resolved with program.plan() (regret.resolve: deduplicated,
    refusals recorded); only the policy's, rejected, when the policy's plan cannot be resolved."""
    def plan_of(request):
        return program.plan(plan=request, **ops)

    first = regret.resolve([None], plan_of)
    if "rejected" in first[0]:
        return first
    second_phase = program.workspace_bytes(**ops) > 0
    all_16bit = all(a.itemsize == 2 for a in row_inputs(program, ops))
    return regret.resolve(candidates(n, rows, first[0]["plan"], row_input_bytes(program, ops), second_phase, all_16bit,
                                     which), plan_of)


def dry_family(op, dtype, n, rows, which="all"):
    """family() on the CPU: numpy arrays (empty_case), no GPU."""
    import tile
    c = empty_case(op, dtype, n, rows)
    entries = family(tile.builtin(op), operands(op, c, new_outputs(op, c)), rows, n, which)
    tile.clear_kernel_caches()  # each plan resolved was lowered: hundreds of MiB over a whole run
    return entries


# --------------------------------------------------------------------------------------------
# The GPU run.


def run_point(op, dtype, n, args, gen):
    import torch

    import sweep
    import tile
    case_op = CASE[op]
    rows = rows_for(op, dtype, n, args)
    gen.manual_seed(zlib.crc32(f"{case_op} {dtype} {n}".encode()))  # train_sweep's inputs for its points
    c = train_sweep.make_case(case_op, dtype, n, rows, gen)
    check_layout(op, c, rows, n, dtype)
    refs = train_sweep.references(case_op, c)
    o = new_outputs(op, c)
    names = train_sweep.OUTPUTS[case_op]
    program = tile.builtin(op)
    ops = operands(op, c, o)
    entries = family(program, ops, rows, n, args.family)

    def reset():
        for name in names:
            if name == "dlogits":
                o.dlogits.copy_(c.logits)  # the call writes over its logits: the inputs again
            else:
                getattr(o, name).fill_(float("nan"))  # poisoned: a value left unwritten fails the oracle

    def check(fixed):
        reset()
        try:
            program(plan=fixed, **ops)
            torch.cuda.synchronize()
        except Exception as e:  # a plan that fails to compile or launch is recorded, not timed
            return {"passed": False, "error": f"{type(e).__name__}: {e}"}
        return train_sweep.check_outputs(sweep, case_op, [getattr(o, k) for k in names], refs, dtype)

    def time_of(fixed):
        reset()
        return sweep.time_ms(lambda: program(plan=fixed, **ops), args.batch_ms, args.batches)[0]

    # Every plan's kernels compiled first, args.compile_jobs at a time (a call releases the GIL
    # while it compiles); what these calls write is poisoned again before each check.
    plans = [regret.fixed_plan(e["plan"]) for e in entries if "plan" in e]
    if args.compile_jobs > 1 and len(plans) > 1:
        from concurrent.futures import ThreadPoolExecutor

        def warm(fixed):
            try:
                program(plan=fixed, **ops)
            except Exception:  # noqa: BLE001 - the check below records the error
                pass
        with ThreadPoolExecutor(args.compile_jobs) as pool:
            list(pool.map(warm, plans))
        torch.cuda.synchronize()
    regret.measure(entries, check, time_of)
    del c, refs, o, ops
    torch.cuda.empty_cache()
    return regret.conclude({"op": op, "dtype": dtype, "n": n, "rows": rows, "candidates": entries})


def parse(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ops", nargs="+", default=OPS, choices=OPS)
    ap.add_argument("--dtypes", nargs="+", default=train_sweep.DTYPES, choices=train_sweep.DTYPES,
                    help="dtypes of every operator but cross-entropy (bf16)")
    ap.add_argument("--ns", nargs="+", type=int, default=train_sweep.NS,
                    help="row lengths of every operator but cross-entropy")
    ap.add_argument("--vocabs", nargs="+", type=int, default=train_sweep.VOCABS, help="cross-entropy vocabulary sizes")
    ap.add_argument("--input-mib", type=float, default=256, help="size of one rows x N input (default 256)")
    ap.add_argument("--ce-rows", type=int, default=4096, help="cross-entropy rows (default 4096)")
    ap.add_argument("--batch-ms", type=float, default=10, help="length of one timed batch (default 10)")
    ap.add_argument("--batches", type=int, default=5, help="timed batches per plan (default 5)")
    ap.add_argument("--family", choices=["all", "clusters"], default="all",
                    help="the candidates: all (default), or the policy's plan and the cluster candidates only")
    ap.add_argument("--compile-jobs", type=int, default=8,
                    help="calls compiling a point's kernels at once before it is measured (default 8)")
    ap.add_argument("--resume", action="store_true", help="keep the points already in --out and add the others")
    ap.add_argument("--deadline-s", type=float, default=None,
                    help="start no point after this many seconds; exit 3 with the file incomplete")
    ap.add_argument("--markdown", help="also write the tables (bench/regret_table.py's, with a summary per "
                                       "operator) to this file, or - for stdout")
    ap.add_argument("--list-candidates", action="store_true",
                    help="resolve and print every point's candidates on the CPU (numpy arrays), run nothing")
    ap.add_argument("--out", type=Path, help="the result file (required unless --list-candidates)")
    args = ap.parse_args(argv)
    if args.out is None and not args.list_candidates:
        ap.error("--out is required unless --list-candidates")
    return args


def list_candidates(args):
    from regret_table import plan_text
    for op, dtype, n in planned(args):
        rows = rows_for(op, dtype, n, args)
        entries = dry_family(op, dtype, n, rows, args.family)
        plans = [e for e in entries if "plan" in e]
        print(f"{op} {dtype} N={n} rows={rows}: {len(plans)} plans, {len(entries) - len(plans)} rejected")
        for e in entries:
            what = plan_text(e["plan"]) if "plan" in e else "rejected: " + e["rejected"]
            print(f"  {json.dumps(e['request'])}: {what}")
    return 0


def markdown(args, doc):
    from regret_table import render
    text = render(doc, args.out.name, by_op=True)
    if args.markdown == "-":
        sys.stdout.write(text)
    else:
        Path(args.markdown).write_text(text)


def main(argv):
    args = parse(argv)
    if args.list_candidates:
        return list_candidates(args)
    import torch
    if not torch.cuda.is_available():
        raise SystemExit("train_regret.py: needs a CUDA device (--list-candidates runs on the CPU)")

    todo = planned(args)
    cases = regret.resumed_cases(args, todo, KIND, "train_regret.py")
    done = {(c["op"], c["dtype"], c["n"]) for c in cases}

    def save(partial):
        cases.sort(key=lambda c: todo.index((c["op"], c["dtype"], c["n"])))
        by_op = {op: regret.summary([c for c in cases if c["op"] == op]) for op in args.ops}
        doc = regret.document(args, __doc__, cases, extra={"kind": KIND, "ops": args.ops, "complete": not partial,
                                                           "summary_by_op": by_op})
        regret.write(args.out, doc)
        if args.markdown:
            markdown(args, doc)
        return doc

    gen = torch.Generator(device="cuda")
    start = time.monotonic()
    for i, (op, dtype, n) in enumerate(todo, 1):
        if (op, dtype, n) in done:
            continue
        if regret.past_deadline(args, start, save, len(todo) - len(cases)):
            return 3
        t0 = time.monotonic()
        case = run_point(op, dtype, n, args, gen)
        case["wall_s"] = round(time.monotonic() - t0, 2)
        cases.append(case)
        save(partial=True)  # a run cut short keeps every finished point
        timed = [e for e in case["candidates"] if "ms" in e]
        rejected = sum("rejected" in e for e in case["candidates"])
        failed = sum(not e["oracle"]["passed"] for e in case["candidates"] if "oracle" in e)
        result = (f"policy {1000 * case['policy_ms']:.1f} us, best {1000 * case['best_ms']:.1f} us, regret "
                  f"{100 * case['regret']:.1f}%" if "regret" in case else "ERROR: " + case["error"])
        print(f"[{i}/{len(todo)}] {op} {dtype} N={n} rows={case['rows']}: {len(timed)} plans timed, {rejected} "
              f"rejected, {failed} failed the oracle; {result} ({case['wall_s']:.1f} s)", flush=True)
    doc = save(partial=False)
    s = doc["summary"]
    print(f"regret: geometric mean {100 * (s['geomean_regret'] or 0):.1f}%, worst {100 * (s['worst_regret'] or 0):.1f}% "
          f"over {s['with_regret']} of {s['cases']} cases; wrote {args.out} ({time.monotonic() - start:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
