// The CUDA driver API, loaded at run time.
//
// libcuda is never linked: driver() dlopens libcuda.so.1 on first use and looks up every
// entry point listed in TILE_CUDA_DRIVER_FUNCTIONS, so binaries start (and host-only tests
// run) on machines without a GPU. <cuda.h> supplies only types and prototypes. Call
// through the table: TILE_CU_CHECK(driver().cuMemAlloc(&p, n)).
// Tests: tests/backend/cuda/driver_test.cpp.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "tile/error.hpp"

// cuda.h renames entry points per stream mode; the table is loaded once for the whole
// program, so every translation unit must see the same (legacy default stream) names.
#if defined(CUDA_API_PER_THREAD_DEFAULT_STREAM)
#error "Tile loads the legacy default-stream driver entry points"
#endif

// Each function once. cuda.h #defines versioned names (cuMemAlloc -> cuMemAlloc_v2), so the
// members, their prototypes and the looked-up symbols all use the versioned name, and call
// sites written with the plain name expand to the same member.
// clang-format off
#define TILE_CUDA_DRIVER_FUNCTIONS(X)                                                           \
  X(cuInit) X(cuGetErrorName) X(cuGetErrorString) X(cuDriverGetVersion)                         \
  X(cuDeviceGet) X(cuDeviceGetCount) X(cuDeviceGetName) X(cuDeviceGetAttribute)                 \
  X(cuDeviceGetUuid) X(cuDevicePrimaryCtxRetain)                                                \
  X(cuCtxGetCurrent) X(cuCtxSetCurrent) X(cuCtxGetDevice) X(cuCtxSynchronize) X(cuCtxGetId)     \
  X(cuModuleLoadData) X(cuModuleUnload) X(cuModuleGetFunction)                                  \
  X(cuFuncSetAttribute) X(cuFuncGetAttribute) X(cuLaunchKernel) X(cuLaunchKernelEx)             \
  X(cuOccupancyMaxActiveClusters)                                                               \
  X(cuMemAlloc) X(cuMemFree) X(cuMemcpyHtoD) X(cuMemcpyDtoH) X(cuMemcpyDtoD)                    \
  X(cuMemcpyDtoDAsync) X(cuMemsetD8) X(cuMemsetD8Async) X(cuMemGetInfo)                         \
  X(cuPointerGetAttribute)                                                                      \
  X(cuStreamCreate) X(cuStreamDestroy) X(cuStreamSynchronize) X(cuStreamIsCapturing)            \
  X(cuEventCreate) X(cuEventDestroy) X(cuEventRecord) X(cuEventSynchronize)                     \
  X(cuEventElapsedTime)
// clang-format on

namespace tile::cuda {

struct Driver {
#define TILE_CUDA_DECLARE_MEMBER(fn) decltype(&::fn) fn = nullptr;
  TILE_CUDA_DRIVER_FUNCTIONS(TILE_CUDA_DECLARE_MEMBER)
#undef TILE_CUDA_DECLARE_MEMBER
};

// Loads libcuda and runs cuInit(0) once (thread-safe). Throws NoDriverError ("no CUDA
// driver: <why>") when the library, a symbol or a device is missing or cuInit fails.
const Driver& driver();
// Never throws.
bool driver_available() noexcept;

// "CUDA_ERROR_OUT_OF_MEMORY (out of memory)"; falls back to the number without a driver.
std::string cu_error_string(CUresult result);

namespace detail {
[[noreturn]] void throw_cu_error(CUresult result, const char* call, const char* file, int line);
}

// Returns the current context, or retains `device`'s primary context and makes it current.
CUcontext ensure_context(int device = 0);
// Ordinal of the device of the current context (after ensure_context()).
int current_device();
// The context's process-unique id (cuCtxGetId): unlike a CUcontext handle, never reused
// after the context is destroyed, so it can key per-context caches.
uint64_t context_id(CUcontext ctx);

struct DeviceInfo {
  std::string name;
  std::string uuid;  // "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", as nvidia-smi prints it
  int ordinal = 0;
  int sm_count = 0;
  int cc_major = 0;
  int cc_minor = 0;
  int max_threads_per_block = 0;
  int max_shared_per_block = 0;        // bytes, without opt-in
  int max_shared_per_block_optin = 0;  // bytes, via CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
  int l2_bytes = 0;
  int clock_khz = 0;
  int mem_clock_khz = 0;
  int mem_bus_width = 0;   // bits
  int driver_version = 0;  // e.g. 13000
  bool cluster_launch = false;  // CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH (compute capability 9.0 and later)
};

DeviceInfo device_info(int device = 0);
// "sm_90" for compute capability 9.0.
std::string arch_name(const DeviceInfo& info);

// Global memory owned for its lifetime; allocated in the context ensure_context() yields.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* get() const { return reinterpret_cast<void*>(ptr_); }
  CUdeviceptr device_ptr() const { return ptr_; }
  size_t bytes() const { return bytes_; }

  // Synchronous copies of `bytes` bytes at byte `offset` into the buffer.
  void copy_from_host(const void* src, size_t bytes, size_t offset = 0);
  void copy_to_host(void* dst, size_t bytes, size_t offset = 0) const;
  void fill_byte(uint8_t value);

 private:
  void check_range(const char* op, size_t bytes, size_t offset) const;

  CUdeviceptr ptr_ = 0;
  size_t bytes_ = 0;
};

class Stream {
 public:
  Stream();  // non-blocking with respect to the legacy default stream
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  CUstream get() const { return stream_; }
  void synchronize() const;

 private:
  CUstream stream_ = nullptr;
};

class Event {
 public:
  Event();
  ~Event();
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  CUevent get() const { return event_; }
  void record(CUstream stream = nullptr);
  void synchronize() const;
  // Milliseconds from `start` to this event; both must have been recorded.
  float elapsed_ms_since(const Event& start) const;

 private:
  CUevent event_ = nullptr;
};

}  // namespace tile::cuda

// Evaluates a driver call returning CUresult; on failure throws tile::Error naming the call,
// its location and the error.
#define TILE_CU_CHECK(call)                                                             \
  do {                                                                                  \
    const CUresult tile_cu_result_ = (call);                                            \
    if (tile_cu_result_ != CUDA_SUCCESS)                                                \
      ::tile::cuda::detail::throw_cu_error(tile_cu_result_, #call, __FILE__, __LINE__); \
  } while (0)
