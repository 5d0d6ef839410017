// estimate_cost: the bytes a plan's kernel reads and writes for a call.
//
// Counts what the loads issue, not what the row needs: every pass that re-reads the input,
// column operands per program and pass, and with `clamp` tails the clamped reads of lanes past
// the row end and of guard programs past the last row. The CPU backend counts the bytes its
// loads actually read; tests/cost/cost_model_test.cpp requires the two to agree.
#pragma once

#include <cstdint>

#include "tile/plan.hpp"
#include "tile/policy.hpp"
#include "tile/spec.hpp"

namespace tile {

struct CostEstimate {
  int64_t bytes_read = 0;        // issued by loads (input, columns)
  int64_t bytes_written = 0;     // by stores
  int64_t compulsory_bytes = 0;  // input once + output once + each column once
  int input_passes = 0;          // times each input element is read
};

CostEstimate estimate_cost(const RowProgram& program, const PlanInputs& in, const MappingPlan& plan);

}  // namespace tile
