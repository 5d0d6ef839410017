"""The four row programs of the Python tests (test_tile_programs.py on the CPU backend,
test_tile_programs_cuda.py on torch CUDA tensors), each with an independent float64 numpy
computation of what it means."""
import numpy as np

import tile


def f32(v):
    """A scalar as the kernel reads it: rounded to float32."""
    return float(np.float32(v))


def softmax_temperature_mask():
    """softmax(x / t + mask) over each row; mask is an additive row (0 or -inf)."""
    p = tile.RowProgram("softmax_temperature_mask")
    x, mask = p.row_in("x", doc="logits"), p.row_in("mask", doc="additive mask")
    t = p.scalar_in("t", default=1.0, doc="temperature")
    p.scalar_range(t, 1e-3, 1e3)
    y = p.row_out("y", may_alias=x)
    v = p.load(x) / p.load(t) + p.load(mask)
    m, s = p.reduce2(tile.Axis.cols, tile.monoid.online_softmax(), v)
    p.store(y, tile.exp(v - m) / s)
    return p


def softmax_temperature_mask_ref(x, mask, t):
    z = x.astype(np.float64) / f32(t) + mask.astype(np.float64)
    with np.errstate(invalid="ignore"):
        e = np.exp(z - z.max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)


def rms_norm_gemma():
    """Gemma's RMSNorm: x * rsqrt(mean(x^2) + eps) * (1 + weight), written in float32 whatever x is."""
    p = tile.RowProgram("rms_norm_gemma")
    x, w = p.row_in("x"), p.col_in("weight")
    eps = p.scalar_in("eps", default=1e-6)
    y = p.row_out("y", dtypes="f32")
    v = p.load(x)
    ms = p.reduce1(tile.Axis.cols, tile.monoid.sum(), v * v) / p.cols()
    p.store(y, v * tile.rsqrt(ms + p.load(eps)) * (1 + p.load(w)))
    return p


def rms_norm_gemma_ref(x, w, eps=1e-6):
    x = x.astype(np.float64)
    return x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + f32(eps)) * (1 + w.astype(np.float64))


def logsumexp():
    """log(sum(exp(x))) of each row, as one float32 value per row."""
    p = tile.RowProgram("logsumexp")
    x, lse = p.row_in("x"), p.row_scalar_out("lse")
    m, s = p.reduce2(tile.Axis.cols, tile.monoid.online_softmax(), p.load(x))
    p.store(lse, m + tile.log(s))
    return p


def logsumexp_ref(x):
    x = x.astype(np.float64)
    m = x.max(axis=-1)
    return m + np.log(np.exp(x - m[..., None]).sum(axis=-1))


def weight_gradient():
    """The gradients of y = x * weight + bias: dweight = sum over rows of x * dy, dbias = sum of dy."""
    p = tile.RowProgram("weight_gradient")
    x, dy = p.row_in("x"), p.row_in("dy")
    dw, db = p.col_out("dweight", dtypes="f32"), p.col_out("dbias", dtypes="f32", optional=True)
    p.store(dw, p.reduce1(tile.Axis.rows, tile.monoid.sum(), p.load(x) * p.load(dy)))
    p.store(db, p.reduce1(tile.Axis.rows, tile.monoid.sum(), p.load(dy)))
    return p


def weight_gradient_ref(x, dy):
    x, dy = x.astype(np.float64).reshape(-1, x.shape[-1]), dy.astype(np.float64).reshape(-1, dy.shape[-1])
    return (x * dy).sum(axis=0), dy.sum(axis=0), np.abs(x * dy).sum(axis=0), np.abs(dy).sum(axis=0)
