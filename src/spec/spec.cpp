#include "tile/spec.hpp"

#include <sstream>

#include "tile/error.hpp"

namespace tile {

int RowProgram::add(RowNode node, bool element) {
  nodes_.push_back(std::move(node));
  element_.push_back(element);
  return int(nodes_.size()) - 1;
}

RowExpr RowProgram::input() { return {this, add({RowNode::Kind::input}, true)}; }

RowExpr RowProgram::column(const std::string& name) {
  bool seen = false;
  for (auto& c : columns_) seen |= c == name;
  if (!seen) columns_.push_back(name);
  RowNode n{RowNode::Kind::column};
  n.name = name;
  return {this, add(n, true)};
}

RowExpr RowProgram::scalar(const std::string& name) {
  bool seen = false;
  for (auto& s : scalars_) seen |= s == name;
  if (!seen) scalars_.push_back(name);
  RowNode n{RowNode::Kind::scalar};
  n.name = name;
  return {this, add(n, false)};
}

RowExpr RowProgram::constant(double value) {
  RowNode n{RowNode::Kind::constant};
  n.value = value;
  return {this, add(n, false)};
}

RowExpr RowProgram::cols() { return {this, add({RowNode::Kind::cols}, false)}; }

RowExpr RowProgram::reduce(Reduction kind, RowExpr element) {
  TILE_CHECK(element.program == this, "reduce of a node from another program");
  TILE_CHECK(is_element(element.id), "reduce needs an element expression");
  RowNode n{RowNode::Kind::reduce};
  n.a = element.id;
  n.reduction = kind;
  return {this, add(n, false)};
}

RowExpr RowProgram::unary(UnaryFn fn, RowExpr a) {
  TILE_CHECK(a.program == this, "operand from another program");
  RowNode n{RowNode::Kind::unary};
  n.a = a.id;
  n.unary = fn;
  return {this, add(n, is_element(a.id))};
}

RowExpr RowProgram::binary(BinaryFn fn, RowExpr a, RowExpr b) {
  TILE_CHECK(a.program == this && b.program == this, "operand from another program");
  RowNode n{RowNode::Kind::binary};
  n.a = a.id;
  n.b = b.id;
  n.binary = fn;
  return {this, add(n, is_element(a.id) || is_element(b.id))};
}

void RowProgram::output(RowExpr value) {
  TILE_CHECK(value.program == this, "output from another program");
  output_ = value.id;
}

std::string RowProgram::to_string() const {
  static const char* unary_names[] = {"neg", "exp", "log", "rsqrt", "sqrt"};
  static const char* binary_names[] = {"add", "sub", "mul", "div", "max", "min"};
  std::ostringstream os;
  os << "row_program " << name_ << " {\n";
  for (size_t i = 0; i < nodes_.size(); ++i) {
    const RowNode& n = nodes_[i];
    os << "  %" << i << (element_[i] ? " [elem] = " : " [row]  = ");
    switch (n.kind) {
      case RowNode::Kind::input: os << "input[c]"; break;
      case RowNode::Kind::column: os << n.name << "[c]"; break;
      case RowNode::Kind::scalar: os << "scalar " << n.name; break;
      case RowNode::Kind::constant: os << "const " << n.value; break;
      case RowNode::Kind::cols: os << "cols"; break;
      case RowNode::Kind::reduce:
        os << (n.reduction == Reduction::sum ? "reduce_sum %" : "reduce_max %") << n.a;
        break;
      case RowNode::Kind::unary: os << unary_names[int(n.unary)] << " %" << n.a; break;
      case RowNode::Kind::binary:
        os << binary_names[int(n.binary)] << " %" << n.a << ", %" << n.b;
        break;
    }
    os << "\n";
  }
  os << "  output %" << output_ << "\n}\n";
  return os.str();
}

RowExpr operator+(RowExpr a, RowExpr b) { return a.program->binary(BinaryFn::add, a, b); }
RowExpr operator-(RowExpr a, RowExpr b) { return a.program->binary(BinaryFn::sub, a, b); }
RowExpr operator*(RowExpr a, RowExpr b) { return a.program->binary(BinaryFn::mul, a, b); }
RowExpr operator/(RowExpr a, RowExpr b) { return a.program->binary(BinaryFn::div, a, b); }
RowExpr operator-(RowExpr a) { return a.program->unary(UnaryFn::neg, a); }
RowExpr exp(RowExpr a) { return a.program->unary(UnaryFn::exp, a); }
RowExpr log(RowExpr a) { return a.program->unary(UnaryFn::log, a); }
RowExpr rsqrt(RowExpr a) { return a.program->unary(UnaryFn::rsqrt, a); }
RowExpr max(RowExpr a, RowExpr b) { return a.program->binary(BinaryFn::max, a, b); }

}  // namespace tile
