// The CPU backend against the float64 oracle over the seeded sweep and the packing
// configurations, plus guard rows and exact/automatic cooperating widths.
#include "support/cases.hpp"

namespace tile::testing {
namespace {

TEST(CpuSweep, EveryOperatorDtypeAndShape) {
  for (const Case& c : core_sweep()) expect_case_passes(c, Backend::cpu);
}

TEST(CpuSweep, PackingConfigurations) {
  for (const Case& c : packing_sweep()) {
    SCOPED_TRACE(c.name());
    CaseResult r = run_case(c, Backend::cpu);
    EXPECT_TRUE(r.check.ok) << r.check.first_mismatch;
    EXPECT_TRUE(r.outside_untouched);
    EXPECT_EQ(r.record.plan.programs_per_group, *c.plan.programs_per_group);
    EXPECT_EQ(r.record.threads_per_group, *c.plan.programs_per_group * 256);
  }
}

TEST(CpuSweep, GuardProgramsWriteNothing) {
  // 37 rows, two programs per group: the second program of the last group has no row.
  for (Op op : {Op::softmax, Op::rms_norm, Op::layer_norm})
    for (TailHandling tail : {TailHandling::predicate, TailHandling::clamp}) {
      Case c;
      c.op = op, c.rows = 37, c.cols = 1537, c.seed = 77;
      c.plan.programs_per_group = 2;
      c.plan.workers_per_program = 128;
      c.plan.tail = tail;
      SCOPED_TRACE(c.name() + " tail " + to_string(tail));
      CaseResult r = run_case(c, Backend::cpu);
      EXPECT_EQ(r.record.groups, 19);
      EXPECT_TRUE(r.check.ok) << r.check.first_mismatch;
      EXPECT_TRUE(r.outside_untouched) << "a guard program wrote past the last row";
    }
}

TEST(CpuSweep, ExactAndAutomaticWidths) {
  for (Op op : {Op::softmax, Op::layer_norm}) {
    Case c;
    c.op = op, c.rows = 64, c.cols = 3072, c.seed = 91;
    CaseResult automatic = run_case(c, Backend::cpu);
    EXPECT_TRUE(automatic.check.ok) << automatic.check.first_mismatch;
    EXPECT_EQ(automatic.record.plan.width_mode, WidthMode::automatic);
    for (int width : {32, 64, 96, 512}) {
      c.plan.workers_per_program = width;
      CaseResult exact = run_case(c, Backend::cpu);
      EXPECT_TRUE(exact.check.ok) << exact.check.first_mismatch;
      EXPECT_EQ(exact.record.plan.width_mode, WidthMode::exact);
      EXPECT_EQ(exact.record.plan.workers_per_program, width);
      EXPECT_EQ(exact.record.threads_per_group, width * exact.record.plan.programs_per_group);
    }
  }
}

TEST(CpuSweep, ProgramScopeBarriersAndRereadPlans) {
  Case c;
  c.rows = 37, c.cols = 4097, c.seed = 31;
  for (Op op : {Op::softmax, Op::log_softmax, Op::rms_norm, Op::layer_norm}) {
    c.op = op;
    c.plan = {};
    c.plan.programs_per_group = 3;
    c.plan.workers_per_program = 128;
    c.plan.barrier_scope = BarrierScope::program;
    expect_case_passes(c, Backend::cpu);
    c.plan = {};
    c.plan.caching = InputCaching::reread;
    c.plan.workers_per_program = 64;
    c.plan.stripe_unroll = 3;
    expect_case_passes(c, Backend::cpu);
  }
}

TEST(CpuSweep, SubWarpProgramsPackedForShortRows) {
  for (int64_t cols : {1, 5, 16, 40, 64}) {
    Case c;
    c.op = Op::layer_norm, c.rows = 333, c.cols = cols, c.seed = uint64_t(cols);
    CaseResult r = run_case(c, Backend::cpu);
    EXPECT_TRUE(r.check.ok) << c.name() << ": " << r.check.first_mismatch;
    EXPECT_TRUE(r.outside_untouched) << c.name();
  }
}

TEST(CpuSemantics, NanAndAllNegativeInfinityRowsFollowPyTorch) {
  const float inf = std::numeric_limits<float>::infinity();
  const int64_t cols = 70;
  std::vector<float> x(3 * cols, 0.5f), y(3 * cols, 0.0f);
  x[5] = std::nanf("");                                    // row 0: a NaN
  for (int64_t c = 0; c < cols; ++c) x[cols + c] = -inf;   // row 1: all -inf
  x[2 * cols + 3] = -inf;                                  // row 2: one -inf
  // Re-read plans take the one-pass (online) max and sum: the same results.
  PlanRequest reread;
  reread.caching = InputCaching::reread, reread.workers_per_program = 32, reread.stripe_unroll = 2;
  for (const PlanRequest& plan : {PlanRequest{}, reread})
    for (Op op : {Op::softmax, Op::log_softmax}) {
      Call call{op, matrix(x.data(), DType::f32, 3, cols), matrix(y.data(), DType::f32, 3, cols)};
      run(call, {plan, nullptr, Backend::cpu});
      for (int64_t c = 0; c < cols; ++c) {
        EXPECT_TRUE(std::isnan(y[c])) << op_name(op) << " NaN row col " << c;
        EXPECT_TRUE(std::isnan(y[cols + c])) << op_name(op) << " all -inf row col " << c;
      }
      EXPECT_EQ(y[2 * cols + 3], op == Op::softmax ? 0.0f : -inf);
      EXPECT_TRUE(check_against_oracle(call).ok) << check_against_oracle(call).first_mismatch;
    }
}

TEST(CpuSemantics, LayerNormOfRowsFarFromZeroKeepsItsVariance) {
  // Rows of 100 + N(0, 1): a variance from E[x^2] - E[x]^2 would lose three digits in fp32.
  std::mt19937_64 rng(11);
  HostMatrix x(DType::f32, 4, 5000, 5000), y(DType::f32, 4, 5000, 5000);
  x.fill_random(rng);
  for (int64_t i = 0; i < 4 * 5000; ++i) store_from_float(x.data(), i, DType::f32, 100.0f + load_as_float(x.data(), i, DType::f32));
  for (InputCaching caching : {InputCaching::registers, InputCaching::reread}) {
    PlanRequest plan;
    plan.caching = caching;
    Call call{Op::layer_norm, x.view(), y.view()};
    run(call, {plan, nullptr, Backend::cpu});
    OracleCheck check = check_against_oracle(call);
    EXPECT_TRUE(check.ok) << to_string(caching) << ": " << check.first_mismatch;
  }
}

TEST(CpuSemantics, CheckAgainstAStoredReferenceMatchesTheOracleCheck) {
  std::mt19937_64 rng(3);
  HostMatrix x(DType::bf16, 5, 300, 300), y(DType::bf16, 5, 300, 300);
  x.fill_random(rng);
  Call call{Op::log_softmax, x.view(), y.view()};
  run(call, {{}, nullptr, Backend::cpu});
  const std::vector<double> reference = oracle(call);
  OracleCheck stored = check_against(call, reference), fresh = check_against_oracle(call);
  EXPECT_TRUE(stored.ok) << stored.first_mismatch;
  EXPECT_EQ(stored.checked, fresh.checked);
  EXPECT_EQ(stored.max_abs_error, fresh.max_abs_error);
  store_from_float(y.data(), 7, DType::bf16, 0.5f);  // a wrong element is found either way
  EXPECT_FALSE(check_against(call, reference).ok);
  EXPECT_THROW(check_against(call, std::vector<double>(10)), InternalError);
}

TEST(CpuSemantics, InPlaceCallsReadBeforeWriting) {
  std::mt19937_64 rng(5);
  for (InputCaching caching : {InputCaching::registers, InputCaching::reread}) {
    HostMatrix x(DType::f32, 9, 2000, 2000), reference(DType::f32, 9, 2000, 2000);
    x.fill_random(rng);
    reference.bytes() = x.bytes();
    Call expected{Op::layer_norm, reference.view(), reference.view()};
    std::vector<double> want = oracle(expected);
    PlanRequest plan;
    plan.caching = caching;
    run(Call{Op::layer_norm, x.view(), x.view()}, {plan, nullptr, Backend::cpu});
    for (int64_t i = 0; i < 9 * 2000; ++i) ASSERT_NEAR(load_as_float(x.data(), i, DType::f32), want[i], 1e-4);
  }
}

}  // namespace
}  // namespace tile::testing
