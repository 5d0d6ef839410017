// Targets: where a prepared kernel runs. Each target declares what it can do (the limits the
// policy and the plan validation respect) and implements codegen and launch. The CPU
// executor, CUDA and the stub of a build without CUDA are targets.
#pragma once

#include <memory>
#include <string>

#include "api/pipeline.hpp"
#include "tile/policy.hpp"
#include "tile/tile.hpp"

namespace tile {

// What a target can do, declared once. limits() folds these into the DeviceLimits the policy
// and plan validation respect, so a plan a target cannot run is refused before lowering.
struct TargetCaps {
  int named_barriers = 16;          // per group; id 0 is the group barrier, 1.. one per program
  int max_cluster_size = 1;         // groups per cluster a launch may have (1: no clusters)
  int vector_bytes = 16;            // widest single memory access of a worker
  int shared_bytes = 48 * 1024;     // static shared memory per group
  int staged_bytes = 227 * 1024;    // shared memory a group may opt into, static included (H200's)
  bool can_launch = false;          // a launch can run in this process (driver, device)
};

// `limits` with the fields the caps decide replaced by the caps' values.
DeviceLimits with_caps(DeviceLimits limits, const TargetCaps& caps);

// A call resolved down to its launches: the kernels loaded in one context, their grids and
// scalar arguments. A later call that differs from it only in its data pointers replays it,
// skipping bind's derivations, the plan, the kernel caches and the launch record; the caller
// keys everything else the resolution read (program serial, operands' dtypes, shapes, strides
// and pointer alignment, scalars, plan request, device). It refers to its call's program,
// which must outlive it unchanged.
class Replay {
 public:
  virtual ~Replay() = default;
  // The workspace each replay needs (a reduction over the rows: its partials), in bytes; 0
  // for a call of one row kernel.
  virtual int64_t workspace_bytes() const { return 0; }
  // Launches with operand i's data at data[i] (declaration order) on `stream`; `workspace`
  // holds workspace_bytes() bytes, aligned as run() requires, or is null (then the library's
  // own workspace of that stream, as run() without CallOptions::workspace). False, having
  // launched nothing, when the call must take the full path instead: a pointer bind refuses
  // (bind then names it), or another current context.
  virtual bool launch(const void* const* data, void* stream, void* workspace = nullptr) const = 0;
};

class Target {
 public:
  virtual ~Target() = default;
  virtual const char* name() const = 0;
  virtual TargetCaps caps() const = 0;
  // The device limits plans must respect on this target (may query the device): the caps'
  // limits plus what the device reports.
  virtual DeviceLimits limits(const CallOptions& options) const = 0;
  // The generated source of a prepared kernel's row kernel ("" when the target has none).
  virtual std::string source(const PreparedKernel& kernel) const = 0;
  virtual LaunchRecord launch(const PreparedKernel& kernel, const BoundCall& call,
                              const CallOptions& options) const = 0;
  // The call just launched as a Replay, or null where the target makes none (the CPU
  // executor).
  virtual std::shared_ptr<const Replay> replay(std::shared_ptr<const PreparedKernel> /*kernel*/,
                                               const BoundCall& /*call*/, const CallOptions& /*options*/) const {
    return nullptr;
  }
  // Forgets what the target caches beyond prepared kernels (compiled modules); not the disk.
  virtual void clear_caches() const {}
};

// The first line of a generated source: the kernel and its plan.
std::string source_header(const PreparedKernel& kernel);

const Target& cpu_target();
const Target& cuda_target();  // the stub in a build without CUDA
const Target& target_for(Backend backend);

// The kernel arguments of one lowered kernel, as values: buffers' base pointers (the
// workspace given separately) and scalar parameters (integers in `i`, floats in `f`, or in
// `d` for a kernel whose float type is f64).
struct ArgumentValues {
  std::vector<void*> buffers;
  std::vector<int64_t> extents;  // elements each buffer may touch
  struct Scalar {
    int64_t i = 0;
    float f = 0;
    double d = 0;
  };
  std::vector<Scalar> params;
};
// tile::run, also returning the call as a Replay where its target makes one (else null).
LaunchRecord run(const RowProgram& program, const Args& args, const CallOptions& options,
                 std::shared_ptr<const Replay>& replay);

ArgumentValues argument_values(const LoweredKernel& kernel, const BoundCall& call, void* workspace,
                               int64_t workspace_elems, int64_t slots);

}  // namespace tile
