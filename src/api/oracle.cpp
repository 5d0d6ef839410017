// The float64 reference, written independently of the IR: plain loops over host memory with
// PyTorch's semantics (NaN propagates, an all -inf softmax row is NaN), and the rule a kernel's
// output is checked by (docs/source/numerics.md).
#include <algorithm>
#include <cmath>
#include <exception>
#include <functional>
#include <limits>
#include <sstream>
#include <thread>
#include <vector>

#include "bind/bind.hpp"
#include "tile/tile.hpp"

namespace tile {

namespace {

constexpr double kUnit = 0x1p-24;  // fp32's unit roundoff
// A float64 call is held to the same number of units in the last place as an fp32 one: every
// fp32 tolerance scaled by fp64's unit roundoff over fp32's (2^-29).
constexpr double kF64Scale = 0x1p-29;

// Calls fn(first_row, end_row, block) on contiguous blocks of rows that cover [0, rows), on up
// to hardware_concurrency threads where the call holds a million elements or more (a bf16
// 8192 x 4096 oracle and check took 0.55-0.67 s on one thread, half a benchmark point's time).
// Rows are independent, so the results do not depend on the split. Returns the block count; an
// exception from any block is rethrown (the first block's first).
template <typename Fn>
int for_row_blocks(int64_t rows, int64_t cols, Fn fn) {
  const int64_t elems = rows * std::max<int64_t>(cols, 1);
  const int64_t threads =
      elems < (int64_t(1) << 20) ? 1 : std::clamp<int64_t>(std::thread::hardware_concurrency(), 1, 64);
  const int blocks = int(std::clamp<int64_t>(std::min(threads, rows), 1, 64));
  if (blocks == 1) {
    fn(int64_t(0), rows, 0);
    return 1;
  }
  std::vector<std::exception_ptr> errors(static_cast<size_t>(blocks));
  {
    std::vector<std::jthread> pool;
    for (int b = 0; b < blocks; ++b)
      pool.emplace_back([&, b] {
        try {
          fn(rows * b / blocks, rows * (b + 1) / blocks, b);
        } catch (...) {
          errors[size_t(b)] = std::current_exception();
        }
      });
  }
  for (const std::exception_ptr& e : errors)
    if (e) std::rethrow_exception(e);
  return blocks;
}

// The eps a kernel computes with: the call's, or the operator's default; rounded to fp32 unless
// the call is a float64 one (which reads eps as a double).
double kernel_eps(const Call& call) {
  const BoundCall bound = bind(call);
  const double eps = bound.operand("eps").value;
  return bound.f64 ? eps : double(float(eps));
}

// A LayerNorm row's float64 mean, 1 / sqrt(var + eps) and largest |x| (NaN when the row is).
struct NormRow {
  double mean = 0, inv = 0, amax = 0;
};

// The norms' sums are taken in Acc: double, or long double for float64 inputs, whose squares
// (and sums near the largest double) would overflow or underflow a double (x86's long double
// has a 15-bit exponent).
// `mean_out` and `inv_out`, where given, receive the unrounded statistics (a subnormal mean
// rounded to double keeps only its few significant bits).
template <typename Acc>
NormRow layer_norm_row_in(const Call& call, int64_t r, double eps, Acc* mean_out = nullptr, Acc* inv_out = nullptr) {
  const int64_t cols = call.x.cols;
  NormRow n;
  Acc mean = 0;
  double lo = std::numeric_limits<double>::infinity(), hi = -lo;
  for (int64_t c = 0; c < cols; ++c) {
    double v = load_as_double(call.x.data, r * call.x.row_stride + c, call.x.dtype);
    mean += v;
    n.amax = std::max(n.amax, std::abs(v));
    lo = std::min(lo, v), hi = std::max(hi, v);
  }
  // The mean lies in [min x, max x]; a rounded sum may not (long double holds n fp64 values'
  // sum inexactly), and a constant row must have exactly its value as mean (var 0).
  mean /= Acc(cols);
  if (lo <= hi) mean = std::clamp(mean, Acc(lo), Acc(hi));
  Acc var = 0;
  for (int64_t c = 0; c < cols; ++c) {
    Acc d = Acc(load_as_double(call.x.data, r * call.x.row_stride + c, call.x.dtype)) - mean;
    var += d * d;
  }
  const Acc inv = Acc(1) / std::sqrt(var / Acc(cols) + Acc(eps));
  n.mean = double(mean);
  n.inv = double(inv);
  if (mean_out) *mean_out = mean, *inv_out = inv;
  return n;
}
NormRow layer_norm_row(const Call& call, int64_t r, double eps) {
  return call.x.dtype == DType::f64 ? layer_norm_row_in<long double>(call, r, eps)
                                    : layer_norm_row_in<double>(call, r, eps);
}

// y of one softmax (log-softmax) row, in Acc: a float64 call's reference sums in long double,
// or the sum's own rounding (sqrt(cols) units) would be as large as the kernel's.
template <typename Acc>
void softmax_row(const std::vector<double>& x, bool has_nan, bool log, double* y) {
  Acc m = -std::numeric_limits<Acc>::infinity();
  for (double v : x) m = std::max(m, Acc(v));
  if (has_nan) m = std::numeric_limits<Acc>::quiet_NaN();
  Acc s = 0;
  for (double v : x) s += std::exp(Acc(v) - m);
  for (size_t c = 0; c < x.size(); ++c) y[c] = double(log ? Acc(x[c]) - m - std::log(s) : std::exp(Acc(x[c]) - m) / s);
}

// y of one RMSNorm row (x: the row, w: the weight or nullptr-like absent), sums in Acc.
template <typename Acc>
void rms_norm_row(const std::vector<double>& x, double eps, const std::function<double(int64_t)>& weight, double* y) {
  Acc ss = 0;
  for (double v : x) ss += Acc(v) * Acc(v);
  const Acc inv = Acc(1) / std::sqrt(ss / Acc(x.size()) + Acc(eps));
  for (size_t c = 0; c < x.size(); ++c) y[c] = double(Acc(x[c]) * inv * Acc(weight(int64_t(c))));
}

}  // namespace

std::vector<double> oracle(const Call& call) {
  bind(call);  // the same argument checks as a launch
  const int64_t rows = call.x.rows, cols = call.x.cols;
  std::vector<double> out(static_cast<size_t>(rows * cols));
  const double eps = call.op == Op::rms_norm || call.op == Op::layer_norm ? kernel_eps(call) : 0.0;
  auto column = [&](const VectorView& v, int64_t c, double absent) {
    return v.data ? double(load_as_double(v.data, c, v.dtype)) : absent;
  };
  for_row_blocks(rows, cols, [&](int64_t first, int64_t end, int) {
    std::vector<double> x(static_cast<size_t>(cols));
    for (int64_t r = first; r < end; ++r) {
      bool has_nan = false;
      for (int64_t c = 0; c < cols; ++c) {
        x[c] = load_as_double(call.x.data, r * call.x.row_stride + c, call.x.dtype);
        has_nan |= std::isnan(x[c]);
      }
      double* y = &out[size_t(r * cols)];
      switch (call.op) {
        case Op::softmax:
        case Op::log_softmax:
          if (call.x.dtype == DType::f64)
            softmax_row<long double>(x, has_nan, call.op == Op::log_softmax, y);
          else
            softmax_row<double>(x, has_nan, call.op == Op::log_softmax, y);
          break;
        case Op::rms_norm: {
          const auto w = [&](int64_t c) { return column(call.weight, c, 1.0); };
          if (call.x.dtype == DType::f64)
            rms_norm_row<long double>(x, eps, w, y);
          else
            rms_norm_row<double>(x, eps, w, y);
          break;
        }
        case Op::layer_norm: {
          if (call.x.dtype == DType::f64) {  // in long double: huge and subnormal rows
            long double mean = 0, inv = 0;
            layer_norm_row_in<long double>(call, r, eps, &mean, &inv);
            for (int64_t c = 0; c < cols; ++c)
              y[c] = double((x[c] - mean) * inv * column(call.weight, c, 1.0) + column(call.bias, c, 0.0));
            break;
          }
          double mean = 0;
          for (double v : x) mean += v;
          mean /= double(cols);
          double var = 0;
          for (double v : x) var += (v - mean) * (v - mean);
          var /= double(cols);
          double inv = 1.0 / std::sqrt(var + eps);
          for (int64_t c = 0; c < cols; ++c)
            y[c] = (x[c] - mean) * inv * column(call.weight, c, 1.0) + column(call.bias, c, 0.0);
          break;
        }
      }
    }
  });
  return out;
}

int merge_depth(const MappingPlan& p, int64_t cols) {
  // The elements a worker combines in sequence (its cached slice, or the loop iterations plus
  // one iteration's elements), then the warp and the cross-warp butterflies.
  const int64_t per_iteration = p.elems_per_stripe() * p.stripe_unroll;
  int64_t chain = p.caching == InputCaching::registers
                      ? int64_t(p.stripes) * p.vector_elems
                      : (cols + per_iteration - 1) / per_iteration + int64_t(p.stripe_unroll) * p.vector_elems;
  int levels = 0;
  for (int w = std::min(p.workers_per_program, 32); w > 1; w /= 2) ++levels;
  if (p.workers_per_program > 32) levels += 5;
  for (int c = 1; c < p.ctas_per_program; ++c) ++levels;  // the cluster's partials, folded in rank order
  return int(std::min<int64_t>(chain + levels, 1 << 30));
}

OracleCheck check_against_oracle(const Call& call) { return check_against(call, oracle(call), plan_for(call)); }
OracleCheck check_against_oracle(const Call& call, const MappingPlan& plan) {
  return check_against(call, oracle(call), plan);
}
OracleCheck check_against(const Call& call, const std::vector<double>& ref) {
  return check_against(call, ref, plan_for(call));
}

OracleCheck check_against(const Call& call, const std::vector<double>& ref, const MappingPlan& plan) {
  if (int64_t(ref.size()) != call.x.rows * call.x.cols)
    throw_argument_error("check_against", "reference",
                         "rows x cols = " + std::to_string(call.x.rows) + " x " + std::to_string(call.x.cols) + " values",
                         std::to_string(ref.size()) + " values");
  // rtol covers rounding to the output dtype plus fp32 accumulation; atol is relative to the
  // row's largest |ref| (softmax rows hold many tiny values); floor is the output's smallest
  // step (a few fp32 subnormal steps for fp32). The merge depth adds one unit roundoff per
  // rounding a reduction's partial goes through.
  // A float64 call: the fp32 rule scaled to fp64's unit roundoff (kF64Scale).
  const bool f64 = call.y.dtype == DType::f64;
  const double unit = f64 ? kUnit * kF64Scale : kUnit, subnormal_steps = f64 ? 0x1p-1072 : 0x1p-147;
  double rtol = 2e-5, atol = 1e-6, floor = subnormal_steps;
  if (call.y.dtype == DType::f16) rtol = 1.5e-3, atol = 1e-4, floor = 6e-8;
  if (call.y.dtype == DType::bf16) rtol = 8e-3, atol = 1e-4, floor = 1e-38;
  if (f64) rtol *= kF64Scale, atol *= kF64Scale;
  const double depth = merge_depth(plan, call.x.cols);
  rtol += (depth + 8) * unit;
  const double limit = overflow_threshold(call.y.dtype);
  const double eps = call.op == Op::layer_norm ? kernel_eps(call) : 0.0;
  auto weight = [&](int64_t c) {
    return call.weight.data ? std::abs(double(load_as_double(call.weight.data, c, call.weight.dtype))) : 1.0;
  };
  const int64_t rows = call.x.rows, cols = call.x.cols;
  // One check a block of rows, merged in row order (the first mismatch is the lowest row's).
  std::vector<OracleCheck> parts(64);
  const int blocks = for_row_blocks(rows, cols, [&](int64_t first, int64_t end, int block) {
    OracleCheck& check = parts[size_t(block)];
    for (int64_t r = first; r < end; ++r) {
      double row_max = 0;
      for (int64_t c = 0; c < cols; ++c)
        if (std::isfinite(ref[r * cols + c])) row_max = std::max(row_max, std::min(std::abs(ref[r * cols + c]), limit));
      // LayerNorm centres by a computed mean: its rounding through `depth` merges, amplified by
      // 1 / sqrt(var + eps) (ill-conditioned rows far from zero).
      NormRow norm;
      double mean_error = 0;
      if (call.op == Op::layer_norm) {
        norm = layer_norm_row(call, r, eps);
        // Scaled by the unit first: fp64 rows reach the largest doubles.
        mean_error = unit * depth * std::abs(norm.mean) + unit * 4 * std::log2(depth + 2) * norm.amax;
      }
      for (int64_t c = 0; c < cols; ++c) {
        const double want = ref[r * cols + c];
        const double got = load_as_double(call.y.data, r * call.y.row_stride + c, call.y.dtype);
        // Results beyond the output dtype's range round to +-inf: compare after clamping both.
        const double want_c = std::clamp(want, -limit, limit), got_c = std::clamp(got, -limit, limit);
        double tol = rtol * std::abs(want_c) + atol * row_max + floor;
        // The norms' normalised value x_hat may itself be subnormal (tiny rows, large eps): its
        // few roundings at the subnormal step, times the weight.
        if (call.op == Op::rms_norm || call.op == Op::layer_norm) tol += subnormal_steps * weight(c);
        // A zero weight scales the mean's error away: an infinite x_hat (a constant row, eps 0)
        // would make the product NaN.
        if (mean_error > 0 && weight(c) != 0) {
          const double x = load_as_double(call.x.data, r * call.x.row_stride + c, call.x.dtype);
          // x - mean in long double: it overflows a double at fp64's extremes.
          tol += mean_error * norm.inv * (2 + std::abs(double((static_cast<long double>(x) - norm.mean) * norm.inv))) *
                 weight(c);
        }
        const double err = std::abs(got_c - want_c);
        bool ok = std::isnan(want) ? std::isnan(got) : std::isinf(want) ? got == want : !std::isnan(got) && err <= tol;
        ++check.checked;
        if (std::isfinite(want) && std::isfinite(got)) {
          check.max_abs_error = std::max(check.max_abs_error, std::abs(got - want));
          if (want != 0) check.max_rel_error = std::max(check.max_rel_error, std::abs(got - want) / std::abs(want));
        }
        if (!ok) {
          if (check.mismatches++ == 0) {
            std::ostringstream os;
            os.precision(9);
            os << "row " << r << " col " << c << ": got " << got << ", want " << want << " (tolerance " << tol << ")";
            check.first_mismatch = os.str();
          }
          check.ok = false;
        }
      }
    }
  });
  OracleCheck check;
  for (int b = 0; b < blocks; ++b) {
    const OracleCheck& part = parts[size_t(b)];
    if (check.first_mismatch.empty()) check.first_mismatch = part.first_mismatch;
    check.ok = check.ok && part.ok;
    check.checked += part.checked;
    check.mismatches += part.mismatches;
    check.max_abs_error = std::max(check.max_abs_error, part.max_abs_error);
    check.max_rel_error = std::max(check.max_rel_error, part.max_rel_error);
  }
  return check;
}

}  // namespace tile
