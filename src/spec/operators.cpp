// The built-in operators as row programs.
#include <limits>

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

// The normalisation factor k = p / sqrt(ms p^2 + eps) = rsqrt(ms + eps / p^2) of statistics
// scaled by p (ms: the mean square of x / p), so the output (x / p) * k never forms 1 / p or
// the mean square itself. Where eps / p^2 overflows (p small) eps dwarfs the statistics and
// k = p * rsqrt(eps + ms p^2) (the second term only carries a NaN). Where it underflows (p
// large), a floor of 2^-126 for eps > 0, below the statistics of any row that is not constant,
// keeps a constant row's 0 * k at 0 rather than 0 * inf.
RowExpr scaled_rstd(RowProgram& p, RowExpr scale, RowExpr mean_square, RowExpr eps) {
  RowExpr inv = 1.0 / scale;
  RowExpr e2 = max(eps * inv * inv, min(eps, p.constant(0x1p-126)));
  RowExpr overflow = eq(e2, p.constant(std::numeric_limits<double>::infinity()));
  return p.select(overflow, scale * rsqrt(eps + mean_square * scale * scale), rsqrt(mean_square + e2));
}

// RMSNorm on a sum of squares scaled by a power of two (scaled_sum_squares): right for every
// finite input whose result fp32 holds (docs/source/numerics.md).
RowProgram rms_norm_program() {
  RowProgram p("rms_norm");
  Operand x = p.row_in("x", DTypeSet::floats(), "input rows");
  Operand y = p.row_out("y", DTypeSet::floats(), x, "output rows (may be x itself)");
  Operand w = p.col_in("weight", DTypeSet::floats(), /*optional=*/true, "per-column scale");
  Operand eps = p.scalar_in("eps", ValueType::f32, 1e-6, "added to the mean square");
  p.scalar_range(eps, 0.0, 1e300);
  Operand rstd = p.row_scalar_out("rstd", {DType::f32}, /*optional=*/true, "1 / sqrt(mean square + eps) per row");
  RowExpr v = p.load(x);
  auto [scale, sum] = p.reduce2(Axis::cols, monoid::scaled_sum_squares(), v);
  RowExpr k = scaled_rstd(p, scale, sum / p.cols(), p.load(eps));
  RowExpr inv = 1.0 / scale;
  p.store(rstd, k * inv);  // +inf where 1 / rms exceeds fp32 (a tiny row and eps = 0)
  p.store(y, v * inv * k * p.load_or(w, 1.0));
  return p;
}

// LayerNorm's mean and variance come from one scaled_mean_m2 reduction (Chan's merge of parts
// scaled by powers of two): the variance is a sum of squared deviations, never E[x^2] - E[x]^2,
// nothing overflows at any magnitude, and a constant row gives exactly the bias.
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
  std::vector<RowExpr> stats = p.reduce(Axis::cols, monoid::scaled_mean_m2(), {v});
  RowExpr scale = stats[1], mean = stats[2];
  RowExpr k = scaled_rstd(p, scale, stats[3] / p.cols(), p.load(eps));
  RowExpr inv = 1.0 / scale;
  p.store(mean_out, mean * scale);
  p.store(rstd_out, k * inv);
  p.store(y, (v * inv - mean) * k * p.load_or(w, 1.0) + p.load_or(b, 0.0));
  return p;
}

}  // namespace

const RowProgram& builtin_program(Op op) {
  static const RowProgram programs[] = {softmax_program(false), softmax_program(true), rms_norm_program(),
                                        layer_norm_program()};
  return programs[int(op)];
}

}  // namespace tile
