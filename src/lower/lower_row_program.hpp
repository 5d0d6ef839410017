// lower_row_program: row program + kernel signature + mapping plan -> raw IR.
//
// Each program (the workers that own one row) covers its row in stripes of
// workers_per_program * vector_elems elements (times ctas_per_program when the row spans the
// groups of a cluster: worker w of the group of rank c is worker c * W + w of the row). Reductions over the columns are grouped in
// levels (a reduction whose inputs use another's result comes a level later); each level is
// one pass over the row: every worker folds its elements with the monoid's `chunk` graph (its
// whole cached slice, or one re-read iteration at a time merged with `combine`), then the
// states merge up the scope stack — lanes of a warp by shuffles, warps of a program through
// shared memory and one barrier, the groups of a cluster through distributed shared memory
// between cluster barriers (lane r reads rank r, a butterfly folds them) — with `combine` again.
// Monoids with a fast graph (RMSNorm's, LayerNorm's) take the program fast path where the
// program spans whole warps of one group: plain sums merged across the program, the fast
// graph on the totals, and the exact path above only where its exactness test fails.
// An output pass stores the row outputs.
// Reductions over the rows fold each program's rows into per-slot partials (registers, or
// the workspace for re-read plans) that a second kernel, lower_finish, combines in a fixed
// order: bitwise identical from run to run. Guard programs (rows past the last) run every
// instruction with loads and stores masked off (or clamped), so they reach every barrier.
// Tested through the CPU backend by tests/lower/lower_row_program_test.cpp (random programs x
// random plans against the float64 evaluation) and tests/api/cpu_sweep_test.cpp.
#pragma once

#include <algorithm>
#include <optional>
#include <set>
#include <vector>

#include "ir/ir.hpp"
#include "tile/plan.hpp"
#include "tile/spec.hpp"

namespace tile {

struct KernelSignature;

// What one kernel parameter carries, for the targets that fill in the arguments.
struct ParamSource {
  // inv_cols: 1 / max(cols, 1) in the kernel's float type, so that divisions by the row length
  // are multiplications (an IEEE division is about eight instructions and a slow-path call).
  enum class Kind : uint8_t { rows, cols, stride, scalar, slots, inv_cols };
  Kind kind;
  int operand = -1;  // stride, scalar
};

struct LoweredKernel {
  ir::Kernel kernel;
  std::vector<int> buffers;  // operand bound to each buffer; -1 is the workspace
  std::vector<ParamSource> params;
  bool column_outputs = false;  // (the finish kernel) it stores per-column outputs
};

struct LoweredProgram {
  LoweredKernel main;
  std::optional<LoweredKernel> finish;  // the second phase of reductions over the rows
  // Workspace elements (of workspace_dtype) per slot (one slot per program of the grid):
  // col_parts * cols + fixed_parts.
  int col_parts = 0, fixed_parts = 0;
  int workspace_elem_bytes() const { return main.kernel.real == ir::Type::f64 ? 8 : 4; }
};

// The workspace holds partial states in the kernel's float type.
inline DType workspace_dtype(ir::Type real) { return real == ir::Type::f64 ? DType::f64 : DType::f32; }

// Columns a group of the finish kernel takes, one a lane of each warp (lower_finish).
constexpr int64_t kFinishColumns = 32;

// Groups of the finish kernel for `cols` columns: one a kFinishColumns of them where it stores
// per-column outputs, else one (group 0 stores the scalar outputs).
inline int64_t finish_groups(const LoweredKernel& finish, int64_t cols) {
  if (!finish.column_outputs) return 1;
  return std::max<int64_t>(1, (cols + kFinishColumns - 1) / kFinishColumns);
}

LoweredProgram lower_row_program(const RowProgram& program, const KernelSignature& signature,
                                 const MappingPlan& plan);

// The reductions a call computes (program indices): those the values of its present outputs
// use, directly or through other reductions' inputs. `present` is per operand, in declaration
// order. The lowering and the plan's inputs (a reduction over the rows that no present output
// needs puts no loop over row blocks on the plan) both read it.
std::set<int> live_reductions(const RowProgram& program, const std::vector<bool>& present);

// Reductions over the columns by level: a reduction whose inputs use the result of another
// comes one level after it. Used by the lowering and the cost model.
std::vector<std::vector<int>> reduction_levels(const RowProgram& program);

// Whether a level takes the program fast path (see level_pass), and whether that path loads
// the row's head (the vector at column 0, in every worker) for a fast graph's `first` node:
// not where head_in_cache (a cached program of one warp, whose lane 0 holds column 0
// and broadcasts it with one shuffle).
bool program_fast_path(const RowProgram& program, const std::vector<int>& level, const MappingPlan& plan);
bool head_in_cache(const MappingPlan& plan);
bool reads_row_head(const RowProgram& program, const std::vector<int>& level, const MappingPlan& plan);

}  // namespace tile
