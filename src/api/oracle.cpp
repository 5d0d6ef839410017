// The float64 reference, written independently of the IR: plain loops over host memory with
// PyTorch's semantics (NaN propagates, an all -inf softmax row is NaN).
#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>

#include "bind/bind.hpp"
#include "tile/tile.hpp"

namespace tile {

std::vector<double> oracle(const Call& call) {
  bind(call);  // the same argument checks as a launch
  const int64_t rows = call.x.rows, cols = call.x.cols;
  std::vector<double> out(static_cast<size_t>(rows * cols));
  std::vector<double> x(static_cast<size_t>(cols));
  const double eps = call.eps ? *call.eps : call.op == Op::layer_norm ? kLayerNormEps : kRmsNormEps;
  auto column = [&](const VectorView& v, int64_t c, double absent) {
    return v.data ? double(load_as_float(v.data, c, v.dtype)) : absent;
  };
  for (int64_t r = 0; r < rows; ++r) {
    bool has_nan = false;
    for (int64_t c = 0; c < cols; ++c) {
      x[c] = load_as_float(call.x.data, r * call.x.row_stride + c, call.x.dtype);
      has_nan |= std::isnan(x[c]);
    }
    double* y = &out[size_t(r * cols)];
    switch (call.op) {
      case Op::softmax:
      case Op::log_softmax: {
        double m = -std::numeric_limits<double>::infinity();
        for (double v : x) m = std::max(m, v);
        if (has_nan) m = std::numeric_limits<double>::quiet_NaN();
        double s = 0;
        for (double v : x) s += std::exp(v - m);
        for (int64_t c = 0; c < cols; ++c)
          y[c] = call.op == Op::softmax ? std::exp(x[c] - m) / s : x[c] - m - std::log(s);
        break;
      }
      case Op::rms_norm: {
        double ss = 0;
        for (double v : x) ss += v * v;
        double inv = 1.0 / std::sqrt(ss / double(cols) + eps);
        for (int64_t c = 0; c < cols; ++c) y[c] = x[c] * inv * column(call.weight, c, 1.0);
        break;
      }
      case Op::layer_norm: {
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
  return out;
}

OracleCheck check_against_oracle(const Call& call) { return check_against(call, oracle(call)); }

OracleCheck check_against(const Call& call, const std::vector<double>& ref) {
  TILE_CHECK(int64_t(ref.size()) == call.x.rows * call.x.cols, "reference of ", ref.size(), " values for a ",
             call.x.rows, " x ", call.x.cols, " call");
  // rtol covers rounding to the output dtype plus fp32 accumulation; atol is relative to the
  // row's largest |ref| (softmax rows hold many tiny values); floor is the output's smallest step.
  double rtol = 2e-5, atol = 1e-6, floor = 0;
  if (call.y.dtype == DType::f16) rtol = 1.5e-3, atol = 1e-4, floor = 6e-8;
  if (call.y.dtype == DType::bf16) rtol = 8e-3, atol = 1e-4, floor = 1e-38;
  OracleCheck check;
  const int64_t rows = call.x.rows, cols = call.x.cols;
  for (int64_t r = 0; r < rows; ++r) {
    double row_max = 0;
    for (int64_t c = 0; c < cols; ++c)
      if (std::isfinite(ref[r * cols + c])) row_max = std::max(row_max, std::abs(ref[r * cols + c]));
    // LayerNorm subtracts an fp32 mean: two ulps of it, scaled by rstd and the largest |weight|,
    // are an error no fp32 kernel avoids on rows far from zero.
    double mean_ulps = 0;
    if (call.op == Op::layer_norm) {
      double mean = 0, var = 0, wmax = call.weight.data ? 0.0 : 1.0;
      for (int64_t c = 0; c < cols; ++c) mean += load_as_float(call.x.data, r * call.x.row_stride + c, call.x.dtype);
      mean /= double(cols);
      for (int64_t c = 0; c < cols; ++c) {
        double d = load_as_float(call.x.data, r * call.x.row_stride + c, call.x.dtype) - mean;
        var += d * d;
      }
      for (int64_t c = 0; call.weight.data && c < cols; ++c)
        wmax = std::max(wmax, std::abs(double(load_as_float(call.weight.data, c, call.weight.dtype))));
      const double eps = call.eps ? *call.eps : kLayerNormEps;
      mean_ulps = std::ldexp(std::abs(mean), -23) / std::sqrt(var / double(cols) + eps) * wmax;
      if (!std::isfinite(mean_ulps)) mean_ulps = 0;
    }
    for (int64_t c = 0; c < cols; ++c) {
      double want = ref[r * cols + c];
      double got = load_as_float(call.y.data, r * call.y.row_stride + c, call.y.dtype);
      double tol = rtol * std::abs(want) + atol * row_max + floor + mean_ulps;
      double err = std::abs(got - want);
      bool ok = std::isnan(want) ? std::isnan(got) : (std::isinf(want) ? got == want : err <= tol);
      ++check.checked;
      if (std::isfinite(want) && std::isfinite(got)) {
        check.max_abs_error = std::max(check.max_abs_error, err);
        if (want != 0) check.max_rel_error = std::max(check.max_rel_error, err / std::abs(want));
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
  return check;
}

}  // namespace tile
