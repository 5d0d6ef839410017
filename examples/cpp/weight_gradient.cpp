// A reduction across the rows, the shape of a weight gradient: dweight[c] = sum over rows of
// x[r, c] * dy[r, c], in fp32 partials per program, then a second phase in a fixed order.
#include "example.hpp"

int main() {
  using namespace tile;
  RowProgram p("weight_gradient");
  Operand x = p.row_in("x"), dy = p.row_in("dy"), dw = p.col_out("dweight");
  p.store(dw, p.reduce1(Axis::rows, monoid::sum(), p.load(x) * p.load(dy)));

  std::map<std::string, example::HostOperand> ops;
  ops["x"] = example::random_matrix(DType::bf16, 300, 768, 6, 2.0);
  ops["dy"] = example::random_matrix(DType::f32, 300, 768, 7, 1.0);
  ops["dweight"] = example::zeros(DType::f32, 768);
  return example::run_and_check(p, ops, {});
}
