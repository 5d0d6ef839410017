// Entry points: run a call on the CPU or CUDA backend.
#include <mutex>
#include <unordered_map>

#include "api/call.hpp"
#include "backend/cpu/executor.hpp"
#include "backend/cuda/driver.hpp"
#include "backend/cuda/jit_module.hpp"
#include "ir/printer.hpp"

namespace tile {

namespace {

// Argument values in kernel order: buffers (x, y, columns), then rows, cols, strides, scalars.
struct KernelArgs {
  std::vector<const void*> buffers;
  std::vector<int64_t> extents;  // elements each buffer may touch
  int64_t rows, cols, x_stride, y_stride;
  float eps;
};

KernelArgs kernel_args(const Call& call, const ir::Kernel& k) {
  KernelArgs a;
  auto extent = [](const TensorView& t) { return t.rows == 0 ? 0 : (t.rows - 1) * t.row_stride + t.cols; };
  a.buffers = {call.x.data, call.y.data};
  a.extents = {extent(call.x), extent(call.y)};
  for (size_t b = 2; b < k.buffers.size(); ++b) {
    const VectorView& v = k.buffers[b].name == "weight" ? call.weight : call.bias;
    a.buffers.push_back(v.data);
    a.extents.push_back(v.size);
  }
  a.rows = call.x.rows;
  a.cols = call.x.cols;
  a.x_stride = call.x.row_stride;
  a.y_stride = call.y.row_stride;
  a.eps = call_eps(call);
  return a;
}

// Compiled and loaded kernels by (prepared kernel, device): after the first call a launch
// needs no hashing or compile-cache lookup.
struct LoadedKernel {
  std::shared_ptr<const cuda::CompileResult> module;
  CUfunction function = nullptr;
};
std::mutex& loaded_mutex() {
  static std::mutex mutex;
  return mutex;
}
std::unordered_map<const PreparedKernel*, std::unordered_map<int, LoadedKernel>>& loaded_kernels() {
  static std::unordered_map<const PreparedKernel*, std::unordered_map<int, LoadedKernel>> map;
  return map;
}

const std::string& device_arch(int device) {
  static std::mutex mutex;
  static std::unordered_map<int, std::string> arch;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = arch.find(device);
  if (it == arch.end()) it = arch.emplace(device, cuda::arch_name(cuda::device_info(device))).first;
  return it->second;
}

}  // namespace

LaunchRecord run(const Call& call, const CallOptions& options) {
  std::shared_ptr<const PreparedKernel> pk = prepare(call, options.plan);
  const ir::Kernel& k = pk->kernel;
  LaunchRecord rec;
  rec.plan = pk->plan;
  rec.kernel_name = k.name;
  rec.source_sha256 = pk->source_sha256;
  rec.groups = (call.x.rows + k.programs_per_group - 1) / k.programs_per_group;
  rec.threads_per_group = k.threads_per_group();
  rec.shared_bytes = k.shared_elems() * 4;
  KernelArgs a = kernel_args(call, k);

  if (options.backend == Backend::cpu) {
    if (rec.groups == 0) return rec;
    cpu::LaunchArgs args;
    args.groups = rec.groups;
    for (size_t b = 0; b < a.buffers.size(); ++b)
      args.buffers.push_back({const_cast<void*>(a.buffers[b]), 0, a.extents[b]});
    args.params = {{0, a.rows}, {0, a.cols}, {0, a.x_stride}, {0, a.y_stride}};
    for (size_t p = 4; p < k.params.size(); ++p) args.params.push_back({a.eps, 0});
    rec.bytes_loaded = cpu::execute(k, args).bytes_loaded;
    return rec;
  }

  cuda::ensure_context(options.device);
  const int device = cuda::current_device();
  LoadedKernel loaded;
  {
    std::lock_guard<std::mutex> lock(loaded_mutex());
    auto& per_device = loaded_kernels()[pk.get()];
    if (auto it = per_device.find(device); it != per_device.end()) {
      loaded = it->second;
      rec.cache_origin = "launch-cache";
    }
  }
  if (!loaded.function) {
    loaded.module = cuda::compile_cubin(pk->source, device_arch(device));
    loaded.function = cuda::get_function(*loaded.module, k.name);
    rec.compile_ms = loaded.module->compile_ms;
    static const char* origins[] = {"compiled", "memory", "disk"};
    rec.cache_origin = origins[int(loaded.module->origin)];
    std::lock_guard<std::mutex> lock(loaded_mutex());
    loaded_kernels()[pk.get()][device] = loaded;
  }
  rec.arch = loaded.module->arch;
  rec.cubin_sha256 = loaded.module->cubin_sha256;
  rec.compile_options = loaded.module->options;
  if (rec.groups == 0) return rec;  // rows = 0 launches nothing
  CUfunction fn = loaded.function;
  std::vector<CUdeviceptr> ptrs;
  for (const void* p : a.buffers) ptrs.push_back(reinterpret_cast<CUdeviceptr>(p));
  std::vector<void*> argv;
  for (CUdeviceptr& p : ptrs) argv.push_back(&p);
  argv.insert(argv.end(), {&a.rows, &a.cols, &a.x_stride, &a.y_stride});
  for (size_t p = 4; p < k.params.size(); ++p) argv.push_back(&a.eps);
  TILE_CU_CHECK(cuda::driver().cuLaunchKernel(fn, unsigned(rec.groups), 1, 1, unsigned(rec.threads_per_group), 1, 1, 0,
                                              static_cast<CUstream>(options.stream), argv.data(), nullptr));
  return rec;
}

void clear_kernel_caches() {
  {
    std::lock_guard<std::mutex> lock(loaded_mutex());
    loaded_kernels().clear();
  }
  {
    std::lock_guard<std::mutex> lock(prepared_mutex());
    prepared_cache().clear();
  }
  cuda::clear_memory_cache();
}

std::string ir_for(const Call& call, const PlanRequest& request) { return ir::to_string(prepare(call, request)->kernel); }

void softmax(const TensorView& x, const TensorView& y, const CallOptions& options) {
  run(Call{Op::softmax, x, y}, options);
}
void log_softmax(const TensorView& x, const TensorView& y, const CallOptions& options) {
  run(Call{Op::log_softmax, x, y}, options);
}
void rms_norm(const TensorView& x, const TensorView& y, const VectorView& weight, float eps,
              const CallOptions& options) {
  run(Call{Op::rms_norm, x, y, weight, {}, eps}, options);
}
void layer_norm(const TensorView& x, const TensorView& y, const VectorView& weight, const VectorView& bias,
                float eps, const CallOptions& options) {
  run(Call{Op::layer_norm, x, y, weight, bias, eps}, options);
}

}  // namespace tile
