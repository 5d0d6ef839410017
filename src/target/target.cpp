#include "target/target.hpp"

namespace tile {

const Target& target_for(Backend backend) { return backend == Backend::cpu ? cpu_target() : cuda_target(); }

ArgumentValues argument_values(const LoweredKernel& kernel, const BoundCall& call, void* workspace,
                               int64_t workspace_elems, int64_t slots) {
  ArgumentValues a;
  for (int operand : kernel.buffers) {
    if (operand < 0) {
      a.buffers.push_back(workspace);
      a.extents.push_back(workspace_elems);
    } else {
      a.buffers.push_back(call.operands[operand].data);
      a.extents.push_back(call.operands[operand].extent);
    }
  }
  for (const ParamSource& p : kernel.params) {
    ArgumentValues::Scalar v;
    switch (p.kind) {
      case ParamSource::Kind::rows: v.i = call.rows; break;
      case ParamSource::Kind::cols: v.i = call.cols; break;
      case ParamSource::Kind::stride: v.i = call.operands[p.operand].stride; break;
      case ParamSource::Kind::slots: v.i = slots; break;
      case ParamSource::Kind::scalar:
        v.f = float(call.operands[p.operand].value);
        v.i = int64_t(call.operands[p.operand].value);
        break;
    }
    a.params.push_back(v);
  }
  return a;
}

}  // namespace tile
