// The built-in operators as row programs.
#include <iterator>
#include <limits>
#include <string>

#include "spec/normaliser.hpp"
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

Normaliser scaled_normaliser(RowProgram& p, RowExpr e, RowExpr mean_square, RowExpr eps) {
  RowExpr ec = min(max(e, p.constant(monoid::kF32Exponents.lo, monoid::kF64Exponents.lo)),
                   p.constant(monoid::kF32Exponents.hi, monoid::kF64Exponents.hi));
  RowExpr eps_scaled = max(ldexp(eps, -2.0 * e), min(eps, p.constant(0x1p-126, 0x1p-1022)));
  RowExpr dominated = le(p.constant(1e30), eps_scaled);
  RowExpr plain = rsqrt(ldexp(mean_square, 2.0 * e) + eps);  // at e = 0 the same operations as `scaled`
  RowExpr scaled = rsqrt(mean_square + eps_scaled);
  return {ldexp(p.constant(1.0), 0.0 - ec), p.select(dominated, ldexp(plain, ec), ldexp(scaled, ec - e)),
          p.select(dominated, plain, ldexp(scaled, 0.0 - e))};
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

// RMSNorm on a sum of squares kept at an exponent (scaled_sum_squares): right for every finite
// input whose result the float type holds, from subnormal rows to rows at its largest values
// (docs/source/numerics.md).
RowProgram rms_norm_program() {
  RowProgram p("rms_norm");
  Operand x = p.row_in("x", DTypeSet::floats(), "input rows");
  Operand y = p.row_out("y", DTypeSet::floats(), x, "output rows (may be x itself)");
  Operand w = p.col_in("weight", DTypeSet::floats(), /*optional=*/true, "per-column scale");
  Operand eps = p.scalar_in("eps", ValueType::f32, 1e-6, "added to the mean square");
  p.scalar_range(eps, 0.0, 1e300);
  Operand rstd = p.row_scalar_out("rstd", DTypeSet::statistics(), /*optional=*/true, "1 / sqrt(mean square + eps) per row");
  RowExpr v = p.load(x);
  auto [k, s] = p.reduce2(Axis::cols, monoid::scaled_sum_squares(), v);
  Normaliser n = scaled_normaliser(p, k, s / p.cols(), p.load(eps));
  p.store(rstd, n.rstd);  // +inf where 1 / rms exceeds the float type (a tiny row and eps = 0)
  p.store(y, v * n.a * n.b * p.load_or(w, 1.0));
  return p;
}

// LayerNorm's mean and variance come from one scaled_mean_m2 reduction (Chan's merge of parts
// kept at exponents): the variance is a sum of squared deviations, never E[x^2] - E[x]^2,
// nothing overflows at any magnitude, and a constant row gives exactly the bias.
RowProgram layer_norm_program() {
  RowProgram p("layer_norm");
  Operand x = p.row_in("x", DTypeSet::floats(), "input rows");
  Operand y = p.row_out("y", DTypeSet::floats(), x, "output rows (may be x itself)");
  Operand w = p.col_in("weight", DTypeSet::floats(), /*optional=*/true, "per-column scale");
  Operand b = p.col_in("bias", DTypeSet::floats(), /*optional=*/true, "per-column shift");
  Operand eps = p.scalar_in("eps", ValueType::f32, 1e-5, "added to the variance");
  p.scalar_range(eps, 0.0, 1e300);
  Operand mean_out = p.row_scalar_out("mean", DTypeSet::statistics(), /*optional=*/true, "mean per row");
  Operand rstd_out = p.row_scalar_out("rstd", DTypeSet::statistics(), /*optional=*/true, "1 / sqrt(variance + eps) per row");
  RowExpr v = p.load(x);
  std::vector<RowExpr> stats = p.reduce(Axis::cols, monoid::scaled_mean_m2(), {v});
  RowExpr e = stats[1], mean = stats[2];  // e is already within the clamp range
  Normaliser n = scaled_normaliser(p, e, stats[3] / p.cols(), p.load(eps));
  p.store(mean_out, ldexp(mean, e));
  p.store(rstd_out, n.rstd);
  p.store(y, (v * n.a - mean) * n.b * p.load_or(w, 1.0) + p.load_or(b, 0.0));
  return p;
}

}  // namespace

const RowProgram& builtin_program(Op op) {
  static const RowProgram programs[] = {softmax_program(false), softmax_program(true), rms_norm_program(),
                                        layer_norm_program()};
  // An Op cast from an integer the enum does not hold names no program.
  if (int(op) >= int(std::size(programs)))
    throw Error("built-in operator: expected one of softmax, log_softmax, rms_norm, layer_norm, got Op(" +
                std::to_string(int(op)) + ")");
  return programs[int(op)];
}

}  // namespace tile
