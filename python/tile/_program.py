"""Row programs from Python: the builder of include/tile/spec.hpp, with Python operators on
expressions, and calls that allocate their outputs.

    p = tile.RowProgram("softmax_t")
    x, t = p.row_in("x"), p.scalar_in("t", default=1.0)
    y = p.row_out("y", may_alias=x)
    v = p.load(x) / p.load(t)
    m, s = p.reduce2(tile.Axis.cols, tile.monoid.online_softmax(), v)
    p.store(y, tile.exp(v - m) / s)
    out = p(x=x_array, t=0.5)

Every rule a program must follow is the C++ builder's, with its messages ("row program
'softmax_t': ..."); every call goes through the same conversion and binding as the built-in
operators (python/tile/_call.py, python/src/module.cpp).
"""

import enum
import json
import numbers

from . import _call, _tile
from .monoid import Monoid

__all__ = ["RowProgram", "Operand", "Expr", "Axis", "builtin", "training_programs", "exp", "log", "sqrt", "rsqrt", "abs", "tanh",
           "maximum", "minimum", "to_f32", "eq", "ne", "lt", "le", "logical_and", "logical_or", "logical_not"]

# Keywords of a call, so no operand may take these names.
_RESERVED = ("plan", "stream", "dtypes")


class Axis(enum.Enum):
    """The axis a reduction folds: along each row (one value per row) or across the rows (one
    value per column, or per call)."""
    cols = "cols"
    rows = "rows"


class Operand:
    """A declared operand of a program; load and store take it."""

    __slots__ = ("program", "id", "name", "role")

    def __init__(self, program, id, name, role):
        self.program, self.id, self.name, self.role = program, id, name, role

    @property
    def _decl(self):
        return self.program._info().by_name[self.name]

    @property
    def dtypes(self):
        """Tile's names of the dtypes the operand accepts ('f32', 'f64', 'f16', 'bf16', 'i32', 'i64')."""
        return tuple(self._decl["dtypes"])

    @property
    def optional(self):
        return self._decl["optional"]

    @property
    def doc(self):
        return self._decl["doc"]

    def __repr__(self):
        return f"<tile.Operand {self.role} '{self.name}' of row program '{self.program.name}'>"


class Expr:
    """A node of a program's expression graph. Arithmetic (+ - * / and unary -), orderings
    (< <= > >=) and logic (& | ~ on comparisons) append nodes; tile.eq / tile.ne compare for
    equality, since == and != keep their Python meaning. Numbers mix in as constants: an int
    next to an i64 expression is an integer, otherwise a float32 constant."""

    __slots__ = ("program", "id")

    def __init__(self, program, id):
        self.program, self.id = program, id

    @property
    def type(self):
        """'f32', 'i64' or 'b1'."""
        return self.program._p.node(self.id)[0]

    @property
    def shape(self):
        """'element', 'per-row', 'per-column' or 'uniform': the axes it varies along."""
        return self.program._p.node(self.id)[1]

    def __repr__(self):
        return f"<tile.Expr %{self.id}: {self.type} {self.shape} of row program '{self.program.name}'>"

    def __bool__(self):
        raise TypeError(f"row program '{self.program.name}': an expression has no truth value while the program is "
                        "built; use p.select(cond, a, b), tile.logical_and/or/not")

    def __add__(self, o): return _binary("add", self, o)
    def __radd__(self, o): return _binary("add", o, self)
    def __sub__(self, o): return _binary("sub", self, o)
    def __rsub__(self, o): return _binary("sub", o, self)
    def __mul__(self, o): return _binary("mul", self, o)
    def __rmul__(self, o): return _binary("mul", o, self)
    def __truediv__(self, o): return _binary("div", self, o)
    def __rtruediv__(self, o): return _binary("div", o, self)
    def __neg__(self): return _unary("neg", self)
    def __lt__(self, o): return _binary("lt", self, o)
    def __le__(self, o): return _binary("le", self, o)
    def __gt__(self, o): return _binary("lt", o, self)
    def __ge__(self, o): return _binary("le", o, self)
    def __and__(self, o): return _binary("and", self, o)
    def __rand__(self, o): return _binary("and", o, self)
    def __or__(self, o): return _binary("or", self, o)
    def __ror__(self, o): return _binary("or", o, self)
    def __invert__(self): return _unary("not", self)

    __hash__ = object.__hash__


def _ref(e):
    return (e.program._p, e.id)


def _lift(program, v, like):
    """A number as a constant of `program`: an integer beside an i64 expression, else f32."""
    if isinstance(v, Expr):
        return v
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        np_scalar = hasattr(v, "dtype") and getattr(v, "shape", None) == ()
        if not np_scalar or isinstance(v, bool) or getattr(v.dtype, "kind", "") not in "iuf":
            raise TypeError(f"row program '{program.name}': expected an expression or a number, got "
                            f"{_call._type_name(v)} {v!r}")
        v = v.item()
    if isinstance(v, int) and like is not None and like.type == "i64":
        return Expr(program, program._p.integer(v))
    return Expr(program, program._p.constant(float(v)))


def _unary(fn, a, public=None):
    if not isinstance(a, Expr):
        raise TypeError(f"tile.{public or fn}: expected an expression, got {_call._type_name(a)} {a!r}")
    p = a.program
    return Expr(p, p._p.unary(fn, _ref(a)))


def _binary(fn, a, b, public=None):
    like = a if isinstance(a, Expr) else b
    if not isinstance(like, Expr):
        raise TypeError(f"tile.{public or fn}: expected an expression for at least one argument, got "
                        f"{_call._type_name(a)} and {_call._type_name(b)}")
    p = like.program
    a, b = _lift(p, a, like), _lift(p, b, like)
    return Expr(p, p._p.binary(fn, _ref(a), _ref(b)))


def exp(a): return _unary("exp", a)
def log(a): return _unary("log", a)
def sqrt(a): return _unary("sqrt", a)
def rsqrt(a): return _unary("rsqrt", a)
def abs(a): return _unary("abs", a)  # noqa: A001 - numpy's and C++'s name
def tanh(a): return _unary("tanh", a)
def to_f32(a): return _unary("to_f32", a)
def logical_not(a): return _unary("not", a, "logical_not")
def maximum(a, b): return _binary("max", a, b, "maximum")  # NaN if either is NaN, as torch.maximum
def minimum(a, b): return _binary("min", a, b, "minimum")
def eq(a, b): return _binary("eq", a, b)
def ne(a, b): return _binary("ne", a, b)
def lt(a, b): return _binary("lt", a, b)
def le(a, b): return _binary("le", a, b)
def logical_and(a, b): return _binary("and", a, b, "logical_and")
def logical_or(a, b): return _binary("or", a, b, "logical_or")
def exponent(a): return _unary("exponent", a)  # floor(log2 |a|) for finite nonzero a, else 0
def ldexp(a, b): return _binary("ldexp", a, b)  # a * 2^b, exact, b integer-valued (f32)


def _axis(program, axis):
    if isinstance(axis, Axis):
        return axis.value
    if axis in ("cols", "rows"):
        return axis
    raise ValueError(f"row program '{program.name}': reduce: argument 'axis': expected tile.Axis.cols or "
                     f"tile.Axis.rows, got {axis!r}")


def _monoid(program, m):
    if isinstance(m, Monoid):
        return m.name
    hint = " (call it: tile.monoid.sum())" if callable(m) and getattr(m, "__module__", "") == "tile.monoid" else ""
    raise TypeError(f"row program '{program.name}': reduce: argument 'monoid': expected a tile.monoid "
                    f"value{hint}, got {_call._type_name(m)}")


class RowProgram:
    """A row program: operands declared once, an expression graph over them, stores. Calling it
    runs it; plan, ir, source, reference and check introspect a call like the built-ins'."""

    def __init__(self, name):
        self._p = _tile.Program(name)
        self._cached = None

    @classmethod
    def _of(cls, p):
        self = cls.__new__(cls)
        self._p, self._cached = p, None
        return self

    @property
    def name(self):
        return self._p.name

    def _info(self):
        # The declarations, read again whenever the program changed (its serial moved).
        if self._cached is None or self._cached.serial != self._p.serial:
            self._cached = _call.Info(self._p)
        return self._cached

    @property
    def operands(self):
        """The declared operands, in order."""
        return tuple(Operand(self, i, d["name"], d["role"]) for i, d in enumerate(self._info().decls))

    def operand(self, name):
        for i, d in enumerate(self._info().decls):
            if d["name"] == name:
                return Operand(self, i, name, d["role"])
        raise KeyError(f"row program '{self.name}' has no operand '{name}'")

    def __str__(self):
        return self._p.to_string()

    def __repr__(self):
        names = ", ".join(d["name"] for d in self._info().decls)
        return f"<tile.RowProgram '{self.name}' ({names})>"

    # ---- operands ----

    # Default dtypes of float operands; a statistic (rstd, a loss) is float32, or float64 in a
    # float64 call (every float operand float64).
    _FLOATS = ("f32", "f16", "bf16", "f64")
    _STATISTICS = ("f32", "f64")

    def _dtypes(self, name, dtypes, default):
        if dtypes is None:
            return list(default)
        if isinstance(dtypes, str) or not hasattr(dtypes, "__iter__"):
            dtypes = [dtypes]
        out = []
        for d in dtypes:
            t = _call.tile_dtype_name(d)
            if t is None:
                raise ValueError(f"row program '{self.name}': operand '{name}': argument 'dtypes': expected float32, "
                                 f"float64, float16, bfloat16, int32 or int64 (or f32, f64, f16, bf16, i32, i64), "
                                 f"got {d!r}")
            out.append(t)
        return out

    def _declare(self, role, name, *args):
        if name in _RESERVED:
            raise ValueError(f"row program '{self.name}': operand name '{name}': expected a name that is not "
                             f"{', '.join(_RESERVED)} (keywords of a call from Python)")
        return Operand(self, getattr(self._p, role)(name, *args), name, role)

    def _own(self, operand, what):
        if not isinstance(operand, Operand):
            raise TypeError(f"row program '{self.name}': {what}: expected an operand this program declared, got "
                            f"{_call._type_name(operand)}")
        if operand.program is not self and operand.program._p is not self._p:
            raise ValueError(f"row program '{self.name}': {what}: operand '{operand.name}' belongs to row program "
                             f"'{operand.program.name}'")
        return operand.id

    def row_in(self, name, dtypes=None, doc="", optional=False):
        """(rows, cols) read; rows may be strided, each row contiguous. An optional one is read
        with load_or; rows and columns come from the first row operand that is not optional."""
        return self._declare("row_in", name, self._dtypes(name, dtypes, self._FLOATS), doc, bool(optional))

    def row_out(self, name, dtypes=None, may_alias=None, doc="", optional=False):
        """(rows, cols) written; may be exactly the row input `may_alias` (in place). An optional
        one given as None is not computed."""
        alias = -1 if may_alias is None else self._own(may_alias, f"row_out '{name}': may_alias")
        return self._declare("row_out", name, self._dtypes(name, dtypes, self._FLOATS), alias, doc,
                             bool(optional))

    def row_scalar_in(self, name, dtypes, doc="", optional=False):
        """(rows,) read: one value per row (a target class, a saved statistic); an array of stride
        0 (numpy.broadcast_to, torch.expand) gives every row one value."""
        return self._declare("row_scalar_in", name, self._dtypes(name, dtypes, ()), doc, bool(optional))

    def row_scalar_out(self, name, dtypes=None, optional=True, doc=""):
        """(rows,) written: one value per row (rstd, a per-row loss)."""
        return self._declare("row_scalar_out", name, self._dtypes(name, dtypes, self._STATISTICS), bool(optional), doc)

    def col_in(self, name, dtypes=None, optional=False, doc=""):
        """(cols,) read: one value per column (weight, bias)."""
        return self._declare("col_in", name, self._dtypes(name, dtypes, self._FLOATS), bool(optional), doc)

    def col_out(self, name, dtypes=None, optional=False, doc=""):
        """(cols,) written: reduced across the rows (dweight, dbias)."""
        return self._declare("col_out", name, self._dtypes(name, dtypes, self._FLOATS), bool(optional), doc)

    def scalar_in(self, name, type="f32", default=None, doc=""):
        """A number passed by value, as f32 or i64; `default` when the call gives none."""
        if type not in ("f32", "i64"):
            raise ValueError(f"row program '{self.name}': scalar '{name}': expected type f32 or i64, got {type!r}")
        if type == "i64" and default is not None and isinstance(default, numbers.Integral) and \
                not -(2**53) <= int(default) <= 2**53:   # exactly: a float would round it
            raise ValueError(f"row program '{self.name}': scalar '{name}': default {int(default)}: expected an integer "
                             f"of magnitude at most 2^53")
        return self._declare("scalar_in", name, type, None if default is None else float(default), doc)

    def scalar_out(self, name, dtypes=None, optional=False, doc=""):
        """(1,) written: reduced across the rows (a mean loss)."""
        return self._declare("scalar_out", name, self._dtypes(name, dtypes, self._STATISTICS), bool(optional), doc)

    def scalar_range(self, scalar, lo, hi):
        """The values a scalar input accepts (inclusive)."""
        self._p.scalar_range(self._own(scalar, "scalar_range"), float(lo), float(hi))

    # ---- expressions ----

    def _expr(self, v, like=None):
        return _lift(self, v, like)

    def load(self, operand):
        return Expr(self, self._p.load(self._own(operand, "load")))

    def load_or(self, operand, absent):
        """An optional operand's value, or `absent` when the call leaves it out."""
        return Expr(self, self._p.load_or(self._own(operand, "load_or"), float(absent)))

    def constant(self, value):
        """A float32 constant."""
        return Expr(self, self._p.constant(float(value)))

    def integer(self, value):
        """An i64 constant, of magnitude at most 2^53."""
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise TypeError(f"row program '{self.name}': integer constant: expected an integer, got "
                            f"{type(value).__name__} {value!r}")
        if not -(2**53) <= int(value) <= 2**53:
            raise ValueError(f"row program '{self.name}': integer constant {int(value)} is not exactly representable "
                             f"(|v| <= 2^53)")
        return Expr(self, self._p.integer(int(value)))

    def cols(self):
        """The row length, as f32."""
        return Expr(self, self._p.cols())

    def col_index(self):
        """The element's column, as i64."""
        return Expr(self, self._p.col_index())

    def select(self, cond, a, b):
        """a where cond else b (cond a comparison)."""
        like = a if isinstance(a, Expr) else b if isinstance(b, Expr) else None
        cond, a, b = self._expr(cond), self._expr(a, like), self._expr(b, like)
        return Expr(self, self._p.select(_ref(cond), _ref(a), _ref(b)))

    def reduce(self, axis, monoid, inputs):
        """Folds `inputs` (one expression per monoid input) over `axis`; one expression per part."""
        if isinstance(inputs, Expr):
            inputs = [inputs]
        refs = [_ref(self._expr(e)) for e in inputs]
        return [Expr(self, i) for i in self._p.reduce(_axis(self, axis), _monoid(self, monoid), refs)]

    def reduce1(self, axis, monoid, input):
        """reduce with a one-part monoid (sum, max)."""
        return Expr(self, self._p.reduce1(_axis(self, axis), _monoid(self, monoid), _ref(self._expr(input))))

    def reduce2(self, axis, monoid, input):
        """reduce with a two-part monoid (online_softmax, scaled_sum_squares): a pair."""
        a, b = self._p.reduce2(_axis(self, axis), _monoid(self, monoid), _ref(self._expr(input)))
        return Expr(self, a), Expr(self, b)

    def store(self, operand, value):
        self._p.store(self._own(operand, "store"), _ref(self._expr(value)))

    # ---- calls ----

    def _outputs(self, ops):
        present = [ops[d["name"]] for d in self._info().outputs if ops.get(d["name"]) is not None]
        return present[0] if len(present) == 1 else tuple(present)

    def __call__(self, *, plan=None, stream=None, dtypes=None, **operands):
        """Runs the program on the operands, by name: arrays for row, per-row, per-column and
        scalar-output operands, numbers for scalars. Outputs not given are allocated like the
        first row input (numpy on the CPU, torch on its device) — row outputs with its dtype,
        the others float32, unless `dtypes` names one — and an output given as None is left out
        (optional ones). Returns the outputs present, in declaration order: one array, or a
        tuple of them."""
        info = self._info()
        _call.refuse_grad(info.name, operands)
        ops = _call.prepare(info, operands, dtypes)
        _call.launch(self._p, info, ops, plan, stream, False)
        return self._outputs(ops[0])

    def run(self, *, plan=None, stream=None, dtypes=None, **operands):
        """As calling the program, but returns the launch record (the dict tile.run returns)
        with `outputs`, a dict of output name -> array."""
        info = self._info()
        _call.refuse_grad(info.name, operands)
        ops = _call.prepare(info, operands, dtypes)
        rec = _call.launch(self._p, info, ops, plan, stream, True)
        rec["outputs"] = {d["name"]: ops[0][d["name"]] for d in info.outputs if ops[0].get(d["name"]) is not None}
        return rec

    def _introspect(self, fn, plan, dtypes, operands):
        info = self._info()
        ops, _ = _call.prepare(info, operands, dtypes)
        return _call.introspect(fn, self._p, ops, _call.plan_json(info.name, plan))

    def plan(self, *, plan=None, dtypes=None, **operands):
        """The resolved mapping plan (a dict) a call with these operands launches."""
        return json.loads(self._introspect(_tile.plan, plan, dtypes, operands))

    def ir(self, *, plan=None, dtypes=None, **operands):
        """The raw IR a call with these operands runs."""
        return self._introspect(_tile.ir, plan, dtypes, operands)

    def source(self, *, plan=None, dtypes=None, **operands):
        """The CUDA source a call with these operands compiles."""
        return self._introspect(_tile.source, plan, dtypes, operands)

    def workspace_bytes(self, *, plan=None, dtypes=None, **operands):
        """The bytes of workspace a call with these operands needs on their device: 0 unless the
        program reduces over the rows (tile::workspace_bytes). Calls with torch CUDA tensors take
        it from torch's allocator; others use the library's own."""
        return self._introspect(_tile.workspace_bytes, plan, dtypes, operands)

    def _host(self, operands):
        # Host copies of torch device tensors: the reference runs on the CPU.
        out = {}
        for name, v in operands.items():
            if _call._is_torch(v) and v.device.type != "cpu":
                v = v.detach().cpu()
            out[name] = v
        return out

    def reference(self, *, dtypes=None, **operands):
        """The float64 evaluation of the program (tile::reference) on the inputs given: a dict of
        output name -> numpy float64 array shaped like that output. Outputs need not be given;
        those given as None are left out. Device tensors are copied to the host first."""
        info = self._info()
        ops, like = _call.prepare(info, self._host(operands), dtypes)
        values = _call.introspect(lambda p, o, plan, labels: _tile.reference(p, o, labels), self._p, ops, None)
        out = {}
        for name, flat in values.items():
            decl = info.by_name[name]
            shape = tuple(ops[name].shape) if decl["role"] == "scalar_out" else _call.output_shape(info, decl, like)
            out[name] = flat.reshape(shape)
        return out

    def check(self, /, **operands):
        """Compares the outputs given (written by a call with the same inputs) with the float64
        reference, element by element, with tile::check_against_reference's tolerances. Returns
        a dict: ok, checked, mismatches, max_abs_error, max_rel_error, first_mismatch."""
        info = self._info()
        ops, _ = _call.prepare(info, self._host(operands), None, allocate_outputs=False)
        return _call.introspect(lambda p, o, plan, labels: _tile.check(p, o, labels), self._p, ops, None)


_BUILTINS = {}


def builtin(name):
    """A built-in operator as a row program ("softmax", "log_softmax", "rms_norm", "layer_norm",
    or a training operator's: "rms_norm_backward", "cross_entropy", ...; tile.training_programs()
    lists them): the same calls and introspection as a program of your own; it cannot be
    changed."""
    p = _BUILTINS.get(name)
    if p is None:
        if not isinstance(name, str):
            raise TypeError(f"builtin: argument 'name': expected one of 'softmax', 'log_softmax', 'rms_norm', "
                            f"'layer_norm' or a training operator's name, got {name!r}")
        forward, training = ("softmax", "log_softmax", "rms_norm", "layer_norm"), tuple(_tile.Program.library_names())
        if name not in forward + training:
            raise ValueError(f"builtin: argument 'name': expected one of {', '.join(forward)} or a training "
                             f"operator ({', '.join(training)}), got {name!r}")
        made = _tile.Program.library(name) if name in training else _tile.Program.builtin(name)
        p = _BUILTINS[name] = RowProgram._of(made)
    return p


def training_programs():
    """The names of the training operators' programs, for tile.builtin."""
    return tuple(_tile.Program.library_names())
