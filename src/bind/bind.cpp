#include "bind/bind.hpp"

#include <algorithm>
#include <array>
#include <cfloat>
#include <cmath>
#include <limits>
#include <memory>
#include <mutex>
#include <numeric>
#include <shared_mutex>
#include <unordered_map>

#include "bind/overlap.hpp"
#include "core/text.hpp"
#include "lower/lower_row_program.hpp"
#include "tile/error.hpp"

namespace tile {

namespace {

bool is_row(Role r) { return r == Role::row_in || r == Role::row_out; }
bool is_row_scalar(Role r) { return r == Role::row_scalar_in || r == Role::row_scalar_out; }
bool is_col(Role r) { return r == Role::col_in || r == Role::col_out; }

std::string shape_text(int64_t rows, int64_t cols, int64_t stride) {
  return "(" + std::to_string(rows) + ", " + std::to_string(cols) + ") with row stride " + std::to_string(stride);
}

std::string number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

const char* kind_of(const Args::Value& v) {
  switch (v.index()) {
    case 0: return "a matrix (TensorView)";
    case 1: return "a vector (VectorView)";
    default: return "a number";
  }
}

// Largest element offset + 1 a view may span: byte offsets of every dtype stay below 2^63 and
// leave room for the kernels' 64-bit index arithmetic.
constexpr int64_t kMaxExtent = (int64_t(1) << 61) - 1;

}  // namespace

const ProgramFacts& facts_of(const RowProgram& program) {
  static std::shared_mutex mutex;
  static std::unordered_map<uint64_t, std::unique_ptr<const ProgramFacts>> cache;
  {
    std::shared_lock lock(mutex);
    if (auto it = cache.find(program.serial()); it != cache.end()) return *it->second;
  }
  program.validate();
  auto f = std::make_unique<ProgramFacts>();
  f->levels = reduction_levels(program);
  // Every merge takes shared slots of its own: a level's combine merge one per state part, its
  // staged merges one per chunk sum or max. The larger of the two, summed over the levels.
  int slots = 0;
  for (const std::vector<int>& level : f->levels) {
    int parts = 0, chunk_reductions = 0;
    for (int red : level) {
      const Monoid& m = program.reductions()[red].monoid;
      parts += int(m.parts.size());
      for (const MonoidNode& n : m.nodes)
        chunk_reductions += n.kind == MonoidNode::Kind::chunk_sum || n.kind == MonoidNode::Kind::chunk_max;
    }
    slots += std::max(parts, chunk_reductions);
  }
  f->merge_parts = std::max(1, slots);
  for (const RowReduction& r : program.reductions()) f->reduces_rows |= r.axis == Axis::rows;
  for (size_t i = 0; i < program.operands().size() && f->first_row_operand < 0; ++i)
    if (is_row(program.operands()[i].role) && !program.operands()[i].optional) f->first_row_operand = int(i);
  TILE_CHECK(f->first_row_operand >= 0, "a validated program without a row operand that is not optional");
  std::unique_lock lock(mutex);
  return *cache.emplace(program.serial(), std::move(f)).first->second;
}

void check_f32_scalar(const std::string& op, const std::string& name, double value) {
  // The kernel reads scalars as fp32. fp32 rounding to nearest errs by at most 2^-24 relative
  // in the normal range; a value that rounds to 0 or inf, or loses more as a subnormal, is not
  // the value the caller asked for.
  const float f = float(value);
  const bool held = value == 0 || (std::isfinite(f) && std::abs(double(f) - value) <= 0x1p-24 * std::abs(value));
  if (!held)
    throw_argument_error(op, name,
                         "a value that float32 holds within rounding (relative error at most 2^-24: magnitudes in "
                         "[1.17549435e-38, 3.40282347e+38], 0, and the subnormals float32 holds exactly)",
                         number(value));
}

void KernelSignature::append_key(std::string& key) const {
  for (size_t i = 0; i < present.size(); ++i) key += present[i] ? char('a' + int(dtypes[i])) : '-';
  key += ';';
}

bool KernelSignature::f64() const {
  for (size_t i = 0; i < dtypes.size(); ++i)
    if (present[i] && dtypes[i] == DType::f64) return true;
  return false;
}

KernelSignature BoundCall::signature() const {
  KernelSignature s;
  for (const BoundOperand& o : operands) {
    s.present.push_back(o.present);
    s.dtypes.push_back(o.dtype);
  }
  return s;
}

const BoundOperand& BoundCall::operand(const std::string& name) const {
  int i = program->find_operand(name);
  TILE_CHECK(i >= 0, "no operand ", name);
  return operands[i];
}

namespace {

// The largest power of two up to 16 dividing the base address of every present row and column
// input operand: what the policy may assume of vector accesses.
int64_t base_alignment_of(const BoundCall& call) {
  uintptr_t bits = 0;
  const auto& decls = call.program->operands();
  for (size_t i = 0; i < decls.size(); ++i)
    if (call.operands[i].present && (is_row(decls[i].role) || decls[i].role == Role::col_in))
      bits |= reinterpret_cast<uintptr_t>(call.operands[i].data);
  int64_t alignment = 16;
  while (alignment > 1 && bits % alignment != 0) alignment /= 2;
  return alignment;
}

}  // namespace

PlanInputs BoundCall::plan_inputs() const {
  PlanInputs in;
  in.rows = rows, in.cols = cols;
  in.rows_operand = program->operands()[facts->first_row_operand].name;
  const auto& decls = program->operands();
  for (size_t i = 0; i < decls.size(); ++i) {
    const BoundOperand& o = operands[i];
    if (!o.present) continue;
    if (is_row(decls[i].role))
      in.row_operands.push_back({o.dtype, o.stride, decls[i].role == Role::row_in});
    else if (decls[i].role == Role::col_in)
      in.column_dtypes.push_back(o.dtype);
  }
  in.base_alignment = base_alignment_of(*this);
  in.merge_parts = facts->merge_parts;
  // The reductions over the rows this call computes: an optional output left absent (a
  // per-row loss without its sum) leaves the plan free of their partials.
  std::vector<bool> present;
  for (const BoundOperand& o : operands) present.push_back(o.present);
  if (facts->reduces_rows)
    for (int red : live_reductions(*program, present)) {
      const RowReduction& r = program->reductions()[red];
      if (r.axis != Axis::rows) continue;
      in.reduces_rows = true;
      if (program->nodes()[r.inputs[0]].shape.cols) in.rows_reduction_parts += int(r.monoid.parts.size());
    }
  in.real_bytes = f64 ? 8 : 4;
  return in;
}

void BoundCall::append_plan_key(std::string& key) const {
  auto put = [&key](int64_t v) { key.append(reinterpret_cast<const char*>(&v), sizeof v); };
  put(int64_t(program->serial()));
  put(rows), put(cols), put(base_alignment_of(*this)), put(f64);
  // Roles and the facts follow from the program; the strides of row operands are what is left.
  for (const BoundOperand& o : operands) put(o.present ? int64_t(o.dtype) : -1), put(o.present ? o.stride : 0);
}

namespace {

// Operand i's memory at `data`: its rows (or values) as strided byte ranges.
StridedBytes view_of(const BoundCall& call, size_t i, const void* data) {
  const BoundOperand& b = call.operands[i];
  const Role role = call.program->operands()[i].role;
  const int64_t es = dtype_size(b.dtype);
  const uintptr_t base = reinterpret_cast<uintptr_t>(data);
  if (is_row(role)) return StridedBytes{base, b.stride * es, call.cols * es, call.rows};
  if (is_row_scalar(role)) return StridedBytes{base, b.stride * es, es, b.stride == 0 ? 1 : call.rows};
  return StridedBytes{base, b.extent * es, b.extent * es, 1};
}

// Outputs overlap nothing else, except the one input each may alias exactly (in place: same
// pointer, stride and dtype; each worker reads its elements before it writes them). True when
// output o at data_o and operand a at data_a break that rule.
bool conflict(const BoundCall& call, size_t o, size_t a, const void* data_o, const void* data_a) {
  const auto& decls = call.program->operands();
  const BoundOperand &bo = call.operands[o], &ba = call.operands[a];
  if (!is_output(decls[o].role) || !bo.present || bo.extent == 0) return false;
  if (a == o || !ba.present || ba.extent == 0 || decls[a].role == Role::scalar_in) return false;
  if (decls[o].may_alias == int(a) && data_o == data_a && bo.stride == ba.stride && bo.dtype == ba.dtype) return false;
  return overlaps(view_of(call, o, data_o), view_of(call, a, data_a));
}

// What the checks of one operand's data pointer find: null, aligned to its element size, and
// the view's end inside the address space.
enum class PointerProblem { none, null, misaligned, past_end };

PointerProblem pointer_problem(const BoundOperand& b, const void* data) {
  if (b.extent > 0 && data == nullptr) return PointerProblem::null;
  const uintptr_t base = reinterpret_cast<uintptr_t>(data);
  if (base % dtype_size(b.dtype) != 0) return PointerProblem::misaligned;
  if (uintptr_t(b.extent) * dtype_size(b.dtype) > UINTPTR_MAX - base) return PointerProblem::past_end;
  return PointerProblem::none;
}

}  // namespace

bool pointers_bind(const BoundCall& call, const void* const* data) {
  const size_t n = call.operands.size();
  for (size_t i = 0; i < n; ++i)
    if (call.operands[i].present && call.program->operands()[i].role != Role::scalar_in &&
        pointer_problem(call.operands[i], data[i]) != PointerProblem::none)
      return false;
  const auto& decls = call.program->operands();
  for (size_t o = 0; o < n; ++o) {
    if (!is_output(decls[o].role)) continue;
    for (size_t a = 0; a < n; ++a)
      if (conflict(call, o, a, data[o], data[a])) return false;
  }
  return true;
}

namespace {

// The one check of a call: values[i] is operand i's value, or null when the caller gave none.
BoundCall bind_values(const RowProgram& program, const Args::Value* const* values) {
  const ProgramFacts& facts = facts_of(program);
  const std::string& op = program.name();
  const auto& decls = program.operands();
  BoundCall call;
  call.program = &program;
  call.facts = &facts;
  call.operands.resize(decls.size());
  // rows and cols come from the first row operand; every other operand must agree.
  const int first = facts.first_row_operand;

  // The first row operand is checked first, then the others in declaration order.
  for (size_t k = 0; k < decls.size(); ++k) {
    const size_t i = k == 0 ? size_t(first) : k <= size_t(first) ? k - 1 : k;
    const OperandDecl& d = decls[i];
    BoundOperand& b = call.operands[i];
    const Args::Value* v = values[i];
    const std::string& name = d.name;
    if (d.role == Role::scalar_in) {
      b.present = true;
      b.dtype = d.scalar_type == ValueType::i64 ? DType::i64 : DType::f32;
      if (!v) {
        if (!d.default_value) throw_argument_error(op, name, "a number (the scalar has no default)", "nothing");
        b.value = *d.default_value;
      } else if (v->index() != 2) {
        throw_argument_error(op, name, "a number", kind_of(*v));
      } else {
        b.value = std::get<double>(*v);
      }
      if (!std::isfinite(b.value) || b.value < d.min_value || b.value > d.max_value) {
        // A range is unbounded on an infinite side (a float64 eps declares [0, 1e300]).
        const bool lo = std::isfinite(d.min_value), hi = std::isfinite(d.max_value);
        const std::string range = lo && hi ? "a value in [" + number(d.min_value) + ", " + number(d.max_value) + "]"
                                  : lo   ? "a finite value >= " + number(d.min_value)
                                  : hi   ? "a finite value <= " + number(d.max_value)
                                         : "a finite value";
        throw_argument_error(op, name, range, number(b.value));
      }
      if (d.scalar_type == ValueType::i64) {
        if (!exact_integer(b.value))
          throw_argument_error(op, name, "an integer of magnitude at most 2^53", number(b.value));
      }
      continue;  // a float scalar's precision is the call's: checked once every operand is bound
    }
    if (!v) {
      if (d.optional) continue;
      throw_argument_error(op, name, std::string(is_row(d.role) ? "a matrix" : "a vector") + " (" +
                                         std::string(role_name(d.role)) + ")", "nothing");
    }
    // A null vector means absent, as for weight and bias in the built-in operators.
    if (v->index() == 1 && std::get<VectorView>(*v).data == nullptr && d.optional) continue;
    if (is_row(d.role)) {
      if (v->index() != 0) throw_argument_error(op, name, "a matrix (TensorView)", kind_of(*v));
      const TensorView& t = std::get<TensorView>(*v);
      if (int(i) == first) {
        if (t.rows < 0) throw_argument_error(op, name, "rows >= 0", std::to_string(t.rows));
        if (t.cols < 1) throw_argument_error(op, name, "cols >= 1", std::to_string(t.cols));
        call.rows = t.rows, call.cols = t.cols;
      } else if (t.rows != call.rows || t.cols != call.cols) {
        throw_argument_error(op, name,
                             "shape (" + std::to_string(call.rows) + ", " + std::to_string(call.cols) + ") like " + decls[first].name,
                             "(" + std::to_string(t.rows) + ", " + std::to_string(t.cols) + ")");
      }
      if (t.cols > kMaxExtent) throw_argument_error(op, name, "cols at most 2^61 - 1", std::to_string(t.cols));
      if (t.row_stride < t.cols)
        throw_argument_error(op, name, "row_stride >= cols = " + std::to_string(t.cols), std::to_string(t.row_stride));
      if (t.rows > 1 && t.rows - 1 > (kMaxExtent - t.cols) / t.row_stride)
        throw_argument_error(op, name, "(rows - 1) * row_stride + cols at most 2^61 - 1 elements",
                             shape_text(t.rows, t.cols, t.row_stride));
      b.data = t.data, b.dtype = t.dtype, b.stride = t.row_stride;
      b.extent = t.rows == 0 ? 0 : (t.rows - 1) * t.row_stride + t.cols;
    } else if (is_row_scalar(d.role)) {
      if (v->index() == 0) {
        const TensorView& t = std::get<TensorView>(*v);
        if (t.cols != 1 || t.rows != call.rows)
          throw_argument_error(op, name, "one value per row: shape (" + std::to_string(call.rows) + ", 1)",
                               "(" + std::to_string(t.rows) + ", " + std::to_string(t.cols) + ")");
        b.data = t.data, b.dtype = t.dtype, b.stride = t.row_stride;
      } else if (v->index() == 1) {
        const VectorView& w = std::get<VectorView>(*v);
        if (w.size != call.rows)
          throw_argument_error(op, name, std::to_string(call.rows) + " elements (one per row)", std::to_string(w.size));
        b.data = const_cast<void*>(w.data), b.dtype = w.dtype, b.stride = w.stride;
      } else {
        throw_argument_error(op, name, "a vector with one value per row", kind_of(*v));
      }
      // An input may broadcast one value to every row (stride 0); an output may not.
      const int64_t min_stride = d.role == Role::row_scalar_in ? 0 : 1;
      if (b.stride < min_stride)
        throw_argument_error(op, name, "a stride >= " + std::to_string(min_stride), std::to_string(b.stride));
      if (call.rows > 1 && b.stride > 0 && call.rows - 1 > (kMaxExtent - 1) / b.stride)
        throw_argument_error(op, name, "(rows - 1) * stride + 1 at most 2^61 - 1 elements", std::to_string(b.stride));
      b.extent = call.rows == 0 ? 0 : (call.rows - 1) * b.stride + 1;
    } else {  // per-column operands and scalar outputs
      if (v->index() != 1) throw_argument_error(op, name, "a vector (VectorView)", kind_of(*v));
      const VectorView& w = std::get<VectorView>(*v);
      const int64_t want = is_col(d.role) ? call.cols : 1;
      if (w.size != want)
        throw_argument_error(op, name, std::to_string(want) + (is_col(d.role) ? " elements (one per column)" : " element"),
                             std::to_string(w.size));
      if (w.stride != 1) throw_argument_error(op, name, "a contiguous vector (stride 1)", "stride " + std::to_string(w.stride));
      b.data = const_cast<void*>(w.data), b.dtype = w.dtype, b.stride = 1, b.extent = w.size;
    }
    b.present = true;
    if (!d.dtypes.contains(b.dtype))
      throw_argument_error(op, name, "dtype " + d.dtypes.to_string(), std::string(dtype_name(b.dtype)));
    switch (pointer_problem(b, b.data)) {
      case PointerProblem::none:
        break;
      case PointerProblem::null:
        throw_argument_error(op, name, "a non-null data pointer", "null");
      case PointerProblem::misaligned:
        throw_argument_error(op, name,
                             "a pointer aligned to its element size (" + std::to_string(dtype_size(b.dtype)) + " bytes)",
                             "a misaligned pointer");
      case PointerProblem::past_end:
        throw_argument_error(op, name, is_row(d.role) ? "a view that ends inside the address space" : "a vector that ends inside the address space",
                             (is_row(d.role) ? shape_text(call.rows, call.cols, b.stride) : std::to_string(b.extent) + " elements") +
                                 " at address " + std::to_string(reinterpret_cast<uintptr_t>(b.data)));
    }
  }

  // One float precision per call: f64 when any float operand is f64, and then every one is
  // (a kernel's float registers have one type, include/tile/dtype.hpp).
  int first_f64 = -1, first_other = -1;
  for (size_t i = 0; i < decls.size(); ++i) {
    const BoundOperand& b = call.operands[i];
    if (!b.present || decls[i].role == Role::scalar_in || !is_float(b.dtype)) continue;
    int& first_of = b.dtype == DType::f64 ? first_f64 : first_other;
    if (first_of < 0) first_of = int(i);
  }
  if (first_f64 >= 0 && first_other >= 0) {
    const size_t early = size_t(std::min(first_f64, first_other)), late = size_t(std::max(first_f64, first_other));
    const std::string like = decls[early].name + " (" + std::string(dtype_name(call.operands[early].dtype)) + ")";
    throw_argument_error(op, decls[late].name,
                         int(late) == first_other
                             ? "dtype f64 like " + like + ": a float64 call has every float operand in f64"
                             : "a float dtype other than f64 like " + like + ", or every float operand in f64",
                         std::string(dtype_name(call.operands[late].dtype)));
  }
  call.f64 = first_f64 >= 0;
  for (size_t i = 0; i < decls.size(); ++i) {
    BoundOperand& b = call.operands[i];
    if (decls[i].role != Role::scalar_in || decls[i].scalar_type == ValueType::i64) continue;
    if (call.f64) b.dtype = DType::f64;  // read as a double: any finite value is held exactly
    else check_f32_scalar(op, decls[i].name, b.value);
  }

  for (size_t o = 0; o < decls.size(); ++o) {
    if (!is_output(decls[o].role)) continue;
    for (size_t a = 0; a < decls.size(); ++a) {
      if (!conflict(call, o, a, call.operands[o].data, call.operands[a].data)) continue;
      const bool allowed = decls[o].may_alias == int(a);
      throw_argument_error(op, decls[o].name,
                           "memory that does not overlap " + decls[a].name +
                               (allowed ? ", or exactly " + decls[a].name + " (same pointer, stride and dtype)" : ""),
                           "an overlapping view");
    }
  }
  return call;
}

}  // namespace

namespace {
[[noreturn]] void unknown_operand(const RowProgram& program, const std::string& name) {
  std::string names;
  for (const OperandDecl& d : program.operands()) names += (names.empty() ? "" : ", ") + d.name;
  throw_argument_error(program.name(), printable(name), "one of the operands " + names, "an unknown operand");
}
}  // namespace

BoundCall bind(const RowProgram& program, const Args& args) {
  const auto& decls = program.operands();
  std::vector<const Args::Value*> values(decls.size(), nullptr);
  for (const auto& [name, value] : args.values()) {
    const int i = program.find_operand(name);
    if (i >= 0) {
      values[i] = &value;
      continue;
    }
    unknown_operand(program, name);
  }
  return bind_values(program, values.data());
}

BoundCall bind(const Call& call) {
  const RowProgram& program = builtin_program(call.op);
  // The built-ins declare x, y, then their optional operands; Args names them the same way.
  const auto& decls = program.operands();
  Args::Value storage[8];
  const Args::Value* values[8] = {};
  TILE_CHECK(decls.size() <= 8, "built-in ", program.name(), " has ", decls.size(), " operands");
  static constexpr const char* kNames[] = {"x", "y", "weight", "bias", "eps"};
  // Each built-in's operand index of each Call field (-1: not declared), found once.
  static const auto indices = [] {
    constexpr int kBuiltins = int(Op::layer_norm) + 1;
    std::array<std::array<int, 5>, kBuiltins> table{};
    for (int op = 0; op < kBuiltins; ++op)
      for (int f = 0; f < 5; ++f) table[op][f] = builtin_program(Op(op)).find_operand(kNames[f]);
    return table;
  }();
  auto put = [&](int field, Args::Value v, bool given) {
    if (!given) return;
    const int i = indices[int(call.op)][field];
    if (i < 0) unknown_operand(program, kNames[field]);
    storage[i] = std::move(v);
    values[i] = &storage[i];
  };
  put(0, call.x, true);
  put(1, call.y, true);
  put(2, call.weight, call.weight.data != nullptr);
  put(3, call.bias, call.bias.data != nullptr);
  put(4, call.eps.value_or(0.0), call.eps.has_value());
  return bind_values(program, values);
}

int64_t grid_groups(const BoundCall& call, const MappingPlan& plan) {
  // Row blocks (at most grid_limit of them at once), each spanning ctas_per_program groups of
  // one cluster.
  const int64_t P = plan.programs_per_group, C = plan.ctas_per_program;
  int64_t blocks = (call.rows + P - 1) / P;
  if (plan.grid_limit > 0) blocks = std::min<int64_t>(blocks, plan.grid_limit);
  if (blocks * C > std::numeric_limits<int32_t>::max()) {
    throw_argument_error(call.program->name(), call.program->operands()[call.facts->first_row_operand].name,
                         "at most 2^31 - 1 groups of " + std::to_string(P) + " rows (the grid's limit)" +
                             (C > 1 ? ", " + std::to_string(C) + " groups a row block" : std::string()),
                         std::to_string(call.rows) + " rows");
  }
  return blocks * C;
}

}  // namespace tile
