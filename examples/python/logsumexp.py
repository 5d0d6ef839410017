"""log(sum(exp(x))) of each row, written as one float32 value per row (a per-row output).

A (batch, tokens, vocab) input gives a (batch, tokens) result. Also shows the program's float64
reference (program.reference) next to an independent numpy one; exits 1 on a mismatch.

    python examples/python/logsumexp.py [--cpu]
"""
import sys

import numpy as np

import tile


def build():
    p = tile.RowProgram("logsumexp")
    x = p.row_in("x")
    lse = p.row_scalar_out("lse", doc="log(sum(exp(x))) per row")
    m, s = p.reduce2(tile.Axis.cols, tile.monoid.online_softmax(), p.load(x))
    p.store(lse, m + tile.log(s))
    return p


def reference(x):
    m = x.max(axis=-1)
    return m + np.log(np.exp(x - m[..., None]).sum(axis=-1))


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
        x = (torch.randn(4, 128, 32000, device="cuda") * 4).to(torch.bfloat16)
        lse = p(x=x)
        torch.cuda.synchronize()
        x64, lse64 = x.double().cpu().numpy(), lse.double().cpu().numpy()
        small = {"x": x[:1, :8]}  # the float64 reference runs on the host: a slice of it
    else:
        x = (rng.standard_normal((3, 5, 700)) * 4).astype(np.float32)
        lse = p(x=x)
        x64, lse64 = x.astype(np.float64), lse.astype(np.float64)
        small = {"x": x}
    want = reference(x64)
    err = np.abs(lse64 - want)
    bound = 2e-5 * np.abs(want) + 2e-6 * np.abs(x64).max(axis=-1)
    ok = bool((err <= bound).all())
    ref = p.reference(**small)["lse"]  # the library's float64 evaluation of the same program
    n = ref.size
    ok &= bool(np.allclose(ref.ravel(), want.ravel()[:n], rtol=1e-12, atol=0))
    print(f"lse {tuple(lse.shape)} {lse.dtype}: max |error| {err.max():.3g}, "
          f"{int((err > bound).sum())} of {err.size} beyond tolerance; program.reference agrees: "
          f"{np.allclose(ref.ravel(), want.ravel()[:n], rtol=1e-12, atol=0)}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
