// The kernel caches of src/api (prepared kernels, loaded kernels) and the compile cache under
// concurrent calls while another thread keeps clearing them: every result must still come from
// its own kernel. The operators mixed here give different outputs on one input, so a call that
// launched another call's kernel fails its float64 check.
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

#include "support/cases.hpp"

namespace tile::testing {
namespace {
namespace fs = std::filesystem;

struct Variant {
  Op op;
  PlanRequest plan;
};

// Four operators, each under six plans: 24 distinct prepared kernels.
std::vector<Variant> variants() {
  std::vector<Variant> out;
  for (Op op : {Op::softmax, Op::log_softmax, Op::rms_norm, Op::layer_norm})
    for (int workers : {32, 64, 128})
      for (InputCaching caching : {InputCaching::registers, InputCaching::reread}) {
        Variant v{op, {}};
        v.plan.workers_per_program = workers;
        v.plan.caching = caching;
        out.push_back(v);
      }
  return out;
}

// One fp32 input, weight and bias, read by every thread; each variant's float64 reference.
struct Inputs {
  int64_t rows, cols;
  HostMatrix x;
  HostVector weight, bias;
  std::vector<Variant> variants = tile::testing::variants();
  std::vector<std::vector<double>> references;

  Inputs(int64_t rows, int64_t cols) : rows(rows), cols(cols), x(DType::f32, rows, cols, cols),
                                       weight(DType::f32, cols), bias(DType::f32, cols) {
    std::mt19937_64 rng(2026);
    x.fill_random(rng, 2.0);
    weight.fill_random(rng, 1.0, 0.5);
    bias.fill_random(rng, 0.0, 0.5);
    for (const Variant& v : variants) references.push_back(oracle(call(v, x.view())));
  }
  // Host pointers; the GPU test swaps in device pointers to launch.
  Call call(const Variant& v, TensorView y) {
    Call c{v.op, x.view(), y};
    if (v.op == Op::rms_norm || v.op == Op::layer_norm) c.weight = weight.view();
    if (v.op == Op::layer_norm) c.bias = bias.view();
    return c;
  }
};

std::string describe(const Variant& v, const LaunchRecord& r) {
  return op_name(v.op) + " plan " + r.plan.to_json();
}

// The test can tell the kernels apart: each operator's output, checked against the reference
// of every other operator, fails.
void expect_operators_distinguishable(Inputs& in, const std::vector<HostMatrix>& outputs) {
  for (size_t i = 0; i < in.variants.size(); ++i)
    for (size_t j = 0; j < in.variants.size(); ++j) {
      if (in.variants[i].op == in.variants[j].op) continue;
      HostMatrix y = outputs[i];
      EXPECT_FALSE(check_against(in.call(in.variants[i], y.view()), in.references[j]).ok)
          << op_name(in.variants[i].op) << "'s output passes " << op_name(in.variants[j].op) << "'s check";
    }
}

// Runs `work(thread, variant index)` for every variant `rounds` times on each of `threads`
// threads (each in its own order) while another thread clears every kernel cache; returns the
// failures the work reported and how often the caches were cleared.
template <typename Work>
std::pair<std::vector<std::string>, int> run_while_clearing(int threads, int rounds, size_t variants, Work work) {
  std::atomic<bool> done{false};
  std::atomic<int> clears{0};
  std::thread clearer([&] {
    while (!done.load()) {
      clear_kernel_caches();
      ++clears;
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  });
  std::vector<std::vector<std::string>> failures(static_cast<size_t>(threads));
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t)
    workers.emplace_back([&, t] {
      try {
        for (int round = 0; round < rounds; ++round)
          for (size_t k = 0; k < variants; ++k) {
            // Strides prime to 24 visit every variant, each thread in its own order.
            static constexpr size_t kStrides[] = {1, 5, 7, 11, 13, 17, 19, 23};
            const size_t i = (k * kStrides[size_t(t) % 8] + size_t(t) + size_t(round)) % variants;
            if (std::string failure = work(t, i); !failure.empty()) failures[size_t(t)].push_back(failure);
          }
      } catch (const std::exception& e) {
        failures[size_t(t)].push_back(std::string("thread ") + std::to_string(t) + " threw: " + e.what());
      }
    });
  for (std::thread& w : workers) w.join();
  done = true;
  clearer.join();
  std::vector<std::string> all;
  for (auto& f : failures) all.insert(all.end(), f.begin(), f.end());
  return {all, clears.load()};
}

TEST(KernelCacheCpu, ConcurrentCallsWhileCachesAreCleared) {
  Inputs in(5, 300);
  std::vector<HostMatrix> outputs;
  for (const Variant& v : in.variants) {
    outputs.emplace_back(DType::f32, in.rows, in.cols, in.cols);
    outputs.back().poison();
    run(in.call(v, outputs.back().view()), {v.plan, nullptr, Backend::cpu});
  }
  expect_operators_distinguishable(in, outputs);

  const int threads = 4, rounds = 20;
  std::atomic<int> checked{0};
  auto [failures, clears] = run_while_clearing(threads, rounds, in.variants.size(), [&](int, size_t i) -> std::string {
    const Variant& v = in.variants[i];
    HostMatrix y(DType::f32, in.rows, in.cols, in.cols);
    y.poison();
    const Call call = in.call(v, y.view());
    LaunchRecord r = run(call, {v.plan, nullptr, Backend::cpu});
    OracleCheck check = check_against(call, in.references[i]);
    ++checked;
    if (!check.ok) return describe(v, r) + ": " + check.first_mismatch;
    if (!y.outside_untouched()) return describe(v, r) + ": wrote outside its rows";
    return "";
  });
  for (const std::string& f : failures) ADD_FAILURE() << f;
  EXPECT_EQ(checked.load(), threads * rounds * int(in.variants.size()));
  EXPECT_GT(clears, 0);
  std::printf("%d CPU calls on %d threads checked against the oracle; caches cleared %d times meanwhile\n",
              checked.load(), threads, clears);
}

#if TILE_WITH_CUDA  // the GPU half uses the driver API; a build without CUDA has no api.ops_gpu
class KernelCacheGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda::driver_available()) GTEST_SKIP() << "no CUDA driver: GPU tests need a GPU";
    // A fresh disk cache: the first call of each kernel compiles, calls after a clear read it back.
    const char* saved = std::getenv("TILE_CACHE_DIR");
    saved_ = saved ? std::optional<std::string>(saved) : std::nullopt;
    dir_ = fs::temp_directory_path() / ("tile-ops-test-" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    ::setenv("TILE_CACHE_DIR", dir_.c_str(), 1);
    clear_kernel_caches();
  }
  void TearDown() override {
    if (dir_.empty()) return;
    clear_kernel_caches();
    if (saved_)
      ::setenv("TILE_CACHE_DIR", saved_->c_str(), 1);
    else
      ::unsetenv("TILE_CACHE_DIR");
    std::error_code ignored;
    fs::remove_all(dir_, ignored);
  }

  std::optional<std::string> saved_;
  fs::path dir_;
};

// One thread's device copies of the inputs and its output, on its own stream.
struct DeviceOperands {
  cuda::DeviceBuffer x, y, weight, bias;
  DeviceOperands(Inputs& in, HostMatrix& y_host)
      : x(in.x.bytes().size()), y(y_host.bytes().size()), weight(in.weight.bytes.size()),
        bias(in.bias.bytes.size()) {
    x.copy_from_host(in.x.bytes().data(), in.x.bytes().size());
    weight.copy_from_host(in.weight.bytes.data(), in.weight.bytes.size());
    bias.copy_from_host(in.bias.bytes.data(), in.bias.bytes.size());
    // Copies from pageable memory may still be in flight; kernels on a non-blocking stream
    // would not wait for them.
    TILE_CU_CHECK(cuda::driver().cuCtxSynchronize());
  }
  // `call` with host pointers -> the same call on these buffers.
  Call on_device(Call call) {
    call.x.data = x.get();
    call.y.data = y.get();
    if (call.weight.data) call.weight.data = weight.get();
    if (call.bias.data) call.bias.data = bias.get();
    return call;
  }
  // Poisons the output and its guard band, launches on `stream`, waits and copies both back.
  LaunchRecord launch(const Call& host_call, const PlanRequest& plan, const cuda::Stream& stream, HostMatrix& y_host) {
    TILE_CU_CHECK(cuda::driver().cuMemsetD8Async(y.device_ptr(), 0xff, y.bytes(), stream.get()));
    LaunchRecord r = run(on_device(host_call), {plan, stream.get(), Backend::cuda});
    stream.synchronize();
    y.copy_to_host(y_host.bytes().data(), y_host.bytes().size());
    return r;
  }
};

TEST_F(KernelCacheGpu, LoadedKernelGoesWithItsPreparedKernel) {
  Inputs in(64, 1000);
  cuda::ensure_context(0);
  cuda::Stream stream;
  HostMatrix y(DType::f32, in.rows, in.cols, in.cols);
  DeviceOperands dev(in, y);
  const Variant& v = in.variants[0];
  const Call call = in.call(v, y.view());
  std::vector<std::string> origins;
  for (int i = 0; i < 3; ++i) {
    if (i == 2) clear_kernel_caches();
    origins.push_back(dev.launch(call, v.plan, stream, y).cache_origin);
    EXPECT_TRUE(check_against(call, in.references[0]).ok) << "call " << i;
  }
  EXPECT_EQ(origins[0], "compiled");
  EXPECT_EQ(origins[1], "launch-cache");
  EXPECT_EQ(origins[2], "disk");  // the prepared kernel, its loaded kernel and the memory cache were cleared
}

TEST_F(KernelCacheGpu, ThreadsOnOwnStreamsWhileCachesAreCleared) {
  Inputs in(64, 1000);
  cuda::ensure_context(0);
  std::printf("device: %s\n", cuda::device_info(0).name.c_str());
  {
    cuda::Stream stream;
    HostMatrix y(DType::f32, in.rows, in.cols, in.cols);
    DeviceOperands dev(in, y);
    std::vector<HostMatrix> outputs;
    for (size_t i = 0; i < in.variants.size(); ++i) {
      dev.launch(in.call(in.variants[i], y.view()), in.variants[i].plan, stream, y);
      outputs.push_back(y);
      EXPECT_TRUE(check_against(in.call(in.variants[i], outputs.back().view()), in.references[i]).ok);
    }
    expect_operators_distinguishable(in, outputs);
  }

  const int threads = 8, rounds = 20;
  std::atomic<int> checked{0};
  std::mutex origins_mutex;
  std::map<std::string, int> origins;
  struct PerThread {
    cuda::Stream stream;
    HostMatrix y;
    DeviceOperands dev;
  };
  std::vector<std::unique_ptr<PerThread>> per_thread(threads);
  auto [failures, clears] = run_while_clearing(threads, rounds, in.variants.size(), [&](int t, size_t i) -> std::string {
    auto& mine = per_thread[size_t(t)];
    if (!mine) {
      cuda::ensure_context(0);
      HostMatrix y(DType::f32, in.rows, in.cols, in.cols);
      mine.reset(new PerThread{cuda::Stream(), y, DeviceOperands(in, y)});
    }
    const Variant& v = in.variants[i];
    const Call call = in.call(v, mine->y.view());
    LaunchRecord r = mine->dev.launch(call, v.plan, mine->stream, mine->y);
    {
      std::lock_guard<std::mutex> lock(origins_mutex);
      ++origins[r.cache_origin];
    }
    OracleCheck check = check_against(call, in.references[i]);
    ++checked;
    if (!check.ok) return describe(v, r) + ": " + check.first_mismatch + " (" + r.cache_origin + ")";
    if (!mine->y.outside_untouched()) return describe(v, r) + ": wrote outside its rows";
    return "";
  });
  for (const std::string& f : failures) ADD_FAILURE() << f;
  EXPECT_EQ(checked.load(), threads * rounds * int(in.variants.size()));
  EXPECT_GT(clears, 0);
  std::printf("%d GPU launches on %d streams checked against the oracle; caches cleared %d times meanwhile;",
              checked.load(), threads, clears);
  for (const auto& [origin, count] : origins) std::printf(" %s %d", origin.c_str(), count);
  std::printf("\n");
}
#endif  // TILE_WITH_CUDA

}  // namespace
}  // namespace tile::testing
