// The training operators as row programs: backward passes of softmax, log-softmax, RMSNorm and
// LayerNorm, fused residual-add RMSNorm forward and backward, and cross-entropy (forward,
// forward + backward, backward). The formulas are written out in docs/source/training.md.
#include <cfloat>
#include <limits>
#include <memory>
#include <mutex>
#include <tuple>

#include "spec/normaliser.hpp"
#include "tile/error.hpp"
#include "tile/training.hpp"

namespace tile {

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// dx = y * (dy - sum(y * dy)), or dx = dy - exp(y) * sum(dy) for log-softmax.
RowProgram softmax_backward_program(bool log) {
  RowProgram p(log ? "log_softmax_backward" : "softmax_backward");
  Operand y = p.row_in("y", DTypeSet::floats(), log ? "log_softmax output" : "softmax output");
  Operand dy = p.row_in("dy", DTypeSet::floats(), "gradient of y");
  Operand dx = p.row_out("dx", DTypeSet::floats(), dy, "gradient of x (may be dy itself)");
  RowExpr vy = p.load(y), g = p.load(dy);
  if (log) {
    p.store(dx, g - exp(vy) * p.reduce1(Axis::cols, monoid::sum(), g));
  } else {
    p.store(dx, vy * (g - p.reduce1(Axis::cols, monoid::sum(), vy * g)));
  }
  return p;
}

// With xhat = x * rstd and g = dy * weight: dx = rstd * (g - xhat * mean(g * xhat)), and
// dweight = sum over rows of dy * xhat. Every product stays near the scale of dy, so rows of
// huge or tiny x neither overflow nor underflow (rstd^3 would).
RowProgram rms_norm_backward_program() {
  RowProgram p("rms_norm_backward");
  Operand dy = p.row_in("dy", DTypeSet::floats(), "gradient of y");
  Operand x = p.row_in("x", DTypeSet::floats(), "input rows of the forward pass");
  Operand w = p.col_in("weight", DTypeSet::floats(), /*optional=*/true, "per-column scale");
  Operand rstd = p.row_scalar_in("rstd", DTypeSet::statistics(), "1 / sqrt(mean square + eps) per row, as rms_norm saved it");
  Operand dx = p.row_out("dx", DTypeSet::floats(), dy, "gradient of x (may be dy itself)");
  Operand dw = p.col_out("dweight", DTypeSet::floats(), /*optional=*/true, "gradient of weight, summed over the rows");
  RowExpr r = p.load(rstd), g0 = p.load(dy);
  RowExpr xhat = p.load(x) * r, g = g0 * p.load_or(w, 1.0);
  RowExpr dot = p.reduce1(Axis::cols, monoid::sum(), g * xhat);
  p.store(dx, r * (g - xhat * (dot / p.cols())));
  p.store(dw, p.reduce1(Axis::rows, monoid::sum(), g0 * xhat));
  return p;
}

// With xhat = (x - mean) * rstd and g = dy * weight:
// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)); dweight = sum dy * xhat; dbias = sum dy.
RowProgram layer_norm_backward_program() {
  RowProgram p("layer_norm_backward");
  Operand dy = p.row_in("dy", DTypeSet::floats(), "gradient of y");
  Operand x = p.row_in("x", DTypeSet::floats(), "input rows of the forward pass");
  Operand w = p.col_in("weight", DTypeSet::floats(), /*optional=*/true, "per-column scale");
  Operand mean = p.row_scalar_in("mean", DTypeSet::statistics(), "mean per row, as layer_norm saved it");
  Operand rstd = p.row_scalar_in("rstd", DTypeSet::statistics(), "1 / sqrt(variance + eps) per row, as layer_norm saved it");
  Operand dx = p.row_out("dx", DTypeSet::floats(), dy, "gradient of x (may be dy itself)");
  Operand dw = p.col_out("dweight", DTypeSet::floats(), /*optional=*/true, "gradient of weight, summed over the rows");
  Operand db = p.col_out("dbias", DTypeSet::floats(), /*optional=*/true, "gradient of bias, summed over the rows");
  RowExpr r = p.load(rstd), g0 = p.load(dy);
  RowExpr xhat = (p.load(x) - p.load(mean)) * r, g = g0 * p.load_or(w, 1.0);
  // The means are per-row values, so the division by n happens once a row (as a product with
  // 1 / n), not once an element.
  RowExpr mean_g = p.reduce1(Axis::cols, monoid::sum(), g) / p.cols();
  RowExpr mean_gx = p.reduce1(Axis::cols, monoid::sum(), g * xhat) / p.cols();
  p.store(dx, r * (g - (mean_g + xhat * mean_gx)));
  p.store(dw, p.reduce1(Axis::rows, monoid::sum(), g0 * xhat));
  p.store(db, p.reduce1(Axis::rows, monoid::sum(), g0));
  return p;
}

// h = x + residual in fp32; residual_out = h in its dtype; y = h * rstd(h) * weight, with rstd
// as rms_norm computes it (no overflow for any finite h).
RowProgram fused_add_rms_norm_program() {
  RowProgram p("fused_add_rms_norm");
  Operand x = p.row_in("x", DTypeSet::floats(), "input rows");
  Operand res = p.row_in("residual", DTypeSet::floats(), "residual rows, added to x");
  Operand w = p.col_in("weight", DTypeSet::floats(), /*optional=*/true, "per-column scale");
  Operand eps = p.scalar_in("eps", ValueType::f32, 1e-6, "added to the mean square");
  p.scalar_range(eps, 0.0, 1e300);
  Operand y = p.row_out("y", DTypeSet::floats(), x, "normalized rows (may be x itself)");
  Operand res_out = p.row_out("residual_out", DTypeSet::floats(), res, "x + residual (may be residual itself)");
  Operand rstd = p.row_scalar_out("rstd", DTypeSet::statistics(), /*optional=*/true, "1 / sqrt(mean square + eps) per row");
  RowExpr h = p.load(x) + p.load(res);
  auto [k, s] = p.reduce2(Axis::cols, monoid::scaled_sum_squares(), h);
  Normaliser n = scaled_normaliser(p, k, s / p.cols(), p.load(eps));
  p.store(rstd, n.rstd);
  p.store(res_out, h);
  p.store(y, h * n.a * n.b * p.load_or(w, 1.0));
  return p;
}

// dh = rstd * (g - hhat * mean(g * hhat)) + dresidual_out, hhat = h * rstd, g = dy * weight.
RowProgram fused_add_rms_norm_backward_program() {
  RowProgram p("fused_add_rms_norm_backward");
  Operand dy = p.row_in("dy", DTypeSet::floats(), "gradient of y");
  Operand dres =
      p.row_in("dresidual_out", DTypeSet::floats(), "gradient of residual_out (absent: 0)", /*optional=*/true);
  Operand h = p.row_in("residual_out", DTypeSet::floats(), "x + residual, as fused_add_rms_norm saved it");
  Operand w = p.col_in("weight", DTypeSet::floats(), /*optional=*/true, "per-column scale");
  Operand rstd = p.row_scalar_in("rstd", DTypeSet::statistics(), "1 / sqrt(mean square + eps) per row, as saved");
  Operand dx = p.row_out("dx", DTypeSet::floats(), dy, "gradient of x (may be dy itself)");
  Operand dr =
      p.row_out("dresidual", DTypeSet::floats(), dres,
                "gradient of residual, the same values as dx (may be dresidual_out itself)", /*optional=*/true);
  Operand dw = p.col_out("dweight", DTypeSet::floats(), /*optional=*/true, "gradient of weight, summed over the rows");
  RowExpr r = p.load(rstd), g0 = p.load(dy);
  RowExpr hhat = p.load(h) * r, g = g0 * p.load_or(w, 1.0);
  RowExpr dot = p.reduce1(Axis::cols, monoid::sum(), g * hhat);
  RowExpr dh = r * (g - hhat * (dot / p.cols())) + p.load_or(dres, 0.0);
  p.store(dx, dh);
  p.store(dr, dh);
  p.store(dw, p.reduce1(Axis::rows, monoid::sum(), g0 * hhat));
  return p;
}

// Cross-entropy of row logits z against a target class t, after z <- softcap * tanh(z / softcap):
//   loss = lse - (1 - ls) z_t - ls / C * sum(z) + z_loss * lse^2   (0 where t == ignore_index)
//   dz   = dloss / count * ((1 + 2 z_loss lse) softmax(z) - (1 - ls) [j == t] - ls / C)
// times 1 - tanh^2(z / softcap) with a softcap. lse - z_t is computed as log(s) + (m - z_t), so
// a confident row's small loss does not cancel against a large lse. A target outside [0, C)
// that is not ignored makes its row's loss and gradient NaN.
RowProgram cross_entropy_program_of(CrossEntropyPass pass, bool smoothing, bool softcap) {
  static const char* names[] = {"cross_entropy", "cross_entropy_fused", "cross_entropy_backward"};
  RowProgram p(names[int(pass)]);
  const bool forward = pass != CrossEntropyPass::backward, gradient = pass != CrossEntropyPass::forward;
  Operand logits = p.row_in("logits", DTypeSet::floats(), "logits, one row per sample");
  Operand target = p.row_scalar_in("target", DTypeSet::integers(), "class of each row, or ignore_index");
  Operand lse_in, dloss, count;
  if (!forward) lse_in = p.row_scalar_in("lse", DTypeSet::statistics(), "log-sum-exp per row, as cross_entropy saved it");
  if (gradient) {
    dloss = p.row_scalar_in("dloss", DTypeSet::floats(),
                            "gradient of each row's loss (stride 0: one value for every row; absent: 1)", true);
    count = p.row_scalar_in("count", DTypeSet::statistics(),
                            "rows whose target is not ignore_index, for reduction mean (stride 0; absent: 1)", true);
  }
  Operand ignore = p.scalar_in("ignore_index", ValueType::i64, -100.0, "the target of rows that add nothing");
  Operand ls, cap;
  if (smoothing) {
    ls = p.scalar_in("label_smoothing", ValueType::f32, 0.0, "weight of the uniform distribution in the target");
    p.scalar_range(ls, 0.0, 1.0);
  }
  Operand zl = p.scalar_in("z_loss", ValueType::f32, 0.0, "weight of lse^2 in each row's loss");
  p.scalar_range(zl, 0.0, 1e300);
  if (softcap) {
    cap = p.scalar_in("softcap", ValueType::f32, std::nullopt, "logits become softcap * tanh(logits / softcap)");
    p.scalar_range(cap, FLT_MIN, 1e300);
  }
  Operand loss, lse_out, loss_sum, loss_mean, count_out, dlogits;
  if (forward) {
    loss = p.row_scalar_out("loss", DTypeSet::statistics(), true, "loss of each row (0 where the target is ignore_index)");
    lse_out = p.row_scalar_out("lse", DTypeSet::statistics(), true, "log-sum-exp of each row's logits");
    loss_sum = p.scalar_out("loss_sum", DTypeSet::statistics(), true, "sum of the rows' losses");
    loss_mean = p.scalar_out("loss_mean", DTypeSet::statistics(), true, "loss_sum / the rows whose target is not ignore_index");
  }
  if (pass == CrossEntropyPass::forward)
    count_out = p.scalar_out("count", DTypeSet::statistics(), true, "the rows whose target is not ignore_index");
  if (gradient)
    dlogits = p.row_out("dlogits", DTypeSet::floats(), logits, "gradient of the logits (may be logits itself)");

  RowExpr z = p.load(logits), th;  // th = tanh(z / softcap), for the softcap's derivative
  if (softcap) {
    RowExpr c = p.load(cap);
    th = tanh(z / c);
    z = c * th;
  }
  RowExpr t = p.load(target), tf = to_f32(t);
  RowExpr ignored = eq(t, p.load(ignore));
  // Exact for C <= 2^24 columns (the operators refuse more).
  RowExpr in_range = logical_and(le(p.constant(0.0), tf), lt(tf, p.cols()));
  RowExpr hit = eq(p.col_index(), t);
  RowExpr zero = p.constant(0.0), nan = p.constant(kNaN);
  RowExpr eps = smoothing ? p.load(ls) : zero;
  RowExpr lse, m, s;
  if (forward) {
    std::tie(m, s) = p.reduce2(Axis::cols, monoid::online_softmax(), z);
    RowExpr zt = p.reduce1(Axis::cols, monoid::sum(), p.select(hit, z, zero));
    RowExpr log_s = log(s);
    lse = m + log_s;
    RowExpr nll = smoothing
                      ? log_s + (1.0 - eps) * (m - zt) + eps * (m - p.reduce1(Axis::cols, monoid::sum(), z) / p.cols())
                      : log_s + (m - zt);
    RowExpr row_loss = p.select(ignored, zero, p.select(in_range, nll + (p.load(zl) * lse) * lse, nan));
    p.store(loss, row_loss);
    p.store(lse_out, lse);
    RowExpr total = p.reduce1(Axis::rows, monoid::sum(), row_loss);
    RowExpr counted = p.reduce1(Axis::rows, monoid::sum(), p.select(ignored, zero, p.constant(1.0)));
    p.store(loss_sum, total);
    p.store(loss_mean, total / counted);
    if (pass == CrossEntropyPass::forward) p.store(count_out, counted);
  } else {
    lse = p.load(lse_in);
  }
  if (gradient) {
    // softmax(z) from this pass's statistics, or from the saved lse.
    RowExpr prob = forward ? exp(z - m) * (1.0 / s) : exp(z - lse);
    RowExpr scale = p.load_or(dloss, 1.0) / p.load_or(count, 1.0);
    RowExpr g = (1.0 + (2.0 * p.load(zl)) * lse) * prob;
    g = smoothing ? g - p.select(hit, 1.0 - eps, zero) - eps / p.cols() : g - p.select(hit, p.constant(1.0), zero);
    if (softcap) g = g * (1.0 - th * th);
    p.store(dlogits, p.select(ignored, zero, p.select(in_range, scale * g, nan)));
  }
  return p;
}

}  // namespace

std::string reduction_name(Reduction r) {
  switch (r) {
    case Reduction::none:
      return "none";
    case Reduction::sum:
      return "sum";
    case Reduction::mean:
      return "mean";
  }
  return "?";
}

Reduction parse_reduction(const std::string& name) {
  for (Reduction r : {Reduction::none, Reduction::sum, Reduction::mean})
    if (reduction_name(r) == name) return r;
  throw_argument_error("cross_entropy", "reduction", "one of none, sum, mean", "'" + name + "'");
}

const RowProgram& cross_entropy_program(CrossEntropyPass pass, bool label_smoothing, bool softcap) {
  // Built on first use, each variant once; programs never move.
  static std::once_flag once[3][2][2];
  static std::unique_ptr<RowProgram> programs[3][2][2];
  auto& slot = programs[int(pass)][label_smoothing][softcap];
  std::call_once(once[int(pass)][label_smoothing][softcap], [&] {
    slot = std::make_unique<RowProgram>(cross_entropy_program_of(pass, label_smoothing, softcap));
  });
  return *slot;
}

const std::vector<std::string>& training_program_names() {
  static const std::vector<std::string> names = {
      "softmax_backward",    "log_softmax_backward", "rms_norm_backward",
      "layer_norm_backward", "fused_add_rms_norm",   "fused_add_rms_norm_backward",
      "cross_entropy",       "cross_entropy_fused",  "cross_entropy_backward"};
  return names;
}

const RowProgram& training_program(const std::string& name) {
  static const RowProgram programs[] = {softmax_backward_program(false), softmax_backward_program(true),
                                        rms_norm_backward_program(),     layer_norm_backward_program(),
                                        fused_add_rms_norm_program(),    fused_add_rms_norm_backward_program()};
  if (name == "cross_entropy") return cross_entropy_program(CrossEntropyPass::forward);
  if (name == "cross_entropy_fused") return cross_entropy_program(CrossEntropyPass::fused);
  if (name == "cross_entropy_backward") return cross_entropy_program(CrossEntropyPass::backward);
  for (const RowProgram& p : programs)
    if (p.name() == name) return p;
  std::string names;
  for (const std::string& n : training_program_names()) names += (names.empty() ? "" : ", ") + n;
  throw_argument_error("training_program", "name", "one of " + names, "'" + name + "'");
}

}  // namespace tile
