"""softmax(x / t + mask) over each row, as a row program of your own.

The temperature t is a scalar operand, the additive mask (0 or -inf) a second row input; the row
maximum and the sum of exponentials come from one online reduction, so a row is read once. Runs
on torch CUDA tensors when a GPU is there (bfloat16), else on the CPU backend with numpy
(float32), and checks the result against a float64 numpy reference; exits 1 on a mismatch.

    python examples/python/softmax_temperature_mask.py [--cpu]
"""
import sys

import numpy as np

import tile


def build():
    p = tile.RowProgram("softmax_temperature_mask")
    x = p.row_in("x", doc="logits")
    mask = p.row_in("mask", doc="added to the scaled logits: 0 keeps a column, -inf drops it")
    t = p.scalar_in("t", default=1.0, doc="temperature")
    p.scalar_range(t, 1e-3, 1e3)
    y = p.row_out("y", may_alias=x)  # may be x itself (in place)
    v = p.load(x) / p.load(t) + p.load(mask)
    m, s = p.reduce2(tile.Axis.cols, tile.monoid.online_softmax(), v)
    p.store(y, tile.exp(v - m) / s)
    return p


def reference(x, mask, t):
    z = x / float(np.float32(t)) + mask  # the kernel reads t as float32
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def main():
    p = build()
    print(p)
    rng = np.random.default_rng(0)
    torch = None
    if "--cpu" not in sys.argv:
        try:
            import torch
        except ImportError:
            pass
    if torch is not None and torch.cuda.is_available():
        shape, rtol, atol = (64, 4096), 1.6e-2, 8e-3  # bfloat16 output
        x = torch.randn(shape, device="cuda").to(torch.bfloat16)
        mask = torch.zeros(shape, device="cuda").masked_fill(torch.rand(shape, device="cuda") < 0.3, float("-inf"))
        mask[:, 0] = 0
        y = p(x=x, mask=mask, t=0.7)
        torch.cuda.synchronize()
        x64, mask64, y64 = (a.double().cpu().numpy() for a in (x, mask, y))
    else:
        shape, rtol, atol = (8, 300), 2e-5, 2e-6
        x = rng.standard_normal(shape).astype(np.float32)
        mask = np.where(rng.random(shape) < 0.3, -np.inf, 0.0).astype(np.float32)
        mask[:, 0] = 0
        y = p(x=x, mask=mask, t=0.7)
        x64, mask64, y64 = x.astype(np.float64), mask.astype(np.float64), y.astype(np.float64)
    want = reference(x64, mask64, 0.7)
    err = np.abs(y64 - want)
    bound = rtol * np.abs(want) + atol * np.abs(want).max(axis=-1, keepdims=True)
    print(f"{type(y).__module__} {tuple(y.shape)} {y.dtype}: max |error| {err.max():.3g}, "
          f"{int((err > bound).sum())} of {err.size} beyond tolerance")
    return 0 if (err <= bound).all() else 1


if __name__ == "__main__":
    sys.exit(main())
