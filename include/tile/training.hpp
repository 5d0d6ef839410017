// Training operators: backward passes, fused residual-add RMSNorm and cross-entropy.
//
// Each is a row program (src/spec/training_ops.cpp) run like a built-in: the analytic policy,
// the lowering, both backends. Weight gradients (dweight, dbias) and reduced losses are
// reductions over the rows: fp32 partials per program, then a second kernel that folds them in
// a fixed order, so they are bitwise identical from run to run. The formulas, the special
// values and which outputs may alias which inputs are in docs/source/training.md; the Python
// functions of the same names in python/tile/_training.py.
//
//   tile::rms_norm(x, y, w, rstd);                         // forward, saving 1/rms per row
//   tile::rms_norm_backward(dy, x, w, rstd, dx, dw);        // dx and dweight
//   tile::cross_entropy_fused(logits, target, loss, logits, {}, {}, {}, count);  // dlogits in place
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "tile/tile.hpp"

namespace tile {

// ---- the programs ----

enum class Reduction : uint8_t { none, sum, mean };
std::string reduction_name(Reduction r);
Reduction parse_reduction(const std::string& name);  // "none", "sum", "mean"; throws tile::Error

// The cross-entropy programs: the forward pass (loss, lse, the count of rows not ignored), the
// forward pass that also writes dlogits (fused), and the backward pass from the saved lse.
enum class CrossEntropyPass : uint8_t { forward, fused, backward };
// Each pass in four variants: with a label_smoothing scalar or not, with a softcap scalar or
// not (a program without the operand computes as if it were 0, or absent).
const RowProgram& cross_entropy_program(CrossEntropyPass pass, bool label_smoothing = false, bool softcap = false);

// A training operator's program by name: softmax_backward, log_softmax_backward,
// rms_norm_backward, layer_norm_backward, fused_add_rms_norm, fused_add_rms_norm_backward, and
// cross_entropy, cross_entropy_fused, cross_entropy_backward (their variant without label
// smoothing and softcap). Throws tile::Error for another name.
const RowProgram& training_program(const std::string& name);
const std::vector<std::string>& training_program_names();

// ---- softmax ----

// dx = y * (dy - sum(y * dy)) per row, y = softmax(x). dx may be dy itself (same pointer,
// stride and dtype).
void softmax_backward(const TensorView& y, const TensorView& dy, const TensorView& dx, const CallOptions& options = {});
// dx = dy - exp(y) * sum(dy) per row, y = log_softmax(x). dx may be dy itself.
void log_softmax_backward(const TensorView& y, const TensorView& dy, const TensorView& dx,
                          const CallOptions& options = {});

// ---- norms ----

// rms_norm and layer_norm that also write their per-row statistics (float32, one per row; an
// empty VectorView leaves one out).
void rms_norm(const TensorView& x, const TensorView& y, const VectorView& weight, const VectorView& rstd,
              double eps = kRmsNormEps, const CallOptions& options = {});
void layer_norm(const TensorView& x, const TensorView& y, const VectorView& weight, const VectorView& bias,
                const VectorView& mean, const VectorView& rstd, double eps = kLayerNormEps,
                const CallOptions& options = {});

// From y = x * rstd * weight: dx, and dweight = sum over rows of dy * x * rstd when given (in
// its own dtype; weight may be absent, then as ones). dx may be dy itself.
void rms_norm_backward(const TensorView& dy, const TensorView& x, const VectorView& weight, const VectorView& rstd,
                       const TensorView& dx, const VectorView& dweight = {}, const CallOptions& options = {});
// From y = (x - mean) * rstd * weight + bias: dx, and when given dweight = sum of dy * (x -
// mean) * rstd and dbias = sum of dy over the rows. dx may be dy itself.
void layer_norm_backward(const TensorView& dy, const TensorView& x, const VectorView& weight, const VectorView& mean,
                         const VectorView& rstd, const TensorView& dx, const VectorView& dweight = {},
                         const VectorView& dbias = {}, const CallOptions& options = {});

// residual_out = x + residual (fp32 sum, stored in residual_out's dtype); y = rms_norm(the fp32
// sum) * weight; rstd per row when given. In place (vLLM's contract): y = x and residual_out =
// residual, exactly; no other overlap is accepted.
void fused_add_rms_norm(const TensorView& x, const TensorView& residual, const TensorView& y,
                        const TensorView& residual_out, const VectorView& weight = {}, double eps = kRmsNormEps,
                        const VectorView& rstd = {}, const CallOptions& options = {});
// The gradient of both outputs: dh = rms_norm_backward(dy, residual_out, weight, rstd) +
// dresidual_out is the gradient of x and of residual alike; dx = dh, dresidual = dh (in its
// own dtype) when given, dweight when given. dresidual_out and dresidual are absent when their
// data is null. dx may be dy itself, dresidual may be dresidual_out itself.
void fused_add_rms_norm_backward(const TensorView& dy, const TensorView& dresidual_out, const TensorView& residual_out,
                                 const VectorView& weight, const VectorView& rstd, const TensorView& dx,
                                 const TensorView& dresidual = {}, const VectorView& dweight = {},
                                 const CallOptions& options = {});

// ---- cross-entropy ----

struct CrossEntropyOptions {
  int64_t ignore_index = -100;
  Reduction reduction = Reduction::mean;
  double label_smoothing = 0.0;   // in [0, 1]
  double z_loss = 0.0;            // >= 0: z_loss * lse^2 added to each row's loss
  std::optional<double> softcap;  // > 0: logits become softcap * tanh(logits / softcap) first
};

// The loss of each row (float32): (rows,) for Reduction::none, else one value (the sum, or the
// mean over the rows whose target is not ignore_index). lse: log-sum-exp of each row's
// (softcapped) logits, when given. count: one float32, the number of rows whose target is not
// ignore_index, when given. A target outside [0, cols) that is not ignore_index is an error on
// the CPU backend and gives NaN (loss and dlogits of its row) on the CUDA backend.
void cross_entropy(const TensorView& logits, const VectorView& target, const VectorView& loss,
                   const CrossEntropyOptions& ce = {}, const VectorView& lse = {}, const VectorView& count = {},
                   const CallOptions& options = {});
// dlogits = dloss * d(loss)/d(logits) from the lse cross_entropy saved. dloss: (rows,) for
// Reduction::none, else one value (any float dtype); absent: 1. Reduction::mean also needs `count`, as
// cross_entropy writes it. dlogits may be logits itself.
void cross_entropy_backward(const VectorView& dloss, const TensorView& logits, const VectorView& target,
                            const VectorView& lse, const TensorView& dlogits, const CrossEntropyOptions& ce = {},
                            const VectorView& count = {}, const CallOptions& options = {});
// The forward and the backward pass in one pass over the logits: loss (and lse) as
// cross_entropy writes them, and dlogits for the upstream gradient dloss (absent: 1). dlogits
// may be logits itself: the gradient replaces the logits. Reduction::mean needs a `count`
// buffer (one float32), which a first, small kernel over the targets fills.
void cross_entropy_fused(const TensorView& logits, const VectorView& target, const VectorView& loss,
                         const TensorView& dlogits, const CrossEntropyOptions& ce = {}, const VectorView& dloss = {},
                         const VectorView& lse = {}, const VectorView& count = {}, const CallOptions& options = {});

}  // namespace tile
