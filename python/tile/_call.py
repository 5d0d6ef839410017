"""One call of a row program from Python: checks the extension cannot make (numpy byte order,
masks, read-only outputs, scalar types), allocates missing outputs, resolves the stream, and
enters the extension by one of two doors: `_tile.launch` (every array through DLPack) or
`_tile.launch_raw` (torch CUDA tensors as plain integers, far cheaper per call). Both convert
the operands by their declared roles and bind them in C++ (python/src/module.cpp). Calls on
torch CUDA tensors that reduce over the rows get their workspace from torch's allocator
(torch_workspace), so CUDA-graph capture never waits on memory the library would allocate."""

import json
import numbers
import operator
import sys

from . import _log, _tile

_ROW = ("row_in", "row_out")
_OUTPUTS = ("row_out", "row_scalar_out", "col_out", "scalar_out")

# Names of dtypes, numpy's, torch's and Tile's, by Tile's name.
_TILE_DTYPE = {"float32": "f32", "f32": "f32", "float16": "f16", "f16": "f16", "bfloat16": "bf16", "bf16": "bf16",
               "int32": "i32", "i32": "i32", "int64": "i64", "i64": "i64", "float64": "f64", "f64": "f64"}
_LONG_NAME = {"f32": "float32", "f16": "float16", "bf16": "bfloat16", "i32": "int32", "i64": "int64",
              "f64": "float64"}


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


def _names(dtypes):
    """'float32, float16 or bfloat16' for Tile's dtype names."""
    long = [_LONG_NAME[d] for d in dtypes]
    return long[0] if len(long) == 1 else ", ".join(long[:-1]) + " or " + long[-1]


def stat_dtype(like):
    """Tile's name of the dtype a call's statistics (rstd, mean, lse, losses) take: f64 in a
    float64 call (`like`, its first row operand, is float64), else f32."""
    return "f64" if tile_dtype_name(getattr(like, "dtype", None)) == "f64" else "f32"


def tile_dtype_name(d):
    """Tile's name ('f32', ...) of a dtype given as a string, a numpy dtype or type, or a torch
    dtype; None for any other."""
    if isinstance(d, str):
        return _TILE_DTYPE.get(d)
    torch = _torch()
    if torch is not None and isinstance(d, torch.dtype):
        return _TILE_DTYPE.get(str(d).split(".")[-1])
    np = sys.modules.get("numpy")
    if np is not None:
        try:
            return _TILE_DTYPE.get(np.dtype(d).name)
        except TypeError:
            return None
    return None


class Info:
    """What a call needs to know of a program's declarations, read once per program version."""

    def __init__(self, program):
        self.serial = program.serial
        self.name = program.name
        self.decls = program.operands()
        self.by_name = {d["name"]: d for d in self.decls}
        self.arrays = {d["name"] for d in self.decls if d["role"] != "scalar_in"}
        self.scalars = [d["name"] for d in self.decls if d["role"] == "scalar_in"]
        self.outputs = [d for d in self.decls if d["role"] in _OUTPUTS]
        rows = [d["name"] for d in self.decls if d["role"] in _ROW and not d["optional"]]
        row_ins = [d["name"] for d in self.decls if d["role"] == "row_in" and not d["optional"]]
        self.first_row = rows[0] if rows else None        # the extension's: rows, columns, device
        self.first_row_in = row_ins[0] if row_ins else self.first_row  # outputs are allocated like it
        # Only per-column and scalar outputs hold reductions over the rows, the calls that may
        # need a workspace: for the others the launch asks for none.
        self.may_need_workspace = any(d["role"] in ("col_out", "scalar_out") for d in self.decls)


def scalar(op, name, v):
    """A scalar operand as a Python float or int; its range is checked by the library."""
    t = type(v)
    if t is float or t is int:
        return v
    np = sys.modules.get("numpy")
    if isinstance(v, bool) or (np is not None and isinstance(v, np.bool_)) or not isinstance(v, numbers.Real):
        raise TypeError(f"{op}: argument '{name}': expected a real number (float), got {_type_name(v)} {v!r}")
    if isinstance(v, numbers.Integral):
        return operator.index(v)
    return float(v)


def refuse_eps_none(op, eps):
    """torch's rms_norm reads eps=None as the dtype's machine epsilon: a silent default would differ."""
    if eps is None:
        hint = " (tile.nn.RMSNorm takes eps=None as torch does, the machine epsilon of x's dtype)" \
            if op == "rms_norm" else ""
        raise TypeError(f"{op}: argument 'eps': expected a real number (float), got None{hint}")


def check_array(op, arg, a, accepted="f32 f64 f16 bf16", output=False):
    """What the extension cannot say well of an array: not an array at all, a numpy dtype DLPack
    cannot export (other byte orders, structured, object), a mask, a read-only output."""
    if not hasattr(a, "__dlpack__"):
        np = sys.modules.get("numpy")
        what = " (a scalar, not an array)" if np is not None and isinstance(a, np.generic) else ""
        raise TypeError(f"{op}: argument '{arg}': expected an array exporting DLPack (numpy, torch, ...), "
                        f"got {_type_name(a)}{what}")
    if _is_numpy(a):
        np = sys.modules["numpy"]
        names = _names(accepted.split())
        t = a.dtype
        if t.fields is None and t.kind in "biufc" and not t.isnative:
            order = "big" if t.byteorder == ">" else "little"
            raise ValueError(f"{op}: argument '{arg}': expected dtype {names} in native "
                             f"({sys.byteorder}-endian) byte order, got {t.str!r} ({order}-endian; "
                             f".astype(a.dtype.newbyteorder('=')) converts it)")
        # Structured and object arrays, and the long doubles DLPack cannot export (their import
        # would fail inside the binding without naming the argument).
        long_double = t.kind == "f" and t.itemsize > 8 or t.kind == "c" and t.itemsize > 16
        if t.fields is not None or t.kind not in "biufc" or long_double:
            raise ValueError(f"{op}: argument '{arg}': expected dtype {names}, got {t}")
        if isinstance(a, np.ma.MaskedArray):  # DLPack exports the data and drops the mask
            raise TypeError(f"{op}: argument '{arg}': expected an array without a mask, got numpy.ma.MaskedArray "
                            "(its masked elements would be read; .filled(value) chooses what they hold)")
        if output and not a.flags.writeable:
            raise ValueError(f"{op}: argument '{arg}': expected a writable array, got a read-only numpy array")


def _plan_value(op, key, value):
    """A plan field's value as JSON takes it: integers of any integer type (numpy's too) as int."""
    np = sys.modules.get("numpy")
    if np is not None and isinstance(value, np.bool_):
        return bool(value)                      # rejected by the library, which names the field
    if value is None or isinstance(value, (str, bool, int)):
        return value
    if hasattr(type(value), "__index__"):       # numpy integer scalars and 0-d integer arrays
        return operator.index(value)
    if isinstance(value, numbers.Real):
        raise ValueError(f"{op}: argument 'plan.{key}': expected an integer, got {value!r}")
    raise TypeError(f"{op}: argument 'plan.{key}': expected an integer or a string, got {_type_name(value)}")


def plan_json(op, plan):
    if plan is None:
        return None
    if isinstance(plan, str):
        return plan
    if isinstance(plan, dict):
        for key in plan:
            if not isinstance(key, str):
                raise TypeError(f"{op}: argument 'plan': expected plan field names as strings, "
                                f"got {key!r} ({_type_name(key)})")
        return json.dumps({key: _plan_value(op, key, value) for key, value in plan.items()})
    raise TypeError(f"{op}: argument 'plan': expected a dict of plan fields, a JSON string or None, "
                    f"got {_type_name(plan)}")


def stream_handle(op, stream, on_cuda):
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


def to_dlpack(torch, a):
    # The capsule directly: Tensor.__dlpack__ costs microseconds of Python per call, and refuses
    # tensors that require grad (autograd is above this: tile/_torch_ops.py).
    return torch.utils.dlpack.to_dlpack(a) if isinstance(a, torch.Tensor) else a


# The torch fast path, switched on by init_torch once torch is loaded (it may be imported after
# tile): torch.Tensor, launch_raw's dtype codes by torch dtype, and torch's C entry points for the
# current device and stream, looked up once instead of on every call.
class _NoTorch:
    pass


Tensor = _NoTorch
RAW_CODES = {}
current_device = None
current_stream = None
empty_like = None
empty = None
float32 = None
float64 = None
contiguous = None
grad_enabled = None
# Called with torch after the fast path is on: the package's custom ops and routing.
torch_hooks = []


def init_torch(torch):
    global Tensor, RAW_CODES, current_device, current_stream, empty_like, empty, float32, float64, contiguous, grad_enabled
    RAW_CODES = {getattr(torch, name): code for name, code in _tile.RAW_DTYPE_CODES.items()}
    # Private but long-standing (torch.cuda.current_device and Inductor call them); the public
    # API where a build lacks them.
    current_device = getattr(torch._C, "_cuda_getDevice", None) or torch.cuda.current_device
    current_stream = (getattr(torch._C, "_cuda_getCurrentRawStream", None)
                      or (lambda device: torch.cuda.current_stream(device).cuda_stream))
    empty_like = torch.empty_like
    empty = torch.empty
    float32 = torch.float32
    float64 = torch.float64
    contiguous = torch.contiguous_format
    grad_enabled = torch.is_grad_enabled
    first = Tensor is _NoTorch
    Tensor = torch.Tensor                       # it switches the fast path on
    if first:
        for hook in torch_hooks:
            hook(torch)


def raw(a):
    """A torch CUDA tensor as launch_raw reads it; raises for anything else (the DLPack path)."""
    if not a.is_cuda:
        raise TypeError
    return a.data_ptr(), a.shape, a.stride(), RAW_CODES[a.dtype], a.get_device()


def torch_workspace(nbytes, device, stream):
    """The workspace of a CUDA call that needs one (_tile.launch's `workspace` allocator): a
    uint8 tensor from torch's caching allocator, on the launch's stream. The allocator is
    stream-ordered, so the block returns to the pool when the call has been enqueued and is
    reused only by work ordered after it; under CUDA-graph capture it comes from the graph's
    pool and stays the graph's. So no call depends on memory the library allocates itself."""
    torch = _torch()
    if stream == current_stream(device):
        t = torch.empty(nbytes, dtype=torch.uint8, device=device)
    else:                                       # a stream given to the call: its blocks are that stream's
        s = torch.cuda.default_stream(device) if stream == 0 else torch.cuda.ExternalStream(stream, device=device)
        with torch.cuda.stream(s):
            t = torch.empty(nbytes, dtype=torch.uint8, device=device)
    return t.data_ptr(), t


def launch_torch_cuda(program, operands, arrays, device, plan, stream, record, labels, op, workspace=None):
    """launch_raw when every array operand is a torch CUDA tensor of a dtype it reads; None
    otherwise (the DLPack path then checks and names what it cannot read)."""
    ops = {}
    try:
        for name, v in operands.items():
            ops[name] = raw(v) if v is not None and name in arrays else v
    except Exception:
        return None, False                      # outside the handler: no chained traceback
    handle = current_stream(device) if stream is None else stream_handle(op, stream, True)
    if current_device() == device:
        return _tile.launch_raw(program, ops, plan, handle, record, labels, True, workspace), True
    with _torch().cuda.device(device):          # the library launches into the current context
        return _tile.launch_raw(program, ops, plan, handle, record, labels, True, workspace), True


def launch_dlpack(program, operands, like, plan, stream, record, labels, op, workspace=None):
    """_tile.launch: every array through DLPack; `like` (the first row operand) picks the stream.
    `workspace` (torch_workspace or None) is passed for torch CUDA tensors only."""
    torch = _torch()
    if torch is not None and isinstance(like, torch.Tensor):
        if Tensor is _NoTorch:
            init_torch(torch)
        ops = {name: to_dlpack(torch, v) for name, v in operands.items()}
        if not like.is_cuda:
            return _tile.launch(program, ops, plan, stream_handle(op, stream, False), record, labels, True)
        handle = torch.cuda.current_stream(like.device).cuda_stream if stream is None else stream_handle(op, stream, True)
        if torch.cuda.current_device() == like.device.index:
            return _tile.launch(program, ops, plan, handle, record, labels, True, workspace)
        with torch.cuda.device(like.device):    # the library launches into the current context
            return _tile.launch(program, ops, plan, handle, record, labels, True, workspace)
    if torch is not None:
        operands = {name: to_dlpack(torch, v) for name, v in operands.items()}
    device = getattr(like, "__dlpack_device__", None)
    on_cuda = like is None or (device is not None and device()[0] == 2)  # kDLCUDA
    return _tile.launch(program, operands, plan, stream_handle(op, stream, on_cuda), record, labels, True)


def introspect(fn, program, operands, plan, labels=None):
    torch = _torch()
    if torch is not None:
        operands = {name: to_dlpack(torch, v) for name, v in operands.items()}
    return fn(program, operands, plan, labels)


# ---- programs: outputs allocated when not given ----

def _output_dtype(op, decl, like, given):
    """Tile's name of an output's dtype: `given`, else the first row input's for row outputs
    and f32 (f64 in a float64 call) for the others, where the declaration allows them."""
    allowed = decl["dtypes"]
    if given is not None:
        name = tile_dtype_name(given)
        if name not in allowed:
            raise ValueError(f"{op}: argument 'dtypes': expected for '{decl['name']}' a dtype {_names(allowed)}, "
                             f"got {given!r}")
        return name
    if decl["role"] == "row_out":
        name = tile_dtype_name(getattr(like, "dtype", None))
        if name in allowed:
            return name
    stat = stat_dtype(like)
    return stat if stat in allowed else "f32" if "f32" in allowed else allowed[0]


def output_shape(info, decl, like):
    role = decl["role"]
    shape = tuple(like.shape)
    if role == "row_out":
        return shape
    if role == "row_scalar_out":
        return shape[:-1]
    if role == "col_out":
        return shape[-1:]
    return (1,)


def allocate(op, name, like, like_name, shape, dtype):
    """An empty array of Tile dtype `dtype` with `like`'s framework and device."""
    if _is_torch(like):
        torch = _torch()
        return torch.empty(shape, dtype=getattr(torch, _LONG_NAME[dtype]), device=like.device)
    if _is_numpy(like):
        if dtype == "bf16":
            raise ValueError(f"{op}: argument '{name}': expected an output array of dtype bfloat16 (numpy has no "
                             f"bfloat16 to allocate one with), got None")
        return sys.modules["numpy"].empty(shape, dtype=_LONG_NAME[dtype])
    raise TypeError(f"{op}: argument '{name}': expected an output array when {like_name} is neither a numpy array "
                    f"nor a torch tensor, got None ({like_name} is {type(like).__name__})")


def prepare(info, operands, dtypes, allocate_outputs=True, labels=None):
    """Checks a program call's operands in Python and allocates the outputs not given (a name
    given as None is an absent optional output). Returns (operands, device_like): the operands
    as the extension takes them, and the first row operand, which picks device and stream.
    `labels` renames operands in errors, as launch's does."""
    op = info.name
    labels = labels or {}
    ops = dict(operands)
    for name in info.scalars:
        v = ops.get(name)
        if v is not None:
            ops[name] = scalar(op, labels.get(name, name), v)
    for name, v in ops.items():
        decl = info.by_name.get(name)
        if v is not None and decl is not None and decl["role"] != "scalar_in":
            check_array(op, labels.get(name, name), v, " ".join(decl["dtypes"]), decl["role"] in _OUTPUTS)
    if dtypes is not None:
        if not isinstance(dtypes, dict):
            raise TypeError(f"{op}: argument 'dtypes': expected a dict of output name -> dtype, got "
                            f"{_type_name(dtypes)}")
        for name in dtypes:
            decl = info.by_name.get(name)
            if decl is None or decl["role"] not in _OUTPUTS:
                outputs = ", ".join(d["name"] for d in info.outputs)
                raise ValueError(f"{op}: argument 'dtypes': expected names of outputs ({outputs}), got {name!r}")
            if ops.get(name) is not None:
                given = tile_dtype_name(getattr(ops[name], "dtype", None))
                if given != tile_dtype_name(dtypes[name]):
                    raise ValueError(f"{op}: argument 'dtypes': expected for '{name}' None or the dtype of the "
                                     f"array given, {ops[name].dtype}, got {dtypes[name]!r}")
    like = ops.get(info.first_row_in) if info.first_row_in else None
    if like is None:
        like = ops.get(info.first_row)
    if allocate_outputs and like is not None and hasattr(like, "shape"):
        for decl in info.outputs:
            name = decl["name"]
            if name in ops:
                continue
            dtype = _output_dtype(op, decl, like, None if dtypes is None else dtypes.get(name))
            like_name = info.first_row_in if ops.get(info.first_row_in) is not None else info.first_row
            ops[name] = allocate(op, name, like, like_name, output_shape(info, decl, like), dtype)
    return ops, ops.get(info.first_row)


def refuse_grad(op, ops):
    """Row programs have no backward: a torch tensor that requires grad is refused, not read
    as if its gradient did not matter."""
    if grad_enabled is None or not grad_enabled():
        return
    for name, v in ops.items():
        if isinstance(v, Tensor) and v.requires_grad:
            raise RuntimeError(f"{op}: argument '{name}': row programs are not differentiable, but {name} requires "
                               f"grad; call it under torch.no_grad() or pass {name}.detach()")


def launch(program, info, operands, plan, stream, record, labels=None):
    """Runs a prepared call; returns the launch record (None when record is false)."""
    op = info.name
    ops, like = operands
    plan = plan_json(op, plan)
    if Tensor is _NoTorch and _is_torch(like):
        init_torch(_torch())
    if isinstance(like, Tensor) and like.is_cuda:
        # A workspace, where the call needs one, from torch's allocator (torch_workspace).
        workspace = torch_workspace if info.may_need_workspace else None
        rec, ran = launch_torch_cuda(program, ops, info.arrays, like.get_device(), plan, stream, record, labels, op,
                                     workspace)
        if not ran:
            rec = launch_dlpack(program, ops, like, plan, stream, record, labels, op, workspace)
    else:
        rec = launch_dlpack(program, ops, like, plan, stream, record, labels, op)
    if rec is not None:
        _log.event(op, rec)
        if not record:
            return None
    return rec
