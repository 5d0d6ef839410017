"""The workspace of reductions over the rows from Python (CPU backend): the size query
(RowProgram.workspace_bytes, _tile.workspace_bytes) against what the launch uses, a workspace
given to _tile.launch written as given with the same result bit for bit, the refusals, and
which calls ask the torch allocator for one. Capture on the GPU: test_torch_compile.py."""
import numpy as np
import pytest

import tile
from tile import _call, _tile


def rms_backward(rows=300, cols=500, seed=0):
    """rms_norm_backward's operands with dweight, outputs poisoned."""
    g = np.random.default_rng(seed)
    x = g.standard_normal((rows, cols), dtype=np.float32)
    return dict(dy=g.standard_normal((rows, cols), dtype=np.float32), x=x,
                weight=g.uniform(0.5, 1.5, cols).astype(np.float32),
                rstd=g.uniform(0.5, 2.0, rows).astype(np.float32),
                dx=np.full((rows, cols), np.nan, np.float32), dweight=np.full(cols, np.nan, np.float32))


P = tile.builtin("rms_norm_backward")


def launch(ops, workspace):
    return _tile.launch(P._p, ops, None, 0, True, None, False, workspace)


def test_no_workspace_without_reductions_over_the_rows():
    x = np.random.default_rng(1).standard_normal((64, 100), dtype=np.float32)
    assert tile.builtin("softmax").workspace_bytes(x=x) == 0
    assert tile.builtin("softmax_backward").workspace_bytes(y=x, dy=x) == 0
    assert tile.run("softmax", x)["workspace_bytes"] == 0
    # A workspace given to a call that needs none is ignored, however small.
    one = np.zeros(1, np.float32)
    _tile.launch(tile.builtin("softmax")._p, {"x": x, "y": np.empty_like(x)}, None, 0, False, None, False,
                 (one.ctypes.data, 1))


@pytest.mark.parametrize("plan", [None, {"workers_per_program": 32, "programs_per_group": 1},
                                  {"workers_per_program": 32, "programs_per_group": 4}])
def test_query_is_what_the_launch_uses(plan):
    ops = rms_backward()
    n = P.workspace_bytes(plan=plan, **ops)
    assert n > 0 and n % (4 * 500) == 0          # one fp32 partial per column and slot
    rec = P.run(plan=plan, **ops)
    assert rec["kernels"] == 2 and rec["workspace_bytes"] == n
    assert _tile.workspace_bytes(P._p, ops, None if plan is None else _call.plan_json("p", plan)) == n


def test_query_binds_and_checks_like_a_call():
    ops = rms_backward(4, 16)
    ops["rstd"] = ops["rstd"][:3]
    with pytest.raises(ValueError, match=r"rms_norm_backward: argument 'rstd': expected shape \(4,\).*got shape \(3,\)"):
        P.workspace_bytes(**ops)


def test_given_workspace_is_written_with_the_same_result():
    own, given = rms_backward(), rms_backward()
    P(**own)
    assert P.check(**own)["ok"]                   # the float64 reference
    n = P.workspace_bytes(**given)
    ws = np.full(n // 4 + 8, np.nan, np.float32)  # 8 floats more: left as they were
    rec = launch(given, (ws.ctypes.data, ws.nbytes))
    assert rec["workspace_bytes"] == n
    assert own["dx"].tobytes() == given["dx"].tobytes()
    assert own["dweight"].tobytes() == given["dweight"].tobytes()
    assert not np.isnan(ws[: n // 4]).all(), "the given workspace was not written"
    assert np.isnan(ws[n // 4:]).all(), "the workspace was written past the bytes the call needs"


def test_too_small_misaligned_or_null_workspace_is_refused_before_the_launch():
    ops = rms_backward(64, 1000)
    n = P.workspace_bytes(**ops)
    ws = np.zeros(n // 4 + 4, np.float32)
    with pytest.raises(ValueError) as e:
        launch(ops, (ws.ctypes.data, n - 4))
    assert str(e.value) == (f"rms_norm_backward: argument 'workspace': expected at least {n} bytes "
                            f"(tile::workspace_bytes of this call), got {n - 4} bytes")
    with pytest.raises(ValueError, match=r"argument 'workspace': expected a pointer aligned to 4 bytes .*got an "
                                         r"address 2 bytes past a 4-byte boundary"):
        launch(ops, (ws.ctypes.data + 2, n))
    with pytest.raises(ValueError, match=rf"argument 'workspace': expected a pointer to the workspace_size = {n} "
                                         r"bytes given, or none .*got nullptr"):
        launch(ops, (0, n))
    assert np.isnan(ops["dx"]).all() and np.isnan(ops["dweight"]).all()   # nothing ran


@pytest.mark.parametrize("workspace,message", [
    (3, r"expected None, a callable or a tuple \(pointer, bytes\), got int"),
    ((1, 2, 3), r"expected None, a callable or a tuple \(pointer, bytes\), got a tuple of 3 items"),
    ((1.0, 16), r"expected the pointer as an int >= 0, got 1.0"),
    ((16, -1), r"expected the size in bytes as an int >= 0, got -1"),
])
def test_malformed_workspace_argument(workspace, message):
    with pytest.raises(TypeError, match=r"rms_norm_backward: argument 'workspace': " + message):
        launch(rms_backward(4, 16), workspace)


def test_an_allocator_is_asked_only_on_the_cuda_backend():
    def refuse(*args):
        raise AssertionError(f"asked for a workspace on the CPU backend: {args}")
    ops = rms_backward()
    rec = launch(ops, refuse)
    assert rec["workspace_bytes"] > 0 and P.check(**ops)["ok"]


def test_which_programs_may_ask_for_a_workspace():
    needs = {name: _call.Info(tile.builtin(name)._p).may_need_workspace for name in tile.training_programs()}
    for name in ("rms_norm_backward", "layer_norm_backward", "fused_add_rms_norm_backward", "cross_entropy",
                 "cross_entropy_fused"):
        assert needs[name], name
    for name in ("softmax_backward", "log_softmax_backward", "fused_add_rms_norm"):
        assert not needs[name], name
    assert not any(_call.Info(tile.builtin(op)._p).may_need_workspace
                   for op in ("softmax", "log_softmax", "rms_norm", "layer_norm"))


def test_torch_cpu_tensors_ask_no_workspace(monkeypatch):
    torch = pytest.importorskip("torch")

    def refuse(*args):
        raise AssertionError("torch_workspace called for CPU tensors")
    monkeypatch.setattr(_call, "torch_workspace", refuse)
    ops = {k: torch.from_numpy(v) for k, v in rms_backward().items()}
    dx, dw = tile.rms_norm_backward(ops["dy"], ops["x"], ops["weight"], ops["rstd"])
    P(**{**ops, "dx": dx, "dweight": dw})        # the same call as a program, writing the same outputs
    assert P.check(**{k: v.numpy() for k, v in {**ops, "dx": dx, "dweight": dw}.items()})["ok"]
