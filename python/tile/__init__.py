"""Tile: generated row-reduction kernels (softmax, log-softmax, RMSNorm, LayerNorm), their
backward passes, fused residual-add RMSNorm and cross-entropy (tile/_training.py), and row
programs of your own.

Arrays cross without copies: numpy (CPU) arrays run on the CPU backend, torch CUDA tensors on
the CUDA backend. Torch CUDA tensors pass as plain integers (pointer, shape, strides, dtype,
device); everything else through DLPack. The reduction runs over the last dimension, which must
be contiguous; the leading dimensions must flatten to rows of one stride. Outputs are allocated
with the input's framework when not given.

    y = tile.softmax(x)                               # new array, like x
    tile.rms_norm(x, weight=w, out=x)                 # in place
    y, rstd = tile.rms_norm(x, return_rstd=True)      # with 1/rms per row, float32
    tile.plan("layer_norm", x, weight=w, bias=b)      # the resolved mapping plan, as a dict

    p = tile.RowProgram("scaled_softmax")             # a program of your own (tile/_program.py)
    x, y = p.row_in("x"), p.row_out("y")
    v = p.load(x) * 0.5
    m, s = p.reduce2(tile.Axis.cols, tile.monoid.online_softmax(), v)
    p.store(y, tile.exp(v - m) / s)
    out = p(x=x_array)
"""
import json
import sys

from . import _call, _tile, monoid
from ._call import init_torch as _init_torch
from ._program import (Axis, Expr, Operand, RowProgram, abs, builtin, eq, exp, le, log, logical_and, logical_not,
                       logical_or, lt, maximum, minimum, ne, rsqrt, sqrt, tanh, to_f32, training_programs)
from ._training import (cross_entropy, cross_entropy_backward, cross_entropy_fused, fused_add_rms_norm,
                        fused_add_rms_norm_backward, layer_norm_backward, log_softmax_backward, rms_norm_backward,
                        softmax_backward)

__all__ = [
    "softmax", "log_softmax", "rms_norm", "layer_norm", "run", "plan", "ir", "source",
    "softmax_backward", "log_softmax_backward", "rms_norm_backward", "layer_norm_backward", "fused_add_rms_norm",
    "fused_add_rms_norm_backward", "cross_entropy", "cross_entropy_backward", "cross_entropy_fused",
    "RowProgram", "Operand", "Expr", "Axis", "monoid", "builtin", "training_programs",
    "exp", "log", "sqrt", "rsqrt", "abs", "tanh", "maximum", "minimum", "to_f32", "eq", "ne", "lt", "le",
    "logical_and", "logical_or", "logical_not",
    "clear_kernel_caches", "cache_dir", "nvrtc_version", "nvrtc_library", "device_info", "build_info",
    "driver_available", "InternalError",
]

# A broken invariant inside the library (a RuntimeError): a bug to report, never a bad argument,
# which raises ValueError or TypeError.
InternalError = _tile.InternalError

_OPS = ("softmax", "log_softmax", "rms_norm", "layer_norm")
# The built-in operators' programs; their output is called `out` here, `y` by the library.
_PROGRAMS = {op: _tile.Program.builtin(op) for op in _OPS}
_LABELS = {"y": "out"}

RMS_NORM_EPS = 1e-6
LAYER_NORM_EPS = 1e-5

_DTYPE_NAMES = {"float32": "float32", "f32": "float32", "float16": "float16", "f16": "float16",
                "bfloat16": "bfloat16", "bf16": "bfloat16"}

_torch = _call._torch
_is_torch = _call._is_torch
_is_numpy = _call._is_numpy
_type_name = _call._type_name


def _check_op(fn, op):
    if not isinstance(op, str) or op not in _OPS:
        raise (ValueError if isinstance(op, str) else TypeError)(
            f"{fn}: argument 'op': expected one of {', '.join(map(repr, _OPS))}, got {op!r}")


def _out_dtype(op, x, dtype):
    if dtype is None:
        return x.dtype
    name = dtype if isinstance(dtype, str) else None
    if name is not None:
        if name not in _DTYPE_NAMES:
            raise ValueError(f"{op}: argument 'dtype': expected float32, float16 or bfloat16, got {name!r}")
        name = _DTYPE_NAMES[name]
    if _is_torch(x):
        torch = _torch()
        d = getattr(torch, name) if name else dtype
        if not isinstance(d, torch.dtype) or str(d).split(".")[-1] not in ("float32", "float16", "bfloat16"):
            raise ValueError(f"{op}: argument 'dtype': expected float32, float16 or bfloat16, got {dtype!r}")
        return d
    if name == "bfloat16":
        raise ValueError(f"{op}: argument 'dtype': expected float32 or float16 for a numpy output "
                         "(numpy has no bfloat16), got 'bfloat16'")
    np = sys.modules["numpy"]
    try:
        d = np.dtype(name if name else dtype)
    except TypeError:
        d = None
    if d not in (np.dtype(np.float32), np.dtype(np.float16)):
        raise ValueError(f"{op}: argument 'dtype': expected float32 or float16 for a numpy output, got {dtype!r}")
    return d


def _allocate(op, x, dtype):
    if _is_torch(x):
        return _torch().empty(x.shape, dtype=_out_dtype(op, x, dtype), device=x.device)
    if _is_numpy(x):
        return sys.modules["numpy"].empty(x.shape, dtype=_out_dtype(op, x, dtype))
    raise TypeError(f"{op}: argument 'out': expected an output array when x is neither a numpy array nor a torch "
                    f"tensor, got None (x is {type(x).__name__})")


def _check_dim(op, x, dim):
    _call.check_array(op, "x", x)
    ndim = len(x.shape)
    if dim not in (-1, ndim - 1):
        raise ValueError(f"{op}: argument 'dim': expected -1 or {ndim - 1} (the last dimension; Tile reduces over "
                         f"rows), got {dim}")


def _check_out_dtype(op, x, out, dtype):
    if out.dtype != _out_dtype(op, x, dtype):
        raise ValueError(f"{op}: argument 'dtype': expected None or out's dtype {out.dtype}, got {dtype}")


def _checked_out(op, x, out, weight, bias, dtype):
    for arg, a in (("weight", weight), ("bias", bias)):
        if a is not None:
            _call.check_array(op, arg, a)
    if out is None:
        return _allocate(op, x, dtype)
    _call.check_array(op, "out", out, output=True)
    if dtype is not None:
        _check_out_dtype(op, x, out, dtype)
    return out


def _result(out, stats, rec):
    if rec is None:
        return (out, *stats) if stats else out
    rec["out"] = out
    return rec


def _launch(op, x, out, weight, bias, eps, plan, stream, dtype, record, stats=()):
    # The common case inline: torch CUDA tensors cross as plain integers instead of a DLPack
    # capsule each, whose making and reading cost microseconds per call. launch_raw converts
    # and checks what launch does; what this path does not read (another framework's array, a
    # CPU or sparse tensor, an unsupported dtype) goes the DLPack way, whose checks name it.
    if not (isinstance(x, _call.Tensor) and x.is_cuda):
        if _call.Tensor is _call._NoTorch and _is_torch(x):   # torch was imported after tile
            _init_torch(_torch())
            return _launch(op, x, out, weight, bias, eps, plan, stream, dtype, record, stats)
        return _launch_dlpack(op, x, out, weight, bias, eps, plan, stream, dtype, record, stats)
    try:
        device = x.get_device()
        ops = {"x": (x.data_ptr(), x.shape, x.stride(), _call.RAW_CODES[x.dtype], device)}
        if out is not None:
            ops["y"] = _call.raw(out)
        if weight is not None:
            ops["weight"] = _call.raw(weight)
        if bias is not None:
            ops["bias"] = _call.raw(bias)
    except Exception:
        ops = None                              # outside the handler: no chained traceback
    if ops is None:
        return _launch_dlpack(op, x, out, weight, bias, eps, plan, stream, dtype, record, stats)
    if dtype is not None:
        if out is not None:
            _check_out_dtype(op, x, out, dtype)
        else:
            out = _allocate(op, x, dtype)
            code = _call.RAW_CODES.get(out.dtype)
            if code is None:                    # e.g. torch.float64: the DLPack path names it
                return _launch_dlpack(op, x, out, weight, bias, eps, plan, stream, None, record, stats)
            ops["y"] = (out.data_ptr(), out.shape, out.stride(), code, device)
    elif out is None:
        out = _call.empty_like(x, memory_format=_call.contiguous)
        ops["y"] = (out.data_ptr(), out.shape, out.stride(), ops["x"][3], device)
    extra = ()
    if stats:                                   # per-row float32 statistics, shaped like x's rows
        torch = _torch()
        extra = tuple(torch.empty(x.shape[:-1], dtype=torch.float32, device=x.device) for _ in stats)
        for name, t in zip(stats, extra):
            ops[name] = (t.data_ptr(), t.shape, t.stride(), 0, device)
    if eps is not None:
        ops["eps"] = _call.scalar(op, "eps", eps)
    if plan is not None:
        plan = _call.plan_json(op, plan)
    handle = _call.current_stream(device) if stream is None else _call.stream_handle(op, stream, True)
    if _call.current_device() == device:
        rec = _tile.launch_raw(_PROGRAMS[op], ops, plan, handle, record, _LABELS)
    else:                                       # the library launches into the current context
        with _torch().cuda.device(device):
            rec = _tile.launch_raw(_PROGRAMS[op], ops, plan, handle, record, _LABELS)
    return _result(out, extra, rec)


def _launch_dlpack(op, x, out, weight, bias, eps, plan, stream, dtype, record, stats=()):
    torch = _torch()
    if torch is not None and isinstance(x, torch.Tensor) and _call.Tensor is _call._NoTorch:
        _init_torch(torch)
    if eps is not None:
        eps = _call.scalar(op, "eps", eps)
    plan = _call.plan_json(op, plan)
    _call.check_array(op, "x", x)
    out = _checked_out(op, x, out, weight, bias, dtype)
    ops = {"x": x, "y": out}
    if weight is not None:
        ops["weight"] = weight
    if bias is not None:
        ops["bias"] = bias
    if eps is not None:
        ops["eps"] = eps
    extra = tuple(_call.allocate(op, name, x, "x", tuple(x.shape[:-1]), "f32") for name in stats)
    ops.update(zip(stats, extra))
    rec = _call.launch_dlpack(_PROGRAMS[op], ops, x, plan, stream, record, _LABELS, op)
    return _result(out, extra, rec)


def run(op, x, out=None, weight=None, bias=None, eps=None, plan=None, stream=None, dtype=None):
    """Runs `op` ("softmax", "log_softmax", "rms_norm", "layer_norm") and returns its launch record.

    The record is a dict: plan (the resolved mapping plan), kernel_name, source_sha256,
    cubin_sha256 and arch (empty on the CPU), groups, threads_per_group, shared_bytes,
    bytes_loaded (CPU only), cache_origin ("compiled", "memory", "disk" or "launch-cache";
    empty on the CPU), compile_ms, compile_options, backend ("cpu" or "cuda"), and out (the
    output array).
    """
    _check_op("run", op)
    return _launch(op, x, out, weight, bias, eps, plan, stream, dtype, True)


def softmax(x, dim=-1, out=None, plan=None, stream=None, dtype=None):
    """exp(x - max) / sum(exp(x - max)) over the last dimension."""
    if dim != -1:
        _check_dim("softmax", x, dim)
    return _launch("softmax", x, out, None, None, None, plan, stream, dtype, False)


def log_softmax(x, dim=-1, out=None, plan=None, stream=None, dtype=None):
    """x - max - log(sum(exp(x - max))) over the last dimension."""
    if dim != -1:
        _check_dim("log_softmax", x, dim)
    return _launch("log_softmax", x, out, None, None, None, plan, stream, dtype, False)


def rms_norm(x, weight=None, eps=RMS_NORM_EPS, out=None, plan=None, stream=None, dtype=None, return_rstd=False):
    """x * rsqrt(mean(x^2) + eps) [* weight] over the last dimension; with return_rstd, also
    rsqrt(mean(x^2) + eps) per row (float32, shaped like x's rows): (out, rstd)."""
    return _launch("rms_norm", x, out, weight, None, eps, plan, stream, dtype, False,
                   ("rstd",) if return_rstd else ())


def layer_norm(x, weight=None, bias=None, eps=LAYER_NORM_EPS, out=None, plan=None, stream=None, dtype=None,
               return_stats=False):
    """(x - mean) * rsqrt(var + eps) [* weight] [+ bias] over the last dimension; with
    return_stats, also the mean and rsqrt(var + eps) per row (float32, shaped like x's rows):
    (out, mean, rstd)."""
    return _launch("layer_norm", x, out, weight, bias, eps, plan, stream, dtype, False,
                   ("mean", "rstd") if return_stats else ())


def _introspect(fn, op, x, weight, bias, out, plan, eps, dtype):
    # An output is needed for the plan (its dtype, stride and alignment): allocated if absent.
    _check_op(fn.__name__, op)
    _call.check_array(op, "x", x)
    out = _checked_out(op, x, out, weight, bias, dtype)
    ops = {"x": x, "y": out}
    if weight is not None:
        ops["weight"] = weight
    if bias is not None:
        ops["bias"] = bias
    if eps is not None:
        ops["eps"] = _call.scalar(op, "eps", eps)
    return _call.introspect(fn, _PROGRAMS[op], ops, _call.plan_json(op, plan), _LABELS)


def plan(op, x, weight=None, bias=None, out=None, plan=None, eps=None, dtype=None):
    """The resolved mapping plan (a dict) that run() with the same arguments launches."""
    return json.loads(_introspect(_tile.plan, op, x, weight, bias, out, plan, eps, dtype))


def ir(op, x, weight=None, bias=None, out=None, plan=None, eps=None, dtype=None):
    """The raw IR that run() with the same arguments launches."""
    return _introspect(_tile.ir, op, x, weight, bias, out, plan, eps, dtype)


def source(op, x, weight=None, bias=None, out=None, plan=None, eps=None, dtype=None):
    """The generated CUDA source that run() with the same arguments compiles."""
    return _introspect(_tile.source, op, x, weight, bias, out, plan, eps, dtype)


def clear_kernel_caches():
    """Forgets every lowered, compiled and loaded kernel of this process; the next call of each
    kernel lowers and compiles it afresh (or reads it from the disk cache, which is kept)."""
    _tile.clear_kernel_caches()


def cache_dir():
    """The on-disk kernel cache folder (TILE_CACHE_DIR, ...), or None when none is configured."""
    return _tile.cache_dir()


def nvrtc_version():
    """The NVRTC version libtile.so compiles with, e.g. '13.0'; RuntimeError without NVRTC."""
    return _tile.nvrtc_version()


def nvrtc_library():
    """The path of the libnvrtc that libtile.so loaded (found at run time: TILE_NVRTC_LIBRARY, the
    nvidia-cuda-nvrtc wheel, the CUDA toolkit, ...); RuntimeError "no NVRTC found" without one."""
    return _tile.nvrtc_library()


def driver_available():
    """True when the CUDA driver loads and a device exists (never in a build without CUDA)."""
    return _tile.driver_available()


def device_info(device=0):
    """Properties of CUDA device `device` (name, uuid, arch, sm_count, ...); RuntimeError without a driver."""
    return _tile.device_info(device)


def build_info():
    """version, git_commit (at configure time), library (the libtile.so loaded), nanobind, compiler,
    cuda (False when built with TILE_WITH_CUDA=OFF: CUDA arrays and the NVRTC functions raise)."""
    return _tile.build_info()


if "torch" in sys.modules:
    _init_torch(sys.modules["torch"])
