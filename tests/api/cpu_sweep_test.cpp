// The CPU backend against the float64 oracle over the seeded sweep and the packing
// configurations, plus guard rows and exact/automatic cooperating widths.
#include <algorithm>
#include <set>

#include "support/cases.hpp"

namespace tile::testing {
namespace {

TEST(CpuSweep, EveryOperatorDtypeAndShape) {
  for (const Case& c : core_sweep()) expect_case_passes(c, Backend::cpu);
}

TEST(CpuSweep, Float64CallsComputeInFloat64) {
  // Held to fp32's rule scaled to fp64's unit roundoff: an f32-precision step anywhere fails.
  for (const Case& c : f64_sweep()) expect_case_passes(c, Backend::cpu);
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

TEST(CpuSweep, OneCaseOfEveryPlanFamily) {
  // The sanitizer set's cases (tests/api/CMakeLists.txt) on the CPU: each launches the plan it
  // asks for, passes the oracle, and together they cover every class of the family.
  std::set<std::string> seen;
  for (const FamilyCase& f : plan_family_cases()) {
    SCOPED_TRACE(f.family + ": " + f.c.name());
    CaseResult r = run_case(f.c, Backend::cpu);
    EXPECT_TRUE(r.check.ok) << r.check.first_mismatch;
    EXPECT_TRUE(r.outside_untouched);
    const MappingPlan& p = r.record.plan;
    EXPECT_EQ(p.workers_per_program, *f.c.plan.workers_per_program);
    EXPECT_EQ(p.caching, *f.c.plan.caching);
    EXPECT_EQ(p.barrier_scope, *f.c.plan.barrier_scope);
    EXPECT_EQ(p.tail, *f.c.plan.tail);
    EXPECT_EQ(p.alignment, *f.c.plan.alignment);
    EXPECT_EQ(p.cache_format, *f.c.plan.cache_format);
    EXPECT_EQ(p.grid_limit, *f.c.plan.grid_limit);
    EXPECT_EQ(p.merge, *f.c.plan.merge);
    EXPECT_EQ(p.ctas_per_program, f.c.plan.ctas_per_program.value_or(1));
    EXPECT_TRUE(seen.insert(f.family).second) << "family listed twice";
    seen.insert("op " + op_name(f.c.op));
    seen.insert("x " + std::string(dtype_name(f.c.x)));
    seen.insert("y " + std::string(dtype_name(f.c.y)));
  }
  for (const char* op : {"softmax", "log_softmax", "rms_norm", "layer_norm"}) EXPECT_TRUE(seen.count(std::string("op ") + op)) << op;
  for (const char* dt : {"f32", "f16", "bf16"}) {
    EXPECT_TRUE(seen.count(std::string("x ") + dt)) << dt;
    EXPECT_TRUE(seen.count(std::string("y ") + dt)) << dt;
  }
  for (const char* family : {"registers w8 packed group predicate require packed-cache staged",
                             "reread w96 packed program clamp scalar_fallback f32-cache loop combine",
                             "registers w96 packed program predicate scalar_fallback packed-cache combine",
                             "registers w96 single group clamp require f32-cache loop staged",
                             "reread w32 single group clamp require f32-cache combine"})
    EXPECT_TRUE(seen.count(family)) << family;
  EXPECT_EQ(std::count_if(seen.begin(), seen.end(), [](const std::string& f) { return f.rfind("cluster", 0) == 0; }), 16);
  // 224 register, 56 re-read and 16 cluster families, ops, dtypes
  EXPECT_EQ(std::count_if(seen.begin(), seen.end(), [](const std::string& f) { return f.rfind("shared", 0) == 0; }),
            24);
  EXPECT_EQ(seen.size(), size_t(280 + 16 + 24 + 4 + 3 + 3));
}

TEST(CpuSweep, ClusterProgramsAtLongRows) {
  // The GPU sweep's cluster cases (cluster_sweep): each row is read once, by the groups of a
  // cluster, and the partial states merge through distributed shared memory.
  for (const Case& c : cluster_sweep()) {
    SCOPED_TRACE(c.name());
    CaseResult r = run_case(c, Backend::cpu);
    EXPECT_TRUE(r.check.ok) << r.check.first_mismatch;
    EXPECT_TRUE(r.outside_untouched);
    EXPECT_EQ(r.record.plan.ctas_per_program, *c.plan.ctas_per_program);
    EXPECT_GT(r.record.plan.ctas_per_program, 1);
    EXPECT_EQ(r.record.plan.caching, *c.plan.caching);
    EXPECT_EQ(r.record.groups, c.rows * r.record.plan.ctas_per_program);
  }
}

TEST(CpuSweep, GroupsLoopingOverRowBlocksReuseTheirPartialsSafely) {
  // grid_limit: each group loops over row blocks and its warps reuse the shared partials; the
  // next block's writes must wait for this block's reads (the CPU backend reports the race).
  for (Op op : {Op::softmax, Op::log_softmax, Op::rms_norm, Op::layer_norm})
    for (BarrierScope scope : {BarrierScope::group, BarrierScope::program}) {
      Case c;
      c.op = op, c.rows = 9, c.cols = 700, c.seed = 41;
      c.plan.workers_per_program = 96, c.plan.programs_per_group = 2, c.plan.grid_limit = 2, c.plan.barrier_scope = scope;
      SCOPED_TRACE(c.name() + " " + to_string(scope));
      CaseResult r = run_case(c, Backend::cpu);
      EXPECT_TRUE(r.check.ok) << r.check.first_mismatch;
      EXPECT_TRUE(r.outside_untouched);
      EXPECT_EQ(r.record.groups, 2);
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

// Plans of every caching mode for one call: the policy's, re-read ones that split a row into
// one-element parts (W x V x U = 1, 32 and 128 elements an iteration) and register ones.
std::vector<PlanRequest> plans_of_every_caching() {
  std::vector<PlanRequest> plans(1);
  for (auto [w, v, u] : {std::tuple{1, 1, 1}, std::tuple{32, 1, 1}, std::tuple{32, 2, 2}}) {
    PlanRequest p;
    p.caching = InputCaching::reread, p.workers_per_program = w, p.vector_elems = v, p.stripe_unroll = u;
    plans.push_back(p);
  }
  PlanRequest cached;  // 40 stripes of 256 scalars: rows up to 10240
  cached.caching = InputCaching::registers, cached.workers_per_program = 256, cached.vector_elems = 1;
  cached.stripes = 40, cached.private_budget = 64;
  plans.push_back(cached);
  // The norms' program fast path in a re-read program of two warps.
  PlanRequest reread;
  reread.caching = InputCaching::reread, reread.workers_per_program = 64, reread.vector_elems = 1, reread.stripe_unroll = 2;
  plans.push_back(reread);
  return plans;
}

// plans_of_every_caching, and two packed programs of two warps (rows up to 3008) under a group
// barrier (each worker folds both programs' totals for the fast path's test) and under a
// program barrier (its own): packed rows of different magnitudes share a group.
std::vector<PlanRequest> plans_with_packed_programs() {
  std::vector<PlanRequest> plans = plans_of_every_caching();
  for (BarrierScope scope : {BarrierScope::group, BarrierScope::program}) {
    PlanRequest packed;
    packed.caching = InputCaching::registers, packed.workers_per_program = 64, packed.programs_per_group = 2;
    packed.vector_elems = 1, packed.stripes = 47, packed.private_budget = 64, packed.barrier_scope = scope;
    plans.push_back(packed);
  }
  return plans;
}

std::string describe(const PlanRequest& plan, const Call& call) { return plan_for(call, plan).to_json(); }

TEST(CpuSemantics, NanReachesTheOnlineSumWhileTheRunningMaxIsMinusInfinity) {
  // fmax ignores NaN: a worker (or iteration) that has seen only NaN and -inf has a running max
  // of -inf. Its NaN must still make the whole row NaN.
  const float nan = std::nanf(""), inf = std::numeric_limits<float>::infinity();
  std::vector<float> x = {nan, 1, 2, 3}, y(4);
  PlanRequest scalar;
  scalar.caching = InputCaching::reread, scalar.vector_elems = 1;
  for (Op op : {Op::softmax, Op::log_softmax}) {
    Call call{op, matrix(x.data(), DType::f32, 1, 4), matrix(y.data(), DType::f32, 1, 4)};
    run(call, {scalar, nullptr, Backend::cpu});
    for (float v : y) EXPECT_TRUE(std::isnan(v)) << op_name(op) << ": " << v;
  }
  // 1 x 10000 fp32, on every caching mode and the policy's plan (a cluster where the target
  // launches them): the NaN's worker sees only -inf otherwise.
  const int64_t cols = 10000;
  std::vector<float> row(cols, -inf), out(cols, 0.0f);
  row[5000] = nan, row[9000] = 1.0f;
  for (Op op : {Op::softmax, Op::log_softmax}) {
    Call call{op, matrix(row.data(), DType::f32, 1, cols), matrix(out.data(), DType::f32, 1, cols)};
    std::vector<PlanRequest> plans = plans_of_every_caching();
    plans.push_back({});
    for (const PlanRequest& plan : plans) {
      std::fill(out.begin(), out.end(), 0.0f);
      run(call, {plan, nullptr, Backend::cpu});
      for (int64_t c = 0; c < cols; ++c)
        ASSERT_TRUE(std::isnan(out[c])) << op_name(op) << " col " << c << " = " << out[c] << ", plan " << describe(plan, call);
    }
  }
}

TEST(CpuSemantics, LayerNormOfLargeConstantRowsIsExactlyZero) {
  // 2e19^2 overflows fp32; the exact answer is 0 (the bias), on every caching mode.
  for (float value : {2e19f, -3.4e38f, 1e-40f, 0.1f}) {
    const int64_t cols = 10000;
    std::vector<float> x(cols, value), y(cols, 1.0f), bias(cols, 0.25f);
    Call call{Op::layer_norm, matrix(x.data(), DType::f32, 1, cols), matrix(y.data(), DType::f32, 1, cols)};
    for (const PlanRequest& plan : plans_of_every_caching()) {
      run(call, {plan, nullptr, Backend::cpu});
      for (int64_t c = 0; c < cols; ++c) ASSERT_EQ(y[c], 0.0f) << value << " col " << c << ", plan " << describe(plan, call);
      call.bias = {bias.data(), DType::f32, cols};
      run(call, {plan, nullptr, Backend::cpu});
      for (int64_t c = 0; c < cols; ++c) ASSERT_EQ(y[c], 0.25f) << value << " col " << c << ", plan " << describe(plan, call);
      call.bias = {};
    }
  }
}

TEST(CpuSemantics, NormsAreRightAtEveryMagnitude) {
  // Rows whose squares or sums overflow fp32 (up to FLT_MAX), tiny and subnormal rows, and rows
  // mixing both: the output is representable, so it must match the oracle.
  std::mt19937_64 rng(17);
  for (DType dt : {DType::f32, DType::bf16}) {
    const int64_t rows = 6, cols = 3000;  // at most 3008: plans_with_packed_programs
    HostMatrix x(dt, rows, cols, cols), y(DType::f32, rows, cols, cols);
    x.fill_row(rng, 0, RowPattern::huge, 0);
    x.fill_row(rng, 1, RowPattern::magnitudes, 0);
    x.fill_row(rng, 2, RowPattern::tiny, 0);
    x.fill_row(rng, 3, RowPattern::offset, 0);
    for (int64_t c = 0; c < cols; ++c) {
      const float max = float(dtype_max(dt));                              // bf16's max is below fp32's
      store_from_float(x.data(), 4 * cols + c, dt, c % 2 ? max : -max);  // +-max: RMS 1, LayerNorm +-1
      store_from_float(x.data(), 5 * cols + c, dt, c % 3 ? 1e-45f : 3e38f);
    }
    for (Op op : {Op::rms_norm, Op::layer_norm})
      for (float eps : {0.0f, 1e-5f})
        for (const PlanRequest& plan : plans_with_packed_programs()) {
          Call call{op, x.view(), y.view(), {}, {}, eps};
          run(call, {plan, nullptr, Backend::cpu});
          OracleCheck check = check_against_oracle(call, plan_for(call, plan));
          EXPECT_TRUE(check.ok) << op_name(op) << " " << dtype_name(dt) << " eps " << eps << ": " << check.first_mismatch
                                << ", plan " << describe(plan, call);
          // One unit roundoff per rounding of the plan's longest merge chain (numerics.md).
          const double tol = (merge_depth(plan_for(call, plan), cols) + 8) * 0x1p-24;
          for (int64_t c = 0; c < 4; ++c)
            EXPECT_NEAR(load_as_float(y.data(), 4 * cols + c, DType::f32), c % 2 ? 1.0 : -1.0, tol) << op_name(op);
        }
  }
}

TEST(CpuSemantics, DegenerateNormRowsFollowPyTorch) {
  // eps = 0: a zero row (RMSNorm) and a constant row (LayerNorm) are 0 / 0, NaN as in PyTorch;
  // with eps > 0 they are 0. An infinite element: RMSNorm 0 elsewhere and NaN there, LayerNorm NaN.
  const float inf = std::numeric_limits<float>::infinity();
  const int64_t cols = 300;
  std::vector<float> x(3 * cols, 0.0f), y(3 * cols);
  for (int64_t c = 0; c < cols; ++c) x[cols + c] = 7.5f;
  for (int64_t c = 0; c < cols; ++c) x[2 * cols + c] = float(c);
  x[2 * cols + 10] = inf;
  for (const PlanRequest& plan : plans_with_packed_programs())
    for (float eps : {0.0f, 1e-5f}) {
      Call rms{Op::rms_norm, matrix(x.data(), DType::f32, 3, cols), matrix(y.data(), DType::f32, 3, cols), {}, {}, eps};
      run(rms, {plan, nullptr, Backend::cpu});
      for (int64_t c = 0; c < cols; ++c) {
        EXPECT_EQ(std::isnan(y[c]), eps == 0.0f) << "rms_norm zero row, eps " << eps << ", plan " << describe(plan, rms);
        if (c != 10) {
          EXPECT_EQ(y[2 * cols + c], 0.0f) << "rms_norm with an infinity, col " << c;
        }
      }
      EXPECT_TRUE(std::isnan(y[2 * cols + 10]));
      EXPECT_TRUE(check_against_oracle(rms, plan_for(rms, plan)).ok);
      Call ln{Op::layer_norm, rms.x, rms.y, {}, {}, eps};
      run(ln, {plan, nullptr, Backend::cpu});
      for (int64_t c = 0; c < cols; ++c) {
        EXPECT_EQ(std::isnan(y[cols + c]), eps == 0.0f) << "layer_norm constant row, eps " << eps << ", plan " << describe(plan, ln);
        if (eps != 0.0f) {
          EXPECT_EQ(y[cols + c], 0.0f);
        }
        EXPECT_TRUE(std::isnan(y[2 * cols + c]));
      }
      EXPECT_TRUE(check_against_oracle(ln, plan_for(ln, plan)).ok);
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
  EXPECT_THROW(check_against(call, std::vector<double>(10)), Error);  // the caller's mistake
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
