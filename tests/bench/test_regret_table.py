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
