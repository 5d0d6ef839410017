"""The implementations Tile is compared with, each as a factory of a launch callable.

    make(name, op, x, weight, bias, eps, out) -> (callable, note)

Peers: torch eager, torch.compile (compiled on the first call, which the caller times and
reports separately), a hand-written one-program-per-row Triton kernel, Liger-Kernel and QuACK
when they are importable (never vendored; bench/install_peers.sh installs both from wheels on
the GPU machine). QuACK compiles (and where it autotunes, tunes) on the first call of a shape;
the caller treats that call like torch.compile's compile. A peer that cannot run a case raises
`Unsupported` with the reason, which the sweep records instead of a number; so do the argument
checks by which Liger and QuACK refuse a shape or dtype (see `refusals`).
"""

from __future__ import annotations

import importlib

import torch
import torch.nn.functional as F

EPS = {"rms_norm": 1e-6, "layer_norm": 1e-5}


class Unsupported(Exception):
    pass


def _torch_fn(op, x, weight, bias, eps):
    cols = x.shape[-1]
    if op == "softmax":
        return lambda: torch.softmax(x, -1)
    if op == "log_softmax":
        return lambda: torch.log_softmax(x, -1)
    if op == "rms_norm":
        return lambda: F.rms_norm(x, (cols,), weight, eps)
    return lambda: F.layer_norm(x, (cols,), weight, bias, eps)


def torch_eager(op, x, weight, bias, eps, out):
    if op in ("softmax", "log_softmax"):
        fn = getattr(torch, op)
        try:
            fn(x, -1, out=out)
            return (lambda: fn(x, -1, out=out)), f"torch.{op}(x, -1, out=y)"
        except TypeError:  # builds without the public out= overload
            inner = getattr(torch, "_" + op)
            return (lambda: inner(x, -1, False, out=out)), f"torch._{op}(x, -1, False, out=y)"
    return _torch_fn(op, x, weight, bias, eps), f"torch eager {op} (allocates its output)"


def torch_compile(op, x, weight, bias, eps, out):
    cols = x.shape[-1]

    def body(x, weight, bias):
        if op == "softmax":
            return torch.softmax(x.float(), -1).to(x.dtype)
        if op == "log_softmax":
            return torch.log_softmax(x.float(), -1).to(x.dtype)
        xf = x.float()
        if op == "rms_norm":
            y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()
        else:
            y = F.layer_norm(xf, (cols,), weight.float(), bias.float(), eps)
        return y.to(x.dtype)

    # Every case compiles afresh: dynamo otherwise counts each shape and dtype as a recompile of
    # `body` and, past its recompile limit, silently runs it uncompiled.
    torch._dynamo.reset()
    compiled = torch.compile(body, dynamic=False)
    return (lambda: compiled(x, weight, bias)), "torch.compile (dynamic=False) of an fp32-upcast body"


# ----------------------------------------------------------------------------- Triton

_TRITON = None


def _triton_kernels():
    """One program per row, the whole row in one block: the textbook Triton reduction."""
    global _TRITON
    if _TRITON is not None:
        return _TRITON
    import triton
    import triton.language as tl

    @triton.jit
    def softmax_kernel(x_ptr, y_ptr, x_stride, y_stride, n, LOG: tl.constexpr, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, BLOCK)
        mask = cols < n
        x = tl.load(x_ptr + row * x_stride + cols, mask=mask, other=-float("inf")).to(tl.float32)
        m = tl.max(x, 0)
        e = tl.exp(x - m)
        s = tl.sum(e, 0)
        y = (x - m - tl.log(s)) if LOG else e / s
        tl.store(y_ptr + row * y_stride + cols, y.to(y_ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def rms_norm_kernel(x_ptr, w_ptr, y_ptr, x_stride, y_stride, n, eps, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, BLOCK)
        mask = cols < n
        x = tl.load(x_ptr + row * x_stride + cols, mask=mask, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        r = tl.rsqrt(tl.sum(x * x, 0) / n + eps)
        tl.store(y_ptr + row * y_stride + cols, (x * r * w).to(y_ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def layer_norm_kernel(x_ptr, w_ptr, b_ptr, y_ptr, x_stride, y_stride, n, eps, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, BLOCK)
        mask = cols < n
        x = tl.load(x_ptr + row * x_stride + cols, mask=mask, other=0.0).to(tl.float32)
        mean = tl.sum(x, 0) / n
        d = tl.where(mask, x - mean, 0.0)
        r = tl.rsqrt(tl.sum(d * d, 0) / n + eps)
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        b = tl.load(b_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(y_ptr + row * y_stride + cols, (d * r * w + b).to(y_ptr.dtype.element_ty), mask=mask)

    _TRITON = (triton, softmax_kernel, rms_norm_kernel, layer_norm_kernel)
    return _TRITON


def triton_row(op, x, weight, bias, eps, out):
    triton, softmax_kernel, rms_norm_kernel, layer_norm_kernel = _triton_kernels()
    rows, cols = x.shape
    block = triton.next_power_of_2(cols)
    if block > 65536:
        raise Unsupported(f"a one-block row of {cols} columns exceeds the textbook kernel (65536)")
    warps = min(32, max(4, block // 1024))
    grid = (rows,)
    if op in ("softmax", "log_softmax"):
        def fn():
            softmax_kernel[grid](x, out, x.stride(0), out.stride(0), cols, LOG=op == "log_softmax",
                                 BLOCK=block, num_warps=warps)
    elif op == "rms_norm":
        def fn():
            rms_norm_kernel[grid](x, weight, out, x.stride(0), out.stride(0), cols, eps, BLOCK=block, num_warps=warps)
    else:
        def fn():
            layer_norm_kernel[grid](x, weight, bias, out, x.stride(0), out.stride(0), cols, eps, BLOCK=block,
                                    num_warps=warps)
    return fn, f"Triton, one program per row, BLOCK={block}, num_warps={warps}"


# ----------------------------------------------------------------------------- Liger and QuACK

LIGER_MAX_N = 65536  # Liger's one-block rows: next_power_of_2(N) up to 65536 elements


def refusals(fn, who):
    """fn, with the exceptions by which `who` refuses a shape or dtype (its argument checks are
    asserts and ValueErrors, raised on the first call) recorded as Unsupported, not as errors."""
    def call():
        try:
            return fn()
        except (AssertionError, ValueError) as e:
            raise Unsupported(f"{who} refused the call: {type(e).__name__}: {e}") from e
    return call


def liger_module(name):
    """liger_kernel.ops.<name>: the default (Triton) implementation, whatever LIGER_KERNEL_IMPL says."""
    try:
        return importlib.import_module(f"liger_kernel.ops.{name}")
    except Exception as e:  # ImportError, or a broken install failing on import
        raise Unsupported(f"liger_kernel is not importable ({type(e).__name__}: {e})")


def liger_check_n(n):
    if 1 << max(0, n - 1).bit_length() > LIGER_MAX_N:
        raise Unsupported(f"Liger-Kernel refuses rows longer than {LIGER_MAX_N} elements (N = {n}: one Triton "
                          "block per row)")


def quack_module(name):
    try:
        return importlib.import_module(f"quack.{name}")
    except Exception as e:
        raise Unsupported(f"quack is not importable ({type(e).__name__}: {e}); bench/install_peers.sh installs it")


def quack_check_n(n):
    # Checked before the call: QuACK's kernels load 128-bit vectors along the row, and a refused
    # shape must never reach a kernel (an illegal address would end the whole sweep).
    if n % 4:
        raise Unsupported(f"QuACK refuses N % 4 != 0 (N = {n})")


def liger(op, x, weight, bias, eps, out):
    if op == "log_softmax":
        raise Unsupported("Liger-Kernel has no log-softmax")
    liger_check_n(x.shape[-1])
    if op == "rms_norm":
        f = liger_module("rms_norm").LigerRMSNormFunction
        return (lambda: f.apply(x, weight, eps)), "liger_kernel.ops.rms_norm.LigerRMSNormFunction.apply(x, w, eps)"
    if op == "layer_norm":
        f = liger_module("layer_norm").LigerLayerNormFunction
        return (lambda: f.apply(x, weight, bias, eps)), \
            "liger_kernel.ops.layer_norm.LigerLayerNormFunction.apply(x, w, b, eps)"
    f = liger_module("softmax").LigerSoftmaxFunction
    return (lambda: f.apply(x)), "liger_kernel.ops.softmax.LigerSoftmaxFunction.apply(x)"


def quack(op, x, weight, bias, eps, out):
    if op == "log_softmax":
        raise Unsupported("QuACK 0.6.5 has no log-softmax (quack.softmax computes softmax only)")
    quack_check_n(x.shape[-1])
    if op == "softmax":
        m = quack_module("softmax")
        return refusals(lambda: m._softmax_fwd(x, out), "QuACK"), "quack.softmax._softmax_fwd(x, out)"
    m = quack_module("rmsnorm")
    if op == "rms_norm":
        return refusals(lambda: m.rmsnorm_fwd(x, weight, eps=eps)[0], "QuACK"), \
            "quack.rmsnorm.rmsnorm_fwd(x, w, eps=eps)[0] (allocates its output)"
    # layernorm_fwd takes float32 weight and bias only: it gets float32 copies of the same values
    # (exact), so the operator is the same; the copies' extra N x 2 bytes are not counted.
    w32, b32 = weight.float(), bias.float()
    return refusals(lambda: m.layernorm_fwd(x, w32, b32, eps=eps), "QuACK"), \
        "quack.rmsnorm.layernorm_fwd(x, w, b, eps=eps), weight and bias as float32 copies (it takes float32 only)"


PEERS = {"torch_eager": torch_eager, "torch_compile": torch_compile, "triton_row": triton_row, "liger": liger,
         "quack": quack}


def make(name, op, x, weight, bias, eps, out):
    return PEERS[name](op, x, weight, bias, eps, out)
