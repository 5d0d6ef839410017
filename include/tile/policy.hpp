// The analytic policy: a closed-form mapping plan for a call, and plan validation.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tile/dtype.hpp"
#include "tile/plan.hpp"

namespace tile {

struct DeviceLimits {
  int sm_count = 132;                 // H200
  int max_threads_per_group = 1024;
  int max_threads_per_sm = 2048;
  int named_barriers = 16;            // id 0 is the group barrier, 1.. are per program
  int max_shared_bytes = 48 * 1024;   // static shared memory per group
  int max_staged_bytes = 227 * 1024;  // shared memory a group may opt into, static included (caching "shared"), H200
  int max_vector_bytes = 16;          // widest single memory access of a worker
  int max_cluster_size = 1;           // groups per cluster a launch may have (1: no clusters)
  int64_t max_groups = 2147483647;    // groups in a grid (gridDim.x)
};

// A row operand (input or output) of a call: its dtype and row stride in elements.
struct RowOperandInfo {
  DType dtype = DType::f32;
  int64_t stride = 0;
  bool input = true;
};

// What the policy may look at: the shape, every present row and column operand (dtype,
// stride, the alignment of the base addresses: the largest power of two dividing every base
// address, in bytes) and what the program's reductions need. Derived from a bound call
// (src/bind/bind.cpp); for_rows() describes the one-input, one-output built-in operators.
struct PlanInputs {
  int64_t rows = 0, cols = 0;
  std::vector<RowOperandInfo> row_operands;
  std::vector<DType> column_dtypes;
  int64_t base_alignment = 16;
  int merge_parts = 3;               // shared slots per warp the merges of one row take
  int rows_reduction_parts = 0;      // per-element accumulators of the call's reductions over the rows
  bool reduces_rows = false;         // some reduction the call computes runs over the rows
  int real_bytes = 4;                // a float register's bytes: 8 in a float64 call
  std::string rows_operand = "x";    // the operand errors about the row count name

  static PlanInputs for_rows(DType x, DType y, int64_t rows, int64_t cols, int64_t x_stride = 0,
                             int64_t y_stride = 0, std::optional<DType> columns = std::nullopt);
  int row_inputs() const;           // row operands read
  int64_t input_bytes_per_col() const;  // bytes of every row input in one column
  int widest_elem_bytes() const;    // over every row and column operand
  // Whether the groups loop over row blocks (grid_limit > 0): per-column accumulators over the
  // rows, whose partials (a row of the workspace a program slot) the grid bounds. Row values
  // reduced over the rows take a slot a row block instead, so they leave the mapping free.
  bool loops_over_rows() const { return rows_reduction_parts > 0; }
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
// register caching where the row fits and re-reading with unroll 1, 2 or 4 (loading the next
// iteration ahead or not, where the row takes more than one iteration). Pruned to plans
// whose first stripe is not mostly past the row end. The policy's plan is always included.
std::vector<MappingPlan> mapping_family(const PlanInputs& in, const DeviceLimits& limits = {});

// True when every row of every operand starts on a `vector_elems`-element boundary.
bool rows_aligned(const PlanInputs& in, int vector_elems);
// True when rows_aligned and cols is a multiple of `vector_elems`: what alignment "require" needs.
bool whole_vectors(const PlanInputs& in, int vector_elems);

}  // namespace tile
