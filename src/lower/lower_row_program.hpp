// lower_row_program: operator spec + mapping plan -> raw IR.
//
// Each worker computes row = group_index * programs_per_group + program_in_group and covers
// the row in stripes of workers_per_program * vector_elems elements. With register caching the
// row slice is loaded once into `cached` registers and every reduction pass and the output
// pass read those; with re-reading every pass loads the row again, except that softmax's max
// and its sum of exp(x - max) share one pass (online_max_partner), as do LayerNorm's sum
// and sum of squared deviations (online_variance_partner). Row reductions are a warp
// shuffle butterfly, then (multi-warp programs) one shared slot per warp, one barrier and a
// second butterfly that every warp runs, so no broadcast barrier is needed. Guard programs
// (rows past the last) run every instruction with their loads and stores masked off (or
// clamped), so they reach every barrier. Tested through the CPU backend by
// tests/api/cpu_sweep_test.cpp and tests/cost/cost_model_test.cpp.
#pragma once

#include <optional>
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

// RMSNorm's and LayerNorm's normalisation in a row program:
//   inv = rsqrt(reduce_sum(C * C) / cols + s), used only by the product C * inv,
// where C is an element expression E (RMSNorm), or E - reduce_sum(E) / cols used only by
// C * C and C * inv (LayerNorm), and s is a row scalar no reduction feeds (eps). The lowering
// computes these statistics as parts scaled by a power of two, merged pairwise, and the
// product as (E / p - mean) * (p * inv): nothing overflows or underflows whatever the
// magnitude of E (docs/source/numerics.md), and a constant row gives exactly 0.
struct NormIdiom {
  int element = -1;     // E
  int centered = -1;    // C (E itself for RMSNorm)
  int mean_sum = -1;    // reduce_sum(E), LayerNorm only
  int square_sum = -1;  // reduce_sum(C * C)
  int inv = -1;         // rsqrt(square_sum / cols + s)
  int eps = -1;         // s
  int product = -1;     // C * inv
  bool centred() const { return mean_sum >= 0; }
};
std::optional<NormIdiom> norm_idiom(const RowProgram& program);

// The sum reduction of exp(E - M), where M is the max reduction `max_node` of E (softmax's
// normaliser), or -1. Re-read plans compute the two in one pass with a running rescale.
int online_max_partner(const RowProgram& program, int max_node);
// The sum reduction of (E - S / cols)^2, where S is the sum reduction `sum_node` of E
// (LayerNorm's variance), or -1. Re-read plans compute the two in one pass (Chan's merge).
int online_variance_partner(const RowProgram& program, int sum_node);

}  // namespace tile
