"""Tile and its peers for the training operators of bench/train_sweep.py, each as a factory of a
launch callable that returns the operator's outputs in a fixed order:

    make(name, op, case) -> (callable, note)

    softmax_backward       (dx,)                    from y = softmax(x), dy
    rms_norm_backward      (dx, dweight)            from dy, x, weight, rstd
    layer_norm_backward    (dx, dweight, dbias)     from dy, x, weight, bias, mean, rstd
    fused_add_rms_norm     (y, residual_out)        from x, residual, weight
    cross_entropy_fwd_bwd  (loss, dlogits)          from logits, target: per-row loss and the
                                                    gradient of their sum (dloss = 1 per row)

`case` holds the inputs (attributes named as above; rstd and mean float32, one per row; target
int64). Peers: torch eager (its own backward kernels, reached through autograd, or
torch._softmax_backward_data), torch.compile of the float32 formula, Liger-Kernel (the module
functions under liger_kernel.ops.* that its autograd Functions call) and QuACK. Where a peer
works in place (Liger's rms_norm backward overwrites dy, Liger's and QuACK's fused cross-entropy
and Tile's overwrite the logits) it gets its own copy of that input, so every peer starts from
the same values; later timed calls then read their own earlier output, which changes no
kernel's work. Refusals are `peers.Unsupported`, as in the forward sweep.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from peers import Unsupported, liger_check_n, liger_module, quack_check_n, quack_module, refusals

EPS = {"rms_norm_backward": 1e-6, "layer_norm_backward": 1e-5, "fused_add_rms_norm": 1e-6}


# ----------------------------------------------------------------------------- Tile

def tile_impl(op, c):
    import tile
    if op == "softmax_backward":
        dx = torch.full_like(c.dy, float("nan"))  # poisoned: a value left unwritten fails the oracle
        return (lambda: (tile.softmax_backward(c.y, c.dy, out=dx),)), "tile.softmax_backward(y, dy, out=dx)"
    if op == "rms_norm_backward":
        dx = torch.full_like(c.dy, float("nan"))
        return (lambda: tile.rms_norm_backward(c.dy, c.x, c.weight, c.rstd, out=dx)), \
            "tile.rms_norm_backward(dy, x, w, rstd, out=dx)"
    if op == "layer_norm_backward":
        dx = torch.full_like(c.dy, float("nan"))
        return (lambda: tile.layer_norm_backward(c.dy, c.x, c.weight, c.bias, c.mean, c.rstd, out=dx)), \
            "tile.layer_norm_backward(dy, x, w, b, mean, rstd, out=dx)"
    if op == "fused_add_rms_norm":
        return (lambda: tile.fused_add_rms_norm(c.x, c.residual, weight=c.weight, eps=EPS[op])), \
            "tile.fused_add_rms_norm(x, residual, weight=w) (allocates y and residual_out)"
    buf = c.logits.clone()
    return (lambda: (tile.cross_entropy_fused(buf, c.target, reduction="none"), buf)), \
        "tile.cross_entropy_fused(logits, target, reduction='none'): dlogits over the logits"


# ----------------------------------------------------------------------------- torch eager

def torch_eager(op, c):
    if op == "softmax_backward":
        dtype = c.y.dtype
        return (lambda: (torch._softmax_backward_data(c.dy, c.y, -1, dtype),)), \
            "torch._softmax_backward_data(dy, y, -1, dtype)"
    if op in ("rms_norm_backward", "layer_norm_backward"):
        # The backward of the eager forward, through autograd: the graph (and its saved
        # statistics) is kept, so each call runs the backward kernels alone.
        n = c.x.shape[-1]
        x = c.x.detach().requires_grad_()
        w = c.weight.detach().requires_grad_()
        if op == "rms_norm_backward":
            leaves, y = (x, w), F.rms_norm(x, (n,), w, EPS[op])
        else:
            b = c.bias.detach().requires_grad_()
            leaves, y = (x, w, b), F.layer_norm(x, (n,), w, b, EPS[op])
        fwd = "F.rms_norm" if op == "rms_norm_backward" else "F.layer_norm"
        return (lambda: torch.autograd.grad(y, leaves, c.dy, retain_graph=True)), \
            f"torch.autograd.grad of {fwd} (its backward kernels; forward run once, outside the timing)"
    if op == "fused_add_rms_norm":
        n = c.x.shape[-1]

        def fn():
            r = c.x + c.residual
            return F.rms_norm(r, (n,), c.weight, EPS[op]), r
        return fn, "r = x + residual; F.rms_norm(r, w) (two kernels; normalises the rounded sum)"
    # Upcast first, as transformers' causal-LM loss does: bf16 log-probabilities would put the
    # gradient of a row 1 / |log p| ulps off (about 4 % for p = 1e-5), beyond the oracle's bound.
    return _torch_ce(lambda logits, target: F.cross_entropy(logits.float(), target, reduction="none"), c), \
        "F.cross_entropy(logits.float(), target, reduction='none') and torch.autograd.grad"


def _torch_ce(loss_fn, c):
    logits = c.logits.detach().requires_grad_()

    def fn():
        loss = loss_fn(logits, c.target)
        (g,) = torch.autograd.grad(loss, logits, torch.ones_like(loss))
        return loss, g
    return fn


# ----------------------------------------------------------------------------- torch.compile

def _compile_body(op, dtype):
    eps = EPS.get(op, 0.0)

    if op == "softmax_backward":
        def body(y, dy):
            yf, dyf = y.float(), dy.float()
            return (yf * (dyf - (yf * dyf).sum(-1, keepdim=True))).to(dtype),
    elif op == "rms_norm_backward":
        def body(dy, x, w, rstd):
            dyf, r = dy.float(), rstd[:, None]
            xhat = x.float() * r
            g = dyf * w.float()
            dx = r * (g - xhat * (g * xhat).mean(-1, keepdim=True))
            return dx.to(dtype), (dyf * xhat).sum(0).to(w.dtype)
    elif op == "layer_norm_backward":
        def body(dy, x, w, mean, rstd):
            dyf, r = dy.float(), rstd[:, None]
            xhat = (x.float() - mean[:, None]) * r
            g = dyf * w.float()
            dx = r * (g - g.mean(-1, keepdim=True) - xhat * (g * xhat).mean(-1, keepdim=True))
            return dx.to(dtype), (dyf * xhat).sum(0).to(w.dtype), dyf.sum(0).to(w.dtype)
    elif op == "fused_add_rms_norm":
        def body(x, residual, w):
            h = x.float() + residual.float()
            y = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps) * w.float()
            return y.to(dtype), h.to(residual.dtype)
    else:
        return None
    # As in the forward sweep: a fresh dynamo per case, so no shape counts as a recompile.
    torch._dynamo.reset()
    return torch.compile(body, dynamic=False)


def torch_compile(op, c):
    if op == "cross_entropy_fwd_bwd":
        torch._dynamo.reset()
        f = torch.compile(lambda logits, target: F.cross_entropy(logits.float(), target, reduction="none"),
                          dynamic=False)
        return _torch_ce(f, c), ("torch.compile (dynamic=False) of F.cross_entropy(logits.float(), target, "
                                 "reduction='none'), backward by AOTAutograd through torch.autograd.grad")
    f = _compile_body(op, (c.y if op == "softmax_backward" else c.x).dtype)
    args = {"softmax_backward": lambda: (c.y, c.dy),
            "rms_norm_backward": lambda: (c.dy, c.x, c.weight, c.rstd),
            "layer_norm_backward": lambda: (c.dy, c.x, c.weight, c.mean, c.rstd),
            "fused_add_rms_norm": lambda: (c.x, c.residual, c.weight)}[op]()
    return (lambda: f(*args)), "torch.compile (dynamic=False) of the float32 formula"


# ----------------------------------------------------------------------------- Liger

def liger(op, c):
    if op == "cross_entropy_fwd_bwd":
        m = liger_module("cross_entropy")
        # The forward writes the gradient over its input when the input requires grad (what
        # LigerCrossEntropyFunction does); it also reads the count of rows on the host.
        buf = c.logits.clone().requires_grad_()
        return (lambda: (m.cross_entropy_forward(buf, c.target, None, -100, 0.0, 0.0, "none", None, False)[0],
                         buf.detach())), \
            "liger_kernel.ops.cross_entropy.cross_entropy_forward (reduction 'none'): dlogits over the logits"
    n = c.x.shape[-1] if op != "softmax_backward" else c.y.shape[-1]
    liger_check_n(n)
    settings = liger_module("utils").calculate_settings
    if op == "softmax_backward":
        m = liger_module("softmax")
        block, warps = settings(n)
        return (lambda: (m._softmax_backward(c.dy, c.y, block, warps, False),)), \
            "liger_kernel.ops.softmax._softmax_backward (LigerSoftmaxFunction's backward)"
    if op == "rms_norm_backward":
        m = liger_module("rms_norm")
        block, warps = settings(n)
        llama = m._str_to_casting_mode["llama"]
        dy = c.dy.clone()  # in_place: dx over dy (LigerRMSNormFunction's default)
        return (lambda: m.rms_norm_backward(dy, c.x, c.weight, c.rstd, 0.0, llama, block, warps, True, None)), \
            "liger_kernel.ops.rms_norm.rms_norm_backward (casting mode llama, in_place: dx over dy)"
    if op == "layer_norm_backward":
        m = liger_module("layer_norm")
        return (lambda: m.layer_norm_backward(c.dy, c.x, c.weight, c.bias, c.mean, c.rstd)), \
            "liger_kernel.ops.layer_norm.layer_norm_backward"
    m = liger_module("fused_add_rms_norm")
    return (lambda: m.fused_add_rms_norm_forward(c.x, c.residual, c.weight, EPS[op], 0.0, "llama")[:2]), \
        "liger_kernel.ops.fused_add_rms_norm.fused_add_rms_norm_forward (casting mode llama; also writes rstd)"


# ----------------------------------------------------------------------------- QuACK

def quack(op, c):
    if op == "cross_entropy_fwd_bwd":
        quack_check_n(c.logits.shape[-1])
        m = quack_module("cross_entropy")
        buf = c.logits.clone()
        return refusals(lambda: m.cross_entropy_fwd(buf, c.target, return_dx=True, inplace_backward=True), "QuACK"), \
            "quack.cross_entropy.cross_entropy_fwd(logits, target, return_dx=True, inplace_backward=True)"
    if op == "softmax_backward":
        quack_check_n(c.y.shape[-1])
        m = quack_module("softmax")
        return refusals(lambda: (m.softmax_bwd(c.dy, c.y),), "QuACK"), "quack.softmax.softmax_bwd(dy, y)"
    quack_check_n(c.x.shape[-1])
    m = quack_module("rmsnorm")
    if op == "rms_norm_backward":
        return refusals(lambda: m.rmsnorm_bwd(c.x, c.weight, c.dy, c.rstd)[:2], "QuACK"), \
            "quack.rmsnorm.rmsnorm_bwd(x, w, dy, rstd)"
    if op == "layer_norm_backward":
        return refusals(lambda: m.layernorm_bwd(c.x, c.weight, c.dy, c.rstd, c.mean, has_bias=True), "QuACK"), \
            "quack.rmsnorm.layernorm_bwd(x, w, dy, rstd, mean, has_bias=True)"
    return refusals(lambda: m.rmsnorm_fwd(c.x, c.weight, residual=c.residual, eps=EPS[op])[:2], "QuACK"), \
        "quack.rmsnorm.rmsnorm_fwd(x, w, residual=residual, eps=eps)"


PEERS = {"torch_eager": torch_eager, "torch_compile": torch_compile, "liger": liger, "quack": quack}


def make(name, op, case):
    return (tile_impl if name == "tile" else PEERS[name])(op, case)

