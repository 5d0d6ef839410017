// The built-in operators as row programs.
#include "tile/error.hpp"
#include "tile/spec.hpp"

namespace tile {

std::string op_name(Op op) {
  switch (op) {
    case Op::softmax: return "softmax";
    case Op::log_softmax: return "log_softmax";
    case Op::rms_norm: return "rms_norm";
    case Op::layer_norm: return "layer_norm";
  }
  return "?";
}

Op parse_op(const std::string& name) {
  for (Op op : {Op::softmax, Op::log_softmax, Op::rms_norm, Op::layer_norm})
    if (op_name(op) == name) return op;
  throw Error("operator: expected one of softmax, log_softmax, rms_norm, layer_norm, got '" + name + "'");
}

namespace {

// Softmax and log-softmax: the row max and the sum of exp(x - max) in one reduction (one pass
// over the row even when it is re-read); an all -inf row gives NaN, as in PyTorch.
RowProgram softmax_program(bool log) {
  RowProgram p(log ? "log_softmax" : "softmax");
  Operand x = p.row_in("x", DTypeSet::floats(), "input rows");
  Operand y = p.row_out("y", DTypeSet::floats(), x, "output rows (may be x itself)");
  RowExpr v = p.load(x);
  auto [m, s] = p.reduce2(Axis::cols, monoid::online_softmax(), v);
  p.store(y, log ? (v - m) - tile::log(s) : exp(v - m) * (1.0 / s));
  return p;
}

RowProgram rms_norm_program() {
  RowProgram p("rms_norm");
  Operand x = p.row_in("x", DTypeSet::floats(), "input rows");
  Operand y = p.row_out("y", DTypeSet::floats(), x, "output rows (may be x itself)");
  Operand w = p.col_in("weight", DTypeSet::floats(), /*optional=*/true, "per-column scale");
  Operand eps = p.scalar_in("eps", ValueType::f32, 1e-6, "added to the mean square");
  p.scalar_range(eps, 0.0, 1e300);
  Operand rstd = p.row_scalar_out("rstd", {DType::f32}, /*optional=*/true, "1 / sqrt(mean square + eps) per row");
  RowExpr v = p.load(x);
  // The sum of squares as (k, s) with Σ x^2 = s 4^k (no overflow or underflow for any finite
  // x): rstd = 2^-k / sqrt(s / cols + eps 4^-k), with exact power-of-two scaling. Where eps 4^-k
  // dwarfs s / cols (< 4), rstd is 1 / sqrt(eps) to fp32's precision.
  auto [k, s] = p.reduce2(Axis::cols, monoid::scaled_sum_squares(), v);
  RowExpr e = p.load(eps);
  RowExpr eps_scaled = ldexp(e, -2.0 * k);
  RowExpr scaled = ldexp(rsqrt(s / p.cols() + eps_scaled), -k);
  RowExpr r = p.select(lt(eps_scaled, p.constant(1e30)), scaled, rsqrt(e));
  p.store(rstd, r);
  p.store(y, v * r * p.load_or(w, 1.0));
  return p;
}

// LayerNorm's mean and variance come from one mean_m2 reduction (Chan's merge): the variance
// is a sum of squared deviations, never E[x^2] - E[x]^2.
RowProgram layer_norm_program() {
  RowProgram p("layer_norm");
  Operand x = p.row_in("x", DTypeSet::floats(), "input rows");
  Operand y = p.row_out("y", DTypeSet::floats(), x, "output rows (may be x itself)");
  Operand w = p.col_in("weight", DTypeSet::floats(), /*optional=*/true, "per-column scale");
  Operand b = p.col_in("bias", DTypeSet::floats(), /*optional=*/true, "per-column shift");
  Operand eps = p.scalar_in("eps", ValueType::f32, 1e-5, "added to the variance");
  p.scalar_range(eps, 0.0, 1e300);
  Operand mean_out = p.row_scalar_out("mean", {DType::f32}, /*optional=*/true, "mean per row");
  Operand rstd_out = p.row_scalar_out("rstd", {DType::f32}, /*optional=*/true, "1 / sqrt(variance + eps) per row");
  RowExpr v = p.load(x);
  std::vector<RowExpr> stats = p.reduce(Axis::cols, monoid::mean_m2(), {v});
  RowExpr mean = stats[1];
  RowExpr rstd = rsqrt(stats[2] / p.cols() + p.load(eps));
  p.store(mean_out, mean);
  p.store(rstd_out, rstd);
  p.store(y, (v - mean) * rstd * p.load_or(w, 1.0) + p.load_or(b, 0.0));
  return p;
}

}  // namespace

const RowProgram& builtin_program(Op op) {
  static const RowProgram programs[] = {softmax_program(false), softmax_program(true), rms_norm_program(),
                                        layer_norm_program()};
  return programs[int(op)];
}

}  // namespace tile
