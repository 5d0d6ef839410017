#include "backend/cuda/driver.hpp"

#include <dlfcn.h>

#include <cstdio>
#include <map>
#include <mutex>
#include <utility>

namespace tile::cuda {
namespace {

#define TILE_CUDA_STRINGIFY_(x) #x
#define TILE_CUDA_STRINGIFY(x) TILE_CUDA_STRINGIFY_(x)

struct LoadedDriver {
  Driver table;
  std::string error;  // empty when usable
};

LoadedDriver load_driver() {
  LoadedDriver out;
  // Never dlclosed: the driver stays mapped for the life of the process.
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    const char* why = dlerror();
    out.error = std::string("no CUDA driver: libcuda.so.1 not found (") + (why ? why : "?") + ")";
    return out;
  }
  // The argument is macro-expanded before stringification, so cuMemAlloc looks up
  // "cuMemAlloc_v2", the symbol the prototype in cuda.h describes.
#define TILE_CUDA_LOAD(fn)                                                                      \
  out.table.fn = reinterpret_cast<decltype(out.table.fn)>(dlsym(lib, TILE_CUDA_STRINGIFY(fn))); \
  if (!out.table.fn) {                                                                          \
    out.error = std::string("no CUDA driver: libcuda.so.1 lacks ") + TILE_CUDA_STRINGIFY(fn) +  \
                " (driver older than CUDA_VERSION " + std::to_string(CUDA_VERSION) + "?)";      \
    return out;                                                                                 \
  }
  TILE_CUDA_DRIVER_FUNCTIONS(TILE_CUDA_LOAD)
#undef TILE_CUDA_LOAD

  const Driver& d = out.table;
  if (CUresult r = d.cuInit(0); r != CUDA_SUCCESS) {
    const char* name = nullptr;
    const char* text = nullptr;
    d.cuGetErrorName(r, &name);
    d.cuGetErrorString(r, &text);
    out.error = std::string("no CUDA driver: cuInit failed with ") +
                (name ? name : std::to_string(static_cast<int>(r))) + " (" + (text ? text : "?") +
                ")";
    return out;
  }
  int count = 0;
  if (d.cuDeviceGetCount(&count) != CUDA_SUCCESS || count == 0)
    out.error = "no CUDA driver: no CUDA device";
  return out;
}

const LoadedDriver& loaded() {
  static const LoadedDriver state = load_driver();
  return state;
}

}  // namespace

const Driver& driver() {
  const LoadedDriver& s = loaded();
  if (!s.error.empty()) throw NoDriverError(s.error);
  return s.table;
}

bool driver_available() noexcept {
  try {
    return loaded().error.empty();
  } catch (...) {
    return false;
  }
}

std::string cu_error_string(CUresult result) {
  const LoadedDriver& s = loaded();
  const char* name = nullptr;
  const char* text = nullptr;
  // The table may be loaded even when unusable (e.g. cuInit failed); use what is there.
  if (s.table.cuGetErrorName) s.table.cuGetErrorName(result, &name);
  if (s.table.cuGetErrorString) s.table.cuGetErrorString(result, &text);
  std::string out = name ? name : "CUresult " + std::to_string(static_cast<int>(result));
  if (text) out += std::string(" (") + text + ")";
  return out;
}

namespace detail {
void throw_cu_error(CUresult result, const char* call, const char* file, int line) {
  throw Error(std::string("CUDA driver call failed: ") + call + " at " + file + ":" +
              std::to_string(line) + ": " + cu_error_string(result));
}
}  // namespace detail

CUcontext ensure_context(int device) {
  const Driver& d = driver();
  CUcontext ctx = nullptr;
  TILE_CU_CHECK(d.cuCtxGetCurrent(&ctx));
  if (ctx) return ctx;
  // Retain each primary context once per process; new threads only make it current.
  static std::mutex mutex;
  static std::map<int, CUcontext> retained;
  {
    std::lock_guard lock(mutex);
    auto it = retained.find(device);
    if (it == retained.end()) {
      CUdevice dev = 0;
      TILE_CU_CHECK(d.cuDeviceGet(&dev, device));
      TILE_CU_CHECK(d.cuDevicePrimaryCtxRetain(&ctx, dev));
      it = retained.emplace(device, ctx).first;
    }
    ctx = it->second;
  }
  TILE_CU_CHECK(d.cuCtxSetCurrent(ctx));
  return ctx;
}

int current_device() {
  ensure_context();
  CUdevice dev = 0;
  TILE_CU_CHECK(driver().cuCtxGetDevice(&dev));
  return static_cast<int>(dev);
}

uint64_t context_id(CUcontext ctx) {
  unsigned long long id = 0;
  TILE_CU_CHECK(driver().cuCtxGetId(ctx, &id));
  return id;
}

DeviceInfo device_info(int device) {
  const Driver& d = driver();
  CUdevice dev = 0;
  TILE_CU_CHECK(d.cuDeviceGet(&dev, device));
  DeviceInfo info;
  info.ordinal = device;
  char name[256] = {};
  TILE_CU_CHECK(d.cuDeviceGetName(name, sizeof(name) - 1, dev));
  info.name = name;

  CUuuid uuid{};
  TILE_CU_CHECK(d.cuDeviceGetUuid(&uuid, dev));
  std::string hex = "GPU-";
  for (int i = 0; i < 16; ++i) {
    char byte[3];
    std::snprintf(byte, sizeof(byte), "%02x", static_cast<unsigned char>(uuid.bytes[i]));
    hex += byte;
    if (i == 3 || i == 5 || i == 7 || i == 9) hex += '-';
  }
  info.uuid = hex;

  auto attr = [&](CUdevice_attribute a) {
    int v = 0;
    TILE_CU_CHECK(d.cuDeviceGetAttribute(&v, a, dev));
    return v;
  };
  info.sm_count = attr(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT);
  info.cc_major = attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR);
  info.cc_minor = attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR);
  info.max_threads_per_block = attr(CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK);
  info.max_shared_per_block = attr(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK);
  info.max_shared_per_block_optin = attr(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN);
  info.cluster_launch = attr(CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH) != 0;
  info.l2_bytes = attr(CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE);
  info.clock_khz = attr(CU_DEVICE_ATTRIBUTE_CLOCK_RATE);
  info.mem_clock_khz = attr(CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE);
  info.mem_bus_width = attr(CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH);
  TILE_CU_CHECK(d.cuDriverGetVersion(&info.driver_version));
  return info;
}

std::string arch_name(const DeviceInfo& info) {
  return "sm_" + std::to_string(info.cc_major) + std::to_string(info.cc_minor);
}

// ---- DeviceBuffer -------------------------------------------------------------------------

DeviceBuffer::DeviceBuffer(size_t bytes) : bytes_(bytes) {
  ensure_context();
  if (bytes > 0) TILE_CU_CHECK(driver().cuMemAlloc(&ptr_, bytes));  // cuMemAlloc(0) is an error
}

DeviceBuffer::~DeviceBuffer() {
  if (ptr_) driver().cuMemFree(ptr_);  // a destructor cannot report; the context may be gone
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : ptr_(std::exchange(other.ptr_, 0)), bytes_(std::exchange(other.bytes_, 0)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    if (ptr_) driver().cuMemFree(ptr_);
    ptr_ = std::exchange(other.ptr_, 0);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

void DeviceBuffer::check_range(const char* op, size_t bytes, size_t offset) const {
  if (offset > bytes_ || bytes > bytes_ - offset)
    throw_argument_error(op, "bytes", "offset + bytes <= " + std::to_string(bytes_),
                         "offset " + std::to_string(offset) + " + bytes " + std::to_string(bytes));
}

void DeviceBuffer::copy_from_host(const void* src, size_t bytes, size_t offset) {
  check_range("DeviceBuffer::copy_from_host", bytes, offset);
  if (bytes > 0) TILE_CU_CHECK(driver().cuMemcpyHtoD(ptr_ + offset, src, bytes));
}

void DeviceBuffer::copy_to_host(void* dst, size_t bytes, size_t offset) const {
  check_range("DeviceBuffer::copy_to_host", bytes, offset);
  if (bytes > 0) TILE_CU_CHECK(driver().cuMemcpyDtoH(dst, ptr_ + offset, bytes));
}

void DeviceBuffer::fill_byte(uint8_t value) {
  if (bytes_ > 0) TILE_CU_CHECK(driver().cuMemsetD8(ptr_, value, bytes_));
}

// ---- Stream, Event ------------------------------------------------------------------------

Stream::Stream() {
  ensure_context();
  TILE_CU_CHECK(driver().cuStreamCreate(&stream_, CU_STREAM_NON_BLOCKING));
}

Stream::~Stream() {
  if (stream_) driver().cuStreamDestroy(stream_);
}

void Stream::synchronize() const { TILE_CU_CHECK(driver().cuStreamSynchronize(stream_)); }

Event::Event() {
  ensure_context();
  TILE_CU_CHECK(driver().cuEventCreate(&event_, CU_EVENT_DEFAULT));
}

Event::~Event() {
  if (event_) driver().cuEventDestroy(event_);
}

void Event::record(CUstream stream) { TILE_CU_CHECK(driver().cuEventRecord(event_, stream)); }

void Event::synchronize() const { TILE_CU_CHECK(driver().cuEventSynchronize(event_)); }

float Event::elapsed_ms_since(const Event& start) const {
  float ms = 0.0f;
  TILE_CU_CHECK(driver().cuEventElapsedTime(&ms, start.event_, event_));
  return ms;
}

}  // namespace tile::cuda
