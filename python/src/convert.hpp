// How the Python extensions read an array operand and report what is wrong with it: shared
// by tile._tile (python/src/module.cpp: DLPack arrays and launch_raw's integers) and the
// optional tile._torch_C (python/src/torch_ext.cpp: at::Tensor), so that each way in checks
// the same things in the same order and says so in the same words.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <algorithm>
#include <cstdint>
#include <exception>
#include <optional>
#include <string>
#include <vector>

// Included by the modules between visibility push(default) and pop (module.cpp says why).
#if TILE_WITH_CUDA
#include "backend/cuda/jit_module.hpp"  // tile::cuda::CompileError
#endif
#include "tile/tile.hpp"

namespace tile_py {

namespace nb = nanobind;

inline constexpr int kDLCPU = 1;
inline constexpr int kDLCUDA = 2;

inline constexpr tile::DType kDTypes[] = {tile::DType::f32,  tile::DType::f64, tile::DType::f16,
                                          tile::DType::bf16, tile::DType::i32, tile::DType::i64};

inline bool is_row(tile::Role r) { return r == tile::Role::row_in || r == tile::Role::row_out; }
inline bool is_row_scalar(tile::Role r) { return r == tile::Role::row_scalar_in || r == tile::Role::row_scalar_out; }
inline bool is_col(tile::Role r) { return r == tile::Role::col_in || r == tile::Role::col_out; }

inline std::string tuple_string(const int64_t* values, size_t n) {
  std::string s = "(";
  for (size_t i = 0; i < n; ++i) s += (i ? ", " : "") + std::to_string(values[i]);
  return s + (n == 1 ? ",)" : ")");
}

inline std::string dtype_string(nb::dlpack::dtype t) {
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

inline constexpr nb::dlpack::dtype kF16{uint8_t(nb::dlpack::dtype_code::Float), 16, 1};
inline constexpr nb::dlpack::dtype kBF16{uint8_t(nb::dlpack::dtype_code::Bfloat), 16, 1};

// The DLPack dtype of each tile::DType, in enum order (the raw dtype codes).
inline nb::dlpack::dtype dlpack_dtype(tile::DType t) {
  switch (t) {
    case tile::DType::f32:
      return nb::dtype<float>();
    case tile::DType::f16:
      return kF16;
    case tile::DType::bf16:
      return kBF16;
    case tile::DType::i32:
      return nb::dtype<int32_t>();
    case tile::DType::i64:
      return nb::dtype<int64_t>();
    case tile::DType::f64:
      return nb::dtype<double>();
  }
  return {};
}

// numpy's and torch's names of the dtypes an operand accepts: "float32, float64, float16 or bfloat16".
inline std::string dtype_names(tile::DTypeSet set) {
  static const char* names[] = {"float32", "float16", "bfloat16", "int32", "int64", "float64"};
  std::vector<std::string> in;
  for (tile::DType t : kDTypes)
    if (set.contains(t)) in.emplace_back(names[int(t)]);
  std::string out;
  for (size_t i = 0; i < in.size(); ++i) out += (i == 0 ? "" : i + 1 == in.size() ? " or " : ", ") + in[i];
  return out;
}

struct Device {
  int type = kDLCPU, id = 0;
  bool operator==(const Device& o) const { return type == o.type && (type == kDLCPU || id == o.id); }
};

inline std::string device_string(Device d) {
  if (d.type == kDLCPU) return "cpu";
  if (d.type == kDLCUDA) return "cuda:" + std::to_string(d.id);
  return "DLPack device type " + std::to_string(d.type) + " (id " + std::to_string(d.id) + ")";
}

// What the conversion reads of an array, whichever way it came: imported through DLPack or as
// plain integers (launch_raw). Shape and strides are in elements and point into storage that
// outlives the call.
struct ArrayInfo {
  const void* data = nullptr;
  nb::dlpack::dtype dtype{};
  size_t ndim = 0;
  const int64_t* shape = nullptr;
  const int64_t* strides = nullptr;
  Device device;
};

inline std::string layout(const ArrayInfo& a) {
  return "shape " + tuple_string(a.shape, a.ndim) + " strides " + tuple_string(a.strides, a.ndim) + " (in elements)";
}

// Views carry non-const pointers; inputs are only read.
inline void* mutable_data(const void* p) { return const_cast<void*>(p); }

// What one conversion needs beside the array: the operator's and the argument's names and the
// operand's declaration.
struct Slot {
  const std::string& op;
  const std::string& arg;
  const tile::OperandDecl& decl;
};

inline tile::DType checked_dtype(const Slot& s, const ArrayInfo& a) {
  for (tile::DType t : kDTypes)
    if (a.dtype == dlpack_dtype(t) && s.decl.dtypes.contains(t)) return t;
  tile::throw_argument_error(s.op, s.arg, "dtype " + dtype_names(s.decl.dtypes), dtype_string(a.dtype));
}

inline void check_device(const Slot& s, const ArrayInfo& a, std::optional<Device> like, const std::string& like_name) {
  const Device d = a.device;
  if (like && !(d == *like))
    tile::throw_argument_error(s.op, s.arg, "an array on " + device_string(*like) + " like " + like_name,
                               "one on " + device_string(d));
  if (d.type != kDLCPU && d.type != kDLCUDA)
    tile::throw_argument_error(s.op, s.arg, "a CPU or CUDA array", "one on " + device_string(d));
}

// The stride between consecutive items when dimensions [0, n) of `a` flatten to one stride;
// dimensions of extent 1 take no part (their strides are arbitrary). `unit` is the stride of
// a single item.
inline int64_t flat_stride(const Slot& s, const ArrayInfo& a, size_t n, int64_t unit, const char* what) {
  int64_t stride = unit;
  int inner = -1;  // innermost dimension of extent > 1
  for (int i = int(n) - 1; i >= 0; --i) {
    if (a.shape[i] == 1) continue;
    int64_t flat = 0;
    if (inner < 0) {
      stride = a.strides[i];
    } else if (__builtin_mul_overflow(a.strides[inner], a.shape[inner], &flat) || a.strides[i] != flat) {
      tile::throw_argument_error(
          s.op, s.arg, std::string(what) + " (stride[i] == stride[i+1] * shape[i+1] over dimensions of extent > 1)",
          layout(a));
    }
    inner = i;
  }
  return stride;
}

// The product of extents [0, n), refusing negative extents and wrapped products.
inline int64_t count(const Slot& s, const ArrayInfo& a, size_t n, const char* what) {
  for (size_t i = 0; i < a.ndim; ++i)
    if (a.shape[i] < 0) tile::throw_argument_error(s.op, s.arg, "a shape of extents >= 0", layout(a));
  int64_t product = 1;
  bool wrapped = false;
  for (size_t i = 0; i < n; ++i) wrapped |= __builtin_mul_overflow(product, a.shape[i], &product);
  const bool empty = std::find(a.shape, a.shape + n, 0) != a.shape + n;
  if (wrapped && !empty)
    tile::throw_argument_error(s.op, s.arg, std::string(what) + " whose product (the rows) is below 2^63", layout(a));
  return empty ? 0 : product;
}

// A row operand: the leading dimensions flatten to rows of one stride, the last one is the
// contiguous column dimension.
inline tile::TensorView as_matrix(const Slot& s, const ArrayInfo& a) {
  const size_t n = a.ndim;
  if (n == 0) tile::throw_argument_error(s.op, s.arg, "an array of at least one dimension", "a 0-d array");
  const int64_t rows = count(s, a, n - 1, "leading extents");
  const int64_t cols = a.shape[n - 1];
  const tile::DType dtype = checked_dtype(s, a);
  // An empty array has arbitrary strides.
  if (rows == 0 || cols == 0) return tile::TensorView{mutable_data(a.data), dtype, rows, cols, cols};
  if (cols > 1 && a.strides[n - 1] != 1)
    tile::throw_argument_error(s.op, s.arg, "a contiguous last dimension (stride 1)", layout(a));
  int64_t row_stride = cols;
  if (rows > 1) {
    row_stride = flat_stride(s, a, n - 1, cols, "leading dimensions that flatten to rows of one stride");
    if (row_stride < cols)
      tile::throw_argument_error(
          s.op, s.arg, "rows at increasing addresses that do not overlap (row stride >= " + std::to_string(cols) + ")",
          layout(a));
  }
  return tile::TensorView{mutable_data(a.data), dtype, rows, cols, row_stride};
}

// A per-row operand: the leading shape of the first row operand, one value per row; its
// dimensions flatten to one stride (bind refuses strides below 1).
inline tile::VectorView as_row_values(const Slot& s, const ArrayInfo& a, const ArrayInfo& rows_like,
                                      const std::string& like) {
  const size_t n = rows_like.ndim - 1;
  if (a.ndim != n || !std::equal(a.shape, a.shape + n, rows_like.shape))
    tile::throw_argument_error(s.op, s.arg,
                               "shape " + tuple_string(rows_like.shape, n) + " (one value per row of " + like + ")",
                               "shape " + tuple_string(a.shape, a.ndim));
  const tile::DType dtype = checked_dtype(s, a);
  const int64_t rows = count(s, a, n, "extents");
  const int64_t stride = rows <= 1 ? 1 : flat_stride(s, a, n, 1, "dimensions that flatten to one stride");
  return tile::VectorView{a.data, dtype, rows, stride};
}

// A per-column operand: one contiguous value per column.
inline tile::VectorView as_columns(const Slot& s, const ArrayInfo& a, int64_t cols) {
  if (a.ndim != 1 || a.shape[0] != cols || (cols > 1 && a.strides[0] != 1))
    tile::throw_argument_error(
        s.op, s.arg, "shape (" + std::to_string(cols) + ",) with stride 1 (one element per column)", layout(a));
  return tile::VectorView{a.data, checked_dtype(s, a), cols};
}

// A scalar output: an array of one element, of any shape.
inline tile::VectorView as_one_value(const Slot& s, const ArrayInfo& a) {
  int64_t n = 1;
  for (size_t i = 0; i < a.ndim; ++i) n *= a.shape[i] < 0 ? 0 : a.shape[i];
  if (n != 1) tile::throw_argument_error(s.op, s.arg, "an array of one element", layout(a));
  return tile::VectorView{a.data, checked_dtype(s, a), 1};
}

// A plan given as JSON, its parse errors naming the operator called and the field as
// plan.<field>, as the refusals of a plan matched to the call do.
inline tile::PlanRequest parse_plan(const std::string& op, const std::string& text) {
  return tile::PlanRequest::from_json(text, op, "plan");
}

// tile::bind's one-precision rule (float64 with no other float dtype), said with the labels and
// numpy's and torch's dtype names: a call's float operands are all float64, or none is.
inline void check_one_precision(const std::string& op, const std::vector<tile::OperandDecl>& decls,
                                const std::vector<std::string>& names, const tile::Args& args) {
  static const char* long_names[] = {"float32", "float16", "bfloat16", "int32", "int64", "float64"};
  int first_f64 = -1, first_other = -1;
  std::vector<tile::DType> dtypes(decls.size(), tile::DType::i64);
  for (size_t i = 0; i < decls.size(); ++i) {
    auto it = args.values().find(decls[i].name);
    if (it == args.values().end() || it->second.index() == 2) continue;
    const tile::DType t = it->second.index() == 0 ? std::get<tile::TensorView>(it->second).dtype
                                                  : std::get<tile::VectorView>(it->second).dtype;
    if (!tile::is_float(t)) continue;
    dtypes[i] = t;
    int& first = t == tile::DType::f64 ? first_f64 : first_other;
    if (first < 0) first = int(i);
  }
  if (first_f64 < 0 || first_other < 0) return;
  const size_t early = size_t(std::min(first_f64, first_other)), late = size_t(std::max(first_f64, first_other));
  const std::string like = names[early] + " (" + long_names[int(dtypes[early])] + ")";
  tile::throw_argument_error(
      op, names[late],
      int(late) == first_other
          ? "dtype float64 like " + like + ": a float64 call has every float operand in float64"
          : "a float dtype other than float64 like " + like + ", or every float operand in float64",
      long_names[int(dtypes[late])]);
}

// tile::Error is a caller's mistake (ValueError) unless it reports a missing driver, a failed
// NVRTC compile or a failed driver call; those are RuntimeErrors. Internal errors are
// tile.InternalError.
inline void translate_error(const std::exception_ptr& p, PyObject* internal_error_type) {
  try {
    std::rethrow_exception(p);
  } catch (const tile::NoDriverError& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
#if TILE_WITH_CUDA
  } catch (const tile::cuda::CompileError& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
#endif
  } catch (const tile::Error& e) {
    // Driver, NVRTC and module-loading failures and calls refused during CUDA-graph capture are
    // plain tile::Errors (driver.cpp, jit_module.cpp, target.cpp), not the caller's arguments;
    // told apart by prefix.
    const std::string what = e.what();
    bool runtime = false;
    for (const char* prefix : {"CUDA driver call failed", "NVRTC call failed", "get_function:", "CUDA-graph capture:"})
      runtime |= what.rfind(prefix, 0) == 0;
    PyErr_SetString(runtime ? PyExc_RuntimeError : PyExc_ValueError, e.what());
  } catch (const tile::InternalError& e) {
    PyErr_SetString(
        internal_error_type,
        (std::string(e.what()) + " [a bug in the Tile library, not in the call: please report it]").c_str());
  }
}

}  // namespace tile_py
