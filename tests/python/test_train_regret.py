"""bench/train_regret.py without a GPU: every training operator's candidate family resolves on
the CPU (numpy arrays, the dry run a GPU run's family is) to distinct valid plans that include
the policy's; refusals are recorded, not raised; the operands the benchmark calls each program
with are those the public function passes; --list-candidates prints the families."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import tile
from tile import _call, _training

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "bench")
sys.path.insert(0, BENCH)
import regret  # noqa: E402
import train_regret  # noqa: E402

# The points of the GPU subset: N 4096-262144 at bf16 and fp32, vocabularies 32000 and 128256.
ARGS = train_regret.parse(["--list-candidates", "--ns", "4096", "16384", "65536", "262144",
                           "--vocabs", "32000", "128256"])
POINTS = train_regret.planned(ARGS)


def resolved(op, dtype, n):
    rows = train_regret.rows_for(op, dtype, n, ARGS)
    return rows, train_regret.dry_family(op, dtype, n, rows)


def program_call(op, dtype, n, rows):
    """A fresh set of the operands of a point, and its program."""
    c = train_regret.empty_case(op, dtype, n, rows)
    return tile.builtin(op), train_regret.operands(op, c, train_regret.new_outputs(op, c))


def test_the_points_cover_every_operator():
    assert {p[0] for p in POINTS} == set(train_regret.OPS) == set(tile.training_programs()) - {
        "cross_entropy", "cross_entropy_backward"}
    assert len(POINTS) == 6 * 2 * 4 + 2


@pytest.mark.parametrize("op,dtype,n", POINTS)
def test_family_resolves_to_distinct_valid_plans_with_the_policys(op, dtype, n):
    rows, entries = resolved(op, dtype, n)
    program, ops = program_call(op, dtype, n, rows)
    plans = [e for e in entries if "plan" in e]
    assert len(plans) >= 2, entries
    keys = [json.dumps(regret.fixed_plan(e["plan"]), sort_keys=True) for e in plans]
    assert len(set(keys)) == len(keys)
    # The policy's plan comes first, as the call resolves it with nothing fixed.
    assert entries[0]["request"] is None and entries[0]["plan"] == program.plan(**ops)
    for e in plans:
        # Valid: given back with every field fixed, the plan passes the validation as itself.
        fixed = regret.fixed_plan(e["plan"])
        assert regret.fixed_plan(program.plan(plan=fixed, **ops)) == fixed, e["request"]
        request = e["request"] or {}
        assert all(e["plan"][k] == v for k, v in request.items()), e
    for e in entries:
        if "rejected" in e:
            assert f"{op}: argument" in e["rejected"], e


def test_families_vary_the_mapping_the_caching_and_the_second_phase():
    # bf16 x 4096: widths and packings; the other caching; the reduction over the rows' phase.
    _, entries = resolved("rms_norm_backward", "bf16", 4096)
    plans = [e["plan"] for e in entries if "plan" in e]
    assert len({p["workers_per_program"] for p in plans}) >= 4
    assert len({p["programs_per_group"] for p in plans}) >= 3
    assert {p["caching"] for p in plans} == {"registers", "reread"}
    assert len({p["grid_limit"] for p in plans}) >= 3 and len({p["finish_workers"] for p in plans}) == 4
    # A long row without a reduction over the rows: clusters of groups caching the row.
    _, entries = resolved("softmax_backward", "f32", 65536)
    assert max(e["plan"]["ctas_per_program"] for e in entries if "plan" in e) > 1
    # And with one (the weight gradient): clusters looping over row blocks, prefetching or not.
    _, entries = resolved("rms_norm_backward", "bf16", 32768)
    looping = [e["plan"] for e in entries if "plan" in e and e["plan"]["ctas_per_program"] > 1]
    assert looping and all(p["grid_limit"] > 0 for p in looping)
    assert {p["row_prefetch"] for p in looping} == {"none", "next"}
    # Cross-entropy with reduction "none" has no second phase: the folding workers do not vary,
    # and the policy's one row block a group is timed against groups looping over row blocks.
    _, entries = resolved("cross_entropy_fused", "bf16", 32000)
    assert {e["plan"]["finish_workers"] for e in entries if "plan" in e} == {1024}
    assert {e["plan"]["grid_limit"] for e in entries if "plan" in e} == {0, 256, 512}


def test_refused_candidates_are_recorded_not_raised():
    # The family itself: register caching of a 256K fp32 row is refused by the validation.
    _, entries = resolved("rms_norm_backward", "f32", 262144)
    refused = [e for e in entries if "rejected" in e]
    assert refused and all("argument 'plan.caching'" in e["rejected"] for e in refused), refused
    # Requests no call takes, each recorded with the validation's message naming the field.
    rows = train_regret.rows_for("rms_norm_backward", "bf16", 4096, ARGS)
    program, ops = program_call("rms_norm_backward", "bf16", 4096, rows)
    bad = [{"workers_per_program": 48}, {"programs_per_group": 2, "ctas_per_program": 2}, {"vector_elems": 3}]
    out = regret.resolve([None] + bad, lambda r: program.plan(plan=r, **ops))
    assert "plan" in out[0]
    for request, e in zip(bad, out[1:]):
        assert e["request"] == request and "plan" not in e
        assert f"argument 'plan.{next(iter(request))}'" in e["rejected"], e
    # A call whose policy cannot be resolved: only the policy's request, rejected.
    x = np.zeros((4, 7), np.float32)
    c = {"y": x, "dy": np.zeros((4, 8), np.float32), "dx": np.zeros((4, 7), np.float32)}
    out = train_regret.family(tile.builtin("softmax_backward"), c, 4, 7)
    assert len(out) == 1 and out[0]["request"] is None and "softmax_backward" in out[0]["rejected"]
    assert "error" in regret.conclude({"candidates": out})


def public_call(op, c, o):
    """The public function, called as a user would with the point's arrays."""
    if op == "softmax_backward":
        return tile.softmax_backward(c.y, c.dy, out=o.dx)
    if op == "log_softmax_backward":
        return tile.log_softmax_backward(c.y, c.dy, out=o.dx)
    if op == "rms_norm_backward":
        return tile.rms_norm_backward(c.dy, c.x, c.weight, c.rstd, out=o.dx)
    if op == "layer_norm_backward":
        return tile.layer_norm_backward(c.dy, c.x, c.weight, c.bias, c.mean, c.rstd, out=o.dx)
    if op == "fused_add_rms_norm":
        return tile.fused_add_rms_norm(c.x, c.residual, weight=c.weight)
    if op == "fused_add_rms_norm_backward":
        return tile.fused_add_rms_norm_backward(c.dy, c.dresidual_out, c.x, c.weight, c.rstd)
    return tile.cross_entropy_fused(o.dlogits, c.target, reduction="none")


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("op", train_regret.OPS)
def test_the_operands_are_those_the_public_function_passes(monkeypatch, op, dtype):
    calls = []

    def run(name, operands, dtypes=None, plan=None, stream=None, label_smoothing=False, softcap=False, **naming):
        # _training._run up to the launch: the operands as the program receives them.
        _, info = _training._program(name, label_smoothing, softcap)
        ops, _ = _call.prepare(info, operands, dtypes)
        calls.append((name, ops, label_smoothing, softcap))
        return ops

    monkeypatch.setattr(_training, "_run", run)
    rows, n = 24, 1000 if op == "cross_entropy_fused" else 512
    c = train_regret.empty_case(op, dtype, n, rows)
    o = train_regret.new_outputs(op, c)
    bench = train_regret.operands(op, c, o)
    public_call(op, c, o)
    assert len(calls) == 1 and calls[0][0] == op and calls[0][2:] == (False, False)
    given = calls[0][1]
    program = tile.builtin(op)
    ours, _ = _call.prepare(program._info(), bench, None)
    assert {k for k, v in given.items() if v is not None} == {k for k, v in ours.items() if v is not None}
    for name, v in given.items():
        w = ours[name]
        if v is None or not hasattr(v, "shape"):
            assert v == w, name                       # absent, or the same scalar
        elif program.operand(name).role.endswith("_in"):
            assert v is w, name                       # the same input
        else:                                         # given as out=, or allocated alike
            assert v is w or (v.dtype, v.shape) == (w.dtype, w.shape), name
    assert program.plan(**given) == program.plan(**bench)


def test_bf16_resolves_like_its_float16_stand_in():
    torch = pytest.importorskip("torch")
    for op, n in (("rms_norm_backward", 16384), ("fused_add_rms_norm", 65536), ("cross_entropy_fused", 32000)):
        rows = train_regret.rows_for(op, "bf16", n, ARGS)
        stand_in = train_regret.dry_family(op, "bf16", n, rows)
        c = train_regret.empty_case(op, "bf16", n, rows)
        for name, a in vars(c).items():
            setattr(c, name, torch.zeros(a.shape, dtype=torch.bfloat16 if a.dtype == np.float16 else
                                         getattr(torch, a.dtype.name)))
        program = tile.builtin(op)
        real = train_regret.family(program, train_regret.operands(op, c, train_regret.new_outputs(op, c)), rows, n)
        assert [(e["request"], e.get("plan")) for e in real] == [(e["request"], e.get("plan")) for e in stand_in]


def test_make_case_gives_the_inputs_the_dry_run_allocates():
    pytest.importorskip("torch")
    import train_sweep
    import torch
    gen = torch.Generator().manual_seed(5)
    old = train_sweep.DEVICE
    train_sweep.DEVICE = "cpu"
    try:
        for op in train_regret.OPS:
            for dtype in ("bf16", "f32"):
                c = train_sweep.make_case(train_regret.CASE[op], dtype, 64, 3, gen)
                train_regret.check_layout(op, c, 3, 64, dtype)
        c.extra = c.target
        with pytest.raises(SystemExit, match="internal error"):
            train_regret.check_layout(op, c, 3, 64, dtype)
    finally:
        train_sweep.DEVICE = old


def test_list_candidates_runs_without_torch():
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import train_regret as t; "
            "code = t.main(['--list-candidates', '--ops', 'layer_norm_backward', 'cross_entropy_fused', '--ns', '4096', "
            "'262144', '--dtypes', 'f32', '--vocabs', '32000']); "
            "assert 'torch' not in sys.modules, 'torch imported'; sys.exit(code)")
    proc = subprocess.run([sys.executable, "-c", code, BENCH], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    heads = [line for line in proc.stdout.splitlines() if not line.startswith("  ")]
    assert [h.split(":")[0] for h in heads] == ["layer_norm_backward f32 N=4096 rows=16384",
                                                "layer_norm_backward f32 N=262144 rows=256",
                                                "cross_entropy_fused bf16 N=32000 rows=4096"]
    assert "rejected: ValueError: layer_norm_backward: argument 'plan.caching'" in proc.stdout
    assert proc.stdout.count("  null: ") == 3
