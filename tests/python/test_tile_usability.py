"""Empty inputs, JIT-compile reports (logger "tile", TILE_LOG) and tile.precompile, with numpy on
the CPU backend (no torch needed); test_torch_usability.py has the torch side."""
import logging
import os
import subprocess
import sys

import numpy as np
import pytest

import tile
from tile import _log


# ---- empty inputs: what torch returns ----

@pytest.mark.parametrize("shape", [(4, 0), (0, 0), (2, 3, 0), (0, 16), (0, 3, 16)])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_empty_inputs_return_empty_results(shape, dtype):
    x = np.ones(shape, dtype)
    cols = shape[-1]
    rows = shape[:-1]
    for op in ("softmax", "log_softmax"):
        y = getattr(tile, op)(x)
        assert y.shape == shape and y.dtype == x.dtype
    y, rstd = tile.rms_norm(x, weight=np.ones(cols, np.float32), return_rstd=True)
    assert y.shape == shape and rstd.shape == rows and rstd.dtype == np.float32
    y, mean, rstd = tile.layer_norm(x, weight=np.ones(cols, dtype), bias=np.zeros(cols, dtype), return_stats=True)
    assert y.shape == shape and mean.shape == rows and rstd.shape == rows
    if cols == 0:                                # statistics of no values: NaN, as torch's
        assert np.isnan(rstd).all() and np.isnan(mean).all()
    out = np.full(shape, 7, dtype)
    assert tile.softmax(x, out=out) is out
    assert tile.layer_norm(x, dtype="float32").dtype == np.float32


def test_empty_inputs_are_checked_like_any_other():
    with pytest.raises(ValueError, match=r"layer_norm: argument 'bias': expected shape \(0,\)"):
        tile.layer_norm(np.ones((3, 0), np.float32), bias=np.ones(2, np.float32))
    with pytest.raises(ValueError, match=r"softmax: argument 'out': expected shape \(3, 0\) like x, got shape \(2, 0\)"):
        tile.softmax(np.ones((3, 0), np.float32), out=np.ones((2, 0), np.float32))
    with pytest.raises(ValueError, match=r"softmax: argument 'dtype': expected None or out's dtype"):
        tile.softmax(np.ones((3, 0), np.float32), out=np.ones((3, 0), np.float32), dtype="float16")
    rec = tile.run("rms_norm", np.ones((3, 0), np.float32))
    assert rec["kernels"] == 0 and rec["out"].shape == (3, 0)


# ---- JIT-compile reports ----

RECORD = {"kernel_name": "tile_softmax_f32_w256", "cache_origin": "compiled", "compile_ms": 412.25, "arch": "sm_90",
          "plan": {"workers_per_program": 256, "programs_per_group": 1}}


def test_compile_events_are_logged_with_kernel_plan_time_and_cache(caplog):
    with caplog.at_level(logging.INFO, logger="tile"):
        _log.event("softmax", RECORD)
        _log.event("softmax", dict(RECORD, cache_origin="disk", compile_ms=0.5))
        _log.event("softmax", dict(RECORD, cache_origin="launch-cache"))   # reused: not an event
        _log.event("softmax", dict(RECORD, cache_origin=""))               # the CPU backend: no JIT
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        'softmax: kernel tile_softmax_f32_w256 compiled with NVRTC (cache miss) in 412.2 ms for sm_90; plan '
        '{"workers_per_program":256,"programs_per_group":1}',
        'softmax: kernel tile_softmax_f32_w256 read from the disk cache (cache hit) in 0.5 ms for sm_90; plan '
        '{"workers_per_program":256,"programs_per_group":1}',
    ]
    assert all(r.name == "tile" and r.levelno == logging.INFO for r in caplog.records)


def test_calls_on_the_cpu_report_no_compile(caplog):
    with caplog.at_level(logging.INFO, logger="tile"):
        tile.softmax(np.ones((3, 40), np.float32))
        tile.builtin("rms_norm")(x=np.ones((3, 40), np.float32))
    assert caplog.records == []


def test_tile_log_environment_variable():
    code = ("import logging, tile; h = [x for x in logging.getLogger('tile').handlers if getattr(x, '_tile_env', 0)];"
            "print(len(h), logging.getLogger('tile').level);"
            "tile._log.event('rms_norm', {'kernel_name': 'k', 'cache_origin': 'memory', 'compile_ms': 1.0, "
            "'arch': 'sm_90', 'plan': {}})")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    for value, handlers, level in (("1", "1", logging.INFO), ("debug", "1", logging.DEBUG), ("0", "0", 0)):
        env["TILE_LOG"] = value
        run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
        assert run.returncode == 0, run.stderr
        assert run.stdout.split() == [handlers, str(level)]
        logged = "tile: rms_norm: kernel k taken from the memory cache (cache hit) in 1.0 ms for sm_90; plan {}"
        assert (logged in run.stderr) == (value != "0"), run.stderr


def test_launches_ask_for_compile_events_only():
    # launch(..., record=False, events=True) builds no record for a CPU call (nothing compiled).
    x = np.ones((2, 8), np.float32)
    assert tile._tile.launch(tile._PROGRAMS["softmax"], {"x": x, "y": np.empty_like(x)}, None, 0, False, None,
                             True) is None


# ---- precompile ----

def test_precompile_on_the_cpu_runs_the_call_and_compiles_nothing():
    x = np.random.default_rng(0).standard_normal((5, 64)).astype(np.float32)
    y = np.zeros_like(x)
    assert tile.precompile(tile.softmax, x, out=y) == []
    np.testing.assert_allclose(y, tile.softmax(x), rtol=0, atol=0)
    assert tile.precompile("rms_norm", x, weight=np.ones(64, np.float32)) == []
    assert tile.precompile(tile.builtin("layer_norm"), x=x) == []


def test_precompile_refuses_what_is_not_an_operator():
    with pytest.raises(ValueError, match=r"precompile: argument 'fn': expected an operator name"):
        tile.precompile("plan", np.ones((2, 2), np.float32))
    with pytest.raises(TypeError, match=r"precompile: argument 'fn': expected a tile operator or row program, got int"):
        tile.precompile(3)
    if "torch" not in sys.modules:
        with pytest.raises(ValueError, match=r"backward=True needs torch tensors"):
            tile.precompile(tile.softmax, np.ones((2, 2), np.float32), backward=True)
