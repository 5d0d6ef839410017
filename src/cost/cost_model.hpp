// estimate_cost: the bytes a plan's row kernel reads and writes for a call.
//
// Counts what the loads issue, not what the rows need: every pass that re-reads a row input
// (one per level of reductions over the columns, plus the output pass), per-column operands per
// program and pass (once per program when rows are cached in registers), per-row inputs once
// per worker, and with `clamp` tails the clamped reads of lanes past the row end and of guard
// programs past the last row. Partials of reductions over the rows are counted apart, in
// workspace_bytes. It reads the program, not the IR, so it prices a plan without lowering it
// and stays an independent count: the CPU backend counts the bytes its loads actually read, and
// tests/cost/cost_model_test.cpp requires the two to agree and the passes it counts to be the
// lowered kernel's loops over the row (found by an IRVisitor).
#pragma once

#include <cstdint>

#include "bind/bind.hpp"
#include "tile/plan.hpp"
#include "tile/policy.hpp"
#include "tile/spec.hpp"

namespace tile {

struct CostEstimate {
  int64_t bytes_read = 0;        // issued by the row kernel's loads of operands
  int64_t bytes_written = 0;     // by its stores to operands
  int64_t compulsory_bytes = 0;  // every present input once + every output once
  int input_passes = 0;          // times each row input element is read (the most of any input)
};

CostEstimate estimate_cost(const RowProgram& program, const BoundCall& call, const MappingPlan& plan);

}  // namespace tile
