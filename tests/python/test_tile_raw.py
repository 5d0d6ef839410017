"""tile._tile.launch_raw, the path torch CUDA tensors take, exercised on the CPU backend with numpy
arrays given as plain integers (device -1): the same results and errors as the DLPack launch, for
every role of operand."""
import numpy as np
import pytest

import tile
from tile import _tile

OPS = ["softmax", "log_softmax", "rms_norm", "layer_norm"]
LABELS = {"y": "out"}


def raw(a):
    """(data_ptr, shape, strides in elements, dtype code, device) of a numpy array, as torch's would be."""
    return (a.ctypes.data, a.shape, tuple(s // a.itemsize for s in a.strides), _tile.RAW_DTYPE_CODES[a.dtype.name],
            -1)


def as_raw(operands):
    return {k: raw(v) if isinstance(v, np.ndarray) else v for k, v in operands.items()}


def make(shape, dtype=np.float32, seed=0):
    return (np.random.default_rng(seed).standard_normal(shape) * 3).astype(dtype)


def program(op):
    return _tile.Program.builtin(op)


def same_layout(v):
    """A copy of v with v's strides and offset in a copy of its buffer: a peeled plan's accesses
    depend on where each row starts, so both launches must see one layout."""
    base = v.base
    if not isinstance(base, np.ndarray) or base.base is not None or not base.flags.c_contiguous:
        return v.copy()
    buffer = base.copy()
    return np.ndarray(v.shape, v.dtype, buffer=buffer, offset=v.ctypes.data - base.ctypes.data, strides=v.strides)


def both(p, operands, record=False):
    """Runs p through launch and launch_raw (into copies of the outputs, laid out alike); returns
    (launch's, launch_raw's) (outputs, record)."""
    copies = {k: same_layout(v) if isinstance(v, np.ndarray) else v for k, v in operands.items()}
    a = _tile.launch(p, operands, None, 0, record, LABELS)
    b = _tile.launch_raw(p, as_raw(copies), None, 0, record, LABELS)
    return (operands, a), (copies, b)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_same_output_as_launch(op, dtype):
    wide = make((3, 5, 96), dtype)
    ops = {"x": wide[:, :, :70], "y": np.zeros((3, 5, 70), dtype)}   # strided rows: (B, T, C) of a (B, T, S) buffer
    if op in ("rms_norm", "layer_norm"):
        ops["weight"] = make(70, np.float32, seed=1)
        ops["rstd"] = np.zeros((3, 5), np.float32)
    if op == "layer_norm":
        ops["bias"] = make(70, np.float32, seed=2)
        ops["mean"] = np.zeros((3, 5, 2), np.float32)[:, :, 0]        # per-row values may be strided views
    (got, rec), (got_raw, rec_raw) = both(program(op), ops)
    assert rec is None and rec_raw is None           # record=False builds no dict
    for name in ("y", "rstd", "mean"):
        if name in ops:
            assert np.array_equal(got[name], got_raw[name]), name
    (_, rec), (_, rec_raw) = both(program(op), ops, record=True)
    assert rec == rec_raw and rec["backend"] == "cpu"


def error_of(fn):
    with pytest.raises(Exception) as info:
        fn()
    return type(info.value), str(info.value)


@pytest.mark.parametrize("case", ["strided_last", "not_flattening", "overlapping", "out_shape", "weight_shape",
                                  "bias_stride", "zero_d", "bias_on_rms_norm", "bad_eps", "unknown_operand",
                                  "missing_x", "rstd_shape", "rstd_dtype", "rstd_not_flattening", "x_int_dtype"])
def test_same_errors_as_launch(case):
    op = "rms_norm"
    ops = {"x": make((4, 64)), "y": np.empty((4, 64), np.float32)}
    if case == "strided_last":
        ops["x"] = make((4, 128))[:, ::2]
    elif case == "not_flattening":
        ops["x"] = make((3, 4, 16)).transpose(1, 0, 2)
        ops["y"] = np.empty(ops["x"].shape, np.float32)
    elif case == "overlapping":
        ops["x"] = np.lib.stride_tricks.as_strided(make((4, 64)), shape=(4, 32), strides=(16 * 4, 4))
        ops["y"] = np.empty((4, 32), np.float32)
    elif case == "out_shape":
        ops["y"] = np.empty(64, np.float32)
    elif case == "weight_shape":
        ops["weight"] = np.ones(63, np.float32)
    elif case == "bias_stride":
        op = "layer_norm"
        ops["weight"], ops["bias"] = np.ones(64, np.float32), np.ones(128, np.float32)[::2]
    elif case == "zero_d":
        ops["x"], ops["y"] = np.ones((), np.float32), np.ones((), np.float32)
    elif case == "bias_on_rms_norm":
        ops["bias"] = np.ones(64, np.float32)
    elif case == "bad_eps":
        ops["eps"] = -1.0
    elif case == "unknown_operand":
        ops["gamma"] = 2.0
    elif case == "missing_x":
        del ops["x"]
    elif case == "rstd_shape":
        ops["rstd"] = np.empty((4, 1), np.float32)
    elif case == "rstd_dtype":
        ops["rstd"] = np.empty(4, np.float16)
    elif case == "rstd_not_flattening":
        ops["x"] = make((2, 3, 64))
        ops["y"] = np.empty((2, 3, 64), np.float32)
        ops["rstd"] = np.empty((3, 2), np.float32).T
    elif case == "x_int_dtype":
        ops["x"] = np.ones((4, 64), np.int32)
    want = error_of(lambda: _tile.launch(program(op), ops, None, 0, False, LABELS))
    got = error_of(lambda: _tile.launch_raw(program(op), as_raw(ops), None, 0, False, LABELS))
    assert got == want
    assert want[0] is ValueError, want


def test_error_messages_name_the_operand():
    ops = {"x": make((4, 64)), "y": np.empty((4, 64), np.float32), "rstd": np.empty((4, 1), np.float32)}
    with pytest.raises(ValueError, match=r"rms_norm: argument 'rstd': expected shape \(4,\) \(one value per row of x\), "
                                         r"got shape \(4, 1\)"):
        _tile.launch_raw(program("rms_norm"), as_raw(ops))
    ops["rstd"] = np.empty(4, np.float16)
    with pytest.raises(ValueError, match=r"rms_norm: argument 'rstd': expected dtype float32 or float64, got float16"):
        _tile.launch(program("rms_norm"), ops)
    del ops["rstd"]
    ops["gamma"] = 1.0
    with pytest.raises(ValueError, match=r"rms_norm: argument 'gamma': expected one of the operands x, y, weight, eps, "
                                         r"rstd, got an unknown operand"):
        _tile.launch(program("rms_norm"), ops)
    with pytest.raises(ValueError, match=r"softmax: argument 'x': expected a matrix \(row input\), got nothing"):
        _tile.launch(program("softmax"), {"y": ops["y"]})
    with pytest.raises(ValueError, match=r"softmax: argument 'x': expected a matrix \(row input\), got nothing"):
        _tile.launch(program("softmax"), {"x": None, "y": ops["y"]})
    with pytest.raises(TypeError, match=r"softmax: expected operand names as strings, got 1"):
        _tile.launch(program("softmax"), {1: ops["y"]})
    with pytest.raises(TypeError, match=r"softmax: expected the operands as a dict"):
        _tile.launch(program("softmax"), [ops["x"], ops["y"]])


def test_bad_plan_gives_the_same_error():
    ops = {"x": make((4, 64)), "y": np.empty((4, 64), np.float32)}
    plan = '{"warps": 2}'
    want = error_of(lambda: _tile.launch(program("softmax"), ops, plan, 0, False))
    assert error_of(lambda: _tile.launch_raw(program("softmax"), as_raw(ops), plan, 0, False)) == want


def test_malformed_tuples_are_type_errors():
    x, out = make((4, 64)), np.empty((4, 64), np.float32)
    sm, rms = program("softmax"), program("rms_norm")
    with pytest.raises(TypeError, match=r"launch_raw: argument 'out': expected a tuple \(data_ptr, shape"):
        _tile.launch_raw(sm, {"x": raw(x), "y": out}, labels=LABELS)
    with pytest.raises(TypeError, match=r"launch_raw: argument 'x': expected a tuple"):
        _tile.launch_raw(sm, {"x": raw(x)[:4], "y": raw(out)})
    with pytest.raises(TypeError, match=r"launch_raw: argument 'x': expected a tuple"):
        _tile.launch_raw(sm, {"x": (x.ctypes.data, (4, 64), (64,), 0, -1), "y": raw(out)})
    with pytest.raises(TypeError, match=r"launch_raw: argument 'x': unknown dtype code 7"):
        _tile.launch_raw(sm, {"x": raw(x)[:3] + (7, -1), "y": raw(out)})
    with pytest.raises(TypeError, match=r"launch_raw: argument 'weight': expected 64-bit integers.*got 1.5"):
        _tile.launch_raw(rms, {"x": raw(x), "y": raw(out), "weight": (0, (64,), (1.5,), 0, -1)})
    with pytest.raises(TypeError, match=r"launch_raw: argument 'x': expected 64-bit integers.*got 36893488147419103232"):
        _tile.launch_raw(sm, {"x": (x.ctypes.data, (2**65, 64), (64, 1), 0, -1), "y": raw(out)})
    with pytest.raises(TypeError, match=r"rms_norm: argument 'eps': expected a real number \(float\), got str 'a'"):
        _tile.launch_raw(rms, {"x": raw(x), "y": raw(out), "eps": "a"})


def test_shapes_whose_element_count_overflows_are_refused():
    # Leading extents multiplying past 2^63 once wrapped to 0 rows, and the call "succeeded".
    x, out = make((4, 64)), np.empty((4, 64), np.float32)
    sm = program("softmax")
    for shape in [(2**62, 4, 64), (2**32, 2**32, 64), (3, 2**62, 64)]:
        strides = (0,) * (len(shape) - 1) + (1,)
        with pytest.raises(ValueError, match=r"softmax: argument 'x': expected leading extents whose product "
                                             r"\(the rows\) is below 2\^63, got shape"):
            _tile.launch_raw(sm, {"x": (x.ctypes.data, shape, strides, 0, -1), "y": raw(out)})
    with pytest.raises(ValueError, match=r"softmax: argument 'x': expected a shape of extents >= 0, got shape \(-1, 64\)"):
        _tile.launch_raw(sm, {"x": (x.ctypes.data, (-1, 64), (64, 1), 0, -1), "y": raw(out)})
    # Rows beyond what a view may span are refused before anything runs.
    with pytest.raises(ValueError, match=r"softmax: argument 'x': expected \(rows - 1\) \* row_stride \+ cols at most "
                                         r"2\^61 - 1 elements, got \(4611686018427387904, 64\)"):
        _tile.launch_raw(sm, {"x": (x.ctypes.data, (2**62, 64), (64, 1), 0, -1),
                              "y": (out.ctypes.data, (2**62, 64), (64, 1), 0, -1)})
    # An empty leading extent is an empty call, whatever the others.
    assert _tile.launch_raw(sm, {"x": (x.ctypes.data, (2**62, 0, 64), (0, 0, 1), 0, -1),
                                 "y": (out.ctypes.data, (2**62, 0, 64), (0, 0, 1), 0, -1)}, record=True)["groups"] == 0


def test_many_dimensions():
    x = make((2, 1, 2, 1, 2, 1, 2, 1, 3, 16))         # more dimensions than launch_raw keeps inline
    (got, _), (got_raw, _) = both(program("softmax"), {"x": x, "y": np.empty_like(x)})
    assert np.array_equal(got["y"], got_raw["y"])


def test_integer_operands_cross_both_ways():
    # A per-row integer target (i32 and i64 codes): the logit at each row's target column.
    p = tile.RowProgram("pick")
    x, target = p.row_in("x"), p.row_scalar_in("target", ["i32", "i64"])
    picked = p.row_scalar_out("picked")
    v = p.load(x)
    p.store(picked, p.reduce1(tile.Axis.cols, tile.monoid.sum(),
                              p.select(tile.eq(p.col_index(), p.load(target)), v, 0.0)))
    xs = make((5, 40))
    for dtype in (np.int32, np.int64):
        t = np.array([0, 39, 7, 3, 20], dtype)
        (got, _), (got_raw, _) = both(p._p, {"x": xs, "target": t, "picked": np.full(5, np.nan, np.float32)})
        assert np.array_equal(got["picked"], xs[np.arange(5), t])
        assert np.array_equal(got_raw["picked"], got["picked"])


def test_dtype_codes():
    assert _tile.RAW_DTYPE_CODES == {"float32": 0, "float16": 1, "bfloat16": 2, "int32": 3, "int64": 4, "float64": 5}
    assert tile.softmax(make((2, 8))).shape == (2, 8)  # numpy keeps the DLPack path
