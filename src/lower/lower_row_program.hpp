// lower_row_program: operator spec + mapping plan -> raw IR.
//
// Each worker computes row = group_index * programs_per_group + program_in_group and covers
// the row in stripes of workers_per_program * vector_elems elements. With register caching the
// row slice is loaded once into `cached` registers and every reduction pass and the output
// pass read those; with re-reading every pass loads the row again. Row reductions are a warp
// shuffle butterfly, then (multi-warp programs) one shared slot per warp, one barrier and a
// second butterfly that every warp runs, so no broadcast barrier is needed. Guard programs
// (rows past the last) run every instruction with their loads and stores masked off (or
// clamped), so they reach every barrier. Tested through the CPU backend by
// tests/api/cpu_sweep_test.cpp and tests/cost/cost_model_test.cpp.
#pragma once

#include <vector>

#include "ir/ir.hpp"
#include "tile/plan.hpp"
#include "tile/spec.hpp"

namespace tile {

struct KernelSignature {
  DType x = DType::f32, y = DType::f32;
  std::vector<DType> columns;  // one per program.columns(), in that order
};

// Kernel arguments: buffers x, y, then the program's columns; scalar params rows, cols,
// x_stride, y_stride (i64), then the program's scalars (f32).
ir::Kernel lower_row_program(const RowProgram& program, const KernelSignature& signature,
                             const MappingPlan& plan);

}  // namespace tile
