// NVRTC compiles every kernel of the CPU sweep, of the sanitizer's plan families, of the
// cluster sweep and of the float64 sweep for sm_90 (no GPU needed), and every group and cluster barrier in the generated
// source is reached unconditionally.
#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <set>
#include <sstream>

#include "bind/bind.hpp"
#include "backend/cuda/emit_cuda.hpp"
#include "backend/cuda/jit_module.hpp"
#include "ir/verifier.hpp"
#include "lower/lower_row_program.hpp"
#include "support/cases.hpp"

namespace tile::testing {
namespace {

Call host_call(const Case& c, HostMatrix& x, HostMatrix& y, HostVector& w, HostVector& b) {
  Call call{c.op, x.view(), y.view()};
  bool norm = c.op == Op::rms_norm || c.op == Op::layer_norm;
  if (norm && c.weight) call.weight = w.view();
  if (c.op == Op::layer_norm && c.bias) call.bias = b.view();
  return call;
}

// A cluster plan's source, lowered for a target with clusters of up to 16 groups (sm_90) whether
// or not this process can launch one: plan, validation, lowering, verification, CUDA C++.
std::string cluster_source(const Call& call, const PlanRequest& request) {
  const BoundCall bound = bind(call);
  DeviceLimits limits;
  limits.max_cluster_size = 16;
  const MappingPlan plan = choose_plan(bound.plan_inputs(), request, limits);
  validate_plan(plan, bound.plan_inputs(), limits, op_name(call.op));
  const LoweredProgram lp = lower_row_program(*bound.program, bound.signature(), plan);
  ir::verify_or_throw(lp.main.kernel);
  EXPECT_EQ(lp.main.kernel.ctas_per_cluster, plan.ctas_per_program);
  return cuda::emit_cuda(lp.main.kernel, "// plan " + plan.to_json());
}

std::vector<std::string> sweep_sources() {
  std::set<std::string> sources;
  std::vector<Case> cases = core_sweep();
  for (const Case& c : packing_sweep()) cases.push_back(c);
  for (const FamilyCase& f : plan_family_cases()) cases.push_back(f.c);  // the sanitizer set
  // Register-cached long rows; their staged twins (up to 64 unrolled stripes each) compile on
  // the GPU, and staged code reaches NVRTC here through the plan families.
  for (const Case& c : cluster_sweep())
    if (c.plan.caching != InputCaching::shared) cases.push_back(c);
  for (const Case& c : f64_sweep())  // double registers, double2 accesses; fewer shapes of one plan class
    if (c.rows != 0 && c.cols != 2 && c.cols != 1023) cases.push_back(c);
  for (BarrierScope scope : {BarrierScope::group, BarrierScope::program})
    for (InputCaching caching : {InputCaching::registers, InputCaching::reread}) {
      Case c;
      c.rows = 37, c.cols = 3000;
      c.plan.programs_per_group = 2, c.plan.barrier_scope = scope, c.plan.caching = caching;
      for (Op op : {Op::softmax, Op::log_softmax, Op::rms_norm, Op::layer_norm}) {
        c.op = op;
        cases.push_back(c);
      }
    }
  for (const Case& c : cases) {
    HostMatrix x(c.x, std::max<int64_t>(c.rows, 1), c.cols, c.x_stride_or_cols(), c.offset, 0);
    HostMatrix y(c.y, std::max<int64_t>(c.rows, 1), c.cols, c.y_stride_or_x(), c.y_offset_or_x(), 0);
    HostVector w(c.w, c.cols), b(c.w, c.cols);
    const Call call = host_call(c, x, y, w, b);
    sources.insert(c.plan.ctas_per_program.value_or(1) > 1 ? cluster_source(call, c.plan) : source_for(call, c.plan));
  }
  return {sources.begin(), sources.end()};
}

TEST(GeneratedSource, GroupBarriersAreReachedUnconditionally) {
  int barriers = 0, sources = 0, exact_branches = 0;
  for (const std::string& src : sweep_sources()) {
    ++sources;
    // Inside the kernel body, depth 1 is straight-line code; any if/for/else opens depth 2+,
    // except the loop over row blocks of a group (grid_limit), whose trip count is the same for
    // every thread of the group: a barrier may sit at depth 1 of its body. The program fast
    // path's exact branch (its first line says so) tests totals every worker read from shared
    // memory at the same indices: uniform too, which the IR verifier proves.
    size_t start = src.find("extern \"C\" __global__");
    ASSERT_NE(start, std::string::npos);
    std::istringstream lines(src.substr(start));
    std::string line;
    int depth = 0, number = 0;
    std::vector<bool> uniform;  // per open block: the row-block loop (or the kernel body)
    while (std::getline(lines, line)) {
      ++number;
      std::string code = line.substr(0, line.find("//"));
      if (line.find("// the fast path is not exact enough here: the exact path") != std::string::npos && !uniform.empty())
        uniform.back() = true, ++exact_branches;
      if (code.find("__syncthreads()") != std::string::npos || code.find("tile_named_barrier(") != std::string::npos ||
          code.find("tile_cluster_barrier()") != std::string::npos) {
        ++barriers;
        EXPECT_TRUE(depth >= 1 && std::all_of(uniform.begin(), uniform.end(), [](bool u) { return u; }))
            << "barrier under control flow at kernel line " << number << ": " << line;
        EXPECT_EQ(code.find("if"), std::string::npos) << line;
      }
      for (char ch : code) {
        if (ch == '{') ++depth, uniform.push_back(depth == 1 || code.find("for (block_it") != std::string::npos);
        if (ch == '}') --depth, uniform.pop_back();
      }
    }
  }
  EXPECT_GT(sources, 50);
  EXPECT_GT(barriers, 50);
  EXPECT_GT(exact_branches, 10);
}

TEST(GeneratedSource, NvrtcCompilesEveryKernelOfTheSweepForSm90) {
  std::filesystem::path dir = std::filesystem::temp_directory_path() / "tile-nvrtc-sweep-test";
  setenv("TILE_CACHE_DIR", dir.c_str(), 1);
  setenv("TILE_DISABLE_DISK_CACHE", "1", 1);
  int compiled = 0, clusters = 0, f64 = 0;
  for (const std::string& src : sweep_sources()) {
    auto result = cuda::compile_cubin(src, "sm_90");
    ASSERT_EQ(result->cubin.compare(0, 4, "\x7f" "ELF"), 0);
    ++compiled;
    clusters += src.find("tile_remote_shared_push(&") != std::string::npos;
    f64 += src.find("__shared__ double") != std::string::npos || src.find("double2 tile_w") != std::string::npos;
  }
  std::printf("NVRTC %s compiled %d kernels (%d cluster kernels) for sm_90\n", cuda::nvrtc_version().c_str(), compiled,
              clusters);
  EXPECT_GT(compiled, 50);
  EXPECT_GE(clusters, 30);  // the cluster families and the cluster sweep
  EXPECT_GE(f64, 20);       // float64 calls
}

}  // namespace
}  // namespace tile::testing
