// tile._tile: the compiled half of the Python package.
//
// Arrays arrive through DLPack (launch, plan, ir, source) or, for torch tensors, as plain
// integers (launch_raw: pointer, shape, strides, dtype code, device), and become
// tile::TensorView / VectorView without copies: the leading dimensions of x and out flatten to
// rows of one row stride, the last one is the contiguous column dimension. Both ways share one
// set of checks (bind) and one launch (execute). CPU arrays run on the CPU backend, CUDA arrays
// on the CUDA backend. python/tile/__init__.py allocates outputs and resolves streams; this file
// checks, binds and launches. Tests: tests/python/.
#include <dlfcn.h>
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <algorithm>
#include <cstdint>
#include <exception>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

// The module is compiled with hidden visibility, libtile.so with default visibility; the
// library's types keep default visibility here so its exceptions are caught by type.
#pragma GCC visibility push(default)
#if TILE_WITH_CUDA
#include "backend/cuda/driver.hpp"      // needs only <cuda.h>: DeviceInfo, ensure_context
#include "backend/cuda/jit_module.hpp"  // needs only <cuda.h>: the NVRTC cache
#include "backend/cuda/nvrtc.hpp"       // needs only <nvrtc.h>: where NVRTC is searched for
#endif
#include "tile/tile.hpp"
#pragma GCC visibility pop
#include "tile_git_commit.h"  // generated on every build: TILE_GIT_COMMIT, TILE_GIT_DIRTY

#ifndef TILE_VERSION
#define TILE_VERSION "unknown"
#endif

namespace nb = nanobind;

namespace {

using Input = nb::ndarray<nb::ro>;  // x, weight, bias: read-only access suffices
using Output = nb::ndarray<>;       // out: must be writable

constexpr int kDLCPU = 1;
constexpr int kDLCUDA = 2;

std::string tuple_string(const int64_t* values, size_t n) {
  std::string s = "(";
  for (size_t i = 0; i < n; ++i) s += (i ? ", " : "") + std::to_string(values[i]);
  return s + (n == 1 ? ",)" : ")");
}

std::string dtype_string(nb::dlpack::dtype t) {
  using Code = nb::dlpack::dtype_code;
  std::string name;
  switch (Code(t.code)) {
    case Code::Int:
      name = "int";
      break;
    case Code::UInt:
      name = "uint";
      break;
    case Code::Float:
      name = "float";
      break;
    case Code::Bfloat:
      name = "bfloat";
      break;
    case Code::Complex:
      name = "complex";
      break;
    case Code::Bool:
      name = "bool";
      break;
    default:
      name = "DLPack type code " + std::to_string(t.code) + " of ";
      break;
  }
  name += std::to_string(t.bits);
  if (t.lanes != 1) name += "x" + std::to_string(t.lanes);
  return name;
}

constexpr nb::dlpack::dtype kF16{uint8_t(nb::dlpack::dtype_code::Float), 16, 1};
constexpr nb::dlpack::dtype kBF16{uint8_t(nb::dlpack::dtype_code::Bfloat), 16, 1};

tile::DType dtype_of(const std::string& op, const char* arg, nb::dlpack::dtype t) {
  if (t == nb::dtype<float>()) return tile::DType::f32;
  if (t == kF16) return tile::DType::f16;
  if (t == kBF16) return tile::DType::bf16;
  tile::throw_argument_error(op, arg, "dtype float32, float16 or bfloat16", dtype_string(t));
}

struct Device {
  int type = kDLCPU, id = 0;
  bool operator==(const Device& o) const { return type == o.type && (type == kDLCPU || id == o.id); }
};

std::string device_string(Device d) {
  if (d.type == kDLCPU) return "cpu";
  if (d.type == kDLCUDA) return "cuda:" + std::to_string(d.id);
  return "DLPack device type " + std::to_string(d.type) + " (id " + std::to_string(d.id) + ")";
}

// What the checks read of an array, whichever way it came: imported through DLPack (launch,
// plan, ir, source) or as plain integers (launch_raw). Shape and strides are in elements and
// point into storage that outlives the call.
struct ArrayInfo {
  const void* data = nullptr;
  nb::dlpack::dtype dtype{};
  size_t ndim = 0;
  const int64_t* shape = nullptr;
  const int64_t* strides = nullptr;
  Device device;
};

std::string layout(const ArrayInfo& a) {
  return "shape " + tuple_string(a.shape, a.ndim) + " strides " + tuple_string(a.strides, a.ndim) + " (in elements)";
}

Device device_of(const std::string& op, const char* arg, const ArrayInfo& a, std::optional<Device> like) {
  const Device d = a.device;
  if (like && !(d == *like))
    tile::throw_argument_error(op, arg, "an array on " + device_string(*like) + " like x",
                               "one on " + device_string(d));
  if (d.type != kDLCPU && d.type != kDLCUDA)
    tile::throw_argument_error(op, arg, "a CPU or CUDA array", "one on " + device_string(d));
  return d;
}

// Views carry non-const pointers; x, weight and bias are only read.
inline void* mutable_data(const void* p) { return const_cast<void*>(p); }

// Leading dimensions flatten to rows when they collapse to a single row stride; dimensions of
// extent 1 take no part (their strides are arbitrary).
tile::TensorView as_matrix(const std::string& op, const char* arg, const ArrayInfo& a) {
  const size_t n = a.ndim;
  if (n == 0) tile::throw_argument_error(op, arg, "an array of at least one dimension", "a 0-d array");
  for (size_t i = 0; i < n; ++i)
    if (a.shape[i] < 0) tile::throw_argument_error(op, arg, "a shape of extents >= 0", layout(a));
  const int64_t cols = a.shape[n - 1];
  // rows: the product of the leading extents, 0 if any is 0, and never a wrapped product.
  int64_t rows = 1;
  bool wrapped = false;
  for (size_t i = 0; i + 1 < n; ++i) wrapped |= __builtin_mul_overflow(rows, a.shape[i], &rows);
  const bool empty = std::find(a.shape, a.shape + n - 1, 0) != a.shape + n - 1;
  if (wrapped && !empty)
    tile::throw_argument_error(op, arg, "leading extents whose product (the rows) is below 2^63", layout(a));
  if (empty) rows = 0;
  int64_t row_stride = cols;
  const tile::DType dtype = dtype_of(op, arg, a.dtype);
  // An empty array has arbitrary strides.
  if (rows == 0 || cols == 0) return tile::TensorView{mutable_data(a.data), dtype, rows, cols, row_stride};
  if (cols > 1 && a.strides[n - 1] != 1)
    tile::throw_argument_error(op, arg, "a contiguous last dimension (stride 1)", layout(a));
  if (rows > 1) {
    int inner = -1;  // innermost leading dimension of extent > 1
    for (int i = int(n) - 2; i >= 0; --i) {
      if (a.shape[i] == 1) continue;
      int64_t flat = 0;
      if (inner < 0) {
        row_stride = a.strides[i];
      } else if (__builtin_mul_overflow(a.strides[inner], a.shape[inner], &flat) || a.strides[i] != flat) {
        tile::throw_argument_error(op, arg,
                                   "leading dimensions that flatten to rows of one stride "
                                   "(stride[i] == stride[i+1] * shape[i+1] over dimensions of extent > 1)",
                                   layout(a));
      }
      inner = i;
    }
    if (row_stride < cols)
      tile::throw_argument_error(
          op, arg, "rows at increasing addresses that do not overlap (row stride >= " + std::to_string(cols) + ")",
          layout(a));
  }
  return tile::TensorView{mutable_data(a.data), dtype, rows, cols, row_stride};
}

tile::VectorView as_vector(const std::string& op, const char* arg, const ArrayInfo& a, int64_t cols) {
  if (a.ndim != 1 || a.shape[0] != cols || (cols > 1 && a.strides[0] != 1))
    tile::throw_argument_error(op, arg, "shape (" + std::to_string(cols) + ",) with stride 1 (one element per column)",
                               layout(a));
  return tile::VectorView{a.data, dtype_of(op, arg, a.dtype), cols};
}

// The arguments of a call, in the order they are checked.
enum Arg { kX, kOut, kWeight, kBias };
constexpr const char* kArgNames[] = {"x", "out", "weight", "bias"};

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
A import_array(const std::string& op, const char* arg, nb::handle h) {
  A a;
  if (!nb::try_cast(h, a, /*convert=*/false)) {
    std::string given = nb::type_name(h.type()).c_str() + export_failure(h);
    if (std::is_same_v<A, Output>) given += " (read-only, or not exportable through DLPack)";
    tile::throw_argument_error(op, arg,
                               std::is_same_v<A, Output> ? "a writable array exporting DLPack (numpy, torch, ...)"
                                                         : "an array exporting DLPack (numpy, torch, ...) of dtype "
                                                           "float32, float16 or bfloat16 in native byte order",
                               given);
  }
  return a;
}

// The arrays of launch, plan, ir and source, imported through DLPack one at a time as bind()
// asks for them, and held for as long as the call may run. Y is Output for launches and Input
// for introspection, which never writes.
template <typename Y>
struct DLPackArrays {
  nb::handle handles[4];
  Input x, weight, bias;
  Y y;

  template <typename A>
  static ArrayInfo info(const A& a) {
    return {a.data(), a.dtype(), a.ndim(), a.shape_ptr(), a.stride_ptr(), Device{a.device_type(), a.device_id()}};
  }

  std::optional<ArrayInfo> operator()(const std::string& op, Arg arg) {
    const nb::handle h = handles[arg];
    switch (arg) {
      case kX:
        return info(x = import_array<Input>(op, "x", h));
      case kOut:
        return info(y = import_array<Y>(op, "out", h));
      case kWeight:
        if (h.is_none()) return std::nullopt;
        return info(weight = import_array<Input>(op, "weight", h));
      case kBias:
        if (h.is_none()) return std::nullopt;
        return info(bias = import_array<Input>(op, "bias", h));
    }
    return std::nullopt;
  }
};

// The arrays of launch_raw: each a tuple (data pointer, shape, strides in elements, dtype code,
// device index; -1 for the CPU) or None for an absent weight or bias. The Python package builds
// these from torch tensors, which costs far less than a DLPack capsule per array.
struct RawArrays {
  static constexpr int kMaxDims = 8;  // shapes and strides of more dimensions go to the heap
  nb::handle handles[4];
  int64_t dims[4][2 * kMaxDims];
  std::vector<int64_t> heap[4];

  static int64_t as_int(nb::handle h, const char* arg) {
    const long long v = PyLong_AsLongLong(h.ptr());
    if (v == -1 && PyErr_Occurred()) {
      PyErr_Clear();
      throw nb::type_error(("launch_raw: argument '" + std::string(arg) +
                            "': expected 64-bit integers in its shape, strides, dtype code and device, got " +
                            nb::repr(h).c_str())
                               .c_str());
    }
    return v;
  }

  std::optional<ArrayInfo> operator()(const std::string&, Arg arg) {
    const nb::handle h = handles[arg];
    const char* name = kArgNames[arg];
    if ((arg == kWeight || arg == kBias) && h.is_none()) return std::nullopt;
    const auto malformed = [&] {
      throw nb::type_error(("launch_raw: argument '" + std::string(name) +
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
    int64_t* d = dims[arg];
    if (a.ndim > kMaxDims) {
      heap[arg].resize(2 * a.ndim);
      d = heap[arg].data();
    }
    for (size_t i = 0; i < a.ndim; ++i) {
      d[i] = as_int(PyTuple_GET_ITEM(shape, i), name);
      d[a.ndim + i] = as_int(PyTuple_GET_ITEM(strides, i), name);
    }
    a.shape = d;
    a.strides = d + a.ndim;
    a.data = PyLong_AsVoidPtr(PyTuple_GET_ITEM(h.ptr(), 0));
    if (!a.data && PyErr_Occurred()) {
      PyErr_Clear();
      malformed();
    }
    const int64_t code = as_int(PyTuple_GET_ITEM(h.ptr(), 3), name);
    switch (code) {
      case int64_t(tile::DType::f32):
        a.dtype = nb::dtype<float>();
        break;
      case int64_t(tile::DType::f16):
        a.dtype = kF16;
        break;
      case int64_t(tile::DType::bf16):
        a.dtype = kBF16;
        break;
      default:
        throw nb::type_error(("launch_raw: argument '" + std::string(name) + "': unknown dtype code " +
                              std::to_string(code) + " (see RAW_DTYPE_CODES)")
                                 .c_str());
    }
    const int64_t device = as_int(PyTuple_GET_ITEM(h.ptr(), 4), name);
    a.device = device < 0 ? Device{kDLCPU, 0} : Device{kDLCUDA, int(device)};
    return a;
  }
};

struct Bound {
  tile::Call call;
  tile::CallOptions options;
};

// Checks and binds a call whichever way its arrays arrive: `arrays(op, arg)` reads one, and
// each is checked before the next is read, so errors come in one order on every path.
template <typename Arrays>
Bound bind(const std::string& op_name, Arrays& arrays, std::optional<double> eps,
           const std::optional<std::string>& plan) {
  Bound b;
  b.call.op = tile::parse_op(op_name);
  const std::string op = tile::op_name(b.call.op);
  const ArrayInfo x = *arrays(op, kX);
  const Device device = device_of(op, "x", x, std::nullopt);
  b.call.x = as_matrix(op, "x", x);

  const ArrayInfo y = *arrays(op, kOut);
  device_of(op, "out", y, device);
  if (y.ndim != x.ndim || !std::equal(y.shape, y.shape + y.ndim, x.shape))
    tile::throw_argument_error(op, "out", "shape " + tuple_string(x.shape, x.ndim) + " like x",
                               "shape " + tuple_string(y.shape, y.ndim));
  b.call.y = as_matrix(op, "out", y);

  if (const std::optional<ArrayInfo> weight = arrays(op, kWeight)) {
    device_of(op, "weight", *weight, device);
    b.call.weight = as_vector(op, "weight", *weight, b.call.x.cols);
  }
  if (const std::optional<ArrayInfo> bias = arrays(op, kBias)) {
    device_of(op, "bias", *bias, device);
    b.call.bias = as_vector(op, "bias", *bias, b.call.x.cols);
  }
  if (eps) b.call.eps = tile::checked_eps(b.call.op, *eps);
  if (plan) b.options.plan = tile::PlanRequest::from_json(*plan);
  b.options.backend = device.type == kDLCUDA ? tile::Backend::cuda : tile::Backend::cpu;
  b.options.device = device.id;
  return b;
}

nb::object json_loads(const std::string& text) { return nb::module_::import_("json").attr("loads")(text); }

// Runs a bound call; returns the launch record as a dict, or None when `record` is false (the
// operators' path, which builds no dict).
nb::object execute(Bound& b, uintptr_t stream, bool record) {
  b.options.stream = reinterpret_cast<void*>(stream);
  tile::LaunchRecord rec;
  {
    nb::gil_scoped_release release;
#if TILE_WITH_CUDA  // without CUDA, tile::run refuses the CUDA backend itself
    if (b.options.backend == tile::Backend::cuda) {
      // The library launches into the current context; it must be the arrays' device.
      tile::cuda::ensure_context(b.options.device);
      const int current = tile::cuda::current_device();
      if (current != b.options.device)
        throw std::runtime_error(tile::op_name(b.call.op) +
                                 ": the arrays are on cuda:" + std::to_string(b.options.device) +
                                 " but the current CUDA context is on cuda:" + std::to_string(current) +
                                 " (make that device current first)");
    }
#endif
    rec = tile::run(b.call, b.options);
  }
  if (!record) return nb::none();
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
  d["cache_origin"] = rec.cache_origin;
  d["compile_ms"] = rec.compile_ms;
  nb::list options;
  for (const std::string& o : rec.compile_options) options.append(o);
  d["compile_options"] = options;
  d["backend"] = b.options.backend == tile::Backend::cuda ? "cuda" : "cpu";
  return d;
}

nb::object launch(const std::string& op, nb::handle x, nb::handle y, nb::handle weight, nb::handle bias,
                  std::optional<double> eps, const std::optional<std::string>& plan, uintptr_t stream, bool record) {
  DLPackArrays<Output> arrays{{x, y, weight, bias}};
  Bound b = bind(op, arrays, eps, plan);
  return execute(b, stream, record);
}

nb::object launch_raw(const std::string& op, nb::handle x, nb::handle y, nb::handle weight, nb::handle bias,
                      std::optional<double> eps, const std::optional<std::string>& plan, uintptr_t stream,
                      bool record) {
  RawArrays arrays{{x, y, weight, bias}, {}, {}};
  Bound b = bind(op, arrays, eps, plan);
  return execute(b, stream, record);
}

enum class Introspect { plan, ir, source };

std::string introspect(Introspect what, const std::string& op, nb::handle x, nb::handle y, nb::handle weight,
                       nb::handle bias, std::optional<double> eps, const std::optional<std::string>& plan) {
  DLPackArrays<Input> arrays{{x, y, weight, bias}};
  const Bound b = bind(op, arrays, eps, plan);
  switch (what) {
    case Introspect::plan:
      return tile::plan_for(b.call, b.options.plan).to_json();
    case Introspect::ir:
      return tile::ir_for(b.call, b.options.plan);
    case Introspect::source:
      return tile::source_for(b.call, b.options.plan);
  }
  return {};
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

// tile::Error is a caller's mistake (ValueError) unless it reports a missing driver, a failed
// NVRTC compile or a failed driver call; those are RuntimeErrors. Internal errors are
// tile.InternalError.
void translate(const std::exception_ptr& p, void*) {
  try {
    std::rethrow_exception(p);
  } catch (const tile::NoDriverError& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
#if TILE_WITH_CUDA
  } catch (const tile::cuda::CompileError& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
#endif
  } catch (const tile::Error& e) {
    // Driver, NVRTC and module-loading failures are plain tile::Errors (driver.cpp,
    // jit_module.cpp), not the caller's arguments; told apart by prefix.
    const std::string what = e.what();
    bool runtime = false;
    for (const char* prefix : {"CUDA driver call failed", "NVRTC call failed", "get_function:"})
      runtime |= what.rfind(prefix, 0) == 0;
    PyErr_SetString(runtime ? PyExc_RuntimeError : PyExc_ValueError, e.what());
  } catch (const tile::InternalError& e) {
    PyErr_SetString(
        internal_error_type,
        (std::string(e.what()) + " [a bug in the Tile library, not in the call: please report it]").c_str());
  }
}

}  // namespace

NB_MODULE(_tile, m) {
  m.doc() = "Tile: generated row-reduction kernels (softmax, log-softmax, RMSNorm, LayerNorm).";
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

  m.def("launch", &launch, nb::arg("op"), nb::arg("x"), nb::arg("out"), nb::arg("weight").none() = nb::none(),
        nb::arg("bias").none() = nb::none(), nb::arg("eps").none() = nb::none(), nb::arg("plan").none() = nb::none(),
        nb::arg("stream") = 0, nb::arg("record") = true,
        "Runs op(x) into out on the backend of x's device (CPU or CUDA; stream: a CUstream handle) "
        "and returns the launch record (None when record is false).");
  m.def("launch_raw", &launch_raw, nb::arg("op"), nb::arg("x"), nb::arg("out"), nb::arg("weight").none() = nb::none(),
        nb::arg("bias").none() = nb::none(), nb::arg("eps").none() = nb::none(), nb::arg("plan").none() = nb::none(),
        nb::arg("stream") = 0, nb::arg("record") = true,
        "launch() with each array given as a tuple (data_ptr, shape, strides in elements, dtype code, device "
        "index; -1 for the CPU): the same checks and launch without a DLPack capsule per array.");
  nb::dict codes;  // the dtype codes of launch_raw, by the name numpy and torch give the dtype
  codes["float32"] = int(tile::DType::f32);
  codes["float16"] = int(tile::DType::f16);
  codes["bfloat16"] = int(tile::DType::bf16);
  m.attr("RAW_DTYPE_CODES") = codes;
  m.def(
      "plan",
      [](const std::string& op, nb::handle x, nb::handle y, nb::handle weight, nb::handle bias,
         std::optional<double> eps, const std::optional<std::string>& plan) {
        return introspect(Introspect::plan, op, x, y, weight, bias, eps, plan);
      },
      nb::arg("op"), nb::arg("x"), nb::arg("out"), nb::arg("weight").none() = nb::none(),
      nb::arg("bias").none() = nb::none(), nb::arg("eps").none() = nb::none(), nb::arg("plan").none() = nb::none(),
      "The resolved mapping plan, as JSON, that launch() would run.");
  m.def(
      "ir",
      [](const std::string& op, nb::handle x, nb::handle y, nb::handle weight, nb::handle bias,
         std::optional<double> eps, const std::optional<std::string>& plan) {
        return introspect(Introspect::ir, op, x, y, weight, bias, eps, plan);
      },
      nb::arg("op"), nb::arg("x"), nb::arg("out"), nb::arg("weight").none() = nb::none(),
      nb::arg("bias").none() = nb::none(), nb::arg("eps").none() = nb::none(), nb::arg("plan").none() = nb::none(),
      "The raw IR launch() would run.");
  m.def(
      "source",
      [](const std::string& op, nb::handle x, nb::handle y, nb::handle weight, nb::handle bias,
         std::optional<double> eps, const std::optional<std::string>& plan) {
        return introspect(Introspect::source, op, x, y, weight, bias, eps, plan);
      },
      nb::arg("op"), nb::arg("x"), nb::arg("out"), nb::arg("weight").none() = nb::none(),
      nb::arg("bias").none() = nb::none(), nb::arg("eps").none() = nb::none(), nb::arg("plan").none() = nb::none(),
      "The generated CUDA source launch() would compile.");

  m.def("clear_kernel_caches", &tile::clear_kernel_caches,
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
