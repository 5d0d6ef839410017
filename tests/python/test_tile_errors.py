"""Arguments the Python package must reject, with messages naming argument, expected and given."""
import numpy as np
import pytest

import tile


def x32(shape=(4, 64)):
    return np.random.default_rng(0).standard_normal(shape).astype(np.float32)


def test_bad_dim():
    with pytest.raises(ValueError, match=r"softmax: argument 'dim': expected -1 or 2 .*got 0"):
        tile.softmax(x32((2, 3, 8)), dim=0)
    with pytest.raises(ValueError, match=r"log_softmax: argument 'dim'.*got 5"):
        tile.log_softmax(x32(), dim=5)
    assert tile.softmax(x32((2, 3, 8)), dim=2).shape == (2, 3, 8)


def test_non_contiguous_last_dim():
    x = x32((4, 64))[:, ::2]
    with pytest.raises(ValueError, match=r"argument 'x': expected a contiguous last dimension \(stride 1\), "
                                         r"got shape \(4, 32\) strides \(64, 2\)"):
        tile.softmax(x)
    with pytest.raises(ValueError, match=r"argument 'x': expected a contiguous last dimension"):
        tile.softmax(np.asfortranarray(x32()))


def test_leading_dims_that_do_not_flatten():
    x = x32((3, 4, 16)).transpose(1, 0, 2)
    with pytest.raises(ValueError, match=r"rms_norm: argument 'x': expected leading dimensions that flatten "
                                         r"to rows of one stride.*got shape \(4, 3, 16\) strides \(16, 64, 1\)"):
        tile.rms_norm(x)
    out = np.empty((3, 4, 16), np.float32).transpose(1, 0, 2)
    with pytest.raises(ValueError, match=r"argument 'out': expected leading dimensions"):
        tile.rms_norm(np.ascontiguousarray(x), out=out)


def test_overlapping_rows():
    x = np.lib.stride_tricks.as_strided(x32((4, 64)), shape=(4, 32), strides=(16 * 4, 4))
    with pytest.raises(ValueError, match=r"argument 'x': expected rows that do not overlap \(row stride >= 32\)"):
        tile.softmax(x)


def test_wrong_weight_shape():
    with pytest.raises(ValueError, match=r"rms_norm: argument 'weight': expected shape \(64,\) with stride 1.*"
                                         r"got shape \(63,\)"):
        tile.rms_norm(x32(), weight=np.ones(63, np.float32))
    with pytest.raises(ValueError, match=r"layer_norm: argument 'bias': expected shape \(64,\).*got shape \(1, 64\)"):
        tile.layer_norm(x32(), weight=np.ones(64, np.float32), bias=np.ones((1, 64), np.float32))
    with pytest.raises(ValueError, match=r"argument 'weight': expected shape \(64,\) with stride 1.*strides \(2,\)"):
        tile.rms_norm(x32(), weight=np.ones(128, np.float32)[::2])


def test_unsupported_dtype():
    with pytest.raises(ValueError, match=r"softmax: argument 'x': expected dtype float32, float16 or bfloat16, "
                                         r"got int32"):
        tile.softmax(np.ones((4, 8), np.int32))
    with pytest.raises(ValueError, match=r"argument 'out': expected dtype float32, float16 or bfloat16, got float64"):
        tile.softmax(x32(), out=np.empty((4, 64), np.float64))
    with pytest.raises(ValueError, match=r"argument 'weight': expected dtype .* got float64"):
        tile.rms_norm(x32(), weight=np.ones(64))
    with pytest.raises(ValueError, match=r"argument 'dtype': expected float32 or float16 for a numpy output"):
        tile.softmax(x32(), dtype="bfloat16")


def test_weight_and_bias_dtypes_may_differ():
    # Each per-column operand has its own dtype; the result matches the oracle either way.
    x = x32()
    y = tile.layer_norm(x, weight=np.full(64, 2, np.float32), bias=np.ones(64, np.float16))
    mean = x.mean(axis=-1, keepdims=True)
    want = (x - mean) / np.sqrt(x.var(axis=-1, keepdims=True) + 1e-5) * 2 + 1
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4)


def test_out_shape_and_writability():
    with pytest.raises(ValueError, match=r"argument 'out': expected shape \(2, 32\) like x, got shape \(64,\)"):
        tile.softmax(x32((2, 32)), out=np.empty(64, np.float32))
    out = np.empty((4, 64), np.float32)
    out.flags.writeable = False
    with pytest.raises(ValueError, match=r"argument 'out': expected a writable array"):
        tile.softmax(x32(), out=out)
    with pytest.raises(ValueError, match=r"argument 'dtype': expected None or out's dtype"):
        tile.softmax(x32(), out=np.empty((4, 64), np.float32), dtype="float16")


def test_partial_overlap_is_rejected():
    buf = x32((5, 64))
    with pytest.raises(ValueError, match=r"argument 'y': expected memory that does not overlap x"):
        tile.softmax(buf[:4], out=buf[1:])


def test_not_an_array():
    with pytest.raises(TypeError, match=r"softmax: argument 'x': expected an array exporting DLPack.*got list"):
        tile.softmax([[1.0, 2.0]])
    with pytest.raises(TypeError, match=r"argument 'weight': expected an array exporting DLPack.*got tuple"):
        tile.rms_norm(x32(), weight=(1.0,) * 64)


def test_bad_plan_and_op():
    with pytest.raises(ValueError, match=r"mapping plan: argument 'programs_per_group': expected an integer"):
        tile.softmax(x32(), plan={"programs_per_group": "two"})
    with pytest.raises(ValueError, match=r"mapping plan: argument 'warps': expected a known plan field"):
        tile.plan("softmax", x32(), plan={"warps": 2})
    with pytest.raises(TypeError, match=r"argument 'plan': expected a dict"):
        tile.softmax(x32(), plan=3)
    with pytest.raises(ValueError, match=r"softmax"):
        tile.run("softmax", x32(), weight=np.ones(64, np.float32))
    with pytest.raises(ValueError):
        tile.run("gelu", x32())


def test_bad_eps():
    with pytest.raises(ValueError, match=r"rms_norm: argument 'eps': expected a finite value >= 0"):
        tile.rms_norm(x32(), eps=-1.0)


def test_stream_on_cpu():
    with pytest.raises(ValueError, match=r"argument 'stream': expected None for arrays on the CPU"):
        tile.softmax(x32(), stream=1234)
    with pytest.raises(TypeError, match=r"argument 'stream': expected an int"):
        tile.softmax(x32(), stream="default")
