// Driver loading (host only: Driver.*) and device round trips (DriverGpu.*, CTest
// backend.cuda.driver_gpu, skipped without a driver).
#include "backend/cuda/driver.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <regex>
#include <vector>

#include "backend/cuda/jit_module.hpp"

namespace tile::cuda {
namespace {

TEST(Driver, MissingDriverIsReportedOrDeviceIsSane) {
  if (!driver_available()) {
    try {
      driver();
      FAIL() << "driver() should throw without a driver";
    } catch (const NoDriverError& e) {
      EXPECT_EQ(std::string(e.what()).rfind("no CUDA driver", 0), 0u) << e.what();
    }
    EXPECT_THROW(device_info(0), NoDriverError);
    EXPECT_THROW(ensure_context(), NoDriverError);
    EXPECT_THROW(DeviceBuffer(16), NoDriverError);
    return;
  }
  const DeviceInfo info = device_info(0);
  EXPECT_FALSE(info.name.empty());
  EXPECT_TRUE(
      std::regex_match(info.uuid, std::regex("GPU-[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}")))
      << info.uuid;
  EXPECT_EQ(info.ordinal, 0);
  EXPECT_GT(info.sm_count, 0);
  EXPECT_GE(info.cc_major, 5);
  EXPECT_GE(info.max_threads_per_block, 512);
  EXPECT_GE(info.max_shared_per_block, 48 * 1024);
  EXPECT_GE(info.max_shared_per_block_optin, info.max_shared_per_block);
  EXPECT_GT(info.l2_bytes, 0);
  EXPECT_GT(info.clock_khz, 0);
  EXPECT_GT(info.mem_clock_khz, 0);
  EXPECT_GT(info.mem_bus_width, 0);
  EXPECT_GE(info.driver_version, 12000);
  EXPECT_EQ(arch_name(info), "sm_" + std::to_string(info.cc_major) + std::to_string(info.cc_minor));
}

TEST(Driver, ArchName) {
  DeviceInfo info;
  info.cc_major = 9;
  info.cc_minor = 0;
  EXPECT_EQ(arch_name(info), "sm_90");
  info.cc_major = 10;
  EXPECT_EQ(arch_name(info), "sm_100");
}

TEST(Driver, CuCheckNamesTheCallAndTheError) {
  auto ok = [] { return CUDA_SUCCESS; };
  auto out_of_memory = [] { return CUDA_ERROR_OUT_OF_MEMORY; };
  EXPECT_NO_THROW(TILE_CU_CHECK(ok()));
  try {
    TILE_CU_CHECK(out_of_memory());
    FAIL() << "TILE_CU_CHECK should throw";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("out_of_memory()"), std::string::npos) << what;
    EXPECT_NE(what.find("driver_test.cpp"), std::string::npos) << what;
    EXPECT_NE(what.find(driver_available() ? "CUDA_ERROR_OUT_OF_MEMORY" : "CUresult 2"),
              std::string::npos)
        << what;
  }
}

// ---- needs a device ---------------------------------------------------------------------

class DriverGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    if (driver_available()) return;
    try {
      driver();
    } catch (const NoDriverError& e) {
      GTEST_SKIP() << e.what();
    }
  }
};

TEST_F(DriverGpu, ContextIsRetainedOnce) {
  const CUcontext ctx = ensure_context();
  EXPECT_NE(ctx, nullptr);
  EXPECT_EQ(ensure_context(), ctx);
  EXPECT_EQ(current_device(), 0);
}

TEST_F(DriverGpu, BufferRoundTripsBytes) {
  constexpr size_t kBytes = 4096;
  std::vector<uint8_t> host(kBytes);
  for (size_t i = 0; i < kBytes; ++i) host[i] = static_cast<uint8_t>(i * 7 + 3);

  DeviceBuffer buf(kBytes);
  EXPECT_NE(buf.get(), nullptr);
  EXPECT_EQ(buf.bytes(), kBytes);
  buf.copy_from_host(host.data(), kBytes);
  std::vector<uint8_t> back(kBytes);
  buf.copy_to_host(back.data(), kBytes);
  EXPECT_EQ(back, host);

  const std::vector<uint8_t> patch(100, 0xee);
  buf.copy_from_host(patch.data(), patch.size(), 1000);
  std::copy(patch.begin(), patch.end(), host.begin() + 1000);
  buf.copy_to_host(back.data(), kBytes);
  EXPECT_EQ(back, host);

  std::vector<uint8_t> tail(10);
  buf.copy_to_host(tail.data(), tail.size(), kBytes - 10);
  EXPECT_TRUE(std::equal(tail.begin(), tail.end(), host.end() - 10));

  buf.fill_byte(0xab);
  buf.copy_to_host(back.data(), kBytes);
  EXPECT_EQ(back, std::vector<uint8_t>(kBytes, 0xab));

  EXPECT_THROW(buf.copy_from_host(host.data(), kBytes, 1), Error);
  EXPECT_THROW(buf.copy_to_host(back.data(), 1, kBytes + 1), Error);

  DeviceBuffer moved = std::move(buf);
  EXPECT_EQ(buf.get(), nullptr);
  EXPECT_EQ(moved.bytes(), kBytes);
  EXPECT_EQ(DeviceBuffer(0).get(), nullptr);
}

constexpr const char* kPatternKernel =
    R"(extern "C" __global__ void write_pattern(unsigned* out, unsigned n, unsigned seed) {
  unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = i * 2654435761u ^ seed;
}
)";

TEST_F(DriverGpu, CompilesAndLaunchesKernel) {
  ::setenv("TILE_DISABLE_DISK_CACHE", "1", 1);  // keep the user's kernel cache untouched
  const DeviceInfo info = device_info(current_device());
  auto module = compile_cubin(kPatternKernel, arch_name(info));
  const CUfunction fn = get_function(*module, "write_pattern");
  EXPECT_EQ(get_function(*module, "write_pattern"), fn);
  EXPECT_THROW(get_function(*module, "no_such_kernel"), Error);

  int max_threads = 0;
  TILE_CU_CHECK(
      driver().cuFuncGetAttribute(&max_threads, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, fn));
  EXPECT_GE(max_threads, 256);

  unsigned n = 1000, seed = 0x5eedu;
  DeviceBuffer out(n * sizeof(unsigned));
  out.fill_byte(0);
  CUdeviceptr ptr = out.device_ptr();
  void* args[] = {&ptr, &n, &seed};
  Stream stream;
  Event start, stop;
  start.record(stream.get());
  TILE_CU_CHECK(driver().cuLaunchKernel(fn, (n + 255) / 256, 1, 1, 256, 1, 1, 0, stream.get(), args,
                                        nullptr));
  stop.record(stream.get());
  stream.synchronize();
  EXPECT_GE(stop.elapsed_ms_since(start), 0.0f);

  std::vector<unsigned> host(n);
  out.copy_to_host(host.data(), n * sizeof(unsigned));
  for (unsigned i = 0; i < n; ++i) ASSERT_EQ(host[i], (i * 2654435761u) ^ seed) << "at " << i;

  // A CUBIN for another architecture does not load, and the error says so.
  const std::string other = info.cc_major == 10 ? "sm_90" : "sm_100";
  auto foreign = compile_cubin(kPatternKernel, other);
  try {
    get_function(*foreign, "write_pattern");
    FAIL() << "a " << other << " CUBIN should not load on " << arch_name(info);
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(other), std::string::npos) << e.what();
  }
  ::unsetenv("TILE_DISABLE_DISK_CACHE");
}

}  // namespace
}  // namespace tile::cuda
