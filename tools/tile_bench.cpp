// `tile bench`: bandwidth of the default (analytic) plans against a device-to-device copy of
// the same bytes timed the same way in the same process. Every kernel output is checked
// against the float64 oracle before it is timed. This is a quick look; bench/ holds the
// rigorous runner.
#include <algorithm>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include <atomic>
#include <chrono>
#include <fstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "backend/cuda/driver.hpp"
#include "bind/bind.hpp"
#include "backend/cuda/jit_module.hpp"
#include "testing/host_tensor.hpp"
#include "tile/tile.hpp"
#include "tile_cli.hpp"

namespace tile::cli {

namespace {

namespace cu = tile::cuda;

// Median per-launch milliseconds of `batches` batches of `launches` calls, timed with events.
template <typename F>
double median_ms(F&& launch, int launches, int batches) {
  std::vector<double> per_launch;
  cu::Event start, stop;
  for (int b = 0; b < batches; ++b) {
    start.record();
    for (int i = 0; i < launches; ++i) launch();
    stop.record();
    stop.synchronize();
    per_launch.push_back(double(stop.elapsed_ms_since(start)) / launches);
  }
  std::sort(per_launch.begin(), per_launch.end());
  return per_launch[per_launch.size() / 2];
}

template <typename F>
double timed(F&& launch) {
  for (int i = 0; i < 3; ++i) launch();  // warm up (compile, module load, clocks)
  double probe = median_ms(launch, 3, 1);
  int launches = std::clamp(int(20.0 / std::max(probe, 1e-3)), 3, 20000);  // about 20 ms a batch
  return median_ms(launch, launches, 7);
}

// Milliseconds per device-to-device copy that reads and writes `bytes` in all, timed like a kernel.
double copy_ms(double bytes) {
  const size_t half = size_t(bytes / 2);
  cu::DeviceBuffer src(half), dst(half);
  src.fill_byte(0x3c);
  return timed([&] { TILE_CU_CHECK(cu::driver().cuMemcpyDtoDAsync(dst.device_ptr(), src.device_ptr(), half, nullptr)); });
}

// One operator call on device buffers holding random inputs, with host copies for the oracle.
struct DeviceCase {
  DeviceCase(tile::Op op, tile::DType dt, long long rows, long long cols, uint64_t seed)
      : x(dt, rows, cols, cols, 0, 0), y(dt, rows, cols, cols, 0, 0), w(dt, cols), b(dt, cols),
        dx(x.bytes().size()), dy(y.bytes().size()), dw(w.bytes.size()), db(b.bytes.size()) {
    std::mt19937_64 rng(seed);
    x.fill_random(rng);
    w.fill_random(rng, 1.0, 0.5);
    b.fill_random(rng, 0.0, 0.5);
    dx.copy_from_host(x.bytes().data(), x.bytes().size());
    dw.copy_from_host(w.bytes.data(), w.bytes.size());
    db.copy_from_host(b.bytes.data(), b.bytes.size());
    set_op(op);
  }
  void set_op(tile::Op op) {
    const tile::DType dt = x.view().dtype;
    const long long rows = x.view().rows, cols = x.view().cols;
    call = tile::Call{op, tile::matrix(dx.get(), dt, rows, cols), tile::matrix(dy.get(), dt, rows, cols)};
    if (op == tile::Op::rms_norm || op == tile::Op::layer_norm) call.weight = {dw.get(), dt, cols};
    if (op == tile::Op::layer_norm) call.bias = {db.get(), dt, cols};
    reference.clear();
  }
  // Poisons the output, runs once, checks every element against the float64 oracle.
  tile::OracleCheck run_checked(const tile::PlanRequest& request, tile::LaunchRecord* rec) {
    dy.fill_byte(0xff);
    *rec = tile::run(call, {request});
    TILE_CU_CHECK(cu::driver().cuCtxSynchronize());
    dy.copy_to_host(y.bytes().data(), y.bytes().size());
    tile::Call host = call;
    host.x.data = x.data(), host.y.data = y.data();
    if (call.weight.data) host.weight.data = w.data();
    if (call.bias.data) host.bias.data = b.data();
    if (reference.empty()) reference = tile::oracle(host);  // once per operator and input
    return tile::check_against(host, reference, rec->plan);
  }
  // Input read once, output written once, weight and bias once.
  double bytes() const {
    const int es = tile::dtype_size(call.x.dtype);
    return double(call.x.rows * call.x.cols) * 2 * es +
           double(call.x.cols) * es * ((call.weight.data != nullptr) + (call.bias.data != nullptr));
  }
  tile::testing::HostMatrix x, y;
  tile::testing::HostVector w, b;
  cu::DeviceBuffer dx, dy, dw, db;
  tile::Call call;
  std::vector<double> reference;  // the float64 oracle of `call`, computed on first use
};

// `tile bench --host`: per operator and small shape (the four seed shapes, fp32, and decode
// sizes of 1, 8, 64 rows x 4096 and 16384): host microseconds per tile::run call (median of 25
// samples of 200 calls issued back to back, steady_clock, one synchronize after each sample)
// and per tile::plan_for call (its binding and planning, the same way),
// then GPU microseconds per launch back to back (event-timed batches) for the kernel, for a
// device copy of the same bytes and for an empty kernel (the launch floor).
int host_main() {
  cu::ensure_context(0);
  cu::DeviceInfo dev = cu::device_info(0);
  auto empty = tile::cuda::compile_cubin("extern \"C\" __global__ void tile_empty() {}", tile::cuda::arch_name(dev));
  CUfunction empty_fn = tile::cuda::get_function(*empty, "tile_empty");
  auto launch_empty = [&] { TILE_CU_CHECK(cu::driver().cuLaunchKernel(empty_fn, 1, 1, 1, 32, 1, 1, 0, nullptr, nullptr, nullptr)); };
  const double floor_us = timed(launch_empty) * 1e3;
  std::printf("device %s (%s); empty-kernel launch floor %.2f us per launch back to back\n", dev.name.c_str(),
              dev.uuid.c_str(), floor_us);
  std::printf("%-12s %-12s %9s %9s %9s %9s %9s %9s %9s\n", "op", "shape", "host_us", "plan_us", "wall_us", "gpu_us",
              "copy_us", "gpu/copy", "gpu/floor");
  std::vector<std::pair<long long, long long>> shapes = {{37, 1537}, {256, 3072}, {768, 6144}, {1024, 4096},
                                                         {1, 4096}, {8, 4096}, {64, 4096}, {1, 16384}, {8, 16384}, {64, 16384}};
  for (tile::Op op : {tile::Op::softmax, tile::Op::log_softmax, tile::Op::rms_norm, tile::Op::layer_norm})
    for (auto [rows, cols] : shapes) {
      DeviceCase c(op, tile::DType::f32, rows, cols, uint64_t(rows * 131 + cols));
      tile::LaunchRecord rec;
      tile::OracleCheck check = c.run_checked({}, &rec);
      if (!check.ok) {
        std::printf("%-12s oracle FAIL: %s\n", tile::op_name(op).c_str(), check.first_mismatch.c_str());
        return 1;
      }
      std::vector<double> host, wall;
      for (int i = 0; i < 20; ++i) tile::run(c.call);
      TILE_CU_CHECK(cu::driver().cuCtxSynchronize());
      for (int sample = 0; sample < 25; ++sample) {
        auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < 200; ++i) tile::run(c.call);
        auto t1 = std::chrono::steady_clock::now();
        TILE_CU_CHECK(cu::driver().cuCtxSynchronize());
        auto t2 = std::chrono::steady_clock::now();
        host.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count() / 200);
        wall.push_back(std::chrono::duration<double, std::micro>(t2 - t0).count() / 200);
      }
      // The part of a call before its launch: binding and planning (tile::plan_for).
      std::vector<double> plan;
      for (int sample = 0; sample < 25; ++sample) {
        auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < 200; ++i) tile::plan_for(c.call);
        plan.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / 200);
      }
      std::sort(host.begin(), host.end());
      std::sort(wall.begin(), wall.end());
      std::sort(plan.begin(), plan.end());
      const double gpu_us = timed([&] { tile::run(c.call); }) * 1e3;
      const double copy_us = copy_ms(c.bytes()) * 1e3;
      std::printf("%-12s %-12s %9.2f %9.2f %9.2f %9.2f %9.2f %9.2f %9.2f\n", tile::op_name(op).c_str(),
                  (std::to_string(rows) + "x" + std::to_string(cols)).c_str(), host[12], plan[12], wall[12], gpu_us,
                  copy_us, gpu_us / copy_us, gpu_us / floor_us);
      std::fflush(stdout);
    }
  return 0;
}

}  // namespace

int bench_main(const BenchOptions& options) {
  // `tile bench [--plan JSON] [--shape RxC]... [--op NAME]... [--dtype T]...`: fixed plan fields for
  // every call; shapes, operators and dtypes to time.
  // `tile bench --host`: host and launch-bound times of small calls (host_main).
  if (options.host) return host_main();
  std::vector<std::pair<long long, long long>> shapes = {{37, 1537}, {256, 3072}, {768, 6144}, {1024, 4096}, {32768, 4096}, {4096, 32768}};
  std::vector<tile::Op> ops = {tile::Op::softmax, tile::Op::log_softmax, tile::Op::rms_norm, tile::Op::layer_norm};
  if (!options.ops.empty()) ops = options.ops;
  std::vector<tile::DType> dtypes = {tile::DType::f32, tile::DType::bf16};
  if (!options.dtypes.empty()) dtypes = options.dtypes;
  const tile::PlanRequest& request = options.request;
  if (!options.shapes.empty()) {
    shapes.clear();
    for (const Shape& shape : options.shapes) shapes.push_back({shape.rows, shape.cols});
  }
  cu::ensure_context(0);
  cu::DeviceInfo dev = cu::device_info(0);
  std::printf("device %s (%s), %d SMs; times are medians of 7 event-timed batches of back-to-back launches\n",
              dev.name.c_str(), dev.uuid.c_str(), dev.sm_count);
  std::printf("%-12s %-5s %-12s %10s %10s %10s %9s  %s\n", "op", "dtype", "shape", "kernel_us", "GB/s", "copy_GB/s", "%copy", "plan");
  for (tile::DType dt : dtypes)
    for (auto [rows, cols] : shapes) {
      DeviceCase c(ops[0], dt, rows, cols, uint64_t(rows * 131 + cols));
      for (tile::Op op : ops) {
        c.set_op(op);
        tile::LaunchRecord rec;
        tile::OracleCheck check = c.run_checked(request, &rec);
        if (!check.ok) {
          std::printf("%-12s oracle FAIL: %s\n", tile::op_name(op).c_str(), check.first_mismatch.c_str());
          return 1;
        }
        const double bytes = c.bytes();
        double kernel_ms = timed([&] { tile::run(c.call, {request}); });
        double gbs = bytes / kernel_ms / 1e6, copy_gbs = bytes / copy_ms(bytes) / 1e6;
        std::printf("%-12s %-5s %-12s %10.2f %10.0f %10.0f %8.1f%%  %s\n", tile::op_name(op).c_str(),
                    std::string(tile::dtype_name(dt)).c_str(), (std::to_string(rows) + "x" + std::to_string(cols)).c_str(),
                    kernel_ms * 1e3, gbs, copy_gbs, 100.0 * gbs / copy_gbs, rec.plan.to_json().c_str());
        std::fflush(stdout);
      }
    }
  return 0;
}

namespace {

// Compiles every plan's kernel for `call` on all host threads, filling the in-memory cache that
// tile::run then hits; NVRTC compiles are independent and thread-safe.
void precompile(const tile::Call& call, const std::vector<tile::MappingPlan>& plans, const std::string& arch) {
  std::atomic<size_t> next{0};
  std::vector<std::string> errors(plans.size());
  auto work = [&] {
    for (size_t i = next++; i < plans.size(); i = next++) {
      try {
        tile::cuda::compile_cubin(tile::source_for(call, tile::PlanRequest::exactly(plans[i])), arch);
      } catch (const std::exception& e) {
        errors[i] = e.what();
      }
    }
  };
  std::vector<std::thread> pool;
  for (unsigned t = 0; t < std::max(1u, std::thread::hardware_concurrency()); ++t) pool.emplace_back(work);
  for (std::thread& t : pool) t.join();
  for (size_t i = 0; i < plans.size(); ++i)
    if (!errors[i].empty()) throw tile::Error("plan " + plans[i].to_json() + " did not compile: " + errors[i]);
}

}  // namespace

// `tile tune --op OP --shape RxC [--dtype T] [--out FILE]`: times every plan of the mapping
// family (each oracle-checked first, against one float64 reference per call) and reports the
// analytic policy's regret against the fastest; --out also writes every plan's time as JSON.
int tune_main(const TuneOptions& options) {
  const std::string &op_text = options.op_text, &shape = options.shape_text, &dtype = options.dtype_text,
                    &out_path = options.out_path;
  const long long rows = options.shape.rows, cols = options.shape.cols;
  const tile::Op op = options.op;
  const tile::DType dt = options.dtype;
  cu::ensure_context(0);
  DeviceCase c(op, dt, rows, cols, uint64_t(rows * 131 + cols));
  const tile::PlanInputs in = tile::bind(tile::builtin_program(op), tile::to_args(c.call)).plan_inputs();
  std::vector<tile::MappingPlan> family = tile::mapping_family(in);
  std::printf("tile tune: %s %s %s, %zu plans; medians of 7 event-timed batches per plan\n", op_text.c_str(),
              shape.c_str(), dtype.c_str(), family.size());
  const cu::DeviceInfo dev = cu::device_info(0);
  auto t0 = std::chrono::steady_clock::now();
  precompile(c.call, family, tile::cuda::arch_name(dev));
  std::printf("  compiled in %.1f s\n", std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  std::fflush(stdout);
  std::vector<std::pair<double, tile::MappingPlan>> times;
  for (size_t i = 0; i < family.size(); ++i) {
    tile::PlanRequest exact = tile::PlanRequest::exactly(family[i]);
    tile::LaunchRecord rec;
    tile::OracleCheck check = c.run_checked(exact, &rec);
    if (!check.ok) {
      std::printf("oracle FAIL for plan %s: %s\n", family[i].to_json().c_str(), check.first_mismatch.c_str());
      return 1;
    }
    times.push_back({timed([&] { tile::run(c.call, {exact}); }), family[i]});
    if ((i + 1) % 25 == 0) std::printf("  %zu/%zu timed\n", i + 1, family.size()), std::fflush(stdout);
  }
  const double policy_ms = times.front().first;  // mapping_family puts the policy's plan first
  std::sort(times.begin(), times.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::printf("fastest plans (us per launch, GB/s):\n");
  for (size_t i = 0; i < std::min<size_t>(8, times.size()); ++i)
    std::printf("  %9.2f %8.0f  %s\n", times[i].first * 1e3, c.bytes() / times[i].first / 1e6, times[i].second.to_json().c_str());
  std::printf("policy: %.2f us (%.0f GB/s); regret %.1f%% against the fastest\n", policy_ms * 1e3,
              c.bytes() / policy_ms / 1e6, 100.0 * (policy_ms / times.front().first - 1.0));
  if (!out_path.empty()) {
    nlohmann::json doc = {{"schema", "tile-tune/1"}, {"op", op_text}, {"shape", shape}, {"dtype", dtype},
                          {"device", dev.name}, {"device_uuid", dev.uuid}, {"bytes", c.bytes()},
                          {"method", "median of 7 CUDA-event-timed batches of back-to-back launches, about 20 ms each; "
                                     "every plan checked against the float64 oracle first"},
                          {"policy_plan", nlohmann::json::parse(family.front().to_json())},
                          {"policy_ms", policy_ms}, {"best_ms", times.front().first},
                          {"regret", policy_ms / times.front().first - 1.0}, {"plans", nlohmann::json::array()}};
    for (const auto& [ms, plan] : times)
      doc["plans"].push_back({{"plan", nlohmann::json::parse(plan.to_json())}, {"ms", ms}, {"gbs", c.bytes() / ms / 1e6}});
    std::ofstream file(out_path);
    file << doc.dump(1) << "\n";
    if (!file) throw tile::Error("cannot write " + out_path);
    std::printf("wrote %s\n", out_path.c_str());
  }
  return 0;
}

}  // namespace tile::cli
