// The float64 evaluation of a row program: what a program means, with every value exact to
// double precision. Reductions fold a whole axis as one chunk of the monoid; the kernels'
// per-worker chunks and merges must agree with it (tests/lower/lower_row_program_test.cpp).
#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <random>
#include <sstream>

#include "bind/bind.hpp"
#include "tile/tile.hpp"

namespace tile {

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

double apply(UnaryFn fn, double a) {
  switch (fn) {
    case UnaryFn::neg: return -a;
    case UnaryFn::exp: return std::exp(a);
    case UnaryFn::log: return std::log(a);
    case UnaryFn::sqrt: return std::sqrt(a);
    case UnaryFn::rsqrt: return 1.0 / std::sqrt(a);
    case UnaryFn::abs: return std::abs(a);
    case UnaryFn::tanh: return std::tanh(a);
    case UnaryFn::logical_not: return a == 0 ? 1 : 0;
    case UnaryFn::to_f32: return a;
    case UnaryFn::exponent: return a == 0 || !std::isfinite(a) ? 0.0 : double(std::ilogb(a));
  }
  return kNaN;
}

// f64: the program computes in a float64 call (ldexp's exponent clamp is then the f64 one).
double apply(BinaryFn fn, double a, double b, bool f64) {
  switch (fn) {
    case BinaryFn::add: return a + b;
    case BinaryFn::sub: return a - b;
    case BinaryFn::mul: return a * b;
    case BinaryFn::div: return a / b;
    case BinaryFn::max: return std::isnan(a) || std::isnan(b) ? kNaN : std::max(a, b);
    case BinaryFn::min: return std::isnan(a) || std::isnan(b) ? kNaN : std::min(a, b);
    case BinaryFn::lt: return a < b;
    case BinaryFn::le: return a <= b;
    case BinaryFn::eq: return a == b;
    case BinaryFn::ne: return a != b;
    case BinaryFn::logical_and: return a != 0 && b != 0;
    case BinaryFn::logical_or: return a != 0 || b != 0;
    case BinaryFn::ldexp: {
      const double limit = f64 ? 3000.0 : 1000.0;
      return std::isnan(b) ? b : std::ldexp(a, int(std::clamp(b, -limit, limit)));
    }
  }
  return kNaN;
}

// Simulated rounding, for the tolerance's estimate of how far the call's arithmetic may move
// an output: with a generator, each inexact operation's result moves by one rounding up or
// down at random — u |result| for IEEE operations (u the unit roundoff of the call's
// precision), 2u for the library functions (CUDA's expf, logf, tanhf and rsqrtf are within
// 2 ulp), u Σ|terms| for a sum — and the exact ones (neg, abs, max, min, select, comparisons,
// ldexp, exponent) stay exact. Without a generator every value is exact.
class Rounding {
 public:
  Rounding(double u, std::mt19937_64* rng) : u_(u), rng_(rng) {}
  double apply(double r, double ulps) { return rng_ && ulps > 0 && std::isfinite(r) ? r + sign() * ulps * u_ * std::abs(r) : r; }
  double sum(double s, double terms) { return rng_ && std::isfinite(s) ? s + sign() * u_ * terms : s; }
  static double ulps(UnaryFn fn, double r) {
    switch (fn) {
      case UnaryFn::sqrt: return 1;
      case UnaryFn::to_f32: return std::abs(r) >= 0x1p24 ? 1 : 0;  // integers from 2^24 on round
      case UnaryFn::exp:
      case UnaryFn::log:
      case UnaryFn::rsqrt:
      case UnaryFn::tanh: return 2;
      default: return 0;
    }
  }
  static double ulps(BinaryFn fn) {
    return fn == BinaryFn::add || fn == BinaryFn::sub || fn == BinaryFn::mul || fn == BinaryFn::div ? 1 : 0;
  }

 private:
  double sign() { return (*rng_)() & 1 ? 1.0 : -1.0; }
  double u_;
  std::mt19937_64* rng_;
};

double rounded(Rounding& rounding, UnaryFn fn, double a) {
  const double r = apply(fn, a);
  return rounding.apply(r, Rounding::ulps(fn, r));
}
double rounded(Rounding& rounding, BinaryFn fn, double a, double b, bool f64) {
  return rounding.apply(apply(fn, a, b, f64), Rounding::ulps(fn));
}

// A monoid's chunk graph over elements[input][e], all valid.
std::vector<double> chunk(const Monoid& m, const std::vector<std::vector<double>>& elements, bool f64, Rounding& rounding) {
  const size_t n = elements.empty() ? 0 : elements[0].size();
  std::vector<std::vector<double>> elem(m.nodes.size());  // element-level values
  std::vector<double> value(m.nodes.size(), kNaN);
  std::vector<char> done(m.nodes.size(), 0);
  std::function<void(int)> eval = [&](int id) {
    if (done[id]) return;
    const MonoidNode& x = m.nodes[id];
    for (int o : {x.a, x.b, x.c})
      if (o >= 0) eval(o);
    auto at = [&](int o, size_t e) { return m.nodes[o].element ? elem[o][e] : value[o]; };
    if (x.element) {
      elem[id].resize(n);
      for (size_t e = 0; e < n; ++e) {
        switch (x.kind) {
          case MonoidNode::Kind::element: elem[id][e] = elements[x.index][e]; break;
          case MonoidNode::Kind::unary: elem[id][e] = rounded(rounding, x.unary, at(x.a, e)); break;
          case MonoidNode::Kind::binary: elem[id][e] = rounded(rounding, x.binary, at(x.a, e), at(x.b, e), f64); break;
          case MonoidNode::Kind::select: elem[id][e] = at(x.a, e) != 0 ? at(x.b, e) : at(x.c, e); break;
          default: TILE_CHECK(false, "element-level node of kind ", int(x.kind));
        }
      }
    } else {
      switch (x.kind) {
        case MonoidNode::Kind::count: value[id] = double(n); break;
        case MonoidNode::Kind::constant: value[id] = x.value_in(f64); break;
        case MonoidNode::Kind::chunk_sum: {
          double s = 0, terms = 0;
          for (size_t e = 0; e < n; ++e) s += at(x.a, e), terms += std::abs(at(x.a, e));
          value[id] = rounding.sum(s, terms);
          break;
        }
        case MonoidNode::Kind::chunk_max: {
          double s = -std::numeric_limits<double>::infinity();
          for (size_t e = 0; e < n; ++e) s = apply(BinaryFn::max, s, at(x.a, e), f64);
          value[id] = s;
          break;
        }
        case MonoidNode::Kind::unary: value[id] = rounded(rounding, x.unary, value[x.a]); break;
        case MonoidNode::Kind::binary: value[id] = rounded(rounding, x.binary, value[x.a], value[x.b], f64); break;
        case MonoidNode::Kind::select: value[id] = value[x.a] != 0 ? value[x.b] : value[x.c]; break;
        default: TILE_CHECK(false, "state node in a chunk graph");
      }
    }
    done[id] = 1;
  };
  std::vector<double> state;
  for (int id : m.chunk) {
    eval(id);
    state.push_back(value[id]);
  }
  return state;
}

class Evaluator {
 public:
  // magnitudes: every sum of |terms|; rng: simulated rounding (Rounding).
  Evaluator(const RowProgram& p, const BoundCall& call, bool magnitudes, std::mt19937_64* rng = nullptr)
      : p_(p), call_(call), magnitudes_(magnitudes), rounding_(call.f64 ? 0x1p-53 : 0x1p-24, rng) {}

  Reference run() {
    const auto& decls = p_.operands();
    const int64_t rows = call_.rows, cols = call_.cols;
    std::vector<std::vector<std::vector<double>>> rows_inputs(p_.reductions().size());  // [red][input][r*cols+c or r]
    Reference out;
    for (size_t i = 0; i < decls.size(); ++i) {
      if (!is_output(decls[i].role) || !call_.operands[i].present) continue;
      const int64_t n = decls[i].role == Role::row_out ? rows * cols
                        : decls[i].role == Role::row_scalar_out ? rows
                        : decls[i].role == Role::col_out ? cols
                                                         : 1;
      out[decls[i].name].values.assign(size_t(n), kNaN);
    }
    for (int64_t r = 0; r < rows; ++r) {
      row_ = r;
      values_.assign(p_.nodes().size(), {});
      for (const RowStore& s : p_.stores()) {
        const OperandDecl& d = decls[s.operand];
        if (!call_.operands[s.operand].present) continue;
        if (d.role == Role::row_out) {
          const std::vector<double>& v = eval(s.value);
          for (int64_t c = 0; c < cols; ++c) out[d.name].values[size_t(r * cols + c)] = at(v, c);
        } else if (d.role == Role::row_scalar_out) {
          out[d.name].values[size_t(r)] = eval(s.value)[0];
        }
      }
      for (size_t red = 0; red < p_.reductions().size(); ++red) {
        const RowReduction& rr = p_.reductions()[red];
        if (rr.axis != Axis::rows) continue;
        rows_inputs[red].resize(rr.inputs.size());
        for (size_t k = 0; k < rr.inputs.size(); ++k) {
          const std::vector<double>& v = eval(rr.inputs[k]);
          const bool elem = p_.nodes()[rr.inputs[k]].shape.cols;
          for (int64_t c = 0; c < (elem ? cols : 1); ++c) {
            double x = at(v, c);
            rows_inputs[red][k].push_back(term(rr, x));
          }
        }
      }
    }
    // Reductions over the rows, one chunk per column; then the outputs built on them.
    rows_results_.assign(p_.reductions().size(), {});
    for (size_t red = 0; red < p_.reductions().size(); ++red) {
      const RowReduction& rr = p_.reductions()[red];
      if (rr.axis != Axis::rows) continue;
      const bool elem = p_.nodes()[rr.inputs[0]].shape.cols;
      const int64_t width = elem ? cols : 1;
      rows_results_[red].resize(size_t(width));
      for (int64_t c = 0; c < width; ++c) {
        std::vector<std::vector<double>> inputs(rr.inputs.size());
        for (size_t k = 0; k < rr.inputs.size(); ++k)
          for (int64_t r = 0; r < rows; ++r) inputs[k].push_back(rows_inputs[red][k].empty() ? 0.0 : rows_inputs[red][k][size_t(r * width + c)]);
        rows_results_[red][size_t(c)] = chunk(rr.monoid, inputs, call_.f64, rounding_);
      }
    }
    row_ = -1;
    values_.assign(p_.nodes().size(), {});
    for (const RowStore& s : p_.stores()) {
      const OperandDecl& d = decls[s.operand];
      if (!call_.operands[s.operand].present || (d.role != Role::col_out && d.role != Role::scalar_out)) continue;
      const std::vector<double>& v = eval(s.value);
      for (size_t c = 0; c < out[d.name].values.size(); ++c) out[d.name].values[c] = at(v, int64_t(c));
    }
    // An i64 value stored to an i32 output keeps its low 32 bits, as the kernels' conversion
    // does (and torch's); i64 values are exact here up to 2^53.
    for (size_t i = 0; i < decls.size(); ++i) {
      if (!is_output(decls[i].role) || !call_.operands[i].present || call_.operands[i].dtype != DType::i32) continue;
      for (double& v : out[decls[i].name].values)
        if (std::isfinite(v) && std::abs(v) < 0x1p63) v = double(int32_t(uint32_t(uint64_t(int64_t(v)))));
    }
    return out;
  }

 private:
  // A reduction's input as folded: in the magnitude evaluation a sum takes |terms|, since its
  // rounding error scales with them, which a cancelling sum (a mean near 0 of terms near 1)
  // hides from its result.
  double term(const RowReduction& rr, double x) const {
    return magnitudes_ && rr.monoid.name == "sum" ? std::abs(x) : x;
  }
  // v holds one value (uniform or per-row) or one per column.
  static double at(const std::vector<double>& v, int64_t c) { return v.size() == 1 ? v[0] : v[size_t(c)]; }

  const std::vector<double>& eval(int id) {
    std::vector<double>& v = values_[id];
    if (!v.empty()) return v;
    const RowNode& n = p_.nodes()[id];
    const int64_t cols = call_.cols;
    const int64_t width = n.shape.cols ? cols : 1;
    std::vector<double> result(size_t(width), kNaN);
    switch (n.kind) {
      case RowNode::Kind::load: {
        const BoundOperand& b = call_.operands[n.operand];
        const Role role = p_.operands()[n.operand].role;
        for (int64_t c = 0; c < width; ++c) {
          if (!b.present) {
            result[c] = n.value;
            continue;
          }
          int64_t e = 0;
          if (role == Role::row_in) e = row_ * b.stride + c;
          else if (role == Role::row_scalar_in) e = row_ * b.stride;
          else if (role == Role::col_in) e = c;
          // A kernel reads float scalars as fp32, or as doubles in a float64 call.
          if (role == Role::scalar_in) result[c] = n.type == ValueType::f32 && !call_.f64 ? double(float(b.value)) : b.value;
          else result[c] = is_float(b.dtype) ? double(load_as_double(b.data, e, b.dtype)) : double(load_as_int(b.data, e, b.dtype));
        }
        break;
      }
      case RowNode::Kind::constant:
        result[0] = n.type != ValueType::f32 ? n.value : call_.f64 ? n.value_in(true) : double(float(n.value));
        break;
      case RowNode::Kind::cols: result[0] = double(cols); break;
      case RowNode::Kind::col_index:
        for (int64_t c = 0; c < width; ++c) result[c] = double(c);
        break;
      case RowNode::Kind::unary: {
        const std::vector<double> a = eval(n.a);
        for (int64_t c = 0; c < width; ++c) result[c] = rounded(rounding_, n.unary, at(a, c));
        break;
      }
      case RowNode::Kind::binary: {
        const std::vector<double> a = eval(n.a), b = eval(n.b);
        for (int64_t c = 0; c < width; ++c) result[c] = rounded(rounding_, n.binary, at(a, c), at(b, c), call_.f64);
        break;
      }
      case RowNode::Kind::select: {
        const std::vector<double> k = eval(n.a), a = eval(n.b), b = eval(n.c);
        for (int64_t c = 0; c < width; ++c) result[c] = at(k, c) != 0 ? at(a, c) : at(b, c);
        break;
      }
      case RowNode::Kind::result: {
        const RowReduction& rr = p_.reductions()[n.reduction];
        if (rr.axis == Axis::rows) {
          for (int64_t c = 0; c < width; ++c) result[c] = rows_results_[n.reduction][size_t(c)][n.part];
        } else {
          std::vector<std::vector<double>> inputs;
          for (int in : rr.inputs) {
            inputs.push_back(eval(in));
            for (double& x : inputs.back()) x = term(rr, x);
          }
          result[0] = chunk(rr.monoid, inputs, call_.f64, rounding_)[n.part];
        }
        break;
      }
    }
    return v = std::move(result);
  }

  const RowProgram& p_;
  const BoundCall& call_;
  bool magnitudes_;
  Rounding rounding_;
  int64_t row_ = -1;
  std::vector<std::vector<double>> values_;
  std::vector<std::vector<std::vector<double>>> rows_results_;  // [red][col] -> state
};

}  // namespace

// Four evaluations with simulated rounding; the tolerance allows twice the largest change they
// show. Over 3000 random programs (tests/lower, seeds 60000 and 80000, 20,000 program x plan
// cases) the largest excess of a kernel's error over the other terms was 0.31 of that change.
constexpr int kRoundingRuns = 4;
constexpr double kRoundingAllowance = 2.0;

Reference reference(const RowProgram& program, const Args& args) {
  const BoundCall call = bind(program, args);
  Reference ref = Evaluator(program, call, false).run();
  // The magnitude fp32 rounding errors scale with: per row, the largest finite |value| of the
  // output and of the same program with every sum (over the rows or along a row) taken of
  // |terms|.
  const Reference mag = Evaluator(program, call, true).run();
  for (auto& [name, out] : ref) {
    const Role role = program.operands()[program.find_operand(name)].role;
    out.scale.assign(out.values.size(), 0.0);
    const int64_t width = role == Role::row_out ? call.cols : int64_t(out.values.size());
    for (size_t start = 0; start < out.values.size(); start += size_t(std::max<int64_t>(width, 1))) {
      double m = 0;
      for (size_t i = start; i < start + size_t(width) && i < out.values.size(); ++i) {
        if (std::isfinite(out.values[i])) m = std::max(m, std::abs(out.values[i]));
        if (std::isfinite(mag.at(name).values[i])) m = std::max(m, std::abs(mag.at(name).values[i]));
      }
      for (size_t i = start; i < start + size_t(width) && i < out.values.size(); ++i) out.scale[i] = m;
    }
    out.error.assign(out.values.size(), 0.0);
  }
  // How far the call's roundings may move each output: the largest change over a few
  // evaluations with simulated rounding (Rounding), from fixed seeds so a reference is the
  // same every time. It follows cancellation wherever it happens (log(1 + tiny), the
  // difference of two near values), which the magnitude term above sees only inside sums.
  for (int run = 0; run < kRoundingRuns; ++run) {
    std::mt19937_64 rng(uint64_t(run) + 1);
    const Reference moved = Evaluator(program, call, false, &rng).run();
    for (auto& [name, out] : ref)
      for (size_t i = 0; i < out.values.size(); ++i) {
        const double want = out.values[i], got = moved.at(name).values[i];
        if (!std::isfinite(want)) continue;
        out.error[i] = std::max(out.error[i], std::isfinite(got) ? std::abs(got - want) : std::numeric_limits<double>::infinity());
      }
  }
  return ref;
}

OracleCheck check_against_reference(const RowProgram& program, const Args& args) {
  return check_against_reference(program, args, reference(program, args));
}

OracleCheck check_against_reference(const RowProgram& program, const Args& args, const Reference& ref) {
  const BoundCall call = bind(program, args);
  OracleCheck check;
  for (const auto& [name, out] : ref) {
    const int i = program.find_operand(name);
    const BoundOperand& b = call.operands[i];
    const Role role = program.operands()[i].role;
    // As check_against: rtol for the output dtype's rounding plus fp32 arithmetic, atol
    // relative to the row's (vector's) magnitude; sums over the rows add sqrt(rows) roundings.
    // Then twice the change simulated rounding made (reference(): cancellation anywhere).
    double rtol = 2e-5, atol = 1e-6, floor = 0;
    if (b.dtype == DType::f16) rtol = 1.5e-3, atol = 1e-4, floor = 6e-8;
    if (b.dtype == DType::bf16) rtol = 8e-3, atol = 1e-4, floor = 1e-38;
    if (b.dtype == DType::f64) rtol = 2e-5 * 0x1p-29, atol = 1e-6 * 0x1p-29;  // the same ulps as fp32's
    if (role == Role::col_out || role == Role::scalar_out) atol *= 4 * std::sqrt(double(std::max<int64_t>(call.rows, 1)));
    const bool integer = !is_float(b.dtype);
    for (size_t k = 0; k < out.values.size(); ++k) {
      int64_t e = int64_t(k);
      if (role == Role::row_out) e = int64_t(k) / call.cols * b.stride + int64_t(k) % call.cols;
      if (role == Role::row_scalar_out) e = int64_t(k) * b.stride;
      const double want = out.values[k];
      const double got = integer ? double(load_as_int(b.data, e, b.dtype)) : double(load_as_double(b.data, e, b.dtype));
      // Values beyond the output dtype's range round to +-inf: compared after clamping both.
      const double limit = overflow_threshold(b.dtype);
      const double want_c = std::clamp(want, -limit, limit), got_c = std::clamp(got, -limit, limit);
      const double tol =
          integer ? 0.0 : rtol * std::abs(want_c) + atol * out.scale[k] + floor + kRoundingAllowance * out.error[k];
      const double err = std::abs(got_c - want_c);
      const bool ok = std::isnan(want) ? std::isnan(got) : (std::isinf(want) ? got == want : !std::isnan(got) && err <= tol);
      ++check.checked;
      if (std::isfinite(want_c) && std::isfinite(got_c)) {  // an overflow counts to the dtype's threshold
        check.max_abs_error = std::max(check.max_abs_error, err);
        if (want_c != 0) check.max_rel_error = std::max(check.max_rel_error, err / std::abs(want_c));
      }
      if (!ok) {
        if (check.mismatches++ == 0) {
          std::ostringstream os;
          os.precision(9);
          os << name << "[" << k << "]: got " << got << ", want " << want << " (tolerance " << tol << ")";
          check.first_mismatch = os.str();
        }
        check.ok = false;
      }
    }
  }
  return check;
}

}  // namespace tile
