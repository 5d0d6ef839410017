"""bench/regret_table.py on a synthetic tile-regret/1 document."""

import json
import math
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "regret_table.py"


def plan(w, caching="registers"):
    return {"workers_per_program": w, "programs_per_group": 1, "vector_elems": 4, "stripes": 4,
            "caching": caching, "stripe_unroll": 1}


def case(op, n, policy_ms, best_ms):
    return {"op": op, "dtype": "f32", "n": n, "rows": 8, "policy_ms": policy_ms, "best_ms": best_ms,
            "regret": policy_ms / best_ms - 1, "policy_plan": plan(256), "best_plan": plan(512),
            "candidates": [{"request": None, "plan": plan(256), "ms": policy_ms, "oracle": {"passed": True}},
                           {"request": {"workers_per_program": 512}, "plan": plan(512), "ms": best_ms,
                            "oracle": {"passed": True}},
                           {"request": {"workers_per_program": 64}, "plan": plan(64),
                            "oracle": {"passed": False}}]}


def run(tmp_path, doc):
    src = tmp_path / "regret.json"
    src.write_text(json.dumps(doc))
    return subprocess.run([sys.executable, str(SCRIPT), str(src), "--markdown", "-"], capture_output=True, text=True)


def test_geometric_mean_worst_case_and_oracle_failures(tmp_path):
    doc = {"schema": "tile-regret/1", "gpu": "test", "created": "now",
           "cases": [case("softmax", 1024, 1.0, 1.0), case("softmax", 4096, 1.21, 1.0), case("rms_norm", 1024, 1.08, 1.0)]}
    out = run(tmp_path, doc)
    assert out.returncode == 0, out.stderr
    geo = math.exp((math.log(1.0) + math.log(1.21) + math.log(1.08)) / 3) - 1
    assert f"**{100 * geo:.1f} %**" in out.stdout
    assert "| softmax | f32 | 4096 | 21.0 |" in out.stdout
    assert "above 10 %: 1" in out.stdout
    assert "failed the float64 oracle: 3" in out.stdout
    assert "| 4096 | 21.0 (2) |" in out.stdout  # two candidates timed, one failed its check


def test_wrong_schema_is_refused(tmp_path):
    out = run(tmp_path, {"schema": "tile-sweep/1", "points": []})
    assert out.returncode == 2
    assert "expected 'tile-regret/1'" in out.stderr


def test_summary_per_operator_and_the_plans_of_training_calls():
    sys.path.insert(0, str(SCRIPT.parent))
    import regret_table
    cases = [case("softmax_backward", 4096, 1.0, 1.0), case("softmax_backward", 65536, 1.21, 1.0),
             case("rms_norm_backward", 4096, 1.5, 1.0), case("rms_norm_backward", 65536, 1.0, 1.0)]
    del cases[3]["regret"]  # the policy's plan failed the oracle: no number
    text = regret_table.render({"gpu": "test", "created": "now", "cases": cases}, "x.json", by_op=True)
    assert f"| softmax_backward | 2 of 2 | {100 * (math.sqrt(1.21) - 1):.1f} | 21.0 | f32 N=65536 |" in text
    assert "| rms_norm_backward | 1 of 2 | 50.0 | 50.0 | f32 N=4096 |" in text
    geo = math.exp((math.log(1.21) + math.log(1.5)) / 3) - 1
    assert f"| **all** | 3 of 4 | {100 * geo:.1f} | 50.0 | rms_norm_backward f32 N=4096 |" in text
    assert "| operator |" not in regret_table.render({"gpu": "test", "created": "now", "cases": cases}, "x.json")
    # A cluster's groups, and a reduction over the rows' grid limit and second-phase workers.
    p = dict(plan(512), ctas_per_program=4, grid_limit=0, finish_workers=256)
    assert regret_table.plan_text(p) == "w512 p1 v4 s4 registers c4"
    p = dict(plan(256, "reread"), ctas_per_program=1, grid_limit=264, finish_workers=128, stripe_unroll=4)
    assert regret_table.plan_text(p) == "w256 p1 v4 s4 reread u4 g264 f128"
