// The workspace of reductions over the rows (src/api/ops.cpp): tile::workspace_bytes says what a
// call needs and agrees with what the launch uses; a workspace the caller gives
// (CallOptions::workspace) is the one the call writes, with the same result bit for bit as the
// library's own; one too small, misaligned or null is refused before anything runs, on the CPU
// backend, which uses a given workspace as CUDA does. WorkspaceGpu (api.workspace_gpu, label
// gpu): a CUDA-graph capture on a fresh stream with a caller's workspace, replayed bitwise like
// the eager call, and without one refused with its way out; a replay of such a call, with a
// given workspace or the library's, bitwise like an eager call. Python: test_tile_workspace.py,
// test_torch_compile.py.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <random>

#include "support/error_of.hpp"
#include "tile/training.hpp"

#if TILE_WITH_CUDA
#include <dlfcn.h>

#include <map>
#include <memory>
#include <string>

#include "backend/cuda/driver.hpp"
#include "target/target.hpp"  // tile::Replay
#endif

namespace tile {
namespace {

const CallOptions kCpu{{}, nullptr, Backend::cpu};

CallOptions with_workspace(void* ws, size_t bytes, PlanRequest plan = {}) {
  CallOptions o = kCpu;
  o.plan = plan;
  o.workspace = ws;
  o.workspace_size = bytes;
  return o;
}

std::vector<float> random(size_t n, unsigned seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 g(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = d(g);
  return v;
}

// rms_norm_backward with dweight (a reduction over the rows) on f32 operands; outputs poisoned.
struct RmsNormBackward {
  int64_t rows, cols;
  std::vector<float> dy, x, w, rstd, dx, dw;
  RmsNormBackward(int64_t r, int64_t c)
      : rows(r),
        cols(c),
        dy(random(size_t(r * c), 1)),
        x(random(size_t(r * c), 2)),
        w(random(size_t(c), 3)),
        rstd(random(size_t(r), 4, 0.5f, 2.0f)),
        dx(size_t(r * c), std::numeric_limits<float>::quiet_NaN()),
        dw(size_t(c), std::numeric_limits<float>::quiet_NaN()) {}
  Args args() {
    return Args()
        .set("dy", matrix(dy.data(), DType::f32, rows, cols))
        .set("x", matrix(x.data(), DType::f32, rows, cols))
        .set("weight", VectorView{w.data(), DType::f32, cols})
        .set("rstd", VectorView{rstd.data(), DType::f32, rows})
        .set("dx", matrix(dx.data(), DType::f32, rows, cols))
        .set("dweight", VectorView{dw.data(), DType::f32, cols});
  }
};

const RowProgram& rms_backward() { return training_program("rms_norm_backward"); }

using tile::testing::error_of;

TEST(Workspace, NoneForProgramsWithoutReductionsOverTheRows) {
  std::vector<float> x = random(64 * 100, 5), y(64 * 100);
  const Call softmax{Op::softmax, matrix(x.data(), DType::f32, 64, 100), matrix(y.data(), DType::f32, 64, 100)};
  EXPECT_EQ(workspace_bytes(softmax, kCpu), 0);
  EXPECT_EQ(workspace_bytes(softmax), 0);  // the CUDA backend's plan: still none, and no GPU needed
  EXPECT_EQ(run(softmax, kCpu).workspace_bytes, 0);
  std::vector<float> dy = random(64 * 100, 6), dx(64 * 100);
  const Args a = Args()
                     .set("y", matrix(y.data(), DType::f32, 64, 100))
                     .set("dy", matrix(dy.data(), DType::f32, 64, 100))
                     .set("dx", matrix(dx.data(), DType::f32, 64, 100));
  EXPECT_EQ(workspace_bytes(training_program("softmax_backward"), a, kCpu), 0);
  // A call that needs none ignores a workspace given, however small.
  float one = 0;
  EXPECT_NO_THROW(run(softmax, with_workspace(&one, 1)));
}

TEST(Workspace, QueryIsWhatTheLaunchUsesForEveryPlan) {
  RmsNormBackward t(300, 500);
  for (int ppg : {1, 2, 4}) {
    PlanRequest plan;
    plan.workers_per_program = 32, plan.programs_per_group = ppg;
    CallOptions o = kCpu;
    o.plan = plan;
    const int64_t bytes = workspace_bytes(rms_backward(), t.args(), o);
    EXPECT_GT(bytes, 0) << ppg;
    EXPECT_EQ(bytes % (4 * t.cols), 0) << "one fp32 partial per column and slot";
    const LaunchRecord rec = run(rms_backward(), t.args(), o);
    EXPECT_EQ(rec.kernels, 2);
    EXPECT_EQ(rec.workspace_bytes, bytes) << ppg;
  }
  // layer_norm_backward: dweight and dbias, two partials per column.
  std::vector<float> mean = random(300, 7), dbias(500);
  Args a = t.args();
  a.set("mean", VectorView{mean.data(), DType::f32, 300}).set("dbias", VectorView{dbias.data(), DType::f32, 500});
  const int64_t ln = workspace_bytes(training_program("layer_norm_backward"), a, kCpu);
  EXPECT_EQ(ln, 2 * workspace_bytes(rms_backward(), t.args(), kCpu));
  EXPECT_EQ(run(training_program("layer_norm_backward"), a, kCpu).workspace_bytes, ln);
}

TEST(Workspace, GivenWorkspaceIsTheOneWrittenWithTheSameResult) {
  RmsNormBackward own(300, 500), given(300, 500);
  run(rms_backward(), own.args(), kCpu);
  const OracleCheck ok = check_against_reference(rms_backward(), own.args());
  EXPECT_TRUE(ok.ok) << ok.first_mismatch;
  const int64_t bytes = workspace_bytes(rms_backward(), given.args(), kCpu);
  std::vector<float> ws(size_t(bytes / 4), std::numeric_limits<float>::quiet_NaN());
  const LaunchRecord rec = run(rms_backward(), given.args(), with_workspace(ws.data(), size_t(bytes)));
  EXPECT_EQ(rec.workspace_bytes, bytes);
  EXPECT_EQ(std::memcmp(own.dw.data(), given.dw.data(), own.dw.size() * 4), 0) << "dweight differs";
  EXPECT_EQ(std::memcmp(own.dx.data(), given.dx.data(), own.dx.size() * 4), 0) << "dx differs";
  size_t written = 0;
  for (float v : ws) written += !std::isnan(v);
  EXPECT_GT(written, 0u) << "the given workspace was not used";
  // A larger one is as good; its bytes past the need are left as they were.
  std::vector<float> larger(ws.size() + 16, -7.0f);
  RmsNormBackward again(300, 500);
  run(rms_backward(), again.args(), with_workspace(larger.data(), larger.size() * 4));
  EXPECT_EQ(std::memcmp(own.dw.data(), again.dw.data(), own.dw.size() * 4), 0);
  for (size_t i = ws.size(); i < larger.size(); ++i) EXPECT_EQ(larger[i], -7.0f) << i;
}

TEST(Workspace, TooSmallMisalignedOrNullIsRefusedBeforeTheLaunch) {
  RmsNormBackward t(64, 1000);
  const int64_t bytes = workspace_bytes(rms_backward(), t.args(), kCpu);
  std::vector<float> ws(size_t(bytes / 4) + 4);
  const std::string need = std::to_string(bytes);
  EXPECT_EQ(error_of([&] { run(rms_backward(), t.args(), with_workspace(ws.data(), size_t(bytes) - 4)); }),
            "rms_norm_backward: argument 'workspace': expected at least " + need +
                " bytes (tile::workspace_bytes of this call), got " + std::to_string(bytes - 4) + " bytes");
  EXPECT_EQ(error_of([&] { run(rms_backward(), t.args(), with_workspace(ws.data(), 0)); }),
            "rms_norm_backward: argument 'workspace': expected at least " + need +
                " bytes (tile::workspace_bytes of this call), got 0 bytes");
  char* base = reinterpret_cast<char*>(ws.data());
  EXPECT_EQ(error_of([&] { run(rms_backward(), t.args(), with_workspace(base + 2, size_t(bytes))); }),
            "rms_norm_backward: argument 'workspace': expected a pointer aligned to 4 bytes (it holds fp32 "
            "partials), got an address 2 bytes past a 4-byte boundary");
  EXPECT_EQ(error_of([&] { run(rms_backward(), t.args(), with_workspace(nullptr, size_t(bytes))); }),
            "rms_norm_backward: argument 'workspace': expected a pointer to the workspace_size = " + need +
                " bytes given, or none (nullptr and workspace_size 0), got nullptr");
  // Refused before anything ran: the outputs are still poisoned.
  for (float v : t.dw) EXPECT_TRUE(std::isnan(v));
  for (size_t i = 0; i < t.dx.size(); i += 97) EXPECT_TRUE(std::isnan(t.dx[i])) << i;
  // The training functions take the same options.
  EXPECT_EQ(error_of([&] {
              rms_norm_backward(matrix(t.dy.data(), DType::f32, 64, 1000), matrix(t.x.data(), DType::f32, 64, 1000),
                                VectorView{t.w.data(), DType::f32, 1000}, VectorView{t.rstd.data(), DType::f32, 64},
                                matrix(t.dx.data(), DType::f32, 64, 1000), VectorView{t.dw.data(), DType::f32, 1000},
                                with_workspace(ws.data(), 8));
            }),
            "rms_norm_backward: argument 'workspace': expected at least " + need +
                " bytes (tile::workspace_bytes of this call), got 8 bytes");
}

TEST(Workspace, QueryBindsAndChecksLikeRun) {
  RmsNormBackward t(4, 16);
  Args a = t.args();
  a.set("rstd", VectorView{t.rstd.data(), DType::f32, 3});
  EXPECT_EQ(error_of([&] { workspace_bytes(rms_backward(), a, kCpu); }),
            "rms_norm_backward: argument 'rstd': expected 4 elements (one per row), got 3");
}

#if TILE_WITH_CUDA  // the GPU half uses the driver API; a build without CUDA has no api.workspace_gpu

// The driver's stream-capture and graph entry points, which the library never calls: looked up
// in the libcuda the library loaded.
struct GraphApi {
  decltype(&::cuStreamBeginCapture) begin = nullptr;
  decltype(&::cuStreamEndCapture) end = nullptr;
  decltype(&::cuGraphInstantiateWithFlags) instantiate = nullptr;
  decltype(&::cuGraphLaunch) launch = nullptr;
  decltype(&::cuGraphExecDestroy) exec_destroy = nullptr;
  decltype(&::cuGraphDestroy) destroy = nullptr;

  GraphApi() {
    cuda::driver();
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (!lib) return;
    begin = reinterpret_cast<decltype(begin)>(dlsym(lib, "cuStreamBeginCapture_v2"));
    end = reinterpret_cast<decltype(end)>(dlsym(lib, "cuStreamEndCapture"));
    instantiate = reinterpret_cast<decltype(instantiate)>(dlsym(lib, "cuGraphInstantiateWithFlags"));
    launch = reinterpret_cast<decltype(launch)>(dlsym(lib, "cuGraphLaunch"));
    exec_destroy = reinterpret_cast<decltype(exec_destroy)>(dlsym(lib, "cuGraphExecDestroy"));
    destroy = reinterpret_cast<decltype(destroy)>(dlsym(lib, "cuGraphDestroy"));
  }
  bool ok() const { return begin && end && instantiate && launch && exec_destroy && destroy; }
};

class WorkspaceGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda::driver_available()) GTEST_SKIP() << "no CUDA driver: GPU tests need a GPU";
    cuda::ensure_context(0);
  }
};

// rms_norm_backward's operands on the device, uploaded from a host case.
struct DeviceRmsNormBackward {
  RmsNormBackward& host;
  cuda::DeviceBuffer dy, x, w, rstd, dx, dw;
  explicit DeviceRmsNormBackward(RmsNormBackward& h)
      : host(h),
        dy(h.dy.size() * 4),
        x(h.x.size() * 4),
        w(h.w.size() * 4),
        rstd(h.rstd.size() * 4),
        dx(h.dx.size() * 4),
        dw(h.dw.size() * 4) {
    upload();
  }
  void upload() {
    dy.copy_from_host(host.dy.data(), dy.bytes());
    x.copy_from_host(host.x.data(), x.bytes());
    w.copy_from_host(host.w.data(), w.bytes());
    rstd.copy_from_host(host.rstd.data(), rstd.bytes());
    dx.fill_byte(0xff);  // NaN until written
    dw.fill_byte(0xff);
    // The synchronous copies and memsets may still be in flight: the launches on other streams
    // must not overtake them.
    TILE_CU_CHECK(cuda::driver().cuCtxSynchronize());
  }
  Args args() {
    const int64_t r = host.rows, c = host.cols;
    return Args()
        .set("dy", matrix(dy.get(), DType::f32, r, c))
        .set("x", matrix(x.get(), DType::f32, r, c))
        .set("weight", VectorView{w.get(), DType::f32, c})
        .set("rstd", VectorView{rstd.get(), DType::f32, r})
        .set("dx", matrix(dx.get(), DType::f32, r, c))
        .set("dweight", VectorView{dw.get(), DType::f32, c});
  }
  // The outputs, into the host case (whose args() then check them against float64).
  void download() {
    dx.copy_to_host(host.dx.data(), dx.bytes());
    dw.copy_to_host(host.dw.data(), dw.bytes());
  }
};

TEST_F(WorkspaceGpu, CaptureOnAFreshStreamWithACallersWorkspace) {
  const GraphApi graphs;
  ASSERT_TRUE(graphs.ok()) << "libcuda lacks the stream-capture entry points";
  RmsNormBackward host(300, 500);
  DeviceRmsNormBackward dev(host);
  CallOptions eager;
  eager.device = 0;
  run(rms_backward(), dev.args(), eager);  // compiles and loads both kernels: the only build
  TILE_CU_CHECK(cuda::driver().cuCtxSynchronize());
  dev.download();
  const std::vector<float> dx_eager = host.dx, dw_eager = host.dw;
  const OracleCheck ok = check_against_reference(rms_backward(), host.args());
  EXPECT_TRUE(ok.ok) << ok.first_mismatch;

  cuda::Stream stream;  // no call has used it: the library has no workspace of its own there
  CallOptions captured;
  captured.stream = stream.get();
  const int64_t bytes = workspace_bytes(rms_backward(), dev.args(), captured);
  ASSERT_GT(bytes, 0);
  cuda::DeviceBuffer ws{static_cast<size_t>(bytes)};
  ws.fill_byte(0xff);
  captured.workspace = ws.get(), captured.workspace_size = ws.bytes();
  dev.upload();  // outputs poisoned again
  TILE_CU_CHECK(graphs.begin(stream.get(), CU_STREAM_CAPTURE_MODE_GLOBAL));
  const std::string error = error_of([&] { run(rms_backward(), dev.args(), captured); });
  CUgraph graph = nullptr;
  TILE_CU_CHECK(graphs.end(stream.get(), &graph));
  ASSERT_EQ(error, "");
  CUgraphExec exec = nullptr;
  TILE_CU_CHECK(graphs.instantiate(&exec, graph, 0));
  for (int replay = 0; replay < 2; ++replay) {
    dev.upload();
    TILE_CU_CHECK(graphs.launch(exec, stream.get()));
    stream.synchronize();
    dev.download();
    EXPECT_EQ(std::memcmp(host.dx.data(), dx_eager.data(), dx_eager.size() * 4), 0) << "dx, replay " << replay;
    EXPECT_EQ(std::memcmp(host.dw.data(), dw_eager.data(), dw_eager.size() * 4), 0) << "dweight, replay " << replay;
  }
  const OracleCheck replayed = check_against_reference(rms_backward(), host.args());
  EXPECT_TRUE(replayed.ok) << replayed.first_mismatch;
  TILE_CU_CHECK(graphs.exec_destroy(exec));
  TILE_CU_CHECK(graphs.destroy(graph));
}

// A call that reduces over the rows replays both its phases (target.hpp, Replay): on other
// buffers, with a caller's workspace and with the library's, bit for bit what an eager call
// on those buffers writes.
TEST_F(WorkspaceGpu, ReplayRunsBothPhasesWithAGivenOrTheLibrarysWorkspace) {
  RmsNormBackward host(300, 500);
  DeviceRmsNormBackward first(host);
  std::shared_ptr<const Replay> replay;
  run(rms_backward(), first.args(), CallOptions{}, replay);
  ASSERT_NE(replay, nullptr);
  EXPECT_GT(replay->workspace_bytes(), 0);
  EXPECT_EQ(replay->workspace_bytes(), workspace_bytes(rms_backward(), first.args()));

  host.dy = random(host.dy.size(), 11);  // other inputs in other buffers: the replay reads these
  host.x = random(host.x.size(), 12);
  DeviceRmsNormBackward second(host);
  run(rms_backward(), second.args(), CallOptions{});
  TILE_CU_CHECK(cuda::driver().cuCtxSynchronize());
  second.download();
  const std::vector<float> dx_eager = host.dx, dw_eager = host.dw;
  const OracleCheck ok = check_against_reference(rms_backward(), host.args());
  EXPECT_TRUE(ok.ok) << ok.first_mismatch;

  const void* data[16] = {};
  const auto& decls = rms_backward().operands();
  ASSERT_LE(decls.size(), 16u);
  const std::map<std::string, const void*> by_name = {{"dy", second.dy.get()},     {"x", second.x.get()},
                                                     {"weight", second.w.get()},  {"rstd", second.rstd.get()},
                                                     {"dx", second.dx.get()},     {"dweight", second.dw.get()}};
  for (size_t i = 0; i < decls.size(); ++i)
    if (auto it = by_name.find(decls[i].name); it != by_name.end()) data[i] = it->second;
  cuda::DeviceBuffer ws{static_cast<size_t>(replay->workspace_bytes())};
  for (void* workspace : {static_cast<void*>(ws.get()), static_cast<void*>(nullptr)}) {
    ws.fill_byte(0xff);
    second.upload();  // outputs poisoned again
    ASSERT_TRUE(replay->launch(data, nullptr, workspace));
    TILE_CU_CHECK(cuda::driver().cuCtxSynchronize());
    second.download();
    const char* which = workspace ? "the caller's workspace" : "the library's workspace";
    EXPECT_EQ(std::memcmp(host.dx.data(), dx_eager.data(), dx_eager.size() * 4), 0) << "dx, " << which;
    EXPECT_EQ(std::memcmp(host.dw.data(), dw_eager.data(), dw_eager.size() * 4), 0) << "dweight, " << which;
  }
}

TEST_F(WorkspaceGpu, CaptureWithoutAWorkspaceSaysHowToGiveOne) {
  const GraphApi graphs;
  ASSERT_TRUE(graphs.ok()) << "libcuda lacks the stream-capture entry points";
  RmsNormBackward host(300, 500);
  DeviceRmsNormBackward dev(host);
  run(rms_backward(), dev.args(), CallOptions{});  // loaded: only the workspace is missing
  TILE_CU_CHECK(cuda::driver().cuCtxSynchronize());
  cuda::Stream stream;
  CallOptions captured;
  captured.stream = stream.get();
  TILE_CU_CHECK(graphs.begin(stream.get(), CU_STREAM_CAPTURE_MODE_GLOBAL));
  const std::string error = error_of([&] { run(rms_backward(), dev.args(), captured); });
  CUgraph graph = nullptr;
  TILE_CU_CHECK(graphs.end(stream.get(), &graph));  // nothing was recorded: the capture is still valid
  if (graph) TILE_CU_CHECK(graphs.destroy(graph));
  EXPECT_EQ(error.rfind("CUDA-graph capture: kernel tile_rms_norm_backward", 0), 0u) << error;
  EXPECT_NE(error.find("needs a workspace of " + std::to_string(workspace_bytes(rms_backward(), dev.args())) +
                       " bytes on the capturing stream"),
            std::string::npos)
      << error;
  EXPECT_NE(error.find("CallOptions::workspace"), std::string::npos) << error;
}

#endif  // TILE_WITH_CUDA

}  // namespace
}  // namespace tile
