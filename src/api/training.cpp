// Entry points of the training operators: each binds its program's operands by name and runs
// it (src/api/ops.cpp); cross-entropy also picks its program variant, checks what the binding
// cannot (the loss's shape per reduction, the targets on the CPU backend) and, for a mean
// reduction, counts the rows that are not ignored on the device first.
#include "tile/training.hpp"

#include <cmath>
#include <cstdio>
#include <string>

namespace tile {

namespace {

// Optional operands are left out when their data is null.
void set_if(Args& a, const std::string& name, const VectorView& v) {
  if (v.data) a.set(name, v);
}
// Required per-row operands too, unless there are no rows (then any pointer will do), so the
// binding says the operand is missing rather than empty.
void set_rows(Args& a, const std::string& name, const VectorView& v, int64_t rows) {
  if (v.data || rows == 0) a.set(name, v);
}
void set_if(Args& a, const std::string& name, const TensorView& t) {
  if (t.data) a.set(name, t);
}

// The eps a call takes: as given in a float64 call; else checked as the fp32 it becomes, with
// the operators' message (checked_eps).
double eps_for(Op op, const TensorView& x, double eps) {
  return x.dtype == DType::f64 ? eps : double(checked_eps(op, eps));
}

}  // namespace

void softmax_backward(const TensorView& y, const TensorView& dy, const TensorView& dx, const CallOptions& options) {
  run(training_program("softmax_backward"), Args().set("y", y).set("dy", dy).set("dx", dx), options);
}

void log_softmax_backward(const TensorView& y, const TensorView& dy, const TensorView& dx, const CallOptions& options) {
  run(training_program("log_softmax_backward"), Args().set("y", y).set("dy", dy).set("dx", dx), options);
}

void rms_norm(const TensorView& x, const TensorView& y, const VectorView& weight, const VectorView& rstd, double eps,
              const CallOptions& options) {
  Args a;
  a.set("x", x).set("y", y).set("eps", eps_for(Op::rms_norm, x, eps));
  set_if(a, "weight", weight);
  set_if(a, "rstd", rstd);
  run(builtin_program(Op::rms_norm), a, options);
}

void layer_norm(const TensorView& x, const TensorView& y, const VectorView& weight, const VectorView& bias,
                const VectorView& mean, const VectorView& rstd, double eps, const CallOptions& options) {
  Args a;
  a.set("x", x).set("y", y).set("eps", eps_for(Op::layer_norm, x, eps));
  set_if(a, "weight", weight);
  set_if(a, "bias", bias);
  set_if(a, "mean", mean);
  set_if(a, "rstd", rstd);
  run(builtin_program(Op::layer_norm), a, options);
}

void rms_norm_backward(const TensorView& dy, const TensorView& x, const VectorView& weight, const VectorView& rstd,
                       const TensorView& dx, const VectorView& dweight, const CallOptions& options) {
  Args a;
  a.set("dy", dy).set("x", x).set("dx", dx);
  set_rows(a, "rstd", rstd, dy.rows);
  set_if(a, "weight", weight);
  set_if(a, "dweight", dweight);
  run(training_program("rms_norm_backward"), a, options);
}

void layer_norm_backward(const TensorView& dy, const TensorView& x, const VectorView& weight, const VectorView& mean,
                         const VectorView& rstd, const TensorView& dx, const VectorView& dweight,
                         const VectorView& dbias, const CallOptions& options) {
  Args a;
  a.set("dy", dy).set("x", x).set("dx", dx);
  set_rows(a, "mean", mean, dy.rows);
  set_rows(a, "rstd", rstd, dy.rows);
  set_if(a, "weight", weight);
  set_if(a, "dweight", dweight);
  set_if(a, "dbias", dbias);
  run(training_program("layer_norm_backward"), a, options);
}

void fused_add_rms_norm(const TensorView& x, const TensorView& residual, const TensorView& y,
                        const TensorView& residual_out, const VectorView& weight, double eps, const VectorView& rstd,
                        const CallOptions& options) {
  Args a;
  a.set("x", x).set("residual", residual).set("y", y).set("residual_out", residual_out);
  a.set("eps", eps_for(Op::rms_norm, x, eps));
  set_if(a, "weight", weight);
  set_if(a, "rstd", rstd);
  run(training_program("fused_add_rms_norm"), a, options);
}

void fused_add_rms_norm_backward(const TensorView& dy, const TensorView& dresidual_out, const TensorView& residual_out,
                                 const VectorView& weight, const VectorView& rstd, const TensorView& dx,
                                 const TensorView& dresidual, const VectorView& dweight, const CallOptions& options) {
  Args a;
  a.set("dy", dy).set("residual_out", residual_out).set("dx", dx);
  set_rows(a, "rstd", rstd, dy.rows);
  set_if(a, "dresidual_out", dresidual_out);
  set_if(a, "dresidual", dresidual);
  set_if(a, "weight", weight);
  set_if(a, "dweight", dweight);
  run(training_program("fused_add_rms_norm_backward"), a, options);
}

namespace {

std::string number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

// What every cross-entropy entry point checks before binding: the scalars that choose the
// program variant, the class count, and on the CPU backend (host memory, cheap to read) the
// targets themselves.
void check_cross_entropy(const char* op, const TensorView& logits, const VectorView& target,
                         const CrossEntropyOptions& ce, Backend backend) {
  if (ce.softcap && !(*ce.softcap > 0))
    throw_argument_error(op, "softcap", "a finite value > 0, or none", number(*ce.softcap));
  // The kernels test 0 <= target < cols in float32, exact up to 2^24.
  if (logits.cols > (int64_t(1) << 24))
    throw_argument_error(op, "logits", "at most 2^24 columns (classes)", std::to_string(logits.cols));
  // A mean divides by the count of rows not ignored, a float32 sum: exact up to 2^24 rows.
  if (ce.reduction == Reduction::mean && logits.rows > (int64_t(1) << 24))
    throw_argument_error(op, "logits", "at most 2^24 rows for reduction mean", std::to_string(logits.rows));
  // The kernels read ignore_index as a double: exact up to 2^53 (2^53 + 1 would round to 2^53
  // and ignore nothing), so the check is on the integer.
  if (ce.ignore_index > kMaxExactInteger || ce.ignore_index < -kMaxExactInteger)
    throw_argument_error(op, "ignore_index", "an integer of magnitude at most 2^53", std::to_string(ce.ignore_index));
  // (Arguments the binding refuses are left to it, with its message.)
  if (backend != Backend::cpu || !target.data || target.size != logits.rows || is_float(target.dtype) ||
      target.stride < 0)
    return;
  for (int64_t r = 0; r < logits.rows; ++r) {
    const int64_t t = load_as_int(target.data, r * target.stride, target.dtype);
    if (t != ce.ignore_index && (t < 0 || t >= logits.cols))
      throw_argument_error(op, "target",
                           "class indices in [0, " + std::to_string(logits.cols) + ") or ignore_index (" +
                               std::to_string(ce.ignore_index) + ")",
                           std::to_string(t) + " at row " + std::to_string(r));
  }
}

const RowProgram& ce_program(CrossEntropyPass pass, const CrossEntropyOptions& ce) {
  return cross_entropy_program(pass, ce.label_smoothing != 0.0, ce.softcap.has_value());
}

void set_ce_scalars(Args& a, const CrossEntropyOptions& ce) {
  a.set("ignore_index", double(ce.ignore_index)).set("z_loss", ce.z_loss);
  if (ce.label_smoothing != 0.0) a.set("label_smoothing", ce.label_smoothing);
  if (ce.softcap) a.set("softcap", *ce.softcap);
}

// The loss of each reduction: per row, or one value bound to loss_sum or loss_mean.
void set_loss(const char* op, Args& a, const VectorView& loss, Reduction reduction) {
  if (reduction == Reduction::none) {
    a.set("loss", loss);
    return;
  }
  if (loss.size != 1)
    throw_argument_error(op, "loss", "one element for reduction " + reduction_name(reduction),
                         std::to_string(loss.size) + " elements");
  a.set(reduction == Reduction::sum ? "loss_sum" : "loss_mean", loss);
}

// dloss as the programs read it: one value per row, or one value broadcast (stride 0).
VectorView per_row_dloss(const char* op, const VectorView& dloss, int64_t rows, Reduction reduction) {
  if (reduction == Reduction::none) return dloss;
  if (dloss.size != 1)
    throw_argument_error(op, "dloss", "one element for reduction " + reduction_name(reduction),
                         std::to_string(dloss.size) + " elements");
  return VectorView{dloss.data, dloss.dtype, rows, 0};
}

// The count of rows not ignored, broadcast to every row, for a mean.
VectorView per_row_count(const char* op, const VectorView& count, int64_t rows) {
  if (!count.data)
    throw_argument_error(op, "count",
                         "one float32 for reduction mean: the rows whose target is not ignore_index, as cross_entropy "
                         "writes it",
                         "nothing");
  if (count.size != 1) throw_argument_error(op, "count", "one element", std::to_string(count.size) + " elements");
  return VectorView{count.data, count.dtype, rows, 0};
}

}  // namespace

void cross_entropy(const TensorView& logits, const VectorView& target, const VectorView& loss,
                   const CrossEntropyOptions& ce, const VectorView& lse, const VectorView& count,
                   const CallOptions& options) {
  check_cross_entropy("cross_entropy", logits, target, ce, options.backend);
  Args a;
  a.set("logits", logits);
  set_rows(a, "target", target, logits.rows);
  set_ce_scalars(a, ce);
  set_loss("cross_entropy", a, loss, ce.reduction);
  set_if(a, "lse", lse);
  set_if(a, "count", count);
  run(ce_program(CrossEntropyPass::forward, ce), a, options);
}

void cross_entropy_backward(const VectorView& dloss, const TensorView& logits, const VectorView& target,
                            const VectorView& lse, const TensorView& dlogits, const CrossEntropyOptions& ce,
                            const VectorView& count, const CallOptions& options) {
  const char* op = "cross_entropy_backward";
  check_cross_entropy(op, logits, target, ce, options.backend);
  Args a;
  a.set("logits", logits).set("dlogits", dlogits);
  set_rows(a, "target", target, logits.rows);
  set_rows(a, "lse", lse, logits.rows);
  set_ce_scalars(a, ce);
  if (dloss.data) a.set("dloss", per_row_dloss(op, dloss, logits.rows, ce.reduction));
  if (ce.reduction == Reduction::mean) a.set("count", per_row_count(op, count, logits.rows));
  run(ce_program(CrossEntropyPass::backward, ce), a, options);
}

void cross_entropy_fused(const TensorView& logits, const VectorView& target, const VectorView& loss,
                         const TensorView& dlogits, const CrossEntropyOptions& ce, const VectorView& dloss,
                         const VectorView& lse, const VectorView& count, const CallOptions& options) {
  const char* op = "cross_entropy_fused";
  check_cross_entropy(op, logits, target, ce, options.backend);
  Args a;
  a.set("logits", logits).set("dlogits", dlogits);
  set_rows(a, "target", target, logits.rows);
  set_ce_scalars(a, ce);
  set_loss(op, a, loss, ce.reduction);
  set_if(a, "lse", lse);
  if (dloss.data) a.set("dloss", per_row_dloss(op, dloss, logits.rows, ce.reduction));
  if (ce.reduction == Reduction::mean) {
    // The mean's divisor before the pass that needs it: a kernel that reads only the targets.
    const VectorView per_row = per_row_count(op, count, logits.rows);
    Args c;
    c.set("logits", logits).set("target", target).set("count", count);
    set_ce_scalars(c, ce);
    run(ce_program(CrossEntropyPass::forward, ce), c, options);
    a.set("count", per_row);
  }
  run(ce_program(CrossEntropyPass::fused, ce), a, options);
}

}  // namespace tile
