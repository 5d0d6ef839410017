"""The helpers bench/regret.py and bench/train_regret.py share, without torch or a GPU:
resolving candidates (deduplicated, refusals recorded), checking and timing them, the regret."""

import math
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))
import regret  # noqa: E402


def plan(w, mode="automatic", caching="registers"):
    return {"workers_per_program": w, "width_mode": mode, "caching": caching}


def fake_plan_of(request):
    """A stand-in for tile.plan: the width asked for (exact) or 128, refusing widths of 48."""
    if request is None:
        return plan(128)
    if request.get("workers_per_program") == 48:
        raise ValueError("op: argument 'plan.workers_per_program': expected ..., got 48")
    if "workers_per_program" in request:
        return plan(request["workers_per_program"], "exact", request.get("caching", "registers"))
    return plan(128, caching=request.get("caching", "registers"))


def test_resolve_deduplicates_and_records_refusals_in_order():
    requests = [None, {"workers_per_program": 256}, {"workers_per_program": 128}, {"workers_per_program": 48},
                {"caching": "reread"}, {"workers_per_program": 256, "caching": "registers"}]
    out = regret.resolve(requests, fake_plan_of)
    # width 128 exact is the policy's plan (width_mode aside); the second 256 repeats the first.
    assert [e["request"] for e in out] == [None, {"workers_per_program": 256}, {"workers_per_program": 48},
                                          {"caching": "reread"}]
    assert out[0]["plan"] == plan(128) and out[1]["plan"] == plan(256, "exact")
    assert out[2] == {"request": {"workers_per_program": 48},
                      "rejected": "ValueError: op: argument 'plan.workers_per_program': expected ..., got 48"}
    assert regret.fixed_plan(out[1]["plan"]) == {"workers_per_program": 256, "caching": "registers"}


def test_measure_times_only_what_passed_the_oracle_and_conclude_finds_the_regret():
    entries = regret.resolve([None, {"workers_per_program": 256}, {"workers_per_program": 64},
                              {"workers_per_program": 48}], fake_plan_of)
    times = {128: 2.0, 256: 1.6, 64: 1.0}
    checked, timed = [], []

    def check(fixed):
        checked.append(fixed)
        return {"passed": fixed["workers_per_program"] != 64}  # the fastest fails: never timed

    def time(fixed):
        timed.append(fixed)
        return times[fixed["workers_per_program"]]

    regret.measure(entries, check, time)
    assert [f["workers_per_program"] for f in checked] == [128, 256, 64]
    assert all("width_mode" not in f for f in checked)
    assert [f["workers_per_program"] for f in timed] == [128, 256]
    assert "ms" not in entries[2] and entries[2]["oracle"] == {"passed": False} and "oracle" not in entries[3]
    case = regret.conclude({"op": "x", "candidates": entries})
    assert case["policy_ms"] == 2.0 and case["best_ms"] == 1.6 and case["best_plan"] == plan(256, "exact")
    assert case["regret"] == pytest.approx(0.25)
    # The policy's plan failing the oracle: no regret, an error.
    entries = regret.resolve([None, {"workers_per_program": 256}], fake_plan_of)
    regret.measure(entries, lambda fixed: {"passed": fixed["workers_per_program"] == 256}, time)
    assert "regret" not in regret.conclude({"candidates": entries})
    assert "error" in regret.conclude({"candidates": entries})


def test_summary_is_the_geometric_mean_and_the_worst():
    cases = [{"regret": 0.0}, {"regret": 0.21}, {"error": "x"}, {"regret": 0.08}]
    s = regret.summary(cases)
    assert s["cases"] == 4 and s["with_regret"] == 3 and s["worst_regret"] == 0.21
    assert s["geomean_regret"] == pytest.approx(math.exp((math.log(1.21) + math.log(1.08)) / 3) - 1)
    assert regret.summary([{"error": "x"}])["geomean_regret"] is None


def test_the_helpers_import_neither_torch_nor_tile():
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import regret, train_regret; "
            "assert not {'torch', 'tile'} & set(sys.modules), sorted(sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code, str(BENCH)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_cluster_family_holds_persistent_cluster_plans_of_long_rows():
    # The policy's plan only below 16384 columns; above, clusters of 4, 8 and 16 looping over one
    # wave of row blocks, every worker with a vector (ctas x workers x V <= 2N).
    assert regret.cluster_candidates(8192, 4, 132, True) == [None]
    family = regret.cluster_candidates(65536, 2, 132, True)
    assert family[0] is None
    plans = family[1:]
    assert {p["ctas_per_program"] for p in plans} == {4, 8, 16}
    assert all(p["grid_limit"] == p["resident_groups"] * 132 // p["ctas_per_program"] for p in plans)
    assert all(p["ctas_per_program"] * p["workers_per_program"] * 8 <= 2 * 65536 for p in plans)
    assert {p["column_loads"] for p in plans} == {"once", "ahead"}
    assert {p["row_prefetch"] for p in plans} == {"none", "next"}
    # Without per-column inputs (softmax) the weights are not held.
    assert {p["column_loads"] for p in regret.cluster_candidates(65536, 2, 132, False)[1:]} == {"ahead"}
