// The float64 oracle of src/api/oracle.cpp splits calls of a million elements or more over the
// host's threads: its reference and its check must be those of one row at a time.
#include <cmath>
#include <limits>
#include <random>

#include "support/cases.hpp"

namespace tile::testing {
namespace {

constexpr int64_t kRows = 1031, kCols = 1100;  // 1.13 million elements: split where cores allow

struct Large {
  HostMatrix x{DType::f32, kRows, kCols, kCols + 3}, y{DType::f32, kRows, kCols, kCols};
  HostVector weight{DType::f32, kCols}, bias{DType::f32, kCols};
  Large() {
    std::mt19937_64 rng(77);
    x.fill_random(rng, 3.0);
    weight.fill_random(rng, 1.0, 0.5);
    bias.fill_random(rng, 0.0, 0.5);
  }
  Call call(Op op, int64_t first = 0, int64_t rows = kRows) {
    TensorView xv = x.view(), yv = y.view();
    xv.data = static_cast<float*>(xv.data) + first * xv.row_stride, xv.rows = rows;
    yv.data = static_cast<float*>(yv.data) + first * yv.row_stride, yv.rows = rows;
    Call c{op, xv, yv};
    if (op == Op::rms_norm || op == Op::layer_norm) c.weight = weight.view();
    if (op == Op::layer_norm) c.bias = bias.view();
    return c;
  }
};

TEST(Oracle, ALargeCallsReferenceIsEachRowsOwn) {
  Large in;
  for (Op op : {Op::softmax, Op::log_softmax, Op::rms_norm, Op::layer_norm}) {
    SCOPED_TRACE(op_name(op));
    const std::vector<double> whole = oracle(in.call(op));
    ASSERT_EQ(int64_t(whole.size()), kRows * kCols);
    for (int64_t r : {int64_t(0), int64_t(1), int64_t(514), kRows - 1}) {
      const std::vector<double> one = oracle(in.call(op, r, 1));
      for (int64_t c = 0; c < kCols; ++c) ASSERT_EQ(whole[size_t(r * kCols + c)], one[size_t(c)]) << "row " << r << " col " << c;
    }
  }
}

TEST(Oracle, ALargeCallsCheckCountsEveryElementAndNamesTheFirstMismatch) {
  Large in;
  const Call call = in.call(Op::layer_norm);
  const std::vector<double> ref = oracle(call);
  float* y = static_cast<float*>(call.y.data);
  for (int64_t i = 0; i < kRows * kCols; ++i) y[i] = float(ref[size_t(i)]);
  OracleCheck check = check_against(call, ref);
  EXPECT_TRUE(check.ok) << check.first_mismatch;
  EXPECT_EQ(check.checked, kRows * kCols);
  EXPECT_EQ(check.mismatches, 0);
  // Wrong values in a late row, then an early one: the early one is named, both are counted.
  y[1000 * kCols + 7] += 1.0f;
  y[3 * kCols + 5] = std::nanf("");
  y[700 * kCols + 1] -= 2.0f;
  check = check_against(call, ref);
  EXPECT_FALSE(check.ok);
  EXPECT_EQ(check.mismatches, 3);
  EXPECT_EQ(check.first_mismatch.rfind("row 3 col 5: got nan", 0), 0u) << check.first_mismatch;
  EXPECT_GE(check.max_abs_error, 1.9);
}

// A float64 LayerNorm row of the largest doubles, constant, with a tiny eps: x_hat is 0 and the
// mean's rounding bound times 1 / sqrt(eps) overflows. A zero weight scales that bound away
// (it made the tolerance inf x 0 = NaN, failing exact outputs); the other columns still pass.
TEST(Oracle, AZeroWeightKeepsTheToleranceOfAnOverflowingMeanBound) {
  constexpr int64_t rows = 2, cols = 64;
  HostMatrix x(DType::f64, rows, cols, cols), y(DType::f64, rows, cols, cols);
  HostVector weight(DType::f64, cols);
  std::mt19937_64 rng(3);
  x.fill_random(rng);
  weight.fill_random(rng, 1.0, 0.5);
  double* xd = static_cast<double*>(x.view().data);
  for (int64_t c = 0; c < cols; ++c) xd[c] = std::numeric_limits<double>::max();
  static_cast<double*>(const_cast<void*>(weight.view().data))[5] = 0.0;
  Call call{Op::layer_norm, x.view(), y.view()};
  call.weight = weight.view();
  call.eps = 1e-30;
  const std::vector<double> ref = oracle(call);
  double* yd = static_cast<double*>(call.y.data);
  for (int64_t i = 0; i < rows * cols; ++i) yd[i] = ref[size_t(i)];
  EXPECT_EQ(ref[5], 0.0);
  const OracleCheck check = check_against(call, ref);
  EXPECT_TRUE(check.ok) << check.first_mismatch;
  EXPECT_EQ(check.checked, rows * cols);
}

}  // namespace
}  // namespace tile::testing
