"""Tile: generated row-reduction kernels (softmax, log-softmax, RMSNorm, LayerNorm).

Arrays travel through DLPack without copies: numpy (CPU) arrays run on the CPU backend, torch
CUDA tensors on the CUDA backend. The reduction runs over the last dimension, which must be
contiguous; the leading dimensions must flatten to rows of one stride. Outputs are allocated
with the input's framework when ``out`` is None.

    y = tile.softmax(x)                               # new array, like x
    tile.rms_norm(x, weight=w, out=x)                 # in place
    tile.plan("layer_norm", x, weight=w, bias=b)      # the resolved mapping plan, as a dict
"""

import json
import sys

from . import _tile

__all__ = [
    "softmax", "log_softmax", "rms_norm", "layer_norm", "run", "plan", "ir", "source",
    "clear_kernel_caches", "cache_dir", "nvrtc_version", "device_info", "build_info",
    "driver_available",
]

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


def _check_array(op, arg, a):
    if not hasattr(a, "__dlpack__"):
        raise TypeError(f"{op}: argument '{arg}': expected an array exporting DLPack (numpy, torch, ...), "
                        f"got {type(a).__name__}")
    if _is_numpy(a) and arg == "out" and not a.flags.writeable:
        raise ValueError(f"{op}: argument 'out': expected a writable array, got a read-only numpy array")


def _for_dlpack(a):
    # Tensors that require grad refuse DLPack export; detach() is a view of the same memory.
    if _is_torch(a) and a.requires_grad:
        return a.detach()
    return a


def _out_dtype(op, x, dtype):
    if dtype is None:
        return x.dtype
    name = dtype if isinstance(dtype, str) else None
    if name is not None:
        if name not in _DTYPE_NAMES:
            raise ValueError(f"{op}: argument 'dtype': expected float32, float16 or bfloat16, got {name!r}")
        name = _DTYPE_NAMES[name]
    if _is_torch(x):
        return getattr(_torch(), name) if name else dtype
    if name == "bfloat16":
        raise ValueError(f"{op}: argument 'dtype': expected float32 or float16 for a numpy output "
                         "(numpy has no bfloat16), got 'bfloat16'")
    return sys.modules["numpy"].dtype(name if name else dtype)


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


def _plan_json(op, plan):
    if plan is None:
        return None
    if isinstance(plan, str):
        return plan
    if isinstance(plan, dict):
        return json.dumps(plan)
    raise TypeError(f"{op}: argument 'plan': expected a dict of plan fields, a JSON string or None, "
                    f"got {type(plan).__name__}")


def _stream_handle(op, x, stream):
    """The CUstream to launch on: `stream` if given, else torch's current stream for x's device."""
    if stream is None:
        if _is_torch(x) and x.is_cuda:
            return _torch().cuda.current_stream(x.device).cuda_stream
        return 0
    if isinstance(stream, int):
        handle = stream
    elif hasattr(stream, "cuda_stream"):         # torch.cuda.Stream, torch.cuda.ExternalStream
        handle = stream.cuda_stream
    elif hasattr(stream, "__cuda_stream__"):     # the CUDA stream protocol: (version, handle)
        handle = stream.__cuda_stream__()[1]
    else:
        raise TypeError(f"{op}: argument 'stream': expected an int CUstream handle, a torch.cuda.Stream or None, "
                        f"got {type(stream).__name__}")
    if handle != 0 and not _on_cuda(x):
        raise ValueError(f"{op}: argument 'stream': expected None for arrays on the CPU, got a stream")
    return handle


def _on_cuda(x):
    if _is_torch(x):
        return x.is_cuda
    device = getattr(x, "__dlpack_device__", None)
    return device is not None and device()[0] == 2  # kDLCUDA


class _TorchDevice:
    """Makes x's CUDA device current (the library launches into the current context)."""

    def __init__(self, x):
        self.guard = _torch().cuda.device(x.device) if _is_torch(x) and x.is_cuda else None

    def __enter__(self):
        if self.guard is not None:
            self.guard.__enter__()

    def __exit__(self, *exc):
        if self.guard is not None:
            return self.guard.__exit__(*exc)
        return False


def _arrays(op, x, out, weight, bias, dtype):
    _check_array(op, "x", x)
    for arg, a in (("weight", weight), ("bias", bias)):
        if a is not None:
            _check_array(op, arg, a)
    if out is None:
        out = _allocate(op, x, dtype)
    else:
        _check_array(op, "out", out)
        if dtype is not None and out.dtype != _out_dtype(op, x, dtype):
            raise ValueError(f"{op}: argument 'dtype': expected None or out's dtype {out.dtype}, got {dtype}")
    return out


def run(op, x, out=None, weight=None, bias=None, eps=None, plan=None, stream=None, dtype=None):
    """Runs `op` ("softmax", "log_softmax", "rms_norm", "layer_norm") and returns its launch record.

    The record is a dict: plan (the resolved mapping plan), kernel_name, source_sha256,
    cubin_sha256 and arch (empty on the CPU), groups, threads_per_group, shared_bytes,
    bytes_loaded (CPU only), backend ("cpu" or "cuda"), and out (the output array).
    """
    out = _arrays(op, x, out, weight, bias, dtype)
    handle = _stream_handle(op, x, stream)
    with _TorchDevice(x):
        record = _tile.launch(op, _for_dlpack(x), _for_dlpack(out), _for_dlpack(weight), _for_dlpack(bias),
                              None if eps is None else float(eps), _plan_json(op, plan), handle)
    record["out"] = out
    return record


def softmax(x, dim=-1, out=None, plan=None, stream=None, dtype=None):
    """exp(x - max) / sum(exp(x - max)) over the last dimension."""
    _check_dim("softmax", x, dim)
    return run("softmax", x, out=out, plan=plan, stream=stream, dtype=dtype)["out"]


def log_softmax(x, dim=-1, out=None, plan=None, stream=None, dtype=None):
    """x - max - log(sum(exp(x - max))) over the last dimension."""
    _check_dim("log_softmax", x, dim)
    return run("log_softmax", x, out=out, plan=plan, stream=stream, dtype=dtype)["out"]


def rms_norm(x, weight=None, eps=RMS_NORM_EPS, out=None, plan=None, stream=None, dtype=None):
    """x * rsqrt(mean(x^2) + eps) [* weight] over the last dimension."""
    return run("rms_norm", x, out=out, weight=weight, eps=eps, plan=plan, stream=stream, dtype=dtype)["out"]


def layer_norm(x, weight=None, bias=None, eps=LAYER_NORM_EPS, out=None, plan=None, stream=None, dtype=None):
    """(x - mean) * rsqrt(var + eps) [* weight] [+ bias] over the last dimension."""
    return run("layer_norm", x, out=out, weight=weight, bias=bias, eps=eps, plan=plan, stream=stream,
               dtype=dtype)["out"]


def _introspect(fn, op, x, weight, bias, out, plan, eps, dtype):
    # An output is needed for the plan (its dtype, stride and alignment): allocated if absent.
    out = _arrays(op, x, out, weight, bias, dtype)
    return fn(op, _for_dlpack(x), _for_dlpack(out), _for_dlpack(weight), _for_dlpack(bias),
              None if eps is None else float(eps), _plan_json(op, plan))


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
    """Clears the in-memory NVRTC cache. The disk cache and the library's memo of lowered
    kernels (per operator, dtypes and plan) are kept."""
    _tile.clear_kernel_caches()


def cache_dir():
    """The on-disk kernel cache folder (TILE_CACHE_DIR, ...), or None when none is configured."""
    return _tile.cache_dir()


def nvrtc_version():
    """The NVRTC version libtile.so compiles with, e.g. '13.0'."""
    return _tile.nvrtc_version()


def driver_available():
    """True when the CUDA driver loads and a device exists."""
    return _tile.driver_available()


def device_info(device=0):
    """Properties of CUDA device `device` (name, uuid, arch, sm_count, ...); RuntimeError without a driver."""
    return _tile.device_info(device)


def build_info():
    """version, git_commit (at configure time), library (the libtile.so loaded), nanobind, compiler."""
    return _tile.build_info()
