// The CPU reference executor: runs a raw IR kernel on the host and so defines what the IR
// means (src/ir/ir.hpp).
//
// The kernel is compiled once, by an IRVisitor (src/ir/visitor.hpp), into flat three-address
// bytecode over a per-worker file of 8-byte slots (registers, built-ins, constants, parameters,
// expression temporaries), with structured control flow lowered to jumps. Clusters (groups,
// when ctas_per_cluster is 1) run one after another; the groups of a cluster run together, each
// with its own shared memory, their workers lane by lane: one worker runs until it reaches a
// barrier or shuffle or finishes, then the next; a barrier is released when every worker of
// its scope waits at that same statement, a shuffle when every lane of the warp does. It
// reports, as ExecutionError, out-of-bounds and misaligned accesses, shared-memory data races
// (remote ones too: a remote read and its owner's write with no cluster barrier between),
// skipped barriers and shuffles, a group exiting while another may still read its shared
// memory, staged loads of elements the worker did not copy or has not waited for (async copies
// land at once but stay pending until the worker's async wait), and integer division by zero
// (library bugs, so an InternalError). Tested by tests/backend/cpu/executor_test.cpp.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ir/ir.hpp"
#include "tile/error.hpp"

namespace tile::cpu {

// One scalar kernel parameter; `f` is read for f32 parameters, `i` for the others.
struct ScalarArg {
  double f = 0;
  int64_t i = 0;
};

// A global buffer: element e (relative to `data`) may be accessed iff lo <= e < hi.
struct BufferArg {
  void* data;
  int64_t lo = 0;
  int64_t hi = 0;
};

struct LaunchArgs {
  int64_t groups = 0;
  std::vector<BufferArg> buffers;  // one per Kernel::buffers entry
  std::vector<ScalarArg> params;   // one per Kernel::params entry
};

struct ExecStats {
  int64_t bytes_loaded = 0, bytes_stored = 0;        // elements accessed x dtype size (async copies load)
  int64_t vector_accesses = 0, scalar_accesses = 0;  // per worker: one per vector access of
                                                     // width > 1, one per scalar element access
  int64_t barriers = 0;                              // releases, one per scope instance
  int64_t shuffles = 0;                              // warp exchanges, one per warp
  int64_t remote_loads = 0;                          // remote shared loads, one per worker
  int64_t remote_pushes = 0;                         // remote shared pushes, one per worker
};

// A kernel that breaks the IR's rules while it runs is a bug in the library that lowered it (or
// in hand-written IR), never a caller's mistake: an InternalError, not a tile::Error.
class ExecutionError : public tile::InternalError {
 public:
  explicit ExecutionError(const std::string& what)
      : tile::InternalError("tile internal error (a library bug, not a bad argument): " + what) {}
};

// Runs `kernel` over args.groups groups. Registers start as NaN (f32) or 0, shared memory as
// NaN, so reads of unwritten values show in the results.
ExecStats execute(const ir::Kernel& kernel, const LaunchArgs& args);

// "loaded 64 B, stored 16 B, 4 vector + 0 scalar accesses, 2 barriers, 10 shuffles"
std::string describe(const ExecStats& stats);

}  // namespace tile::cpu
