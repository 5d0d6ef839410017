// The training operators' entry points (src/api/training.cpp): what each refuses and with which
// message, which outputs may alias which inputs (in place) and which may not, the norms'
// statistics outputs, and the cross-entropy rules the binding cannot check by itself.
#include "tile/training.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>

#include "support/error_of.hpp"

namespace tile {
namespace {

const CallOptions kCpu{{}, nullptr, Backend::cpu};

using tile::testing::error_of;

#define EXPECT_ERROR(stmt, text) EXPECT_EQ(error_of([&] { stmt; }), text)

struct Rows {
  int64_t rows, cols;
  std::vector<float> a, b, c, d;
  std::vector<float> w, dw, s1, s2;
  Rows(int64_t r, int64_t n)
      : rows(r),
        cols(n),
        a(size_t(r * n)),
        b(size_t(r * n)),
        c(size_t(r * n)),
        d(size_t(r * n)),
        w(size_t(n), 1.0f),
        dw(size_t(n)),
        s1(size_t(r), 1.0f),
        s2(size_t(r), 1.0f) {
    std::mt19937 g(1);
    std::normal_distribution<float> nd;
    for (auto* v : {&a, &b, &c, &d})
      for (float& x : *v) x = nd(g);
  }
  TensorView m(std::vector<float>& v) { return matrix(v.data(), DType::f32, rows, cols); }
  VectorView col(std::vector<float>& v) { return VectorView{v.data(), DType::f32, cols}; }
  VectorView row(std::vector<float>& v) { return VectorView{v.data(), DType::f32, rows}; }
};

TEST(TrainingApi, ArgumentErrorsNameTheOperatorAndTheOperand) {
  Rows t(4, 16);
  EXPECT_ERROR(softmax_backward(t.m(t.a), matrix(t.b.data(), DType::f32, 4, 15), t.m(t.c), kCpu),
               "softmax_backward: argument 'dy': expected shape (4, 16) like y, got (4, 15)");
  EXPECT_ERROR(log_softmax_backward(t.m(t.a), t.m(t.b), matrix(t.c.data(), DType::i32, 4, 16), kCpu),
               "log_softmax_backward: argument 'dx': expected dtype f32, f64, f16 or bf16, got i32");
  EXPECT_ERROR(
      rms_norm_backward(t.m(t.a), t.m(t.b), t.col(t.w), VectorView{t.s1.data(), DType::f32, 3}, t.m(t.c), {}, kCpu),
      "rms_norm_backward: argument 'rstd': expected 4 elements (one per row), got 3");
  EXPECT_ERROR(rms_norm_backward(t.m(t.a), t.m(t.b), t.col(t.w), {}, t.m(t.c), {}, kCpu),
               "rms_norm_backward: argument 'rstd': expected a vector (per-row input), got nothing");
  EXPECT_ERROR(
      rms_norm_backward(t.m(t.a), t.m(t.b), t.col(t.w), VectorView{t.s1.data(), DType::bf16, 4}, t.m(t.c), {}, kCpu),
      "rms_norm_backward: argument 'rstd': expected dtype f32 or f64, got bf16");
  EXPECT_ERROR(layer_norm_backward(t.m(t.a), t.m(t.b), t.col(t.w), t.row(t.s1), t.row(t.s2), t.m(t.c),
                                   VectorView{t.dw.data(), DType::f32, 15}, {}, kCpu),
               "layer_norm_backward: argument 'dweight': expected 16 elements (one per column), got 15");
  EXPECT_ERROR(fused_add_rms_norm(t.m(t.a), t.m(t.b), t.m(t.c), t.m(t.d), t.col(t.w), -1.0f, {}, kCpu),
               "rms_norm: argument 'eps': expected 0 or a finite positive value that float32 holds within rounding "
               "(relative error at most 2^-24: [1.17549435e-38, 3.40282347e+38] and the subnormals float32 holds "
               "exactly), got -1");
  EXPECT_ERROR(fused_add_rms_norm_backward(t.m(t.a), {}, t.m(t.b), t.col(t.w), t.row(t.s1),
                                           matrix(t.c.data(), DType::f32, 5, 16), {}, {}, kCpu),
               "fused_add_rms_norm_backward: argument 'dx': expected shape (4, 16) like dy, got (5, 16)");
}

TEST(TrainingApi, OutputsAliasOnlyTheInputTheyMayReplace) {
  Rows t(4, 16);
  // dx may be dy exactly (in place), not y, and not a shifted view of dy.
  EXPECT_NO_THROW(softmax_backward(t.m(t.a), t.m(t.b), t.m(t.b), kCpu));
  EXPECT_ERROR(softmax_backward(t.m(t.a), t.m(t.b), t.m(t.a), kCpu),
               "softmax_backward: argument 'dx': expected memory that does not overlap y, got an overlapping view");
  EXPECT_ERROR(
      rms_norm_backward(t.m(t.a), t.m(t.b), {}, t.row(t.s1), matrix(t.a.data() + 1, DType::f32, 4, 16), {}, kCpu),
      "rms_norm_backward: argument 'dx': expected memory that does not overlap dy, or exactly dy (same pointer, "
      "stride and dtype), got an overlapping view");
  // fused_add_rms_norm in place, vLLM's contract: y over x and residual_out over residual.
  const std::vector<float> x0 = t.a, r0 = t.b;
  EXPECT_NO_THROW(fused_add_rms_norm(t.m(t.a), t.m(t.b), t.m(t.a), t.m(t.b), t.col(t.w), 1e-6f, t.row(t.s1), kCpu));
  for (int64_t r = 0; r < t.rows; ++r) {
    double ss = 0;
    for (int64_t c = 0; c < t.cols; ++c)
      ss += double(x0[size_t(r * 16 + c)] + r0[size_t(r * 16 + c)]) * (x0[size_t(r * 16 + c)] + r0[size_t(r * 16 + c)]);
    const double rstd = 1 / std::sqrt(ss / 16 + 1e-6);
    for (int64_t c = 0; c < t.cols; ++c) {
      const size_t i = size_t(r * 16 + c);
      EXPECT_EQ(t.b[i], x0[i] + r0[i]);
      EXPECT_NEAR(t.a[i], (double(x0[i]) + r0[i]) * rstd, 1e-5);
    }
  }
  // Crossed (y over residual, residual_out over x) or both outputs on one buffer: refused.
  EXPECT_ERROR(fused_add_rms_norm(t.m(t.a), t.m(t.b), t.m(t.b), t.m(t.a), {}, 1e-6f, {}, kCpu),
               "fused_add_rms_norm: argument 'y': expected memory that does not overlap residual, got an overlapping "
               "view");
  EXPECT_ERROR(fused_add_rms_norm(t.m(t.a), t.m(t.b), t.m(t.c), t.m(t.c), {}, 1e-6f, {}, kCpu),
               "fused_add_rms_norm: argument 'y': expected memory that does not overlap residual_out, got an "
               "overlapping view");
  // A 16-bit x with an fp32 residual stream, in place: each output keeps its input's dtype.
  std::vector<uint16_t> xb(4 * 16);
  for (size_t i = 0; i < xb.size(); ++i) xb[i] = float_to_bf16_bits(x0[i]);
  std::vector<float> res = r0;
  EXPECT_NO_THROW(fused_add_rms_norm(matrix(xb.data(), DType::bf16, 4, 16), t.m(res),
                                     matrix(xb.data(), DType::bf16, 4, 16), t.m(res), {}, 1e-6f, {}, kCpu));
  EXPECT_EQ(res[5], bf16_bits_to_float(float_to_bf16_bits(x0[5])) + r0[5]);
  // The backward in place: dx over dy, dresidual over dresidual_out.
  EXPECT_NO_THROW(fused_add_rms_norm_backward(t.m(t.c), t.m(t.d), t.m(t.b), t.col(t.w), t.row(t.s1), t.m(t.c), t.m(t.d),
                                              t.col(t.dw), kCpu));
  EXPECT_EQ(t.c, t.d);  // the same gradient twice
  // cross_entropy_fused in place: dlogits over logits.
  std::vector<int64_t> target = {0, 15, 3, -100};
  std::vector<float> loss(1), count(1);
  EXPECT_NO_THROW(cross_entropy_fused(t.m(t.a), VectorView{target.data(), DType::i64, 4},
                                      VectorView{loss.data(), DType::f32, 1}, t.m(t.a), {}, {}, {},
                                      VectorView{count.data(), DType::f32, 1}, kCpu));
  EXPECT_EQ(count[0], 3.0f);
  for (int64_t c = 0; c < 16; ++c) EXPECT_EQ(t.a[size_t(3 * 16 + c)], 0.0f);  // the ignored row's gradient
}

TEST(TrainingApi, NormStatisticsOutputs) {
  Rows t(3, 40);
  std::vector<float> y(3 * 40), y2(3 * 40), rstd(3), mean(3);
  rms_norm(t.m(t.a), matrix(y.data(), DType::f32, 3, 40), t.col(t.w), t.row(rstd), 1e-6f, kCpu);
  rms_norm(t.m(t.a), matrix(y2.data(), DType::f32, 3, 40), t.col(t.w), 1e-6f, kCpu);
  EXPECT_EQ(y, y2);
  layer_norm(t.m(t.a), matrix(y.data(), DType::f32, 3, 40), t.col(t.w), {}, t.row(mean), t.row(rstd), 1e-5f, kCpu);
  for (int64_t r = 0; r < 3; ++r) {
    double m = 0, v = 0;
    for (int64_t c = 0; c < 40; ++c) m += t.a[size_t(r * 40 + c)];
    m /= 40;
    for (int64_t c = 0; c < 40; ++c) v += (t.a[size_t(r * 40 + c)] - m) * (t.a[size_t(r * 40 + c)] - m);
    EXPECT_NEAR(mean[size_t(r)], m, 1e-6);
    EXPECT_NEAR(rstd[size_t(r)], 1 / std::sqrt(v / 40 + 1e-5), 1e-5);
  }
  EXPECT_ERROR(layer_norm(t.m(t.a), matrix(y.data(), DType::f32, 3, 40), {}, {}, {},
                          VectorView{rstd.data(), DType::f32, 2}, 1e-5f, kCpu),
               "layer_norm: argument 'rstd': expected 3 elements (one per row), got 2");
}

// A float64 call takes eps as the double given, through both rms_norm entry points and
// layer_norm: where eps dominates the variance, its fp32 rounding (3e-8 relative for 1e-6)
// moves the output by far more than float64's rounding, so the check below tells them apart.
TEST(TrainingApi, Float64CallsTakeEpsAsADouble) {
  const int64_t cols = 16;
  std::vector<double> x(cols), y(cols), y2(cols), y3(cols), rstd(1), mean(1);
  for (int64_t c = 0; c < cols; ++c) x[size_t(c)] = 1e-4 * double(c % 4 + 1);
  const double eps = 1e-6;
  double ss = 0, m = 0, v = 0;
  for (double a : x) ss += a * a, m += a;
  m /= double(cols);
  for (double a : x) v += (a - m) * (a - m);
  const double rms_exact = 1 / std::sqrt(ss / double(cols) + eps);
  const double rms_fp32_eps = 1 / std::sqrt(ss / double(cols) + double(float(eps)));
  ASSERT_GT(std::abs(rms_fp32_eps / rms_exact - 1), 1e-10);  // the check can fail
  rms_norm(matrix(x.data(), DType::f64, 1, cols), matrix(y.data(), DType::f64, 1, cols), {}, eps, kCpu);
  rms_norm(matrix(x.data(), DType::f64, 1, cols), matrix(y2.data(), DType::f64, 1, cols), {},
           VectorView{rstd.data(), DType::f64, 1}, eps, kCpu);
  EXPECT_NEAR(rstd[0] / rms_exact, 1.0, 1e-13);
  for (int64_t c = 0; c < cols; ++c) {
    EXPECT_NEAR(y[size_t(c)] / (x[size_t(c)] * rms_exact), 1.0, 1e-13) << c;
    EXPECT_EQ(y[size_t(c)], y2[size_t(c)]) << c;
  }
  layer_norm(matrix(x.data(), DType::f64, 1, cols), matrix(y3.data(), DType::f64, 1, cols), {}, {},
             VectorView{mean.data(), DType::f64, 1}, VectorView{rstd.data(), DType::f64, 1}, eps, kCpu);
  EXPECT_NEAR(rstd[0] * std::sqrt(v / double(cols) + eps), 1.0, 1e-13);
}

TEST(TrainingApi, CrossEntropyRules) {
  Rows t(4, 16);
  std::vector<int64_t> target = {0, 15, 3, -100};
  std::vector<float> loss(4), one(1), count(1), lse(4);
  const VectorView tv{target.data(), DType::i64, 4}, per_row{loss.data(), DType::f32, 4},
      single{one.data(), DType::f32, 1};
  CrossEntropyOptions mean, none, sum;
  none.reduction = Reduction::none, sum.reduction = Reduction::sum;
  // The loss has one value per row for none, one value otherwise.
  EXPECT_ERROR(cross_entropy(t.m(t.a), tv, per_row, mean, {}, {}, kCpu),
               "cross_entropy: argument 'loss': expected one element for reduction mean, got 4 elements");
  EXPECT_ERROR(cross_entropy(t.m(t.a), tv, single, none, {}, {}, kCpu),
               "cross_entropy: argument 'loss': expected 4 elements (one per row), got 1");
  // A target outside [0, cols) that is not ignore_index, read on the CPU backend.
  target[2] = 16;
  EXPECT_ERROR(
      cross_entropy(t.m(t.a), tv, single, mean, {}, {}, kCpu),
      "cross_entropy: argument 'target': expected class indices in [0, 16) or ignore_index (-100), got 16 at row 2");
  target[2] = -1;
  EXPECT_ERROR(
      cross_entropy_fused(t.m(t.a), tv, per_row, t.m(t.b), none, {}, {}, {}, kCpu),
      "cross_entropy_fused: argument 'target': expected class indices in [0, 16) or ignore_index (-100), got -1 at "
      "row 2");
  target[2] = 3;
  std::vector<int32_t> t32 = {0, 15, -7, 1};
  CrossEntropyOptions ignore7 = none;
  ignore7.ignore_index = -7;
  EXPECT_NO_THROW(cross_entropy(t.m(t.a), VectorView{t32.data(), DType::i32, 4}, per_row, ignore7, {}, {}, kCpu));
  EXPECT_EQ(loss[2], 0.0f);
  // A mean's backward needs the count of rows not ignored; the fused form a buffer for it.
  EXPECT_ERROR(
      cross_entropy_backward(single, t.m(t.a), tv, VectorView{lse.data(), DType::f32, 4}, t.m(t.b), mean, {}, kCpu),
      "cross_entropy_backward: argument 'count': expected one float32 for reduction mean: the rows whose target "
      "is not ignore_index, as cross_entropy writes it, got nothing");
  EXPECT_ERROR(
      cross_entropy_fused(t.m(t.a), tv, single, t.m(t.b), mean, {}, {}, {}, kCpu),
      "cross_entropy_fused: argument 'count': expected one float32 for reduction mean: the rows whose target is "
      "not ignore_index, as cross_entropy writes it, got nothing");
  EXPECT_ERROR(
      cross_entropy_backward(per_row, t.m(t.a), tv, VectorView{lse.data(), DType::f32, 4}, t.m(t.b), sum, {}, kCpu),
      "cross_entropy_backward: argument 'dloss': expected one element for reduction sum, got 4 elements");
  // Scalars: their ranges, checked by the binding under the program's name.
  CrossEntropyOptions bad = mean;
  bad.label_smoothing = 1.5;
  EXPECT_ERROR(cross_entropy(t.m(t.a), tv, single, bad, {}, {}, kCpu),
               "cross_entropy: argument 'label_smoothing': expected a value in [0, 1], got 1.5");
  bad = mean, bad.z_loss = -1;
  EXPECT_ERROR(cross_entropy(t.m(t.a), tv, single, bad, {}, {}, kCpu),
               "cross_entropy: argument 'z_loss': expected a value in [0, 1e+300], got -1");
  bad = mean, bad.softcap = 0.0;
  EXPECT_ERROR(cross_entropy(t.m(t.a), tv, single, bad, {}, {}, kCpu),
               "cross_entropy: argument 'softcap': expected a finite value > 0, or none, got 0");
  bad = mean, bad.ignore_index = int64_t(1) << 60;
  EXPECT_ERROR(cross_entropy(t.m(t.a), tv, single, bad, {}, {}, kCpu),
               "cross_entropy: argument 'ignore_index': expected an integer of magnitude at most 2^53, got "
               "1152921504606846976");
  // One past 2^53 would round to 2^53 on its way to the kernel (a double) and ignore nothing.
  bad = mean, bad.ignore_index = (int64_t(1) << 53) + 1;
  EXPECT_ERROR(cross_entropy(t.m(t.a), tv, single, bad, {}, {}, kCpu),
               "cross_entropy: argument 'ignore_index': expected an integer of magnitude at most 2^53, got "
               "9007199254740993");
  bad.ignore_index = -bad.ignore_index;
  EXPECT_ERROR(cross_entropy(t.m(t.a), tv, single, bad, {}, {}, kCpu),
               "cross_entropy: argument 'ignore_index': expected an integer of magnitude at most 2^53, got "
               "-9007199254740993");
  bad.ignore_index = -(int64_t(1) << 53);  // accepted: the targets are read against it
  EXPECT_ERROR(cross_entropy(t.m(t.a), tv, single, bad, {}, {}, kCpu),
               "cross_entropy: argument 'target': expected class indices in [0, 16) or ignore_index "
               "(-9007199254740992), got -100 at row 3");
  EXPECT_ERROR(cross_entropy(t.m(t.a), VectorView{t.s1.data(), DType::f32, 4}, single, mean, {}, {}, kCpu),
               "cross_entropy: argument 'target': expected dtype i32 or i64, got f32");
  // Class counts beyond 2^24 (the kernels compare targets in float32); checked before any read.
  EXPECT_ERROR(cross_entropy(matrix(t.a.data(), DType::f32, 1, (int64_t(1) << 24) + 1),
                             VectorView{target.data(), DType::i64, 1}, single, mean, {}, {}, kCpu),
               "cross_entropy: argument 'logits': expected at most 2^24 columns (classes), got 16777217");
  EXPECT_THROW(parse_reduction("avg"), Error);
  EXPECT_EQ(parse_reduction("sum"), Reduction::sum);
}

// The count stays on the device: a mean's backward reads it through a stride-0 view, so a
// caller may reuse the forward's count without reading it back.
TEST(TrainingApi, CrossEntropyMeanReusesTheForwardsCount) {
  Rows t(6, 10);
  std::vector<int64_t> target = {1, -100, 9, 0, -100, 4};
  std::vector<float> loss(1), count(1), lse(6), dloss = {2.0f}, fused_loss(1), fused_count(1);
  std::vector<float> g(6 * 10), fused(6 * 10);
  const VectorView tv{target.data(), DType::i64, 6};
  CrossEntropyOptions ce;
  ce.label_smoothing = 0.1;
  cross_entropy(t.m(t.a), tv, VectorView{loss.data(), DType::f32, 1}, ce, VectorView{lse.data(), DType::f32, 6},
                VectorView{count.data(), DType::f32, 1}, kCpu);
  EXPECT_EQ(count[0], 4.0f);
  cross_entropy_backward(VectorView{dloss.data(), DType::f32, 1}, t.m(t.a), tv, VectorView{lse.data(), DType::f32, 6},
                         matrix(g.data(), DType::f32, 6, 10), ce, VectorView{count.data(), DType::f32, 1}, kCpu);
  cross_entropy_fused(t.m(t.a), tv, VectorView{fused_loss.data(), DType::f32, 1},
                      matrix(fused.data(), DType::f32, 6, 10), ce, VectorView{dloss.data(), DType::f32, 1}, {},
                      VectorView{fused_count.data(), DType::f32, 1}, kCpu);
  EXPECT_EQ(fused_loss[0], loss[0]);
  EXPECT_EQ(fused_count[0], 4.0f);
  for (size_t i = 0; i < g.size(); ++i) EXPECT_NEAR(fused[i], g[i], 1e-6) << i;
  // Each row's gradient sums to 0 (the softmax sums to 1, the smoothed target too).
  for (int64_t r = 0; r < 6; ++r) {
    double s = 0;
    for (int64_t c = 0; c < 10; ++c) s += g[size_t(r * 10 + c)];
    EXPECT_NEAR(s, 0.0, 1e-6);
  }
}

}  // namespace
}  // namespace tile
