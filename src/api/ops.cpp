// Entry points: every call binds its program's operands, prepares (src/api/pipeline.hpp) and
// launches on the chosen target.
#include "api/pipeline.hpp"
#include "target/target.hpp"

namespace tile {

namespace {

std::shared_ptr<const PreparedKernel> prepared(const RowProgram& program, const BoundCall& call,
                                               const PlanRequest& request, const Target& target,
                                               const CallOptions& options) {
  return prepare(program, call, request, target.limits(options));
}

}  // namespace

namespace {
LaunchRecord launch(const RowProgram& program, const BoundCall& call, const CallOptions& options) {
  const Target& target = target_for(options.backend);
  auto pk = prepared(program, call, options.plan, target, options);
  LaunchRecord rec = target.launch(*pk, call, options);
  rec.ir_sha256 = pk->ir_sha256;
  return rec;
}
}  // namespace

LaunchRecord run(const RowProgram& program, const Args& args, const CallOptions& options) {
  return launch(program, bind(program, args), options);
}

LaunchRecord run(const Call& call, const CallOptions& options) { return launch(builtin_program(call.op), bind(call), options); }

void softmax(const TensorView& x, const TensorView& y, const CallOptions& options) {
  run(Call{Op::softmax, x, y}, options);
}
void log_softmax(const TensorView& x, const TensorView& y, const CallOptions& options) {
  run(Call{Op::log_softmax, x, y}, options);
}
void rms_norm(const TensorView& x, const TensorView& y, const VectorView& weight, float eps, const CallOptions& options) {
  run(Call{Op::rms_norm, x, y, weight, {}, eps}, options);
}
void layer_norm(const TensorView& x, const TensorView& y, const VectorView& weight, const VectorView& bias, float eps,
                const CallOptions& options) {
  run(Call{Op::layer_norm, x, y, weight, bias, eps}, options);
}

MappingPlan plan_for(const RowProgram& program, const Args& args, const PlanRequest& request) {
  CallOptions options;
  return prepared(program, bind(program, args), request, cuda_target(), options)->plan;
}

std::string ir_for(const RowProgram& program, const Args& args, const PlanRequest& request) {
  CallOptions options;
  return prepared(program, bind(program, args), request, cuda_target(), options)->ir_text;
}

std::string source_for(const RowProgram& program, const Args& args, const PlanRequest& request) {
  CallOptions options;
  auto pk = prepared(program, bind(program, args), request, cuda_target(), options);
  return cuda_target().source(*pk);
}

MappingPlan plan_for(const Call& call, const PlanRequest& request) {
  CallOptions options;
  return prepared(builtin_program(call.op), bind(call), request, cuda_target(), options)->plan;
}
std::string ir_for(const Call& call, const PlanRequest& request) {
  return ir_for(builtin_program(call.op), to_args(call), request);
}
std::string source_for(const Call& call, const PlanRequest& request) {
  return source_for(builtin_program(call.op), to_args(call), request);
}

void clear_kernel_caches() {
  clear_prepared_kernels();
  for (Backend backend : {Backend::cpu, Backend::cuda}) target_for(backend).clear_caches();
}

}  // namespace tile
