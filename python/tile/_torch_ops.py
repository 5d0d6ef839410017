"""Tile's operators inside torch: torch.library custom ops (tile::softmax, tile::rms_norm, ...)
with fake implementations, declared mutations and autograd formulas, and the routing that
picks, per call, between them and the direct launch of tile/__init__.py.

A call with torch tensors takes one of three paths:

- direct: plain tensors (type torch.Tensor), not under torch.compile / torch.export tracing,
  and no input requiring grad while grad mode is on. The launch of tile/__init__.py, as
  cheap on the host as a call can be (python.md, "Host overhead").
- eager autograd: the same, but an input requires grad (and no torch.func transform is
  active; weights and biases may be nn.Parameter). A torch.autograd.Function per operator
  (_EAGER) whose forward is the custom op's own implementation (the direct launch) and whose
  setup and backward are the custom op's registered autograd formulas: the same kernels and
  gradients, without the dispatcher's cost.
- custom op (torch.ops.tile.*): everything else — tracing (fake tensors), tensor subclasses
  (DTensor, FakeTensor, ...; nn.Parameter is eager), torch.func transforms. The dispatcher costs
  microseconds more; the op's implementation is the same direct launch.

The gradients use the backward operators (tile.softmax_backward, tile.rms_norm_backward,
...), looked up when the backward runs; where one is missing, the backward raises
NotImplementedError naming it. Nothing differentiable is ever dropped: statistics outputs
(rstd, mean, lse) are marked non-differentiable, out= and in-place forms refuse inputs that
require grad, and so do row programs and tile.run.

Where the optional extension tile._torch_C is loaded, tile.softmax, log_softmax, rms_norm,
layer_norm and fused_add_rms_norm offer their eager calls to it first (tile/__init__.py, and
call() below for the modules); it takes the direct and eager autograd calls it can read in
C++, with C++ autograd nodes, and leaves the others to these paths (python.md, "The torch
extension").

Imported by tile once torch is loaded (tile._call.init_torch). Tests:
tests/python/test_torch_*.py.
"""
import contextlib
import inspect
import sys
from typing import Optional, Tuple

import torch
from torch import Tensor

from . import _call

_pkg = sys.modules[__package__]

# torch.compiler.is_compiling appeared in torch 2.3; it is True while dynamo or export traces.
_is_compiling = torch.compiler.is_compiling
_grad_enabled = torch.is_grad_enabled


def route(x, w=None, b=None):
    """True when a call with these arrays takes the custom-op path (see the module docstring).
    Ordered for the common eager call, which it costs about 0.1-0.2 us."""
    if type(x) is not Tensor:
        return isinstance(x, Tensor)            # subclasses and fake tensors; numpy & co. go direct
    if _is_compiling():                          # dynamo sees type(x) as Tensor while tracing
        return True
    if x.requires_grad or (w is not None and w.requires_grad) or (b is not None and b.requires_grad):
        return _grad_enabled()
    return False


def route_any(args, kwargs):
    """route() over every torch tensor among a call's arguments (the training operators)."""
    tensors = [a for a in args if isinstance(a, Tensor)] + [a for a in kwargs.values() if isinstance(a, Tensor)]
    if not tensors:
        return False
    if _is_compiling() or any(type(t) is not Tensor for t in tensors):
        return True
    return _grad_enabled() and any(t.requires_grad for t in tensors)


# Exact types the eager autograd path takes: nn.Parameter disables __torch_function__, so it
# dispatches like a plain tensor (the weights of tile.nn's modules are Parameters).
_Parameter = torch.nn.Parameter
_functorch_active = torch._C._are_functorch_transforms_active


def eager_grad(*arrays):
    """True when a call that route() / route_any() sent here takes the eager autograd path:
    grad mode on, an input requiring grad, every tensor a plain torch.Tensor (or nn.Parameter),
    no torch.compile / torch.export tracing and no torch.func transform (their wrapped tensors
    go to the custom op, as before). None entries are absent optional arguments."""
    if not _grad_enabled() or _is_compiling() or _functorch_active():
        return False
    grad = False
    for a in arrays:
        if a is not None:
            if type(a) is not Tensor and type(a) is not _Parameter:
                return False
            grad = grad or a.requires_grad
    return grad


def needs_grad(*arrays):
    """True when grad mode is on and one of the torch tensors given requires grad."""
    return _grad_enabled() and any(isinstance(a, Tensor) and a.requires_grad for a in arrays)


def refuse_grad(op, what, **arrays):
    """Raises where a form of a call cannot carry gradients but an input requires them."""
    if not _grad_enabled():
        return
    for name, a in arrays.items():
        if isinstance(a, Tensor) and a.requires_grad:
            raise RuntimeError(f"{op}: argument '{name}': {what} is not differentiable, but {name} requires grad; "
                               f"call it under torch.no_grad(), pass {name}.detach(), or use the form without it")


def _dtensor_class():
    # DTensor exists only once torch.distributed.tensor is imported; no import here (it is slow).
    module = sys.modules.get("torch.distributed.tensor")
    return getattr(module, "DTensor", None)


def refuse_dtensor(op, **arrays):
    """Raises where an argument is a DTensor: the ops have no sharding rule, and DTensor's own
    error names neither the argument nor a way out. Not while tracing (dynamo sees through it)."""
    if _is_compiling():
        return
    cls = _dtensor_class()
    if cls is None:
        return
    for name, a in arrays.items():
        if isinstance(a, cls):
            raise TypeError(f"{op}: argument '{name}': expected a torch.Tensor, got a DTensor (placements "
                            f"{tuple(a.placements)}); Tile's operators have no sharding rule: pass the local shard "
                            f"({name}.to_local()) or the whole tensor ({name}.full_tensor())")


def _refusing_dtensor(name, fn):
    """fn, raising refuse_dtensor's error where one of its arguments is a DTensor."""
    signature = inspect.signature(fn)

    def call(*args, **kwargs):
        if not _is_compiling() and _dtensor_class() is not None:
            refuse_dtensor(name, **signature.bind(*args, **kwargs).arguments)
        return fn(*args, **kwargs)
    return call


def _training(name, of):
    """The direct function of a training operator (tile.softmax_backward, ...), looked up now:
    it may have been added to the package after this module was imported."""
    fn = getattr(_pkg, name, None)
    if fn is None:
        raise NotImplementedError(f"tile.{name} is not available in this version of the tile package, and "
                                  f"{of} needs it")
    return getattr(fn, "_tile_direct", fn)


def _stream(op, stream, x):
    """A context making `stream` current for a custom-op call (the op runs on the current stream)."""
    if stream is None:
        return contextlib.nullcontext()
    if not x.is_cuda:
        _call.stream_handle(op, stream, False)   # refuses any stream but 0 for CPU tensors
        return contextlib.nullcontext()
    if isinstance(stream, torch.cuda.Stream):
        return torch.cuda.stream(stream)
    return torch.cuda.stream(torch.cuda.ExternalStream(_call.stream_handle(op, stream, True), device=x.device))


def _rows(x):
    return x.shape[:-1]


def _stat_dtype(x):
    """The dtype of a call's statistics (rstd, mean, lse, losses): float64 in a float64 call."""
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _stats(x, n):
    return tuple(x.new_empty(_rows(x), dtype=_stat_dtype(x)) for _ in range(n))


_RSTD = ("rstd",)
_MEAN_RSTD = ("mean", "rstd")


# ---- forward operators ----
# Each op's implementation is a named function: the eager autograd path (_EAGER) runs it as is.

def _softmax_impl(x: Tensor, dtype: Optional[torch.dtype] = None, plan: Optional[str] = None) -> Tensor:
    return _pkg._launch("softmax", x, None, None, None, None, plan, None, dtype, False)


_softmax = torch.library.custom_op("tile::softmax", mutates_args=())(_softmax_impl)


def _log_softmax_impl(x: Tensor, dtype: Optional[torch.dtype] = None, plan: Optional[str] = None) -> Tensor:
    return _pkg._launch("log_softmax", x, None, None, None, None, plan, None, dtype, False)


_log_softmax = torch.library.custom_op("tile::log_softmax", mutates_args=())(_log_softmax_impl)


@torch.library.custom_op("tile::softmax_out", mutates_args=("out",))
def _softmax_out(x: Tensor, out: Tensor, plan: Optional[str] = None) -> None:
    _pkg._launch("softmax", x, out, None, None, None, plan, None, None, False)


@torch.library.custom_op("tile::log_softmax_out", mutates_args=("out",))
def _log_softmax_out(x: Tensor, out: Tensor, plan: Optional[str] = None) -> None:
    _pkg._launch("log_softmax", x, out, None, None, None, plan, None, None, False)


def _rms_norm_impl(x: Tensor, weight: Optional[Tensor], eps: Optional[float], dtype: Optional[torch.dtype] = None,
                   plan: Optional[str] = None) -> Tuple[Tensor, Tensor]:
    return _pkg._launch("rms_norm", x, None, weight, None, eps, plan, None, dtype, False, _RSTD)


_rms_norm = torch.library.custom_op("tile::rms_norm", mutates_args=())(_rms_norm_impl)


@torch.library.custom_op("tile::rms_norm_out", mutates_args=("out", "rstd"))
def _rms_norm_out(x: Tensor, weight: Optional[Tensor], eps: Optional[float], out: Tensor, rstd: Optional[Tensor],
                  plan: Optional[str] = None) -> None:
    _pkg._launch_with_stats("rms_norm", x, out, weight, None, eps, plan, {"rstd": rstd})


def _layer_norm_impl(x: Tensor, weight: Optional[Tensor], bias: Optional[Tensor], eps: Optional[float],
                     dtype: Optional[torch.dtype] = None, plan: Optional[str] = None) -> Tuple[Tensor, Tensor, Tensor]:
    return _pkg._launch("layer_norm", x, None, weight, bias, eps, plan, None, dtype, False, _MEAN_RSTD)


_layer_norm = torch.library.custom_op("tile::layer_norm", mutates_args=())(_layer_norm_impl)


@torch.library.custom_op("tile::layer_norm_out", mutates_args=("out", "mean", "rstd"))
def _layer_norm_out(x: Tensor, weight: Optional[Tensor], bias: Optional[Tensor], eps: Optional[float], out: Tensor,
                    mean: Optional[Tensor], rstd: Optional[Tensor], plan: Optional[str] = None) -> None:
    _pkg._launch_with_stats("layer_norm", x, out, weight, bias, eps, plan, {"mean": mean, "rstd": rstd})


@_softmax.register_fake
def _(x, dtype=None, plan=None):
    return x.new_empty(x.shape, dtype=dtype or x.dtype)


@_log_softmax.register_fake
def _(x, dtype=None, plan=None):
    return x.new_empty(x.shape, dtype=dtype or x.dtype)


@_softmax_out.register_fake
def _(x, out, plan=None):
    return None


@_log_softmax_out.register_fake
def _(x, out, plan=None):
    return None


@_rms_norm.register_fake
def _(x, weight, eps, dtype=None, plan=None):
    return (x.new_empty(x.shape, dtype=dtype or x.dtype), *_stats(x, 1))


@_rms_norm_out.register_fake
def _(x, weight, eps, out, rstd, plan=None):
    return None


@_layer_norm.register_fake
def _(x, weight, bias, eps, dtype=None, plan=None):
    return (x.new_empty(x.shape, dtype=dtype or x.dtype), *_stats(x, 2))


@_layer_norm_out.register_fake
def _(x, weight, bias, eps, out, mean, rstd, plan=None):
    return None


# ---- backward operators: the training operators of the package, found when called ----

def _fresh(outputs, inputs):
    """outputs, each cloned where it shares memory with an input or an earlier output: a custom
    op returns no aliases, and a training operator may reuse a buffer (dx in dy's, ...)."""
    seen = {t.untyped_storage().data_ptr() for t in inputs if isinstance(t, Tensor) and t.numel()}
    out = []
    for t in outputs:
        if t.numel():
            if t.untyped_storage().data_ptr() in seen:
                t = t.clone()
            seen.add(t.untyped_storage().data_ptr())
        out.append(t)
    return tuple(out)


def _zero_grads(*likes):
    return tuple(torch.zeros(shape, dtype=dtype, device=device) for shape, dtype, device in likes)


def _softmax_backward_impl(y: Tensor, dy: Tensor, dtype: Optional[torch.dtype] = None) -> Tensor:
    out = torch.empty(y.shape, dtype=dtype or dy.dtype, device=y.device)
    if out.numel():
        _training("softmax_backward", "the gradient of tile.softmax")(y, dy, out=out)
    return out


def _log_softmax_backward_impl(y: Tensor, dy: Tensor, dtype: Optional[torch.dtype] = None) -> Tensor:
    out = torch.empty(y.shape, dtype=dtype or dy.dtype, device=y.device)
    if out.numel():
        _training("log_softmax_backward", "the gradient of tile.log_softmax")(y, dy, out=out)
    return out


def _rms_norm_backward_impl(dy: Tensor, x: Tensor, weight: Optional[Tensor], rstd: Tensor) -> Tuple[Tensor, Tensor]:
    # Without a weight, dweight is an empty tensor (a custom op returns no None).
    w_like = ((0,), x.dtype, x.device) if weight is None else (weight.shape, weight.dtype, weight.device)
    if x.numel() == 0:                           # no element: every gradient is an empty sum
        return _zero_grads((x.shape, x.dtype, x.device), w_like)
    dx, dw = _training("rms_norm_backward", "the gradient of tile.rms_norm")(dy, x, weight, rstd)
    dx = dx.to(x.dtype).contiguous()
    dw = torch.zeros(w_like[0], dtype=w_like[1], device=w_like[2]) if dw is None else dw.to(w_like[1])
    return _fresh((dx, dw), (dy, x, weight, rstd))


def _layer_norm_backward_impl(dy: Tensor, x: Tensor, weight: Optional[Tensor], bias: Optional[Tensor], mean: Tensor,
                              rstd: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
    likes = [((0,), x.dtype, x.device) if p is None else (p.shape, p.dtype, p.device) for p in (weight, bias)]
    if x.numel() == 0:
        return _zero_grads((x.shape, x.dtype, x.device), *likes)
    dx, dw, db = _training("layer_norm_backward", "the gradient of tile.layer_norm")(dy, x, weight, bias, mean, rstd)
    grads = [dx.to(x.dtype).contiguous()]
    for g, (shape, dtype, device) in zip((dw, db), likes):
        grads.append(torch.zeros(shape, dtype=dtype, device=device) if g is None else g.to(dtype))
    return _fresh(grads, (dy, x, weight, bias, mean, rstd))


_softmax_backward = torch.library.custom_op("tile::softmax_backward", mutates_args=())(_softmax_backward_impl)
_log_softmax_backward = torch.library.custom_op("tile::log_softmax_backward", mutates_args=())(
    _log_softmax_backward_impl)
_rms_norm_backward = torch.library.custom_op("tile::rms_norm_backward", mutates_args=())(_rms_norm_backward_impl)
_layer_norm_backward = torch.library.custom_op("tile::layer_norm_backward", mutates_args=())(
    _layer_norm_backward_impl)


@_softmax_backward.register_fake
def _(y, dy, dtype=None):
    return y.new_empty(y.shape, dtype=dtype or dy.dtype)


@_log_softmax_backward.register_fake
def _(y, dy, dtype=None):
    return y.new_empty(y.shape, dtype=dtype or dy.dtype)


@_rms_norm_backward.register_fake
def _(dy, x, weight, rstd):
    return x.new_empty(x.shape), (x.new_empty((0,)) if weight is None else weight.new_empty(weight.shape))


@_layer_norm_backward.register_fake
def _(dy, x, weight, bias, mean, rstd):
    return (x.new_empty(x.shape), *(x.new_empty((0,)) if p is None else p.new_empty(p.shape) for p in (weight, bias)))


# ---- autograd ----

def _backward(ctx, name):
    """The backward operator a gradient formula calls: on the eager autograd path (ctx.eager)
    while no graph of the backward is recorded, the op's own implementation (the same kernels,
    without the dispatcher); else the custom op — under torch.compile and compiled autograd, and
    with create_graph, where the op (it has no autograd formula) refuses a double backward."""
    if getattr(ctx, "eager", False) and not _grad_enabled() and not _is_compiling():
        return _BACKWARD_IMPLS[name]
    return getattr(torch.ops.tile, name)


def _softmax_setup(ctx, inputs, output):
    ctx.x_dtype = inputs[0].dtype
    ctx.save_for_backward(output)


def _softmax_grad(ctx, dy):
    (y,) = ctx.saved_tensors
    return _backward(ctx, "softmax_backward")(y, dy.contiguous(), ctx.x_dtype), None, None


def _log_softmax_grad(ctx, dy):
    (y,) = ctx.saved_tensors
    return _backward(ctx, "log_softmax_backward")(y, dy.contiguous(), ctx.x_dtype), None, None


def _rms_norm_setup(ctx, inputs, output):
    x, weight = inputs[0], inputs[1]
    _, rstd = output
    ctx.mark_non_differentiable(rstd)
    ctx.save_for_backward(x, weight, rstd)


def _rms_norm_grad(ctx, dy, _drstd):
    x, weight, rstd = ctx.saved_tensors
    dx, dw = _backward(ctx, "rms_norm_backward")(dy.contiguous(), x, weight, rstd)
    return dx, (dw if weight is not None and ctx.needs_input_grad[1] else None), None, None, None


def _layer_norm_setup(ctx, inputs, output):
    x, weight, bias = inputs[0], inputs[1], inputs[2]
    _, mean, rstd = output
    ctx.mark_non_differentiable(mean, rstd)
    ctx.save_for_backward(x, weight, bias, mean, rstd)


def _layer_norm_grad(ctx, dy, _dmean, _drstd):
    x, weight, bias, mean, rstd = ctx.saved_tensors
    dx, dw, db = _backward(ctx, "layer_norm_backward")(dy.contiguous(), x, weight, bias, mean, rstd)
    dw = dw if weight is not None and ctx.needs_input_grad[1] else None
    db = db if bias is not None and ctx.needs_input_grad[2] else None
    return dx, dw, db, None, None, None


_softmax.register_autograd(_softmax_grad, setup_context=_softmax_setup)
_log_softmax.register_autograd(_log_softmax_grad, setup_context=_softmax_setup)
_rms_norm.register_autograd(_rms_norm_grad, setup_context=_rms_norm_setup)
_layer_norm.register_autograd(_layer_norm_grad, setup_context=_layer_norm_setup)


# ---- the fused and loss operators of the package, with their gradients ----

def _fused_add_rms_norm_impl(x: Tensor, residual: Tensor, weight: Optional[Tensor],
                             eps: float) -> Tuple[Tensor, Tensor, Tensor]:
    fn = _training("fused_add_rms_norm", "tile.fused_add_rms_norm")
    y, residual_out, rstd = fn(x, residual, weight=weight, eps=eps, return_rstd=True)
    return _fresh((y.to(x.dtype), residual_out.to(residual.dtype), rstd.to(_stat_dtype(x))), (x, residual, weight))


_fused_add_rms_norm = torch.library.custom_op("tile::fused_add_rms_norm", mutates_args=())(_fused_add_rms_norm_impl)


@torch.library.custom_op("tile::fused_add_rms_norm_", mutates_args=("x", "residual"))
def _fused_add_rms_norm_(x: Tensor, residual: Tensor, weight: Optional[Tensor], eps: float) -> None:
    _training("fused_add_rms_norm", "tile.fused_add_rms_norm")(x, residual, weight=weight, eps=eps, in_place=True)


def _fused_add_rms_norm_backward_impl(dy: Tensor, dresidual_out: Tensor, residual_out: Tensor,
                                      weight: Optional[Tensor], rstd: Tensor,
                                      x_dtype: torch.dtype) -> Tuple[Tensor, Tensor, Tensor]:
    s = residual_out
    w_like = ((0,), s.dtype) if weight is None else (weight.shape, weight.dtype)
    if s.numel() == 0:
        return (torch.zeros(s.shape, dtype=x_dtype, device=s.device), torch.zeros_like(s),
                torch.zeros(w_like[0], dtype=w_like[1], device=s.device))
    fused = getattr(_pkg, "fused_add_rms_norm_backward", None)
    if fused is not None:
        dx, dres, dw = getattr(fused, "_tile_direct", fused)(dy, dresidual_out, residual_out, weight, rstd)
    else:                                        # d(x + residual) = rms_norm's dx + the sum's own gradient
        dn, dw = _training("rms_norm_backward", "the gradient of tile.fused_add_rms_norm")(dy, s, weight, rstd)
        dx = dres = dn.float() + dresidual_out.float()
    dw = torch.zeros(w_like[0], dtype=w_like[1], device=s.device) if dw is None else dw.to(w_like[1])
    return _fresh((dx.to(x_dtype).contiguous(), dres.to(s.dtype).contiguous(), dw),
                  (dy, dresidual_out, residual_out, weight, rstd))


_fused_add_rms_norm_backward = torch.library.custom_op("tile::fused_add_rms_norm_backward", mutates_args=())(
    _fused_add_rms_norm_backward_impl)


def _cross_entropy_impl(logits: Tensor, target: Tensor, ignore_index: int, reduction: str, label_smoothing: float,
                        z_loss: float, softcap: Optional[float]) -> Tuple[Tensor, Tensor]:
    rows = logits.shape[:-1]
    if rows.numel() == 0:                        # no row: torch's mean is NaN, its sum 0
        loss = torch.full(() if reduction != "none" else rows, float("nan") if reduction == "mean" else 0.0,
                          dtype=_stat_dtype(logits), device=logits.device)
        return loss, torch.empty(rows, dtype=_stat_dtype(logits), device=logits.device)
    loss, lse = _training("cross_entropy", "tile.cross_entropy")(
        logits, target, ignore_index=ignore_index, reduction=reduction, label_smoothing=label_smoothing,
        z_loss=z_loss, softcap=softcap, return_lse=True)
    return _fresh((loss.to(_stat_dtype(logits)).reshape(rows if reduction == "none" else ()),
                   lse.to(_stat_dtype(logits)).reshape(rows)), (logits, target))


_cross_entropy = torch.library.custom_op("tile::cross_entropy", mutates_args=())(_cross_entropy_impl)


def _cross_entropy_backward_impl(dloss: Tensor, logits: Tensor, target: Tensor, lse: Tensor, ignore_index: int,
                                 reduction: str, label_smoothing: float, z_loss: float,
                                 softcap: Optional[float]) -> Tensor:
    if logits.numel() == 0:
        return torch.zeros_like(logits)
    dlogits = _training("cross_entropy_backward", "the gradient of tile.cross_entropy")(
        dloss, logits, target, lse, ignore_index=ignore_index, reduction=reduction,
        label_smoothing=label_smoothing, z_loss=z_loss, softcap=softcap)
    return _fresh((dlogits.to(logits.dtype).contiguous(),), (dloss, logits, target, lse))[0]


_cross_entropy_backward = torch.library.custom_op("tile::cross_entropy_backward", mutates_args=())(
    _cross_entropy_backward_impl)


@_fused_add_rms_norm.register_fake
def _(x, residual, weight, eps):
    return x.new_empty(x.shape), residual.new_empty(residual.shape), *_stats(x, 1)


@_fused_add_rms_norm_.register_fake
def _(x, residual, weight, eps):
    return None


@_fused_add_rms_norm_backward.register_fake
def _(dy, dresidual_out, residual_out, weight, rstd, x_dtype):
    s = residual_out
    return (s.new_empty(s.shape, dtype=x_dtype), s.new_empty(s.shape),
            s.new_empty((0,)) if weight is None else weight.new_empty(weight.shape))


@_cross_entropy.register_fake
def _(logits, target, ignore_index, reduction, label_smoothing, z_loss, softcap):
    rows = logits.shape[:-1]
    return (logits.new_empty(rows if reduction == "none" else (), dtype=_stat_dtype(logits)),
            logits.new_empty(rows, dtype=_stat_dtype(logits)))


@_cross_entropy_backward.register_fake
def _(dloss, logits, target, lse, ignore_index, reduction, label_smoothing, z_loss, softcap):
    return logits.new_empty(logits.shape)


def _fused_setup(ctx, inputs, output):
    x, residual, weight = inputs[0], inputs[1], inputs[2]
    _, residual_out, rstd = output
    ctx.mark_non_differentiable(rstd)
    ctx.x_dtype = x.dtype
    ctx.save_for_backward(residual_out, weight, rstd)


def _fused_grad(ctx, dy, dresidual_out, _drstd):
    s, weight, rstd = ctx.saved_tensors
    dx, dres, dw = _backward(ctx, "fused_add_rms_norm_backward")(dy.contiguous(), dresidual_out.contiguous(), s, weight,
                                                              rstd, ctx.x_dtype)
    return dx, dres, (dw if weight is not None and ctx.needs_input_grad[2] else None), None


def _cross_entropy_setup(ctx, inputs, output):
    logits, target, *options = inputs
    _, lse = output
    ctx.mark_non_differentiable(lse)
    ctx.options = options
    ctx.save_for_backward(logits, target, lse)


def _cross_entropy_grad(ctx, dloss, _dlse):
    logits, target, lse = ctx.saved_tensors
    dlogits = _backward(ctx, "cross_entropy_backward")(dloss.contiguous(), logits, target, lse, *ctx.options)
    return dlogits, None, None, None, None, None, None


_fused_add_rms_norm.register_autograd(_fused_grad, setup_context=_fused_setup)
_cross_entropy.register_autograd(_cross_entropy_grad, setup_context=_cross_entropy_setup)


# ---- the eager autograd path ----

_BACKWARD_IMPLS = {
    "softmax_backward": _softmax_backward_impl,
    "log_softmax_backward": _log_softmax_backward_impl,
    "rms_norm_backward": _rms_norm_backward_impl,
    "layer_norm_backward": _layer_norm_backward_impl,
    "fused_add_rms_norm_backward": _fused_add_rms_norm_backward_impl,
    "cross_entropy_backward": _cross_entropy_backward_impl,
}


def _eager_function(name, impl, setup, grad):
    """A torch.autograd.Function taking the custom op's arguments (positionally): forward its
    implementation, setup and backward its registered formulas, the backward op called as
    _backward says. ctx.eager tells _backward which path the node is on: a class attribute of
    the node (its ctx), set once rather than on every call. The setup runs inside forward, as in
    the Function torch generates for the custom op: a separate setup_context makes apply() bind
    the arguments with inspect.signature, about 12 us a call."""
    def forward(ctx, *args):
        output = impl(*args)
        setup(ctx, args, output)
        return output

    cls = type(f"Eager_{name}", (torch.autograd.Function,),
               {"forward": staticmethod(forward), "backward": staticmethod(grad)})
    cls._backward_cls.eager = True
    return cls


# Each differentiable op's eager path, by name; .apply takes the custom op's arguments.
_EAGER = {
    "softmax": _eager_function("softmax", _softmax_impl, _softmax_setup, _softmax_grad),
    "log_softmax": _eager_function("log_softmax", _log_softmax_impl, _softmax_setup, _log_softmax_grad),
    "rms_norm": _eager_function("rms_norm", _rms_norm_impl, _rms_norm_setup, _rms_norm_grad),
    "layer_norm": _eager_function("layer_norm", _layer_norm_impl, _layer_norm_setup, _layer_norm_grad),
    "fused_add_rms_norm": _eager_function("fused_add_rms_norm", _fused_add_rms_norm_impl, _fused_setup, _fused_grad),
    "cross_entropy": _eager_function("cross_entropy", _cross_entropy_impl, _cross_entropy_setup,
                                     _cross_entropy_grad),
}


# Their apply, looked up once.
_EAGER_APPLY = {name: fn.apply for name, fn in _EAGER.items()}


# ---- the package's functions on the custom-op path (tile/__init__.py routes here) ----

def _plan(op, plan):
    # JSON written out by hand for a dict: torch.compile traces this (it cannot trace json.dumps).
    if not isinstance(plan, dict):
        return _call.plan_json(op, plan)
    fields = []
    for key, value in plan.items():
        if not isinstance(key, str):
            return _call.plan_json(op, plan)     # raises, naming the key
        value = _call._plan_value(op, key, value)
        if isinstance(value, bool):
            text = "true" if value else "false"
        elif isinstance(value, str):
            text = '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
        else:
            text = "null" if value is None else str(value)
        fields.append('"' + key.replace("\\", "\\\\").replace('"', '\\"') + '":' + text)
    return "{" + ",".join(fields) + "}"


def _check_dim(op, x, dim):
    if dim != -1 and dim != x.dim() - 1:
        raise ValueError(f"{op}: argument 'dim': expected -1 or {x.dim() - 1} (the last dimension; Tile reduces "
                         f"over rows), got {dim}")


def _out_dtype(op, x, out, dtype):
    if dtype is None:
        return None
    d = _pkg._out_dtype(op, x, dtype)
    if out is not None and out.dtype != d:
        raise ValueError(f"{op}: argument 'dtype': expected None or out's dtype {out.dtype}, got {dtype}")
    return d


def _plain_grad(x):
    """True for the common eager autograd call: x a plain tensor requiring grad, grad mode on,
    no tracing and no torch.func transform (eager_grad's conditions, for x alone)."""
    return (type(x) is Tensor and x.requires_grad and _grad_enabled() and not _is_compiling()
            and not _functorch_active())


def softmax(x, dim, out, plan, stream, dtype, op="softmax"):
    if out is None and stream is None and dim == -1 and _plain_grad(x):
        # What the checks below would find: no DTensor, no out=, the current stream.
        return _EAGER_APPLY[op](x, None if dtype is None else _out_dtype(op, x, None, dtype), plan)
    refuse_dtensor(op, x=x, out=out)
    _check_dim(op, x, dim)
    d = _out_dtype(op, x, out, dtype)
    with _stream(op, stream, x):
        if out is not None:
            refuse_grad(op, "a call with out=", x=x)
            (_softmax_out if op == "softmax" else _log_softmax_out)(x, out, _plan(op, plan))
            return out
        if eager_grad(x):
            return _EAGER[op].apply(x, d, plan)
        return (_softmax if op == "softmax" else _log_softmax)(x, d, _plan(op, plan))


def log_softmax(x, dim, out, plan, stream, dtype):
    return softmax(x, dim, out, plan, stream, dtype, "log_softmax")


def rms_norm(x, weight, eps, out, plan, stream, dtype, return_rstd):
    if (out is None and stream is None and _plain_grad(x)
            and (weight is None or type(weight) is Tensor or type(weight) is _Parameter)):
        y, rstd = _EAGER_APPLY["rms_norm"](x, weight, eps, None if dtype is None else
                                           _out_dtype("rms_norm", x, None, dtype), plan)
        return (y, rstd) if return_rstd else y
    refuse_dtensor("rms_norm", x=x, weight=weight, out=out)
    d = _out_dtype("rms_norm", x, out, dtype)
    with _stream("rms_norm", stream, x):
        if out is not None:
            refuse_grad("rms_norm", "a call with out=", x=x, weight=weight)
            rstd = x.new_empty(_rows(x), dtype=_stat_dtype(x)) if return_rstd else None
            _rms_norm_out(x, weight, eps, out, rstd, _plan("rms_norm", plan))
            return (out, rstd) if return_rstd else out
        if eager_grad(x, weight):
            y, rstd = _EAGER["rms_norm"].apply(x, weight, eps, d, plan)
        else:
            y, rstd = _rms_norm(x, weight, eps, d, _plan("rms_norm", plan))
    return (y, rstd) if return_rstd else y


def layer_norm(x, weight, bias, eps, out, plan, stream, dtype, return_stats):
    if (out is None and stream is None and _plain_grad(x)
            and (weight is None or type(weight) is Tensor or type(weight) is _Parameter)
            and (bias is None or type(bias) is Tensor or type(bias) is _Parameter)):
        y, mean, rstd = _EAGER_APPLY["layer_norm"](x, weight, bias, eps, None if dtype is None else
                                                   _out_dtype("layer_norm", x, None, dtype), plan)
        return (y, mean, rstd) if return_stats else y
    refuse_dtensor("layer_norm", x=x, weight=weight, bias=bias, out=out)
    d = _out_dtype("layer_norm", x, out, dtype)
    with _stream("layer_norm", stream, x):
        if out is not None:
            refuse_grad("layer_norm", "a call with out=", x=x, weight=weight, bias=bias)
            mean, rstd = _stats(x, 2) if return_stats else (None, None)
            _layer_norm_out(x, weight, bias, eps, out, mean, rstd, _plan("layer_norm", plan))
            return (out, mean, rstd) if return_stats else out
        if eager_grad(x, weight, bias):
            y, mean, rstd = _EAGER["layer_norm"].apply(x, weight, bias, eps, d, plan)
        else:
            y, mean, rstd = _layer_norm(x, weight, bias, eps, d, _plan("layer_norm", plan))
    return (y, mean, rstd) if return_stats else y


def fused_add_rms_norm(x, residual, weight=None, eps=1e-6, in_place=False):
    """tile.fused_add_rms_norm on the custom-op path: (y, residual_out)."""
    if in_place:
        refuse_grad("fused_add_rms_norm", "the in-place form (in_place=True)", x=x, residual=residual, weight=weight)
        _fused_add_rms_norm_(x, residual, weight, eps)
        return x, residual
    fn = _EAGER["fused_add_rms_norm"].apply if eager_grad(x, residual, weight) else _fused_add_rms_norm
    y, residual_out, _ = fn(x, residual, weight, eps)
    return y, residual_out


def cross_entropy(logits, target, ignore_index=-100, reduction="mean", label_smoothing=0.0, z_loss=0.0, softcap=None,
                  return_lse=False):
    """tile.cross_entropy on the custom-op path: the loss, or (loss, lse) with return_lse."""
    if isinstance(target, Tensor) and (target.is_floating_point() or target.is_complex()):
        raise TypeError(f"cross_entropy: argument 'target': expected class indices (int32 or int64; Tile has no "
                        f"class-probability targets), got dtype {target.dtype}")
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"cross_entropy: argument 'reduction': expected 'mean', 'sum' or 'none', got {reduction!r}")
    fn = _EAGER["cross_entropy"].apply if eager_grad(logits, target) else _cross_entropy
    loss, lse = fn(logits, target, int(ignore_index), reduction, float(label_smoothing), float(z_loss),
                   None if softcap is None else float(softcap))
    return (loss, lse) if return_lse else loss


def _backward_op(name, op):
    def call(y, dy, out=None):
        dx = op(y, dy, None if out is None else out.dtype)
        if out is None:
            return dx
        refuse_grad(name, "a call with out=", y=y, dy=dy)
        out.copy_(dx)
        return out
    return call


# The training operators of the package on this path, by name (tile/__init__.py wraps each
# function of these names that the package defines).
TRAINING = {name: _refusing_dtensor(name, fn) for name, fn in {
    "fused_add_rms_norm": fused_add_rms_norm,
    "cross_entropy": cross_entropy,
    "softmax_backward": _backward_op("softmax_backward", _softmax_backward),
    "log_softmax_backward": _backward_op("log_softmax_backward", _log_softmax_backward),
    "rms_norm_backward": lambda dy, x, weight, rstd: _none_for_empty(_rms_norm_backward(dy, x, weight, rstd), weight),
    "layer_norm_backward": lambda dy, x, weight, bias, mean, rstd: _none_for_empty(
        _layer_norm_backward(dy, x, weight, bias, mean, rstd), weight, bias),
}.items()}


def _none_for_empty(grads, *params):
    # The public backward functions return None where the parameter is absent.
    dx, *rest = grads
    return (dx, *(None if p is None else g for g, p in zip(rest, params)))


def call(name, *args, **kwargs):
    """A training operator of the package, on the path route_any picks (the modules use this);
    fused_add_rms_norm and cross_entropy through tile._torch_C first where it is loaded."""
    if (name in _pkg._EXT_TRAINING and _pkg._ext is not None and not _pkg._ext_off()
            and getattr(_pkg, name, None) is not None):   # None: this version has no such operator
        result = getattr(_pkg._ext, name)(args, kwargs)
        if result is not None:
            return result
    if route_any(args, kwargs):
        return TRAINING[name](*args, **kwargs)
    return _training(name, f"tile.{name}")(*args, **kwargs)


# ---- precompile ----

def _leaves(value, leaves):
    """value with every floating-point torch tensor replaced by a detached copy requiring grad."""
    if isinstance(value, Tensor) and value.is_floating_point():
        leaf = value.detach().requires_grad_()
        leaves.append(leaf)
        return leaf
    return value


def run_with_backward(fn, args, kwargs):
    """Runs fn once with its floating-point inputs requiring grad, then its backward with
    gradients of ones for every differentiable output: the kernels of both are built."""
    leaves = []
    args = tuple(_leaves(a, leaves) for a in args)
    kwargs = {k: (v if k == "out" else _leaves(v, leaves)) for k, v in kwargs.items()}
    with torch.enable_grad():
        result = fn(*args, **kwargs)
        results = result if isinstance(result, (tuple, list)) else (result,)
        outputs = [r for r in results if isinstance(r, Tensor) and r.requires_grad]
    if not outputs:
        raise ValueError(f"precompile: backward=True, but {getattr(fn, '__name__', fn)} returned no differentiable "
                         f"output for these arguments")
    torch.autograd.grad(outputs, leaves, [torch.ones_like(o) for o in outputs], allow_unused=True)


def capturing():
    """True while the current CUDA stream is being captured into a graph."""
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


_pkg._init_torch(torch)   # when this module was imported before the package saw torch
