// NVRTC compiles every kernel of the CPU sweep for sm_90 (no GPU needed), and every group
// barrier in the generated source is reached unconditionally.
#include <cstdlib>
#include <filesystem>
#include <set>
#include <sstream>

#include "bind/bind.hpp"
#include "backend/cuda/jit_module.hpp"
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

std::vector<std::string> sweep_sources() {
  std::set<std::string> sources;
  std::vector<Case> cases = core_sweep();
  for (const Case& c : packing_sweep()) cases.push_back(c);
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
    HostMatrix x(c.x, std::max<int64_t>(c.rows, 1), c.cols, c.stride ? c.stride : c.cols, c.offset, 0);
    HostMatrix y(c.y, std::max<int64_t>(c.rows, 1), c.cols, c.stride ? c.stride : c.cols, c.offset, 0);
    HostVector w(c.w, c.cols), b(c.w, c.cols);
    sources.insert(source_for(host_call(c, x, y, w, b), c.plan));
  }
  return {sources.begin(), sources.end()};
}

TEST(GeneratedSource, GroupBarriersAreReachedUnconditionally) {
  int barriers = 0, sources = 0;
  for (const std::string& src : sweep_sources()) {
    ++sources;
    // Inside the kernel body, depth 1 is straight-line code; any if/for/else opens depth 2+.
    size_t start = src.find("extern \"C\" __global__");
    ASSERT_NE(start, std::string::npos);
    std::istringstream lines(src.substr(start));
    std::string line;
    int depth = 0, number = 0;
    while (std::getline(lines, line)) {
      ++number;
      std::string code = line.substr(0, line.find("//"));
      if (code.find("__syncthreads()") != std::string::npos || code.find("tile_named_barrier(") != std::string::npos) {
        ++barriers;
        EXPECT_EQ(depth, 1) << "barrier under control flow at kernel line " << number << ": " << line;
        EXPECT_EQ(code.find("if"), std::string::npos) << line;
      }
      for (char ch : code) depth += ch == '{' ? 1 : ch == '}' ? -1 : 0;
    }
  }
  EXPECT_GT(sources, 50);
  EXPECT_GT(barriers, 50);
}

TEST(GeneratedSource, NvrtcCompilesEveryKernelOfTheSweepForSm90) {
  std::filesystem::path dir = std::filesystem::temp_directory_path() / "tile-nvrtc-sweep-test";
  setenv("TILE_CACHE_DIR", dir.c_str(), 1);
  setenv("TILE_DISABLE_DISK_CACHE", "1", 1);
  int compiled = 0;
  for (const std::string& src : sweep_sources()) {
    auto result = cuda::compile_cubin(src, "sm_90");
    ASSERT_EQ(result->cubin.compare(0, 4, "\x7f" "ELF"), 0);
    ++compiled;
  }
  std::printf("NVRTC %s compiled %d kernels for sm_90\n", cuda::nvrtc_version().c_str(), compiled);
  EXPECT_GT(compiled, 50);
}

}  // namespace
}  // namespace tile::testing
