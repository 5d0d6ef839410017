"""Float64 numpy references of the training operators (tests/python/test_training_*.py), written
from the formulas of docs/source/training.md, independently of the row programs. Each returns the
values and, per value, the magnitude its float32 rounding errors scale with (the sum of the
absolute values of the terms that make it); `assert_close` turns those into a tolerance."""
import numpy as np

# Output dtype name -> relative rounding of the stored value.
RTOL = {"float32": 2.0 ** -22, "float16": 2.0 ** -10, "bfloat16": 2.0 ** -7}
# ... and the absolute rounding of its subnormals (float16's start at 2^-14, spaced 2^-24).
FLOOR = {"float32": 2.0 ** -149, "float16": 2.0 ** -24, "bfloat16": 2.0 ** -133}
ULP32 = 2.0 ** -24


def f64(a):
    """Any array (numpy, torch on any device, bfloat16 included) as float64 numpy."""
    if hasattr(a, "detach"):
        return a.detach().double().cpu().numpy()
    return np.asarray(a, dtype=np.float64)


def dtype_name(a):
    return str(a.dtype).split(".")[-1]


def assert_close(got, want, mag, ulps=512, name=""):
    """|got - want| <= rtol(dtype) |want| + ulps 2^-24 mag + floor(dtype); NaN exactly where want is
    NaN and infinities exact."""
    rtol = RTOL[dtype_name(got)]
    g = f64(got)
    want = np.asarray(want, np.float64)
    assert g.shape == want.shape, (name, g.shape, want.shape)
    nan = np.isnan(want)
    assert (np.isnan(g) == nan).all(), f"{name}: NaN at {np.argwhere(np.isnan(g) != nan)[:5].tolist()}"
    inf = np.isinf(want)
    assert (g[inf] == want[inf]).all(), f"{name}: infinities differ at {np.argwhere(inf & (g != want))[:5].tolist()}"
    ok = nan | inf
    err = np.where(ok, 0, np.abs(g - np.where(ok, 0, want)))
    bound = rtol * np.abs(np.where(ok, 0, want)) + ulps * ULP32 * np.where(ok, 0, mag) + FLOOR[dtype_name(got)]
    worst = np.unravel_index(np.argmax(err - bound), err.shape) if err.size else ()
    assert (err <= bound).all(), f"{name} at {worst}: got {g[worst]}, want {want[worst]} (bound {bound[worst]})"


def _times(a, b):
    """a * b with 0 * inf = 0: a term that is exactly zero adds no rounding error."""
    with np.errstate(invalid="ignore"):
        return np.where((a == 0) | (b == 0), 0.0, a * b)


def softmax_backward(y, dy):
    y, dy = f64(y), f64(dy)
    s = (y * dy).sum(-1, keepdims=True)
    return y * (dy - s), np.abs(y) * (np.abs(dy) + np.abs(y * dy).sum(-1, keepdims=True))


def log_softmax_backward(y, dy):
    y, dy = f64(y), f64(dy)
    e = np.exp(y)
    return dy - e * dy.sum(-1, keepdims=True), np.abs(dy) + _times(e * np.abs(dy).sum(-1, keepdims=True), 1 + np.abs(y))


def rms_norm(x, w=None, eps=1e-6):
    """(y, rstd): x * rstd * w, rstd = 1 / sqrt(mean(x^2) + eps)."""
    x = f64(x)
    rstd = 1 / np.sqrt((x * x).mean(-1) + eps)
    return x * rstd[..., None] * (1.0 if w is None else f64(w)), rstd


def layer_norm(x, w=None, b=None, eps=1e-5):
    """(y, mean, rstd)."""
    x = f64(x)
    mean = x.mean(-1)
    rstd = 1 / np.sqrt(((x - mean[..., None]) ** 2).mean(-1) + eps)
    y = (x - mean[..., None]) * rstd[..., None] * (1.0 if w is None else f64(w)) + (0.0 if b is None else f64(b))
    return y, mean, rstd


def _sum_rows(a):
    return a.reshape(-1, a.shape[-1]).sum(0)


def rms_norm_backward(dy, x, w, rstd, dres=None):
    """((dx, mag), (dweight, mag)) from the saved rstd; dres is added to dx (the fused form)."""
    dy, x, r = f64(dy), f64(x), f64(rstd)[..., None]
    wv = 1.0 if w is None else f64(w)
    g, xhat = dy * wv, x * r
    n = x.shape[-1]
    dot, dot_abs = (g * xhat).sum(-1, keepdims=True), np.abs(g * xhat).sum(-1, keepdims=True)
    extra = 0.0 if dres is None else f64(dres)
    dx = r * (g - xhat * dot / n) + extra
    dx_mag = np.abs(r) * (np.abs(g) + np.abs(xhat) * dot_abs / n) + np.abs(extra)
    return (dx, dx_mag), (_sum_rows(dy * xhat), _sum_rows(np.abs(dy * xhat)))


def layer_norm_backward(dy, x, w, mean, rstd):
    """((dx, mag), (dweight, mag), (dbias, mag))."""
    dy, x, mu, r = f64(dy), f64(x), f64(mean)[..., None], f64(rstd)[..., None]
    wv = 1.0 if w is None else f64(w)
    g, xhat = dy * wv, (x - mu) * r
    n = x.shape[-1]
    a, b = g.sum(-1, keepdims=True), (g * xhat).sum(-1, keepdims=True)
    xerr = (np.abs(x) + np.abs(mu)) * np.abs(r)      # x - mean rounds once in float32
    dx = r * (g - (a + xhat * b) / n)
    dx_mag = np.abs(r) * (np.abs(g) + (np.abs(g).sum(-1, keepdims=True) + (np.abs(xhat) + xerr) *
                                       np.abs(g * xhat).sum(-1, keepdims=True)) / n)
    return ((dx, dx_mag), (_sum_rows(dy * xhat), _sum_rows(np.abs(dy) * (np.abs(xhat) + xerr))),
            (_sum_rows(dy), _sum_rows(np.abs(dy))))


def cross_entropy_rows(logits, target, ignore_index=-100, label_smoothing=0.0, z_loss=0.0, softcap=None,
                       saved_lse=None):
    """Per row: (loss, loss_mag, lse, grad, grad_mag), grad = d loss / d logits for a unit upstream
    gradient (from the saved lse when given). Rows flatten to (R, C)."""
    z0 = f64(logits)
    C = z0.shape[-1]
    z0 = z0.reshape(-1, C)
    t = np.asarray(f64(target), np.int64).reshape(-1)
    R = z0.shape[0]
    # The kernels read the options as float32, or as doubles in a float64 call.
    as_read = float if dtype_name(logits) == "float64" else (lambda v: float(np.float32(v)))
    ls, zl = as_read(label_smoothing), as_read(z_loss)
    if softcap is not None:
        cap = as_read(softcap)
        th = np.tanh(z0 / cap)
        z = cap * th
    else:
        z = z0
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        m = np.max(z, axis=-1)                            # NaN if any is NaN
        all_neg_inf = m == -np.inf
        shifted = np.where(all_neg_inf[:, None], np.nan, z - m[:, None])
        s = np.exp(shifted).sum(-1)
        lse = np.where(all_neg_inf, -np.inf, m + np.log(s))
        ignored = t == ignore_index
        in_range = (t >= 0) & (t < C)
        zt = z[np.arange(R), np.clip(t, 0, C - 1)]
        loss = lse - (1 - ls) * zt
        if ls > 0:
            loss = loss - ls / C * z.sum(-1)
        if zl > 0:
            loss = loss + zl * lse * lse
        mag = np.abs(lse) + np.abs(m) + np.abs(zt) + ls * np.abs(z).sum(-1) / C + 2 * zl * lse * lse + 1
        if softcap is not None:
            mag = mag + np.abs(zt) + ls * np.abs(z).sum(-1) / C
        loss = np.where(ignored, 0.0, np.where(in_range, loss, np.nan))
        mag = np.where(ignored, 0.0, mag)
        lse_used = lse if saved_lse is None else f64(saved_lse).reshape(-1)
        if saved_lse is None:
            p = np.exp(shifted) / s[:, None]
        else:
            p = np.exp(z - lse_used[:, None])
        coef = 1 + 2 * zl * lse_used
        onehot = np.arange(C)[None, :] == t[:, None]
        g = coef[:, None] * p - np.where(onehot, 1 - ls, 0.0) - ls / C
        gm = _times(((np.abs(coef) + 2 * zl * np.abs(lse_used))[:, None] * p), 2 + np.abs(z) + np.abs(lse_used)[:, None]) + 1
        if softcap is not None:
            d = 1 - th * th
            gm = gm * d + np.abs(g) * 4
            g = g * d
        g = np.where(ignored[:, None], 0.0, np.where(in_range[:, None], g, np.nan))
        gm = np.where(ignored[:, None], 0.0, gm)
    return loss, mag, lse, g, gm


def cross_entropy(logits, target, reduction="mean", **options):
    """(loss, mag) as tile.cross_entropy returns it, and the count of rows not ignored."""
    loss, mag, lse, _, _ = cross_entropy_rows(logits, target, **options)
    count = float((np.asarray(f64(target)).reshape(-1) != options.get("ignore_index", -100)).sum())
    rows = tuple(np.shape(f64(logits))[:-1])
    if reduction == "none":
        return loss.reshape(rows), mag.reshape(rows), lse.reshape(rows), count
    total, total_mag = loss.sum(), mag.sum()
    with np.errstate(invalid="ignore", divide="ignore"):
        if reduction == "mean":
            return np.float64(total / count), np.float64(total_mag / max(count, 1)), lse.reshape(rows), count
    return np.float64(total), np.float64(total_mag), lse.reshape(rows), count


def cross_entropy_grad(dloss, logits, target, reduction="mean", saved_lse=None, **options):
    """(dlogits, mag) for the upstream gradient dloss (per row for 'none', else one value; None: 1)."""
    _, _, _, g, gm = cross_entropy_rows(logits, target, saved_lse=saved_lse, **options)
    shape = np.shape(f64(logits))
    t = np.asarray(f64(target)).reshape(-1)
    if dloss is None:
        scale = np.ones(g.shape[0])
    else:
        d = f64(dloss).reshape(-1)
        scale = d if reduction == "none" else np.full(g.shape[0], d[0])
    if reduction == "mean":
        with np.errstate(divide="ignore"):
            scale = scale / (t != options.get("ignore_index", -100)).sum()
    ignored = (t == options.get("ignore_index", -100))[:, None]
    with np.errstate(invalid="ignore"):
        return (np.where(ignored, 0.0, scale[:, None] * g).reshape(shape),
                _times(np.abs(scale)[:, None], gm).reshape(shape))
