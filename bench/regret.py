#!/usr/bin/env python3
"""The analytic policy's regret: its plan timed against a family of plans around it.

For each operator, dtype and N (inputs of about --input-mib MiB, as bench/sweep.py), the
candidates are the policy's plan and plans that fix some fields and let the policy fill the
rest: widths giving 1, 2, 4, 8 or 16 stripes, packing 2-16 programs for short rows, sub-warp
programs for rows of at most 32 vectors, and for rows of 16384 elements or more re-reading
with 256, 512 or 1024 workers and an unroll of 2 or 4, also loading the next iteration ahead
(row_prefetch "next") where the row takes more than one, plus register caching with 1024
workers, and rows split over a thread-block cluster of 2, 4, 8 or 16 groups of 256, 512 or
1024 workers caching the row in registers (where the slice fits the budget; tile.plan()
refuses the others, which are left out), and for rows of 65536 elements or more re-read over a
cluster of 8 or 16 groups of 256 or 512 workers, two or four resident an SM (up to 1024
threads). --family clusters keeps the policy's plan and
persistent cluster plans only, for rows of 16384 elements or more: 4, 8 or 16 groups of 256 or
512 workers caching the row, looping over one wave of row blocks (one or two groups of 256 an
SM, one of 512), the norms' weight and bias loaded once a group before the loop (column_loads
"once", a budget of 255 scalars) or with each row, the next row block prefetched or not. Candidates are resolved with tile.plan() and deduplicated, every one is checked
against a float64 oracle (torch on the GPU) on the output before it is timed, and a time is
the median of --batches CUDA-event-timed batches of back-to-back launches of about
--batch-ms each. Regret = policy time / fastest candidate's time - 1.

This is the same search as `tile tune` over a smaller family (tile tune times every plan of
the mapping family and checks on the CPU, minutes per shape); it fits a whole sweep of N in a
few minutes of GPU time.

    python bench/regret.py --out bench/results/regret.json [--markdown FILE]

A run past --deadline-s stops before its next (dtype, N) (the file says complete: false); the
same command with --resume adds the missing cases. Each (dtype, N) draws its inputs from a seed
of its own, so a resumed run times the inputs a whole run would.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import platform
import sys
import time
import zlib
from pathlib import Path

# torch, tile and the sweep's helpers are imported by main(): the helpers below, which
# bench/train_regret.py shares, need neither torch nor a GPU.
sys.path.insert(0, str(Path(__file__).resolve().parent))


def cluster_candidates(n, element_bytes, sms, weights):
    """Persistent cluster plans (the module's docstring says which); weights: the operator
    reads per-column inputs (a norm's weight and bias)."""
    out = [None]
    if n < 16384:
        return out
    for ctas in (4, 8, 16):
        for w in (256, 512):
            if ctas * w * (16 // element_bytes) > 2 * n:
                continue
            for groups in ((1, 2) if w == 256 else (1,)):
                for loads in (("once", "ahead") if weights else ("ahead",)):
                    for prefetch in ("none", "next"):
                        out.append({"ctas_per_program": ctas, "workers_per_program": w, "caching": "registers",
                                    "resident_groups": groups, "grid_limit": groups * sms // ctas,
                                    "column_loads": loads, "row_prefetch": prefetch, "private_budget": 255})
    return out


def candidates(n, element_bytes):
    vectors = n * element_bytes // 16
    out = [None]
    for stripes in (1, 2, 4, 8, 16):
        w = vectors // stripes
        if 32 <= w <= 1024 and w % 32 == 0:
            out.append({"workers_per_program": w})
            for programs in (2, 4, 8, 16):
                if w * programs <= 1024 and w <= 256:
                    out.append({"workers_per_program": w, "programs_per_group": programs})
    if vectors <= 32:
        for w in (4, 8, 16, 32):
            for programs in (8, 16, 32):
                if w <= vectors and w * programs <= 1024:
                    out.append({"workers_per_program": w, "programs_per_group": programs})
    if n >= 16384:
        for w in (256, 512, 1024):
            for unroll in (2, 4):
                out.append({"workers_per_program": w, "caching": "reread", "stripe_unroll": unroll})
                if w * unroll * 16 < n * element_bytes:  # more than one iteration
                    out.append({"workers_per_program": w, "caching": "reread", "stripe_unroll": unroll,
                                "row_prefetch": "next"})
        out.append({"workers_per_program": 1024, "caching": "registers", "private_budget": 128})
        for ctas in (2, 4, 8, 16):
            for w in (256, 512, 1024):
                if ctas * w * (16 // element_bytes) <= 2 * n:  # every worker has a vector
                    out.append({"ctas_per_program": ctas, "workers_per_program": w, "caching": "registers"})
    if n >= 65536:  # re-read over a cluster: fewer rows in flight, so the second pass may hit L2
        out += [{"ctas_per_program": c, "workers_per_program": w, "caching": "reread", "resident_groups": g}
                for c in (8, 16) for w in (256, 512) for g in (2, 4)
                if g * w <= 1024 and c * w * (16 // element_bytes) <= 2 * n]
    return out


def fixed_plan(plan):
    """The resolved plan, every field fixed (width_mode, exact or automatic, follows from a fixed
    width and does not change the kernel)."""
    return {k: v for k, v in plan.items() if k != "width_mode"}


def resolve(requests, plan_of):
    """Each request resolved by plan_of(request) -> plan dict, in order: {"request", "plan"} for
    the first request of each distinct plan (width_mode aside), {"request", "rejected"} for one
    the call cannot take (the validation's message names the field); a request resolving to a
    plan listed already is dropped."""
    seen, out = set(), []
    for request in requests:
        try:
            plan = plan_of(request)
        except Exception as e:  # a candidate the call cannot take (validation names the field)
            out.append({"request": request, "rejected": f"{type(e).__name__}: {e}"})
            continue
        key = json.dumps(fixed_plan(plan), sort_keys=True)
        if key in seen:
            continue
        seen.add(key)
        out.append({"request": request, "plan": plan})
    return out


def measure(entries, check, time):
    """Every resolved entry is checked (check(fixed plan) -> the oracle's verdict, a dict with
    "passed") and, only if it passed, timed (time(fixed plan) -> ms), in order."""
    for entry in entries:
        if "plan" not in entry:
            continue
        fixed = fixed_plan(entry["plan"])
        entry["oracle"] = check(fixed)
        if entry["oracle"]["passed"]:
            entry["ms"] = time(fixed)


def conclude(case):
    """Adds to a case (its "candidates" measured) the policy's and the fastest time and plan and
    the regret, or an error when the policy's plan has no time."""
    timed = case["candidates"]
    ok = [t for t in timed if "ms" in t]
    policy = next((t for t in timed if t.get("request") is None), None)
    best = min(ok, key=lambda t: t["ms"]) if ok else None
    if policy and "ms" in policy and best:
        case.update(policy_ms=policy["ms"], best_ms=best["ms"], best_plan=best["plan"],
                    policy_plan=policy["plan"], regret=policy["ms"] / best["ms"] - 1)
    else:
        case["error"] = "the policy's plan failed the oracle or nothing was timed"
    return case


def geomean_regret(regrets):
    """The geometric mean of 1 + regret, less 1; None for no regrets."""
    return math.exp(sum(math.log1p(r) for r in regrets) / len(regrets)) - 1 if regrets else None


def summary(cases):
    regrets = [c["regret"] for c in cases if "regret" in c]
    return {"cases": len(cases), "with_regret": len(regrets), "geomean_regret": geomean_regret(regrets),
            "worst_regret": max(regrets) if regrets else None}


def document(args, method, cases, extra=None):
    """The tile-regret/1 document of a run (GPU, versions, method, config, summary, cases);
    extra: further top-level fields, before the summary."""
    import torch

    import tile
    return {"schema": "tile-regret/1", "created": dt.datetime.now(dt.timezone.utc).isoformat(),
            "gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "python": platform.python_version(),
            "tile": tile.build_info(), "method": method.strip(), "config": vars(args) | {"out": str(args.out)},
            **(extra or {}), "summary": summary(cases), "cases": cases}


def resumed_cases(args, todo, kind=None, who="regret.py"):
    """With --resume, the cases of args.out that this run plans (todo: its (op, dtype, n) keys);
    the document must be a tile-regret/1 one of the same kind (None: the forward operators)."""
    if not (args.resume and args.out.exists()):
        return []
    old = json.loads(args.out.read_text())
    if not isinstance(old, dict) or old.get("schema") != "tile-regret/1" or old.get("kind") != kind:
        raise SystemExit(f"{who}: --resume: {args.out} is not a {kind or 'forward'} tile-regret/1 document")
    keys = set(todo)
    cases = [c for c in old.get("cases", []) if (c.get("op"), c.get("dtype"), c.get("n")) in keys]
    print(f"resuming: {len(cases)} of {len(todo)} points already in {args.out}", flush=True)
    return cases


def past_deadline(args, start, save, left):
    """True (after saving the run as incomplete) once it is past --deadline-s; left: the points
    still to run."""
    if args.deadline_s is None or time.monotonic() - start <= args.deadline_s:
        return False
    save(partial=True)
    print(f"deadline: stopped after {time.monotonic() - start:.0f} s with {left} points left; run the same "
          "command with --resume", flush=True)
    return True


def write(path, doc):
    """Writes the document, replacing the file atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=1, default=str))
    os.replace(tmp, path)


def main(argv):
    import torch

    import peers
    import sweep

    import tile

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ops", nargs="+", default=sweep.OPS, choices=sweep.OPS)
    ap.add_argument("--dtypes", nargs="+", default=list(sweep.DTYPES), choices=list(sweep.DTYPES))
    ap.add_argument("--ns", nargs="+", type=int, default=sweep.NS)
    ap.add_argument("--input-mib", type=float, default=512)
    ap.add_argument("--batch-ms", type=float, default=10)
    ap.add_argument("--batches", type=int, default=5)
    ap.add_argument("--family", choices=["all", "clusters"], default="all",
                    help="the candidates: all (default), or the policy's plan and persistent cluster plans only")
    ap.add_argument("--resume", action="store_true", help="keep the cases already in --out and add the others")
    ap.add_argument("--deadline-s", type=float, default=None,
                    help="start no (dtype, N) after this many seconds; exit 3 with the file incomplete")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("regret.py: needs a CUDA device")

    todo = [(op, d, n) for d in args.dtypes for n in args.ns for op in args.ops]
    cases = resumed_cases(args, todo)
    have = {(c["op"], c["dtype"], c["n"]) for c in cases}

    def save(partial):
        cases.sort(key=lambda c: todo.index((c["op"], c["dtype"], c["n"])))
        doc = document(args, __doc__, cases, extra={"complete": not partial})
        write(args.out, doc)
        return doc

    gen = torch.Generator(device="cuda")
    total, done = len(todo), len(cases)
    start = time.monotonic()
    for dtype in args.dtypes:
        es = torch.tensor([], dtype=sweep.DTYPES[dtype]).element_size()
        for n in args.ns:
            if all((op, dtype, n) in have for op in args.ops):
                continue
            if past_deadline(args, start, save, total - len(cases)):
                return 3
            gen.manual_seed(zlib.crc32(f"regret {dtype} {n}".encode()))
            rows, x, w, b = sweep.inputs(dtype, n, args.input_mib, gen)
            out = torch.empty_like(x)
            for op in args.ops:
                if (op, dtype, n) in have:
                    continue
                done += 1
                eps = peers.EPS.get(op, 0.0)
                kw = sweep.tile_kwargs(op, out, w, b, eps)
                ref = sweep.reference(op, x, w, b, eps)
                no_eps = {k: v for k, v in kw.items() if k != "eps"}
                family = (cluster_candidates(n, es, torch.cuda.get_device_properties(0).multi_processor_count,
                                             op in ("rms_norm", "layer_norm"))
                          if args.family == "clusters" else candidates(n, es))
                timed = resolve(family, lambda request: tile.plan(op, x, plan=request, **no_eps))

                def check(fixed):
                    out.fill_(float("nan"))
                    tile.run(op, x, plan=fixed, **kw)
                    torch.cuda.synchronize()
                    return sweep.check(out, ref, dtype)

                def time_of(fixed):
                    return sweep.time_ms(lambda: tile.run(op, x, plan=fixed, **kw), args.batch_ms, args.batches)[0]

                measure(timed, check, time_of)
                del ref
                case = conclude({"op": op, "dtype": dtype, "n": n, "rows": rows, "candidates": timed})
                cases.append(case)
                save(partial=True)  # a run cut short keeps every finished case
                print(f"[{done}/{total}] {op} {dtype} N={n}: {sum('ms' in t for t in timed)} plans; regret "
                      f"{100 * case.get('regret', float('nan')):.1f}%", flush=True)
            del x, w, b, out
            torch.cuda.empty_cache()

    doc = save(partial=False)
    summary_ = doc["summary"]
    print(f"regret: geometric mean {100 * (summary_['geomean_regret'] or 0):.1f}%, worst "
          f"{100 * (summary_['worst_regret'] or 0):.1f}% over {summary_['with_regret']} cases; wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
