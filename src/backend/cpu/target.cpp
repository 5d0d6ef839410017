// The CPU target: runs the lowered IR on the host with the reference executor. It generates
// no source; the IR is what it runs.
#include <algorithm>

#include "backend/cpu/executor.hpp"
#include "target/target.hpp"

namespace tile {

namespace {

cpu::LaunchArgs launch_args(const LoweredKernel& lk, const ArgumentValues& a, int64_t groups) {
  cpu::LaunchArgs args;
  args.groups = groups;
  for (size_t b = 0; b < a.buffers.size(); ++b) args.buffers.push_back({a.buffers[b], 0, a.extents[b]});
  for (size_t p = 0; p < a.params.size(); ++p) {
    const ir::Type t = lk.kernel.params[p].type;
    args.params.push_back({t == ir::Type::f32 ? double(a.params[p].f) : t == ir::Type::f64 ? a.params[p].d : 0.0, a.params[p].i});
  }
  return args;
}

class CpuTarget final : public Target {
 public:
  const char* name() const override { return "cpu"; }
  // The executor can run any plan; it declares CUDA's caps so that a plan, and so the IR, is
  // the same on both backends and the CPU checks what the GPU runs. It runs the groups of a
  // cluster together, so it takes clusters of up to 16 groups (the largest CUDA allows).
  TargetCaps caps() const override {
    TargetCaps c;
    c.can_launch = true;
    c.max_cluster_size = 16;
    return c;
  }
  DeviceLimits limits(const CallOptions&) const override { return with_caps(DeviceLimits{}, caps()); }
  std::string source(const PreparedKernel&) const override { return ""; }

  LaunchRecord launch(const PreparedKernel& pk, const BoundCall& call, const CallOptions& options) const override {
    const LoweredProgram& lp = pk.lowered;
    LaunchRecord rec;
    rec.plan = pk.plan;
    rec.kernel_name = lp.main.kernel.name;
    rec.groups = grid_groups(call, pk.plan);
    rec.threads_per_group = lp.main.kernel.threads_per_group();
    rec.shared_bytes = int(lp.main.kernel.group_shared_bytes());
    const int64_t slots = workspace_slots(pk.plan, rec.groups);
    // The caller's workspace (host memory, checked by run() to hold ws_elems), else our own.
    const int64_t ws_elems = workspace_elems(pk, call);
    std::vector<double> own;  // holds f32 or f64 partials
    void* workspace = options.workspace;
    if (lp.finish) {
      if (!workspace) {
        own.resize(size_t(ws_elems));
        workspace = own.data();
      }
      rec.workspace_bytes = ws_elems * lp.workspace_elem_bytes();
      rec.kernels = 2;
    }
    if (rec.groups > 0) {
      ArgumentValues a = argument_values(lp.main, call, workspace, ws_elems, slots);
      const cpu::ExecStats st = cpu::execute(lp.main.kernel, launch_args(lp.main, a, rec.groups));
      rec.bytes_loaded = st.bytes_loaded;
      rec.vector_accesses = st.vector_accesses;
      rec.scalar_accesses = st.scalar_accesses;
    }
    if (lp.finish) {
      ArgumentValues a = argument_values(*lp.finish, call, workspace, ws_elems, slots);
      cpu::execute(lp.finish->kernel, launch_args(*lp.finish, a, finish_groups(*lp.finish, call.cols)));
    }
    return rec;
  }
};

}  // namespace

const Target& cpu_target() {
  static const CpuTarget target;
  return target;
}

}  // namespace tile
