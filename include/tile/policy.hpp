// The analytic policy: a closed-form mapping plan for a call, and plan validation.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tile/dtype.hpp"
#include "tile/plan.hpp"
#include "tile/spec.hpp"

namespace tile {

struct DeviceLimits {
  int sm_count = 132;                 // H200
  int max_threads_per_group = 1024;
  int named_barriers = 16;            // id 0 is the group barrier, 1.. are per program
  int max_shared_bytes = 48 * 1024;   // static shared memory per group
  int64_t max_groups = 2147483647;    // groups in a grid (gridDim.x)
};

// What the policy may look at: the operator, dtypes, shape, strides and the alignment of the
// operands' base addresses (the largest power of two dividing every base address, in bytes).
struct PlanInputs {
  Op op = Op::softmax;
  DType x_dtype = DType::f32, y_dtype = DType::f32, column_dtype = DType::f32;
  bool has_columns = false;
  int64_t rows = 0, cols = 0, x_stride = 0, y_stride = 0;
  int64_t base_alignment = 16;
};

// Fills every field the request leaves unset (see docs/source/internals/tile/policy.md).
MappingPlan choose_plan(const PlanInputs& in, const PlanRequest& request,
                        const DeviceLimits& limits = {});

// Throws tile::Error naming `op`, the plan field, what was expected and what was given, or
// naming x when its rows need more groups than a grid holds. Every entry point (run, plan_for,
// ir_for, source_for) and the mapping family share this one check.
void validate_plan(const MappingPlan& plan, const PlanInputs& in, const DeviceLimits& limits,
                   const std::string& op);

// The mapping family `tile tune` searches for a call: every valid plan over power-of-two widths
// (and the policy's), vector widths whose accesses stay aligned, packings up to 32 programs,
// register caching where the row fits and re-reading with unroll 1, 2 or 4. Pruned to plans
// whose first stripe is not mostly past the row end. The policy's plan is always included.
std::vector<MappingPlan> mapping_family(const PlanInputs& in, const DeviceLimits& limits = {});

// True when every row of every operand starts on a `vector_elems`-element boundary.
bool rows_aligned(const PlanInputs& in, int vector_elems);
// True when rows_aligned and cols is a multiple of `vector_elems`: what alignment "require" needs.
bool whole_vectors(const PlanInputs& in, int vector_elems);

}  // namespace tile
