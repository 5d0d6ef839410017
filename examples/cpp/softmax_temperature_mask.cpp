// softmax(x / t + mask): a temperature scalar and an additive mask row per column.
#include "example.hpp"

int main() {
  using namespace tile;
  RowProgram p("softmax_temperature_mask");
  Operand x = p.row_in("x"), mask = p.col_in("mask"), y = p.row_out("y");
  Operand t = p.scalar_in("temperature", ValueType::f32, 1.0);
  p.scalar_range(t, 1e-6, 1e6);
  RowExpr z = p.load(x) / p.load(t) + p.load(mask);
  auto [m, s] = p.reduce2(Axis::cols, monoid::online_softmax(), z);
  p.store(y, exp(z - m) / s);

  std::map<std::string, example::HostOperand> ops;
  ops["x"] = example::random_matrix(DType::f32, 33, 1000, 1, 4.0);
  ops["mask"] = example::random_vector(DType::f32, 1000, 2, 1.0);
  ops["y"] = example::zeros(DType::f32, 33, 1000);
  return example::run_and_check(p, ops, {{"temperature", 0.7}});
}
