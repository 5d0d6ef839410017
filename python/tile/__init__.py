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

With torch: the operators differentiate when inputs require grad, are torch.library custom
ops (torch.ops.tile.*) under torch.compile, and tile.nn holds drop-in modules (tile/_torch_ops.py,
tile/nn.py); where the optional extension tile._torch_C is built, their eager calls on torch
tensors go through it in C++ (python/src/torch_ext.cpp). TILE_LOG=1 reports every JIT compile
(tile/_log.py).
"""
import functools
import importlib
import json
import os
import numbers
import sys

from . import _call, _log, _tile, monoid
from ._program import (Axis, Expr, Operand, RowProgram, abs, builtin, eq, exp, exponent, ldexp, le, log, logical_and,
                       logical_not, logical_or, lt, maximum, minimum, ne, rsqrt, sqrt, tanh, to_f32, training_programs)
from ._training import (cross_entropy, cross_entropy_backward, cross_entropy_fused, fused_add_rms_norm,
                        fused_add_rms_norm_backward, layer_norm_backward, log_softmax_backward, rms_norm_backward,
                        softmax_backward)

__all__ = [
    "softmax", "log_softmax", "rms_norm", "layer_norm", "run", "plan", "ir", "source",
    "softmax_backward", "log_softmax_backward", "rms_norm_backward", "layer_norm_backward", "fused_add_rms_norm",
    "fused_add_rms_norm_backward", "cross_entropy", "cross_entropy_backward", "cross_entropy_fused",
    "RowProgram", "Operand", "Expr", "Axis", "monoid", "builtin", "training_programs",
    "exp", "log", "sqrt", "rsqrt", "abs", "tanh", "maximum", "minimum", "to_f32", "eq", "ne", "lt", "le",
    "logical_and", "logical_or", "logical_not", "exponent", "ldexp",
    "clear_kernel_caches", "cache_dir", "nvrtc_version", "nvrtc_library", "device_info", "build_info",
    "driver_available", "InternalError", "precompile",
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
                "bfloat16": "bfloat16", "bf16": "bfloat16", "float64": "float64", "f64": "float64"}

_torch = _call._torch
_is_torch = _call._is_torch
_is_numpy = _call._is_numpy
_type_name = _call._type_name

# tile/_torch_ops.py and its route(), once torch is loaded: a call whose arrays need autograd or
# are traced by torch.compile goes there (its eager autograd Functions or its custom ops); None
# while torch is not loaded.
_torch_api = None
_routed = None
# tile._torch_C, the operators' C++ entry for torch tensors (python/src/torch_ext.cpp), where it
# was built for the torch loaded: the operators call it first, outside torch.compile tracing,
# and it returns None for a call it leaves to the paths here. `_ext_status` says why it is or
# is not used (build_info()["torch_extension"]).
_ext = None
_ext_status = "not loaded: torch is not loaded"
_ext_off = None  # True for a call that must take the paths here (see _load_torch_extension)


def _init_torch(torch):
    """Switches the torch paths on: the fast launch, the custom ops and the routing to them."""
    global _torch_api, _routed
    if _torch_api is not None or not isinstance(getattr(torch, "Tensor", None), type):
        return                                  # set up already, or not torch (a docs build's stand-in)
    _call.init_torch(torch)
    if not hasattr(torch.library, "register_autograd"):   # torch.library's custom ops came in 2.4
        why = f"tile's torch integration needs torch >= 2.5 (found {torch.__version__})"
        _routed = functools.partial(_unsupported_torch, why)
        return
    from . import _torch_ops as api
    if hasattr(api, "route"):                   # else it is being imported; its last line calls this
        _torch_api, _routed = api, api.route
        _load_torch_extension(torch)


def _load_torch_extension(torch):
    """Loads tile._torch_C where it was built for this torch and TILE_TORCH_EXTENSION does not
    switch it off. Its backward nodes call the custom ops of _torch_ops (registered by now)."""
    global _ext, _ext_status, _ext_off
    setting = os.environ.get("TILE_TORCH_EXTENSION", "").strip().lower()
    if setting in ("0", "off", "false", "no"):
        _ext_status = f"not used: TILE_TORCH_EXTENSION={os.environ['TILE_TORCH_EXTENSION']}"
        return
    try:
        # import_module, not `from . import`: while the package is still being imported, the
        # latter reports a missing module as a circular import.
        _torch_C = importlib.import_module(f"{__name__}._torch_C")
    except ImportError as e:
        missing = isinstance(e, ModuleNotFoundError) and e.name == f"{__name__}._torch_C"
        _ext_status = "not built (TILE_TORCH_EXTENSION=ON builds it)" if missing else f"not loaded: {e}"
        return
    if _torch_C.TORCH_VERSION != torch.__version__:
        _ext_status = f"not used: built for torch {_torch_C.TORCH_VERSION}, this is torch {torch.__version__}"
        return
    # Calls take the paths here while torch.compile or torch.export traces, and while compile
    # reports are wanted (tile.precompile collecting, the "tile" logger at INFO: TILE_LOG): the
    # extension launches through libtile.so and reports no compile.
    is_compiling, collectors, enabled = torch.compiler.is_compiling, _log._collectors, _log.logger.isEnabledFor

    def ext_off():
        return is_compiling() or bool(collectors) or enabled(20)  # 20: logging.INFO

    _ext_off = ext_off
    _ext, _ext_status = _torch_C, "loaded"


def _unsupported_torch(why, x=None, w=None, b=None):
    # Without the custom ops a gradient or a compiled graph would be lost: say so instead.
    torch = _torch()
    if isinstance(x, torch.Tensor) and (torch.compiler.is_compiling() or (torch.is_grad_enabled() and any(
            a is not None and a.requires_grad for a in (x, w, b)))):
        raise RuntimeError(why)
    return False


_call.torch_hooks.append(_init_torch)


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
            raise ValueError(f"{op}: argument 'dtype': expected float32, float64, float16 or bfloat16, got {name!r}")
        name = _DTYPE_NAMES[name]
    if _is_torch(x):
        torch = _torch()
        d = getattr(torch, name) if name else dtype
        if not isinstance(d, torch.dtype) or str(d).split(".")[-1] not in ("float32", "float64", "float16", "bfloat16"):
            raise ValueError(f"{op}: argument 'dtype': expected float32, float64, float16 or bfloat16, got {dtype!r}")
        return d
    if name == "bfloat16":
        raise ValueError(f"{op}: argument 'dtype': expected float32, float64 or float16 for a numpy output "
                         "(numpy has no bfloat16), got 'bfloat16'")
    np = sys.modules["numpy"]
    try:
        d = np.dtype(name if name else dtype)
    except TypeError:
        d = None
    # `is None` first: numpy compares None equal to float64 (np.dtype(None) is float64).
    if d is None or d not in (np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.float16)):
        raise ValueError(f"{op}: argument 'dtype': expected float32, float64 or float16 for a numpy output, "
                         f"got {dtype!r}")
    return d


def _allocate(op, x, dtype):
    if _is_torch(x):
        return _torch().empty(x.shape, dtype=_out_dtype(op, x, dtype), device=x.device)
    if _is_numpy(x):
        return sys.modules["numpy"].empty(x.shape, dtype=_out_dtype(op, x, dtype))
    raise TypeError(f"{op}: argument 'out': expected an output array when x is neither a numpy array nor a torch "
                    f"tensor, got None (x is {type(x).__name__})")


def _dim_index(op, dim):
    """dim as an int: an integer of any integer type, never a float or a bool (as torch)."""
    if isinstance(dim, bool) or not isinstance(dim, numbers.Integral):
        raise TypeError(f"{op}: argument 'dim': expected an integer, got {type(dim).__name__} {dim!r}")
    return int(dim)


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


def _result(op, out, stats, rec, record):
    if rec is not None:
        _log.event(op, rec)
        if record:
            rec["out"] = out
            return rec
    return (out, *stats) if stats else out


def _empty_result(op, x, out, weight, bias, dtype, record, stats=(), given=None):
    """A call on rows of no columns, which the library refuses (cols >= 1): what torch returns —
    an empty output, and per-row statistics of no values, NaN — after the checks the library
    would make of the arguments."""
    if _call.tile_dtype_name(getattr(x, "dtype", None)) not in ("f32", "f64", "f16", "bf16"):
        raise ValueError(f"{op}: argument 'x': expected dtype float32, float64, float16 or bfloat16, got {x.dtype}")
    for arg, a in (("weight", weight), ("bias", bias)):
        if a is not None and tuple(a.shape) != (0,):
            raise ValueError(f"{op}: argument '{arg}': expected shape (0,) with stride 1 (one element per column), "
                             f"got shape {tuple(a.shape)}")
    out = _checked_out(op, x, out, weight, bias, dtype)
    if tuple(out.shape) != tuple(x.shape):
        raise ValueError(f"{op}: argument 'out': expected shape {tuple(x.shape)} like x, got shape {tuple(out.shape)}")
    if given is not None:
        extra = tuple(a for a in given.values() if a is not None)
    else:
        extra = tuple(_call.allocate(op, name, x, "x", tuple(x.shape[:-1]), _call.stat_dtype(x)) for name in stats)
    for a in extra:
        a.fill_(float("nan")) if _is_torch(a) else a.fill(float("nan"))
    if record:                                  # a record of nothing launched
        rec = dict.fromkeys(("kernel_name", "source_sha256", "ir_sha256", "cubin_sha256", "arch", "cache_origin"), "")
        rec.update(plan=None, kernels=0, workspace_bytes=0, groups=0, threads_per_group=0, shared_bytes=0,
                   bytes_loaded=0, vector_accesses=0, scalar_accesses=0, compile_ms=0.0, compile_options=[], out=out,
                   backend="cuda" if _is_torch(x) and x.is_cuda else "cpu")
        return rec
    return (out, *extra) if extra else out


def _launch(op, x, out, weight, bias, eps, plan, stream, dtype, record, stats=()):
    # The common case inline: torch CUDA tensors cross as plain integers instead of a DLPack
    # capsule each, whose making and reading cost microseconds per call. launch_raw converts
    # and checks what launch does, and replays a call it has seen with other data pointers
    # (python.md, "Host overhead"); what this path does not read (another framework's array,
    # a CPU or sparse tensor, an unsupported dtype) goes the DLPack way, whose checks name it.
    if not (isinstance(x, _call.Tensor) and x.is_cuda):
        if _call.Tensor is _call._NoTorch and _is_torch(x):   # torch was imported after tile
            _init_torch(_torch())
            return _launch(op, x, out, weight, bias, eps, plan, stream, dtype, record, stats)
        return _launch_dlpack(op, x, out, weight, bias, eps, plan, stream, dtype, record, stats)
    try:
        device = x.get_device()
        shape = x.shape
        code = _call.RAW_CODES[x.dtype]
        empty = shape[-1] == 0                  # IndexError for a 0-d x: the DLPack path names it
        ops = {"x": (x.data_ptr(), shape, x.stride(), code, device)}
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
    if empty:
        return _empty_result(op, x, out, weight, bias, dtype, record, stats)
    if dtype is not None:
        if out is not None:
            _check_out_dtype(op, x, out, dtype)
        else:
            out = _allocate(op, x, dtype)
            code = _call.RAW_CODES.get(out.dtype)
            if code is None:                    # e.g. torch.float64: the DLPack path names it
                return _launch_dlpack(op, x, out, weight, bias, eps, plan, stream, None, record, stats)
            ops["y"] = (out.data_ptr(), shape, out.stride(), code, device)
    elif out is None:
        # x's own dtype, so x's dtype code; contiguous, so strides like a contiguous x's.
        out = _call.empty_like(x, memory_format=_call.contiguous)
        ops["y"] = (out.data_ptr(), shape, out.stride(), code, device)
    extra = ()
    if stats:                                   # per-row statistics (float32, float64 for float64 x), like x's rows
        rows = shape[:-1]
        empty_stats = _call.empty
        stat = _call.float64 if x.dtype == _call.float64 else _call.float32
        stat_code = _call.RAW_CODES[stat]
        dev = x.device
        extra = tuple([empty_stats(rows, dtype=stat, device=dev) for _ in stats])
        for name, t in zip(stats, extra):
            ops[name] = (t.data_ptr(), rows, t.stride(), stat_code, device)
    if eps is not None:
        ops["eps"] = eps if type(eps) is float else _call.scalar(op, "eps", eps)
    if plan is not None:
        plan = _call.plan_json(op, plan)
    handle = _call.current_stream(device) if stream is None else _call.stream_handle(op, stream, True)
    if _call.current_device() == device:
        rec = _tile.launch_raw(_PROGRAMS[op], ops, plan, handle, record, _LABELS, True)
    else:                                       # the library launches into the current context
        with _torch().cuda.device(device):
            rec = _tile.launch_raw(_PROGRAMS[op], ops, plan, handle, record, _LABELS, True)
    if rec is None and not extra:               # the common call, without a function call more
        return out
    return _result(op, out, extra, rec, record)


def _launch_dlpack(op, x, out, weight, bias, eps, plan, stream, dtype, record, stats=()):
    torch = _torch()
    if torch is not None and isinstance(x, torch.Tensor) and _call.Tensor is _call._NoTorch:
        _init_torch(torch)
    if eps is not None:
        eps = _call.scalar(op, "eps", eps)
    plan = _call.plan_json(op, plan)
    _call.check_array(op, "x", x)
    if len(x.shape) and x.shape[-1] == 0:
        return _empty_result(op, x, out, weight, bias, dtype, record, stats)
    out = _checked_out(op, x, out, weight, bias, dtype)
    ops = {"x": x, "y": out}
    if weight is not None:
        ops["weight"] = weight
    if bias is not None:
        ops["bias"] = bias
    if eps is not None:
        ops["eps"] = eps
    extra = tuple(_call.allocate(op, name, x, "x", tuple(x.shape[:-1]), _call.stat_dtype(x)) for name in stats)
    ops.update(zip(stats, extra))
    rec = _call.launch_dlpack(_PROGRAMS[op], ops, x, plan, stream, record, _LABELS, op)
    return _result(op, out, extra, rec, record)


_INFOS = {}


def _launch_with_stats(op, x, out, weight, bias, eps, plan, stats):
    """A call with its output and per-row statistics given (None: not computed): the out=
    forms of the custom ops."""
    if len(x.shape) and x.shape[-1] == 0:
        return _empty_result(op, x, out, weight, bias, None, False, given=stats)
    info = _INFOS.get(op) or _INFOS.setdefault(op, _call.Info(_PROGRAMS[op]))
    ops = {"x": x, "y": out, **stats}
    for name, v in (("weight", weight), ("bias", bias), ("eps", eps)):
        if v is not None:
            ops[name] = v
    _call.launch(_PROGRAMS[op], info, (ops, x), _call.plan_json(op, plan), None, False, _LABELS)


def run(op, x, out=None, weight=None, bias=None, eps=None, plan=None, stream=None, dtype=None):
    """Runs `op` ("softmax", "log_softmax", "rms_norm", "layer_norm") and returns its launch record.

    The record is a dict: plan (the resolved mapping plan), kernel_name, source_sha256,
    cubin_sha256 and arch (empty on the CPU), groups, threads_per_group, shared_bytes,
    bytes_loaded, vector_accesses and scalar_accesses (CPU only), cache_origin ("compiled",
    "memory", "disk" or "launch-cache"; empty on the CPU), compile_ms, compile_options,
    backend ("cpu" or "cuda"), and out (the output array).
    """
    _check_op("run", op)
    if _torch_api is not None:
        _torch_api.refuse_grad(f"run('{op}')", "tile.run (a launch record)", x=x, weight=weight, bias=bias)
    return _launch(op, x, out, weight, bias, eps, plan, stream, dtype, True)


def softmax(x, dim=-1, out=None, plan=None, stream=None, dtype=None):
    """``exp(x - max) / sum(exp(x - max))`` over the last dimension."""
    if type(dim) is not int:
        dim = _dim_index("softmax", dim)
    if _ext is not None and not _ext_off():
        y = _ext.softmax(x, dim, out, plan, stream, dtype)
        if y is not None:
            return y
    if _routed is not None and _routed(x):
        return _torch_api.softmax(x, dim, out, plan, stream, dtype)
    if dim != -1:
        _check_dim("softmax", x, dim)
    return _launch("softmax", x, out, None, None, None, plan, stream, dtype, False)


def log_softmax(x, dim=-1, out=None, plan=None, stream=None, dtype=None):
    """``x - max - log(sum(exp(x - max)))`` over the last dimension."""
    if type(dim) is not int:
        dim = _dim_index("log_softmax", dim)
    if _ext is not None and not _ext_off():
        y = _ext.log_softmax(x, dim, out, plan, stream, dtype)
        if y is not None:
            return y
    if _routed is not None and _routed(x):
        return _torch_api.log_softmax(x, dim, out, plan, stream, dtype)
    if dim != -1:
        _check_dim("log_softmax", x, dim)
    return _launch("log_softmax", x, out, None, None, None, plan, stream, dtype, False)


def rms_norm(x, weight=None, eps=RMS_NORM_EPS, out=None, plan=None, stream=None, dtype=None, return_rstd=False):
    """``x * rsqrt(mean(x^2) + eps) [* weight]`` over the last dimension; with return_rstd, also
    ``rsqrt(mean(x^2) + eps)`` per row (float32, float64 for float64 x; shaped like x's rows):
    ``(out, rstd)``."""
    _call.refuse_eps_none("rms_norm", eps)
    if _ext is not None and not _ext_off():
        y = _ext.rms_norm(x, weight, eps, out, plan, stream, dtype, return_rstd)
        if y is not None:
            return y
    if _routed is not None and _routed(x, weight):
        return _torch_api.rms_norm(x, weight, eps, out, plan, stream, dtype, return_rstd)
    return _launch("rms_norm", x, out, weight, None, eps, plan, stream, dtype, False,
                   ("rstd",) if return_rstd else ())


def layer_norm(x, weight=None, bias=None, eps=LAYER_NORM_EPS, out=None, plan=None, stream=None, dtype=None,
               return_stats=False):
    """``(x - mean) * rsqrt(var + eps) [* weight] [+ bias]`` over the last dimension; with
    return_stats, also the mean and ``rsqrt(var + eps)`` per row (float32, float64 for float64 x;
    shaped like x's rows):
    ``(out, mean, rstd)``."""
    _call.refuse_eps_none("layer_norm", eps)
    if _ext is not None and not _ext_off():
        y = _ext.layer_norm(x, weight, bias, eps, out, plan, stream, dtype, return_stats)
        if y is not None:
            return y
    if _routed is not None and _routed(x, weight, bias):
        return _torch_api.layer_norm(x, weight, bias, eps, out, plan, stream, dtype, return_stats)
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
    if _ext is not None:
        _ext.clear_replays()
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
    cuda (False when built with TILE_WITH_CUDA=OFF: CUDA arrays and the NVRTC functions raise),
    torch_extension ("loaded" where the operators' eager calls on torch tensors enter tile._torch_C,
    else why not)."""
    info = _tile.build_info()
    info["torch_extension"] = _ext_status
    return info


def precompile(fn, *args, backward=False, **kwargs):
    """Builds ahead of time the kernels that ``fn(*args, **kwargs)`` launches — lowered,
    compiled (or read from the disk cache) and loaded into the current CUDA context of the
    arrays' device, the second-phase kernel of a reduction over the rows included — so that a
    later CUDA-graph capture of the same call, on any stream, needs no warm-up call: with torch
    tensors, a call's workspace comes from torch's allocator at each call, captures included.
    It runs the call once, like any call (outputs not given are allocated and dropped); the
    kernels depend on the shapes, dtypes and alignment of the arrays, so pass arrays like those
    of the calls to come.

    fn is an operator (``tile.softmax``, the name ``"softmax"``, a training operator) or a
    ``tile.RowProgram``. With ``backward=True`` (torch tensors), the floating-point inputs are
    made to require grad and the backward runs too, building the backward operators' kernels.
    Refused during a capture. Returns the kernels this call compiled or loaded, as dicts: op,
    kernel, cache_origin, cache_hit, compile_ms, arch, plan (empty when all were loaded
    already, and on the CPU backend, which compiles nothing).
    """
    if isinstance(fn, str):
        target = globals().get(fn)
        if fn.startswith("_") or not callable(target) or fn not in _OPS + tuple(_TRAINING):
            raise ValueError(f"precompile: argument 'fn': expected an operator name ({', '.join(_OPS)}, or a "
                             f"training operator this version provides) or a callable, got {fn!r}")
        fn = target
    if not callable(fn):
        raise TypeError(f"precompile: argument 'fn': expected a tile operator or row program, got {_type_name(fn)}")
    if _torch_api is not None and _torch_api.capturing():
        raise RuntimeError("precompile: a CUDA-graph capture is underway on the current stream; call "
                           "tile.precompile before capturing")
    with _log.collect() as events:
        if backward:
            if _torch_api is None:
                raise ValueError("precompile: backward=True needs torch tensors (torch is not loaded)")
            _torch_api.run_with_backward(fn, args, kwargs)
        elif _torch_api is not None:
            with _torch().no_grad():
                fn(*args, **kwargs)
        else:
            fn(*args, **kwargs)
    return events


def __getattr__(name):
    # tile.nn (torch modules) on first use, so that `import tile` never imports torch.
    if name == "nn":
        return importlib.import_module(".nn", __name__)
    raise AttributeError(f"module 'tile' has no attribute {name!r}")


# The training operators, where this version defines them, differentiate and trace like the
# forward operators: each is wrapped so that torch tensors needing autograd or traced by
# torch.compile take its custom op (tile/_torch_ops.py); `_tile_direct` keeps the function itself.
# Keep this after every operator's definition (test_torch_autograd.py checks it).
_TRAINING = ("fused_add_rms_norm", "cross_entropy", "softmax_backward", "log_softmax_backward", "rms_norm_backward",
             "layer_norm_backward")


# The training operators tile._torch_C takes (as (args, kwargs); None: the paths here take it).
_EXT_TRAINING = ("fused_add_rms_norm", "cross_entropy")


def _differentiable(name, direct):
    entry = name in _EXT_TRAINING

    @functools.wraps(direct)
    def call(*args, **kwargs):
        if entry and _ext is not None and not _ext_off():
            result = getattr(_ext, name)(args, kwargs)
            if result is not None:
                return result
        if _torch_api is not None and _torch_api.route_any(args, kwargs):
            return _torch_api.TRAINING[name](*args, **kwargs)
        if _routed is not None and _torch_api is None:   # a torch too old for the custom ops
            _routed(next((a for a in args if _is_torch(a)), None))   # raises where a gradient is needed
        return direct(*args, **kwargs)
    call._tile_direct = direct
    return call


for _name in _TRAINING:
    if callable(globals().get(_name)) and not hasattr(globals()[_name], "_tile_direct"):
        globals()[_name] = _differentiable(_name, globals()[_name])

_log.configure_from_environment()

if "torch" in sys.modules:
    _init_torch(sys.modules["torch"])
else:
    # torch imported after tile: the custom ops must exist before torch.compile traces a call,
    # which may be the first call (tile/_after_import.py).
    from . import _after_import
    _after_import.call_after_import("torch", _init_torch)
