#include "api/call.hpp"

#include <cmath>
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

struct ByteRange {
  uintptr_t lo = 0, hi = 0;
  bool overlaps(const ByteRange& o) const { return lo < o.hi && o.lo < hi; }
};
ByteRange range_of(const TensorView& t) {
  if (t.rows == 0) return {};
  uintptr_t lo = reinterpret_cast<uintptr_t>(t.data);
  return {lo, lo + uintptr_t(((t.rows - 1) * t.row_stride + t.cols) * dtype_size(t.dtype))};
}
ByteRange range_of(const VectorView& v) {
  uintptr_t lo = reinterpret_cast<uintptr_t>(v.data);
  return {lo, v.data ? lo + uintptr_t(v.size * dtype_size(v.dtype)) : lo};
}

void check_matrix(const std::string& op, const char* name, const TensorView& t) {
  if (t.rows < 0) throw_argument_error(op, name, "rows >= 0", std::to_string(t.rows));
  if (t.cols < 1) throw_argument_error(op, name, "cols >= 1", std::to_string(t.cols));
  if (t.row_stride < t.cols)
    throw_argument_error(op, name, "row_stride >= cols = " + std::to_string(t.cols), std::to_string(t.row_stride));
  if (t.rows > 0 && t.data == nullptr) throw_argument_error(op, name, "a non-null data pointer", "null");
  // The last element's offset must fit in 64 bits with room for index arithmetic.
  if (t.rows > 0 && (t.rows - 1) > (INT64_MAX / 4 - t.cols) / t.row_stride)
    throw_argument_error(op, name, "(rows - 1) * row_stride + cols below 2^61 elements", shape(t.rows, t.cols, t.row_stride));
  if (reinterpret_cast<uintptr_t>(t.data) % dtype_size(t.dtype) != 0)
    throw_argument_error(op, name, "a pointer aligned to its element size (" + std::to_string(dtype_size(t.dtype)) + " bytes)",
                         "a misaligned pointer");
}

void check_vector(const std::string& op, const char* name, const VectorView& v, int64_t cols) {
  if (!v.data) return;
  if (v.size != cols) throw_argument_error(op, name, std::to_string(cols) + " elements (one per column)", std::to_string(v.size));
  if (reinterpret_cast<uintptr_t>(v.data) % dtype_size(v.dtype) != 0)
    throw_argument_error(op, name, "a pointer aligned to its element size", "a misaligned pointer");
}

// prepare()'s memo, by operator, dtypes, operands and plan.
struct PreparedCache {
  std::mutex mutex;
  std::unordered_map<std::string, std::shared_ptr<const PreparedKernel>> kernels;
};
PreparedCache& prepared_cache() {
  static PreparedCache cache;
  return cache;
}

}  // namespace

void clear_prepared_kernels() {
  PreparedCache& cache = prepared_cache();
  std::lock_guard<std::mutex> lock(cache.mutex);
  cache.kernels.clear();
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
  if (!norm && call.eps) throw_argument_error(op, "eps", "no eps (the operator takes none)", std::to_string(*call.eps));
  check_vector(op, "weight", call.weight, call.x.cols);
  check_vector(op, "bias", call.bias, call.x.cols);
  if (call.weight.data && call.bias.data && call.weight.dtype != call.bias.dtype)
    throw_argument_error(op, "bias", std::string("the weight's dtype ") + std::string(dtype_name(call.weight.dtype)),
                         std::string(dtype_name(call.bias.dtype)));
  if (norm) {
    float eps = call_eps(call);
    if (!(eps >= 0.0f) || std::isinf(eps)) throw_argument_error(op, "eps", "a finite value >= 0", std::to_string(eps));
  }
  // Output may alias the input only exactly (in place: same pointer, stride and dtype); each
  // worker then reads its elements before writing them.
  if (call.x.rows > 0) {
    ByteRange y = range_of(call.y);
    bool in_place = call.y.data == call.x.data && call.y.row_stride == call.x.row_stride && call.y.dtype == call.x.dtype;
    if (!in_place && y.overlaps(range_of(call.x)))
      throw_argument_error(op, "y", "memory that does not overlap x, or exactly x (same pointer, stride and dtype)",
                           "a partially overlapping view");
    if (call.weight.data && y.overlaps(range_of(call.weight)))
      throw_argument_error(op, "y", "memory that does not overlap weight", "an overlapping view");
    if (call.bias.data && y.overlaps(range_of(call.bias)))
      throw_argument_error(op, "y", "memory that does not overlap bias", "an overlapping view");
  }
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

  PreparedCache& cache = prepared_cache();
  {
    std::lock_guard<std::mutex> lock(cache.mutex);
    if (auto it = cache.kernels.find(key); it != cache.kernels.end()) return it->second;
  }

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
  // Built outside the lock so that calls of other kernels proceed; when two threads build one
  // kernel, the first to insert wins and both return it.
  std::lock_guard<std::mutex> lock(cache.mutex);
  return cache.kernels.emplace(key, std::move(prepared)).first->second;
}

MappingPlan plan_for(const Call& call, const PlanRequest& request) { return prepare(call, request)->plan; }

std::string source_for(const Call& call, const PlanRequest& request) { return prepare(call, request)->source; }

}  // namespace tile
