// The float64 evaluation of row programs (src/spec/evaluate.cpp) against the oracle written
// independently of them (src/api/oracle.cpp), for the four built-in programs: two readings of
// what the operators mean must agree.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

#include "testing/host_tensor.hpp"
#include "tile/tile.hpp"

namespace tile {
namespace {

TEST(Evaluate, BuiltInProgramsAgreeWithTheIndependentOracle) {
  std::mt19937_64 rng(9);
  for (Op op : {Op::softmax, Op::log_softmax, Op::rms_norm, Op::layer_norm})
    for (int64_t cols : {1, 7, 300})
      for (bool weight : {false, true}) {
        testing::HostMatrix x(DType::bf16, 5, cols, cols + 3), y(DType::f32, 5, cols, cols);
        x.fill_random(rng, 2.0);
        testing::HostVector w(DType::f32, cols), b(DType::f16, cols);
        w.fill_random(rng, 1.0, 0.5);
        b.fill_random(rng, 0.0, 0.5);
        Call call{op, x.view(), y.view()};
        if (weight && op != Op::softmax && op != Op::log_softmax) call.weight = w.view();
        if (weight && op == Op::layer_norm) call.bias = b.view();
        const std::vector<double> oracle_y = oracle(call);
        const Reference ref = reference(builtin_program(op), to_args(call));
        ASSERT_EQ(ref.at("y").values.size(), oracle_y.size());
        for (size_t i = 0; i < oracle_y.size(); ++i)
          ASSERT_NEAR(ref.at("y").values[i], oracle_y[i], 1e-9 * std::max(1.0, std::abs(oracle_y[i])))
              << op_name(op) << " cols " << cols << " element " << i;
      }
}

// A row's mean of terms near 1 that cancel to near 0: an fp32 sum of them is off by rounding
// errors of the size of its terms, not of its result, so the tolerance of outputs built on it
// scales with the sum of |terms| (1 here) and still catches an error 10x that.
TEST(Evaluate, ToleranceScalesWithTheTermsOfACancellingSum) {
  RowProgram p("row_mean");
  Operand x = p.row_in("x", DTypeSet::floats(), "input rows");
  Operand y = p.row_out("y", DTypeSet::floats(), x, "the row's mean in every column");
  RowExpr v = p.load(x);
  RowExpr s = p.reduce1(Axis::cols, monoid::sum(), v);
  p.store(y, v * 0.0 + s / p.cols());
  const int64_t cols = 1000;
  testing::HostMatrix xm(DType::f32, 1, cols, cols), ym(DType::f32, 1, cols, cols);
  float* xs = static_cast<float*>(xm.data());
  for (int64_t c = 0; c < cols; ++c) xs[c] = c % 2 ? -1.0f : 1.0f + 1e-4f;  // mean 5e-5
  Args args;
  args.set("x", xm.view());
  args.set("y", ym.view());
  const Reference want = reference(p, args);
  const double mean = want.at("y").values[0];
  ASSERT_NEAR(mean, 5e-5, 1e-7);  // 1 + 1e-4 rounded to f32
  float* ys = static_cast<float*>(ym.data());
  for (double off : {5e-7, 1e-5}) {
    for (int64_t c = 0; c < cols; ++c) ys[c] = float(mean + off);
    const OracleCheck check = check_against_reference(p, args, want);
    EXPECT_EQ(check.ok, off < 1e-6) << off << ": " << check.first_mismatch;
  }
}

// Cancellation outside any sum: y = (x + 1) - 1 for x near 1e-4. fp32 rounds x + 1 by up to
// 6e-8, a thousandth of y, far past the dtype's and the row's terms; the simulated rounding
// follows it, so the CPU executor's fp32 result passes, a result off by 10x the allowance does
// not, and the reference is the same every time it is taken.
TEST(Evaluate, ToleranceFollowsCancellationOutsideASum) {
  RowProgram p("one_plus_minus_one");
  Operand x = p.row_in("x", DTypeSet::floats(), "input rows");
  Operand y = p.row_out("y", DTypeSet::floats(), x, "(x + 1) - 1");
  p.store(y, (p.load(x) + 1.0) - 1.0);
  const int64_t rows = 4, cols = 300;
  std::mt19937_64 rng(3);
  testing::HostMatrix xm(DType::f32, rows, cols, cols), ym(DType::f32, rows, cols, cols);
  float* xs = static_cast<float*>(xm.data());
  for (int64_t i = 0; i < rows * cols; ++i) xs[i] = float(1e-5 + 1e-4 * double(rng() % 1000) / 1000.0);
  Args args;
  args.set("x", xm.view());
  args.set("y", ym.view());
  const Reference want = reference(p, args);
  const Reference again = reference(p, args);
  EXPECT_EQ(want.at("y").error, again.at("y").error);
  run(p, args, {{}, nullptr, Backend::cpu});
  // The rounding of x + 1 shows: values outside the dtype's and the row's terms alone.
  const float* ys = static_cast<const float*>(ym.data());
  int past_magnitude_terms = 0;
  for (int64_t i = 0; i < rows * cols; ++i) {
    const double w = want.at("y").values[size_t(i)];
    past_magnitude_terms += std::abs(ys[i] - w) > 2e-5 * std::abs(w) + 1e-6 * want.at("y").scale[size_t(i)];
  }
  EXPECT_GT(past_magnitude_terms, rows * cols / 10);
  const OracleCheck check = check_against_reference(p, args, want);
  EXPECT_TRUE(check.ok) << check.first_mismatch;
  for (int64_t i = 0; i < rows * cols; ++i)
    static_cast<float*>(ym.data())[i] = float(want.at("y").values[size_t(i)] + 20.0 * want.at("y").error[size_t(i)]);
  EXPECT_FALSE(check_against_reference(p, args, want).ok);
}

// An fp16 output of 10^5 rounds to infinity: the check clamps both sides to the dtype's
// overflow threshold (65520) as the built-in operators' does, so the infinity a kernel writes
// passes and the other infinity, or NaN, does not.
TEST(Evaluate, OutputsBeyondTheDtypesRangeMayBeInfinite) {
  RowProgram p("scale");
  Operand x = p.row_in("x", DTypeSet::floats(), "input rows");
  Operand y = p.row_out("y", DTypeSet::floats(), Operand{}, "x * 1000");
  p.store(y, p.load(x) * 1000.0);
  testing::HostMatrix xm(DType::f32, 1, 3, 3), ym(DType::f16, 1, 3, 3);
  float* xs = static_cast<float*>(xm.data());
  xs[0] = 100.0f, xs[1] = -100.0f, xs[2] = 0.5f;  // 1e5, -1e5, 500
  Args args;
  args.set("x", xm.view());
  args.set("y", ym.view());
  run(p, args, {{}, nullptr, Backend::cpu});
  const Reference want = reference(p, args);
  EXPECT_TRUE(std::isinf(load_as_double(ym.data(), 0, DType::f16)));
  const OracleCheck check = check_against_reference(p, args, want);
  EXPECT_TRUE(check.ok) << check.first_mismatch;
  const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
  for (double wrong : {-inf, nan, 500.0}) {
    store_from_double(ym.data(), 0, DType::f16, wrong);
    const OracleCheck bad = check_against_reference(p, args, want);
    EXPECT_FALSE(bad.ok) << wrong;
    if (!std::isnan(wrong)) {
      EXPECT_GT(bad.max_abs_error, 6e4) << wrong;  // counted to the threshold
    }
  }
}

}  // namespace
}  // namespace tile
