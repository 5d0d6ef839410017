// Argument checking and the per-call kernel cache shared by every entry point.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "ir/ir.hpp"
#include "lower/lower_row_program.hpp"
#include "tile/tile.hpp"

namespace tile {

// Everything derived from a call and a plan request that does not depend on the backend.
struct PreparedKernel {
  MappingPlan plan;
  ir::Kernel kernel;
  std::string source;         // CUDA C++
  std::string source_sha256;
};

// Throws tile::Error naming the operator and argument for any bad argument.
void check_call(const Call& call);
// True when some byte of a row of `a` is a byte of a row (or the vector) of `b`: exact for
// strided row views, O(log) in the strides. An absent vector (data == nullptr) overlaps nothing.
bool views_overlap(const TensorView& a, const TensorView& b);
bool views_overlap(const TensorView& a, const VectorView& b);
PlanInputs plan_inputs(const Call& call);
float call_eps(const Call& call);
// Lowered, verified and printed once per (operator, dtypes, operands, plan); memoised.
std::shared_ptr<const PreparedKernel> prepare(const Call& call, const PlanRequest& request);
// The memo behind prepare(); clear_kernel_caches() empties it.
std::mutex& prepared_mutex();
std::unordered_map<std::string, std::shared_ptr<const PreparedKernel>>& prepared_cache();

}  // namespace tile
