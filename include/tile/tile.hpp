// Tile: generated GPU kernels for row-wise reductions.
//
//   tile::softmax(x, y);                          // CUDA backend, analytic plan
//   tile::rms_norm(x, y, w, 1e-6f, {.plan = req}); // fields of `req` fixed, the rest analytic
//   tile::run(call, {.backend = tile::Backend::cpu});  // the same kernel on the CPU backend
//
// Tensors are views: device pointers for the CUDA backend, host pointers for the CPU backend.
// Rows may be strided (row_stride >= cols); the last dimension is contiguous.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "tile/dtype.hpp"
#include "tile/error.hpp"
#include "tile/plan.hpp"
#include "tile/policy.hpp"
#include "tile/spec.hpp"
#include "tile/tensor.hpp"

namespace tile {

enum class Backend : uint8_t { cuda, cpu };

constexpr float kRmsNormEps = 1e-6f;
constexpr float kLayerNormEps = 1e-5f;

// One operator application. weight and bias are optional (data == nullptr) and only for the
// norms; eps defaults to the operator's (kRmsNormEps, kLayerNormEps).
struct Call {
  Op op = Op::softmax;
  TensorView x, y;
  VectorView weight, bias;
  std::optional<float> eps;
};

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
};

// What a call launched, for logs and benchmark records.
struct LaunchRecord {
  MappingPlan plan;
  std::string kernel_name;
  std::string source_sha256;
  std::string cubin_sha256;   // empty on the CPU backend
  std::string arch;           // e.g. sm_90; empty on the CPU backend
  int64_t groups = 0;
  int threads_per_group = 0;
  int shared_bytes = 0;
  int64_t bytes_loaded = 0;   // CPU backend only: bytes its loads actually read
  // CUDA backend: how the kernel binary was obtained by this call ("compiled", "memory",
  // "disk"; "launch-cache" when the call reused an already loaded kernel), its NVRTC time and
  // options.
  std::string cache_origin;
  double compile_ms = 0;
  std::vector<std::string> compile_options;
};

LaunchRecord run(const Call& call, const CallOptions& options = {});

void softmax(const TensorView& x, const TensorView& y, const CallOptions& options = {});
void log_softmax(const TensorView& x, const TensorView& y, const CallOptions& options = {});
void rms_norm(const TensorView& x, const TensorView& y, const VectorView& weight = {},
              float eps = kRmsNormEps, const CallOptions& options = {});
void layer_norm(const TensorView& x, const TensorView& y, const VectorView& weight = {},
                const VectorView& bias = {}, float eps = kLayerNormEps,
                const CallOptions& options = {});

// Introspection: the plan a call would launch, its raw IR and its CUDA source. They validate
// the call's arguments like run() but need no GPU.
MappingPlan plan_for(const Call& call, const PlanRequest& request = {});
std::string ir_for(const Call& call, const PlanRequest& request = {});
std::string source_for(const Call& call, const PlanRequest& request = {});

// Forgets every lowered, compiled and loaded kernel of this process (the on-disk cache is
// separate: see TILE_CACHE_DIR / TILE_DISABLE_DISK_CACHE). The next call of each kernel
// lowers and compiles it afresh.
void clear_kernel_caches();

// The float64 reference: y_ref[r * cols + c] for a call whose pointers are host memory.
std::vector<double> oracle(const Call& call);

struct OracleCheck {
  bool ok = true;
  int64_t checked = 0, mismatches = 0;
  double max_abs_error = 0, max_rel_error = 0;
  std::string first_mismatch;  // "row r col c: got g, want w (tolerance t)"
};
// Compares the output a call wrote (host memory, call.y) with the oracle, element by element:
// |y - ref| <= rtol*|ref| + atol*max|ref in row| + floor, NaN where and only where ref is NaN.
OracleCheck check_against_oracle(const Call& call);
// The same comparison against a reference computed earlier by oracle() for the same inputs
// (for checking many plans of one call without recomputing it).
OracleCheck check_against(const Call& call, const std::vector<double>& reference);

}  // namespace tile
