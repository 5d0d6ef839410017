"""torch.autograd.gradcheck in float64 through every differentiable Tile operator: Tile's forward
and backward kernels against finite differences of its own forward, on torch CUDA tensors (the
CUDA backend, marked gpu) and on torch CPU tensors (the CPU executor).

A float64 call computes in float64 (every float register, statistic and saved rstd/mean/lse is
float64), so the Jacobians agree to finite-difference accuracy: the tolerances below are some
10^4 times tighter than a single fp32 rounding in the forward would allow (its error divided by
the step, 2^-24 / 1e-6 ~ 0.06), so a kernel that rounded through fp32 anywhere fails them."""
import pytest

torch = pytest.importorskip("torch")
from torch.autograd import gradcheck  # noqa: E402

import tile  # noqa: E402

# Finite-difference step and tolerances (gradcheck's defaults are eps 1e-6, atol 1e-5, rtol 1e-3).
EPS, ATOL, RTOL = 1e-6, 1e-7, 1e-5

DEVICES = [
    "cpu",
    pytest.param("cuda", marks=[pytest.mark.gpu,
                                pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no CUDA device")]),
]
# A few rows of odd widths (tails, sub-warp programs) and, on the GPU, rows of several warps.
SHAPES = {"cpu": [(3, 17), (2, 2, 33)], "cuda": [(3, 17), (2, 2, 33), (3, 1100)]}


def leaf(shape, device, seed, scale=1.0, mean=0.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g, dtype=torch.float64) * scale + mean).to(device).requires_grad_()


def check(fn, inputs, numel):
    # fast_mode (a random projection of the Jacobian) for the larger rows keeps the GPU run short.
    assert gradcheck(fn, inputs, eps=EPS, atol=ATOL, rtol=RTOL, fast_mode=numel > 2000)


def shapes(device):
    return SHAPES[device]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
def test_softmax(device, op):
    for shape in shapes(device):
        x = leaf(shape, device, 1, 2.0)
        y = getattr(tile, op)(x)
        assert y.dtype == torch.float64 and y.grad_fn is not None
        check(getattr(tile, op), (x,), x.numel())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("weighted", [True, False])
def test_rms_norm(device, weighted):
    for shape in shapes(device):
        x = leaf(shape, device, 2, 1.5, 0.3)
        w = leaf(shape[-1], device, 3, 0.5, 1.0) if weighted else None
        y, rstd = tile.rms_norm(x, weight=w, eps=1e-5, return_rstd=True)
        assert y.dtype == torch.float64 and rstd.dtype == torch.float64
        if weighted:
            check(lambda x, w: tile.rms_norm(x, weight=w, eps=1e-5), (x, w), x.numel())
        else:
            check(lambda x: tile.rms_norm(x, eps=1e-5), (x,), x.numel())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("affine", ["both", "weight", "bias", "none"])
def test_layer_norm(device, affine):
    for shape in shapes(device):
        x = leaf(shape, device, 4, 2.0, -0.5)
        w = leaf(shape[-1], device, 5, 0.5, 1.0) if affine in ("both", "weight") else None
        b = leaf(shape[-1], device, 6, 0.5) if affine in ("both", "bias") else None
        y, mean, rstd = tile.layer_norm(x, weight=w, bias=b, return_stats=True)
        assert y.dtype == mean.dtype == rstd.dtype == torch.float64
        params = [t for t in (w, b) if t is not None]

        def fn(x, *p, w=w, b=b):
            it = iter(p)
            return tile.layer_norm(x, weight=next(it) if w is not None else None, bias=next(it) if b is not None else None)

        check(fn, (x, *params), x.numel())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("weighted", [True, False])
def test_fused_add_rms_norm(device, weighted):
    for shape in shapes(device):
        x, r = leaf(shape, device, 7), leaf(shape, device, 8, 2.0, 0.2)
        w = leaf(shape[-1], device, 9, 0.5, 1.0) if weighted else None
        y, s = tile.fused_add_rms_norm(x, r, w)
        assert y.dtype == s.dtype == torch.float64
        if weighted:
            check(lambda x, r, w: tile.fused_add_rms_norm(x, r, w), (x, r, w), x.numel())
        else:
            check(lambda x, r: tile.fused_add_rms_norm(x, r), (x, r), x.numel())


CROSS_ENTROPY = {
    "mean": dict(reduction="mean"),
    "sum": dict(reduction="sum"),
    "none": dict(reduction="none"),
    "label_smoothing": dict(label_smoothing=0.1),
    "ignore_index": dict(ignore_index=2),
    "z_loss_softcap": dict(z_loss=1e-3, softcap=5.0),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("variant", sorted(CROSS_ENTROPY))
def test_cross_entropy(device, variant):
    kwargs = CROSS_ENTROPY[variant]
    for shape in shapes(device):
        logits = leaf(shape, device, 10, 3.0)
        rows = logits.shape[:-1].numel()
        g = torch.Generator().manual_seed(11)
        target = torch.randint(0, shape[-1], (rows,), generator=g)
        target[1] = kwargs.get("ignore_index", -100)  # an ignored row
        target = target.reshape(shape[:-1]).to(device)
        loss = tile.cross_entropy(logits, target, **kwargs)
        assert loss.dtype == torch.float64
        check(lambda z: tile.cross_entropy(z, target, **kwargs), (logits,), logits.numel())
