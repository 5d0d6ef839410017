// Gemma's RMSNorm: y = x * rsqrt(mean(x^2) + eps) * (1 + weight), bf16 in, fp32 out.
#include "example.hpp"

int main() {
  using namespace tile;
  RowProgram p("rms_norm_gemma");
  Operand x = p.row_in("x"), w = p.col_in("weight"), y = p.row_out("y");
  Operand eps = p.scalar_in("eps", ValueType::f32, 1e-6);
  RowExpr v = p.load(x);
  RowExpr mean_square = p.reduce1(Axis::cols, monoid::sum(), v * v) / p.cols();
  p.store(y, v * rsqrt(mean_square + p.load(eps)) * (1.0 + p.load(w)));

  std::map<std::string, example::HostOperand> ops;
  ops["x"] = example::random_matrix(DType::bf16, 17, 2048, 3, 3.0);
  ops["weight"] = example::random_vector(DType::f32, 2048, 4, 0.5);
  ops["y"] = example::zeros(DType::f32, 17, 2048);
  return example::run_and_check(p, ops, {});
}
