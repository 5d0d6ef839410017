// Operator specs: what a row program computes, independent of how workers map onto rows.
//
// A RowProgram declares its operands once — each with a role, its axes and the dtypes it
// accepts — and builds an expression graph over them: loads, element-wise math, a column index,
// `select`, and reductions over an axis with a monoid (include/tile/monoid.hpp). Reductions
// over the columns give one value per row; reductions over the rows give one value per column
// (a weight gradient) or one value per call (a loss). Stores write expressions to outputs.
//
//   RowProgram p("softmax");
//   Operand x = p.row_in("x"), y = p.row_out("y", {}, /*may_alias=*/x);
//   RowExpr v = p.load(x);
//   auto [m, s] = p.reduce2(Axis::cols, monoid::online_softmax(), v);
//   p.store(y, exp(v - m) / s);
//
// Everything else — kernel signature, argument checks, aliasing, the C++/Python bindings and
// the `tile` command — is derived from the declarations (src/bind/bind.cpp).
#pragma once

#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tile/dtype.hpp"
#include "tile/monoid.hpp"

namespace tile {

// What an operand is to the program, and so its axes.
enum class Role : uint8_t {
  row_in,          // (rows, cols) read; rows may be strided, each row contiguous
  row_out,         // (rows, cols) written
  row_scalar_in,   // (rows,) read: one value per row (a target, a saved statistic)
  row_scalar_out,  // (rows,) written: one value per row (rstd, a per-row loss)
  col_in,          // (cols,) read: one value per column (weight, bias)
  col_out,         // (cols,) written: reduced across the rows (dweight, dbias)
  scalar_in,       // one value passed by value (eps, ignore_index)
  scalar_out,      // (1,) written: reduced across the rows (a mean loss)
};
std::string_view role_name(Role role);
bool is_output(Role role);

// The dtypes an operand accepts, as a set.
class DTypeSet {
 public:
  constexpr DTypeSet() = default;
  constexpr DTypeSet(std::initializer_list<DType> dtypes) {
    for (DType t : dtypes) bits_ |= uint8_t(1u << int(t));
  }
  static constexpr DTypeSet floats() { return {DType::f32, DType::f16, DType::bf16, DType::f64}; }
  // A statistic (rstd, mean, lse, a loss) is kept at the call's float precision: f32, or f64
  // in a float64 call.
  static constexpr DTypeSet statistics() { return {DType::f32, DType::f64}; }
  static constexpr DTypeSet integers() { return {DType::i32, DType::i64}; }
  constexpr bool contains(DType t) const { return bits_ & (1u << int(t)); }
  constexpr bool empty() const { return bits_ == 0; }
  std::string to_string() const;  // "f32, f64, f16 or bf16"
  bool operator==(const DTypeSet&) const = default;

 private:
  uint8_t bits_ = 0;
};

// The type of an expression's value. Memory dtypes exist only on operands: loads convert
// floats to the kernel's float type and integers to i64. `f32` names that float type: fp32,
// or fp64 in a float64 call (every float operand f64, include/tile/dtype.hpp).
enum class ValueType : uint8_t { f32, i64, b1 };
std::string_view value_type_name(ValueType t);

// Axes an expression varies along. An element varies along both; a row scalar along rows;
// a column value (a column operand, or a reduction over the rows) along cols; a uniform value
// along neither.
struct Shape {
  bool rows = false, cols = false;
  bool operator==(const Shape&) const = default;
};
std::string shape_name(Shape s);

enum class Axis : uint8_t { cols, rows };

struct Operand {
  int id = -1;
  explicit operator bool() const { return id >= 0; }
};

struct OperandDecl {
  std::string name;
  Role role;
  DTypeSet dtypes;
  bool optional = false;           // the caller may leave it out (weight, bias, dweight)
  int may_alias = -1;              // outputs: the input this output may alias exactly (in place)
  ValueType scalar_type = ValueType::f32;  // scalar_in: passed as f32 or i64
  std::optional<double> default_value;     // scalar_in: the value when the caller gives none
  // scalar_in: the accepted range of finite values (infinite: unbounded on that side).
  double min_value = -std::numeric_limits<double>::infinity(), max_value = std::numeric_limits<double>::infinity();
  std::string doc;                 // one line for error messages and generated help
};

struct RowNode {
  enum class Kind : uint8_t {
    load,       // operand `operand`; an absent optional operand reads as `value`
    constant,   // `value` (`f64_value` where given, in a float64 call)
    cols,       // the row length, f32
    col_index,  // the column of the element, i64
    unary,      // fn(a)
    binary,     // a fn b
    select,     // a ? b : c
    result,     // part `part` of reduction `reduction`
  };
  Kind kind;
  ValueType type = ValueType::f32;
  Shape shape;
  int a = -1, b = -1, c = -1;
  int operand = -1;
  double value = 0.0;
  int reduction = -1, part = 0;
  UnaryFn unary = UnaryFn::neg;
  BinaryFn binary = BinaryFn::add;
  std::optional<double> f64_value;
  bool after_rows = false;  // depends on a reduction over the rows (set as the node is added)
  double value_in(bool f64) const { return f64 && f64_value ? *f64_value : value; }
};

// reduce(axis, monoid, inputs): folds the inputs over the axis; one result node per part.
struct RowReduction {
  Axis axis;
  Monoid monoid;
  std::vector<int> inputs;   // node ids, one per monoid input
  std::vector<int> results;  // node ids of kind result, one per monoid part
};

struct RowStore {
  int operand;
  int value;
};

class RowProgram;

// A handle to a node of a RowProgram; arithmetic on handles appends nodes.
struct RowExpr {
  RowProgram* program = nullptr;
  int id = -1;
};

// i64 values of a program are exact in the float64 reference, and integer scalars travel as
// doubles: both hold integers of magnitude at most 2^53 exactly.
constexpr int64_t kMaxExactInteger = int64_t(1) << 53;
inline bool exact_integer(double v) { return v == std::trunc(v) && std::abs(v) <= double(kMaxExactInteger); }

class RowProgram {
 public:
  static constexpr int kMaxNodes = 4096;  // nodes a program holds at most

  explicit RowProgram(std::string name);
  // RowExprs point at their program: copying one would leave them pointing at the original.
  RowProgram(const RowProgram&) = delete;
  RowProgram& operator=(const RowProgram&) = delete;
  // The moved-from program is left empty, under its name and a serial of its own: the caches
  // keyed by the serial describe the program moved into.
  RowProgram(RowProgram&& other);

  // ---- operands (declared once; the call binds them by name) ----
  // Optional row and per-row inputs are read with load_or; rows and cols come from the first
  // row operand that is not optional.
  Operand row_in(std::string name, DTypeSet dtypes = DTypeSet::floats(), std::string doc = "",
                 bool optional = false);
  Operand row_out(std::string name, DTypeSet dtypes = DTypeSet::floats(), Operand may_alias = {},
                  std::string doc = "", bool optional = false);
  // A per-row input may be given with stride 0: one value broadcast to every row.
  Operand row_scalar_in(std::string name, DTypeSet dtypes, std::string doc = "", bool optional = false);
  Operand row_scalar_out(std::string name, DTypeSet dtypes = DTypeSet::statistics(), bool optional = true,
                         std::string doc = "");
  Operand col_in(std::string name, DTypeSet dtypes = DTypeSet::floats(), bool optional = false,
                 std::string doc = "");
  Operand col_out(std::string name, DTypeSet dtypes = DTypeSet::floats(), bool optional = false,
                  std::string doc = "");
  Operand scalar_in(std::string name, ValueType type = ValueType::f32,
                    std::optional<double> default_value = std::nullopt, std::string doc = "");
  Operand scalar_out(std::string name, DTypeSet dtypes = DTypeSet::statistics(), bool optional = false,
                     std::string doc = "");
  // The values a scalar input accepts (inclusive); a call outside them is an error.
  void scalar_range(Operand scalar, double lo, double hi);

  // ---- expressions ----
  RowExpr load(Operand operand);                     // an optional operand must use load_or
  RowExpr load_or(Operand operand, double absent);  // `absent` when the caller leaves it out
  RowExpr constant(double value);                   // f32
  // A constant whose value depends on the float precision (a limit of the format's exponent
  // range): `f32` in an f32 kernel, `f64` in a float64 call.
  RowExpr constant(double f32, double f64);
  RowExpr integer(int64_t value);                   // i64
  RowExpr cols();                                   // the row length, as f32
  RowExpr col_index();                              // the element's column, as i64
  RowExpr unary(UnaryFn fn, RowExpr a);
  RowExpr binary(BinaryFn fn, RowExpr a, RowExpr b);
  RowExpr select(RowExpr cond, RowExpr a, RowExpr b);
  // Folds `inputs` (one per monoid input) over `axis`; returns one expression per part.
  std::vector<RowExpr> reduce(Axis axis, const Monoid& monoid, std::vector<RowExpr> inputs);
  RowExpr reduce1(Axis axis, const Monoid& monoid, RowExpr input);  // a one-part monoid
  std::pair<RowExpr, RowExpr> reduce2(Axis axis, const Monoid& monoid, RowExpr input);
  void store(Operand operand, RowExpr value);

  // ---- introspection ----
  const std::string& name() const { return name_; }
  const std::vector<OperandDecl>& operands() const { return operands_; }
  const std::vector<RowNode>& nodes() const { return nodes_; }
  const std::vector<RowReduction>& reductions() const { return reductions_; }
  const std::vector<RowStore>& stores() const { return stores_; }
  int find_operand(const std::string& name) const;  // -1 when absent
  // Identifies this program's exact content within the process: every change gives a new
  // value, and no two programs share one (the kernel cache's key).
  uint64_t serial() const { return serial_; }
  // Throws tile::Error naming the program when it is incomplete: an output never stored,
  // stored twice, or a store whose shape does not fit its operand.
  void validate() const;
  std::string to_string() const;

 private:
  Operand declare(OperandDecl decl);
  int add(RowNode node);
  const RowNode& node(RowExpr e) const;
  [[noreturn]] void fail(const std::string& what) const;

  std::string name_;
  std::vector<OperandDecl> operands_;
  std::vector<RowNode> nodes_;
  std::vector<RowReduction> reductions_;
  std::vector<RowStore> stores_;
  uint64_t serial_ = 0;
};

RowExpr operator+(RowExpr a, RowExpr b);
RowExpr operator-(RowExpr a, RowExpr b);
RowExpr operator*(RowExpr a, RowExpr b);
RowExpr operator/(RowExpr a, RowExpr b);
RowExpr operator-(RowExpr a);
RowExpr operator+(RowExpr a, double b);
RowExpr operator+(double a, RowExpr b);
RowExpr operator-(RowExpr a, double b);
RowExpr operator-(double a, RowExpr b);
RowExpr operator*(RowExpr a, double b);
RowExpr operator*(double a, RowExpr b);
RowExpr operator/(RowExpr a, double b);
RowExpr operator/(double a, RowExpr b);
RowExpr exp(RowExpr a);
RowExpr log(RowExpr a);
RowExpr sqrt(RowExpr a);
RowExpr rsqrt(RowExpr a);
RowExpr abs(RowExpr a);
RowExpr tanh(RowExpr a);
RowExpr max(RowExpr a, RowExpr b);  // NaN if either is NaN, as torch.maximum
RowExpr min(RowExpr a, RowExpr b);
RowExpr to_f32(RowExpr a);
RowExpr exponent(RowExpr a);            // floor(log2 |a|) for finite nonzero a, else 0
RowExpr ldexp(RowExpr a, RowExpr b);    // a * 2^b, exact, b integer-valued
RowExpr ldexp(RowExpr a, double b);
RowExpr eq(RowExpr a, RowExpr b);
RowExpr ne(RowExpr a, RowExpr b);
RowExpr lt(RowExpr a, RowExpr b);
RowExpr le(RowExpr a, RowExpr b);
RowExpr logical_and(RowExpr a, RowExpr b);
RowExpr logical_or(RowExpr a, RowExpr b);
RowExpr logical_not(RowExpr a);

// The built-in operators. Each is a row program (src/spec/operators.cpp); optional operands
// (weight, bias) are part of it, so one program serves every combination of them.
enum class Op : uint8_t { softmax, log_softmax, rms_norm, layer_norm };
std::string op_name(Op op);
Op parse_op(const std::string& name);  // throws tile::Error
const RowProgram& builtin_program(Op op);

}  // namespace tile
