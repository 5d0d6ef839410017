#include "api/pipeline.hpp"

#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <unordered_map>

#include "ir/printer.hpp"
#include "core/sha256.hpp"
#include "ir/verifier.hpp"

namespace tile {

namespace {

std::mutex& prepared_mutex() {
  static std::mutex mutex;
  return mutex;
}
std::unordered_map<std::string, std::shared_ptr<const PreparedKernel>>& prepared_cache() {
  static std::unordered_map<std::string, std::shared_ptr<const PreparedKernel>> cache;
  return cache;
}
// The prepared kernel of every call already planned, by what its plan follows from (the call's
// plan key, the request, the device limits): a repeated call skips the policy, the plan's
// validation and the kernel key. Bounded, since the row count is part of the key; it is
// emptied when full (calls then plan once again).
std::unordered_map<std::string, std::shared_ptr<const PreparedKernel>>& planned_calls() {
  static std::unordered_map<std::string, std::shared_ptr<const PreparedKernel>> cache;
  return cache;
}
constexpr size_t kPlannedCalls = 4096;

std::string planned_call_key(const BoundCall& call, const PlanRequest& request, const DeviceLimits& limits) {
  std::string key;
  key.reserve(256);
  call.append_plan_key(key);
  request.append_key(key);
  for (int64_t v : {int64_t(limits.sm_count), int64_t(limits.max_threads_per_group), int64_t(limits.max_threads_per_sm),
                    int64_t(limits.named_barriers), int64_t(limits.max_shared_bytes), int64_t(limits.max_staged_bytes),
                    int64_t(limits.max_vector_bytes), int64_t(limits.max_cluster_size), limits.max_groups})
    key.append(reinterpret_cast<const char*>(&v), sizeof v);
  return key;
}

std::string describe(const BoundCall& call) {
  std::ostringstream os;
  os << "bind " << call.program->name() << ": rows " << call.rows << ", cols " << call.cols << "\n";
  const auto& decls = call.program->operands();
  for (size_t i = 0; i < decls.size(); ++i) {
    const BoundOperand& b = call.operands[i];
    os << "  " << decls[i].name << " (" << role_name(decls[i].role) << "): ";
    if (!b.present)
      os << "absent\n";
    else if (decls[i].role == Role::scalar_in)
      os << b.value << "\n";
    else
      os << dtype_name(b.dtype) << ", stride " << b.stride << ", " << b.extent << " elements\n";
  }
  return os.str();
}

}  // namespace

bool dump_requested(const char* pass) {
  const char* env = std::getenv("TILE_DUMP");
  if (!env || !*env) return false;
  const std::string list = std::string(",") + env + ",";
  return list.find(",all,") != std::string::npos || list.find("," + std::string(pass) + ",") != std::string::npos;
}

std::shared_ptr<const PreparedKernel> prepare(const RowProgram& program, const BoundCall& call,
                                              const PlanRequest& request, const DeviceLimits& limits) {
  std::string call_key = planned_call_key(call, request, limits);
  {
    std::lock_guard<std::mutex> lock(prepared_mutex());
    if (auto it = planned_calls().find(call_key); it != planned_calls().end()) return it->second;
  }
  const PlanInputs in = call.plan_inputs();
  MappingPlan plan = choose_plan(in, request, limits);
  validate_plan(plan, in, limits, program.name());
  grid_groups(call, plan);  // the one grid check: run, plan_for and source_for alike

  // program serial, then each operand's presence and dtype, then the plan: raw bytes.
  std::string key;
  key.reserve(128);
  const uint64_t serial = program.serial();
  key.append(reinterpret_cast<const char*>(&serial), sizeof serial);
  for (const BoundOperand& o : call.operands) key += o.present ? char('a' + int(o.dtype)) : '-';
  plan.append_key(key);
  auto remember = [&](std::shared_ptr<const PreparedKernel> pk) {  // under prepared_mutex()
    if (planned_calls().size() >= kPlannedCalls) planned_calls().clear();
    planned_calls().emplace(std::move(call_key), pk);
    return pk;
  };
  {
    std::lock_guard<std::mutex> lock(prepared_mutex());
    auto& cache = prepared_cache();
    if (auto it = cache.find(key); it != cache.end()) return remember(it->second);
  }

  const KernelSignature signature = call.signature();
  auto prepared = std::make_shared<PreparedKernel>();
  prepared->plan = plan;
  prepared->signature = signature;
  prepared->program_text = program.to_string();
  if (dump_requested("bind")) std::fprintf(stderr, "%s", describe(call).c_str());
  if (dump_requested("plan")) std::fprintf(stderr, "plan %s\n%s", plan.to_json().c_str(), plan.loop_nest().c_str());
  prepared->lowered = lower_row_program(program, signature, plan);
  prepared->ir_text = ir::to_string(prepared->lowered.main.kernel);
  if (prepared->lowered.finish) prepared->ir_text += ir::to_string(prepared->lowered.finish->kernel);
  prepared->ir_sha256 = sha256_hex(prepared->ir_text);
  if (dump_requested("lower")) std::fprintf(stderr, "%s%s", prepared->program_text.c_str(), prepared->ir_text.c_str());
  ir::verify_or_throw(prepared->lowered.main.kernel);
  if (prepared->lowered.finish) ir::verify_or_throw(prepared->lowered.finish->kernel);
  if (dump_requested("verify")) std::fprintf(stderr, "verify: %s passed\n", prepared->lowered.main.kernel.name.c_str());

  std::lock_guard<std::mutex> lock(prepared_mutex());
  // Two threads missing on one key both lower it; the first to finish fills the map.
  return remember(prepared_cache().emplace(key, std::move(prepared)).first->second);
}

int64_t workspace_elems(const PreparedKernel& pk, const BoundCall& call) {
  const LoweredProgram& lp = pk.lowered;
  if (!lp.finish) return 0;
  const int64_t slots = workspace_slots(pk.plan, grid_groups(call, pk.plan));
  return slots * (lp.col_parts * call.cols + lp.fixed_parts);
}

void clear_prepared_kernels() {
  std::lock_guard<std::mutex> lock(prepared_mutex());
  prepared_cache().clear();
  planned_calls().clear();
}

}  // namespace tile
