"""The gradients of y = x * weight + bias with respect to weight and bias: sums over the rows,
dweight = sum(x * dy), dbias = sum(dy), one float32 value per column (per-column outputs).

A reduction over the rows runs in two phases: per-group partials in float32, then one pass that
folds them in a fixed order, so the result is the same bits on every run. Checks against a
float64 numpy reference; exits 1 on a mismatch.

    python examples/python/weight_gradient.py [--cpu]
"""
import sys

import numpy as np

import tile


def build():
    p = tile.RowProgram("weight_gradient")
    x, dy = p.row_in("x", doc="the layer's input"), p.row_in("dy", doc="the gradient of its output")
    dweight = p.col_out("dweight", dtypes="f32")
    dbias = p.col_out("dbias", dtypes="f32", optional=True)
    p.store(dweight, p.reduce1(tile.Axis.rows, tile.monoid.sum(), p.load(x) * p.load(dy)))
    p.store(dbias, p.reduce1(tile.Axis.rows, tile.monoid.sum(), p.load(dy)))
    return p


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
        x = torch.randn(4, 1024, 4096, device="cuda").to(torch.bfloat16)
        dy = torch.randn(4, 1024, 4096, device="cuda").to(torch.bfloat16)
        dweight, dbias = p(x=x, dy=dy)
        again, _ = p(x=x, dy=dy)
        torch.cuda.synchronize()
        same = bool(torch.equal(again, dweight))
        x64, dy64 = x.double().cpu().numpy(), dy.double().cpu().numpy()
        got = dweight.double().cpu().numpy(), dbias.double().cpu().numpy()
    else:
        x = rng.standard_normal((4, 50, 96)).astype(np.float32)
        dy = rng.standard_normal((4, 50, 96)).astype(np.float32)
        dweight, dbias = p(x=x, dy=dy)
        again, _ = p(x=x, dy=dy)
        same = bool(np.array_equal(again, dweight))
        x64, dy64 = x.astype(np.float64), dy.astype(np.float64)
        got = dweight.astype(np.float64), dbias.astype(np.float64)
    x64, dy64 = x64.reshape(-1, x64.shape[-1]), dy64.reshape(-1, dy64.shape[-1])
    ok = same
    for name, g, terms in (("dweight", got[0], x64 * dy64), ("dbias", got[1], dy64)):
        want = terms.sum(axis=0)
        err = np.abs(g - want)
        bound = 1e-5 * np.abs(terms).sum(axis=0)  # float32 sums: relative to the sum of |terms|
        ok &= bool((err <= bound).all())
        print(f"{name} {g.shape}: max |error| {err.max():.3g}, {int((err > bound).sum())} of {err.size} beyond "
              f"tolerance")
    print(f"{x64.shape[0]} rows; a second run gives the same bits: {same}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
