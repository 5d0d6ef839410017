"""Float64 torch implementations of the training operators, with the signatures the package's
torch integration calls (tile/_torch_ops.py): softmax_backward, log_softmax_backward,
rms_norm_backward, layer_norm_backward, fused_add_rms_norm (with return_rstd) and its
backward, cross_entropy (with return_lse) and its backward.

Where this version of the package lacks one, the fixture `training_ops` installs the
implementation here in its place (wrapped as the package wraps its own, tile._differentiable),
so that the autograd wiring, opcheck and torch.compile are tested end to end; where the package
has one, the package's own runs. `stand_ins` lists the names replaced, and the tests say so.
"""
import pytest
import torch

NAMES = ("softmax_backward", "log_softmax_backward", "rms_norm_backward", "layer_norm_backward",
         "fused_add_rms_norm", "fused_add_rms_norm_backward", "cross_entropy", "cross_entropy_backward")


def _write(out, value, like):
    if out is None:
        return value.to(like.dtype)
    out.copy_(value)
    return out


def softmax_backward(y, dy, out=None):
    y64, dy64 = y.double(), dy.double()
    return _write(out, y64 * (dy64 - (dy64 * y64).sum(-1, keepdim=True)), dy)


def log_softmax_backward(y, dy, out=None):
    y64, dy64 = y.double(), dy.double()
    return _write(out, dy64 - y64.exp() * dy64.sum(-1, keepdim=True), dy)


def _rows_sum(t):
    return t.reshape(-1, t.shape[-1]).sum(0)


def rms_norm_backward(dy, x, weight, rstd):
    x64, dy64, r = x.double(), dy.double(), rstd.double()[..., None]
    xhat = x64 * r
    g = dy64 * weight.double() if weight is not None else dy64
    dx = r * (g - xhat * (g * xhat).mean(-1, keepdim=True))
    dw = None if weight is None else _rows_sum(dy64 * xhat).to(weight.dtype)
    return dx.to(x.dtype), dw


def layer_norm_backward(dy, x, weight, bias, mean, rstd):
    x64, dy64, r = x.double(), dy.double(), rstd.double()[..., None]
    xhat = (x64 - mean.double()[..., None]) * r
    g = dy64 * weight.double() if weight is not None else dy64
    dx = r * (g - g.mean(-1, keepdim=True) - xhat * (g * xhat).mean(-1, keepdim=True))
    dw = None if weight is None else _rows_sum(dy64 * xhat).to(weight.dtype)
    db = None if bias is None else _rows_sum(dy64).to(bias.dtype)
    return dx.to(x.dtype), dw, db


def fused_add_rms_norm(x, residual, weight=None, eps=1e-6, in_place=False, return_rstd=False):
    s = x.double() + residual.double()
    rstd = torch.rsqrt((s * s).mean(-1) + eps)
    y = s * rstd[..., None]
    if weight is not None:
        y = y * weight.double()
    if in_place:
        residual.copy_(s)
        x.copy_(y)
        y, s_out = x, residual
    else:
        y, s_out = y.to(x.dtype), s.to(residual.dtype)
    return (y, s_out, rstd.float()) if return_rstd else (y, s_out)


def fused_add_rms_norm_backward(dy, dresidual_out, residual_out, weight, rstd):
    dn, dw = rms_norm_backward(dy, residual_out, weight, rstd)
    ds = dn.double() + dresidual_out.double()
    return ds, ds.to(residual_out.dtype), dw


def _capped(logits, softcap):
    z = logits.double()
    return z if softcap is None else softcap * torch.tanh(z / softcap)


def cross_entropy(logits, target, ignore_index=-100, reduction="mean", label_smoothing=0.0, z_loss=0.0, softcap=None,
                  return_lse=False):
    z = _capped(logits, softcap)
    lse = torch.logsumexp(z, -1)
    keep = target != ignore_index
    t = torch.where(keep, target, torch.zeros_like(target)).long()
    picked = z.gather(-1, t[..., None])[..., 0]
    rows = (1 - label_smoothing) * (lse - picked) + label_smoothing * (lse - z.mean(-1)) + z_loss * lse * lse
    rows = torch.where(keep, rows, torch.zeros_like(rows))
    if reduction == "none":
        loss = rows
    elif reduction == "sum":
        loss = rows.sum()
    else:
        loss = rows.sum() / keep.sum()
    loss = loss.float()
    return (loss, lse.float()) if return_lse else loss


def cross_entropy_backward(dloss, logits, target, lse, ignore_index=-100, reduction="mean", label_smoothing=0.0,
                           z_loss=0.0, softcap=None):
    z = _capped(logits, softcap)
    keep = target != ignore_index
    t = torch.where(keep, target, torch.zeros_like(target)).long()
    p = torch.softmax(z, -1)
    onehot = torch.zeros_like(z).scatter_(-1, t[..., None], 1.0)
    lse64 = lse.double()[..., None]
    g = p * (1 + 2 * z_loss * lse64) - (1 - label_smoothing) * onehot - label_smoothing / z.shape[-1]
    if reduction == "none":
        scale = dloss.double()[..., None]
    elif reduction == "sum":
        scale = dloss.double()
    else:
        scale = dloss.double() / keep.sum()
    g = torch.where(keep[..., None], g * scale, torch.zeros_like(g))
    if softcap is not None:
        g = g * (1 - (z / softcap) ** 2)
    return g.to(logits.dtype)


@pytest.fixture
def training_ops(monkeypatch):
    """The package with every training operator present: its own where it has one, the float64
    implementations above elsewhere. Yields the names replaced."""
    import tile
    replaced = []
    for name in NAMES:
        if getattr(tile, name, None) is None:
            monkeypatch.setattr(tile, name, tile._differentiable(name, globals()[name]), raising=False)
            replaced.append(name)
    yield replaced
