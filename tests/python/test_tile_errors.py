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
    # An integer of any integer type; a float or a bool is refused as torch refuses it (1.0 == 1).
    assert tile.log_softmax(x32(), dim=np.int64(1)).shape == (4, 64)
    for op, dim in (("softmax", 1.0), ("softmax", -1.0), ("log_softmax", True)):
        with pytest.raises(TypeError, match=rf"{op}: argument 'dim': expected an integer, got {type(dim).__name__}"):
            getattr(tile, op)(x32(), dim=dim)


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
    with pytest.raises(ValueError, match=r"argument 'x': expected rows at increasing addresses that do not overlap "
                                         r"\(row stride >= 32\)"):
        tile.softmax(x)
    with pytest.raises(ValueError, match=r"argument 'x': expected rows at increasing addresses.*strides \(-64, 1\)"):
        tile.softmax(x32()[::-1])


def test_wrong_weight_shape():
    with pytest.raises(ValueError, match=r"rms_norm: argument 'weight': expected shape \(64,\) with stride 1.*"
                                         r"got shape \(63,\)"):
        tile.rms_norm(x32(), weight=np.ones(63, np.float32))
    with pytest.raises(ValueError, match=r"layer_norm: argument 'bias': expected shape \(64,\).*got shape \(1, 64\)"):
        tile.layer_norm(x32(), weight=np.ones(64, np.float32), bias=np.ones((1, 64), np.float32))
    with pytest.raises(ValueError, match=r"argument 'weight': expected shape \(64,\) with stride 1.*strides \(2,\)"):
        tile.rms_norm(x32(), weight=np.ones(128, np.float32)[::2])


def test_unsupported_dtype():
    with pytest.raises(ValueError, match=r"softmax: argument 'x': expected dtype float32, float64, float16 or bfloat16, "
                                         r"got int32"):
        tile.softmax(np.ones((4, 8), np.int32))
    # float64 is a dtype of its own calls: every float operand float64, or none.
    with pytest.raises(ValueError, match=r"softmax: argument 'out': expected a float dtype other than float64 like x "
                                         r"\(float32\), or every float operand in float64, got float64"):
        tile.softmax(x32(), out=np.empty((4, 64), np.float64))
    with pytest.raises(ValueError, match=r"argument 'weight': expected a float dtype other than float64 like x .* "
                                         r"got float64"):
        tile.rms_norm(x32(), weight=np.ones(64))
    with pytest.raises(ValueError, match=r"argument 'dtype': expected float32, float64 or float16 for a numpy output"):
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
    with pytest.raises(ValueError, match=r"softmax: argument 'plan.programs_per_group': expected an integer"):
        tile.softmax(x32(), plan={"programs_per_group": "two"})
    with pytest.raises(ValueError, match=r"softmax: argument 'plan.warps': expected a known plan field"):
        tile.plan("softmax", x32(), plan={"warps": 2})
    with pytest.raises(TypeError, match=r"argument 'plan': expected a dict"):
        tile.softmax(x32(), plan=3)
    with pytest.raises(ValueError, match=r"softmax"):
        tile.run("softmax", x32(), weight=np.ones(64, np.float32))
    with pytest.raises(ValueError):
        tile.run("gelu", x32())


EPS_RANGE = r"expected 0 or a finite positive value that float32 holds within rounding"


def test_bad_eps():
    with pytest.raises(ValueError, match=r"rms_norm: argument 'eps': " + EPS_RANGE + r".*got -1$"):
        tile.rms_norm(x32(), eps=-1.0)
    # Values float32 would round to 0, to a coarse subnormal or to inf are refused, not rounded.
    for eps, given in [(1e-50, "1e-50"), (1e-40, "1e-40"), (1e39, "1e\\+39"), (float("nan"), "nan"),
                       (10**400, "inf")]:
        with pytest.raises(ValueError, match=r"layer_norm: argument 'eps': " + EPS_RANGE + r".*got " + given):
            tile.layer_norm(x32(), eps=eps)
    for eps, given in [("abc", r"str 'abc'"), ("1e-5", r"str '1e-5'"), (True, r"bool True"), (1j, r"complex 1j"),
                       (np.array([1e-5, 1.0]), r"numpy.ndarray"), ([1e-5], r"list")]:
        with pytest.raises(TypeError, match=r"rms_norm: argument 'eps': expected a real number \(float\), got " + given):
            tile.rms_norm(x32(), eps=eps)
    with pytest.raises(TypeError, match=r"rms_norm: argument 'eps'"):
        tile.plan("rms_norm", x32(), eps="abc")
    with pytest.raises(ValueError, match=r"softmax: argument 'eps': expected no eps \(the operator takes none\), "
                                         r"got 9.99999975e-06"):
        tile.run("softmax", x32(), eps=1e-5)


def test_eps_zero_and_numpy_scalars_are_accepted():
    x = x32((2, 8))
    x[0] = 0
    y = tile.rms_norm(x, eps=0)                  # no regularisation: a zero row is 0/0
    assert np.isnan(y[0]).all() and np.isfinite(y[1]).all()
    assert np.isfinite(tile.rms_norm(x, eps=np.float32(1e-6))).all()
    assert np.isfinite(tile.layer_norm(x32(), eps=np.float64(1e-5))).all()
    assert np.isfinite(tile.rms_norm(x, eps=2.0 ** -149)).all()  # a subnormal float32 holds exactly


def test_plan_values_of_numpy_integer_types():
    y = tile.softmax(x32(), plan={"stripes": np.int64(1), "workers_per_program": np.int32(16)})
    assert np.isfinite(y).all()
    assert tile.plan("softmax", x32(), plan={"programs_per_group": np.uint8(2)})["programs_per_group"] == 2
    with pytest.raises(ValueError, match=r"softmax: argument 'plan.stripes': expected an integer, got true"):
        tile.softmax(x32(), plan={"stripes": np.bool_(True)})
    with pytest.raises(ValueError, match=r"softmax: argument 'plan.stripes': expected an integer, got np.float64\(1.0\)"):
        tile.softmax(x32(), plan={"stripes": np.float64(1.0)})
    with pytest.raises(ValueError, match=r"softmax: argument 'plan.stripes': expected an integer, got nan"):
        tile.softmax(x32(), plan={"stripes": float("nan")})
    with pytest.raises(TypeError, match=r"softmax: argument 'plan.stripes': expected an integer or a string, got list"):
        tile.softmax(x32(), plan={"stripes": [1]})
    with pytest.raises(TypeError, match=r"softmax: argument 'plan': expected plan field names as strings, got 1 \(int\)"):
        tile.softmax(x32(), plan={1: 2})
    with pytest.raises(ValueError, match=r"softmax: argument 'plan.stripes': expected an integer in \[1, 2147483647\], "
                                         r"got 0"):
        tile.softmax(x32(), plan={"stripes": np.int64(0)})


def test_plan_text_with_a_nul_byte():
    # The JSON parser stops at NUL: what follows must not be dropped silently.
    with pytest.raises(ValueError, match=r"softmax: argument 'plan': expected a JSON object without NUL bytes, "
                                         r"got a NUL byte at offset 13 of 21"):
        tile.plan("softmax", x32(), plan='{"stripes":1}\x00garbage')
    with pytest.raises(ValueError, match=r"NUL"):
        tile.softmax(x32(), plan='{"stripes":1}\x00')


def test_big_endian_and_other_unexportable_dtypes():
    for arg, kwargs in [("x", {}), ("out", {"out": np.empty((4, 64), ">f4")}),
                        ("weight", {"weight": np.ones(64, ">f4")})]:
        x = x32().astype(">f4") if arg == "x" else x32()
        with pytest.raises(ValueError, match=rf"rms_norm: argument '{arg}': expected dtype float32, float64, float16 or bfloat16 "
                                             rf"in native \(little-endian\) byte order, got '>f4' \(big-endian; "):
            tile.rms_norm(x, **kwargs)
    with pytest.raises(ValueError, match=r"softmax: argument 'x': expected dtype float32, float64, float16 or bfloat16 "
                                         r"in native .*got '>f2'"):
        tile.plan("softmax", x32().astype(">f2"))
    with pytest.raises(ValueError, match=r"softmax: argument 'x': expected dtype float32, float64, float16 or bfloat16, "
                                         r"got \[\('a', '<f4'\)\]"):
        tile.softmax(np.zeros((2, 3), dtype=[("a", "<f4")]))
    with pytest.raises(ValueError, match=r"argument 'x': expected dtype float32, float64, float16 or bfloat16, got <U1"):
        tile.softmax(np.array([["a"]]))
    for dtype, name in [(bool, "bool8"), (np.int64, "int64"), (np.complex64, "complex64")]:
        with pytest.raises(ValueError, match=rf"softmax: argument 'x': expected dtype float32, float64, float16 or bfloat16, "
                                             rf"got {name}"):
            tile.softmax(np.ones((3, 4), dtype))
    # Long doubles DLPack cannot export (float128 on x86-64) are named like any other dtype.
    for dtype in (np.longdouble, np.clongdouble):
        if np.dtype(dtype).itemsize > (8 if np.dtype(dtype).kind == "f" else 16):
            with pytest.raises(ValueError, match=rf"softmax: argument 'x': expected dtype float32, float64, float16 or "
                                                 rf"bfloat16, got {np.dtype(dtype)}"):
                tile.softmax(np.ones((3, 4), dtype))
            with pytest.raises(ValueError, match=rf"cross_entropy: argument 'target': expected dtype int32 or int64, "
                                                 rf"got {np.dtype(dtype)}"):
                tile.cross_entropy(np.ones((3, 4), np.float32), np.zeros(3, dtype))


def test_scalars_masked_arrays_and_none():
    with pytest.raises(TypeError, match=r"softmax: argument 'x': expected an array exporting DLPack.*got numpy.float32 "
                                        r"\(a scalar, not an array\)"):
        tile.softmax(np.float32(3.0))
    with pytest.raises(ValueError, match=r"softmax: argument 'x': expected an array of at least one dimension, "
                                         r"got a 0-d array"):
        tile.softmax(np.array(3.0, np.float32))
    with pytest.raises(ValueError, match=r"rms_norm: argument 'weight': expected shape \(64,\).*got shape \(\)"):
        tile.rms_norm(x32(), weight=np.array(1.0, np.float32))
    # Rows of no columns return empty results (test_torch_empty.py), after the same checks.
    with pytest.raises(ValueError, match=r"softmax: argument 'x': expected dtype float32, float64, float16 or bfloat16, "
                                         r"got int32"):
        tile.softmax(np.ones((3, 0), np.int32))
    with pytest.raises(ValueError, match=r"rms_norm: argument 'weight': expected shape \(0,\)"):
        tile.rms_norm(np.ones((3, 0), np.float32), weight=np.ones(1, np.float32))
    with pytest.raises(TypeError, match=r"softmax: argument 'x': expected an array without a mask, got "
                                        r"numpy.ma.MaskedArray"):
        tile.softmax(np.ma.array(x32(), mask=np.zeros((4, 64), bool)))
    for fn in (tile.softmax, tile.rms_norm, tile.layer_norm):
        with pytest.raises(TypeError, match=rf"{fn.__name__}: argument 'x': expected an array exporting DLPack.*"
                                            r"got NoneType"):
            fn(None)
    with pytest.raises(TypeError, match=r"softmax: argument 'x': expected an array exporting DLPack.*got memoryview"):
        tile.softmax(memoryview(x32()))


def test_bad_op():
    ops = r"expected one of 'softmax', 'log_softmax', 'rms_norm', 'layer_norm'"
    with pytest.raises(ValueError, match=r"run: argument 'op': " + ops + r", got 'gelu'"):
        tile.run("gelu", x32())
    with pytest.raises(TypeError, match=r"run: argument 'op': " + ops + r", got None"):
        tile.run(None, x32())
    for fn in (tile.plan, tile.ir, tile.source):
        with pytest.raises(TypeError, match=rf"{fn.__name__}: argument 'op': " + ops + r", got 3"):
            fn(3, x32())


def test_bad_dtype_argument():
    for dtype, given in [(np.int32, r"<class 'numpy.int32'>"), ("int8", r"'int8'"), (5, r"5")]:
        with pytest.raises(ValueError, match=r"softmax: argument 'dtype': expected float32.*float16.*got " + given):
            tile.softmax(x32(), dtype=dtype)
    with pytest.raises(ValueError, match=r"softmax: argument 'out': expected a float dtype other than float64 like x"):
        tile.softmax(x32(), dtype=np.float64)   # a float64 output needs a float64 call


def test_disjoint_interleaved_views_of_one_buffer_run():
    b = x32((4, 128))
    before = b.copy()
    out = tile.softmax(b[:, :64], out=b[:, 64:])
    e = np.exp(before[:, :64].astype(np.float64) - before[:, :64].max(axis=1, keepdims=True))
    np.testing.assert_allclose(out, e / e.sum(axis=1, keepdims=True), rtol=1e-5, atol=1e-7)
    assert (b[:, :64] == before[:, :64]).all()
    tile.layer_norm(b[:, 64:], out=b[:, :64])                # the other way round
    with pytest.raises(ValueError, match=r"softmax: argument 'y': expected memory that does not overlap x"):
        tile.softmax(b[:, :64], out=b[:, 63:127])
    with pytest.raises(ValueError, match=r"rms_norm: argument 'y': expected memory that does not overlap weight"):
        tile.rms_norm(b[:, :64], weight=b[0, 64:], out=b[:, 64:])


def test_grid_beyond_its_limit_is_refused_by_every_entry_point():
    # 2^31 + 5 rows of one column, viewed over 4 bytes (never read): the grid check comes first.
    x = np.lib.stride_tricks.as_strided(np.zeros(1, np.float32), shape=(2**31 + 5, 1), strides=(4, 4))
    plan = {"programs_per_group": 1, "workers_per_program": 32, "grid_limit": 0}   # one row block a group
    message = r"softmax: argument 'x': expected at most 2147483647 groups of 1 rows \(the grid's limit\), got 2147483653 rows"
    for fn in (tile.plan, tile.ir, tile.source, tile.run):
        with pytest.raises(ValueError, match=message):
            fn("softmax", x, out=x, plan=plan)
    # Unasked, the policy launches 2^30 row blocks that loop over the rest (planned, not run).
    del plan["grid_limit"]
    assert tile.plan("softmax", x, out=x, plan=plan)["grid_limit"] == 2**30


def test_internal_errors_are_not_value_errors():
    assert issubclass(tile.InternalError, RuntimeError) and not issubclass(tile.InternalError, ValueError)
    with pytest.raises(tile.InternalError, match=r"tile internal error at .*a bug in the Tile library, not in the call"):
        tile._tile._raise_internal_error()


def test_stream_on_cpu():
    with pytest.raises(ValueError, match=r"argument 'stream': expected None for arrays on the CPU"):
        tile.softmax(x32(), stream=1234)
    with pytest.raises(TypeError, match=r"argument 'stream': expected an int"):
        tile.softmax(x32(), stream="default")


@pytest.mark.gpu
def test_torch_fast_path_refuses_the_same():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    x = torch.randn(4, 128, device="cuda")
    with pytest.raises(TypeError, match=r"rms_norm: argument 'eps': expected a real number \(float\), got str 'abc'"):
        tile.rms_norm(x, eps="abc")
    with pytest.raises(ValueError, match=r"rms_norm: argument 'eps': " + EPS_RANGE + r".*got 1e-50"):
        tile.rms_norm(x, eps=1e-50)
    with pytest.raises(ValueError, match=r"softmax: argument 'x': expected an array of at least one dimension"):
        tile.softmax(torch.tensor(3.0, device="cuda"))
    # numpy and torch integer scalars are plan integers; a plan given back is the same kernel.
    plan = tile.plan("softmax", x[:, :64], plan={"stripes": np.int64(1), "programs_per_group": torch.tensor(2)})
    assert plan["programs_per_group"] == 2 and tile.plan("softmax", x[:, :64], plan=plan) == plan
    # Disjoint interleaved halves of one tensor run; sharing one element does not.
    before = x.clone()
    y = tile.softmax(x[:, :64], out=x[:, 64:])
    torch.cuda.synchronize()
    torch.testing.assert_close(y, torch.softmax(before[:, :64].double(), -1).float(), rtol=1e-5, atol=1e-6)
    assert torch.equal(x[:, :64], before[:, :64])
    with pytest.raises(ValueError, match=r"softmax: argument 'y': expected memory that does not overlap x"):
        tile.softmax(x[:, :64], out=x[:, 63:127])


# ---- row programs written in Python ----

def masked_softmax():
    p = tile.RowProgram("masked_softmax")
    x, mask = p.row_in("x"), p.row_in("mask")
    t = p.scalar_in("t", default=1.0)
    p.scalar_range(t, 1e-3, 1e3)
    y = p.row_out("y", may_alias=x)
    v = p.load(x) / p.load(t) + p.load(mask)
    m, s = p.reduce2(tile.Axis.cols, tile.monoid.online_softmax(), v)
    p.store(y, tile.exp(v - m) / s)
    return p


def test_program_call_operands():
    p, x = masked_softmax(), x32()
    mask = np.zeros((4, 64), np.float32)
    with pytest.raises(ValueError, match=r"masked_softmax: argument 'z': expected one of the operands x, mask, t, y, "
                                         r"got an unknown operand"):
        p(x=x, mask=mask, z=x)
    with pytest.raises(ValueError, match=r"masked_softmax: argument 'mask': expected a matrix \(row input\), got nothing"):
        p(x=x)
    with pytest.raises(ValueError, match=r"masked_softmax: argument 'x': expected a matrix \(row input\), got nothing"):
        p(mask=mask)
    with pytest.raises(ValueError, match=r"masked_softmax: argument 'mask': expected shape \(4, 64\) like x, "
                                         r"got shape \(4, 63\)"):
        p(x=x, mask=mask[:, :63])
    with pytest.raises(ValueError, match=r"masked_softmax: argument 'y': expected shape \(4, 64\) like x, got shape \(64,\)"):
        p(x=x, mask=mask, y=np.empty(64, np.float32))
    with pytest.raises(ValueError, match=r"masked_softmax: argument 'mask': expected dtype float32, float64, float16 or bfloat16, "
                                         r"got int32"):
        p(x=x, mask=np.zeros((4, 64), np.int32))
    with pytest.raises(ValueError, match=r"masked_softmax: argument 't': expected a value in \[0.001, 1000\], got 0"):
        p(x=x, mask=mask, t=0)
    with pytest.raises(TypeError, match=r"masked_softmax: argument 't': expected a real number \(float\), got str 'a'"):
        p(x=x, mask=mask, t="a")
    with pytest.raises(TypeError, match=r"masked_softmax: argument 'mask': expected an array exporting DLPack.*got list"):
        p(x=x, mask=[[0.0] * 64] * 4)
    with pytest.raises(ValueError, match=r"masked_softmax: argument 'y': expected memory that does not overlap mask"):
        p(x=x, mask=mask, y=mask)
    with pytest.raises(TypeError, match=r"takes 1 positional argument"):
        p(x, mask)


def test_program_outputs_dtypes_and_shapes():
    p = tile.RowProgram("stats")
    x = p.row_in("x")
    target = p.row_scalar_in("target", ["i32", "i64"])
    total, y = p.row_scalar_out("total"), p.row_out("y", dtypes="bf16")
    colsum = p.col_out("colsum", dtypes=["f32"])
    v = p.load(x)
    p.store(total, p.reduce1(tile.Axis.cols, tile.monoid.sum(), v) + tile.to_f32(p.load(target)))
    p.store(y, v)
    p.store(colsum, p.reduce1(tile.Axis.rows, tile.monoid.sum(), v))
    x, t = x32(), np.zeros(4, np.int64)
    with pytest.raises(ValueError, match=r"stats: argument 'y': expected an output array of dtype bfloat16 \(numpy has "
                                         r"no bfloat16"):
        p(x=x, target=t)
    out = np.empty((4, 64), np.float32)
    with pytest.raises(ValueError, match=r"stats: argument 'y': expected dtype bfloat16, got float32"):
        p(x=x, target=t, y=out)
    with pytest.raises(ValueError, match=r"stats: argument 'target': expected dtype int32 or int64, got float32"):
        p(x=x, target=np.zeros(4, np.float32), y=None)
    with pytest.raises(ValueError, match=r"stats: argument 'target': expected shape \(4,\) \(one value per row of x\), "
                                         r"got shape \(4, 1\)"):
        p(x=x, target=np.zeros((4, 1), np.int64), y=None)
    with pytest.raises(ValueError, match=r"stats: argument 'colsum': expected shape \(64,\) with stride 1"):
        p(x=x, target=t, y=None, colsum=np.empty(63, np.float32))
    with pytest.raises(ValueError, match=r"stats: argument 'total': expected dtype float32 or float64, got float16"):
        p(x=x, target=t, y=None, total=np.empty(4, np.float16))
    with pytest.raises(ValueError, match=r"stats: argument 'total': expected a writable array"):
        ro = np.empty(4, np.float32)
        ro.flags.writeable = False
        p(x=x, target=t, y=None, total=ro)
    with pytest.raises(ValueError, match=r"stats: argument 'dtypes': expected for 'total' a dtype float32 or float64, got 'f16'"):
        p(x=x, target=t, y=None, dtypes={"total": "f16"})
    with pytest.raises(ValueError, match=r"stats: argument 'dtypes': expected names of outputs \(total, y, colsum\), "
                                         r"got 'x'"):
        p(x=x, target=t, dtypes={"x": "f32"})
    with pytest.raises(ValueError, match=r"stats: argument 'y': expected a matrix \(row output\), got nothing"):
        p(x=x, target=t, y=None)                         # a required output cannot be left out


def test_required_output_left_out():
    p = tile.RowProgram("copy")
    x, y = p.row_in("x"), p.row_out("y")
    p.store(y, p.load(x))
    with pytest.raises(ValueError, match=r"copy: argument 'y': expected a matrix \(row output\), got nothing"):
        p(x=x32(), y=None)
    n = tile.RowProgram("needs_n")
    x, y, k = n.row_in("x"), n.row_out("y"), n.scalar_in("k", type="i64")
    n.store(y, n.load(x) * tile.to_f32(n.load(k)))
    with pytest.raises(ValueError, match=r"needs_n: argument 'k': expected a number \(the scalar has no default\), "
                                         r"got nothing"):
        n(x=x32())
    with pytest.raises(ValueError, match=r"needs_n: argument 'k': expected an integer of magnitude at most 2\^53, got 1.5"):
        n(x=x32(), k=1.5)
    assert (n(x=np.ones((2, 3), np.float32), k=np.int64(3)) == 3).all()


def test_bad_program_construction_names_the_program():
    p = tile.RowProgram("bad")
    x, y = p.row_in("x"), p.row_out("y")
    q = tile.RowProgram("other")
    qx = q.row_in("x")
    cases = [
        (lambda: p.store(x, p.load(x)), ValueError, r"row program 'bad': store to 'x', which is an input"),
        (lambda: p.load(y), ValueError, r"row program 'bad': load of 'y', which is an output"),
        (lambda: p.load(x) + q.load(qx), ValueError, r"row program 'bad': an expression from another program"),
        (lambda: p.load(qx), ValueError, r"row program 'bad': load: operand 'x' belongs to row program 'other'"),
        (lambda: p.reduce1(tile.Axis.cols, tile.monoid.sum, p.load(x)), TypeError,
         r"row program 'bad': reduce: argument 'monoid': expected a tile.monoid value \(call it: tile.monoid.sum\(\)\)"),
        (lambda: p.reduce2(tile.Axis.cols, tile.monoid.sum(), p.load(x)), ValueError,
         r"row program 'bad': reduce2 with sum, which has 1 parts"),
        (lambda: p.reduce1("diag", tile.monoid.sum(), p.load(x)), ValueError,
         r"row program 'bad': reduce: argument 'axis': expected tile.Axis.cols or tile.Axis.rows, got 'diag'"),
        (lambda: p.row_in("plan"), ValueError, r"row program 'bad': operand name 'plan': expected a name that is not"),
        (lambda: p.row_in("x"), ValueError, r"row program 'bad': operand 'x' is declared twice"),
        (lambda: p.row_in("z", dtypes="float8"), ValueError,
         r"row program 'bad': operand 'z': argument 'dtypes': expected float32, float64, .* got 'float8'"),
        (lambda: p.row_scalar_in("t", ["f32", "i32"]), ValueError,
         r"row program 'bad': operand 't': expected float dtypes or integer dtypes, got f32 or i32"),
        (lambda: bool(p.load(x)), TypeError, r"row program 'bad': an expression has no truth value"),
        (lambda: p.load(x) + p.col_index(), ValueError, r"row program 'bad': add of f32 and i64"),
        (lambda: p.row_out("w", may_alias=y), ValueError, r"row program 'bad': row output 'w' may alias only a row input"),
        (lambda: p.store(y, p.reduce1(tile.Axis.rows, tile.monoid.sum(), p.load(x))), ValueError,
         r"row program 'bad': store of a reduction over the rows to row output 'y'"),
        (lambda: p.store(y, p.load(x) > 0), ValueError, r"row program 'bad': store of a b1 value to 'y'"),
        (lambda: p.load(x) + "a", TypeError, r"row program 'bad': expected an expression or a number, got str 'a'"),
        (lambda: p.scalar_in("s", type="f64"), ValueError, r"row program 'bad': scalar 's': expected type f32 or i64"),
        (lambda: tile.exp(1.0), TypeError, r"tile.exp: expected an expression, got float 1.0"),
        (lambda: tile.RowProgram("1x"), ValueError, r"RowProgram: argument 'name': expected an identifier"),
    ]
    for fn, kind, pattern in cases:
        with pytest.raises(kind, match=pattern):
            fn()
    with pytest.raises(ValueError, match=r"row program 'bad': output 'y' is never stored"):
        p(x=x32())
    with pytest.raises(ValueError, match=r"row program 'bad': output 'y' is never stored"):
        p.plan(x=x32())
    p.store(y, p.load(x))                                # complete now: it runs
    assert np.array_equal(p(x=x32()), x32())


def test_training_errors_name_the_function_and_argument_called():
    rng = np.random.default_rng(7)
    z = rng.standard_normal((6, 10)).astype(np.float32)
    t = np.arange(6) % 5
    lse = tile.cross_entropy(z, t, return_lse=True)[1]
    strided = np.repeat(z, 2, 1)[:, ::2]
    # A mean's count pass checks the caller's own logits and target: the caller is named.
    with pytest.raises(ValueError, match=r"^cross_entropy_fused: argument 'logits': expected a contiguous"):
        tile.cross_entropy_fused(strided, t)
    with pytest.raises(ValueError, match=r"^cross_entropy_backward: argument 'logits': expected a contiguous"):
        tile.cross_entropy_backward(1.0, strided, t, lse)
    with pytest.raises(ValueError, match=r"^cross_entropy_fused: argument 'target': expected dtype int32 or int64"):
        tile.cross_entropy_fused(z.copy(), t.astype(np.uint8))
    # out= and the bias that shapes dbias are named as given.
    dy = rng.standard_normal((3, 8)).astype(np.float32)
    x = rng.standard_normal((3, 8)).astype(np.float32)
    w = np.ones(8, np.float32)
    _, mean, rstd = tile.layer_norm(x, w, w, return_stats=True)
    with pytest.raises(ValueError, match=r"^layer_norm_backward: argument 'bias': expected shape \(8,\)"):
        tile.layer_norm_backward(dy, x, w, np.ones(3, np.float32), mean, rstd)
    with pytest.raises(ValueError, match=r"^softmax_backward: argument 'out': expected shape \(3, 8\)"):
        tile.softmax_backward(x, dy, out=np.empty((3, 4), np.float32))
    with pytest.raises(ValueError, match=r"^rms_norm_backward: argument 'out': expected shape \(3, 8\)"):
        tile.rms_norm_backward(dy, x, w, rstd, out=np.empty((3, 4), np.float32))
    with pytest.raises(ValueError, match=r"^cross_entropy_backward: argument 'out': expected shape \(6, 10\)"):
        tile.cross_entropy_backward(1.0, z, t, lse, out=np.empty((6, 4), np.float32))
    # A plan's fields are named as plan.<field> of the function called.
    with pytest.raises(ValueError, match=r"^rms_norm_backward: argument 'plan.stripes': expected an integer, got 2.0"):
        tile.rms_norm_backward(dy, x, w, rstd, plan={"stripes": 2.0})
    with pytest.raises(ValueError, match=r"^softmax_backward: argument 'plan.bogus': expected a known plan field"):
        tile.softmax_backward(x, dy, plan={"bogus": 1})


def test_eps_none_and_a_dloss_float32_cannot_hold_are_refused():
    x = x32((2, 8))
    for call in (lambda: tile.rms_norm(x, eps=None), lambda: tile.layer_norm(x, eps=None),
                 lambda: tile.fused_add_rms_norm(x, x.copy(), eps=None)):
        with pytest.raises(TypeError, match=r"argument 'eps': expected a real number \(float\), got None"):
            call()
    z = np.random.default_rng(3).standard_normal((2, 5)).astype(np.float32)
    t = np.array([0, 1])
    lse = tile.cross_entropy(z, t, return_lse=True)[1]
    for dloss in (1e39, -1e39, 1e-50, 10**400):
        with pytest.raises(ValueError, match=r"cross_entropy_backward: argument 'dloss': expected a number float32 holds"):
            tile.cross_entropy_backward(dloss, z, t, lse, reduction="sum")
    # What float32 holds is taken, rounded: the smallest subnormal, the largest finite value, inf.
    for dloss in (2.0**-149, 3.4028234663852886e38, float("inf"), 0.0):
        g = tile.cross_entropy_backward(dloss, z, t, lse, reduction="sum")
        assert g.shape == z.shape


def test_builtin_names_every_program_it_takes():
    with pytest.raises(ValueError, match=r"^builtin: argument 'name': expected one of softmax, log_softmax, rms_norm, "
                                         r"layer_norm or a training operator \(softmax_backward, .*cross_entropy.*\), "
                                         r"got 'nope'$"):
        tile.builtin("nope")
    assert tile.builtin("rms_norm_backward").name == "rms_norm_backward"
    with pytest.raises(TypeError, match=r"^layer_norm: argument 'eps': expected a real number \(float\), got None$"):
        tile.layer_norm(x32(), eps=None)
