// A row-wise logsumexp: one fp32 value per row, nothing else written.
#include "example.hpp"

int main() {
  using namespace tile;
  RowProgram p("logsumexp");
  Operand x = p.row_in("x"), out = p.row_scalar_out("lse", {DType::f32}, false);
  auto [m, s] = p.reduce2(Axis::cols, monoid::online_softmax(), p.load(x));
  p.store(out, m + log(s));

  std::map<std::string, example::HostOperand> ops;
  ops["x"] = example::random_matrix(DType::f16, 64, 5000, 5, 8.0);
  ops["lse"] = example::zeros(DType::f32, 64);
  return example::run_and_check(p, ops, {});
}
