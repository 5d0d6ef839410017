// The CUDA backend against the float64 oracle: the CPU sweep's cases, the packing
// configurations, a seeded fuzz of random shapes, dtypes, strides and plans, 64-bit offsets.
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "support/cases.hpp"

namespace tile::testing {
namespace {

class CudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda::driver_available()) GTEST_SKIP() << "no CUDA driver: GPU tests need a GPU";
  }
};

using CudaSweep = CudaTest;
using CudaSanitizerSubset = CudaTest;
using CudaSanitizerFamily = CudaTest;

TEST_F(CudaSweep, EveryOperatorDtypeAndShape) {
  std::printf("device: %s\n", cuda::device_info(0).name.c_str());
  for (const Case& c : core_sweep()) expect_case_passes(c, Backend::cuda);
}

// ldexp(x, k) and exponent(x) of every pair of xs and ks (x fastest), on the CPU executor and on
// the GPU (outputs poisoned): the CUDA helpers behind them (src/backend/cuda/device/tile_device.cuh,
// a fast path for normal numbers and normal powers of two) against the executor, which defines
// them, bit for bit.
template <typename T>
void expect_exponent_and_ldexp_match(const std::vector<T>& xs, const std::vector<T>& ks, DType dtype,
                                     std::vector<T>& cpu_scaled, std::vector<T>& cpu_e) {
  RowProgram p(dtype == DType::f64 ? "exponent_ldexp_f64" : "exponent_ldexp");
  Operand x = p.row_in("x"), k = p.row_in("k");
  Operand scaled = p.row_out("scaled"), e = p.row_out("e");
  p.store(scaled, ldexp(p.load(x), p.load(k)));
  p.store(e, exponent(p.load(x)));
  const int64_t cols = int64_t(xs.size() * ks.size());
  std::vector<T> hx(cols), hk(cols);
  for (int64_t i = 0; i < cols; ++i) hx[i] = xs[i % xs.size()], hk[i] = ks[i / xs.size()];
  const size_t bytes = size_t(cols) * sizeof(T);
  cpu_scaled.assign(cols, T(0)), cpu_e.assign(cols, T(0));
  std::vector<T> gpu_scaled(cols, T(7)), gpu_e(cols, T(7));
  Args cpu_args;
  cpu_args.set("x", matrix(hx.data(), dtype, 1, cols)).set("k", matrix(hk.data(), dtype, 1, cols));
  cpu_args.set("scaled", matrix(cpu_scaled.data(), dtype, 1, cols)).set("e", matrix(cpu_e.data(), dtype, 1, cols));
  run(p, cpu_args, {{}, nullptr, Backend::cpu});
  cuda::ensure_context(0);
  cuda::DeviceBuffer dx(bytes), dk(bytes), ds(bytes), de(bytes);
  dx.copy_from_host(hx.data(), bytes), dk.copy_from_host(hk.data(), bytes);
  ds.copy_from_host(gpu_scaled.data(), bytes), de.copy_from_host(gpu_e.data(), bytes);  // poisoned
  Args gpu_args;
  gpu_args.set("x", matrix(dx.get(), dtype, 1, cols)).set("k", matrix(dk.get(), dtype, 1, cols));
  gpu_args.set("scaled", matrix(ds.get(), dtype, 1, cols)).set("e", matrix(de.get(), dtype, 1, cols));
  run(p, gpu_args, {{}, nullptr, Backend::cuda});
  TILE_CU_CHECK(cuda::driver().cuCtxSynchronize());
  ds.copy_to_host(gpu_scaled.data(), bytes), de.copy_to_host(gpu_e.data(), bytes);
  auto same = [](T a, T b) { return (std::isnan(a) && std::isnan(b)) || std::memcmp(&a, &b, sizeof(T)) == 0; };
  for (int64_t i = 0; i < cols; ++i) {
    EXPECT_TRUE(same(gpu_scaled[i], cpu_scaled[i])) << "ldexp(" << hx[i] << ", " << hk[i] << "): GPU " << gpu_scaled[i]
                                                    << ", CPU " << cpu_scaled[i];
    EXPECT_TRUE(same(gpu_e[i], cpu_e[i])) << "exponent(" << hx[i] << "): GPU " << gpu_e[i] << ", CPU " << cpu_e[i];
  }
}

// Over zeros, subnormals, normals, the largest floats, infinities and NaN, with exponents inside
// and outside the range of normal powers of two.
TEST_F(CudaSweep, ExponentAndLdexpMatchTheExecutorBitForBit) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> xs = {0.0f, -0.0f, 1e-45f, -3e-42f, 1.1754942e-38f, 1.17549435e-38f, 1.0f, -1.5f,
                                 3.0f, 0.7f, 6.5e4f, -1.2e20f, 3.4028235e38f, inf, -inf, nan};
  const std::vector<float> ks = {-1000, -300, -253, -150, -149, -127, -126, -64, -1, 0,
                                 1,     64,   126,  127,  128,  200,  253,  300,  1000, nan};
  std::vector<float> cpu_scaled, cpu_e;
  expect_exponent_and_ldexp_match(xs, ks, DType::f32, cpu_scaled, cpu_e);
  // The executor's own definition, checked here too: an exact power-of-two scaling.
  EXPECT_EQ(cpu_scaled[xs.size() * 9 + 6], 1.0f);      // ldexp(1, 0)
  EXPECT_EQ(cpu_e[4], -127.0f);                        // the largest subnormal
  EXPECT_EQ(cpu_scaled[xs.size() * 12 + 6], 0x1p126f); // ldexp(1, 126)
}

TEST_F(CudaSweep, Float64CallsComputeInFloat64) {
  for (const Case& c : f64_sweep()) expect_case_passes(c, Backend::cuda);
}

// The f64 helpers (tile_exponent, tile_ldexp of double) over fp64's subnormals, normals,
// extremes and exponents past the range of normal powers of two.
TEST_F(CudaSweep, Float64ExponentAndLdexpMatchTheExecutorBitForBit) {
  const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
  const std::vector<double> xs = {0.0, -0.0, 0x1p-1074, -3e-310, 0x1.fffffffffffffp-1023, 0x1p-1022, 1.0, -1.5,
                                  0.7, -1.2e200, 1.7976931348623157e308, inf, -inf, nan};
  const std::vector<double> ks = {-3000, -2100, -1100, -1075, -1074, -1023, -1022, -64, 0,
                                  1,     1023,  1024,  2000,  2100,  3000,  nan};
  std::vector<double> cpu_scaled, cpu_e;
  expect_exponent_and_ldexp_match(xs, ks, DType::f64, cpu_scaled, cpu_e);
  EXPECT_EQ(cpu_e[2], -1074.0);                         // the smallest subnormal
  EXPECT_EQ(cpu_scaled[xs.size() * 10 + 6], 0x1p1023);  // ldexp(1, 1023)
}

TEST_F(CudaSweep, PackingConfigurations) {
  for (const Case& c : packing_sweep()) {
    SCOPED_TRACE(c.name());
    CaseResult r = run_case(c, Backend::cuda);
    EXPECT_TRUE(r.check.ok) << r.check.first_mismatch;
    EXPECT_TRUE(r.outside_untouched);
    EXPECT_EQ(r.record.threads_per_group, *c.plan.programs_per_group * 256);
  }
}

TEST_F(CudaSweep, GuardRowsAndExactWidths) {
  for (TailHandling tail : {TailHandling::predicate, TailHandling::clamp})
    for (BarrierScope scope : {BarrierScope::group, BarrierScope::program}) {
      Case c;
      c.op = Op::layer_norm, c.rows = 37, c.cols = 1537, c.seed = 3;
      c.plan.programs_per_group = 2, c.plan.workers_per_program = 96, c.plan.tail = tail, c.plan.barrier_scope = scope;
      CaseResult r = run_case(c, Backend::cuda);
      EXPECT_TRUE(r.check.ok) << r.check.first_mismatch;
      EXPECT_TRUE(r.outside_untouched);
      EXPECT_EQ(r.record.plan.workers_per_program, 96);
      EXPECT_EQ(r.record.threads_per_group, 192);
    }
}

TEST_F(CudaSweep, SeededFuzzOfShapesDtypesStridesAndPlans) {
  std::mt19937_64 rng(20261130);
  auto pick = [&](int n) { return int(rng() % uint64_t(n)); };
  const DType dtypes[] = {DType::f32, DType::f16, DType::bf16};
  int valid = 0, rejected = 0;
  while (valid < 500) {
    Case c;
    c.op = Op(pick(4));
    c.x = dtypes[pick(3)], c.y = dtypes[pick(3)], c.w = dtypes[pick(3)];
    c.cols = int64_t(std::exp(std::log(70000.0) * double(rng() % 10000) / 10000.0));
    c.cols = std::max<int64_t>(1, c.cols);
    c.rows = pick(4) == 0 ? pick(3) : 1 + pick(std::max<int>(1, int(std::min<int64_t>(300, 2000000 / c.cols))));
    c.stride = pick(2) ? c.cols + pick(17) : 0;
    c.offset = pick(4) == 0 ? 1 : 0;
    c.weight = pick(4) != 0, c.bias = pick(2);
    c.seed = rng();
    if (pick(2)) c.plan.programs_per_group = 1 + pick(4);
    if (pick(2)) c.plan.workers_per_program = std::vector<int>{4, 16, 32, 64, 96, 128, 256, 512, 1024}[pick(9)];
    if (pick(3) == 0) c.plan.caching = InputCaching::reread;
    if (pick(3) == 0) c.plan.tail = TailHandling::clamp;
    if (pick(3) == 0) c.plan.barrier_scope = BarrierScope::program;
    if (pick(4) == 0) c.plan.vector_elems = 1 << pick(3);
    if (pick(4) == 0) c.plan.stripe_unroll = 1 + pick(4);
    if (pick(4) == 0) c.plan.cache_format = CacheFormat::packed;
    try {
      SCOPED_TRACE(c.name());
      CaseResult r = run_case(c, Backend::cuda);
      EXPECT_TRUE(r.check.ok) << r.check.first_mismatch << " plan " << r.record.plan.to_json();
      EXPECT_TRUE(r.outside_untouched) << "plan " << r.record.plan.to_json();
      ++valid;
    } catch (const Error& e) {
      // Only plan validation may refuse a fuzzed call, with a message naming the plan field.
      EXPECT_NE(std::string(e.what()).find("plan."), std::string::npos) << e.what();
      ++rejected;
    }
  }
  std::printf("fuzz: %d calls checked, %d plans rejected by validation\n", valid, rejected);
}

TEST_F(CudaSweep, SixtyFourBitRowOffsets) {
  // Two bf16 rows 2^31 + 8 elements apart: element offsets beyond int32.
  const int64_t cols = 4096, stride = (int64_t(1) << 31) + 8, elems = stride + cols;
  cuda::ensure_context(0);
  cuda::DeviceBuffer dx(size_t(elems) * 2), dy(size_t(elems) * 2);
  std::mt19937_64 rng(64);
  HostMatrix hx(DType::bf16, 2, cols, cols), hy(DType::bf16, 2, cols, cols);
  hx.fill_random(rng);
  for (int64_t r = 0; r < 2; ++r) dx.copy_from_host(static_cast<char*>(hx.data()) + r * cols * 2, cols * 2, size_t(r * stride * 2));
  dy.fill_byte(0xff);
  for (Op op : {Op::softmax, Op::rms_norm}) {
    run(Call{op, matrix(dx.get(), DType::bf16, 2, cols, stride), matrix(dy.get(), DType::bf16, 2, cols, stride)});
    TILE_CU_CHECK(cuda::driver().cuCtxSynchronize());
    for (int64_t r = 0; r < 2; ++r) dy.copy_to_host(static_cast<char*>(hy.data()) + r * cols * 2, cols * 2, size_t(r * stride * 2));
    OracleCheck check = check_against_oracle(Call{op, hx.view(), hy.view()});
    EXPECT_TRUE(check.ok) << op_name(op) << ": " << check.first_mismatch;
  }
}

TEST_F(CudaSweep, RowsZeroLaunchesNothing) {
  LaunchRecord r = run(Call{Op::softmax, matrix(nullptr, DType::f32, 0, 128), matrix(nullptr, DType::f32, 0, 128)});
  EXPECT_EQ(r.groups, 0);
}

TEST_F(CudaSanitizerSubset, RepresentativePlans) {
  Case c;
  c.rows = 37, c.cols = 1537, c.seed = 11;
  c.plan.programs_per_group = 2, c.plan.workers_per_program = 256, c.plan.vector_elems = 4;
  expect_case_passes(c, Backend::cuda);  // packed, group barriers, misaligned rows, guard program
  c.op = Op::layer_norm, c.plan.barrier_scope = BarrierScope::program, c.plan.programs_per_group = 3;
  expect_case_passes(c, Backend::cuda);  // named barriers per program
  c.op = Op::rms_norm, c.x = DType::bf16, c.y = DType::bf16, c.w = DType::f32, c.cols = 70000, c.rows = 3;
  c.plan = {};
  c.plan.caching = InputCaching::reread;
  expect_case_passes(c, Backend::cuda);  // re-read passes
  c.op = Op::softmax, c.rows = 100, c.cols = 24, c.plan = {};
  c.plan.tail = TailHandling::clamp;
  expect_case_passes(c, Backend::cuda);  // sub-warp programs, clamped tails
}

TEST_F(CudaSweep, ClusterProgramsAtLongRows) {
  // Rows of 64K-256K split over the groups of a cluster (cluster_sweep, the policy's cluster
  // size): launched with the cluster dimension, checked against the float64 oracle.
  for (const Case& c : cluster_sweep()) {
    SCOPED_TRACE(c.name());
    CaseResult r = run_case(c, Backend::cuda);
    EXPECT_TRUE(r.check.ok) << r.check.mismatches << " mismatches; first: " << r.check.first_mismatch;
    EXPECT_TRUE(r.outside_untouched);
    EXPECT_EQ(r.record.plan.ctas_per_program, *c.plan.ctas_per_program);
    EXPECT_EQ(r.record.groups, c.rows * r.record.plan.ctas_per_program);
  }
}

TEST_F(CudaSanitizerFamily, OneKernelOfEveryPlanFamily) {
  // Every structural class of the mapping family once (plan_family_cases; its CPU twin in
  // tests/api/cpu_sweep_test.cpp checks the coverage): the set compute-sanitizer runs over.
  int launched = 0;
  for (const FamilyCase& f : plan_family_cases()) {
    SCOPED_TRACE(f.family);
    expect_case_passes(f.c, Backend::cuda);
    ++launched;
  }
  std::printf("plan families launched: %d\n", launched);
}

}  // namespace
}  // namespace tile::testing
