// tile._tile: the compiled half of the Python package.
//
// Every call is a row program (a built-in or one built with tile.RowProgram) and its operands
// by name, in a dict. One conversion, by the operand's declared role, turns each into what
// tile::bind takes: row operands are (..., cols) arrays whose leading dimensions flatten to
// rows of one stride; per-row operands (...) arrays with one value per row; per-column
// operands (cols,) arrays; scalar outputs one-element arrays; scalar inputs numbers; None or a
// missing name is an absent operand. Arrays arrive through DLPack (launch, plan, ir, source,
// reference, check) or, for torch CUDA tensors, as plain integers (launch_raw: pointer, shape,
// strides, dtype code, device); both ways share the conversion and the launch. CPU arrays run
// on the CPU backend, CUDA arrays on the CUDA backend. python/tile/ allocates outputs and
// resolves streams; this file converts, binds and launches. Tests: tests/python/.
#include <dlfcn.h>
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <exception>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <vector>

// The module is compiled with hidden visibility, libtile.so with default visibility; the
// library's types keep default visibility here so its exceptions are caught by type.
#pragma GCC visibility push(default)
#if TILE_WITH_CUDA
#include "backend/cuda/driver.hpp"      // needs only <cuda.h>: DeviceInfo, ensure_context
#include "backend/cuda/jit_module.hpp"  // needs only <cuda.h>: the NVRTC cache
#include "backend/cuda/nvrtc.hpp"       // needs only <nvrtc.h>: where NVRTC is searched for
#endif
#include "target/target.hpp"  // tile::Replay
#include "tile/tile.hpp"
#include "tile/training.hpp"
#pragma GCC visibility pop
#include "convert.hpp"        // reading arrays and naming what is wrong (shared with tile._torch_C)
#include "tile_git_commit.h"  // generated on every build: TILE_GIT_COMMIT, TILE_GIT_DIRTY

#ifndef TILE_VERSION
#define TILE_VERSION "unknown"
#endif

namespace nb = nanobind;

namespace {

using namespace tile_py;

using Input = nb::ndarray<nb::ro>;  // inputs, and outputs of introspection: never written
using Output = nb::ndarray<>;       // outputs of launches: must be writable

// ---- programs ----

// A row program as Python holds it: one of its own (built with tile.RowProgram) or a built-in,
// which cannot be changed.
struct Program {
  std::unique_ptr<tile::RowProgram> owned;
  const tile::RowProgram* program = nullptr;
  std::optional<tile::Op> builtin;

  tile::RowProgram& builder() {
    if (!owned)
      throw tile::Error("row program '" + program->name() +
                        "': a built-in program cannot be changed (build a tile.RowProgram of your own)");
    return *owned;
  }

  // The operand names as Python strings, made again when the program changed: a call looks
  // every operand up in its dict, and a str with its hash cached is the cheapest key.
  const std::vector<nb::str>& keys() const {
    if (keys_serial_ != program->serial()) {
      keys_.clear();
      for (const tile::OperandDecl& d : program->operands()) keys_.emplace_back(d.name.c_str());
      keys_serial_ = program->serial();
    }
    return keys_;
  }

 private:
  mutable std::vector<nb::str> keys_;
  mutable uint64_t keys_serial_ = 0;
};

// An expression as Python passes it: the program it belongs to and its node.
using ExprRef = std::pair<Program*, int>;

tile::RowExpr expr(const ExprRef& e) {
  // The program checks that the expression is its own before it reads the node.
  return tile::RowExpr{const_cast<tile::RowProgram*>(e.first->program), e.second};
}

tile::DTypeSet dtype_set(const std::vector<std::string>& names) {
  std::vector<tile::DType> v;
  for (const std::string& n : names) {
    const tile::DType t = tile::parse_dtype(n);
    if (std::find(v.begin(), v.end(), t) == v.end()) v.push_back(t);
  }
  // DTypeSet is built from a braced list only.
  switch (v.size()) {
    case 0:
      return {};
    case 1:
      return {v[0]};
    case 2:
      return {v[0], v[1]};
    case 3:
      return {v[0], v[1], v[2]};
    case 4:
      return {v[0], v[1], v[2], v[3]};
    case 5:
      return {v[0], v[1], v[2], v[3], v[4]};
    default:
      return {v[0], v[1], v[2], v[3], v[4], v[5]};
  }
}

// Out-of-range ids are refused by the program with its own message.
tile::Operand operand(int id) { return tile::Operand{id < 0 ? std::numeric_limits<int>::max() : id}; }

tile::UnaryFn unary_fn(const std::string& name) {
  for (int i = 0; i <= int(tile::UnaryFn::exponent); ++i)
    if (name == tile::unary_fn_name(tile::UnaryFn(i))) return tile::UnaryFn(i);
  throw tile::InternalError("unknown unary function " + name);
}

tile::BinaryFn binary_fn(const std::string& name) {
  for (int i = 0; i <= int(tile::BinaryFn::ldexp); ++i)
    if (name == tile::binary_fn_name(tile::BinaryFn(i))) return tile::BinaryFn(i);
  throw tile::InternalError("unknown binary function " + name);
}

tile::Monoid monoid(const std::string& name) {
  if (name == "sum") return tile::monoid::sum();
  if (name == "max") return tile::monoid::max();
  if (name == "online_softmax") return tile::monoid::online_softmax();
  if (name == "mean_m2") return tile::monoid::mean_m2();
  if (name == "scaled_sum_squares") return tile::monoid::scaled_sum_squares();
  throw tile::Error("monoid: expected one of sum, max, online_softmax, mean_m2, scaled_sum_squares, got '" + name +
                    "'");
}

tile::Axis axis(const std::string& name) {
  if (name == "cols") return tile::Axis::cols;
  if (name == "rows") return tile::Axis::rows;
  throw tile::Error("reduce: argument 'axis': expected cols or rows, got '" + name + "'");
}

const char* role_id(tile::Role r) {
  static const char* names[] = {"row_in", "row_out", "row_scalar_in", "row_scalar_out",
                                "col_in", "col_out", "scalar_in",     "scalar_out"};
  return names[int(r)];
}

// ---- arrays (convert.hpp reads them into views) ----

// A scalar input: a Python float or int (python/tile/ turns numpy scalars into these).
double as_number(const Slot& s, nb::handle h) {
  if (PyFloat_Check(h.ptr())) return PyFloat_AS_DOUBLE(h.ptr());
  if (PyLong_Check(h.ptr()) && !PyBool_Check(h.ptr())) {
    // An integer scalar travels as a double: one past 2^53 would round to a neighbour (an
    // ignore_index of 2^53 + 1 would ignore nothing), so it is refused here, exactly.
    if (s.decl.scalar_type == tile::ValueType::i64) {
      int overflow = 0;
      const long long n = PyLong_AsLongLongAndOverflow(h.ptr(), &overflow);
      if (overflow != 0 || n > tile::kMaxExactInteger || n < -tile::kMaxExactInteger)
        tile::throw_argument_error(s.op, s.arg, "an integer of magnitude at most 2^53", nb::repr(h).c_str());
    }
    const double v = PyLong_AsDouble(h.ptr());
    if (v == -1.0 && PyErr_Occurred()) {  // beyond double: out of any range, said as such by bind
      PyErr_Clear();
      return nb::cast<bool>(h.attr("__gt__")(0)) ? HUGE_VAL : -HUGE_VAL;
    }
    return v;
  }
  throw nb::type_error((s.op + ": argument '" + s.arg + "': expected a real number (float), got " +
                        nb::type_name(h.type()).c_str() + " " + nb::repr(h).c_str())
                           .c_str());
}

// Why an object would not import: no __dlpack__, or its dtype and the exporter's own words
// (numpy: "DLPack only supports native byte order") when its __dlpack__ raises.
std::string export_failure(nb::handle h) {
  if (!nb::hasattr(h, "__dlpack__")) return " (it has no __dlpack__)";
  std::string why;
  if (nb::hasattr(h, "dtype")) why += " of dtype " + std::string(nb::str(h.attr("dtype")).c_str());
  try {
    h.attr("__dlpack__")();
  } catch (const nb::python_error& e) {
    why += " (its __dlpack__ raised " + std::string(nb::type_name(e.type()).c_str()) + ": " +
           std::string(nb::str(e.value()).c_str()) + ")";
  }
  return why;
}

template <typename A>
A import_array(const Slot& s, nb::handle h) {
  A a;
  if (!nb::try_cast(h, a, /*convert=*/false)) {
    std::string given = nb::type_name(h.type()).c_str() + export_failure(h);
    if (std::is_same_v<A, Output>) given += " (read-only, or not exportable through DLPack)";
    tile::throw_argument_error(s.op, s.arg,
                               std::is_same_v<A, Output> ? "a writable array exporting DLPack (numpy, torch, ...)"
                                                         : "an array exporting DLPack (numpy, torch, ...) of dtype " +
                                                               dtype_names(s.decl.dtypes) + " in native byte order",
                               given);
  }
  return a;
}

// Arrays imported through DLPack, one at a time as the conversion asks for them, and held for
// as long as the call may run. Outputs are Output for launches and Input for introspection,
// which never writes.
template <typename Out>
struct DLPackArrays {
  std::vector<Input> inputs;
  std::vector<Out> outputs;

  explicit DLPackArrays(size_t n) : inputs(n), outputs(n) {}

  template <typename A>
  static ArrayInfo info(const A& a) {
    return {a.data(), a.dtype(), a.ndim(), a.shape_ptr(), a.stride_ptr(), Device{a.device_type(), a.device_id()}};
  }

  ArrayInfo operator()(const Slot& s, nb::handle h, size_t i) {
    if (tile::is_output(s.decl.role)) return info(outputs[i] = import_array<Out>(s, h));
    return info(inputs[i] = import_array<Input>(s, h));
  }
};

// Arrays of launch_raw: each a tuple (data pointer, shape, strides in elements, dtype code,
// device index; -1 for the CPU). The Python package builds these from torch tensors, which
// costs far less than a DLPack capsule per array.
struct RawArrays {
  static constexpr int kMaxDims = 8;  // shapes and strides of more dimensions go to the heap
  struct Dims {
    int64_t inline_dims[2 * kMaxDims];
    std::vector<int64_t> heap;
  };
  std::vector<Dims> dims;

  explicit RawArrays(size_t n) : dims(n) {}

  static int64_t as_int(nb::handle h, const std::string& arg) {
    const long long v = PyLong_AsLongLong(h.ptr());
    if (v == -1 && PyErr_Occurred()) {
      PyErr_Clear();
      throw nb::type_error(("launch_raw: argument '" + arg +
                            "': expected 64-bit integers in its shape, strides, dtype code and device, got " +
                            nb::repr(h).c_str())
                               .c_str());
    }
    return v;
  }

  ArrayInfo operator()(const Slot& s, nb::handle h, size_t i) {
    const auto malformed = [&] {
      throw nb::type_error(("launch_raw: argument '" + s.arg +
                            "': expected a tuple (data_ptr, shape, strides, dtype code, device index)")
                               .c_str());
    };
    if (!PyTuple_Check(h.ptr()) || PyTuple_GET_SIZE(h.ptr()) != 5) malformed();
    PyObject* shape = PyTuple_GET_ITEM(h.ptr(), 1);
    PyObject* strides = PyTuple_GET_ITEM(h.ptr(), 2);
    if (!PyTuple_Check(shape) || !PyTuple_Check(strides) || PyTuple_GET_SIZE(shape) != PyTuple_GET_SIZE(strides))
      malformed();
    ArrayInfo a;
    a.ndim = size_t(PyTuple_GET_SIZE(shape));
    int64_t* d = dims[i].inline_dims;
    if (a.ndim > kMaxDims) {
      dims[i].heap.resize(2 * a.ndim);
      d = dims[i].heap.data();
    }
    for (size_t k = 0; k < a.ndim; ++k) {
      d[k] = as_int(PyTuple_GET_ITEM(shape, k), s.arg);
      d[a.ndim + k] = as_int(PyTuple_GET_ITEM(strides, k), s.arg);
    }
    a.shape = d;
    a.strides = d + a.ndim;
    a.data = PyLong_AsVoidPtr(PyTuple_GET_ITEM(h.ptr(), 0));
    if (!a.data && PyErr_Occurred()) {
      PyErr_Clear();
      malformed();
    }
    const int64_t code = as_int(PyTuple_GET_ITEM(h.ptr(), 3), s.arg);
    if (code < 0 || code > int64_t(tile::DType::f64))
      throw nb::type_error(("launch_raw: argument '" + s.arg + "': unknown dtype code " + std::to_string(code) +
                            " (see RAW_DTYPE_CODES)")
                               .c_str());
    a.dtype = dlpack_dtype(tile::DType(code));
    const int64_t device = as_int(PyTuple_GET_ITEM(h.ptr(), 4), s.arg);
    a.device = device < 0 ? Device{kDLCPU, 0} : Device{kDLCUDA, int(device)};
    return a;
  }
};

struct Bound {
  const tile::RowProgram* program = nullptr;
  tile::Args args;
  tile::CallOptions options;
};

// Converts a call's operands by role, whichever way its arrays arrive (`arrays(slot, handle,
// index)` reads one). The first row operand comes first (rows, columns and the device come
// from it); then the others in declaration order, each checked before the next is read, so
// errors come in one order on every path. `labels` renames operands in these errors (the
// built-in operators call y `out`); tile::bind's own checks follow, under operand names.
template <typename Arrays>
Bound convert(const Program& prog, nb::handle operands, nb::handle labels, Arrays& arrays,
              const std::optional<std::string>& plan) {
  const tile::RowProgram& p = *prog.program;
  const std::string& op = p.name();
  if (!PyDict_Check(operands.ptr()))
    throw nb::type_error((op + ": expected the operands as a dict of name -> array, number or None, got " +
                          nb::type_name(operands.type()).c_str())
                             .c_str());
  if (!labels.is_none() && !PyDict_Check(labels.ptr()))
    throw nb::type_error((op + ": expected labels as a dict of operand name -> name in messages, got " +
                          nb::type_name(labels.type()).c_str())
                             .c_str());
  p.validate();
  const auto& decls = p.operands();
  PyObject *key, *value;
  Py_ssize_t pos = 0;
  while (PyDict_Next(operands.ptr(), &pos, &key, &value)) {
    const char* utf8 = PyUnicode_Check(key) ? PyUnicode_AsUTF8(key) : nullptr;
    if (!utf8) {
      PyErr_Clear();
      throw nb::type_error((op + ": expected operand names as strings, got " + nb::repr(key).c_str()).c_str());
    }
    const std::string name = utf8;
    if (p.find_operand(name) >= 0) continue;
    // An eps given to an operator that takes none says so, as the C++ operators do.
    if (prog.builtin && name == "eps" && (PyFloat_Check(value) || PyLong_Check(value))) {
      double v = PyFloat_AsDouble(value);
      if (v == -1.0 && PyErr_Occurred()) {  // an int beyond double: out of range, said as such
        PyErr_Clear();
        v = HUGE_VAL;
      }
      tile::checked_eps(*prog.builtin, v);
    }
    tile::Args unknown;
    unknown.set(name, 0.0);
    tile::plan_for(p, unknown);  // its binding refuses the name, listing the operands the program takes
    TILE_CHECK(false, "bind accepted the unknown operand ", name);
  }
  std::vector<std::string> names(decls.size());
  for (size_t i = 0; i < decls.size(); ++i) names[i] = decls[i].name;
  if (!labels.is_none()) {
    pos = 0;
    while (PyDict_Next(labels.ptr(), &pos, &key, &value)) {
      const char* from = PyUnicode_Check(key) ? PyUnicode_AsUTF8(key) : nullptr;
      const char* to = PyUnicode_Check(value) ? PyUnicode_AsUTF8(value) : nullptr;
      if (!from || !to) {
        PyErr_Clear();
        continue;
      }
      if (const int i = p.find_operand(from); i >= 0) names[i] = to;
    }
  }
  const std::vector<nb::str>& keys = prog.keys();
  auto get = [&](size_t i) -> nb::handle {
    PyObject* h = PyDict_GetItemWithError(operands.ptr(), keys[i].ptr());
    if (!h && PyErr_Occurred()) throw nb::python_error();
    return h && h != Py_None ? nb::handle(h) : nb::handle();
  };

  // Rows, columns and the device come from the first row operand that is not optional.
  size_t first = 0;
  while (first < decls.size() && !(is_row(decls[first].role) && !decls[first].optional)) ++first;
  TILE_CHECK(first < decls.size(), "a validated program without a row operand");
  const Slot first_slot{op, names[first], decls[first]};
  const nb::handle first_handle = get(first);
  if (!first_handle)
    tile::throw_argument_error(op, names[first], "a matrix (" + std::string(tile::role_name(decls[first].role)) + ")",
                               "nothing");
  const ArrayInfo rows_like = arrays(first_slot, first_handle, first);
  check_device(first_slot, rows_like, std::nullopt, "");
  const Device device = rows_like.device;

  Bound b;
  b.program = &p;
  const tile::TensorView first_view = as_matrix(first_slot, rows_like);
  b.args.set(decls[first].name, first_view);
  for (size_t i = 0; i < decls.size(); ++i) {
    if (i == first) continue;
    const tile::OperandDecl& d = decls[i];
    const Slot s{op, names[i], d};
    const nb::handle h = get(i);
    if (!h) continue;  // absent: bind refuses it unless it is optional or has a default
    if (d.role == tile::Role::scalar_in) {
      double v = as_number(s, h);
      // The operators' message; a float64 call reads eps as a double (bind checks its range).
      if (prog.builtin && d.name == "eps" && !(rows_like.dtype == dlpack_dtype(tile::DType::f64)))
        v = tile::checked_eps(*prog.builtin, v);
      b.args.set(d.name, v);
      continue;
    }
    const ArrayInfo a = arrays(s, h, i);
    check_device(s, a, device, names[first]);
    if (is_row(d.role)) {
      if (a.ndim != rows_like.ndim || !std::equal(a.shape, a.shape + a.ndim, rows_like.shape))
        tile::throw_argument_error(op, s.arg,
                                   "shape " + tuple_string(rows_like.shape, rows_like.ndim) + " like " + names[first],
                                   "shape " + tuple_string(a.shape, a.ndim));
      b.args.set(d.name, as_matrix(s, a));
    } else if (is_row_scalar(d.role)) {
      b.args.set(d.name, as_row_values(s, a, rows_like, names[first]));
    } else if (is_col(d.role)) {
      b.args.set(d.name, as_columns(s, a, first_view.cols));
    } else {
      b.args.set(d.name, as_one_value(s, a));
    }
  }
  check_one_precision(op, decls, names, b.args);
  if (plan) b.options.plan = parse_plan(op, *plan);
  b.options.backend = device.type == kDLCUDA ? tile::Backend::cuda : tile::Backend::cpu;
  b.options.device = device.id;
  return b;
}

nb::object json_loads(const std::string& text) { return nb::module_::import_("json").attr("loads")(text); }

// Runs a converted call; returns the launch record as a dict, or None when `record` is false
// (the operators' path, which builds no dict) — unless `events` asks for the record of a call
// that compiled or loaded its kernel (cache_origin other than "launch-cache"; CUDA only), which
// python/tile/_log.py reports: the hot path pays one string comparison for it.
// The library launches into the current context; it must be the arrays' device.
void check_context(const Bound& b) {
#if TILE_WITH_CUDA  // without CUDA, tile::run refuses the CUDA backend itself
  if (b.options.backend == tile::Backend::cuda) {
    tile::cuda::ensure_context(b.options.device);
    const int current = tile::cuda::current_device();
    if (current != b.options.device)
      throw std::runtime_error(b.program->name() + ": the arrays are on cuda:" + std::to_string(b.options.device) +
                               " but the current CUDA context is on cuda:" + std::to_string(current) +
                               " (make that device current first)");
  }
#else
  (void)b;
#endif
}

uintptr_t as_address(nb::handle h, const std::string& op, const char* what) {
  const unsigned long long v = PyLong_Check(h.ptr()) ? PyLong_AsUnsignedLongLong(h.ptr()) : 0;
  if (!PyLong_Check(h.ptr()) || (v == (unsigned long long)-1 && PyErr_Occurred())) {
    PyErr_Clear();
    throw nb::type_error((op + ": argument 'workspace': expected " + what + " as an int >= 0, got " +
                          nb::repr(h).c_str())
                             .c_str());
  }
  return uintptr_t(v);
}

// The call's workspace (tile::CallOptions::workspace): None leaves it to the library; a tuple
// (pointer, bytes) is the caller's; a callable is asked, with the GIL held, for
// allocate(bytes, device, stream) -> (pointer, owner) when the call needs a workspace (CUDA
// only: the torch integration allocates it with torch's caching allocator, which works under
// CUDA-graph capture). `owner` is returned to be held until the launch is enqueued.
nb::object set_workspace(Bound& b, nb::handle workspace, uintptr_t stream) {
  const std::string& op = b.program->name();
  if (workspace.is_none()) return nb::none();
  if (PyTuple_Check(workspace.ptr())) {
    if (PyTuple_GET_SIZE(workspace.ptr()) != 2)
      throw nb::type_error((op + ": argument 'workspace': expected None, a callable or a tuple (pointer, bytes), "
                                 "got a tuple of " + std::to_string(PyTuple_GET_SIZE(workspace.ptr())) + " items")
                               .c_str());
    b.options.workspace = reinterpret_cast<void*>(as_address(PyTuple_GET_ITEM(workspace.ptr(), 0), op, "the pointer"));
    b.options.workspace_size = size_t(as_address(PyTuple_GET_ITEM(workspace.ptr(), 1), op, "the size in bytes"));
    return nb::none();
  }
  if (!PyCallable_Check(workspace.ptr()))
    throw nb::type_error((op + ": argument 'workspace': expected None, a callable or a tuple (pointer, bytes), got " +
                          nb::type_name(workspace.type()).c_str())
                             .c_str());
  if (b.options.backend != tile::Backend::cuda) return nb::none();
  int64_t bytes = 0;
  {
    nb::gil_scoped_release release;
    check_context(b);
    bytes = tile::workspace_bytes(*b.program, b.args, b.options);
  }
  if (bytes == 0) return nb::none();
  nb::object got = workspace(bytes, b.options.device, stream);
  if (!PyTuple_Check(got.ptr()) || PyTuple_GET_SIZE(got.ptr()) != 2)
    throw nb::type_error((op + ": argument 'workspace': expected the allocator to return (pointer, owner), got " +
                          std::string(nb::repr(got).c_str()))
                             .c_str());
  b.options.workspace = reinterpret_cast<void*>(as_address(PyTuple_GET_ITEM(got.ptr(), 0), op, "the pointer"));
  b.options.workspace_size = size_t(bytes);
  return got;
}

// `replay`, where given, receives the call as a tile::Replay (null where the target makes none).
nb::object execute(Bound& b, uintptr_t stream, bool record, bool events, nb::handle workspace,
                   std::shared_ptr<const tile::Replay>* replay = nullptr) {
  b.options.stream = reinterpret_cast<void*>(stream);
  const nb::object owner = set_workspace(b, workspace, stream);  // held until the launch is enqueued
  tile::LaunchRecord rec;
  {
    nb::gil_scoped_release release;
    check_context(b);
    rec = replay ? tile::run(*b.program, b.args, b.options, *replay) : tile::run(*b.program, b.args, b.options);
  }
  if (!record && !(events && !rec.cache_origin.empty() && rec.cache_origin != "launch-cache")) return nb::none();
  nb::dict d;
  d["plan"] = json_loads(rec.plan.to_json());
  d["kernel_name"] = rec.kernel_name;
  d["source_sha256"] = rec.source_sha256;
  d["ir_sha256"] = rec.ir_sha256;
  d["kernels"] = rec.kernels;
  d["workspace_bytes"] = rec.workspace_bytes;
  d["cubin_sha256"] = rec.cubin_sha256;
  d["arch"] = rec.arch;
  d["groups"] = rec.groups;
  d["threads_per_group"] = rec.threads_per_group;
  d["shared_bytes"] = rec.shared_bytes;
  d["bytes_loaded"] = rec.bytes_loaded;
  d["vector_accesses"] = rec.vector_accesses;
  d["scalar_accesses"] = rec.scalar_accesses;
  d["cache_origin"] = rec.cache_origin;
  d["compile_ms"] = rec.compile_ms;
  nb::list options;
  for (const std::string& o : rec.compile_options) options.append(o);
  d["compile_options"] = options;
  d["backend"] = b.options.backend == tile::Backend::cuda ? "cuda" : "cpu";
  return d;
}

nb::object launch(const Program& p, nb::handle operands, const std::optional<std::string>& plan, uintptr_t stream,
                  bool record, nb::handle labels, bool events, nb::handle workspace) {
  DLPackArrays<Output> arrays(p.program->operands().size());
  Bound b = convert(p, operands, labels, arrays, plan);
  return execute(b, stream, record, events, workspace);
}

// ---- replays ----
// A launch_raw call on CUDA arrays that repeats an earlier one in all but its data pointers
// replays it (tile::Replay): no conversion, binding, plan or cache lookups, one launch. The
// key holds everything else the first call read; a replay re-checks the pointers itself.

constexpr size_t kMaxReplayOperands = 16;
constexpr size_t kMaxReplays = 4096;  // distinct calls kept; then the map starts afresh

struct ReplayEntry {
  nb::object program;  // the replay refers to the program: kept alive with it
  std::shared_ptr<const tile::Replay> replay;
};

// Never destroyed: its entries hold Python references, which must be dropped while the
// interpreter lives (an atexit hook clears the map, NB_MODULE), not by a static destructor
// running after it has finalized.
std::unordered_map<std::string, ReplayEntry>& replays() {
  static auto* map = new std::unordered_map<std::string, ReplayEntry>();
  return *map;
}

template <typename T>
void append_bytes(std::string& key, const T& v) {
  key.append(reinterpret_cast<const char*>(&v), sizeof v);
}

// The replay key of a launch_raw call and its operands' data pointers (declaration order);
// false where no replay may take the call — a CPU array, anything but the usual tuples,
// numbers and None, an unknown name — which the full path then reads, and names if wrong.
bool replay_key(const Program& prog, nb::handle operands, const std::optional<std::string>& plan, std::string& key,
                const void** data) {
  const tile::RowProgram& p = *prog.program;
  const size_t n = p.operands().size();
  if (n > kMaxReplayOperands || !PyDict_Check(operands.ptr())) return false;
  key.clear();
  append_bytes(key, p.serial());
  append_bytes(key, plan ? plan->size() : size_t(-1));
  if (plan) key += *plan;
  const std::vector<nb::str>& keys = prog.keys();
  Py_ssize_t found = 0;
  for (size_t i = 0; i < n; ++i) {
    data[i] = nullptr;
    PyObject* h = PyDict_GetItemWithError(operands.ptr(), keys[i].ptr());
    if (!h) {
      if (PyErr_Occurred()) {
        PyErr_Clear();
        return false;
      }
      key += '-';
      continue;
    }
    ++found;
    if (h == Py_None) {
      key += '-';
    } else if (PyFloat_CheckExact(h)) {
      key += 's';
      append_bytes(key, PyFloat_AS_DOUBLE(h));
    } else if (PyLong_CheckExact(h)) {
      const double v = PyLong_AsDouble(h);
      if (v == -1.0 && PyErr_Occurred()) {
        PyErr_Clear();
        return false;
      }
      key += 's';
      append_bytes(key, v);
    } else if (PyTuple_CheckExact(h) && PyTuple_GET_SIZE(h) == 5) {
      PyObject* shape = PyTuple_GET_ITEM(h, 1);
      PyObject* strides = PyTuple_GET_ITEM(h, 2);
      if (!PyTuple_Check(shape) || !PyTuple_Check(strides) || PyTuple_GET_SIZE(shape) != PyTuple_GET_SIZE(strides))
        return false;
      const long code = PyLong_AsLong(PyTuple_GET_ITEM(h, 3));
      const long device = PyLong_AsLong(PyTuple_GET_ITEM(h, 4));
      void* ptr = PyLong_AsVoidPtr(PyTuple_GET_ITEM(h, 0));
      if (PyErr_Occurred()) {
        PyErr_Clear();
        return false;
      }
      if (device < 0 || code < 0 || code > long(tile::DType::i64)) return false;  // CPU: no replay
      key += 'a';
      append_bytes(key, int32_t(code));
      append_bytes(key, int32_t(device));
      // Pointer alignment decides the plan's vector accesses and bind's alignment checks.
      append_bytes(key, uint8_t(reinterpret_cast<uintptr_t>(ptr) % 16));
      const Py_ssize_t ndim = PyTuple_GET_SIZE(shape);
      append_bytes(key, int32_t(ndim));
      for (PyObject* dims : {shape, strides})
        for (Py_ssize_t k = 0; k < ndim; ++k) {
          const long long v = PyLong_AsLongLong(PyTuple_GET_ITEM(dims, k));
          if (v == -1 && PyErr_Occurred()) {
            PyErr_Clear();
            return false;
          }
          append_bytes(key, int64_t(v));
        }
      data[i] = ptr;
    } else {
      return false;
    }
  }
  return found == PyDict_GET_SIZE(operands.ptr());  // no name the program does not declare
}

nb::object launch_raw(const Program& p, nb::handle operands, const std::optional<std::string>& plan, uintptr_t stream,
                      bool record, nb::handle labels, bool events, nb::handle workspace) {
  // Replays serve calls that want no record and give no workspace of their own (a replayed
  // call needs none, so an allocator is never asked).
  thread_local std::string key;
  const void* data[kMaxReplayOperands];
  const bool keyed = !record && (workspace.is_none() || PyCallable_Check(workspace.ptr())) &&
                     replay_key(p, operands, plan, key, data);
  if (keyed) {
    auto it = replays().find(key);
    if (it != replays().end()) {
      const std::shared_ptr<const tile::Replay> replay = it->second.replay;
      bool launched = false;
      {
        nb::gil_scoped_release release;
        launched = replay->launch(data, reinterpret_cast<void*>(stream));
      }
      if (launched) return nb::none();
    }
  }
  const std::string call_key = keyed ? key : std::string();  // the full path may call back into Python
  RawArrays arrays(p.program->operands().size());
  Bound b = convert(p, operands, labels, arrays, plan);
  std::shared_ptr<const tile::Replay> replay;
  nb::object result = execute(b, stream, record, events, workspace, keyed ? &replay : nullptr);
  // A replay needing a workspace is not kept: this call's workspace (the caller's allocator, or
  // the library's) is not in its key, and the full path asks the allocator each call.
  if (replay && replay->workspace_bytes() == 0) {
    auto& map = replays();
    if (map.size() >= kMaxReplays) map.clear();
    map[call_key] = ReplayEntry{nb::borrow(nb::find(&p)), std::move(replay)};
  }
  return result;
}

void clear_kernel_caches() {
  replays().clear();
  tile::clear_kernel_caches();
}

// The bytes of workspace launch() with these arguments would need (tile::workspace_bytes), on
// the backend and device of the arrays.
int64_t workspace_bytes(const Program& p, nb::handle operands, const std::optional<std::string>& plan,
                        nb::handle labels) {
  DLPackArrays<Input> arrays(p.program->operands().size());
  const Bound b = convert(p, operands, labels, arrays, plan);
  nb::gil_scoped_release release;
  return tile::workspace_bytes(*b.program, b.args, b.options);
}

enum class Introspect { plan, ir, source };

std::string introspect(Introspect what, const Program& p, nb::handle operands, const std::optional<std::string>& plan,
                       nb::handle labels) {
  DLPackArrays<Input> arrays(p.program->operands().size());
  const Bound b = convert(p, operands, labels, arrays, plan);
  switch (what) {
    case Introspect::plan:
      return tile::plan_for(*b.program, b.args, b.options.plan).to_json();
    case Introspect::ir:
      return tile::ir_for(*b.program, b.args, b.options.plan);
    case Introspect::source:
      return tile::source_for(*b.program, b.args, b.options.plan);
  }
  return {};
}

// The float64 reference and the check against it read host memory.
Bound host_call(const Program& p, nb::handle operands, nb::handle labels, DLPackArrays<Input>& arrays) {
  Bound b = convert(p, operands, labels, arrays, std::nullopt);
  if (b.options.backend != tile::Backend::cpu) {
    const auto& decls = p.program->operands();
    size_t first = 0;
    while (!is_row(decls[first].role)) ++first;
    tile::throw_argument_error(p.program->name(), decls[first].name,
                               "arrays in host memory (the float64 reference is computed on the CPU)",
                               "one on cuda:" + std::to_string(b.options.device));
  }
  return b;
}

nb::dict reference(const Program& p, nb::handle operands, nb::handle labels) {
  DLPackArrays<Input> arrays(p.program->operands().size());
  const Bound b = host_call(p, operands, labels, arrays);
  tile::Reference ref;
  {
    nb::gil_scoped_release release;
    ref = tile::reference(*b.program, b.args);
  }
  nb::dict out;
  for (auto& [name, values] : ref) {
    auto* owned = new std::vector<double>(std::move(values.values));
    nb::capsule owner(owned, [](void* v) noexcept { delete static_cast<std::vector<double>*>(v); });
    const size_t n = owned->size();
    out[name.c_str()] = nb::ndarray<nb::numpy, double, nb::ndim<1>>(owned->data(), {n}, owner);
  }
  return out;
}

nb::dict check(const Program& p, nb::handle operands, nb::handle labels) {
  DLPackArrays<Input> arrays(p.program->operands().size());
  const Bound b = host_call(p, operands, labels, arrays);
  tile::OracleCheck c;
  {
    nb::gil_scoped_release release;
    c = tile::check_against_reference(*b.program, b.args);
  }
  nb::dict d;
  d["ok"] = c.ok;
  d["checked"] = c.checked;
  d["mismatches"] = c.mismatches;
  d["max_abs_error"] = c.max_abs_error;
  d["max_rel_error"] = c.max_rel_error;
  d["first_mismatch"] = c.first_mismatch;
  return d;
}

nb::list operand_list(const Program& p) {
  nb::list out;
  const auto& decls = p.program->operands();
  for (const tile::OperandDecl& d : decls) {
    nb::dict o;
    o["name"] = d.name;
    o["role"] = role_id(d.role);
    nb::list dtypes;
    for (tile::DType t : kDTypes)
      if (d.dtypes.contains(t)) dtypes.append(std::string(tile::dtype_name(t)));
    o["dtypes"] = dtypes;
    o["optional"] = d.optional;
    o["may_alias"] = d.may_alias >= 0 ? nb::object(nb::str(decls[d.may_alias].name.c_str())) : nb::none();
    o["scalar_type"] = std::string(tile::value_type_name(d.scalar_type));
    o["default"] = d.default_value ? nb::object(nb::float_(*d.default_value)) : nb::none();
    o["min"] = d.min_value;
    o["max"] = d.max_value;
    o["doc"] = d.doc;
    out.append(o);
  }
  return out;
}

#if TILE_WITH_CUDA
nb::dict device_info(int device) {
  const tile::cuda::DeviceInfo info = tile::cuda::device_info(device);
  nb::dict d;
  d["name"] = info.name;
  d["uuid"] = info.uuid;
  d["ordinal"] = info.ordinal;
  d["arch"] = tile::cuda::arch_name(info);
  d["sm_count"] = info.sm_count;
  d["cc_major"] = info.cc_major;
  d["cc_minor"] = info.cc_minor;
  d["max_threads_per_block"] = info.max_threads_per_block;
  d["max_shared_per_block"] = info.max_shared_per_block;
  d["max_shared_per_block_optin"] = info.max_shared_per_block_optin;
  d["l2_bytes"] = info.l2_bytes;
  d["clock_khz"] = info.clock_khz;
  d["mem_clock_khz"] = info.mem_clock_khz;
  d["mem_bus_width"] = info.mem_bus_width;
  d["driver_version"] = info.driver_version;
  return d;
}
#else
// What the CUDA-only functions raise in a build without CUDA (a RuntimeError).
[[noreturn]] void no_cuda(const char* function) {
  throw tile::NoDriverError(std::string(function) +
                            ": no CUDA backend: Tile was built without CUDA (TILE_WITH_CUDA=OFF)");
}
#endif

// The file libtile.so was loaded from, for run records.
std::string library_path() {
  Dl_info info{};
  auto fn = &tile::clear_kernel_caches;
  if (dladdr(reinterpret_cast<void*>(fn), &info) && info.dli_fname) return info.dli_fname;
  return {};
}

nb::dict build_info() {
  nb::dict d;
  d["version"] = TILE_VERSION;
  d["git_commit"] = TILE_GIT_COMMIT;
  d["git_dirty"] = bool(TILE_GIT_DIRTY);
  d["library"] = library_path();
  d["nanobind"] = std::to_string(NB_VERSION_MAJOR) + "." + std::to_string(NB_VERSION_MINOR) + "." +
                  std::to_string(NB_VERSION_PATCH);
  d["compiler"] = __VERSION__;
  d["cuda"] = bool(TILE_WITH_CUDA);
  return d;
}

// tile.InternalError (a RuntimeError): a broken invariant inside the library, never the caller's.
PyObject* internal_error_type = nullptr;

void translate(const std::exception_ptr& p, void*) { translate_error(p, internal_error_type); }

void bind_program(nb::module_& m) {
  using tile::DTypeSet;
  nb::class_<Program>(m, "Program",
                      "A row program: tile.RowProgram builds on it (python/tile/_program.py). Operands and "
                      "expressions are integer ids; expressions pass as (program, id).")
      .def(
          "__init__",
          [](Program* self, const std::string& name) {
            new (self) Program();
            self->owned = std::make_unique<tile::RowProgram>(name);
            self->program = self->owned.get();
          },
          nb::arg("name"))
      .def_static(
          "builtin",
          [](const std::string& name) {
            Program p;
            p.builtin = tile::parse_op(name);
            p.program = &tile::builtin_program(*p.builtin);
            return p;
          },
          nb::arg("name"))
      .def_static(
          "library",
          [](const std::string& name, bool label_smoothing, bool softcap) {
            // The training operators' programs (include/tile/training.hpp); cross-entropy's in
            // the variant with or without its label_smoothing and softcap scalars.
            Program p;
            static const std::pair<const char*, tile::CrossEntropyPass> passes[] = {
                {"cross_entropy", tile::CrossEntropyPass::forward},
                {"cross_entropy_fused", tile::CrossEntropyPass::fused},
                {"cross_entropy_backward", tile::CrossEntropyPass::backward}};
            p.program = nullptr;
            for (const auto& [n, pass] : passes)
              if (name == n) p.program = &tile::cross_entropy_program(pass, label_smoothing, softcap);
            if (!p.program) p.program = &tile::training_program(name);
            return p;
          },
          nb::arg("name"), nb::arg("label_smoothing") = false, nb::arg("softcap") = false)
      .def_static("library_names", [] { return tile::training_program_names(); })
      .def_prop_ro("name", [](const Program& p) { return p.program->name(); })
      .def_prop_ro("is_builtin", [](const Program& p) { return p.builtin.has_value(); })
      .def_prop_ro("serial", [](const Program& p) { return p.program->serial(); })
      .def("operands", &operand_list)
      .def("validate", [](const Program& p) { p.program->validate(); })
      .def("to_string", [](const Program& p) { return p.program->to_string(); })
      .def("node",
           [](const Program& p, int id) {
             const auto& nodes = p.program->nodes();
             if (id < 0 || id >= int(nodes.size())) throw tile::InternalError("node id out of range");
             return std::make_pair(std::string(tile::value_type_name(nodes[id].type)),
                                   tile::shape_name(nodes[id].shape));
           })
      .def("row_in",
           [](Program& p, const std::string& name, const std::vector<std::string>& dtypes, const std::string& doc,
              bool optional) { return p.builder().row_in(name, dtype_set(dtypes), doc, optional).id; })
      .def("row_out",
           [](Program& p, const std::string& name, const std::vector<std::string>& dtypes, int may_alias,
              const std::string& doc, bool optional) {
             tile::RowProgram& b = p.builder();
             return b
                 .row_out(name, dtype_set(dtypes), may_alias < 0 ? tile::Operand{} : operand(may_alias), doc, optional)
                 .id;
           })
      .def("row_scalar_in",
           [](Program& p, const std::string& name, const std::vector<std::string>& dtypes, const std::string& doc,
              bool optional) { return p.builder().row_scalar_in(name, dtype_set(dtypes), doc, optional).id; })
      .def("row_scalar_out",
           [](Program& p, const std::string& name, const std::vector<std::string>& dtypes, bool optional,
              const std::string& doc) { return p.builder().row_scalar_out(name, dtype_set(dtypes), optional, doc).id; })
      .def("col_in",
           [](Program& p, const std::string& name, const std::vector<std::string>& dtypes, bool optional,
              const std::string& doc) { return p.builder().col_in(name, dtype_set(dtypes), optional, doc).id; })
      .def("col_out",
           [](Program& p, const std::string& name, const std::vector<std::string>& dtypes, bool optional,
              const std::string& doc) { return p.builder().col_out(name, dtype_set(dtypes), optional, doc).id; })
      .def("scalar_in",
           [](Program& p, const std::string& name, const std::string& type, std::optional<double> default_value,
              const std::string& doc) {
             tile::RowProgram& b = p.builder();
             if (type != "f32" && type != "i64")
               throw tile::Error("row program '" + b.name() + "': scalar '" + name +
                                 "': expected type f32 or i64, got " + type);
             return b.scalar_in(name, type == "f32" ? tile::ValueType::f32 : tile::ValueType::i64, default_value, doc)
                 .id;
           })
      .def("scalar_out",
           [](Program& p, const std::string& name, const std::vector<std::string>& dtypes, bool optional,
              const std::string& doc) { return p.builder().scalar_out(name, dtype_set(dtypes), optional, doc).id; })
      .def("scalar_range",
           [](Program& p, int scalar, double lo, double hi) {
             tile::RowProgram& b = p.builder();
             b.scalar_range(operand(scalar), lo, hi);
           })
      .def("load",
           [](Program& p, int id) {
             tile::RowProgram& b = p.builder();
             return b.load(operand(id)).id;
           })
      .def("load_or",
           [](Program& p, int id, double absent) {
             tile::RowProgram& b = p.builder();
             return b.load_or(operand(id), absent).id;
           })
      .def("constant", [](Program& p, double v) { return p.builder().constant(v).id; })
      .def("integer", [](Program& p, int64_t v) { return p.builder().integer(v).id; })
      .def("cols", [](Program& p) { return p.builder().cols().id; })
      .def("col_index", [](Program& p) { return p.builder().col_index().id; })
      .def("unary", [](Program& p, const std::string& fn,
                       const ExprRef& a) { return p.builder().unary(unary_fn(fn), expr(a)).id; })
      .def("binary", [](Program& p, const std::string& fn, const ExprRef& a,
                        const ExprRef& b) { return p.builder().binary(binary_fn(fn), expr(a), expr(b)).id; })
      .def("select", [](Program& p, const ExprRef& c, const ExprRef& a,
                        const ExprRef& b) { return p.builder().select(expr(c), expr(a), expr(b)).id; })
      .def("reduce",
           [](Program& p, const std::string& ax, const std::string& m, const std::vector<ExprRef>& inputs) {
             tile::RowProgram& b = p.builder();
             std::vector<tile::RowExpr> in;
             for (const ExprRef& e : inputs) in.push_back(expr(e));
             std::vector<int> ids;
             for (const tile::RowExpr& r : b.reduce(axis(ax), monoid(m), in)) ids.push_back(r.id);
             return ids;
           })
      .def("reduce1", [](Program& p, const std::string& ax, const std::string& m,
                         const ExprRef& input) { return p.builder().reduce1(axis(ax), monoid(m), expr(input)).id; })
      .def("reduce2",
           [](Program& p, const std::string& ax, const std::string& m, const ExprRef& input) {
             auto [a, b] = p.builder().reduce2(axis(ax), monoid(m), expr(input));
             return std::make_pair(a.id, b.id);
           })
      .def("store", [](Program& p, int id, const ExprRef& value) {
        tile::RowProgram& b = p.builder();
        b.store(operand(id), expr(value));
      });

  m.def(
      "monoid_parts",
      [](const std::string& name) {
        const tile::Monoid mo = monoid(name);
        return std::make_pair(mo.parts, mo.inputs);
      },
      nb::arg("name"), "The parts of a built-in monoid's state and the number of inputs it folds.");
}

}  // namespace

NB_MODULE(_tile, m) {
  // The replays hold programs and kernels: released at interpreter exit, before finalization.
  nb::module_::import_("atexit").attr("register")(nb::cpp_function([] { replays().clear(); }));
  m.doc() = "Tile: generated row-reduction kernels for built-in and user-written row programs.";
  internal_error_type = PyErr_NewExceptionWithDoc(
      "tile.InternalError", "A broken invariant inside Tile: a library bug, never a bad argument.", PyExc_RuntimeError,
      nullptr);
  m.attr("InternalError") = nb::handle(internal_error_type);
  nb::register_exception_translator(translate);
  // NVIDIA's NVRTC wheels are found through sys.path; NVRTC itself loads on the first compile.
  std::vector<std::string> package_dirs;
  for (nb::handle dir : nb::module_::import_("sys").attr("path"))
    if (nb::isinstance<nb::str>(dir)) package_dirs.push_back(nb::cast<std::string>(dir));
#if TILE_WITH_CUDA
  tile::cuda::set_python_package_dirs(std::move(package_dirs));
#endif
  // Raises the C++ InternalError of a failed internal check, to test its translation.
  m.def("_raise_internal_error", [] { TILE_CHECK(false, "raised on request"); });

  bind_program(m);

  const char* operands_doc =
      "operands: a dict of operand name -> array (row, per-row, per-column and scalar-output operands), number "
      "(scalar inputs) or None (absent); labels: a dict renaming operands in conversion errors.";
  m.def("launch", &launch, nb::arg("program"), nb::arg("operands"), nb::arg("plan").none() = nb::none(),
        nb::arg("stream") = 0, nb::arg("record") = true, nb::arg("labels").none() = nb::none(),
        nb::arg("events") = false, nb::arg("workspace").none() = nb::none(),
        (std::string("Runs a program on the backend of its arrays' device (CPU or CUDA; stream: a CUstream "
                     "handle) and returns the launch record (None when record is false, unless events is true "
                     "and the call compiled or loaded its kernel). ") +
         operands_doc +
         " workspace: None (the library's own), a tuple (pointer, bytes) of memory on the arrays' device, or a "
         "callable allocate(bytes, device, stream) -> (pointer, owner), called on the CUDA backend when the call "
         "needs a workspace (workspace_bytes), owner held until the launch is enqueued.")
            .c_str());
  m.def("launch_raw", &launch_raw, nb::arg("program"), nb::arg("operands"), nb::arg("plan").none() = nb::none(),
        nb::arg("stream") = 0, nb::arg("record") = true, nb::arg("labels").none() = nb::none(),
        nb::arg("events") = false, nb::arg("workspace").none() = nb::none(),
        "launch() with each array given as a tuple (data_ptr, shape, strides in elements, dtype code, device "
        "index; -1 for the CPU): the same conversion and launch without a DLPack capsule per array.");
  m.def("workspace_bytes", &workspace_bytes, nb::arg("program"), nb::arg("operands"),
        nb::arg("plan").none() = nb::none(), nb::arg("labels").none() = nb::none(),
        "The bytes of workspace launch() with these operands needs on their device (0 when none: only reductions "
        "over the rows need one); launches nothing.");
  nb::dict codes;  // the dtype codes of launch_raw, by the name numpy and torch give the dtype
  codes["float32"] = int(tile::DType::f32);
  codes["float16"] = int(tile::DType::f16);
  codes["bfloat16"] = int(tile::DType::bf16);
  codes["int32"] = int(tile::DType::i32);
  codes["int64"] = int(tile::DType::i64);
  codes["float64"] = int(tile::DType::f64);
  m.attr("RAW_DTYPE_CODES") = codes;
  for (auto [name, what] : {std::pair{"plan", Introspect::plan}, std::pair{"ir", Introspect::ir},
                            std::pair{"source", Introspect::source}}) {
    m.def(
        name,
        [what](const Program& p, nb::handle operands, const std::optional<std::string>& plan, nb::handle labels) {
          return introspect(what, p, operands, plan, labels);
        },
        nb::arg("program"), nb::arg("operands"), nb::arg("plan").none() = nb::none(),
        nb::arg("labels").none() = nb::none(),
        what == Introspect::plan ? "The resolved mapping plan, as JSON, that launch() would run."
        : what == Introspect::ir ? "The raw IR launch() would run."
                                 : "The generated CUDA source launch() would compile.");
  }
  m.def("reference", &reference, nb::arg("program"), nb::arg("operands"), nb::arg("labels").none() = nb::none(),
        "The float64 evaluation of the program over host arrays: a dict of output name -> 1-d float64 array, in "
        "row-major order (tile::reference).");
  m.def("check", &check, nb::arg("program"), nb::arg("operands"), nb::arg("labels").none() = nb::none(),
        "Every present output (host arrays) against the float64 reference (tile::check_against_reference).");

  m.def("clear_kernel_caches", &clear_kernel_caches,
        "Forgets every lowered, compiled and loaded kernel of the process (the disk cache stays).");
#if TILE_WITH_CUDA
  m.def(
      "cache_dir",
      []() -> std::optional<std::string> {
        std::string dir = tile::cuda::cache_dir().string();
        if (dir.empty()) return std::nullopt;
        return dir;
      },
      "The kernel cache folder, or None when no folder is configured.");
  m.def("disk_cache_enabled", &tile::cuda::disk_cache_enabled);
  m.def("nvrtc_version", &tile::cuda::nvrtc_version, "The NVRTC version libtile.so uses, e.g. '13.0'.");
  m.def("nvrtc_library", &tile::cuda::nvrtc_library, "The path of the libnvrtc libtile.so loaded.");
  m.def("driver_available", &tile::cuda::driver_available, "True when libcuda loads and a device exists.");
  m.def("device_info", &device_info, nb::arg("device") = 0, "Properties of a CUDA device (needs a driver).");
#else
  m.def("cache_dir", []() -> std::optional<std::string> { return std::nullopt; });
  m.def("disk_cache_enabled", [] { return false; });
  m.def("nvrtc_version", []() -> std::string { no_cuda("nvrtc_version"); });
  m.def("nvrtc_library", []() -> std::string { no_cuda("nvrtc_library"); });
  m.def("driver_available", [] { return false; }, "False: Tile was built without CUDA.");
  m.def("device_info", [](int) -> nb::dict { no_cuda("device_info"); }, nb::arg("device") = 0);
#endif
  m.def("build_info", &build_info, "Version, git commit and build of this extension and the libtile.so it loaded.");
}
