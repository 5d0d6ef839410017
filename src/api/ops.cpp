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

// A workspace the caller gives must hold what the call needs, where it needs one (the targets
// then use it as given); a call that needs none leaves it untouched.
void check_workspace(const std::string& op, const CallOptions& options, int64_t needed, int elem_bytes) {
  if (!options.workspace) {
    if (options.workspace_size > 0)
      throw_argument_error(op, "workspace",
                           "a pointer to the workspace_size = " + std::to_string(options.workspace_size) +
                               " bytes given, or none (nullptr and workspace_size 0)",
                           "nullptr");
    return;
  }
  if (needed == 0) return;
  if (options.workspace_size < uint64_t(needed))
    throw_argument_error(op, "workspace",
                         "at least " + std::to_string(needed) + " bytes (tile::workspace_bytes of this call)",
                         std::to_string(options.workspace_size) + " bytes");
  const std::string b = std::to_string(elem_bytes);
  if (const uintptr_t address = reinterpret_cast<uintptr_t>(options.workspace); address % uintptr_t(elem_bytes) != 0)
    throw_argument_error(op, "workspace",
                         "a pointer aligned to " + b + " bytes (it holds " + (elem_bytes == 8 ? "fp64" : "fp32") + " partials)",
                         "an address " + std::to_string(address % uintptr_t(elem_bytes)) + " bytes past a " + b + "-byte boundary");
}

// `replay`, where given, receives the call as the target's Replay (or null).
LaunchRecord launch(const RowProgram& program, const BoundCall& call, const CallOptions& options,
                    std::shared_ptr<const Replay>* replay = nullptr) {
  const Target& target = target_for(options.backend);
  auto pk = prepared(program, call, options.plan, target, options);
  if (options.workspace || options.workspace_size > 0)
    check_workspace(program.name(), options, workspace_elems(*pk, call) * pk->lowered.workspace_elem_bytes(),
                    pk->lowered.workspace_elem_bytes());
  LaunchRecord rec = target.launch(*pk, call, options);
  rec.ir_sha256 = pk->ir_sha256;
  if (replay) *replay = target.replay(std::move(pk), call, options);
  return rec;
}
}  // namespace

LaunchRecord run(const RowProgram& program, const Args& args, const CallOptions& options) {
  return launch(program, bind(program, args), options);
}

LaunchRecord run(const RowProgram& program, const Args& args, const CallOptions& options,
                 std::shared_ptr<const Replay>& replay) {
  return launch(program, bind(program, args), options, &replay);
}

LaunchRecord run(const Call& call, const CallOptions& options) { return launch(builtin_program(call.op), bind(call), options); }

int64_t workspace_bytes(const RowProgram& program, const Args& args, const CallOptions& options) {
  const BoundCall call = bind(program, args);
  const auto pk = prepared(program, call, options.plan, target_for(options.backend), options);
  return workspace_elems(*pk, call) * pk->lowered.workspace_elem_bytes();
}

int64_t workspace_bytes(const Call& call, const CallOptions& options) {
  const RowProgram& program = builtin_program(call.op);
  const BoundCall bound = bind(call);
  const auto pk = prepared(program, bound, options.plan, target_for(options.backend), options);
  return workspace_elems(*pk, bound) * pk->lowered.workspace_elem_bytes();
}

void softmax(const TensorView& x, const TensorView& y, const CallOptions& options) {
  run(Call{Op::softmax, x, y}, options);
}
void log_softmax(const TensorView& x, const TensorView& y, const CallOptions& options) {
  run(Call{Op::log_softmax, x, y}, options);
}
void rms_norm(const TensorView& x, const TensorView& y, const VectorView& weight, double eps, const CallOptions& options) {
  run(Call{Op::rms_norm, x, y, weight, {}, eps}, options);
}
void layer_norm(const TensorView& x, const TensorView& y, const VectorView& weight, const VectorView& bias, double eps,
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
