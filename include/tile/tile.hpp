// Tile: generated GPU kernels for row programs (softmax, RMSNorm, LayerNorm, and your own).
//
//   tile::softmax(x, y);                               // CUDA backend, analytic plan
//   tile::rms_norm(x, y, w, 1e-6f, {.plan = req});      // fields of `req` fixed, the rest analytic
//   tile::run(call, {.backend = tile::Backend::cpu});   // the same kernel on the CPU backend
//
//   tile::RowProgram p = ...;                           // a program of your own (spec.hpp)
//   tile::run(p, tile::Args().set("x", x).set("y", y)); // bound by operand name
//
// Tensors are views: device pointers for the CUDA backend, host pointers for the CPU backend.
// Rows may be strided (row_stride >= cols); the last dimension is contiguous.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "tile/dtype.hpp"
#include "tile/error.hpp"
#include "tile/monoid.hpp"
#include "tile/plan.hpp"
#include "tile/policy.hpp"
#include "tile/spec.hpp"
#include "tile/tensor.hpp"

namespace tile {

enum class Backend : uint8_t { cuda, cpu };

// Doubles: a float64 call reads eps as a double, an fp32 kernel as the nearest float.
constexpr double kRmsNormEps = 1e-6;
constexpr double kLayerNormEps = 1e-5;

// The operands of one call of a row program, by name. Row operands take a TensorView;
// per-column, per-row and scalar outputs a VectorView; scalar inputs a number. Operands left
// out are absent (optional ones) or take their declared default (scalars).
class Args {
 public:
  using Value = std::variant<TensorView, VectorView, double>;
  Args& set(const std::string& name, const TensorView& v) { return put(name, v); }
  Args& set(const std::string& name, const VectorView& v) { return put(name, v); }
  Args& set(const std::string& name, double v) { return put(name, v); }
  const std::map<std::string, Value>& values() const { return values_; }

 private:
  Args& put(const std::string& name, Value v) {
    values_[name] = std::move(v);
    return *this;
  }
  std::map<std::string, Value> values_;
};

// One application of a built-in operator: x in, y out; weight and bias (optional, norms only);
// eps defaults to the operator's (kRmsNormEps, kLayerNormEps).
struct Call {
  Op op = Op::softmax;
  TensorView x, y;
  VectorView weight, bias;
  std::optional<double> eps;  // a float64 call reads it as given; the others as the nearest float
};
// The same call as operands of builtin_program(call.op).
Args to_args(const Call& call);

// The fp32 eps for an eps given as a double (by Python or a command line): 0, or a finite
// positive value that fp32 holds to within rounding (relative error at most 2^-24). Throws
// tile::Error naming `op` for anything else: negative, NaN, infinite, beyond FLT_MAX, or so
// small that it would round to 0 (1e-50) or to a coarse subnormal (1e-40).
float checked_eps(Op op, double eps);

struct CallOptions {
  PlanRequest plan;        // fields to fix; unset ones come from the analytic policy
  void* stream = nullptr;  // CUstream / cudaStream_t; nullptr is the default stream
  Backend backend = Backend::cuda;
  int device = 0;          // used when no CUDA context is current
  // Scratch memory for the partials of reductions over the rows, of workspace_size bytes
  // (workspace_bytes() says how many a call needs; most need none and ignore it): device memory
  // of the call's context for the CUDA backend, host memory for the CPU backend, aligned to 4
  // bytes (8 for a float64 call), and used by no other call running at the same time; what it holds before the call
  // does not matter. nullptr: the library's own — on CUDA one buffer per (context,
  // stream), allocated by the first call that needs it, which cannot happen during a CUDA-graph
  // capture (docs/source/python.md, "CUDA graphs").
  void* workspace = nullptr;
  size_t workspace_size = 0;
};

// What a call launched, for logs and benchmark records.
struct LaunchRecord {
  MappingPlan plan;
  std::string kernel_name;
  std::string ir_sha256;      // the raw IR the call ran (both backends), as ir_for prints it
  std::string source_sha256;  // CUDA backend only: the generated source
  std::string cubin_sha256;   // empty on the CPU backend
  std::string arch;           // e.g. sm_90; empty on the CPU backend
  int64_t groups = 0;
  int threads_per_group = 0;
  int shared_bytes = 0;       // a group's shared memory: its merges' slots and, caching "shared", its staged row
  int kernels = 1;            // launches: 2 when reductions over the rows need a second phase
  int64_t workspace_bytes = 0;
  int64_t bytes_loaded = 0;   // CPU backend only: bytes its loads actually read
  // CPU backend only: the row kernel's accesses (loads and stores, per worker) that took the
  // vector path, and its single-element ones.
  int64_t vector_accesses = 0, scalar_accesses = 0;
  // CUDA backend: how the kernel binary was obtained by this call ("compiled", "memory",
  // "disk"; "launch-cache" when the call reused an already loaded kernel), its NVRTC time and
  // options.
  std::string cache_origin;
  double compile_ms = 0;
  std::vector<std::string> compile_options;
};

LaunchRecord run(const RowProgram& program, const Args& args, const CallOptions& options = {});
LaunchRecord run(const Call& call, const CallOptions& options = {});

// The bytes of workspace (CallOptions::workspace) a call with these arguments and options needs:
// 0 unless the program reduces over the rows (weight gradients, reduced losses), else one slot
// of fp32 partials (fp64 in a float64 call) per program of the launch, so it depends on the shapes, the plan and the
// device (its SM count). Binds and plans like run(); launches nothing and needs no GPU.
int64_t workspace_bytes(const RowProgram& program, const Args& args, const CallOptions& options = {});
int64_t workspace_bytes(const Call& call, const CallOptions& options = {});

void softmax(const TensorView& x, const TensorView& y, const CallOptions& options = {});
void log_softmax(const TensorView& x, const TensorView& y, const CallOptions& options = {});
void rms_norm(const TensorView& x, const TensorView& y, const VectorView& weight = {},
              double eps = kRmsNormEps, const CallOptions& options = {});
void layer_norm(const TensorView& x, const TensorView& y, const VectorView& weight = {},
                const VectorView& bias = {}, double eps = kLayerNormEps,
                const CallOptions& options = {});

// Introspection: the plan a call would launch, its raw IR and its CUDA source. They bind and
// check the call's arguments like run() but need no GPU.
MappingPlan plan_for(const RowProgram& program, const Args& args, const PlanRequest& request = {});
std::string ir_for(const RowProgram& program, const Args& args, const PlanRequest& request = {});
std::string source_for(const RowProgram& program, const Args& args, const PlanRequest& request = {});
MappingPlan plan_for(const Call& call, const PlanRequest& request = {});
std::string ir_for(const Call& call, const PlanRequest& request = {});
std::string source_for(const Call& call, const PlanRequest& request = {});

// Forgets every lowered, compiled and loaded kernel of this process (the on-disk cache is
// separate: see TILE_CACHE_DIR / TILE_DISABLE_DISK_CACHE). The next call of each kernel
// lowers and compiles it afresh. Safe while other threads run calls (those finish with the
// kernels they hold); run() and the other entry points are thread-safe.
void clear_kernel_caches();

// ---- references ----

// The float64 reference of a built-in call: y_ref[r * cols + c] for host pointers. Written
// independently of the row programs (src/api/oracle.cpp).
std::vector<double> oracle(const Call& call);

// The float64 evaluation of any row program over host operands (src/spec/evaluate.cpp): for
// each present output, its values in row-major order (row scalars one per row, columns one
// per column, scalars one value); per value the magnitude its fp32 rounding error scales
// with (the largest |value| of its row, or for sums over the rows the sum of |terms|); and
// per value how far the call's roundings move it: the largest change over four evaluations in
// which every inexact operation's result moves by one rounding up or down at random (fixed
// seeds), which follows cancellation outside sums (log(1 + tiny), a difference of near values).
struct ReferenceOutput {
  std::vector<double> values;
  std::vector<double> scale;
  std::vector<double> error;
};
using Reference = std::map<std::string, ReferenceOutput>;
Reference reference(const RowProgram& program, const Args& args);

struct OracleCheck {
  bool ok = true;
  int64_t checked = 0, mismatches = 0;
  double max_abs_error = 0, max_rel_error = 0;
  std::string first_mismatch;  // "row r col c: got g, want w (tolerance t)"
};
// Compares the output a call wrote (host memory, call.y) with the oracle, element by element:
// NaN where and only where ref is NaN, the same infinity where ref is infinite, otherwise
// |y - ref| <= rtol*|ref| + atol*max|ref in row| + floor after clamping both to the output
// dtype's range, with rtol growing by one fp32 unit roundoff per step of the plan's
// merge_depth and, for LayerNorm, an allowance for the fp32 rounding of the mean amplified by
// 1 / sqrt(var + eps) (docs/source/numerics.md gives the rule; a float64 call is held to it
// in units of fp64). Without a plan, the plan the
// policy chooses for the call.
OracleCheck check_against_oracle(const Call& call);
OracleCheck check_against_oracle(const Call& call, const MappingPlan& plan);
// The same comparison against a reference computed earlier by oracle() for the same inputs
// (for checking many plans of one call without recomputing it).
OracleCheck check_against(const Call& call, const std::vector<double>& reference);
OracleCheck check_against(const Call& call, const std::vector<double>& reference, const MappingPlan& plan);
// The longest chain of fp32 roundings a reduction's partial goes through under `plan` for rows
// of `cols`: the elements a worker combines in sequence plus the butterfly levels.
int merge_depth(const MappingPlan& plan, int64_t cols);
// Every present output of a row program (host memory) against reference(program, args), with
// the same rule plus twice the reference's `error`; per-column and scalar outputs reduced over
// many rows get a tolerance that grows with the square root of the row count.
OracleCheck check_against_reference(const RowProgram& program, const Args& args);
OracleCheck check_against_reference(const RowProgram& program, const Args& args, const Reference& reference);

}  // namespace tile
