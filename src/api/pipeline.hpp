// The passes every call goes through, in order:
//
//   bind     src/bind/bind.cpp                  program + arguments -> BoundCall (all checks)
//   plan     src/plan/policy.cpp                BoundCall + request -> MappingPlan, validated
//                                               against the call and the target's limits
//   lower    src/lower/lower_row_program.cpp    program + signature + plan -> raw IR
//   verify   src/ir/verifier.cpp                every rule of src/ir/verifier.hpp
//   codegen  the target (src/target/target.hpp) CUDA C++ + NVRTC, or nothing: the CPU
//                                               executor runs the IR itself
//
// TILE_DUMP lists the passes to print after, to stderr: TILE_DUMP=plan,lower (or "all"); the
// codegen dump prints the generated source once per kernel. Lowered kernels are memoised per
// (program, signature, plan); clear_kernel_caches() forgets them.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "bind/bind.hpp"
#include "lower/lower_row_program.hpp"
#include "tile/tile.hpp"

namespace tile {

class Target;

// What a call's passes produce up to codegen, shared by every call with the same key. A
// target keeps what it derives (CUDA source, loaded functions) in `target_state`, so a cache
// entry and everything launched from it live and die together.
struct PreparedKernel {
  MappingPlan plan;
  KernelSignature signature;
  LoweredProgram lowered;
  std::string program_text;  // RowProgram::to_string(), for dumps and source headers
  std::string ir_text;       // the printed IR of every kernel, as ir_for returns it
  std::string ir_sha256;

  struct TargetState {
    virtual ~TargetState() = default;
  };
  // The CUDA target's state (the only target that derives any), made once on first use.
  mutable std::once_flag target_once;
  mutable std::unique_ptr<TargetState> target_state;
};

bool dump_requested(const char* pass);

// bind + plan + lower + verify, memoised.
std::shared_ptr<const PreparedKernel> prepare(const RowProgram& program, const BoundCall& call,
                                              const PlanRequest& request, const DeviceLimits& limits);

// The elements (of workspace_dtype: f32, f64 in a float64 call) of workspace a launch of `kernel` for `call` needs: one slot per program of
// the grid, each holding the partials of the reductions over the rows; 0 without such
// reductions. Every target and workspace_bytes() size it by this.
int64_t workspace_elems(const PreparedKernel& kernel, const BoundCall& call);

// Forgets every prepared kernel (and so every target's state derived from them).
void clear_prepared_kernels();

}  // namespace tile
