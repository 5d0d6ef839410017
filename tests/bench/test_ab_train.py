"""bench/ab_train.py's order of runs and its per-point summary, on synthetic train_sweep results."""

import importlib.util
import math
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "ab_train.py"
spec = importlib.util.spec_from_file_location("ab_train", SCRIPT)
ab_train = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ab_train)


def point(op, n, tile_ms, copy_ms, eager_ms=None):
    impls = {"tile": {"ms": tile_ms}}
    if eager_ms is not None:
        impls["torch_eager"] = {"ms": eager_ms}
    return {"op": op, "dtype": "bf16", "n": n, "copy": {"ms": copy_ms}, "impls": impls}


def run(build, points):
    return {"build": build, "result": {"points": points}}


def test_abba_alternates_the_first_build():
    assert ab_train.abba(1) == ["A", "B"]
    assert ab_train.abba(3) == ["A", "B", "B", "A", "A", "B"]


def test_summary_takes_each_builds_median_and_drops_points_one_build_lacks():
    runs = [run("A", [point("rms_norm_backward", 1024, 0.30, 0.10, 0.5), point("softmax_backward", 1024, 0.2, 0.1)]),
            run("B", [point("rms_norm_backward", 1024, 0.20, 0.11, 0.6)]),
            run("B", [point("rms_norm_backward", 1024, 0.24, 0.09)]),
            run("A", [point("rms_norm_backward", 1024, 0.34, 0.10)]),
            run("A", [point("rms_norm_backward", 1024, 0.90, 0.10)]),
            run("B", [{"op": "rms_norm_backward", "dtype": "bf16", "n": 1024, "copy": {"ms": 0.1},
                       "impls": {"tile": {"error": "refused"}}}])]
    rows = ab_train.summarise(runs)
    assert len(rows) == 1  # softmax_backward ran for A only; a point without a time is skipped
    r = rows[0]
    assert math.isclose(r["a_ms"], 0.34) and math.isclose(r["b_ms"], 0.22)
    assert math.isclose(r["speedup"], 0.34 / 0.22)
    assert math.isclose(r["b_pct_of_copy"], 100 * 0.10 / 0.22)
    assert math.isclose(r["eager_ms"], 0.55)
    table = ab_train.markdown(rows, {"a": "base", "b": "new", "rounds": 3})
    assert "| rms_norm_backward | bf16 | 1024 | 340.0 | 220.0 | 1.545 |" in table
    assert "Geometric mean of A / B over 1 points: 1.545" in table
