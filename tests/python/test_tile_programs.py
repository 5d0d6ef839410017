"""Row programs written in Python (tile.RowProgram), on the CPU backend with numpy arrays: each result
against an independent float64 numpy computation and against the program's own float64 reference
(program.reference). The same programs on torch CUDA tensors: test_tile_programs_cuda.py."""
import numpy as np
import pytest
from programs import (f32, logsumexp, logsumexp_ref, rms_norm_gemma, rms_norm_gemma_ref, softmax_temperature_mask,
                      softmax_temperature_mask_ref, weight_gradient, weight_gradient_ref)

import tile

# Requests covering the mapping families on small rows: the analytic plan, packed programs, a
# re-read row, wider programs with unrolled stripes.
PLANS = [None, {"programs_per_group": 2}, {"caching": "reread"},
         {"workers_per_program": 64, "stripe_unroll": 2, "caching": "reread"}, {"vector_elems": 1}]
# Output dtype -> rtol, and atol relative to the magnitude of the row (or of the terms summed).
TOLERANCE = {np.float32: (2e-5, 2e-6), np.float16: (2e-3, 1e-3)}


def make(shape, dtype=np.float32, seed=0, scale=2.0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(dtype)


def poisoned(shape, dtype=np.float32):
    return np.full(shape, np.nan, dtype)


def assert_close(got, want, scale, dtype=None):
    """|got - want| <= rtol |want| + atol scale, NaN exactly where want is NaN."""
    rtol, atol = TOLERANCE[np.dtype(dtype or got.dtype).type]
    got = np.asarray(got, np.float64)
    assert got.shape == want.shape, (got.shape, want.shape)
    nan = np.isnan(want)
    assert (np.isnan(got) == nan).all(), f"NaN at {np.argwhere(np.isnan(got) != nan)[:5].tolist()}"
    err = np.where(nan, 0, np.abs(got - want))
    bound = rtol * np.abs(np.where(nan, 0, want)) + atol * scale
    worst = np.unravel_index(np.argmax(err - bound), err.shape)
    assert (err <= bound).all(), f"at {worst}: got {got[worst]}, want {want[worst]} (bound {bound[worst]})"


def row_scale(want):
    finite = np.where(np.isfinite(want), np.abs(want), 0)
    return finite.max(axis=-1, keepdims=True)


def assert_reference_agrees(program, want, **operands):
    """program.reference, the library's float64 evaluation, against the independent one."""
    ref = program.reference(**operands)
    for name, w in want.items():
        scale = np.abs(np.where(np.isfinite(w), w, 0)).max() + 1e-300
        np.testing.assert_allclose(ref[name], w, rtol=1e-12, atol=1e-12 * scale, equal_nan=True, err_msg=name)
    return ref


# ---- tests ----

@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("shape", [(6, 100), (2, 3, 37), (1, 512)])
def test_softmax_with_temperature_and_mask(dtype, shape):
    p = softmax_temperature_mask()
    x = make(shape, dtype)
    mask = np.where(np.random.default_rng(1).random(shape) < 0.25, -np.inf, 0.0).astype(dtype)
    mask[..., 0] = 0                                     # every row keeps one column
    want = softmax_temperature_mask_ref(x, mask, 0.7)
    assert_reference_agrees(p, {"y": want}, x=x, mask=mask, t=0.7)
    for plan in PLANS:
        y = poisoned(shape, dtype)
        assert p(x=x, mask=mask, t=0.7, y=y, plan=plan) is y
        assert_close(y, want, row_scale(want))
        assert p.check(x=x, mask=mask, t=0.7, y=y)["ok"]
    y = p(x=x, mask=mask)                                # t defaults to 1; y allocated like x
    assert isinstance(y, np.ndarray) and y.dtype == dtype and y.shape == shape
    assert_close(y, softmax_temperature_mask_ref(x, mask, 1.0), 1.0)


def test_softmax_fully_masked_row_is_nan_and_in_place_works():
    p = softmax_temperature_mask()
    x = make((4, 50))
    mask = np.zeros((4, 50), np.float32)
    mask[2] = -np.inf                                    # as torch: an all -inf row gives NaN
    want = softmax_temperature_mask_ref(x, mask, 2.0)
    assert np.isnan(want[2]).all()
    before = x.copy()
    assert p(x=x, mask=mask, t=2.0, y=x) is x            # y may alias x
    assert_close(x, want, 1.0)
    assert_reference_agrees(p, {"y": want}, x=before, mask=mask, t=2.0)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_rms_norm_gemma_writes_float32(dtype):
    p = rms_norm_gemma()
    x = make((3, 4, 96), dtype)[:, :, :80]               # strided rows, no copy
    w = make(80, np.float32, seed=1, scale=0.5)
    want = rms_norm_gemma_ref(x, w)
    assert_reference_agrees(p, {"y": want}, x=x, weight=w)
    for plan in PLANS:
        y = poisoned((3, 4, 80))
        p(x=x, weight=w, y=y, plan=plan)
        assert_close(y, want, row_scale(want), np.float32)
        assert p.check(x=x, weight=w, y=y)["ok"]
    y = p(x=x, weight=w, eps=1e-3)
    assert y.dtype == np.float32 and y.shape == (3, 4, 80)  # the declared dtype, not x's
    assert_close(y, rms_norm_gemma_ref(x, w, 1e-3), row_scale(want))


@pytest.mark.parametrize("shape", [(7, 64), (2, 3, 50), (300,), (3, 1000)])
def test_logsumexp_per_row(shape):
    p = logsumexp()
    x = make(shape, scale=5.0)
    want = logsumexp_ref(x)
    assert_reference_agrees(p, {"lse": want}, x=x)
    for plan in PLANS:
        lse = poisoned(shape[:-1])
        assert p(x=x, lse=lse, plan=plan) is lse
        assert_close(lse, want, np.abs(want).max(initial=0) + x.max())
    lse = p(x=x)
    assert lse.shape == shape[:-1] and lse.dtype == np.float32


def test_logsumexp_writes_a_strided_per_row_output():
    p = logsumexp()
    x = make((3, 5, 40))
    wide = np.full((3, 5, 2), -7.0, np.float32)
    lse = wide[:, :, 0]                                  # per-row values two floats apart
    assert p(x=x, lse=lse) is lse
    assert_close(wide[:, :, 0], logsumexp_ref(x), 10.0)
    assert (wide[:, :, 1] == -7.0).all(), "the gaps of the per-row output were written"


@pytest.mark.parametrize("rows", [1, 37, 130])
def test_weight_gradient_sums_over_rows(rows):
    p = weight_gradient()
    x, dy = make((rows, 48)), make((rows, 48), seed=1)
    dw_want, db_want, dw_mag, db_mag = weight_gradient_ref(x, dy)
    assert_reference_agrees(p, {"dweight": dw_want, "dbias": db_want}, x=x, dy=dy)
    for plan in PLANS:
        dw, db = poisoned(48), poisoned(48)
        got = p(x=x, dy=dy, dweight=dw, dbias=db, plan=plan)
        assert got[0] is dw and got[1] is db
        assert_close(dw, dw_want, dw_mag)
        assert_close(db, db_want, db_mag)
        assert p.check(x=x, dy=dy, dweight=dw, dbias=db)["ok"]
    dw = p(x=x, dy=dy, dbias=None)                       # an optional output left out
    assert dw.shape == (48,) and dw.dtype == np.float32
    assert_close(dw, dw_want, dw_mag)


def test_weight_gradient_over_3d_rows_of_half_inputs():
    p = weight_gradient()
    x, dy = make((2, 5, 33), np.float16), make((2, 5, 33), np.float16, seed=1)
    dw, db = p(x=x, dy=dy)
    dw_want, db_want, dw_mag, db_mag = weight_gradient_ref(x, dy)
    assert_close(dw, dw_want, dw_mag, np.float32)
    assert_close(db, db_want, db_mag, np.float32)


def test_integer_scalars_travel_exactly_or_are_refused():
    # An i64 scalar reaches the kernel as a double: exact up to 2^53, refused past it (2^53 + 1
    # would arrive as 2^53).
    p = tile.RowProgram("pick_column")
    x, k, y = p.row_in("x"), p.scalar_in("k", "i64"), p.row_out("y")
    p.store(y, p.select(tile.eq(p.col_index(), p.load(k)), p.load(x), 0.0))
    x_ = make((2, 6))
    y_ = p(x=x_, k=4)
    assert (y_[:, 4] == x_[:, 4]).all() and (np.delete(y_, 4, axis=1) == 0).all()
    assert (p(x=x_, k=2**53) == 0).all()
    for big in (2**53 + 1, -(2**53) - 1, 2**64):
        with pytest.raises(ValueError, match=rf"pick_column: argument 'k': expected an integer of magnitude at most "
                                             rf"2\^53, got {big}"):
            p(x=x_, k=big)


def test_integer_outputs_keep_the_low_32_bits_and_integer_division_is_refused():
    p = tile.RowProgram("twice")
    x, y = p.row_in("x", dtypes="i32"), p.row_out("y", dtypes="i32")
    p.store(y, p.load(x) * 2)
    v = np.array([[2**30, -2**31, 5]], np.int32)
    out = p(x=v)
    assert out.tolist() == [[-2**31, 0, 10]]                     # the conversion's wrap, as torch's
    assert p.reference(x=v)["y"].tolist() == [[-2**31, 0, 10]]
    assert p.check(x=v, y=out)["ok"]
    with pytest.raises(ValueError, match="row program 'twice': div of i64 values: integer division is not defined"):
        p.load(x) / 2
    for big in (2**53 + 1, -(2**63), 2**63):
        with pytest.raises(ValueError, match=f"row program 'twice': integer constant {big} is not exactly representable"):
            p.integer(big)
    with pytest.raises(TypeError, match="row program 'twice': integer constant: expected an integer, got float 1.5"):
        p.integer(1.5)


def test_declarations_refuse_what_no_call_could_use():
    p = tile.RowProgram("decl")
    for default in (2.5, 2**53 + 1, 2**60):
        with pytest.raises(ValueError, match=f"row program 'decl': scalar 'k': default .*expected an integer of magnitude"):
            p.scalar_in("k", "i64", default=default)
    q = tile.RowProgram("all_optional")
    x, y = q.row_in("x", optional=True), q.row_out("y", optional=True)
    q.store(y, q.load_or(x, 1.0) * 2)
    with pytest.raises(ValueError, match="row program 'all_optional': expected at least one row input or output operand "
                                         "that is not optional"):
        q(y=np.zeros((2, 3), np.float32))


def test_scaled_sum_squares_pairs_take_ldexp():
    # The rms from the (exponent, scaled sum) pair, exact at any magnitude: 1e30 squares overflow
    # float32, the pair does not.
    p = tile.RowProgram("rms")
    x, out = p.row_in("x"), p.row_scalar_out("rms")
    k, s = p.reduce2(tile.Axis.cols, tile.monoid.scaled_sum_squares(), p.load(x))
    p.store(out, tile.ldexp(tile.sqrt(s / p.cols()), k))
    x_ = make((4, 300)) * np.float32(1e30)
    want = np.sqrt((x_.astype(np.float64) ** 2).mean(axis=1))
    got = p(x=x_)
    assert np.allclose(got, want, rtol=1e-5) and p.check(x=x_, rms=got)["ok"]
    assert (tile.exponent(p.load(x)).type, tile.ldexp(p.load(x), 2.0).type) == ("f32", "f32")


def test_check_finds_a_wrong_output():
    p = logsumexp()
    x = make((5, 30))
    lse = p(x=x)
    assert p.check(x=x, lse=lse)["ok"]
    lse[3] += 1e-2
    result = p.check(x=x, lse=lse)
    assert not result["ok"] and result["mismatches"] == 1 and result["first_mismatch"].startswith("lse[3]: got")


def test_introspection_like_the_builtins():
    p = softmax_temperature_mask()
    x, mask = make((4, 300)), np.zeros((4, 300), np.float32)
    request = {"programs_per_group": 2, "workers_per_program": 64}
    plan = p.plan(x=x, mask=mask, plan=request)
    assert plan["programs_per_group"] == 2 and plan["workers_per_program"] == 64
    record = p.run(x=x, mask=mask, t=0.5, plan=request)
    assert record["plan"] == plan and record["backend"] == "cpu" and record["groups"] == 2
    assert_close(record["outputs"]["y"], softmax_temperature_mask_ref(x, mask, 0.5), 1.0)
    assert p.plan(x=x, mask=mask, plan=plan) == plan     # a printed plan given back
    source = p.source(x=x, mask=mask, plan=plan)
    assert record["kernel_name"] in source and "__global__" in source
    assert record["kernel_name"] in p.ir(x=x, mask=mask, plan=plan)
    text = str(p)
    assert text.startswith("row_program softmax_temperature_mask {") and "reduce_cols online_softmax" in text
    assert [o.name for o in p.operands] == ["x", "mask", "t", "y"]
    assert p.operand("y").role == "row_out" and p.operand("t").doc == "temperature"
    assert repr(p) == "<tile.RowProgram 'softmax_temperature_mask' (x, mask, t, y)>"


def test_builtins_are_programs():
    x = make((5, 70))
    w = make(70, seed=1)
    sm = tile.builtin("softmax")
    assert sm is tile.builtin("softmax") and str(sm).startswith("row_program softmax {")
    assert np.array_equal(sm(x=x), tile.softmax(x))
    y, rstd = tile.builtin("rms_norm")(x=x, weight=w)    # every output, the optional rstd too
    y2, rstd2 = tile.rms_norm(x, weight=w, return_rstd=True)
    assert np.array_equal(y, y2) and np.array_equal(rstd, rstd2)
    assert tile.builtin("rms_norm").plan(x=x, weight=w) == tile.plan("rms_norm", x, weight=w)
    ref = tile.builtin("layer_norm").reference(x=x, weight=w)
    xd = x.astype(np.float64)
    mean, var = xd.mean(-1), xd.var(-1)
    np.testing.assert_allclose(ref["mean"], mean, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(ref["rstd"], 1 / np.sqrt(var + f32(1e-5)), rtol=1e-12)
    with pytest.raises(ValueError, match=r"row program 'softmax': a built-in program cannot be changed"):
        sm.row_in("z")


@pytest.mark.parametrize("shape", [(6, 90), (2, 3, 40)])
def test_norm_statistics(shape):
    x = make(shape, scale=3.0)
    w = make(shape[-1], seed=1)
    xd = x.astype(np.float64)
    rstd_want = 1 / np.sqrt((xd * xd).mean(-1) + f32(1e-6))
    y, rstd = tile.rms_norm(x, weight=w, return_rstd=True)
    assert rstd.shape == shape[:-1] and rstd.dtype == np.float32
    assert_close(rstd, rstd_want, 0)
    assert_close(y, xd * rstd_want[..., None] * w, row_scale(xd * rstd_want[..., None] * w))
    y, mean, rstd = tile.layer_norm(x.astype(np.float16), return_stats=True, eps=1e-3)
    xh = x.astype(np.float16).astype(np.float64)
    mean_want, rstd_want = xh.mean(-1), 1 / np.sqrt(xh.var(-1) + f32(1e-3))
    assert y.dtype == np.float16 and mean.dtype == np.float32 and rstd.shape == shape[:-1]
    assert_close(mean, mean_want, np.abs(xh).max(-1))
    assert_close(rstd, rstd_want, 0)
    y_want = (xh - mean_want[..., None]) * rstd_want[..., None]
    assert_close(y, y_want, row_scale(y_want))


def test_integer_target_and_column_index():
    # Cross-entropy's target logit: select(col_index == target, x, 0) summed over the row.
    p = tile.RowProgram("target_logit")
    x, target = p.row_in("x"), p.row_scalar_in("target", ["int32", np.int64])
    out = p.row_scalar_out("logit", optional=False)
    v = p.load(x)
    p.store(out, p.reduce1(tile.Axis.cols, tile.monoid.sum(), p.select(tile.eq(p.col_index(), p.load(target)), v, 0)))
    x_ = make((4, 3, 25))
    t = np.random.default_rng(2).integers(0, 25, (4, 3))
    got = p(x=x_, target=t)
    assert np.array_equal(got, np.take_along_axis(x_, t[..., None], -1)[..., 0])


def test_expression_operators():
    p = tile.RowProgram("ops")
    x, y = p.row_in("x"), p.row_out("y")
    v = p.load(x)
    pos = v > 0
    both = (v >= -1) & (v < 1)
    r = p.select(pos | ~both, tile.maximum(v, 0.5) - 1 / (2 + tile.abs(v)), -tile.minimum(v, 0))
    r = r * 3 - tile.tanh(v) + tile.sqrt(tile.abs(v)) * tile.rsqrt(1 + v * v) + tile.exp(-tile.abs(v)) - tile.log(2.0 + v * v)
    r = r + tile.to_f32(p.col_index()) / p.cols()
    p.store(y, r)
    xs = make((3, 20))
    v = xs.astype(np.float64)
    pos, both = v > 0, (v >= -1) & (v < 1)
    want = np.where(pos | ~both, np.maximum(v, 0.5) - 1 / (2 + np.abs(v)), -np.minimum(v, 0))
    want = want * 3 - np.tanh(v) + np.sqrt(np.abs(v)) / np.sqrt(1 + v * v) + np.exp(-np.abs(v)) - np.log(2 + v * v)
    want = want + np.arange(20) / 20
    assert_close(p(x=xs), want, row_scale(want))
    e = p.load(x)
    assert e.type == "f32" and e.shape == "element" and (e > 0).type == "b1"
    assert p.col_index().type == "i64" and p.cols().shape == "uniform"
    assert "of row program 'ops'" in repr(e)


def test_scalar_output_sums_over_rows_and_columns():
    # A sum of squares over the whole call: per-row sums, then one sum over the rows.
    p = tile.RowProgram("sum_squares")
    x, total = p.row_in("x"), p.scalar_out("total")
    v = p.load(x)
    p.store(total, p.reduce1(tile.Axis.rows, tile.monoid.sum(), p.reduce1(tile.Axis.cols, tile.monoid.sum(), v * v)))
    x_ = make((3, 7, 45))
    want = (x_.astype(np.float64) ** 2).sum()
    for plan in PLANS:
        out = poisoned(1)
        assert p(x=x_, total=out, plan=plan) is out
        assert_close(out, np.array([want]), want)
    allocated = p(x=x_)
    assert allocated.shape == (1,) and allocated.dtype == np.float32
    held = poisoned(())                                  # any array of one element
    p(x=x_, total=held)
    assert_close(held, np.array(want), want)
    ref = p.reference(x=x_)["total"]
    assert ref.shape == (1,) and abs(ref[0] - want) <= 1e-12 * want
    assert p.check(x=x_, total=held)["ok"]
    with pytest.raises(ValueError, match=r"sum_squares: argument 'total': expected an array of one element, "
                                         r"got shape \(2,\)"):
        p(x=x_, total=np.zeros(2, np.float32))
