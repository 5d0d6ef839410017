// The training operators (include/tile/training.hpp) on either backend against float64
// references written here with plain loops, independently of the row programs: host buffers
// with a poisoned guard band (and device copies for CUDA), one case runner per operator, and a
// comparison whose tolerance scales with each output's dtype and with the magnitude of the
// terms it sums. Shared by tests/spec/training_ops_test.cpp (CPU) and
// tests/api/training_cuda_test.cpp (GPU).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#if TILE_WITH_CUDA
#include "backend/cuda/driver.hpp"
#endif
#include "tile/training.hpp"

namespace tile::testing {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// ---- buffers ----

// One operand's memory: a (rows, cols) matrix with a row stride, or a vector of `rows` values
// `stride` apart (cols == 0), starting `offset` elements into an allocation whose every other
// byte stays 0xff (NaN in each float dtype), so a write outside the view is seen.
struct Buf {
  DType dtype = DType::f32;
  int64_t rows = 0, cols = 0, stride = 1, offset = 0;
  std::vector<uint8_t> bytes;
#if TILE_WITH_CUDA
  std::shared_ptr<cuda::DeviceBuffer> device;
#endif

  static Buf matrix(DType t, int64_t rows, int64_t cols, int64_t stride, int64_t offset = 0) {
    Buf b;
    b.dtype = t, b.rows = rows, b.cols = cols, b.stride = stride, b.offset = offset;
    b.bytes.assign(size_t((offset + b.span() + 32) * dtype_size(t)), 0xff);
    return b;
  }
  static Buf vector(DType t, int64_t n, int64_t stride = 1, int64_t offset = 0) {
    Buf b;
    b.dtype = t, b.rows = n, b.cols = 0, b.stride = stride, b.offset = offset;
    b.bytes.assign(size_t((offset + b.span() + 32) * dtype_size(t)), 0xff);
    return b;
  }
  bool is_matrix() const { return cols > 0; }
  int64_t width() const { return is_matrix() ? cols : 1; }
  int64_t span() const { return rows == 0 ? 0 : (rows - 1) * stride + width(); }
  int64_t index(int64_t r, int64_t c = 0) const { return r * stride + c; }
  void* host() { return bytes.data() + offset * dtype_size(dtype); }
  const void* host() const { return bytes.data() + offset * dtype_size(dtype); }
  double at(int64_t r, int64_t c = 0) const {
    return is_float(dtype) ? load_as_double(host(), index(r, c), dtype)
                           : double(load_as_int(host(), index(r, c), dtype));
  }
  void set(int64_t r, int64_t c, double v) {
    if (is_float(dtype))
      store_from_double(host(), index(r, c), dtype, v);
    else
      store_from_int(host(), index(r, c), dtype, int64_t(v));
  }
  void poison() { std::memset(bytes.data(), 0xff, bytes.size()); }
  // True when no byte outside the view's elements differs from the poison.
  bool outside_untouched() const {
    const int es = dtype_size(dtype);
    for (int64_t e = 0; e < int64_t(bytes.size()) / es; ++e) {
      const int64_t rel = e - offset;
      const bool inside = rel >= 0 && rel < span() && (stride == 0 || rel % stride < width());
      if (inside) continue;
      for (int b = 0; b < es; ++b)
        if (bytes[size_t(e * es + b)] != 0xff) return false;
    }
    return true;
  }
};

// The operands of one call, by name, on one backend. Views point at host memory (CPU) or at
// device copies made by upload() (CUDA); download() brings the outputs back.
class Env {
 public:
  explicit Env(Backend backend) : backend_(backend) {}
  Backend backend() const { return backend_; }
  Buf& add(const std::string& name, Buf b) { return bufs_[name] = std::move(b); }
  Buf& operator[](const std::string& name) { return bufs_.at(name); }
  const Buf& operator[](const std::string& name) const { return bufs_.at(name); }
  bool has(const std::string& name) const { return bufs_.count(name) != 0; }

  void* data(const std::string& name) {
    Buf& b = bufs_.at(name);
#if TILE_WITH_CUDA
    if (backend_ == Backend::cuda) return static_cast<char*>(b.device->get()) + b.offset * dtype_size(b.dtype);
#endif
    return b.host();
  }
  TensorView mat(const std::string& name) {
    if (!has(name)) return {};
    const Buf& b = bufs_.at(name);
    return TensorView{data(name), b.dtype, b.rows, b.cols, b.stride};
  }
  VectorView vec(const std::string& name) {
    if (!has(name)) return {};
    const Buf& b = bufs_.at(name);
    return VectorView{data(name), b.dtype, b.rows, b.stride};
  }

  void upload() {
    if (backend_ != Backend::cuda) return;
#if TILE_WITH_CUDA
    cuda::ensure_context(0);
    for (auto& [name, b] : bufs_) {
      b.device = std::make_shared<cuda::DeviceBuffer>(b.bytes.size());
      b.device->copy_from_host(b.bytes.data(), b.bytes.size());
    }
#else
    throw NoDriverError("the CUDA backend was not built (TILE_WITH_CUDA=OFF)");
#endif
  }
  void download() {
    if (backend_ != Backend::cuda) return;
#if TILE_WITH_CUDA
    TILE_CU_CHECK(cuda::driver().cuCtxSynchronize());
    for (auto& [name, b] : bufs_) b.device->copy_to_host(b.bytes.data(), b.bytes.size());
#endif
  }

 private:
  Backend backend_;
  std::map<std::string, Buf> bufs_;
};

// ---- references ----

// One output's float64 values in row-major order and, per value, the magnitude its rounding
// errors scale with (the sum of the absolute values of the terms that make it).
struct Expected {
  std::vector<double> want, mag;
};
using Expectations = std::map<std::string, Expected>;

inline double nan_max(double a, double b) { return std::isnan(a) || std::isnan(b) ? kNaN : std::max(a, b); }

// The references' sums over a row are taken in long double: a float64 call's kernel, held to
// 256 of its ulps, sums by trees, while a sequential double sum of n equal terms is off by
// up to n / 2 ulps (rms_norm rstd of 21969 equal elements: 137 ulps).
using RefAcc = long double;

// dx = y (dy - sum(y dy)) or dx = dy - exp(y) sum(dy).
inline Expected softmax_backward_ref(const Buf& y, const Buf& dy, bool log) {
  Expected e;
  for (int64_t r = 0; r < y.rows; ++r) {
    RefAcc acc = 0;
    double s_abs = 0;
    for (int64_t c = 0; c < y.cols; ++c) {
      const double t = log ? dy.at(r, c) : y.at(r, c) * dy.at(r, c);
      acc += t, s_abs += std::abs(t);
    }
    const double s = double(acc);
    for (int64_t c = 0; c < y.cols; ++c) {
      const double yv = y.at(r, c), g = dy.at(r, c);
      if (log) {
        e.want.push_back(g - std::exp(yv) * s);
        const double ey = std::exp(yv);  // 0 for a -inf element, whose |y| is no error term
        e.mag.push_back(std::abs(g) + (ey == 0 ? 0.0 : ey * s_abs * (1 + std::abs(yv))));
      } else {
        e.want.push_back(yv * (g - s));
        e.mag.push_back(std::abs(yv) * (std::abs(g) + s_abs));
      }
    }
  }
  return e;
}

// rstd = 1 / sqrt(mean(h^2) + eps), and (mean, rstd) of LayerNorm, for a row of values.
inline double rms_rstd(const std::vector<double>& h, double eps) {
  RefAcc ss = 0;
  for (double v : h) ss += RefAcc(v) * v;
  return double(1 / std::sqrt(ss / RefAcc(h.size()) + eps));
}
inline std::pair<double, double> ln_stats(const std::vector<double>& h, double eps) {
  RefAcc mean = 0;
  for (double v : h) mean += v;
  mean /= RefAcc(h.size());
  RefAcc var = 0;
  for (double v : h) var += (v - mean) * (v - mean);
  return {double(mean), double(1 / std::sqrt(var / RefAcc(h.size()) + eps))};
}

// RMSNorm's backward from the saved rstd: dx = r (g - xhat sum(g xhat) / n), g = dy w,
// xhat = x r; dweight = sum over rows of dy xhat. `dres` (optional) is added to dx (the fused
// residual form).
inline void rms_norm_backward_ref(const Buf& dy, const Buf& x, const Buf* w, const Buf& rstd, const Buf* dres,
                                  Expected& dx, Expected& dw) {
  const int64_t rows = dy.rows, cols = dy.cols;
  dw.want.assign(size_t(cols), 0.0), dw.mag.assign(size_t(cols), 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    const double rs = rstd.at(r);
    RefAcc acc = 0;
    double dot_abs = 0;
    for (int64_t c = 0; c < cols; ++c) {
      const double t = dy.at(r, c) * (w ? w->at(c) : 1.0) * x.at(r, c) * rs;
      acc += t, dot_abs += std::abs(t);
    }
    const double dot = double(acc);
    for (int64_t c = 0; c < cols; ++c) {
      const double g = dy.at(r, c) * (w ? w->at(c) : 1.0), xhat = x.at(r, c) * rs;
      const double extra = dres ? dres->at(r, c) : 0.0;
      dx.want.push_back(rs * (g - xhat * dot / double(cols)) + extra);
      dx.mag.push_back(std::abs(rs) * (std::abs(g) + std::abs(xhat) * dot_abs / double(cols)) + std::abs(extra));
      dw.want[size_t(c)] += dy.at(r, c) * xhat;
      dw.mag[size_t(c)] += std::abs(dy.at(r, c) * xhat);
    }
  }
}

// LayerNorm's backward: dx = r (g - (sum g + xhat sum(g xhat)) / n); dweight = sum dy xhat;
// dbias = sum dy.
inline void layer_norm_backward_ref(const Buf& dy, const Buf& x, const Buf* w, const Buf& mean, const Buf& rstd,
                                    Expected& dx, Expected& dw, Expected& db) {
  const int64_t rows = dy.rows, cols = dy.cols;
  dw.want.assign(size_t(cols), 0.0), dw.mag.assign(size_t(cols), 0.0);
  db.want.assign(size_t(cols), 0.0), db.mag.assign(size_t(cols), 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    const double rs = rstd.at(r), mu = mean.at(r);
    RefAcc a_acc = 0, b_acc = 0;
    double a_abs = 0, b_abs = 0;
    for (int64_t c = 0; c < cols; ++c) {
      const double g = dy.at(r, c) * (w ? w->at(c) : 1.0), xhat = (x.at(r, c) - mu) * rs;
      a_acc += g, b_acc += g * xhat, a_abs += std::abs(g), b_abs += std::abs(g * xhat);
    }
    const double a = double(a_acc), b = double(b_acc);
    for (int64_t c = 0; c < cols; ++c) {
      const double g = dy.at(r, c) * (w ? w->at(c) : 1.0), xhat = (x.at(r, c) - mu) * rs;
      dx.want.push_back(rs * (g - (a + xhat * b) / double(cols)));
      // x - mean rounds once in fp32: an error of |x| + |mean| ulps times rstd times the sums.
      const double xhat_err = (std::abs(x.at(r, c)) + std::abs(mu)) * std::abs(rs);
      dx.mag.push_back(std::abs(rs) * (std::abs(g) + (a_abs + (std::abs(xhat) + xhat_err) * b_abs) / double(cols)));
      dw.want[size_t(c)] += dy.at(r, c) * xhat;
      dw.mag[size_t(c)] += std::abs(dy.at(r, c)) * (std::abs(xhat) + xhat_err);
      db.want[size_t(c)] += dy.at(r, c);
      db.mag[size_t(c)] += std::abs(dy.at(r, c));
    }
  }
}

// Cross-entropy of one row, float64, as docs/source/training.md defines it.
struct CrossEntropyRow {
  double loss = 0, loss_mag = 0, lse = 0;
  std::vector<double> grad, grad_mag;  // d loss / d logits, per unit upstream gradient
};

inline CrossEntropyRow cross_entropy_row(const std::vector<double>& logits, int64_t target,
                                         const CrossEntropyOptions& ce, bool want_grad,
                                         const double* saved_lse = nullptr) {
  const int64_t C = int64_t(logits.size());
  const double ls = ce.label_smoothing, zl = ce.z_loss;
  std::vector<double> z(logits), th(logits.size(), 0.0);
  if (ce.softcap)
    for (size_t j = 0; j < z.size(); ++j) th[j] = std::tanh(logits[j] / *ce.softcap), z[j] = *ce.softcap * th[j];
  double m = -kInf, zsum_abs = 0;
  RefAcc z_acc = 0, s_acc = 0;
  for (double v : z) m = nan_max(m, v), z_acc += v, zsum_abs += std::abs(v);
  if (m != -kInf)
    for (double v : z) s_acc += std::exp(v - m);  // +inf or NaN make s NaN
  const double zsum = double(z_acc), s = double(s_acc);
  CrossEntropyRow out;
  out.lse = m == -kInf ? -kInf : m + std::log(s);
  const double lse = saved_lse ? *saved_lse : out.lse;
  const bool ignored = target == ce.ignore_index, in_range = target >= 0 && target < C;
  const double zt = in_range ? z[size_t(target)] : 0.0;
  // Without smoothing there is no smoothing term (a -inf logit would make it 0 * inf).
  double loss = lse - (1 - ls) * zt + (ls > 0 ? -ls / double(C) * zsum : 0.0) + (zl > 0 ? zl * lse * lse : 0.0);
  double mag = std::abs(lse) + std::abs(m) + std::abs(zt) + ls * zsum_abs / double(C) + 2 * zl * lse * lse + 1;
  if (ce.softcap) mag += std::abs(zt) + ls * zsum_abs / double(C);  // tanh's rounding
  out.loss = ignored ? 0.0 : in_range ? loss : kNaN;
  out.loss_mag = ignored ? 0.0 : mag;
  if (!want_grad) return out;
  const double coef = 1 + 2 * zl * lse;
  for (int64_t j = 0; j < C; ++j) {
    const double p = saved_lse ? std::exp(z[size_t(j)] - lse) : std::exp(z[size_t(j)] - m) / s;
    double g = coef * p - (j == target ? 1 - ls : 0.0) - ls / double(C);
    double gm =
        (p == 0 ? 0.0 : (std::abs(coef) + 2 * zl * std::abs(lse)) * p * (2 + std::abs(z[size_t(j)]) + std::abs(lse))) +
        1;
    if (ce.softcap) {
      const double d = 1 - th[size_t(j)] * th[size_t(j)];
      // 1 - tanh^2 errs by about two ulps of tanh: absolute, not relative to a small d.
      gm = gm * d + std::abs(g) * 4;
      g *= d;
    }
    out.grad.push_back(ignored ? 0.0 : in_range ? g : kNaN);
    out.grad_mag.push_back(ignored ? 0.0 : gm);
  }
  return out;
}

// ---- comparison ----

struct Comparison {
  bool ok = true;
  int64_t checked = 0, mismatches = 0;
  std::string first;
};

// |got - want| <= rtol(dtype) |want| + ulps * u * mag, NaN exactly where want is NaN, inf
// exactly. rtol is the output dtype's rounding: 2^-22, 2^-10, 2^-7 for f32, f16, bf16; u the
// unit roundoff of the arithmetic, 2^-24 (2^-53 with rtol 2^-51 for f64: float64 calls compute
// in float64, held to the same ulps).
inline void compare(Comparison& cmp, const std::string& name, const Buf& got, const Expected& e, double ulps = 256) {
  const bool f64 = got.dtype == DType::f64;
  const double rtol = f64 ? 0x1p-51 : got.dtype == DType::f32 ? 0x1p-22 : got.dtype == DType::f16 ? 0x1p-10 : 0x1p-7;
  const double floor = got.dtype == DType::f16 ? 1e-7 : f64 ? 1e-300 : 1e-37;
  const double unit = f64 ? 0x1p-53 : 0x1p-24;
  const int64_t w = got.width();
  for (size_t k = 0; k < e.want.size(); ++k) {
    const int64_t r = int64_t(k) / w, c = int64_t(k) % w;
    const double g = got.at(r, c), want = e.want[k];
    const double tol = rtol * std::abs(want) + ulps * unit * e.mag[k] + floor;
    const bool ok = std::isnan(want) ? std::isnan(g) : std::isinf(want) ? g == want : std::abs(g - want) <= tol;
    ++cmp.checked;
    if (!ok && cmp.mismatches++ == 0) {
      std::ostringstream os;
      os.precision(9);
      os << name << "[" << r << (got.is_matrix() ? ", " + std::to_string(c) : std::string()) << "]: got " << g
         << ", want " << want << " (tolerance " << tol << ")";
      cmp.first = os.str();
    }
    cmp.ok &= ok;
  }
}

// ---- cases ----

enum class TrainOp : uint8_t {
  softmax_backward,
  log_softmax_backward,
  rms_norm_backward,
  layer_norm_backward,
  fused_add_rms_norm,
  fused_add_rms_norm_backward,
  cross_entropy,
  cross_entropy_backward,
  cross_entropy_fused,
};

// Plans that take the lowering's other paths: re-read loops, narrow and packed programs,
// scalar accesses, clamped tails, program-scope barriers, combine merges, packed 16-bit caches.
inline std::vector<PlanRequest> plan_variants() {
  std::vector<PlanRequest> plans;
  PlanRequest p;
  p.caching = InputCaching::reread, p.stripe_unroll = 2;
  plans.push_back(p);
  p = {}, p.workers_per_program = 32, p.vector_elems = 1;
  plans.push_back(p);
  p = {}, p.programs_per_group = 3, p.workers_per_program = 64, p.vector_elems = 2;
  plans.push_back(p);
  p = {}, p.tail = TailHandling::clamp, p.workers_per_program = 8;
  plans.push_back(p);
  p = {}, p.barrier_scope = BarrierScope::program, p.programs_per_group = 2, p.workers_per_program = 128;
  plans.push_back(p);
  p = {}, p.merge = MergeStrategy::combine, p.workers_per_program = 64;
  plans.push_back(p);
  p = {}, p.grid_limit = 2, p.programs_per_group = 2, p.workers_per_program = 128;  // many rows per slot
  plans.push_back(p);
  return plans;
}

inline const char* train_op_name(TrainOp op) {
  static const char* names[] = {"softmax_backward",    "log_softmax_backward",   "rms_norm_backward",
                                "layer_norm_backward", "fused_add_rms_norm",     "fused_add_rms_norm_backward",
                                "cross_entropy",       "cross_entropy_backward", "cross_entropy_fused"};
  return names[int(op)];
}

struct TrainCase {
  TrainOp op = TrainOp::softmax_backward;
  int64_t rows = 1, cols = 1, pad = 0, offset = 0;  // row stride cols + pad; pointers shifted by offset
  DType in = DType::f32, out = DType::f32;          // row inputs, row outputs
  DType w = DType::f32;                             // weight; dweight and dbias like it
  DType res = DType::f32;                           // residual (fused add), dresidual_out; target (CE): i32 or i64
  bool weight = true, second = true;                // weight given; bias / dresidual_out / dresidual / dloss given
  bool in_place = false;                            // outputs alias their may_alias inputs
  bool special = false;                             // special values in the inputs (NaN, inf, all -inf rows)
  CrossEntropyOptions ce;
  DType target = DType::i64;
  PlanRequest plan;
  uint64_t seed = 1;

  std::string name() const {
    std::ostringstream os;
    os << train_op_name(op) << " " << rows << "x" << cols << " pad " << pad << " offset " << offset << " "
       << dtype_name(in) << "->" << dtype_name(out) << " w " << dtype_name(w) << " res " << dtype_name(res)
       << (weight ? "" : " no-weight") << (second ? "" : " no-second") << (in_place ? " in-place" : "")
       << (special ? " special" : "") << " plan " << plan.to_json();
    if (op >= TrainOp::cross_entropy)
      os << " ce{" << reduction_name(ce.reduction) << " ls " << ce.label_smoothing << " z " << ce.z_loss << " cap "
         << (ce.softcap ? std::to_string(*ce.softcap) : "none") << " ignore " << ce.ignore_index << " "
         << dtype_name(target) << "}";
    return os.str();
  }
};

struct TrainResult {
  Comparison cmp;
  bool outside_untouched = true;
  std::map<std::string, std::vector<uint8_t>> outputs;  // the outputs' bytes, for bitwise checks
  std::map<std::string, Buf> buffers;                    // the outputs as written, for cross-backend checks
  // Each output's cancellation magnitudes (Expected::mag): the float64 rule's allowance for
  // results computed by cancellation, which a cross-backend comparison must allow too.
  std::map<std::string, std::vector<double>> magnitudes;
};

namespace detail {

inline Buf random_matrix(std::mt19937_64& rng, DType t, const TrainCase& c, double mean, double scale) {
  Buf b = Buf::matrix(t, c.rows, c.cols, c.cols + c.pad, c.offset);
  std::normal_distribution<double> d(mean, scale);
  for (int64_t r = 0; r < c.rows; ++r)
    for (int64_t k = 0; k < c.cols; ++k) b.set(r, k, d(rng));
  return b;
}
inline Buf random_vector(std::mt19937_64& rng, DType t, int64_t n, double mean, double scale) {
  Buf b = Buf::vector(t, n);
  std::normal_distribution<double> d(mean, scale);
  for (int64_t i = 0; i < n; ++i) b.set(i, 0, d(rng));
  return b;
}
inline Buf output_matrix(DType t, const TrainCase& c) {
  return Buf::matrix(t, c.rows, c.cols, c.cols + c.pad, c.offset);
}
inline std::vector<double> row_of(const Buf& b, int64_t r) {
  std::vector<double> v;
  for (int64_t k = 0; k < b.cols; ++k) v.push_back(b.at(r, k));
  return v;
}
// The view a row output of an in-place call writes: its input's buffer.
inline const char* target_of(const TrainCase& c, const char* out, const char* in) { return c.in_place ? in : out; }

}  // namespace detail

// The result of a call whose outputs `env` holds: each output compared with its float64
// reference (the tolerance grows with the rows R a reduction over the rows folds), its guard
// band, its bytes and its cancellation magnitudes.
inline TrainResult train_result(Env& env, const Expectations& want, const std::vector<std::string>& outputs, int64_t R) {
  TrainResult result;
  for (const auto& [name, e] : want) {
    compare(result.cmp, name, env[name], e, 256 + double(R));
    result.magnitudes[name] = e.mag;
  }
  for (const std::string& name : outputs) {
    result.outside_untouched &= env[name].outside_untouched();
    result.outputs[name] = env[name].bytes;
    result.buffers[name] = env[name];
  }
  return result;
}

// Runs one case on `backend`: seeded inputs, poisoned outputs, one call of the operator's
// entry point, every output against its float64 reference, and the guard bands.
inline TrainResult run_train_case(const TrainCase& c, Backend backend) {
  using namespace detail;
  std::mt19937_64 rng(c.seed);
  Env env(backend);
  Expectations want;
  std::vector<std::string> outputs;  // names of the buffers the call writes
  const CallOptions opts{c.plan, nullptr, backend};
  const int64_t R = c.rows, C = c.cols;
  const DType stat = c.in == DType::f64 ? DType::f64 : DType::f32;  // statistics: a float64 call's are f64

  switch (c.op) {
    case TrainOp::softmax_backward:
    case TrainOp::log_softmax_backward: {
      const bool log = c.op == TrainOp::log_softmax_backward;
      // y is a softmax (or log-softmax) of random rows; special: a NaN row and a -inf element.
      Buf y = output_matrix(c.in, c);
      for (int64_t r = 0; r < R; ++r) {
        std::vector<double> x(static_cast<size_t>(C));
        std::normal_distribution<double> d(0, 2);
        for (double& v : x) v = d(rng);
        double m = -kInf, s = 0;
        for (double v : x) m = std::max(m, v);
        for (double v : x) s += std::exp(v - m);
        for (int64_t k = 0; k < C; ++k)
          y.set(r, k, log ? x[size_t(k)] - m - std::log(s) : std::exp(x[size_t(k)] - m) / s);
        if (c.special && r == 1) y.set(r, C / 2, log ? -kInf : 0.0);
        if (c.special && r == 2)
          for (int64_t k = 0; k < C; ++k) y.set(r, k, kNaN);
      }
      env.add("y", y);
      env.add("dy", random_matrix(rng, c.in, c, 0, 1));
      if (!c.in_place) env.add("dx", output_matrix(c.out, c));
      want[target_of(c, "dx", "dy")] = softmax_backward_ref(env["y"], env["dy"], log);
      outputs.push_back(target_of(c, "dx", "dy"));
      env.upload();
      (log ? log_softmax_backward : softmax_backward)(env.mat("y"), env.mat("dy"), env.mat(target_of(c, "dx", "dy")),
                                                      opts);
      break;
    }
    case TrainOp::rms_norm_backward:
    case TrainOp::layer_norm_backward: {
      const bool ln = c.op == TrainOp::layer_norm_backward;
      env.add("dy", random_matrix(rng, c.in, c, 0, 1));
      env.add("x", random_matrix(rng, c.in, c, 0.5, 2));
      if (c.special && R > 1)
        for (int64_t k = 0; k < C; ++k) env["x"].set(1, k, ln ? 3.0 : 0.0);  // a constant row, a zero row
      // Huge values; in f64 past fp32's range, with squares the float64 references still hold.
      if (c.special && R > 2 && c.in != DType::f16)
        for (int64_t k = 0; k < C; ++k) env["x"].set(2, k, env["x"].at(2, k) * (c.in == DType::f64 ? 1e150 : 1e30));
      if (c.weight) env.add("weight", random_vector(rng, c.w, C, 1, 0.5));
      env.add("rstd", Buf::vector(stat, R, 1));
      if (ln) env.add("mean", Buf::vector(stat, R, 1));
      for (int64_t r = 0; r < R; ++r) {  // the statistics the forward pass would have saved
        const std::vector<double> h = row_of(env["x"], r);
        if (ln) {
          auto [mu, rs] = ln_stats(h, 1e-5);
          env["mean"].set(r, 0, mu), env["rstd"].set(r, 0, rs);
        } else {
          env["rstd"].set(r, 0, rms_rstd(h, 1e-6));
        }
      }
      if (!c.in_place) env.add("dx", output_matrix(c.out, c));
      if (c.weight) env.add("dweight", Buf::vector(c.w, C));
      if (ln && c.second) env.add("dbias", Buf::vector(c.w, C));
      Expected dx, dw, db;
      const Buf* w = c.weight ? &env["weight"] : nullptr;
      if (ln)
        layer_norm_backward_ref(env["dy"], env["x"], w, env["mean"], env["rstd"], dx, dw, db);
      else
        rms_norm_backward_ref(env["dy"], env["x"], w, env["rstd"], nullptr, dx, dw);
      want[target_of(c, "dx", "dy")] = dx;
      outputs.push_back(target_of(c, "dx", "dy"));
      if (c.weight) want["dweight"] = dw, outputs.push_back("dweight");
      if (ln && c.second) want["dbias"] = db, outputs.push_back("dbias");
      env.upload();
      if (ln)
        layer_norm_backward(env.mat("dy"), env.mat("x"), env.vec("weight"), env.vec("mean"), env.vec("rstd"),
                            env.mat(target_of(c, "dx", "dy")), env.vec("dweight"), env.vec("dbias"), opts);
      else
        rms_norm_backward(env.mat("dy"), env.mat("x"), env.vec("weight"), env.vec("rstd"),
                          env.mat(target_of(c, "dx", "dy")), env.vec("dweight"), opts);
      break;
    }
    case TrainOp::fused_add_rms_norm: {
      env.add("x", random_matrix(rng, c.in, c, 0, 1));
      env.add("residual", random_matrix(rng, c.res, c, 0.3, 2));
      if (c.special && R > 1)
        for (int64_t k = 0; k < C; ++k) env["x"].set(1, k, -env["residual"].at(1, k));  // h == 0 where exact
      if (c.special && R > 2) {  // sums near the largest finite value of the dtypes involved
        const double big = c.in == DType::f16 || c.res == DType::f16 ? 3e4 : c.in == DType::f64 ? 1e150 : 1e37;
        for (int64_t k = 0; k < C; ++k) env["x"].set(2, k, big), env["residual"].set(2, k, big);
      }
      if (c.weight) env.add("weight", random_vector(rng, c.w, C, 1, 0.5));
      if (!c.in_place) env.add("y", output_matrix(c.out, c)), env.add("residual_out", output_matrix(c.res, c));
      env.add("rstd", Buf::vector(stat, R, 1));
      Expected y, ro, rs;
      for (int64_t r = 0; r < R; ++r) {
        std::vector<double> h;
        for (int64_t k = 0; k < C; ++k) h.push_back(env["x"].at(r, k) + env["residual"].at(r, k));
        const double rstd = rms_rstd(h, double(1e-6f));  // the eps the call passes, as fp32
        rs.want.push_back(rstd), rs.mag.push_back(rstd);
        for (int64_t k = 0; k < C; ++k) {
          const double wk = c.weight ? env["weight"].at(k) : 1.0;
          ro.want.push_back(h[size_t(k)]);
          ro.mag.push_back(std::abs(env["x"].at(r, k)) + std::abs(env["residual"].at(r, k)));
          y.want.push_back(h[size_t(k)] * rstd * wk);
          y.mag.push_back((std::abs(env["x"].at(r, k)) + std::abs(env["residual"].at(r, k))) * rstd * std::abs(wk));
        }
      }
      want[target_of(c, "y", "x")] = y, want[target_of(c, "residual_out", "residual")] = ro, want["rstd"] = rs;
      outputs = {target_of(c, "y", "x"), target_of(c, "residual_out", "residual"), "rstd"};
      env.upload();
      fused_add_rms_norm(env.mat("x"), env.mat("residual"), env.mat(target_of(c, "y", "x")),
                         env.mat(target_of(c, "residual_out", "residual")), env.vec("weight"), 1e-6f, env.vec("rstd"),
                         opts);
      break;
    }
    case TrainOp::fused_add_rms_norm_backward: {
      env.add("dy", random_matrix(rng, c.in, c, 0, 1));
      if (c.second) env.add("dresidual_out", random_matrix(rng, c.res, c, 0, 1));
      env.add("residual_out", random_matrix(rng, c.res, c, 0.5, 2));
      if (c.weight) env.add("weight", random_vector(rng, c.w, C, 1, 0.5));
      env.add("rstd", Buf::vector(stat, R, 1));
      for (int64_t r = 0; r < R; ++r) env["rstd"].set(r, 0, rms_rstd(row_of(env["residual_out"], r), 1e-6));
      if (!c.in_place) env.add("dx", output_matrix(c.out, c));
      if (c.second && !c.in_place) env.add("dresidual", output_matrix(c.res, c));
      if (c.weight) env.add("dweight", Buf::vector(c.w, C));
      Expected dx, dw;
      rms_norm_backward_ref(env["dy"], env["residual_out"], c.weight ? &env["weight"] : nullptr, env["rstd"],
                            c.second ? &env["dresidual_out"] : nullptr, dx, dw);
      want[target_of(c, "dx", "dy")] = dx;
      outputs.push_back(target_of(c, "dx", "dy"));
      if (c.second)
        want[target_of(c, "dresidual", "dresidual_out")] = dx,
                                       outputs.push_back(target_of(c, "dresidual", "dresidual_out"));
      if (c.weight) want["dweight"] = dw, outputs.push_back("dweight");
      env.upload();
      fused_add_rms_norm_backward(env.mat("dy"), env.mat("dresidual_out"), env.mat("residual_out"), env.vec("weight"),
                                  env.vec("rstd"), env.mat(target_of(c, "dx", "dy")),
                                  c.second ? env.mat(target_of(c, "dresidual", "dresidual_out")) : TensorView{},
                                  env.vec("dweight"), opts);
      break;
    }
    case TrainOp::cross_entropy:
    case TrainOp::cross_entropy_backward:
    case TrainOp::cross_entropy_fused: {
      const CrossEntropyOptions& ce = c.ce;
      env.add("logits", random_matrix(rng, c.in, c, 0, 3));
      Buf target = Buf::vector(c.target, R, 1);
      std::uniform_int_distribution<int64_t> cls(0, C - 1);
      std::uniform_real_distribution<double> u(0, 1);
      for (int64_t r = 0; r < R; ++r) {
        int64_t t = r == 0 ? 0 : r == 1 ? C - 1 : cls(rng);  // the first and the last class
        if (r >= 2 && u(rng) < 0.2) t = ce.ignore_index;
        target.set(r, 0, double(t));
      }
      Buf& z = env["logits"];
      if (c.special) {  // rows of special values, each ignored or not by its target
        const int64_t specials = std::min<int64_t>(R, 7);
        for (int64_t r = 2; r < specials; ++r) {
          const int64_t kind = r - 2;
          if (kind == 0)
            for (int64_t k = 0; k < C; ++k) z.set(r, k, -kInf);  // all -inf
          if (kind == 1) z.set(r, C / 2, kNaN);                  // a NaN
          if (kind == 2)
            for (int64_t k = 0; k < C; k += 2) z.set(r, k, -kInf);  // some -inf, target among them
          if (kind == 2) target.set(r, 0, 0.0);
          if (kind == 3) z.set(r, C - 1, kInf);  // +inf
          if (kind == 4)
            for (int64_t k = 0; k < C; ++k) z.set(r, k, kNaN), target.set(r, 0, double(ce.ignore_index));
        }
      }
      env.add("target", target);
      const bool none = ce.reduction == Reduction::none;
      std::vector<CrossEntropyRow> rows_ref;
      double count = 0;
      for (int64_t r = 0; r < R; ++r) {
        const int64_t t = int64_t(env["target"].at(r));
        rows_ref.push_back(cross_entropy_row(row_of(z, r), t, ce, c.op != TrainOp::cross_entropy));
        count += t != ce.ignore_index;
      }
      // The upstream gradient: per row, or one value.
      if (c.op != TrainOp::cross_entropy && c.second) env.add("dloss", random_vector(rng, c.w, none ? R : 1, 0.5, 1));
      if (c.op == TrainOp::cross_entropy_backward) {
        env.add("lse", Buf::vector(stat, R, 1));
        for (int64_t r = 0; r < R; ++r) env["lse"].set(r, 0, rows_ref[size_t(r)].lse);
        // The gradient from the saved lse, as rounded to its dtype.
        for (int64_t r = 0; r < R; ++r) {
          const double saved = env["lse"].at(r);
          rows_ref[size_t(r)] = cross_entropy_row(row_of(z, r), int64_t(env["target"].at(r)), ce, true, &saved);
        }
      }
      if (c.op != TrainOp::cross_entropy_backward) {
        env.add("loss", Buf::vector(stat, none ? R : 1));
        env.add("lse_out", Buf::vector(stat, R));
        Expected loss, lse;
        double total = 0, total_mag = 0;
        for (const CrossEntropyRow& rr : rows_ref) {
          if (none) loss.want.push_back(rr.loss), loss.mag.push_back(rr.loss_mag);
          total += rr.loss, total_mag += rr.loss_mag;
          lse.want.push_back(rr.lse), lse.mag.push_back(std::abs(rr.lse) + 1);
        }
        if (ce.reduction == Reduction::sum) loss.want = {total}, loss.mag = {total_mag};
        if (ce.reduction == Reduction::mean) loss.want = {total / count}, loss.mag = {total_mag / count};
        want["loss"] = loss, want["lse_out"] = lse;
        outputs.push_back("loss"), outputs.push_back("lse_out");
      }
      if (ce.reduction == Reduction::mean || c.op == TrainOp::cross_entropy) {
        env.add("count", Buf::vector(stat, 1));
        if (c.op != TrainOp::cross_entropy_backward)
          want["count"] = Expected{{count}, {0.0}}, outputs.push_back("count");
        else
          env["count"].set(0, 0, count);
      }
      if (c.op != TrainOp::cross_entropy) {
        const bool in_place = c.in_place;
        if (!in_place) env.add("dlogits", output_matrix(c.out, c));
        Expected g;
        for (int64_t r = 0; r < R; ++r) {
          double scale = c.second ? env["dloss"].at(none ? r : 0) : 1.0;
          if (ce.reduction == Reduction::mean) scale /= count;
          // An ignored row's gradient is exactly 0, also when every row is ignored (1 / count = inf).
          if (int64_t(env["target"].at(r)) == ce.ignore_index) scale = 0;
          for (int64_t k = 0; k < C; ++k) {
            g.want.push_back(scale * rows_ref[size_t(r)].grad[size_t(k)]);
            g.mag.push_back(std::abs(scale) * rows_ref[size_t(r)].grad_mag[size_t(k)]);
          }
        }
        want[in_place ? "logits" : "dlogits"] = g;
        outputs.push_back(in_place ? "logits" : "dlogits");
      }
      env.upload();
      const VectorView count_view = env.vec("count");
      if (c.op == TrainOp::cross_entropy)
        cross_entropy(env.mat("logits"), env.vec("target"), env.vec("loss"), ce, env.vec("lse_out"), count_view, opts);
      else if (c.op == TrainOp::cross_entropy_backward)
        cross_entropy_backward(env.vec("dloss"), env.mat("logits"), env.vec("target"), env.vec("lse"),
                               env.mat(c.in_place ? "logits" : "dlogits"), ce, count_view, opts);
      else
        cross_entropy_fused(env.mat("logits"), env.vec("target"), env.vec("loss"),
                            env.mat(c.in_place ? "logits" : "dlogits"), ce, env.vec("dloss"), env.vec("lse_out"),
                            count_view, opts);
      break;
    }
  }
  env.download();
  return train_result(env, want, outputs, R);
}

inline void expect_train_case_passes(const TrainCase& c, Backend backend) {
  SCOPED_TRACE(c.name());
  const TrainResult r = run_train_case(c, backend);
  EXPECT_TRUE(r.cmp.ok) << r.cmp.mismatches << " of " << r.cmp.checked << " values off; first: " << r.cmp.first;
  if (c.rows > 0) {
    EXPECT_GE(r.cmp.checked, c.rows);
  }
  EXPECT_TRUE(r.outside_untouched) << "memory outside an output's view was written";
}

// The k-th variation of a sweep case (c.rows set): padding, misalignment, weights, second
// operands, special values, target dtype and each cross-entropy option, each on its own cycle
// so that the cases cover their combinations.
inline void vary_by(TrainCase& c, int k) {
  c.pad = k % 4 == 1 ? 5 : 0;
  c.offset = k % 5 == 2 ? 1 : 0;
  c.weight = k % 6 != 3;
  c.second = k % 7 != 4;
  c.special = k % 4 == 2 && c.rows >= 3;
  c.target = k % 2 ? DType::i32 : DType::i64;
  c.ce.reduction = Reduction(k % 3);
  c.ce.label_smoothing = k % 4 == 1 ? 0.1 : 0.0;
  c.ce.z_loss = k % 5 == 3 ? 1e-3 : 0.0;
  if (k % 6 == 2) c.ce.softcap = 15.0;
  c.ce.ignore_index = k % 9 == 7 ? 3 : -100;  // an ignore_index inside [0, cols) too
}

// The seeded sweep: every operator over odd and even column counts from 1 to a few thousand,
// 0 to 17 rows, strided and misaligned rows, each dtype and mixed dtypes, with and without
// weights, in place, special values; for cross-entropy each reduction, label smoothing,
// z_loss, softcap, ignored targets and both target dtypes. `max_cols` bounds the columns (the
// CPU executor is an interpreter); the GPU runs the same cases with a larger bound.
inline std::vector<TrainCase> train_sweep(int64_t max_cols) {
  std::vector<TrainCase> cases;
  uint64_t seed = 7000;
  const DType floats[] = {DType::f32, DType::f16, DType::bf16};
  const int64_t cols_list[] = {1, 2, 3, 7, 31, 33, 100, 257, 1023, 1537, 3001, 4096, 16384, 65537, 262144};
  for (int op = 0; op <= int(TrainOp::cross_entropy_fused); ++op) {
    int i = 0;
    for (int64_t cols : cols_list) {
      if (cols > max_cols) continue;
      for (int64_t rows : {0, 1, 3, 17}) {
        if (rows == 0 && cols != 33) continue;
        if (cols > 4096 && rows > 3) continue;
        TrainCase c;
        c.op = TrainOp(op), c.rows = rows, c.cols = cols, c.seed = seed++;
        const int k = i++;
        c.in = floats[k % 3], c.out = floats[(k / 3) % 3], c.w = floats[(k + 1) % 3], c.res = floats[(k + 2) % 3];
        vary_by(c, k);
        c.in_place = k % 8 == 5 && c.in == c.out;
        if (c.op == TrainOp::fused_add_rms_norm) c.in_place = k % 3 == 1;
        cases.push_back(c);
      }
    }
  }
  return cases;
}

// Float64 calls of every training operator (every float operand f64, statistics f64): odd and
// long rows, strided and misaligned rows, with and without weights and second operands, in
// place, special values, each cross-entropy variant; plus the plan variants. Held to the
// float64 rule (compare): an fp32 step anywhere fails.
inline std::vector<TrainCase> train_sweep_f64(int64_t max_cols) {
  std::vector<TrainCase> cases;
  uint64_t seed = 17000;
  for (int op = 0; op <= int(TrainOp::cross_entropy_fused); ++op) {
    int k = 0;
    for (int64_t cols : {1, 2, 33, 257, 1537, 4096, 65537}) {
      if (cols > max_cols) continue;
      for (int64_t rows : {1, 3, 17}) {
        if (cols > 4096 && rows > 3) continue;
        TrainCase c;
        c.op = TrainOp(op), c.rows = rows, c.cols = cols, c.seed = seed++;
        c.in = c.out = c.w = c.res = DType::f64;
        vary_by(c, k);
        c.in_place = k % 8 == 5 || (c.op == TrainOp::fused_add_rms_norm && k % 3 == 1);
        ++k;
        cases.push_back(c);
      }
    }
    for (const PlanRequest& plan : plan_variants()) {
      TrainCase c;
      c.op = TrainOp(op), c.rows = 17, c.cols = 1537, c.seed = seed++, c.plan = plan;
      c.in = c.out = c.w = c.res = DType::f64;
      if (plan.cache_format == CacheFormat::packed) continue;  // 16-bit input only
      cases.push_back(c);
    }
  }
  return cases;
}

}  // namespace tile::testing
