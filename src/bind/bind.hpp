// bind: a row program's declared operands + a call's arguments -> checked, ordered operands.
//
// The one place where a call's arguments are checked: names, presence, dtypes, shapes,
// strides, sizes, pointer alignment and aliasing, each error naming the program, the operand,
// what was expected and what was given. The C++ entry points, both backends, the Python
// package and the `tile` command all go through it; the kernel signature and arguments are
// derived from its result. Tested by tests/bind/bind_test.cpp.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tile/policy.hpp"
#include "tile/spec.hpp"
#include "tile/tile.hpp"

namespace tile {

struct BoundOperand {
  bool present = false;
  DType dtype = DType::f32;
  void* data = nullptr;
  int64_t stride = 0;  // row operands: elements between rows; per-row operands: between values
  int64_t extent = 0;  // elements the kernel may touch from data
  double value = 0;    // scalar inputs
};

// What a kernel depends on besides its plan: which operands are present and their dtypes
// (a float scalar's is f64 in a float64 call).
struct KernelSignature {
  std::vector<bool> present;
  std::vector<DType> dtypes;
  bool f64() const;  // the kernel's float type is f64
  bool operator==(const KernelSignature&) const = default;
  void append_key(std::string& key) const;
};

// What every call of a program needs to know about it, computed once per program content
// (RowProgram::serial) and shared: the program is validated, its reductions levelled.
struct ProgramFacts {
  std::vector<std::vector<int>> levels;  // reductions over the columns, by level
  int merge_parts = 1;                   // shared slots per warp every merge of a row takes
  bool reduces_rows = false;             // some reduction of the program runs over the rows
  int first_row_operand = -1;            // defines rows and cols
};
const ProgramFacts& facts_of(const RowProgram& program);

struct BoundCall {
  const RowProgram* program = nullptr;
  const ProgramFacts* facts = nullptr;
  std::vector<BoundOperand> operands;  // in declaration order
  int64_t rows = 0, cols = 0;
  bool f64 = false;  // the float operands are f64: the kernel computes in f64 (float scalars too)

  KernelSignature signature() const;
  PlanInputs plan_inputs() const;
  // Appends, as raw bytes, everything plan_inputs() reads (program, shape, each operand's
  // presence, dtype and stride, the bases' alignment): two calls with the same bytes have the
  // same PlanInputs.
  void append_plan_key(std::string& key) const;
  const BoundOperand& operand(const std::string& name) const;
};

BoundCall bind(const RowProgram& program, const Args& args);
// The same checks, for a built-in operator's call (no operand names to look up).
BoundCall bind(const Call& call);

// For a call bound before, with operand i's data now at data[i] (declaration order): true when
// bind's checks that read data pointers pass (non-null, aligned, inside the address space, no
// overlap but the exact aliases allowed). The other checks depend on what a replay's key holds.
bool pointers_bind(const BoundCall& call, const void* const* data);

// Throws tile::Error naming `op` and `name` unless fp32 holds `value` within rounding.
void check_f32_scalar(const std::string& op, const std::string& name, double value);

// The grid a plan launches for a bound call: groups of programs_per_group rows, capped for
// programs that loop over rows. Throws tile::Error when it exceeds what a launch can address.
int64_t grid_groups(const BoundCall& call, const MappingPlan& plan);

// Workspace slots of a grid of `groups` groups for reductions over the rows: one per program,
// and one per cluster where a cluster's groups share a program.
inline int64_t workspace_slots(const MappingPlan& plan, int64_t groups) {
  return groups / plan.ctas_per_program * plan.programs_per_group;
}

}  // namespace tile
