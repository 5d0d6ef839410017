"""The training operators from Python: backward passes, fused residual-add RMSNorm and
cross-entropy (include/tile/training.hpp), each a call of the library's row program with its
outputs allocated like its inputs: numpy arrays on the CPU backend, torch tensors on their
device. Formulas, special values and aliasing: docs/source/training.md.

    dx = tile.softmax_backward(y, dy)
    y, rstd = tile.rms_norm(x, weight=w, return_rstd=True)
    dx, dw = tile.rms_norm_backward(dy, x, w, rstd)
    loss, lse = tile.cross_entropy(logits, target, return_lse=True)
    dlogits = tile.cross_entropy_backward(dloss, logits, target, lse)
    loss = tile.cross_entropy_fused(logits, target)     # logits now hold dlogits
"""

import math
import numbers
import struct
import sys

from . import _call, _tile

__all__ = ["softmax_backward", "log_softmax_backward", "rms_norm_backward", "layer_norm_backward",
           "fused_add_rms_norm", "fused_add_rms_norm_backward", "cross_entropy", "cross_entropy_backward",
           "cross_entropy_fused"]

RMS_NORM_EPS = 1e-6
_REDUCTIONS = ("none", "sum", "mean")
# Each (program name, label smoothing, softcap) once: the program and its declarations.
_PROGRAMS = {}


def _program(name, label_smoothing=False, softcap=False):
    key = (name, label_smoothing, softcap)
    entry = _PROGRAMS.get(key)
    if entry is None:
        p = _tile.Program.library(name, label_smoothing, softcap)
        entry = _PROGRAMS[key] = (p, _call.Info(p))
    return entry


def _run(name, operands, dtypes=None, plan=None, stream=None, label_smoothing=False, softcap=False, given_as=None,
         caller=None):
    """One call: operands by name (None: an absent optional operand); outputs not named are
    allocated. Returns the operands as called, outputs included. An error names what the
    caller gave: `given_as` maps an operand to the argument it came from (launch's labels: dx
    from out=, dbias shaped like bias), `caller` the function called where that is not `name`
    (cross-entropy's count pass checks the caller's own logits and target)."""
    p, info = _program(name, label_smoothing, softcap)
    try:
        ops = _call.prepare(info, operands, dtypes, labels=given_as)
        _call.launch(p, info, ops, plan, stream, False, given_as)
    except (ValueError, TypeError) as e:
        if caller is None or type(e) not in (ValueError, TypeError) or not str(e).startswith(name + ": "):
            raise
        raise type(e)(caller + str(e)[len(name):]) from None
    return ops[0]


def _given(**operands):
    """The operands that are not None (a required output left to allocate is left out)."""
    return {k: v for k, v in operands.items() if v is not None}


def _dtype(a):
    return None if a is None else a.dtype


def softmax_backward(y, dy, out=None, plan=None, stream=None):
    """dx = y * (dy - sum(y * dy)) over the last dimension, y = softmax(x); dx like dy. out may
    be dy itself."""
    return _run("softmax_backward", _given(y=y, dy=dy, dx=out), {"dx": _dtype(dy)} if out is None else None,
                plan, stream, given_as={"dx": "out"})["dx"]


def log_softmax_backward(y, dy, out=None, plan=None, stream=None):
    """dx = dy - exp(y) * sum(dy) over the last dimension, y = log_softmax(x); dx like dy. out
    may be dy itself."""
    return _run("log_softmax_backward", _given(y=y, dy=dy, dx=out), {"dx": _dtype(dy)} if out is None else None,
                plan, stream, given_as={"dx": "out"})["dx"]


def _columns_like(like):
    """An empty per-column output shaped and typed like `like` (a weight or bias), on its device."""
    if _call._is_torch(like):
        return _call._torch().empty_like(like)
    np = sys.modules.get("numpy")
    if np is not None and isinstance(like, np.ndarray):
        return np.empty_like(like)
    raise TypeError(f"expected a numpy array or a torch tensor for a weight or bias, got {_call._type_name(like)}")


def rms_norm_backward(dy, x, weight, rstd, out=None, plan=None, stream=None):
    """From y = x * rstd * weight (rstd saved by rms_norm(..., return_rstd=True)): (dx,
    dweight), dx like dy (out may be dy itself), dweight summed over the rows in weight's dtype,
    None without a weight."""
    ops = _given(dy=dy, x=x, rstd=rstd, dx=out)
    ops["weight"] = weight
    ops["dweight"] = None if weight is None else _columns_like(weight)
    ops = _run("rms_norm_backward", ops, None, plan, stream, given_as={"dx": "out"})
    return ops["dx"], ops["dweight"]


def layer_norm_backward(dy, x, weight, bias, mean, rstd, out=None, plan=None, stream=None):
    """From y = (x - mean) * rstd * weight + bias (mean, rstd saved by layer_norm(...,
    return_stats=True)): (dx, dweight, dbias), dx like dy (out may be dy itself); dweight and
    dbias summed over the rows in the dtypes of weight and bias, None where those are None."""
    ops = _given(dy=dy, x=x, mean=mean, rstd=rstd, dx=out)
    ops["weight"] = weight
    ops["dweight"] = None if weight is None else _columns_like(weight)
    ops["dbias"] = None if bias is None else _columns_like(bias)
    ops = _run("layer_norm_backward", ops, None, plan, stream, given_as={"dx": "out", "dbias": "bias"})
    return ops["dx"], ops["dweight"], ops["dbias"]


def fused_add_rms_norm(x, residual, weight=None, eps=RMS_NORM_EPS, in_place=False, return_rstd=False, plan=None,
                       stream=None):
    """residual_out = x + residual (summed in float32, stored in residual's dtype) and y =
    rms_norm(x + residual) * weight (in x's dtype): (y, residual_out), or (y, residual_out,
    rstd) with return_rstd. in_place=True writes residual_out into residual and y into x, and
    returns those (vLLM's contract)."""
    _call.refuse_eps_none("fused_add_rms_norm", eps)
    ops = {"x": x, "residual": residual, "weight": weight, "eps": eps}
    if in_place:
        ops["y"], ops["residual_out"] = x, residual
    if not return_rstd:
        ops["rstd"] = None
    ops = _run("fused_add_rms_norm", ops, None if in_place else {"residual_out": _dtype(residual)}, plan, stream)
    return (ops["y"], ops["residual_out"], ops["rstd"]) if return_rstd else (ops["y"], ops["residual_out"])


def fused_add_rms_norm_backward(dy, dresidual_out, residual_out, weight, rstd, plan=None, stream=None):
    """The gradient of both outputs of fused_add_rms_norm: with dh = rms_norm_backward(dy,
    residual_out, weight, rstd) + dresidual_out (None: 0), (dx, dresidual, dweight): dx = dh in
    dy's dtype, dresidual = dh in residual_out's dtype, dweight in weight's dtype (None without a
    weight)."""
    ops = _given(dy=dy, residual_out=residual_out, rstd=rstd)
    ops["dresidual_out"], ops["weight"] = dresidual_out, weight
    ops["dweight"] = None if weight is None else _columns_like(weight)
    ops = _run("fused_add_rms_norm_backward", ops, {"dresidual": _dtype(residual_out)}, plan, stream)
    return ops["dx"], ops["dresidual"], ops["dweight"]


# ---- cross-entropy ----

def _check_ce(op, logits, target, ignore_index, reduction, label_smoothing, z_loss, softcap):
    if not isinstance(reduction, str) or reduction not in _REDUCTIONS:
        raise (ValueError if isinstance(reduction, str) else TypeError)(
            f"{op}: argument 'reduction': expected one of 'none', 'sum', 'mean', got {reduction!r}")
    if isinstance(ignore_index, bool) or not isinstance(ignore_index, numbers.Integral):
        raise TypeError(f"{op}: argument 'ignore_index': expected an integer, got {_call._type_name(ignore_index)} "
                        f"{ignore_index!r}")
    if abs(int(ignore_index)) > 2**53:   # the kernels read it as a double
        raise ValueError(f"{op}: argument 'ignore_index': expected an integer of magnitude at most 2^53, got "
                         f"{int(ignore_index)}")
    for name, v in (("label_smoothing", label_smoothing), ("z_loss", z_loss), ("softcap", softcap)):
        if v is not None:
            _call.scalar(op, name, v)
    if softcap is not None and not softcap > 0:
        raise ValueError(f"{op}: argument 'softcap': expected a finite value > 0, or None, got {softcap!r}")
    _call.check_array(op, "logits", logits)
    _call.check_array(op, "target", target, "i32 i64")
    shape = tuple(getattr(logits, "shape", ()))
    if len(shape) >= 1 and shape[-1] > (1 << 24):   # the kernels compare targets in float32
        raise ValueError(f"{op}: argument 'logits': expected at most 2^24 columns (classes), got {shape[-1]}")
    # Host targets are cheap to read: one out of [0, cols) that is not ignored is an error here;
    # on the GPU it makes its row's loss and gradient NaN (no host synchronisation).
    t = None
    np = sys.modules.get("numpy")
    if np is not None and isinstance(target, np.ndarray):
        t = target
    elif _call._is_torch(target) and target.device.type == "cpu":
        t = target.detach().numpy()
    if t is not None and t.dtype.kind in "iu" and len(shape) >= 1 and t.shape == shape[:-1]:
        flat = t.reshape(-1)
        bad = (flat != ignore_index) & ((flat < 0) | (flat >= shape[-1]))
        if bad.any():
            r = int(bad.argmax())
            raise ValueError(f"{op}: argument 'target': expected class indices in [0, {shape[-1]}) or ignore_index "
                             f"({ignore_index}), got {int(flat[r])} at row {r}")


def _scalars(ignore_index, label_smoothing, z_loss, softcap):
    s = {"ignore_index": int(ignore_index), "z_loss": z_loss}
    if label_smoothing:
        s["label_smoothing"] = label_smoothing
    if softcap is not None:
        s["softcap"] = softcap
    return s


def _variant(label_smoothing, softcap):
    return {"label_smoothing": bool(label_smoothing), "softcap": softcap is not None}


def _scalar_out(op, name, like):
    """A 0-d float32 array (float64 for float64 logits) on `like`'s device (a reduced loss, a count)."""
    return _call.allocate(op, name, like, "logits", (), _call.stat_dtype(like))


def _float32_holds(f):
    """f rounds to a float32 without overflowing to inf or underflowing to 0."""
    try:
        f = float(f)
        r = struct.unpack("f", struct.pack("f", f))[0]
    except OverflowError:  # beyond a double (10**400), or (on some Pythons) rounding to inf
        return False
    return (r != 0 or f == 0) and (math.isfinite(r) or not math.isfinite(f))


def _broadcast_rows(op, name, v, logits, per_row):
    """v as a per-row input: one value per row, or (per_row False) one value for every row, as a
    stride-0 view (no copy, no host synchronisation). A number becomes a float32 array (float64
    for float64 logits)."""
    rows = tuple(logits.shape[:-1])
    if isinstance(v, bool) or not (isinstance(v, numbers.Real) or hasattr(v, "shape")):
        raise TypeError(f"{op}: argument '{name}': expected a number or an array, got {_call._type_name(v)} {v!r}")
    if isinstance(v, numbers.Real):
        long = _call._LONG_NAME[_call.stat_dtype(logits)]
        if long == "float32" and not _float32_holds(v):
            given = repr(v) if len(repr(v)) <= 40 else f"{repr(v)[:20]}... ({len(repr(v))} digits)"
            raise ValueError(f"{op}: argument '{name}': expected a number float32 holds (0, or a magnitude from "
                             f"1.4e-45 to 3.4e+38, or inf or nan), got {given}")
        if _call._is_torch(logits):
            v = _call._torch().full((), float(v), dtype=getattr(_call._torch(), long), device=logits.device)
        else:
            v = sys.modules["numpy"].full((), v, dtype=long)
    if per_row:
        return v
    size = 1
    for d in getattr(v, "shape", ()):
        size *= d
    if not hasattr(v, "shape") or size != 1:
        raise ValueError(f"{op}: argument '{name}': expected one value (a 0-d or one-element array) for this reduction, "
                         f"got shape {tuple(getattr(v, 'shape', ()))}")
    if _call._is_torch(v):
        return v.reshape(()).expand(rows)
    return sys.modules["numpy"].broadcast_to(v.reshape(()), rows)


def _count(op, logits, target, scalars, variant, plan, stream):
    """The number of rows whose target is not ignore_index, as a 0-d float array on the device:
    cross_entropy with no output but its count reads only the targets."""
    count = _scalar_out(op, "count", logits)
    _run("cross_entropy", dict(logits=logits, target=target, loss=None, lse=None, loss_sum=None, loss_mean=None,
                               count=count, **scalars), None, plan, stream, **variant, caller=op)
    return count


def cross_entropy(logits, target, ignore_index=-100, reduction="mean", label_smoothing=0.0, z_loss=0.0, softcap=None,
                  return_lse=False, plan=None, stream=None):
    """Cross-entropy of each row of logits (..., C) against its target class (int32 or int64,
    shaped like the rows) as torch.nn.functional.cross_entropy defines it, with label smoothing,
    a z-loss z_loss * lse^2 per row and a Gemma 2 softcap (logits -> softcap * tanh(logits /
    softcap)) first. Rows whose target is ignore_index add 0. Returns the float32 loss (float64
    for float64 logits): per row
    for reduction 'none', else a 0-d array (the sum, or the mean over the rows not ignored); with
    return_lse, (loss, lse), lse the log-sum-exp of each row."""
    op = "cross_entropy"
    _check_ce(op, logits, target, ignore_index, reduction, label_smoothing, z_loss, softcap)
    ops = dict(logits=logits, target=target, loss=None, loss_sum=None, loss_mean=None, count=None,
               **_scalars(ignore_index, label_smoothing, z_loss, softcap))
    if not return_lse:
        ops["lse"] = None
    key = _loss_operand(op, ops, reduction, logits)
    out = _run(op, ops, None, plan, stream, **_variant(label_smoothing, softcap))
    return (out[key], out["lse"]) if return_lse else out[key]


def _loss_operand(op, ops, reduction, logits):
    """The program's output for the reduction's loss: per row (allocated by the call, one float32
    a row, float64 for float64 logits) or one value (a 0-d array)."""
    key = {"none": "loss", "sum": "loss_sum", "mean": "loss_mean"}[reduction]
    if reduction == "none":
        del ops[key]
    else:
        ops[key] = _scalar_out(op, "loss", logits)
    return key


def cross_entropy_backward(dloss, logits, target, lse, ignore_index=-100, reduction="mean", label_smoothing=0.0,
                           z_loss=0.0, softcap=None, out=None, plan=None, stream=None):
    """dlogits = dloss * d loss / d logits from the lse cross_entropy returned; dloss per row for
    reduction 'none', else one value (a 0-d array or a number). A mean divides by the count of
    rows not ignored, counted on the device. dlogits like logits; out may be logits itself."""
    op = "cross_entropy_backward"
    _check_ce(op, logits, target, ignore_index, reduction, label_smoothing, z_loss, softcap)
    scalars, variant = _scalars(ignore_index, label_smoothing, z_loss, softcap), _variant(label_smoothing, softcap)
    ops = dict(_given(logits=logits, target=target, lse=lse, dlogits=out), **scalars)
    ops["dloss"] = _broadcast_rows(op, "dloss", dloss, logits, reduction == "none")
    if reduction == "mean":
        ops["count"] = _broadcast_rows(op, "count", _count(op, logits, target, scalars, variant, plan, stream), logits,
                                       False)
    return _run(op, ops, None, plan, stream, **variant, given_as={"dlogits": "out"})["dlogits"]


def cross_entropy_fused(logits, target, ignore_index=-100, reduction="mean", label_smoothing=0.0, z_loss=0.0,
                        softcap=None, dloss=None, out=None, return_lse=False, plan=None, stream=None):
    """cross_entropy and its backward in one pass over the logits: returns the loss (and lse) as
    cross_entropy does, and writes dlogits = dloss * d loss / d logits into `out`, by default
    logits itself (the logits are then gone). dloss as cross_entropy_backward takes it; None is
    1. A mean first counts the rows not ignored on the device (a small kernel over the targets)."""
    op = "cross_entropy_fused"
    _check_ce(op, logits, target, ignore_index, reduction, label_smoothing, z_loss, softcap)
    scalars, variant = _scalars(ignore_index, label_smoothing, z_loss, softcap), _variant(label_smoothing, softcap)
    ops = dict(logits=logits, target=target, dlogits=logits if out is None else out, loss=None, loss_sum=None,
               loss_mean=None, **scalars)
    if not return_lse:
        ops["lse"] = None
    key = _loss_operand(op, ops, reduction, logits)
    if dloss is not None:
        ops["dloss"] = _broadcast_rows(op, "dloss", dloss, logits, reduction == "none")
    if reduction == "mean":
        ops["count"] = _broadcast_rows(op, "count", _count(op, logits, target, scalars, variant, plan, stream), logits,
                                       False)
    result = _run(op, ops, None, plan, stream, **variant, given_as=None if out is None else {"dlogits": "out"})
    return (result[key], result["lse"]) if return_lse else result[key]
