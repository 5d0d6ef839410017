#!/usr/bin/env python3
"""Markdown tables of a bench/regret.py run (schema tile-regret/1): the analytic policy's
regret per operator, dtype and N, the fastest plan where the policy's was not, and a summary.

    python bench/regret_table.py bench/results/regret-h200.json --markdown FILE   (or - for stdout)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from plot_sweep import plan_text as sweep_plan_text  # noqa: E402
from regret import geomean_regret  # noqa: E402


def plan_text(p):
    # The sweep tables' compact plan (a cluster's groups and merge among it), plus the unroll
    # that tells re-read plans apart, and for a reduction over the rows (bench/train_regret.py)
    # its grid limit and second-phase workers.
    return (sweep_plan_text(p) + (f" u{p['stripe_unroll']}" if p["caching"] == "reread" else "") +
            (f" g{p['grid_limit']} f{p['finish_workers']}" if p.get("grid_limit") else ""))


def op_summary(cases):
    """A table of the geometric mean and the worst regret of each operator, and over all."""
    lines = ["| operator | cases | geometric mean % | worst % | worst at |", "| --- | ---: | ---: | ---: | --- |"]
    groups = [(op, [c for c in cases if c["op"] == op]) for op in dict.fromkeys(c["op"] for c in cases)]
    for name, group in groups + [("**all**", cases)]:
        with_regret = [c for c in group if "regret" in c]
        if not with_regret:
            lines.append(f"| {name} | 0 of {len(group)} | — | — | |")
            continue
        geo = geomean_regret([c["regret"] for c in with_regret])
        worst = max(with_regret, key=lambda c: c["regret"])
        where = (f"{worst['op']} " if name == "**all**" else "") + f"{worst['dtype']} N={worst['n']}"
        lines.append(f"| {name} | {len(with_regret)} of {len(group)} | {100 * geo:.1f} | {100 * worst['regret']:.1f} "
                     f"| {where} |")
    return lines


def render(doc, source, by_op=False):
    """The tables; by_op: first a summary of each operator (op_summary)."""
    cases = doc["cases"]
    ops = list(dict.fromkeys(c["op"] for c in cases))
    lines = [f"Regret of the analytic policy (source `{source}`; GPU {doc['gpu']}; created {doc['created']}).",
             "",
             "Regret = the policy's time / the fastest candidate's time − 1, in percent; `—`: no number "
             "(the policy's plan failed the oracle or nothing was timed). Candidates per case in brackets.",
             ""]
    if by_op:
        lines += op_summary(cases) + [""]
    for dtype in dict.fromkeys(c["dtype"] for c in cases):
        lines += [f"**{dtype}**", "", "| N | " + " | ".join(ops) + " |", "| ---: |" + " ---: |" * len(ops)]
        for n in sorted({c["n"] for c in cases if c["dtype"] == dtype}):  # cross-entropy: bf16 vocabularies
            cells = []
            for op in ops:
                c = next((c for c in cases if c["op"] == op and c["dtype"] == dtype and c["n"] == n), None)
                if c is None:
                    cells.append("")
                    continue
                timed = sum(1 for t in c["candidates"] if "ms" in t)
                cells.append(f"{100 * c['regret']:.1f} ({timed})" if "regret" in c else f"— ({timed})")
            lines.append(f"| {n} | " + " | ".join(cells) + " |")
        lines.append("")
    regrets = [c["regret"] for c in cases if "regret" in c]
    geo = geomean_regret(regrets) if regrets else float("nan")
    worst = sorted((c for c in cases if "regret" in c), key=lambda c: -c["regret"])
    lines += [f"- Geometric mean regret over {len(regrets)} of {len(cases)} cases: **{100 * geo:.1f} %**",
              f"- Cases with regret above 5 %: {sum(r > 0.05 for r in regrets)}; above 10 %: "
              f"{sum(r > 0.10 for r in regrets)}",
              "", "Largest regrets:", "", "| op | dtype | N | regret % | policy plan | fastest plan |",
              "| --- | --- | ---: | ---: | --- | --- |"]
    for c in worst[:8]:
        lines.append(f"| {c['op']} | {c['dtype']} | {c['n']} | {100 * c['regret']:.1f} | "
                     f"{plan_text(c['policy_plan'])} | {plan_text(c['best_plan'])} |")
    failed = [(c["op"], c["dtype"], c["n"]) for c in cases for t in c["candidates"]
              if "oracle" in t and not t["oracle"]["passed"]]
    lines += ["", f"Candidates that failed the float64 oracle: {len(failed)}" +
              (": " + ", ".join(f"{o} {d} N={n}" for o, d, n in failed) if failed else "."), ""]
    return "\n".join(lines)


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("regret", type=Path)
    ap.add_argument("--markdown", required=True, help="output file, or - for stdout")
    args = ap.parse_args(argv)
    try:
        doc = json.loads(args.regret.read_text())
    except (OSError, ValueError) as e:
        print(f"regret_table.py: cannot read {args.regret}: {e}", file=sys.stderr)
        return 2
    if not isinstance(doc, dict) or doc.get("schema") != "tile-regret/1":
        print(f"regret_table.py: {args.regret}: schema is {doc.get('schema') if isinstance(doc, dict) else None!r}, "
              "expected 'tile-regret/1'", file=sys.stderr)
        return 2
    text = render(doc, args.regret.name)
    if args.markdown == "-":
        sys.stdout.write(text)
    else:
        Path(args.markdown).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
