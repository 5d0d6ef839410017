// The built-in monoids (src/spec/monoid.cpp): their chunk and combine graphs agree with a
// float64 fold over the same elements, however the elements are split into chunks; an empty
// chunk is the identity; NaN and infinity behave as PyTorch's reductions do. Evaluated through
// the CPU executor by running one-reduction programs on chosen rows (the graphs are data, and
// the lowering instantiates them at every merge).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

#include "tile/tile.hpp"

namespace tile {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// One row program per monoid: every part of reduce(cols, monoid, x) stored as a per-row output.
struct PartsProgram {
  RowProgram p{"parts"};
  std::vector<std::string> names;
  explicit PartsProgram(const Monoid& m) {
    Operand x = p.row_in("x");
    Operand y = p.row_out("y");
    std::vector<RowExpr> parts = p.reduce(Axis::cols, m, {p.load(x)});
    for (size_t k = 0; k < parts.size(); ++k) {
      names.push_back("part" + std::to_string(k));
      p.store(p.row_scalar_out(names.back(), {DType::f32}, false), parts[k]);
    }
    p.store(y, p.load(x));
  }
};

// Runs the monoid over each row on the CPU backend with `plan`; returns parts per row.
std::vector<std::vector<float>> run_parts(const Monoid& m, const std::vector<std::vector<float>>& rows, const PlanRequest& plan) {
  PartsProgram prog(m);
  const int64_t cols = int64_t(rows[0].size()), n = int64_t(rows.size());
  std::vector<float> x, y(size_t(n * cols));
  for (const auto& r : rows) x.insert(x.end(), r.begin(), r.end());
  std::vector<std::vector<float>> parts(prog.names.size(), std::vector<float>(size_t(n)));
  Args args;
  args.set("x", matrix(x.data(), DType::f32, n, cols)).set("y", matrix(y.data(), DType::f32, n, cols));
  for (size_t k = 0; k < parts.size(); ++k) args.set(prog.names[k], VectorView{parts[k].data(), DType::f32, n});
  run(prog.p, args, {plan, nullptr, Backend::cpu});
  std::vector<std::vector<float>> out(static_cast<size_t>(n));
  for (int64_t r = 0; r < n; ++r)
    for (auto& part : parts) out[size_t(r)].push_back(part[size_t(r)]);
  return out;
}

// The plans that split a row differently: one worker (one chunk), many workers (a chunk each,
// then shuffles and shared memory), re-read iterations of one vector (chunks merged in a loop).
std::vector<PlanRequest> splits() {
  std::vector<PlanRequest> plans(4);
  plans[0].workers_per_program = 1, plans[0].vector_elems = 1, plans[0].caching = InputCaching::registers,
  plans[0].private_budget = 255, plans[0].stripes = 200;
  plans[1].workers_per_program = 64, plans[1].vector_elems = 1;
  plans[2].workers_per_program = 32, plans[2].vector_elems = 1, plans[2].caching = InputCaching::reread;
  plans[3].workers_per_program = 128, plans[3].vector_elems = 2, plans[3].caching = InputCaching::reread, plans[3].stripe_unroll = 3;
  return plans;
}

void expect_same(float got, double want, const std::string& what) {
  if (std::isnan(want)) {
    EXPECT_TRUE(std::isnan(got)) << what << ": got " << got << ", want NaN";
  } else if (std::isinf(want)) {
    EXPECT_EQ(got, float(want)) << what;
  } else {
    EXPECT_NEAR(got, want, 1e-5 * std::max(1.0, std::abs(want))) << what;
  }
}

TEST(Monoid, EveryBuiltInAgreesWithAFloat64FoldUnderEverySplit) {
  std::mt19937_64 rng(4);
  std::normal_distribution<double> normal;
  std::vector<std::vector<float>> rows(6, std::vector<float>(150));
  for (auto& r : rows)
    for (float& v : r) v = float(3 * normal(rng));
  for (float& v : rows[1]) v = 100 + v;  // far from zero (mean_m2's reason to exist)
  for (int c = 100; c < 150; ++c) rows[2][c] = -kInf;  // a run of -inf
  for (float& v : rows[3]) v *= 1e36f;   // beyond sqrt(FLT_MAX): sums of squares overflow
  for (float& v : rows[4]) v *= 1e-35f;  // tiny
  std::fill(rows[5].begin(), rows[5].end(), 0.0f);
  for (const PlanRequest& plan : splits()) {
    const std::string tag = plan.to_json();
    auto sum = run_parts(monoid::sum(), rows, plan);
    auto mx = run_parts(monoid::max(), rows, plan);
    auto soft = run_parts(monoid::online_softmax(), rows, plan);
    auto stats = run_parts(monoid::mean_m2(), rows, plan);
    auto sq = run_parts(monoid::scaled_sum_squares(), rows, plan);
    auto scaled = run_parts(monoid::scaled_mean_m2(), rows, plan);
    for (size_t r = 0; r < rows.size(); ++r) {
      double s = 0, m = -INFINITY, mean = 0, m2 = 0, amax = 0, ss = 0, e = 0;
      for (float v : rows[r]) s += v, m = std::max(m, double(v)), amax = std::max(amax, std::abs(double(v)));
      for (float v : rows[r]) e += std::exp(double(v) - m);
      mean = s / double(rows[r].size());
      // Σ x^2 = ss 4^kc with 2^k <= max |x| < 2^(k+1) and kc = k clamped to [-103, 125].
      const int k = amax > 0 ? std::ilogb(amax) : 0, kc = std::clamp(k, -103, 125);
      for (float v : rows[r]) m2 += (v - mean) * (v - mean), ss += std::ldexp(double(v), -kc) * std::ldexp(double(v), -kc);
      const std::string at = tag + " row " + std::to_string(r);
      if (r != 2 && r != 3) expect_same(sum[r][0], s, "sum " + at);
      expect_same(mx[r][0], m, "max " + at);
      expect_same(soft[r][0], m, "online_softmax max " + at);
      expect_same(soft[r][1], e, "online_softmax sum " + at);
      if (r != 2 && r != 3) {
        expect_same(stats[r][0], double(rows[r].size()), "mean_m2 count " + at);
        EXPECT_NEAR(stats[r][1], mean, 1e-5 * std::max(1.0, std::abs(mean))) << "mean_m2 mean " << at;
        EXPECT_NEAR(stats[r][2], m2, 1e-4 * std::max(1.0, m2)) << "mean_m2 m2 " << at;
      }
      if (r != 2) {
        // The state holds Σ x^2 = s 4^e. Its exponent is at least kc and bounds every |x|, or
        // is 0 where a worker's fast path found its sums in range (2^-60 <= Σ x^2 < 2^100 for
        // the sum of squares, |x| < 2^31 for the mean and m2): no scaling is needed there.
        const int es = int(sq[r][0]);
        const double sum_sq = std::ldexp(ss, 2 * kc);
        const bool sq_plain = es == 0 && sum_sq >= 0x1p-60 && sum_sq < 0x1p100;
        EXPECT_TRUE((es >= kc && amax < std::ldexp(1.0, es + 1)) || sq_plain)
            << "scaled_sum_squares exponent " << es << " " << at;
        expect_same(std::ldexp(double(sq[r][1]), 2 * (es - kc)), ss, "scaled_sum_squares sum " + at);
        expect_same(scaled[r][0], double(rows[r].size()), "scaled_mean_m2 count " + at);
        const double e = scaled[r][1];
        EXPECT_TRUE((e >= kc && amax < std::ldexp(1.0, int(e) + 1)) || (e == 0 && amax < 0x1p31))
            << "scaled_mean_m2 exponent " << e << " " << at;
        EXPECT_NEAR(std::ldexp(scaled[r][2], int(e)), mean, 1e-5 * std::max(1.0, std::abs(mean))) << "scaled_mean_m2 mean " << at;
        EXPECT_NEAR(std::ldexp(double(scaled[r][3]), 2 * int(e)), m2, 1e-4 * std::max(1.0, m2)) << "scaled_mean_m2 m2 " << at;
      }
    }
  }
}

TEST(Monoid, SpecialValuesFollowPyTorch) {
  // A NaN anywhere makes max, the softmax statistics and the sums NaN; +inf makes the softmax
  // sum NaN (exp(inf - inf)) and the scaled sum of squares +inf; an all -inf row has max -inf and
  // sum of exp 0 (softmax then divides 0 by 0: NaN, as PyTorch).
  const int64_t cols = 70;
  std::vector<std::vector<float>> rows(4, std::vector<float>(cols, 1.0f));
  rows[0][37] = kNaN;
  rows[1][5] = kInf;
  std::fill(rows[2].begin(), rows[2].end(), -kInf);
  rows[3][69] = -kInf;
  for (const PlanRequest& plan : splits()) {
    const std::string tag = plan.to_json();
    auto mx = run_parts(monoid::max(), rows, plan);
    auto soft = run_parts(monoid::online_softmax(), rows, plan);
    auto sq = run_parts(monoid::scaled_sum_squares(), rows, plan);
    auto stats = run_parts(monoid::mean_m2(), rows, plan);
    auto scaled = run_parts(monoid::scaled_mean_m2(), rows, plan);
    EXPECT_TRUE(std::isnan(mx[0][0]) && std::isnan(soft[0][0]) && std::isnan(soft[0][1]) && std::isnan(sq[0][1]) &&
                std::isnan(stats[0][1]) && std::isnan(scaled[0][3]))
        << tag;
    EXPECT_TRUE(std::isnan(scaled[1][3])) << tag << ": a row with +inf has no finite deviations";
    // The mean of a row holding one infinity is that infinity under every split, as a sum is
    // (Chan's update merging it with a finite side took inf + (x - inf) / n = NaN).
    EXPECT_EQ(stats[1][1], kInf) << tag;
    EXPECT_EQ(stats[3][1], -kInf) << tag;
    EXPECT_TRUE(std::isnan(stats[1][2])) << tag;
    EXPECT_EQ(mx[1][0], kInf) << tag;
    EXPECT_TRUE(std::isnan(soft[1][1])) << tag;
    EXPECT_EQ(sq[1][1], kInf) << tag;
    EXPECT_EQ(mx[2][0], -kInf) << tag;
    EXPECT_EQ(soft[2][1], 0.0f) << tag;
    EXPECT_NEAR(soft[3][1], 69.0f, 1e-4) << tag;  // exp(-inf - 1) adds 0
  }
}

// A row's mean, sum of squared deviations from it and sum of squares, in float64.
struct Float64Statistics {
  double mean, m2, ss;
};
Float64Statistics float64_statistics(const std::vector<float>& row) {
  Float64Statistics st{0, 0, 0};
  for (float v : row) st.mean += v, st.ss += double(v) * v;
  st.mean /= double(row.size());
  for (float v : row) st.m2 += (v - st.mean) * (v - st.mean);
  return st;
}

TEST(Monoid, ScaledStatisticsAtEveryMagnitude) {
  // Rows whose squares, sums or deviations overflow fp32, subnormal rows, and constant rows of
  // any magnitude: scaled_sum_squares and scaled_mean_m2 stay finite, and a constant row has its
  // exact mean and m2 = 0 however it is split.
  const float max = std::numeric_limits<float>::max(), tiny = 0x1p-149f;
  std::vector<std::vector<float>> rows(6, std::vector<float>(150));
  for (int c = 0; c < 150; ++c) {
    rows[0][c] = c % 2 ? max : -max;                   // deviations of 2 max
    rows[1][c] = float(c % 7 + 1) * tiny;              // subnormal only
    rows[2][c] = c % 3 ? 3e38f : 1e-44f;               // both ends
    rows[3][c] = 2e19f;                                 // constant, squares overflow
    rows[4][c] = -tiny;                                 // constant, subnormal
    rows[5][c] = 0.1f;                                  // constant, inexact in binary
  }
  for (const PlanRequest& plan : splits()) {
    const std::string tag = plan.to_json();
    auto sq = run_parts(monoid::scaled_sum_squares(), rows, plan);
    auto st = run_parts(monoid::scaled_mean_m2(), rows, plan);
    for (size_t r = 0; r < rows.size(); ++r) {
      const auto [mean, m2, ss] = float64_statistics(rows[r]);
      const int k = int(sq[r][0]), e = int(st[r][1]);  // Σ x^2 = s 4^k; mean, m2 of x 2^-e
      const std::string at = tag + " row " + std::to_string(r);
      EXPECT_TRUE(std::isfinite(sq[r][1]) && std::isfinite(st[r][2]) && std::isfinite(st[r][3])) << at;
      EXPECT_NEAR(std::ldexp(double(sq[r][1]), 2 * k) / ss, 1.0, 1e-5) << at;
      EXPECT_NEAR(std::ldexp(double(st[r][2]), e), mean, 1e-5 * std::abs(mean) + 1e-45) << at;
      if (r >= 3) {
        EXPECT_EQ(std::ldexp(double(st[r][2]), e), double(rows[r][0])) << "constant row, exact mean " << at;
        EXPECT_EQ(st[r][3], 0.0f) << "constant row, m2 " << at;
      } else {
        EXPECT_NEAR(std::ldexp(double(st[r][3]), 2 * e) / m2, 1.0, 1e-4) << at;
      }
    }
  }
}

TEST(Monoid, WorkerFastPathsAgreeWithTheChunkGraphsOnBothSidesOfTheirTests) {
  // Rows whose workers take the fast path (plain or shifted sums) and rows whose workers, or
  // some of them, fail its test and fold their elements with the chunk graph instead: tiny and
  // zero stretches beside ordinary ones, squares that overflow, a shift far out (the first
  // element an outlier), a constant row at an inexact value, an offset row. Every split must give
  // the float64 statistics.
  std::mt19937_64 rng(11);
  std::normal_distribution<double> normal;
  const int cols = 150;
  std::vector<std::vector<float>> rows(8, std::vector<float>(cols));
  for (auto& r : rows)
    for (float& v : r) v = float(normal(rng));
  for (int c = 0; c < cols / 2; ++c) rows[1][c] *= 1e-25f;          // tiny first half
  for (int c = 0; c < cols; c += 3) rows[2][c] = 0.0f;              // zeros between
  for (int c = 0; c < cols; c += 7) rows[3][c] *= 1e25f;            // squares overflow here and there
  for (int c = 0; c < cols; c += 50) rows[4][c] = 1e6f;             // outliers at the workers' first elements
  std::fill(rows[5].begin(), rows[5].end(), 0.3f);                  // constant
  for (float& v : rows[6]) v = 1000.0f + 2.0f * v;                  // offset (fp32 means err by u 1000 / 2 in m2)
  for (float& v : rows[7]) v *= 1e-8f;                              // small, still on the fast side
  for (const PlanRequest& plan : splits()) {
    const std::string tag = plan.to_json();
    auto sq = run_parts(monoid::scaled_sum_squares(), rows, plan);
    auto st = run_parts(monoid::scaled_mean_m2(), rows, plan);
    for (size_t r = 0; r < rows.size(); ++r) {
      const auto [mean, m2, ss] = float64_statistics(rows[r]);
      const int k = int(sq[r][0]), e = int(st[r][1]);
      const std::string at = tag + " row " + std::to_string(r);
      EXPECT_NEAR(std::ldexp(double(sq[r][1]), 2 * k) / ss, 1.0, 1e-5) << "sum of squares " << at;
      EXPECT_NEAR(std::ldexp(double(st[r][2]), e), mean, 1e-5 * std::sqrt(m2 / cols) + 1e-6 * std::abs(mean)) << "mean " << at;
      if (r == 5) {
        EXPECT_EQ(std::ldexp(double(st[r][2]), e), double(rows[r][0])) << "constant row, exact mean " << at;
        EXPECT_EQ(st[r][3], 0.0f) << "constant row, m2 " << at;
      } else {
        EXPECT_NEAR(std::ldexp(double(st[r][3]), 2 * e) / m2, 1.0, 1e-4) << "m2 " << at;
      }
    }
  }
}

TEST(Monoid, GraphsAreWellFormed) {
  for (const Monoid& m : {monoid::sum(), monoid::max(), monoid::online_softmax(), monoid::mean_m2(),
                          monoid::scaled_sum_squares(), monoid::scaled_mean_m2()}) {
    EXPECT_NO_THROW(m.check()) << m.name;
    EXPECT_EQ(m.parts.size(), m.identity.size()) << m.name;
  }
  // A chunk graph that reads a state, or a combine graph that reads elements, is malformed.
  MonoidBuilder b("broken", {"s"}, {0.0});
  EXPECT_THROW(b.build({b.element()}, {b.chunk_sum(b.element())}), InternalError);
  // A fast graph whose sum nests another, or that reads a state, is malformed.
  MonoidBuilder f("fast", {"s"}, {0.0});
  MonoidExpr nested = f.chunk_sum(f.element() * f.chunk_sum(f.element()));
  EXPECT_THROW(f.build({f.mine(0) + f.other(0)}, {f.chunk_sum(f.element())}, {nested},
                       f.binary(BinaryFn::lt, f.constant(0.0), f.count())),
               InternalError);
  MonoidBuilder g("fast", {"s"}, {0.0});
  EXPECT_THROW(g.build({g.mine(0) + g.other(0)}, {g.chunk_sum(g.element())}, {g.mine(0)},
                       g.binary(BinaryFn::lt, g.constant(0.0), g.count())),
               InternalError);
}

}  // namespace
}  // namespace tile
