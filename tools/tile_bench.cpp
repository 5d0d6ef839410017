// `tile bench`: bandwidth of the default (analytic) plans against a device-to-device copy of
// the same bytes timed the same way in the same process. Every kernel output is checked
// against the float64 oracle before it is timed. This is a quick look; bench/ holds the
// rigorous runner.
#include <algorithm>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/driver.hpp"
#include "testing/host_tensor.hpp"
#include "tile/tile.hpp"

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

}  // namespace

int bench_main(int argc, char** argv) {
  std::vector<std::pair<long long, long long>> shapes = {{37, 1537}, {256, 3072}, {768, 6144}, {1024, 4096}, {32768, 4096}, {4096, 32768}};
  std::vector<tile::Op> ops = {tile::Op::softmax, tile::Op::log_softmax, tile::Op::rms_norm, tile::Op::layer_norm};
  // `tile bench [--plan JSON] [--shape RxC]...`: fixed plan fields for every call; shapes to time.
  tile::PlanRequest request;
  std::vector<std::pair<long long, long long>> chosen;
  for (int i = 2; i + 1 < argc; i += 2) {
    std::string flag = argv[i];
    if (flag == "--plan") {
      request = tile::PlanRequest::from_json(argv[i + 1]);
    } else if (flag == "--shape") {
      long long r = 0, c = 0;
      if (std::sscanf(argv[i + 1], "%lldx%lld", &r, &c) != 2) throw tile::Error("tile bench: --shape expects RxC");
      chosen.push_back({r, c});
    } else {
      throw tile::Error("tile bench: unknown option '" + flag + "'");
    }
  }
  if (!chosen.empty()) shapes = chosen;
  cu::ensure_context(0);
  cu::DeviceInfo dev = cu::device_info(0);
  std::printf("device %s (%s), %d SMs; times are medians of 7 event-timed batches of back-to-back launches\n",
              dev.name.c_str(), dev.uuid.c_str(), dev.sm_count);
  std::printf("%-12s %-5s %-12s %10s %10s %10s %9s  %s\n", "op", "dtype", "shape", "kernel_us", "GB/s", "copy_GB/s", "%copy", "plan");
  for (tile::DType dt : {tile::DType::f32, tile::DType::bf16})
    for (auto [rows, cols] : shapes) {
      std::mt19937_64 rng(uint64_t(rows * 131 + cols));
      tile::testing::HostMatrix x(dt, rows, cols, cols, 0, 0), y(dt, rows, cols, cols, 0, 0);
      x.fill_random(rng);
      tile::testing::HostVector w(dt, cols), b(dt, cols);
      w.fill_random(rng, 1.0, 0.5);
      b.fill_random(rng, 0.0, 0.5);
      cu::DeviceBuffer dx(x.bytes().size()), dy(y.bytes().size()), dw(w.bytes.size()), db(b.bytes.size());
      dx.copy_from_host(x.bytes().data(), x.bytes().size());
      dw.copy_from_host(w.bytes.data(), w.bytes.size());
      db.copy_from_host(b.bytes.data(), b.bytes.size());
      for (tile::Op op : ops) {
        tile::Call call{op, tile::matrix(dx.get(), dt, rows, cols), tile::matrix(dy.get(), dt, rows, cols)};
        if (op == tile::Op::rms_norm || op == tile::Op::layer_norm) call.weight = {dw.get(), dt, cols};
        if (op == tile::Op::layer_norm) call.bias = {db.get(), dt, cols};
        dy.fill_byte(0xff);
        tile::LaunchRecord rec = tile::run(call, {request});
        TILE_CU_CHECK(cu::driver().cuCtxSynchronize());
        dy.copy_to_host(y.bytes().data(), y.bytes().size());
        tile::Call host = call;
        host.x.data = x.data(), host.y.data = y.data();
        if (call.weight.data) host.weight.data = w.data();
        if (call.bias.data) host.bias.data = b.data();
        tile::OracleCheck check = tile::check_against_oracle(host);
        if (!check.ok) {
          std::printf("%-12s oracle FAIL: %s\n", tile::op_name(op).c_str(), check.first_mismatch.c_str());
          return 1;
        }
        // Bytes: input read once, output written once, weight and bias once.
        double bytes = double(rows * cols) * 2 * tile::dtype_size(dt) +
                       double(cols) * tile::dtype_size(dt) * ((call.weight.data != nullptr) + (call.bias.data != nullptr));
        double kernel_ms = timed([&] { tile::run(call, {request}); });
        size_t copy_bytes = size_t(bytes / 2);  // a copy of bytes/2 reads and writes `bytes`
        cu::DeviceBuffer copy_src(copy_bytes), copy_dst(copy_bytes);
        copy_src.fill_byte(0x3c);
        double copy_ms = timed([&] { TILE_CU_CHECK(cu::driver().cuMemcpyDtoDAsync(copy_dst.device_ptr(), copy_src.device_ptr(), copy_bytes, nullptr)); });
        double gbs = bytes / kernel_ms / 1e6, copy_gbs = bytes / copy_ms / 1e6;
        std::printf("%-12s %-5s %-12s %10.2f %10.0f %10.0f %8.1f%%  %s\n", tile::op_name(op).c_str(),
                    std::string(tile::dtype_name(dt)).c_str(), (std::to_string(rows) + "x" + std::to_string(cols)).c_str(),
                    kernel_ms * 1e3, gbs, copy_gbs, 100.0 * gbs / copy_gbs, rec.plan.to_json().c_str());
        std::fflush(stdout);
      }
    }
  return 0;
}
