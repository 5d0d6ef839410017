#include "api/call.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <unordered_map>

#include "backend/cuda/emit_cuda.hpp"
#include "core/sha256.hpp"
#include "ir/printer.hpp"
#include "ir/verifier.hpp"

namespace tile {

namespace {

std::string shape(int64_t rows, int64_t cols, int64_t stride) {
  return "(" + std::to_string(rows) + ", " + std::to_string(cols) + ") with row stride " + std::to_string(stride);
}

// Largest element offset + 1 a view may span: byte offsets of every dtype stay below 2^63 and
// leave room for the kernels' 64-bit index arithmetic.
constexpr int64_t kMaxExtent = (int64_t(1) << 61) - 1;

int64_t extent(const TensorView& t) { return t.rows == 0 ? 0 : (t.rows - 1) * t.row_stride + t.cols; }

void check_matrix(const std::string& op, const char* name, const TensorView& t) {
  if (t.rows < 0) throw_argument_error(op, name, "rows >= 0", std::to_string(t.rows));
  if (t.cols < 1) throw_argument_error(op, name, "cols >= 1", std::to_string(t.cols));
  if (t.cols > kMaxExtent) throw_argument_error(op, name, "cols at most 2^61 - 1", std::to_string(t.cols));
  if (t.row_stride < t.cols)
    throw_argument_error(op, name, "row_stride >= cols = " + std::to_string(t.cols), std::to_string(t.row_stride));
  if (t.rows > 0 && t.data == nullptr) throw_argument_error(op, name, "a non-null data pointer", "null");
  if (t.rows > 1 && t.rows - 1 > (kMaxExtent - t.cols) / t.row_stride)
    throw_argument_error(op, name, "(rows - 1) * row_stride + cols at most 2^61 - 1 elements",
                         shape(t.rows, t.cols, t.row_stride));
  const uintptr_t base = reinterpret_cast<uintptr_t>(t.data);
  if (base % dtype_size(t.dtype) != 0)
    throw_argument_error(op, name, "a pointer aligned to its element size (" + std::to_string(dtype_size(t.dtype)) + " bytes)",
                         "a misaligned pointer");
  if (uintptr_t(extent(t)) * dtype_size(t.dtype) > UINTPTR_MAX - base)
    throw_argument_error(op, name, "a view that ends inside the address space",
                         shape(t.rows, t.cols, t.row_stride) + " at address " + std::to_string(base));
}

void check_vector(const std::string& op, const char* name, const VectorView& v, int64_t cols) {
  if (!v.data) return;
  if (v.size != cols) throw_argument_error(op, name, std::to_string(cols) + " elements (one per column)", std::to_string(v.size));
  const uintptr_t base = reinterpret_cast<uintptr_t>(v.data);
  if (base % dtype_size(v.dtype) != 0)
    throw_argument_error(op, name, "a pointer aligned to its element size", "a misaligned pointer");
  if (uintptr_t(v.size) * dtype_size(v.dtype) > UINTPTR_MAX - base)
    throw_argument_error(op, name, "a vector that ends inside the address space", "one past its end");
}

using i128 = __int128;  // byte offsets and their products, exact
using u128 = unsigned __int128;

// The rows of a view as byte intervals: row r covers [base + r * stride, base + r * stride + width).
struct RowSpans {
  i128 base, stride, width, rows;  // stride >= width >= 1, rows >= 1
};
RowSpans spans_of(const TensorView& t) {
  const int64_t es = dtype_size(t.dtype);
  return {i128(reinterpret_cast<uintptr_t>(t.data)), i128(t.row_stride) * es, i128(t.cols) * es, t.rows};
}
RowSpans spans_of(const VectorView& v) {
  const i128 width = i128(v.size) * dtype_size(v.dtype);
  return {i128(reinterpret_cast<uintptr_t>(v.data)), width, width, 1};
}

i128 floor_div(i128 a, i128 b) { return a / b - (a % b != 0 && a < 0); }  // b > 0
i128 ceil_div(i128 a, i128 b) { return -floor_div(-a, b); }

// sum_{i < n} floor((a * i + b) / m) modulo 2^128 (a, b >= 0, m > 0, a * n + b < 2^127): the
// Euclid-like reduction, O(log m) steps.
u128 floor_sum(u128 n, u128 m, u128 a, u128 b) {
  u128 sum = 0;
  while (n > 0) {
    if (a >= m) sum += (n % 2 == 0 ? n / 2 * (n - 1) : (n - 1) / 2 * n) * (a / m), a %= m;
    if (b >= m) sum += n * (b / m), b %= m;
    const u128 y = a * n + b;
    if (y < m) break;
    n = y / m, b = y % m;
    std::swap(m, a);
  }
  return sum;
}

// Rows ra of a and rb of b share a byte iff rb * Sb lies in I(ra) = [lo + ra * Sa, hi + ra * Sa]
// (lo, hi from the bases and widths). Over the ra whose I(ra) meets [0, E], E the last row's
// offset, an I(ra) reaching past either end holds that end (a row of b); otherwise the question is
// whether some I(ra) holds a multiple of Sb: (hi + ra * Sa) mod Sb <= hi - lo, counted with floor
// sums. Exact, O(log) in the strides, never per row.
bool spans_overlap(const RowSpans& a, const RowSpans& b) {
  if (a.rows <= 0 || b.rows <= 0) return false;
  const i128 d = a.base - b.base;
  const i128 lo = d - b.width + 1, hi = d + a.width - 1, end = (b.rows - 1) * b.stride;
  const i128 first = std::max<i128>(0, ceil_div(-hi, a.stride));
  const i128 last = std::min<i128>(a.rows - 1, floor_div(end - lo, a.stride));
  if (first > last) return false;
  if (lo + first * a.stride < 0 || hi + last * a.stride > end) return true;
  const i128 w = hi - lo, m = b.stride;
  if (w + 1 >= m) return true;  // every interval of m integers holds a multiple of m
  // i = ra - first in [0, n): x_i = c + s * i (mod m); x_i > w iff floor((x_i + m - 1 - w) / m) > floor(x_i / m).
  const i128 n = last - first + 1, s = a.stride % m, c = (hi + first * a.stride) % m;
  const u128 above = floor_sum(n, m, s, c + m - 1 - w) - floor_sum(n, m, s, c);
  return above < u128(n);
}

std::string number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

}  // namespace

bool views_overlap(const TensorView& a, const TensorView& b) { return spans_overlap(spans_of(a), spans_of(b)); }
bool views_overlap(const TensorView& a, const VectorView& b) {
  return b.data != nullptr && spans_overlap(spans_of(a), spans_of(b));
}

std::mutex& prepared_mutex() {
  static std::mutex mutex;
  return mutex;
}
std::unordered_map<std::string, std::shared_ptr<const PreparedKernel>>& prepared_cache() {
  static std::unordered_map<std::string, std::shared_ptr<const PreparedKernel>> cache;
  return cache;
}

float call_eps(const Call& call) {
  if (call.eps) return *call.eps;
  return call.op == Op::layer_norm ? kLayerNormEps : kRmsNormEps;
}

void check_call(const Call& call) {
  const std::string op = op_name(call.op);
  check_matrix(op, "x", call.x);
  check_matrix(op, "y", call.y);
  if (call.y.rows != call.x.rows || call.y.cols != call.x.cols)
    throw_argument_error(op, "y", "shape (" + std::to_string(call.x.rows) + ", " + std::to_string(call.x.cols) + ") like x",
                         "(" + std::to_string(call.y.rows) + ", " + std::to_string(call.y.cols) + ")");
  const bool norm = call.op == Op::rms_norm || call.op == Op::layer_norm;
  if (!norm && call.weight.data) throw_argument_error(op, "weight", "no weight (the operator takes none)", "a weight");
  if (call.op != Op::layer_norm && call.bias.data) throw_argument_error(op, "bias", "no bias (the operator takes none)", "a bias");
  if (!norm && call.eps) throw_argument_error(op, "eps", "no eps (the operator takes none)", number(*call.eps));
  check_vector(op, "weight", call.weight, call.x.cols);
  check_vector(op, "bias", call.bias, call.x.cols);
  if (call.weight.data && call.bias.data && call.weight.dtype != call.bias.dtype)
    throw_argument_error(op, "bias", std::string("the weight's dtype ") + std::string(dtype_name(call.weight.dtype)),
                         std::string(dtype_name(call.bias.dtype)));
  if (norm) {
    float eps = call_eps(call);
    if (!(eps >= 0.0f) || std::isinf(eps)) throw_argument_error(op, "eps", "a finite value >= 0", number(eps));
  }
  // Output may alias the input only exactly (in place: same pointer, stride and dtype); each
  // worker then reads its elements before writing them. Disjoint rows of one buffer (x = b[:, :64],
  // y = b[:, 64:]) do not overlap.
  if (call.x.rows > 0) {
    bool in_place = call.y.data == call.x.data && call.y.row_stride == call.x.row_stride && call.y.dtype == call.x.dtype;
    if (!in_place && views_overlap(call.y, call.x))
      throw_argument_error(op, "y", "memory that does not overlap x, or exactly x (same pointer, stride and dtype)",
                           "a partially overlapping view");
    if (views_overlap(call.y, call.weight))
      throw_argument_error(op, "y", "memory that does not overlap weight", "an overlapping view");
    if (views_overlap(call.y, call.bias))
      throw_argument_error(op, "y", "memory that does not overlap bias", "an overlapping view");
  }
}

float checked_eps(Op op, double eps) {
  // fp32 rounding to nearest errs by at most 2^-24 relative in the normal range; a value that
  // rounds to 0 or inf, or loses more as a subnormal, is not the eps the caller asked for.
  const float f = float(eps);
  const bool held = eps == 0 || (std::isfinite(f) && f > 0 && std::abs(double(f) - eps) <= 0x1p-24 * eps);
  if (!held)
    throw_argument_error(op_name(op), "eps",
                         "0 or a finite positive value that float32 holds within rounding (relative error at most "
                         "2^-24: [1.17549435e-38, 3.40282347e+38] and the subnormals float32 holds exactly)",
                         number(eps));
  return f;
}

PlanInputs plan_inputs(const Call& call) {
  PlanInputs in;
  in.op = call.op;
  in.x_dtype = call.x.dtype;
  in.y_dtype = call.y.dtype;
  in.has_columns = call.weight.data || call.bias.data;
  in.column_dtype = call.weight.data ? call.weight.dtype : call.bias.dtype;
  in.rows = call.x.rows;
  in.cols = call.x.cols;
  in.x_stride = call.x.row_stride;
  in.y_stride = call.y.row_stride;
  uintptr_t bits = reinterpret_cast<uintptr_t>(call.x.data) | reinterpret_cast<uintptr_t>(call.y.data) |
                   reinterpret_cast<uintptr_t>(call.weight.data) | reinterpret_cast<uintptr_t>(call.bias.data);
  in.base_alignment = 16;
  while (in.base_alignment > 1 && bits % in.base_alignment != 0) in.base_alignment /= 2;
  return in;
}

std::shared_ptr<const PreparedKernel> prepare(const Call& call, const PlanRequest& request) {
  check_call(call);
  const PlanInputs in = plan_inputs(call);
  MappingPlan plan = choose_plan(in, request);
  validate_plan(plan, in, DeviceLimits{}, op_name(call.op));

  // A compact key: operator, dtypes, operands and every plan field (no JSON on the hot path).
  std::string key;
  key.reserve(64);
  auto put = [&](int v) { key += std::to_string(v), key += ','; };
  put(int(call.op)), put(int(call.x.dtype)), put(int(call.y.dtype));
  put(call.weight.data ? int(call.weight.dtype) : -1), put(call.bias.data ? int(call.bias.dtype) : -1);
  put(plan.programs_per_group), put(plan.workers_per_program), put(int(plan.width_mode)), put(plan.vector_elems);
  put(plan.stripes), put(plan.stripe_unroll), put(int(plan.caching)), put(plan.private_budget);
  put(int(plan.barrier_scope)), put(int(plan.tail)), put(int(plan.alignment)), put(int(plan.cache_format));

  std::lock_guard<std::mutex> lock(prepared_mutex());
  auto& cache = prepared_cache();
  if (auto it = cache.find(key); it != cache.end()) return it->second;

  RowProgram program = make_program(call.op, call.weight.data != nullptr, call.bias.data != nullptr);
  KernelSignature sig{call.x.dtype, call.y.dtype, {}};
  for (const std::string& c : program.columns()) sig.columns.push_back(c == "weight" ? call.weight.dtype : call.bias.dtype);
  // The passes, in order: lower, verify, emit. TILE_DUMP_IR=1 prints the spec, the plan and
  // the IR after lowering to stderr, once per prepared kernel.
  auto prepared = std::make_shared<PreparedKernel>();
  prepared->plan = plan;
  prepared->kernel = lower_row_program(program, sig, plan);
  if (const char* dump = std::getenv("TILE_DUMP_IR"); dump && std::string(dump) != "0")
    std::fprintf(stderr, "%s\nplan %s\n%s%s\n", program.to_string().c_str(), plan.to_json().c_str(),
                 plan.loop_nest().c_str(), ir::to_string(prepared->kernel).c_str());
  ir::verify_or_throw(prepared->kernel);
  prepared->source = cuda::emit_cuda(prepared->kernel, "// Generated by Tile. " + op_name(call.op) + ", plan " + plan.to_json());
  prepared->source_sha256 = sha256_hex(prepared->source);
  return cache.emplace(key, std::move(prepared)).first->second;
}

MappingPlan plan_for(const Call& call, const PlanRequest& request) { return prepare(call, request)->plan; }

std::string source_for(const Call& call, const PlanRequest& request) { return prepare(call, request)->source; }

}  // namespace tile
