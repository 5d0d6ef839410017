#!/usr/bin/env python3
"""Markdown tables of a saved run (bench/SCHEMA.md): one table per timing family, and the
per-case comparison of two variants by non-overlapping per-round ranges.

    python bench/report.py RUN.json [--compare REFERENCE CANDIDATE]
"""

from __future__ import annotations

import argparse
import json

TITLES = {
    "gpu_time": "Per-kernel GPU time (CUPTI activity records), µs per launch",
    "stream_time": "Stream time (CUDA events around a batch, gaps included), µs per launch",
    "throughput": "Warm batched host-wall throughput (K launches, one synchronize), µs per launch",
    "latency": "Individually synchronized host-wall latency, µs per launch",
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("run")
    ap.add_argument("--compare", nargs=2, metavar=("REFERENCE", "CANDIDATE"))
    args = ap.parse_args()
    doc = json.load(open(args.run))
    cases = doc["config"]["cases"]
    variants = [v["name"] for v in doc["config"]["variants"]]
    summary = {(s["case"], s["variant"], s["family"]): s for s in doc["summary"]}
    for family in doc["config"]["families"]:
        if not any(k[2] == family for k in summary):
            continue
        print(f"\n**{TITLES.get(family, family)}**\n")
        print("| operator | shape | variant | median | per-round range |")
        print("| --- | --- | --- | ---: | --- |")
        for c in cases:
            for v in variants:
                s = summary.get((c["id"], v, family))
                if s:
                    print(f"| {c['op']} | {c['rows']}×{c['cols']} | {v} | {s['median']:.2f} | "
                          f"{s['round_min']:.2f} – {s['round_max']:.2f} |")
    if args.compare:
        ref, cand = args.compare
        print(f"\n**{cand} against {ref}, per case** (faster/slower only where the per-round ranges "
              "of medians do not overlap; = otherwise)\n")
        fams = [f for f in doc["config"]["families"] if any(k[2] == f for k in summary)]
        print("| operator | shape | " + " | ".join(fams) + " |")
        print("| --- | --- | " + " | ".join("---" for _ in fams) + " |")
        for c in cases:
            cells = []
            for f in fams:
                a, b = summary.get((c["id"], ref, f)), summary.get((c["id"], cand, f))
                if not a or not b:
                    cells.append("n/a")
                elif b["round_max"] < a["round_min"]:
                    cells.append(f"faster ({b['median'] / a['median']:.2f}×)")
                elif b["round_min"] > a["round_max"]:
                    cells.append(f"slower ({b['median'] / a['median']:.2f}×)")
                else:
                    cells.append(f"= ({b['median'] / a['median']:.2f}×)")
            print(f"| {c['op']} | {c['rows']}×{c['cols']} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
