// Operator specs: what one row computes, independent of how workers map onto it.
//
// A RowProgram is a small expression graph over the elements of one input row: element-wise
// math on the input and on per-column operands (weight, bias), row reductions (sum, max) that
// turn element expressions into row scalars, and one element expression stored as the output.
// Softmax, log-softmax, RMSNorm and LayerNorm are each a few lines (src/spec/operators.cpp);
// a fused row operator is written the same way and lowered by the same pass.
#pragma once

#include <string>
#include <vector>

namespace tile {

enum class Reduction : uint8_t { sum, max };
enum class UnaryFn : uint8_t { neg, exp, log, rsqrt, sqrt };
enum class BinaryFn : uint8_t { add, sub, mul, div, max, min };

struct RowNode {
  enum class Kind : uint8_t { input, column, scalar, constant, cols, reduce, unary, binary };
  Kind kind;
  int a = -1, b = -1;      // operand node ids
  double value = 0.0;      // constant
  std::string name;        // column or scalar name
  Reduction reduction = Reduction::sum;
  UnaryFn unary = UnaryFn::neg;
  BinaryFn binary = BinaryFn::add;
};

class RowProgram;

// A handle to a node of a RowProgram; arithmetic on handles appends nodes.
struct RowExpr {
  RowProgram* program = nullptr;
  int id = -1;
};

class RowProgram {
 public:
  explicit RowProgram(std::string name) : name_(std::move(name)) {}
  // RowExprs point at their program: copying one would leave them pointing at the original.
  RowProgram(const RowProgram&) = delete;
  RowProgram& operator=(const RowProgram&) = delete;
  RowProgram(RowProgram&&) = default;

  RowExpr input();                           // element c of the input row, as fp32
  RowExpr column(const std::string& name);   // element c of a per-column operand
  RowExpr scalar(const std::string& name);   // a scalar launch argument (eps)
  RowExpr constant(double value);
  RowExpr cols();                            // the row length, as fp32
  RowExpr reduce(Reduction kind, RowExpr element);
  RowExpr unary(UnaryFn fn, RowExpr a);
  RowExpr binary(BinaryFn fn, RowExpr a, RowExpr b);
  void output(RowExpr value);

  const std::string& name() const { return name_; }
  const std::vector<RowNode>& nodes() const { return nodes_; }
  int output_node() const { return output_; }
  // Per-column operands and scalars in order of first use; they become kernel arguments.
  const std::vector<std::string>& columns() const { return columns_; }
  const std::vector<std::string>& scalars() const { return scalars_; }
  // True when the node's value differs from element to element (it reads input or a column).
  bool is_element(int id) const { return element_[id]; }
  std::string to_string() const;

 private:
  int add(RowNode node, bool element);
  std::string name_;
  std::vector<RowNode> nodes_;
  std::vector<bool> element_;
  std::vector<std::string> columns_, scalars_;
  int output_ = -1;
};

RowExpr operator+(RowExpr a, RowExpr b);
RowExpr operator-(RowExpr a, RowExpr b);
RowExpr operator*(RowExpr a, RowExpr b);
RowExpr operator/(RowExpr a, RowExpr b);
RowExpr operator-(RowExpr a);
RowExpr exp(RowExpr a);
RowExpr log(RowExpr a);
RowExpr rsqrt(RowExpr a);
RowExpr max(RowExpr a, RowExpr b);

// The four forward operators of the library.
enum class Op : uint8_t { softmax, log_softmax, rms_norm, layer_norm };
std::string op_name(Op op);
Op parse_op(const std::string& name);  // throws tile::Error
RowProgram make_program(Op op, bool has_weight, bool has_bias);

}  // namespace tile
