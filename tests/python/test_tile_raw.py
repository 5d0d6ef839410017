"""tile._tile.launch_raw, the path torch CUDA tensors take, exercised on the CPU backend with numpy
arrays given as plain integers (device -1): the same results and errors as the DLPack launch."""
import numpy as np
import pytest

import tile
from tile import _tile

OPS = ["softmax", "log_softmax", "rms_norm", "layer_norm"]


def raw(a):
    """(data_ptr, shape, strides in elements, dtype code, device) of a numpy array, as torch's would be."""
    return (a.ctypes.data, a.shape, tuple(s // a.itemsize for s in a.strides), _tile.RAW_DTYPE_CODES[a.dtype.name],
            -1)


def make(shape, dtype=np.float32, seed=0):
    return (np.random.default_rng(seed).standard_normal(shape) * 3).astype(dtype)


def both(op, x, out, weight=None, bias=None, record=False):
    """Runs op through launch and launch_raw (into a copy of out); returns (launch's, launch_raw's) results."""
    out_raw = out.copy()
    a = _tile.launch(op, x, out, weight, bias, None, None, 0, record)
    b = _tile.launch_raw(op, raw(x), raw(out_raw), None if weight is None else raw(weight),
                         None if bias is None else raw(bias), None, None, 0, record)
    return (out, a), (out_raw, b)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_same_output_as_launch(op, dtype):
    wide = make((3, 5, 96), dtype)
    x = wide[:, :, :70]                              # strided rows: (B, T, C) of a (B, T, S) buffer
    out = np.zeros((3, 5, 70), dtype)
    weight = make(70, np.float32, seed=1) if op in ("rms_norm", "layer_norm") else None
    bias = make(70, np.float32, seed=2) if op == "layer_norm" else None
    (y, rec), (y_raw, rec_raw) = both(op, x, out, weight, bias)
    assert rec is None and rec_raw is None           # record=False builds no dict
    assert np.array_equal(y, y_raw)
    (_, rec), (_, rec_raw) = both(op, x, out, weight, bias, record=True)
    assert rec == rec_raw and rec["backend"] == "cpu"


def error_of(fn):
    with pytest.raises(Exception) as info:
        fn()
    return type(info.value), str(info.value)


@pytest.mark.parametrize("case", ["strided_last", "not_flattening", "overlapping", "out_shape", "weight_shape",
                                  "bias_stride", "zero_d", "bias_on_rms_norm", "bad_eps", "bad_op"])
def test_same_errors_as_launch(case):
    x, out, weight, bias, op, eps = make((4, 64)), np.empty((4, 64), np.float32), None, None, "rms_norm", None
    if case == "strided_last":
        x = make((4, 128))[:, ::2]
    elif case == "not_flattening":
        x = make((3, 4, 16)).transpose(1, 0, 2)
        out = np.empty(x.shape, np.float32)
    elif case == "overlapping":
        x = np.lib.stride_tricks.as_strided(make((4, 64)), shape=(4, 32), strides=(16 * 4, 4))
        out = np.empty(x.shape, np.float32)
    elif case == "out_shape":
        out = np.empty(64, np.float32)
    elif case == "weight_shape":
        weight = np.ones(63, np.float32)
    elif case == "bias_stride":
        op, weight, bias = "layer_norm", np.ones(64, np.float32), np.ones(128, np.float32)[::2]
    elif case == "zero_d":
        x, out = np.ones((), np.float32), np.ones((), np.float32)
    elif case == "bias_on_rms_norm":
        op, bias = "rms_norm", np.ones(64, np.float32)
    elif case == "bad_eps":
        eps = -1.0
    elif case == "bad_op":
        op = "gelu"
    want = error_of(lambda: _tile.launch(op, x, out, weight, bias, eps, None, 0, False))
    got = error_of(lambda: _tile.launch_raw(op, raw(x), raw(out), None if weight is None else raw(weight),
                                            None if bias is None else raw(bias), eps, None, 0, False))
    assert got == want
    assert want[0] is ValueError


def test_bad_plan_gives_the_same_error():
    x, out = make((4, 64)), np.empty((4, 64), np.float32)
    plan = '{"warps": 2}'
    want = error_of(lambda: _tile.launch("softmax", x, out, None, None, None, plan, 0, False))
    assert error_of(lambda: _tile.launch_raw("softmax", raw(x), raw(out), None, None, None, plan, 0, False)) == want


def test_malformed_tuples_are_type_errors():
    x, out = make((4, 64)), np.empty((4, 64), np.float32)
    with pytest.raises(TypeError, match=r"launch_raw: argument 'out': expected a tuple \(data_ptr, shape"):
        _tile.launch_raw("softmax", raw(x), out)
    with pytest.raises(TypeError, match=r"launch_raw: argument 'x': expected a tuple"):
        _tile.launch_raw("softmax", raw(x)[:4], raw(out))
    with pytest.raises(TypeError, match=r"launch_raw: argument 'x': expected a tuple"):
        _tile.launch_raw("softmax", (x.ctypes.data, (4, 64), (64,), 0, -1), raw(out))
    with pytest.raises(TypeError, match=r"launch_raw: argument 'x': unknown dtype code 7"):
        _tile.launch_raw("softmax", raw(x)[:3] + (7, -1), raw(out))
    with pytest.raises(TypeError, match=r"launch_raw: argument 'weight': expected 64-bit integers.*got 1.5"):
        _tile.launch_raw("rms_norm", raw(x), raw(out), (0, (64,), (1.5,), 0, -1))
    with pytest.raises(TypeError, match=r"launch_raw: argument 'x': expected 64-bit integers.*got 36893488147419103232"):
        _tile.launch_raw("softmax", (x.ctypes.data, (2**65, 64), (64, 1), 0, -1), raw(out))


def test_shapes_whose_element_count_overflows_are_refused():
    # Leading extents multiplying past 2^63 once wrapped to 0 rows, and the call "succeeded".
    x, out = make((4, 64)), np.empty((4, 64), np.float32)
    for shape in [(2**62, 4, 64), (2**32, 2**32, 64), (3, 2**62, 64)]:
        strides = (0,) * (len(shape) - 1) + (1,)
        with pytest.raises(ValueError, match=r"softmax: argument 'x': expected leading extents whose product "
                                             r"\(the rows\) is below 2\^63, got shape"):
            _tile.launch_raw("softmax", (x.ctypes.data, shape, strides, 0, -1), raw(out))
    with pytest.raises(ValueError, match=r"softmax: argument 'x': expected a shape of extents >= 0, got shape \(-1, 64\)"):
        _tile.launch_raw("softmax", (x.ctypes.data, (-1, 64), (64, 1), 0, -1), raw(out))
    # Rows beyond what a view may span are refused before anything runs.
    with pytest.raises(ValueError, match=r"softmax: argument 'x': expected \(rows - 1\) \* row_stride \+ cols at most "
                                         r"2\^61 - 1 elements, got \(4611686018427387904, 64\)"):
        _tile.launch_raw("softmax", (x.ctypes.data, (2**62, 64), (64, 1), 0, -1),
                         (out.ctypes.data, (2**62, 64), (64, 1), 0, -1))
    # An empty leading extent is an empty call, whatever the others.
    assert _tile.launch_raw("softmax", (x.ctypes.data, (2**62, 0, 64), (0, 0, 1), 0, -1),
                            (out.ctypes.data, (2**62, 0, 64), (0, 0, 1), 0, -1), record=True)["groups"] == 0


def test_many_dimensions():
    x = make((2, 1, 2, 1, 2, 1, 2, 1, 3, 16))         # more dimensions than launch_raw keeps inline
    (y, _), (y_raw, _) = both("softmax", x, np.empty_like(x))
    assert np.array_equal(y, y_raw)


def test_dtype_codes():
    assert _tile.RAW_DTYPE_CODES == {"float32": 0, "float16": 1, "bfloat16": 2}
    assert tile.softmax(make((2, 8))).shape == (2, 8)  # numpy keeps the DLPack path
