"""Gemma's RMSNorm, x * rsqrt(mean(x^2) + eps) * (1 + weight), with a float32 output from a
bfloat16 (GPU) or float16 (numpy, which has no bfloat16) input.

The output's dtype is declared (f32 only), so it is allocated as float32 whatever x is. Checks the
result against a float64 numpy reference; exits 1 on a mismatch.

    python examples/python/rms_norm_gemma.py [--cpu]
"""
import sys

import numpy as np

import tile


def build():
    p = tile.RowProgram("rms_norm_gemma")
    x = p.row_in("x")
    w = p.col_in("weight", doc="scale, applied as 1 + weight")
    eps = p.scalar_in("eps", default=1e-6)
    p.scalar_range(eps, 0.0, 1.0)
    y = p.row_out("y", dtypes="f32")
    v = p.load(x)
    mean_square = p.reduce1(tile.Axis.cols, tile.monoid.sum(), v * v) / p.cols()
    p.store(y, v * tile.rsqrt(mean_square + p.load(eps)) * (1 + p.load(w)))
    return p


def reference(x, w, eps):
    return x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + float(np.float32(eps))) * (1 + w)


def main():
    p = build()
    rng = np.random.default_rng(0)
    torch = None
    if "--cpu" not in sys.argv:
        try:
            import torch
        except ImportError:
            pass
    if torch is not None and torch.cuda.is_available():
        x = (torch.randn(2, 128, 2048, device="cuda") * 3).to(torch.bfloat16)
        w = torch.randn(2048, device="cuda") * 0.1
        y = p(x=x, weight=w)
        torch.cuda.synchronize()
        x64, w64, y64 = (a.double().cpu().numpy() for a in (x, w, y))
    else:
        x = (rng.standard_normal((2, 8, 256)) * 3).astype(np.float16)
        w = (rng.standard_normal(256) * 0.1).astype(np.float32)
        y = p(x=x, weight=w)
        x64, w64, y64 = x.astype(np.float64), w.astype(np.float64), y.astype(np.float64)
    want = reference(x64, w64, 1e-6)
    err = np.abs(y64 - want)
    bound = 2e-5 * np.abs(want) + 2e-6 * np.abs(want).max(axis=-1, keepdims=True)
    print(f"{x.dtype} in, {y.dtype} out, shape {tuple(y.shape)}: max |error| {err.max():.3g}, "
          f"{int((err > bound).sum())} of {err.size} beyond tolerance")
    float32 = str(y.dtype) in ("float32", "torch.float32")  # the declared dtype, not x's
    return 0 if (err <= bound).all() and float32 else 1


if __name__ == "__main__":
    sys.exit(main())
