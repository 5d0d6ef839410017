"""The training operators from Python on the CPU backend (numpy arrays): each against the float64
numpy references of training_refs.py over a seeded sweep of shapes, dtypes and layouts (strided,
misaligned, more than two dimensions), special values, ignored targets and in-place forms;
finite-difference gradients of the float64 forwards against every backward; bitwise-identical
weight gradients; the errors the Python layer raises. The same on torch CUDA tensors:
test_training_cuda.py."""
import itertools

import numpy as np
import pytest
import training_refs as ref

import tile

COLS = [1, 2, 3, 7, 33, 257, 1023, 1537, 4096]
ROWS = [0, 1, 3, 17]
DTYPES = [np.float32, np.float16]
LAYOUTS = ["contiguous", "strided", "misaligned", "3d"]


def layout_of(shape, dtype, layout):
    """An empty array of `shape` (rows, cols) laid out as asked: rows padded by 5 elements,
    shifted one element off its allocation, or split into (2, rows / 2, cols)."""
    rows, cols = shape
    if layout == "strided":
        return np.full((rows, cols + 5), np.nan, dtype)[:, :cols]
    if layout == "misaligned":
        return np.full(rows * cols + 1, np.nan, dtype)[1:].reshape(rows, cols)
    if layout == "3d" and rows % 2 == 0 and rows > 0:
        return np.full((2, rows // 2, cols), np.nan, dtype)
    return np.full(shape, np.nan, dtype)


def random(shape, dtype, layout, rng, mean=0.0, scale=1.0):
    a = layout_of(shape, dtype, layout)
    a[...] = (rng.standard_normal(a.shape) * scale + mean).astype(dtype)
    return a


def cases(seed):
    """The sweep: every (rows, cols), dtypes and layouts in turn, seeded."""
    rng = np.random.default_rng(seed)
    out = []
    for k, (rows, cols) in enumerate(itertools.product(ROWS, COLS)):
        if rows == 0 and cols != 33:
            continue
        out.append((rows, cols, DTYPES[k % 2], DTYPES[(k // 2) % 2], LAYOUTS[k % 4], int(rng.integers(1 << 30))))
    return out


def rows_of(a):
    return a.reshape(-1, a.shape[-1])


# ---- the sweep ----

@pytest.mark.parametrize("log", [False, True])
def test_softmax_backward_sweep(log):
    for rows, cols, dt, out_dt, layout, seed in cases(1 + log):
        rng = np.random.default_rng(seed)
        x = random((rows, cols), np.float32, layout, rng, scale=2.0)
        y = (tile.log_softmax if log else tile.softmax)(x).astype(dt)
        dy = random((rows, cols), dt, layout, rng)
        if rows >= 3:
            y[1, 0] = -np.inf if log else 0.0
            y[2] = np.nan
        want, mag = (ref.log_softmax_backward if log else ref.softmax_backward)(y, dy)
        fn = tile.log_softmax_backward if log else tile.softmax_backward
        dx = fn(y, dy)
        assert dx.dtype == dy.dtype and dx.shape == dy.shape
        ref.assert_close(dx, want, mag, name=f"dx {rows}x{cols} {layout}")
        out = layout_of((rows, cols), out_dt, layout)
        assert fn(y, dy, out=out) is out
        ref.assert_close(out, want, mag, name=f"dx out {rows}x{cols} {layout}")


@pytest.mark.parametrize("layer", [False, True])
def test_norm_backward_sweep(layer):
    for k, (rows, cols, dt, w_dt, layout, seed) in enumerate(cases(3 + layer)):
        rng = np.random.default_rng(seed)
        x = random((rows, cols), dt, layout, rng, mean=0.5, scale=2.0)
        dy = random((rows, cols), dt, layout, rng)
        w = None if k % 5 == 3 else (rng.standard_normal(cols) * 0.5 + 1).astype(w_dt)
        b = None if k % 3 == 1 else (rng.standard_normal(cols) * 0.5).astype(w_dt)
        if layer:
            _, mean, rstd = tile.layer_norm(x, weight=w, bias=b, return_stats=True)
            dx, dw, db = tile.layer_norm_backward(dy, x, w, b, mean, rstd)
            (want, mag), (dw_want, dw_mag), (db_want, db_mag) = ref.layer_norm_backward(dy, x, w, mean, rstd)
            assert (db is None) == (b is None)
            if b is not None:
                assert db.dtype == b.dtype
                ref.assert_close(db, db_want, db_mag, ulps=512 + rows, name="dbias")
        else:
            _, rstd = tile.rms_norm(x, weight=w, return_rstd=True)
            dx, dw = tile.rms_norm_backward(dy, x, w, rstd)
            (want, mag), (dw_want, dw_mag) = ref.rms_norm_backward(dy, x, w, rstd)
        assert dx.dtype == dy.dtype and dx.shape == dy.shape
        ref.assert_close(dx, want, mag, name=f"dx {rows}x{cols} {layout}")
        assert (dw is None) == (w is None)
        if w is not None:
            assert dw.dtype == w.dtype and dw.shape == (cols,)
            ref.assert_close(dw, dw_want, dw_mag, ulps=512 + rows, name="dweight")


def test_fused_add_rms_norm_sweep():
    for k, (rows, cols, dt, res_dt, layout, seed) in enumerate(cases(5)):
        rng = np.random.default_rng(seed)
        x = random((rows, cols), dt, layout, rng)
        res = random((rows, cols), res_dt, "contiguous" if layout == "3d" else layout, rng, mean=0.3, scale=2.0)
        res = res.reshape(x.shape)
        w = None if k % 4 == 3 else (rng.standard_normal(cols) * 0.5 + 1).astype(np.float32)
        h = ref.f64(x) + ref.f64(res)
        y_want, rstd_want = ref.rms_norm(h, w)
        y_mag = np.abs(y_want) + (np.abs(ref.f64(x)) + np.abs(ref.f64(res))) * rstd_want[..., None] * (
            1.0 if w is None else np.abs(w.astype(np.float64)))
        y, r_out, rstd = tile.fused_add_rms_norm(x, res, weight=w, return_rstd=True)
        assert y.dtype == x.dtype and r_out.dtype == res.dtype and rstd.dtype == np.float32
        ref.assert_close(y, y_want, y_mag, name="y")
        ref.assert_close(r_out, h, np.abs(ref.f64(x)) + np.abs(ref.f64(res)), name="residual_out")
        ref.assert_close(rstd, rstd_want, rstd_want, name="rstd")
        # The backward, with and without the gradient of residual_out.
        dy = random((rows, cols), dt, layout, rng).reshape(x.shape)
        dres = None if k % 3 == 0 else random((rows, cols), res_dt, "contiguous", rng).reshape(x.shape)
        dx, dr, dw = tile.fused_add_rms_norm_backward(dy, dres, r_out, w, rstd)
        (want, mag), (dw_want, dw_mag) = ref.rms_norm_backward(dy, r_out, w, rstd, dres)
        assert dx.dtype == dy.dtype and dr.dtype == r_out.dtype
        ref.assert_close(dx, want, mag, name="dx")
        ref.assert_close(dr, want, mag, name="dresidual")
        if w is not None:
            ref.assert_close(dw, dw_want, dw_mag, ulps=512 + rows, name="dweight")


def ce_options(k):
    """Cross-entropy options cycled over the sweep."""
    o = {"reduction": ("none", "sum", "mean")[k % 3]}
    if k % 4 == 1:
        o["label_smoothing"] = 0.1
    if k % 5 == 2:
        o["z_loss"] = 1e-3
    if k % 6 == 3:
        o["softcap"] = 15.0
    if k % 7 == 4:
        o["ignore_index"] = 3
    return o


def ce_inputs(rows, cols, dt, layout, rng, ignore_index=-100, special=False):
    """Logits and targets with the first and last class, some ignored rows and, when asked,
    rows of special values."""
    z = random((rows, cols), dt, layout, rng, scale=3.0)
    t = rng.integers(0, cols, rows)
    if rows > 0:
        t[0] = 0
    if rows > 1:
        t[1] = cols - 1
    if rows > 4:
        t[4::5] = ignore_index
    if special and rows >= 7:
        z[2] = -np.inf                  # all -inf
        z[3, cols // 2] = np.nan        # a NaN
        z[4, ::2] = -np.inf             # some -inf, the target among them
        t[4] = 0
        z[5, -1] = np.inf               # +inf
        z[6] = np.nan                   # NaN, ignored
        t[6] = ignore_index
    return z, t.astype(np.int64 if rows % 2 else np.int32).reshape(z.shape[:-1])


def test_cross_entropy_sweep():
    for k, (rows, cols, dt, _, layout, seed) in enumerate(cases(6)):
        rng = np.random.default_rng(seed)
        o = ce_options(k)
        reduction = o.pop("reduction")
        z, t = ce_inputs(rows, cols, dt, layout, rng, o.get("ignore_index", -100), special=k % 2 == 0)
        want, mag, lse_want, _ = ref.cross_entropy(z, t, reduction, **o)
        loss, lse = tile.cross_entropy(z, t, reduction=reduction, return_lse=True, **o)
        assert loss.dtype == np.float32 and loss.shape == (z.shape[:-1] if reduction == "none" else ())
        ref.assert_close(loss, want, mag, ulps=512 + rows, name=f"loss {reduction} {rows}x{cols} {o}")
        ref.assert_close(lse, lse_want, np.abs(lse_want) + 1, name="lse")
        # The backward from the saved lse, then the fused form in place.
        dloss = (rng.standard_normal(z.shape[:-1]) if reduction == "none" else rng.standard_normal(())).astype(np.float32)
        g_want, g_mag = ref.cross_entropy_grad(dloss, z, t, reduction, saved_lse=lse, **o)
        g = tile.cross_entropy_backward(dloss, z, t, lse, reduction=reduction, **o)
        assert g.dtype == z.dtype and g.shape == z.shape
        ref.assert_close(g, g_want, g_mag, name=f"dlogits {reduction} {o}")
        f_want, f_mag = ref.cross_entropy_grad(dloss, z, t, reduction, **o)
        zc = z.copy()
        fused = tile.cross_entropy_fused(zc, t, reduction=reduction, dloss=dloss, **o)
        ref.assert_close(fused, want, mag, ulps=512 + rows, name=f"fused loss {reduction} {o}")
        ref.assert_close(zc, f_want, f_mag, name=f"fused dlogits {reduction} {o}")


# ---- finite differences ----

def numeric_gradient(f, x):
    x = np.array(x, np.float64)
    g = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        v = x[i]
        h = 1e-6 * max(1.0, abs(v))
        x[i] = v + h
        up = f(x)
        x[i] = v - h
        down = f(x)
        x[i] = v
        g[i] = (up - down) / (2 * h)
    return g


def assert_gradient(got, numeric, rtol=2e-5, terms=0.0):
    got = np.asarray(got, np.float64)
    scale = max(np.abs(numeric).max(initial=0), terms)
    np.testing.assert_allclose(got, numeric, rtol=rtol, atol=rtol * scale)


def fp32(shape, rng, mean=0.0, scale=1.0):
    return (rng.standard_normal(shape) * scale + mean).astype(np.float32)


@pytest.mark.parametrize("cols", [1, 7, 33])
def test_gradients_of_softmax_and_norms(cols):
    rng = np.random.default_rng(cols)
    x, dy = fp32((3, cols), rng, scale=2.0), fp32((3, cols), rng)
    w, b = fp32(cols, rng, 1.0, 0.5), fp32(cols, rng, 0.0, 0.5)
    for log in (False, True):
        def f(v, log=log):
            e = np.exp(v - v.max(-1, keepdims=True))
            s = e.sum(-1, keepdims=True)
            return (dy * (np.log(e / s) if log else e / s)).sum()
        y = (tile.log_softmax if log else tile.softmax)(x)
        assert_gradient((tile.log_softmax_backward if log else tile.softmax_backward)(y, dy), numeric_gradient(f, x))
    # dx is rstd times a difference of terms of the size of dy * weight (of nearly equal terms
    # for one column, where the row's norm hardly depends on x).
    _, rstd = tile.rms_norm(x, weight=w, return_rstd=True)
    dx, dw = tile.rms_norm_backward(dy, x, w, rstd)
    terms = float(np.abs(dy * w).max() * rstd.max())
    assert_gradient(dx, numeric_gradient(lambda v: (dy * ref.rms_norm(v, w)[0]).sum(), x), terms=terms)
    assert_gradient(dw, numeric_gradient(lambda v: (dy * ref.rms_norm(x, v)[0]).sum(), w))
    # LayerNorm on rows of mean 0.25 (to within rounding): the saved float32 mean then errs by
    # far less than the rows' spread.
    xl = x.astype(np.float64)
    if cols > 1:
        xl[:, -1] = -xl[:, :-1].sum(-1)
    xl = (xl + 0.25).astype(np.float32)
    _, mean, rstd = tile.layer_norm(xl, weight=w, bias=b, return_stats=True)
    dx, dw, db = tile.layer_norm_backward(dy, xl, w, b, mean, rstd)
    terms = float(np.abs(dy * w).max() * rstd.max())
    assert_gradient(dx, numeric_gradient(lambda v: (dy * ref.layer_norm(v, w, b)[0]).sum(), xl), terms=terms)
    assert_gradient(dw, numeric_gradient(lambda v: (dy * ref.layer_norm(xl, v, b)[0]).sum(), w))
    assert_gradient(db, numeric_gradient(lambda v: (dy * ref.layer_norm(xl, w, v)[0]).sum(), b))


def test_gradients_of_fused_add_rms_norm():
    rng = np.random.default_rng(7)
    x, res, w = fp32((3, 9), rng), fp32((3, 9), rng, 0.2), fp32(9, rng, 1.0, 0.5)
    dy, dres = fp32((3, 9), rng), fp32((3, 9), rng)

    def f(xv, rv, wv):
        h = xv + rv
        return (dy * ref.rms_norm(h, wv)[0]).sum() + (dres * h).sum()

    _, r_out, rstd = tile.fused_add_rms_norm(x, res, weight=w, return_rstd=True)
    dx, dr, dw = tile.fused_add_rms_norm_backward(dy, dres, r_out, w, rstd)
    assert_gradient(dx, numeric_gradient(lambda v: f(v, res, w), x))
    assert_gradient(dr, numeric_gradient(lambda v: f(x, v, w), res))
    assert_gradient(dw, numeric_gradient(lambda v: f(x, res, v), w))


@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize("options", [{}, {"label_smoothing": 0.15}, {"z_loss": 0.02, "label_smoothing": 0.1},
                                     {"softcap": 2.5, "z_loss": 0.01}, {"ignore_index": 2}])
def test_gradients_of_cross_entropy(reduction, options):
    rng = np.random.default_rng(11)
    z = fp32((5, 9), rng, scale=2.0)
    t = np.array([0, 8, options.get("ignore_index", -100), 4, 2], np.int64)
    dloss = fp32((5,) if reduction == "none" else (), rng, 0.5)

    def f(v):
        loss, _, _, _ = ref.cross_entropy(v, t, reduction, **options)
        return float((dloss * loss).sum())

    numeric = numeric_gradient(f, z)
    _, lse = tile.cross_entropy(z, t, reduction=reduction, return_lse=True, **options)
    assert_gradient(tile.cross_entropy_backward(dloss, z, t, lse, reduction=reduction, **options), numeric)
    zc = z.copy()
    tile.cross_entropy_fused(zc, t, reduction=reduction, dloss=dloss, **options)
    assert_gradient(zc, numeric)
    want, _ = ref.cross_entropy_grad(dloss, z, t, reduction, **options)
    assert_gradient(want, numeric, rtol=1e-6)


# ---- special rules ----

def test_in_place_forms():
    rng = np.random.default_rng(3)
    x, res, w = fp32((4, 64), rng), fp32((4, 64), rng), fp32(64, rng, 1.0, 0.5)
    x0, res0 = x.copy(), res.copy()
    y, r_out = tile.fused_add_rms_norm(x, res, weight=w, in_place=True)
    assert y is x and r_out is res
    np.testing.assert_array_equal(res, x0 + res0)
    want, _ = ref.rms_norm(x0.astype(np.float64) + res0, w)
    np.testing.assert_allclose(x, want, rtol=1e-5, atol=1e-5)
    # An fp32 residual stream with 16-bit x.
    xh, resf = x0.astype(np.float16), res0.copy()
    y, r_out = tile.fused_add_rms_norm(xh, resf, in_place=True)
    assert y is xh and r_out is resf and resf.dtype == np.float32
    np.testing.assert_array_equal(resf, x0.astype(np.float16).astype(np.float32) + res0)
    # dx over dy.
    yv, dy = tile.softmax(x0), fp32((4, 64), rng)
    want, _ = ref.softmax_backward(yv, dy)
    assert tile.softmax_backward(yv, dy, out=dy) is dy
    np.testing.assert_allclose(dy, want, rtol=1e-5, atol=1e-6)
    # cross_entropy_fused writes the gradient over the logits unless given out.
    z, t = fp32((4, 64), rng), np.array([0, 63, -100, 5])
    z0 = z.copy()
    g = np.empty_like(z)
    loss = tile.cross_entropy_fused(z, t, out=g)
    np.testing.assert_array_equal(z, z0)
    assert loss == tile.cross_entropy_fused(z, t)
    np.testing.assert_array_equal(z, g)
    assert (z[2] == 0).all()


def test_weight_gradients_are_bitwise_identical_from_run_to_run():
    rng = np.random.default_rng(4)
    x, dy, w = fp32((300, 515), rng), fp32((300, 515), rng), fp32(515, rng, 1.0, 0.5)
    _, mean, rstd = tile.layer_norm(x, weight=w, return_stats=True)
    first = tile.layer_norm_backward(dy, x, w, w, mean, rstd)
    for _ in range(3):
        again = tile.layer_norm_backward(dy, x, w, w, mean, rstd)
        for a, b in zip(first[1:], again[1:]):
            assert a.tobytes() == b.tobytes()
    z, t = fp32((300, 97), rng), rng.integers(0, 97, 300)
    assert tile.cross_entropy(z, t).tobytes() == tile.cross_entropy(z, t).tobytes()


def test_cross_entropy_special_cases():
    z = np.zeros((3, 4), np.float32)
    # Every row ignored: the mean is 0 / 0 (NaN, as torch), the sum 0, the gradient 0.
    t = np.full(3, -100)
    assert np.isnan(tile.cross_entropy(z, t))
    assert tile.cross_entropy(z, t, reduction="sum") == 0
    zc = z.copy()
    assert np.isnan(tile.cross_entropy_fused(zc, t))
    assert (zc == 0).all()
    # No rows at all.
    empty = np.zeros((0, 4), np.float32)
    assert np.isnan(tile.cross_entropy(empty, np.zeros(0, np.int64)))
    assert tile.cross_entropy(empty, np.zeros(0, np.int64), reduction="none").shape == (0,)
    # A uniform row: the loss is log(C) whichever the target, smoothed or not.
    np.testing.assert_allclose(tile.cross_entropy(z, np.array([0, 3, 1]), reduction="none"), np.log(4), rtol=1e-6)
    np.testing.assert_allclose(tile.cross_entropy(z, np.array([0, 3, 1]), label_smoothing=0.3), np.log(4), rtol=1e-6)
    # torch.nn.functional.cross_entropy([[0, 1, 2]], [2], label_smoothing=0.2) = 0.6076059...
    np.testing.assert_allclose(tile.cross_entropy(np.array([[0, 1, 2]], np.float32), np.array([2]), label_smoothing=0.2),
                               0.6076059, rtol=1e-6)
    # A torch CPU-style int32 target, and multi-dimensional rows.
    z3 = np.arange(24, dtype=np.float32).reshape(2, 3, 4) / 7
    t3 = np.array([[0, 1, 2], [3, -100, 0]], np.int32)
    loss = tile.cross_entropy(z3, t3, reduction="none")
    assert loss.shape == (2, 3) and loss[1, 1] == 0


def test_introspection_of_the_training_programs():
    names = tile.training_programs()
    assert "rms_norm_backward" in names and "cross_entropy_fused" in names
    p = tile.builtin("rms_norm_backward")
    assert [o.name for o in p.operands] == ["dy", "x", "weight", "rstd", "dx", "dweight"]
    rng = np.random.default_rng(5)
    x, dy = fp32((8, 256), rng), fp32((8, 256), rng)
    plan = p.plan(dy=dy, x=x, rstd=np.ones(8, np.float32), dweight=np.empty(256, np.float32))
    assert plan["grid_limit"] > 0                                  # a reduction over the rows
    assert "tile_workspace" in p.ir(dy=dy, x=x, rstd=np.ones(8, np.float32), dweight=np.empty(256, np.float32))
    with pytest.raises(ValueError, match="cannot be changed"):
        p.row_in("z")


# ---- errors ----

def test_errors_name_the_operator_and_the_argument():
    z, t = np.zeros((3, 5), np.float32), np.array([0, 1, 7])
    with pytest.raises(ValueError, match=r"cross_entropy: argument 'target': expected class indices in \[0, 5\) or "
                                         r"ignore_index \(-100\), got 7 at row 2"):
        tile.cross_entropy(z, t)
    t[2] = -3
    with pytest.raises(ValueError, match="got -3 at row 2"):
        tile.cross_entropy_fused(z, t)
    t[2] = 4
    with pytest.raises(ValueError, match="cross_entropy: argument 'reduction': expected one of 'none', 'sum', 'mean', "
                                         "got 'avg'"):
        tile.cross_entropy(z, t, reduction="avg")
    with pytest.raises(ValueError, match="argument 'softcap': expected a finite value > 0, or None, got 0"):
        tile.cross_entropy(z, t, softcap=0)
    with pytest.raises(ValueError, match=r"argument 'label_smoothing': expected a value in \[0, 1\], got 1.5"):
        tile.cross_entropy(z, t, label_smoothing=1.5)
    with pytest.raises(TypeError, match="argument 'ignore_index': expected an integer"):
        tile.cross_entropy(z, t, ignore_index=1.5)
    # Exactly: 2^53 + 1 would reach the kernel as 2^53 and leave its rows unignored (NaN losses).
    for big in (2**53 + 1, -(2**53) - 1, 2**70):
        t[1] = big if abs(big) < 2**63 else 1
        with pytest.raises(ValueError, match=f"cross_entropy: argument 'ignore_index': expected an integer of "
                                             f"magnitude at most 2\\^53, got {big}"):
            tile.cross_entropy(z, t, ignore_index=big)
    t[1] = 2**53
    assert tile.cross_entropy(z, t, ignore_index=2**53, reduction="none")[1] == 0
    t[1] = 1
    with pytest.raises(ValueError, match="cross_entropy: argument 'target': expected dtype int32 or int64"):
        tile.cross_entropy(z, t.astype(np.float32))
    with pytest.raises(ValueError, match="argument 'dloss': expected one value"):
        tile.cross_entropy_backward(np.ones(3, np.float32), z, t, np.zeros(3, np.float32))
    for reduction in ("mean", "none"):
        for dloss in (None, True):
            with pytest.raises(TypeError, match=f"cross_entropy_backward: argument 'dloss': expected a number or an "
                                                f"array, got {type(dloss).__name__} {dloss!r}"):
                tile.cross_entropy_backward(dloss, z, t, np.zeros(3, np.float32), reduction=reduction)
    with pytest.raises(ValueError, match="cross_entropy_backward: argument 'lse': expected shape"):
        tile.cross_entropy_backward(1.0, z, t, np.zeros(4, np.float32))
    x = np.zeros((3, 5), np.float32)
    with pytest.raises(ValueError, match="rms_norm_backward: argument 'rstd': expected dtype float32"):
        tile.rms_norm_backward(x, x, None, np.zeros(3, np.float16))
    with pytest.raises(ValueError, match="softmax_backward: argument 'dy': expected shape"):
        tile.softmax_backward(x, np.zeros((3, 4), np.float32))
    # In place with one array as both x and residual: y would overwrite the residual it reads.
    with pytest.raises(ValueError, match="fused_add_rms_norm: argument 'y': expected memory that does not overlap "
                                         "residual, got an overlapping view"):
        tile.fused_add_rms_norm(x, x, in_place=True)
