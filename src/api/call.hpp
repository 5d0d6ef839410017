// Argument checking and the per-call kernel cache shared by every entry point.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "ir/ir.hpp"
#include "lower/lower_row_program.hpp"
#include "tile/tile.hpp"

namespace tile {

// The CUDA backend's kernel loaded in one context; defined in src/api/ops.cpp.
struct LoadedKernel;

// Everything derived from a call and a plan request that does not depend on the backend.
struct PreparedKernel {
  MappingPlan plan;
  ir::Kernel kernel;
  std::string source;         // CUDA C++
  std::string source_sha256;
  // Loaded by run() per CUDA context id (cuda::context_id, never reused). Owned here, so a
  // loaded kernel lives and dies with its prepared kernel and no other kernel can find it.
  mutable std::mutex loaded_mutex;
  mutable std::unordered_map<uint64_t, std::shared_ptr<const LoadedKernel>> loaded;
};

// Throws tile::Error naming the operator and argument for any bad argument.
void check_call(const Call& call);
// True when some byte of a row of `a` is a byte of a row (or the vector) of `b`: exact for
// strided row views, O(log) in the strides. An absent vector (data == nullptr) overlaps nothing.
bool views_overlap(const TensorView& a, const TensorView& b);
bool views_overlap(const TensorView& a, const VectorView& b);
PlanInputs plan_inputs(const Call& call);
float call_eps(const Call& call);
// Lowered, verified and printed once per (operator, dtypes, operands, plan); memoised in a
// process-wide map. Thread-safe; callers keep what it returns alive across a cache clear.
std::shared_ptr<const PreparedKernel> prepare(const Call& call, const PlanRequest& request);
// Empties prepare()'s memo (clear_kernel_caches()); thread-safe.
void clear_prepared_kernels();

}  // namespace tile
