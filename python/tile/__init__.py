"""Tile: generated row-reduction kernels (softmax, log-softmax, RMSNorm, LayerNorm).

Arrays cross without copies: numpy (CPU) arrays run on the CPU backend, torch CUDA tensors on
the CUDA backend. Torch CUDA tensors pass as plain integers (pointer, shape, strides, dtype,
device); everything else through DLPack. The reduction runs over the last dimension, which must
be contiguous; the leading dimensions must flatten to rows of one stride. Outputs are allocated
with the input's framework when ``out`` is None.

    y = tile.softmax(x)                               # new array, like x
    tile.rms_norm(x, weight=w, out=x)                 # in place
    tile.plan("layer_norm", x, weight=w, bias=b)      # the resolved mapping plan, as a dict
"""

import json
import numbers
import operator
import sys

from . import _tile

__all__ = [
    "softmax", "log_softmax", "rms_norm", "layer_norm", "run", "plan", "ir", "source",
    "clear_kernel_caches", "cache_dir", "nvrtc_version", "nvrtc_library", "device_info", "build_info",
    "driver_available", "InternalError",
]

# A broken invariant inside the library (a RuntimeError): a bug to report, never a bad argument,
# which raises ValueError or TypeError.
InternalError = _tile.InternalError

_OPS = ("softmax", "log_softmax", "rms_norm", "layer_norm")

RMS_NORM_EPS = 1e-6
LAYER_NORM_EPS = 1e-5

_DTYPE_NAMES = {"float32": "float32", "f32": "float32", "float16": "float16", "f16": "float16",
                "bfloat16": "bfloat16", "bf16": "bfloat16"}


def _torch():
    # Imported only when torch is already loaded: numpy-only users never pay for it.
    return sys.modules.get("torch")


def _is_torch(a):
    torch = _torch()
    return torch is not None and isinstance(a, torch.Tensor)


def _is_numpy(a):
    np = sys.modules.get("numpy")
    return np is not None and isinstance(a, np.ndarray)


def _type_name(a):
    t = type(a)
    return t.__qualname__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"


def _check_op(fn, op):
    if not isinstance(op, str) or op not in _OPS:
        raise (ValueError if isinstance(op, str) else TypeError)(
            f"{fn}: argument 'op': expected one of {', '.join(map(repr, _OPS))}, got {op!r}")


def _check_array(op, arg, a):
    if not hasattr(a, "__dlpack__"):
        np = sys.modules.get("numpy")
        what = " (a scalar, not an array)" if np is not None and isinstance(a, np.generic) else ""
        raise TypeError(f"{op}: argument '{arg}': expected an array exporting DLPack (numpy, torch, ...), "
                        f"got {_type_name(a)}{what}")
    if _is_numpy(a):
        np = sys.modules["numpy"]
        # numpy exports neither other byte orders nor structured or object dtypes: say which
        # dtype is expected rather than that DLPack failed.
        t = a.dtype
        if t.fields is None and t.kind in "biufc" and not t.isnative:
            order = "big" if t.byteorder == ">" else "little"
            raise ValueError(f"{op}: argument '{arg}': expected dtype float32, float16 or bfloat16 in native "
                             f"({sys.byteorder}-endian) byte order, got {t.str!r} ({order}-endian; "
                             f".astype(a.dtype.newbyteorder('=')) converts it)")
        if t.fields is not None or t.kind not in "biufc":
            raise ValueError(f"{op}: argument '{arg}': expected dtype float32, float16 or bfloat16, got {t}")
        if isinstance(a, np.ma.MaskedArray):  # DLPack exports the data and drops the mask
            raise TypeError(f"{op}: argument '{arg}': expected an array without a mask, got numpy.ma.MaskedArray "
                            "(its masked elements would be read; .filled(value) chooses what they hold)")
        if arg == "out" and not a.flags.writeable:
            raise ValueError(f"{op}: argument 'out': expected a writable array, got a read-only numpy array")


def _eps(op, eps):
    """eps as a float; its range (0 or what float32 holds) is checked by the library."""
    if eps is None:
        return None
    np = sys.modules.get("numpy")
    if isinstance(eps, bool) or (np is not None and isinstance(eps, np.bool_)) or not isinstance(eps, numbers.Real):
        raise TypeError(f"{op}: argument 'eps': expected a real number (float), got {_type_name(eps)} {eps!r}")
    try:
        return float(eps)
    except OverflowError:                       # an int beyond float: out of range, said as such below
        return float("inf") if eps > 0 else float("-inf")


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
    _check_array(op, "x", x)
    ndim = len(x.shape)
    if dim not in (-1, ndim - 1):
        raise ValueError(f"{op}: argument 'dim': expected -1 or {ndim - 1} (the last dimension; Tile reduces over "
                         f"rows), got {dim}")


def _plan_value(key, value):
    """A plan field's value as JSON takes it: integers of any integer type (numpy's too) as int."""
    np = sys.modules.get("numpy")
    if np is not None and isinstance(value, np.bool_):
        return bool(value)                      # rejected by the library, which names the field
    if value is None or isinstance(value, (str, bool, int)):
        return value
    if hasattr(type(value), "__index__"):       # numpy integer scalars and 0-d integer arrays
        return operator.index(value)
    if isinstance(value, numbers.Real):
        raise ValueError(f"mapping plan: argument '{key}': expected an integer, got {value!r}")
    raise TypeError(f"mapping plan: argument '{key}': expected an integer or a string, got {_type_name(value)}")


def _plan_json(op, plan):
    if plan is None:
        return None
    if isinstance(plan, str):
        return plan
    if isinstance(plan, dict):
        for key in plan:
            if not isinstance(key, str):
                raise TypeError(f"{op}: argument 'plan': expected plan field names as strings, "
                                f"got {key!r} ({_type_name(key)})")
        return json.dumps({key: _plan_value(key, value) for key, value in plan.items()})
    raise TypeError(f"{op}: argument 'plan': expected a dict of plan fields, a JSON string or None, "
                    f"got {_type_name(plan)}")


def _stream_handle(op, stream, on_cuda):
    """The CUstream handle `stream` names (an int, a torch.cuda.Stream, a __cuda_stream__ object)."""
    if stream is None:
        return 0
    if isinstance(stream, int):
        handle = stream
    elif hasattr(stream, "__cuda_stream__"):     # the CUDA stream protocol: (version, handle)
        handle = stream.__cuda_stream__()[1]
    elif isinstance(getattr(stream, "cuda_stream", None), int):  # torch.cuda.Stream, ExternalStream
        handle = stream.cuda_stream
    else:
        raise TypeError(f"{op}: argument 'stream': expected an int CUstream handle, a torch.cuda.Stream or None, "
                        f"got {type(stream).__name__}")
    if handle != 0 and not on_cuda:
        raise ValueError(f"{op}: argument 'stream': expected None for arrays on the CPU, got a stream")
    return handle


def _check_out_dtype(op, x, out, dtype):
    if out.dtype != _out_dtype(op, x, dtype):
        raise ValueError(f"{op}: argument 'dtype': expected None or out's dtype {out.dtype}, got {dtype}")


def _checked_out(op, x, out, weight, bias, dtype):
    for arg, a in (("weight", weight), ("bias", bias)):
        if a is not None:
            _check_array(op, arg, a)
    if out is None:
        return _allocate(op, x, dtype)
    _check_array(op, "out", out)
    if dtype is not None:
        _check_out_dtype(op, x, out, dtype)
    return out


def _to_dlpack(torch, a):
    # The capsule directly: Tensor.__dlpack__ costs microseconds of Python per call, and refuses
    # tensors that require grad (read here as they are; the operators are not differentiable).
    return torch.utils.dlpack.to_dlpack(a) if isinstance(a, torch.Tensor) else a


# The torch fast path, switched on by _init_torch once torch is loaded (it may be imported after
# tile): torch.Tensor, launch_raw's dtype codes by torch dtype, and torch's C entry points for the
# current device and stream, looked up once instead of on every call.
class _NoTorch:
    pass


_Tensor = _NoTorch
_RAW_CODES = {}
_current_device = None
_current_stream = None
_empty_like = None
_contiguous = None


def _init_torch(torch):
    global _Tensor, _RAW_CODES, _current_device, _current_stream, _empty_like, _contiguous
    _RAW_CODES = {getattr(torch, name): code for name, code in _tile.RAW_DTYPE_CODES.items()}
    # Private but long-standing (torch.cuda.current_device and Inductor call them); the public
    # API where a build lacks them.
    _current_device = getattr(torch._C, "_cuda_getDevice", None) or torch.cuda.current_device
    _current_stream = (getattr(torch._C, "_cuda_getCurrentRawStream", None)
                       or (lambda device: torch.cuda.current_stream(device).cuda_stream))
    _empty_like = torch.empty_like
    _contiguous = torch.contiguous_format
    _Tensor = torch.Tensor                      # last: it switches the fast path on


def _raw(a):
    """A torch CUDA tensor as launch_raw reads it; raises for anything else (the DLPack path)."""
    if not a.is_cuda:
        raise TypeError
    return a.data_ptr(), a.shape, a.stride(), _RAW_CODES[a.dtype], a.get_device()


def _launch(op, x, out, weight, bias, eps, plan, stream, dtype, record):
    # The common case inline: torch CUDA tensors cross as plain integers instead of a DLPack
    # capsule each, whose making and reading cost microseconds per call. launch_raw checks what
    # launch checks; what this path does not read (another framework's array, a CPU or sparse
    # tensor, an unsupported dtype) goes the DLPack way, whose checks name the argument.
    if not (isinstance(x, _Tensor) and x.is_cuda):
        return _launch_dlpack(op, x, out, weight, bias, eps, plan, stream, dtype, record)
    try:
        device = x.get_device()
        xr = (x.data_ptr(), x.shape, x.stride(), _RAW_CODES[x.dtype], device)
        if out is not None:
            if not out.is_cuda:
                raise TypeError
            yr = (out.data_ptr(), out.shape, out.stride(), _RAW_CODES[out.dtype], out.get_device())
        wr = None if weight is None else _raw(weight)
        br = None if bias is None else _raw(bias)
    except Exception:
        xr = None                               # outside the handler: no chained traceback
    if xr is None:
        return _launch_dlpack(op, x, out, weight, bias, eps, plan, stream, dtype, record)
    if dtype is not None:
        if out is not None:
            _check_out_dtype(op, x, out, dtype)
        else:
            out = _allocate(op, x, dtype)
            code = _RAW_CODES.get(out.dtype)
            if code is None:                    # e.g. torch.float64: the DLPack path names it
                return _launch_dlpack(op, x, out, weight, bias, eps, plan, stream, None, record)
            yr = (out.data_ptr(), out.shape, out.stride(), code, device)
    elif out is None:
        out = _empty_like(x, memory_format=_contiguous)
        yr = (out.data_ptr(), out.shape, out.stride(), xr[3], device)
    if eps is not None:
        eps = _eps(op, eps)
    if plan is not None:
        plan = _plan_json(op, plan)
    handle = _current_stream(device) if stream is None else _stream_handle(op, stream, True)
    if _current_device() == device:
        rec = _tile.launch_raw(op, xr, yr, wr, br, eps, plan, handle, record)
    else:                                       # the library launches into the current context
        with _torch().cuda.device(device):
            rec = _tile.launch_raw(op, xr, yr, wr, br, eps, plan, handle, record)
    if rec is None:
        return out
    rec["out"] = out
    return rec


def _launch_dlpack(op, x, out, weight, bias, eps, plan, stream, dtype, record):
    torch = _torch()
    eps = _eps(op, eps)
    plan = _plan_json(op, plan)
    if torch is None or not isinstance(x, torch.Tensor):
        _check_array(op, "x", x)
        out = _checked_out(op, x, out, weight, bias, dtype)
        device = getattr(x, "__dlpack_device__", None)
        handle = _stream_handle(op, stream, device is not None and device()[0] == 2)  # kDLCUDA
        rec = _tile.launch(op, x, out, weight, bias, eps, plan, handle, record)
    else:
        if _Tensor is _NoTorch:
            _init_torch(torch)
        out = _checked_out(op, x, out, weight, bias, dtype)
        args = [op, _to_dlpack(torch, x), _to_dlpack(torch, out), _to_dlpack(torch, weight),
                _to_dlpack(torch, bias), eps, plan, 0, record]
        if not x.is_cuda:
            args[7] = _stream_handle(op, stream, False)
            rec = _tile.launch(*args)
        else:
            args[7] = (torch.cuda.current_stream(x.device).cuda_stream if stream is None
                       else _stream_handle(op, stream, True))
            if torch.cuda.current_device() == x.device.index:
                rec = _tile.launch(*args)
            else:                                # the library launches into the current context
                with torch.cuda.device(x.device):
                    rec = _tile.launch(*args)
    if rec is None:
        return out
    rec["out"] = out
    return rec


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


def rms_norm(x, weight=None, eps=RMS_NORM_EPS, out=None, plan=None, stream=None, dtype=None):
    """x * rsqrt(mean(x^2) + eps) [* weight] over the last dimension."""
    return _launch("rms_norm", x, out, weight, None, eps, plan, stream, dtype, False)


def layer_norm(x, weight=None, bias=None, eps=LAYER_NORM_EPS, out=None, plan=None, stream=None, dtype=None):
    """(x - mean) * rsqrt(var + eps) [* weight] [+ bias] over the last dimension."""
    return _launch("layer_norm", x, out, weight, bias, eps, plan, stream, dtype, False)


def _introspect(fn, op, x, weight, bias, out, plan, eps, dtype):
    # An output is needed for the plan (its dtype, stride and alignment): allocated if absent.
    _check_op(fn.__name__, op)
    _check_array(op, "x", x)
    out = _checked_out(op, x, out, weight, bias, dtype)
    torch = _torch()
    if torch is not None:
        x, out, weight, bias = (_to_dlpack(torch, a) for a in (x, out, weight, bias))
    return fn(op, x, out, weight, bias, _eps(op, eps), _plan_json(op, plan))


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
