"""Tests of bench/train_sweep.py that need no GPU and no torch: its command line (--help, the
points of a full and a --quick run), the byte formulas, and the checks of a training
`tile-sweep/1` document (train_sweep.validate) on a synthetic run, which must also render
through bench/plot_sweep.py (tables, bytes formulas, the operators' target lines).
"""

import copy
import json
import os
import re
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCH = os.path.join(REPO, "bench")
SCRIPT = os.path.join(BENCH, "train_sweep.py")
sys.path.insert(0, BENCH)
import train_sweep  # noqa: E402

MIB = 2**20


def run(*args, code=None):
    cmd = [sys.executable] + (["-c", code] if code else [SCRIPT]) + [str(a) for a in args]
    return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True, timeout=300,
                          cwd=REPO)


def test_help_needs_no_torch():
    proc = run("--help")
    assert proc.returncode == 0, proc.stderr
    for word in train_sweep.OPS + ["--quick", "--resume", "--deadline-s", "--input-mib", "--ce-rows"]:
        assert word in proc.stdout, word
    # Importing the script, parsing and planning import neither torch nor tile.
    proc = run(code=("import sys; sys.path.insert(0, 'bench'); import train_sweep as t; "
                     "a = t.parse(['--out', 'x.json']); p = t.planned(a); "
                     "assert 'torch' not in sys.modules and 'tile' not in sys.modules, sorted(sys.modules); "
                     "print(len(p))"))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "69"


def test_points_of_a_full_and_a_quick_run():
    full = train_sweep.planned(train_sweep.parse(["--out", "x.json"]))
    assert len(full) == 4 * 2 * 8 + 5
    assert full[0] == ("softmax_backward", "bf16", 1024)
    assert ("layer_norm_backward", "f32", 262144) in full
    assert [p for p in full if p[0] == "cross_entropy_fwd_bwd"] == [
        ("cross_entropy_fwd_bwd", "bf16", v) for v in (32000, 50257, 128256, 151936, 262144)]
    quick = train_sweep.parse(["--quick", "--out", "x.json"])
    assert train_sweep.planned(quick) == [("rms_norm_backward", "bf16", 4096), ("fused_add_rms_norm", "bf16", 4096),
                                          ("cross_entropy_fwd_bwd", "bf16", 32000)]
    assert (quick.input_mib, quick.ce_rows, quick.batches) == (32, 512, 3)
    every = train_sweep.parse(["--quick", "--ops"] + train_sweep.OPS + ["--out", "x.json"])
    assert len(train_sweep.planned(every)) == 5


def test_rows_and_bytes():
    # One rows x N input of 256 MiB.
    assert train_sweep.rows_for("rms_norm_backward", "bf16", 1024, 256, 4096) == 131072
    assert train_sweep.rows_for("softmax_backward", "f32", 262144, 256, 4096) == 256
    assert train_sweep.rows_for("cross_entropy_fwd_bwd", "bf16", 50257, 256, 4096) == 4096
    r, n = 131072, 1024
    assert train_sweep.nbytes("softmax_backward", "bf16", r, n) == 3 * 256 * MIB
    assert train_sweep.nbytes("rms_norm_backward", "bf16", r, n) == 3 * 256 * MIB + 2 * n * 2 + 4 * r
    assert train_sweep.nbytes("layer_norm_backward", "f32", r, n) == 3 * r * n * 4 + 3 * n * 4 + 8 * r
    assert train_sweep.nbytes("fused_add_rms_norm", "bf16", r, n) == 4 * 256 * MIB + n * 2
    assert train_sweep.nbytes("cross_entropy_fwd_bwd", "bf16", 4096, 50257) == 2 * 4096 * 50257 * 2 + 12 * 4096


def entry(op, ms, passed=True, **extra):
    outs = {o: {"passed": passed, "mismatches": 0 if passed else 3, "max_abs_error": 1e-3}
            for o in train_sweep.OUTPUTS[op]}
    e = {"note": "synthetic", "first_call_s": 0.5,
         "oracle": {"passed": passed, "mismatches": 0 if passed else 3, "max_abs_error": 1e-3, "outputs": outs}}
    if passed:
        e.update(ms=ms, launches_per_batch=10, gbs=1e3 / ms, pct_of_copy=100.0 / ms)
    else:
        e["error"] = "failed the float64 oracle; not timed"
    e.update(extra)
    return e


def synthetic():
    """Two N of each operator in bf16 and f32 (cross-entropy: two vocabularies in bf16); copy at
    1 ms; Tile timed everywhere, QuACK refusing N % 4 != 0 and fp32 N > 128K, Liger erroring once
    and failing the oracle once."""
    points = []
    for op, dtype, n in [(op, d, n) for op in train_sweep.OPS[:4] for d in ("bf16", "f32") for n in (4096, 262144)] + \
            [("cross_entropy_fwd_bwd", "bf16", v) for v in (32000, 50257)]:
        rows = train_sweep.rows_for(op, dtype, n, 256, 4096)
        impls = {"tile": entry(op, 1.05, plan={"workers_per_program": 256, "programs_per_group": 1,
                                                "vector_elems": 8, "stripes": 2, "caching": "registers"}),
                 "torch_eager": entry(op, 1.6), "torch_compile": entry(op, 1.2)}
        if n > 65536:
            impls["liger"] = {"unsupported": "Liger-Kernel refuses rows longer than 65536 elements"}
        elif op == "layer_norm_backward" and dtype == "bf16":
            impls["liger"] = entry(op, None, passed=False)
        elif op == "softmax_backward":
            impls["liger"] = {"note": "x", "first_call_s": 0.2, "error": "RuntimeError: boom"}
        else:
            impls["liger"] = entry(op, 1.3)
        if n % 4:
            impls["quack"] = {"unsupported": f"QuACK refuses N % 4 != 0 (N = {n})"}
        else:
            impls["quack"] = entry(op, 1.0 if op == "fused_add_rms_norm" else 1.1)
        points.append({"op": op, "dtype": dtype, "n": n, "rows": rows, "bytes": train_sweep.nbytes(op, dtype, rows, n),
                       "bytes_formula": train_sweep.BYTES[op][0], "copy": {"ms": 1.0, "gbs": 4000.0},
                       "impls": impls, "wall_s": 3.0})
    return {"schema": "tile-sweep/1", "created": "2026-01-01T00:00:00+00:00", "gpu": "Synthetic GPU", "torch": "0.0",
            "tile": {"version": "0.1.0", "git_commit": "0" * 40, "git_dirty": False}, "method": "synthetic",
            "config": {"ops": train_sweep.OPS, "dtypes": ["bf16", "f32"], "peers": train_sweep.PEERS,
                       "input_mib": 256, "ce_rows": 4096, "batch_ms": 10, "batches": 5},
            "complete": True, "kind": "training",
            "bytes_formulas": {op: train_sweep.BYTES[op][0] for op in train_sweep.OPS}, "points": points}


def test_synthetic_run_is_valid():
    assert train_sweep.validate(synthetic()) == []


def _set(path, value):
    def mutate(doc):
        *head, last = path
        node = doc
        for k in head:
            node = node[k]
        if value is KeyError:
            del node[last]
        else:
            node[last] = value
    return mutate


@pytest.mark.parametrize("mutate, pattern", [
    (_set(["kind"], "forward"), r"kind is 'forward', expected 'training'"),
    (_set(["schema"], "tile-repeat/1"), r"schema is 'tile-repeat/1'"),
    (_set(["bytes_formulas", "softmax_backward"], "2·R·N·es"), r"bytes_formulas.softmax_backward is not the formula"),
    (_set(["bytes_formulas"], KeyError), r"bytes_formulas missing"),
    (_set(["points", 0, "bytes"], 1), r"points\[0\] \(softmax_backward bf16 N=4096\): bytes = 1, the formula gives"),
    (_set(["points", 1, "bytes_formula"], "x"), r"points\[1\] .*: bytes_formula is not the formula"),
    (_set(["points", 2, "copy"], {"ms": 0}), r"points\[2\] .*: copy.ms / copy.gbs"),
    (_set(["points", 3, "impls", "tile", "error"], "late"), r"impls.tile holds \['ms', 'error'\]"),
    (_set(["points", 3, "impls", "quack"], {"note": "nothing"}), r"impls.quack holds nothing"),
    (_set(["points", 4, "impls", "tile", "oracle", "passed"], False), r"impls.tile has a time without a passed oracle"),
    (_set(["points", 4, "impls", "tile", "oracle", "outputs"], {"dx": {}}),
     r"impls.tile.oracle.outputs checks \['dx'\], expected \['dx', 'dweight'\]"),
    (_set(["points", 5, "impls", "tile"], KeyError), r"impls missing or without tile"),
    (_set(["points", 6, "op"], "rms_norm"), r"points\[6\]: op, dtype, n or rows missing or unknown"),
    (lambda d: d["points"].append(copy.deepcopy(d["points"][0])), r"a second point for the same op, dtype and N"),
])
def test_validate_rejects(mutate, pattern):
    doc = synthetic()
    mutate(doc)
    problems = train_sweep.validate(doc)
    assert any(re.search(pattern, p) for p in problems), problems


def test_renders_through_plot_sweep(tmp_path):
    src = tmp_path / "train.json"
    src.write_text(json.dumps(synthetic(), indent=1))
    md = tmp_path / "train.md"
    proc = subprocess.run([sys.executable, os.path.join(BENCH, "plot_sweep.py"), str(src), "--markdown", str(md)],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    text = md.read_text(encoding="utf-8")
    assert text.startswith("# Training sweep: Tile against its peers")
    for op in train_sweep.OPS:
        assert f"- `{op}`: {train_sweep.BYTES[op][0]}" in text
    header = next(l for l in text.splitlines() if l.startswith("| op |"))
    assert "QuACK %" in header and "Liger %" in header
    row = next(l for l in text.splitlines() if l.startswith("| fused_add_rms_norm | 4096 |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[4] == "95.2" and cells[-3] == "0.95" and cells[-2] == "QuACK", cells
    assert re.search(r"QuACK at 1 points \(cross_entropy_fwd_bwd bf16 N=50257\): QuACK refuses N % 4 != 0", text)
    assert "layer_norm_backward bf16 N=4096 Liger: failed the float64 oracle; not timed (oracle: 3 mismatches" in text
    assert "softmax_backward bf16 N=4096 Liger: RuntimeError: boom" in text


def test_training_figures_carry_the_operators_targets(tmp_path):
    pytest.importorskip("matplotlib", reason="matplotlib is not installed (pip install -r requirements-dev.txt)")
    src = tmp_path / "train.json"
    src.write_text(json.dumps(synthetic(), indent=1))
    proc = subprocess.run([sys.executable, os.path.join(BENCH, "plot_sweep.py"), str(src), "--svg-dir",
                           str(tmp_path / "svg")], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    svg = lambda name: (tmp_path / "svg" / name).read_text(encoding="utf-8")  # noqa: E731
    assert "target 90 % (4K–32K)" in svg("rms_norm_backward-f32.svg")
    assert "target 85 % (64K–256K)" in svg("rms_norm_backward-f32.svg")
    assert "target 92 % (4K–16K)" in svg("fused_add_rms_norm-bf16.svg")
    assert "target 92" not in svg("fused_add_rms_norm-f32.svg")  # bf16 only
    assert "target 87 % (32000–50257)" in svg("cross_entropy_fwd_bwd-bf16.svg")
    assert "QuACK" in svg("cross_entropy_fwd_bwd-bf16.svg")
