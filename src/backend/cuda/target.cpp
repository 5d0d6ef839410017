// The CUDA target: emits CUDA C++ from the IR, compiles it with NVRTC (jit_module.hpp) and
// launches on the caller's stream. What it derives from a prepared kernel — the source and
// the loaded functions per device — lives in that kernel's target state, so no cache entry
// can outlive or be mistaken for the kernel it was made from.
#include <algorithm>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "backend/cuda/driver.hpp"
#include "backend/cuda/emit_cuda.hpp"
#include "backend/cuda/jit_module.hpp"
#include "core/sha256.hpp"
#include "target/target.hpp"

namespace tile {

namespace {

struct LoadedKernel {
  std::shared_ptr<const cuda::CompileResult> module;
  CUfunction function = nullptr;
};

struct CudaState final : PreparedKernel::TargetState {
  std::once_flag source_once;
  std::string source, source_sha256, finish_source;
  std::mutex mutex;
  // By context id (never reused, unlike a context handle): a caller may switch contexts on
  // one device, and a function belongs to the context that loaded it.
  std::map<uint64_t, std::pair<LoadedKernel, LoadedKernel>> loaded;  // context -> (main, finish)
};

CudaState& state_of(const PreparedKernel& pk) {
  std::call_once(pk.target_once, [&] { pk.target_state = std::make_unique<CudaState>(); });
  return static_cast<CudaState&>(*pk.target_state);
}

void ensure_source(const PreparedKernel& pk, CudaState& st) {
  std::call_once(st.source_once, [&] {
    const std::string header = source_header(pk);
    st.source = cuda::emit_cuda(pk.lowered.main.kernel, header);
    st.source_sha256 = sha256_hex(st.source);
    if (pk.lowered.finish) st.finish_source = cuda::emit_cuda(pk.lowered.finish->kernel, header + " (second phase)");
    if (dump_requested("codegen")) {
      std::fprintf(stderr, "%s", st.source.c_str());
      if (pk.lowered.finish) std::fprintf(stderr, "%s", st.finish_source.c_str());
    }
  });
}

const std::string& device_arch(int device) {
  static std::mutex mutex;
  static std::map<int, std::string> arch;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = arch.find(device);
  if (it == arch.end()) it = arch.emplace(device, cuda::arch_name(cuda::device_info(device))).first;
  return it->second;
}

// Groups of one cluster the device can launch: 16 through the non-portable size on devices
// with cluster launch (compute capability 9.0 and later), else none.
int device_cluster_size(const cuda::DeviceInfo& info) { return info.cluster_launch ? 16 : 1; }

LoadedKernel load(const std::string& source, const ir::Kernel& kernel, int device) {
  LoadedKernel k;
  k.module = cuda::compile_cubin(source, device_arch(device));
  k.function = cuda::get_function(*k.module, kernel.name);
  if (kernel.ctas_per_cluster > 8)  // beyond the portable cluster size, the function must opt in
    TILE_CU_CHECK(cuda::driver().cuFuncSetAttribute(k.function, CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1));
  // Staged regions live in dynamic shared memory, whose size the function opts in to: needed
  // once it and the static shared memory pass 48 KiB together (a plan staging exactly 48 KiB
  // beside its merges' slots could not be resident without it), harmless below.
  if (const int64_t staged = kernel.staged_bytes(); staged > 0) {
    const cuda::DeviceInfo info = cuda::device_info(device);
    if (kernel.group_shared_bytes() > info.max_shared_per_block_optin)
      throw Error("kernel " + kernel.name + " stages " + std::to_string(staged) +
                  " bytes of its row slices in shared memory (" + std::to_string(kernel.shared_bytes()) +
                  " more for its merges), but " + info.name + " (cuda:" + std::to_string(device) +
                  ") gives a group at most " + std::to_string(info.max_shared_per_block_optin) +
                  " (caching \"shared\" in the plan: more stripes on a larger cluster, or caching \"reread\")");
    TILE_CU_CHECK(
        cuda::driver().cuFuncSetAttribute(k.function, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, int(staged)));
  }
  return k;
}

// Fills `config` for launching `groups` groups of `kernel` (clusters of ctas_per_cluster).
void launch_config(CUlaunchConfig& config, CUlaunchAttribute& cluster, const ir::Kernel& kernel, int64_t groups,
                   CUstream stream) {
  config = {};
  config.gridDimX = unsigned(groups), config.gridDimY = 1, config.gridDimZ = 1;
  config.blockDimX = unsigned(kernel.threads_per_group()), config.blockDimY = 1, config.blockDimZ = 1;
  config.hStream = stream;
  config.sharedMemBytes = unsigned(kernel.staged_bytes());
  cluster = {};
  cluster.id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
  cluster.value.clusterDim.x = unsigned(kernel.ctas_per_cluster), cluster.value.clusterDim.y = 1;
  cluster.value.clusterDim.z = 1;
  config.attrs = &cluster, config.numAttrs = 1;
}

// A cluster the device cannot hold at once would fail at launch with a driver error; say why
// instead, once, when the kernel is loaded.
void check_cluster_fits(const LoadedKernel& k, const ir::Kernel& kernel, int device) {
  if (kernel.ctas_per_cluster <= 1) return;
  const cuda::DeviceInfo info = cuda::device_info(device);
  if (kernel.ctas_per_cluster > device_cluster_size(info))
    throw Error("kernel " + kernel.name + " spans clusters of " + std::to_string(kernel.ctas_per_cluster) +
                " groups, but " + info.name + " (cuda:" + std::to_string(device) + ") launches clusters of at most " +
                std::to_string(device_cluster_size(info)) + " (ctas_per_program in the plan)");
  CUlaunchConfig config;
  CUlaunchAttribute cluster;
  launch_config(config, cluster, kernel, kernel.ctas_per_cluster, nullptr);
  int active = 0;
  TILE_CU_CHECK(cuda::driver().cuOccupancyMaxActiveClusters(&active, k.function, &config));
  if (active < 1)
    throw Error("kernel " + kernel.name + ": a cluster of " + std::to_string(kernel.ctas_per_cluster) + " groups of " +
                std::to_string(kernel.threads_per_group()) + " threads cannot be resident on " + info.name +
                " at once (ctas_per_program and workers_per_program in the plan)");
}

// True while `stream` is captured into a CUDA graph: nothing may then be compiled, loaded or
// allocated, and no stream may be synchronized.
bool capturing(CUstream stream) {
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  TILE_CU_CHECK(cuda::driver().cuStreamIsCapturing(stream, &status));
  return status != CU_STREAM_CAPTURE_STATUS_NONE;
}

// The library's workspace, for calls that give none (CallOptions::workspace): one per
// (context, stream), grown to powers of two: launches on one stream are ordered, so they may
// share it; launches on different streams never do. A buffer outgrown is kept, never freed,
// since a captured CUDA graph may still hold its address; so growing needs no
// synchronization, and it is refused during capture (no allocation may happen then).
void* workspace_for(CUstream stream, size_t bytes, const std::string& kernel) {
  static std::mutex mutex;
  static std::map<std::pair<CUcontext, CUstream>, std::pair<CUdeviceptr, size_t>> buffers;
  static std::vector<CUdeviceptr> outgrown;
  CUcontext ctx = nullptr;
  TILE_CU_CHECK(cuda::driver().cuCtxGetCurrent(&ctx));
  std::lock_guard<std::mutex> lock(mutex);
  auto& [ptr, size] = buffers[{ctx, stream}];
  if (size < bytes) {
    if (capturing(stream))
      throw Error("CUDA-graph capture: kernel " + kernel + " needs a workspace of " + std::to_string(bytes) +
                  " bytes on the capturing stream, which the library cannot allocate during capture: pass one "
                  "(CallOptions::workspace, sized by tile::workspace_bytes; the Python package does so with "
                  "torch's allocator), or run the call once on this stream before capturing");
    if (ptr) outgrown.push_back(ptr);
    size_t grown = 256;
    while (grown < bytes) grown *= 2;
    TILE_CU_CHECK(cuda::driver().cuMemAlloc(&ptr, grown));
    size = grown;
  }
  return reinterpret_cast<void*>(ptr);
}

// Launches `groups` groups of `lk` with its buffers' base pointers and scalar parameters.
void launch_kernel(CUfunction fn, const LoweredKernel& lk, void* const* buffers, size_t n_buffers,
                   const ArgumentValues::Scalar* params, size_t n_params, int64_t groups, CUstream stream) {
  // Fixed arrays: no allocation on the launch path.
  constexpr size_t kMax = 64;
  TILE_CHECK(n_buffers <= kMax && n_params <= kMax, "kernel ", lk.kernel.name, " has too many arguments");
  CUdeviceptr ptrs[kMax];
  long long ints[kMax];
  float floats[kMax];
  double doubles[kMax];
  void* argv[2 * kMax];
  size_t n = 0;
  for (size_t b = 0; b < n_buffers; ++b) {
    ptrs[b] = reinterpret_cast<CUdeviceptr>(buffers[b]);
    argv[n++] = &ptrs[b];
  }
  for (size_t p = 0; p < n_params; ++p) {
    if (lk.kernel.params[p].type == ir::Type::f32) {
      floats[p] = params[p].f;
      argv[n++] = &floats[p];
    } else if (lk.kernel.params[p].type == ir::Type::f64) {
      doubles[p] = params[p].d;
      argv[n++] = &doubles[p];
    } else {
      ints[p] = params[p].i;
      argv[n++] = &ints[p];
    }
  }
  if (lk.kernel.ctas_per_cluster > 1) {
    TILE_CHECK(groups % lk.kernel.ctas_per_cluster == 0, "kernel ", lk.kernel.name, ": ", groups,
               " groups are not whole clusters of ", lk.kernel.ctas_per_cluster);
    CUlaunchConfig config;
    CUlaunchAttribute cluster;
    launch_config(config, cluster, lk.kernel, groups, stream);
    TILE_CU_CHECK(cuda::driver().cuLaunchKernelEx(&config, fn, argv, nullptr));
    return;
  }
  TILE_CU_CHECK(cuda::driver().cuLaunchKernel(fn, unsigned(groups), 1, 1, unsigned(lk.kernel.threads_per_group()), 1, 1,
                                              unsigned(lk.kernel.staged_bytes()), stream, argv, nullptr));
}

void launch_kernel(CUfunction fn, const LoweredKernel& lk, const ArgumentValues& a, int64_t groups, CUstream stream) {
  launch_kernel(fn, lk, a.buffers.data(), a.buffers.size(), a.params.data(), a.params.size(), groups, stream);
}

// A call as the CUDA target replays it: the functions loaded in one context (the row kernel,
// and the second phase of a reduction over the rows), their grids, and their scalar arguments,
// which depend on the shapes and scalars only; the buffers are the operands' data pointers of
// each replay and, for a second phase, the workspace the replay is given.
class CudaReplay final : public Replay {
 public:
  CudaReplay(std::shared_ptr<const PreparedKernel> pk, const BoundCall& call, std::pair<LoadedKernel, LoadedKernel> kernels,
             CUcontext context, uint64_t context_id)
      : pk_(std::move(pk)), call_(call), kernels_(std::move(kernels)), context_(context), context_id_(context_id) {
    const LoweredProgram& lp = pk_->lowered;
    groups_ = grid_groups(call_, pk_->plan);
    const int64_t slots = workspace_slots(pk_->plan, groups_);
    params_ = argument_values(lp.main, call_, nullptr, 0, slots).params;
    if (lp.finish) {
      workspace_elems_ = workspace_elems(*pk_, call_);
      finish_groups_ = finish_groups(*lp.finish, call_.cols);
      finish_params_ = argument_values(*lp.finish, call_, nullptr, 0, slots).params;
    }
  }

  int64_t workspace_bytes() const override { return workspace_elems_ * pk_->lowered.workspace_elem_bytes(); }

  bool launch(const void* const* data, void* stream, void* workspace) const override {
    CUcontext current = nullptr;
    if (cuda::driver().cuCtxGetCurrent(&current) != CUDA_SUCCESS || current != context_) return false;
    // A handle may be reused by a later context, an id never is.
    unsigned long long id = 0;
    if (cuda::driver().cuCtxGetId(current, &id) != CUDA_SUCCESS || id != context_id_) return false;
    if (!pointers_bind(call_, data)) return false;
    const LoweredProgram& lp = pk_->lowered;
    const CUstream s = static_cast<CUstream>(stream);
    if (lp.finish && workspace_elems_ > 0 && !workspace)
      workspace = workspace_for(s, size_t(workspace_bytes()), lp.main.kernel.name);
    if (groups_ > 0) launch_one(kernels_.first.function, lp.main, data, workspace, params_, groups_, s);
    if (lp.finish) launch_one(kernels_.second.function, *lp.finish, data, workspace, finish_params_, finish_groups_, s);
    return true;
  }

 private:
  static void launch_one(CUfunction fn, const LoweredKernel& lk, const void* const* data, void* workspace,
                         const std::vector<ArgumentValues::Scalar>& params, int64_t groups, CUstream stream) {
    constexpr size_t kMax = 64;
    void* buffers[kMax];
    TILE_CHECK(lk.buffers.size() <= kMax, "kernel ", lk.kernel.name, " has too many arguments");
    for (size_t b = 0; b < lk.buffers.size(); ++b)
      buffers[b] = lk.buffers[b] < 0 ? workspace : const_cast<void*>(data[lk.buffers[b]]);
    launch_kernel(fn, lk, buffers, lk.buffers.size(), params.data(), params.size(), groups, stream);
  }

  std::shared_ptr<const PreparedKernel> pk_;
  BoundCall call_;  // the call resolved: shapes, strides, scalars; its data pointers are not read
  std::pair<LoadedKernel, LoadedKernel> kernels_;  // (row kernel, second phase)
  CUcontext context_;
  uint64_t context_id_;
  int64_t groups_ = 0, workspace_elems_ = 0, finish_groups_ = 0;
  std::vector<ArgumentValues::Scalar> params_, finish_params_;
};

class CudaTarget final : public Target {
 public:
  const char* name() const override { return "cuda"; }

  // Named barriers, the 16-byte vector and 48 KiB of static shared memory hold on every
  // architecture NVRTC targets; clusters of up to 16 groups are generated, and limits() lowers
  // that to what the device launches.
  TargetCaps caps() const override {
    TargetCaps c;
    c.max_cluster_size = 16;
    c.can_launch = cuda::driver_available();
    return c;
  }

  DeviceLimits limits(const CallOptions& options) const override {
    DeviceLimits l = with_caps(DeviceLimits{}, caps());
    if (!cuda::driver_available()) return l;  // introspection without a GPU: H200-like defaults
    static std::mutex mutex;
    static std::map<int, DeviceLimits> cache;
    std::lock_guard<std::mutex> lock(mutex);
    auto it = cache.find(options.device);
    if (it == cache.end()) {
      const cuda::DeviceInfo info = cuda::device_info(options.device);
      l.sm_count = info.sm_count;
      l.max_threads_per_group = info.max_threads_per_block;
      l.max_cluster_size = std::min(l.max_cluster_size, device_cluster_size(info));
      l.max_staged_bytes = info.max_shared_per_block_optin;  // static and dynamic together
      it = cache.emplace(options.device, l).first;
    }
    return it->second;
  }

  void clear_caches() const override { cuda::clear_memory_cache(); }

  std::shared_ptr<const Replay> replay(std::shared_ptr<const PreparedKernel> pk, const BoundCall& call,
                                       const CallOptions& options) const override {
    CudaState& st = state_of(*pk);
    const CUcontext context = cuda::ensure_context(options.device);
    const uint64_t id = cuda::context_id(context);
    std::pair<LoadedKernel, LoadedKernel> loaded;
    {
      std::lock_guard<std::mutex> lock(st.mutex);
      auto it = st.loaded.find(id);
      if (it == st.loaded.end()) return nullptr;
      loaded = it->second;
    }
    return std::make_shared<CudaReplay>(std::move(pk), call, std::move(loaded), context, id);
  }

  std::string source(const PreparedKernel& pk) const override {
    CudaState& st = state_of(pk);
    ensure_source(pk, st);
    return st.source;
  }

  LaunchRecord launch(const PreparedKernel& pk, const BoundCall& call, const CallOptions& options) const override {
    const LoweredProgram& lp = pk.lowered;
    CudaState& st = state_of(pk);
    ensure_source(pk, st);
    LaunchRecord rec;
    rec.plan = pk.plan;
    rec.kernel_name = lp.main.kernel.name;
    rec.source_sha256 = st.source_sha256;
    rec.groups = grid_groups(call, pk.plan);
    rec.threads_per_group = lp.main.kernel.threads_per_group();
    rec.shared_bytes = int(lp.main.kernel.group_shared_bytes());
    rec.kernels = lp.finish ? 2 : 1;

    const uint64_t context = cuda::context_id(cuda::ensure_context(options.device));
    const int device = cuda::current_device();
    std::pair<LoadedKernel, LoadedKernel> loaded;
    {
      std::lock_guard<std::mutex> lock(st.mutex);
      if (auto it = st.loaded.find(context); it != st.loaded.end()) {
        loaded = it->second;
        rec.cache_origin = "launch-cache";
      }
    }
    if (!loaded.first.function) {
      if (capturing(static_cast<CUstream>(options.stream)))
        throw Error("CUDA-graph capture: kernel " + lp.main.kernel.name +
                    " is not loaded on cuda:" + std::to_string(device) +
                    " yet and cannot be compiled or loaded during capture: build it before capturing (Python: "
                    "tile.precompile; C++: one tile::run with the same shapes)");
      loaded.first = load(st.source, lp.main.kernel, device);
      check_cluster_fits(loaded.first, lp.main.kernel, device);
      if (lp.finish) loaded.second = load(st.finish_source, lp.finish->kernel, device);
      rec.compile_ms = loaded.first.module->compile_ms + (lp.finish ? loaded.second.module->compile_ms : 0.0);
      static const char* origins[] = {"compiled", "memory", "disk"};
      rec.cache_origin = origins[int(loaded.first.module->origin)];
      std::lock_guard<std::mutex> lock(st.mutex);
      st.loaded.emplace(context, loaded);
    }
    rec.arch = loaded.first.module->arch;
    rec.cubin_sha256 = loaded.first.module->cubin_sha256;
    rec.compile_options = loaded.first.module->options;

    const CUstream stream = static_cast<CUstream>(options.stream);
    const int64_t slots = workspace_slots(pk.plan, rec.groups);
    void* workspace = nullptr;
    const int64_t ws_elems = workspace_elems(pk, call);
    if (lp.finish) {
      rec.workspace_bytes = ws_elems * lp.workspace_elem_bytes();
      // The caller's (checked by run() to hold ws_elems), else the library's; none for no rows,
      // where the row kernel is not launched and the second reads no slot.
      if (ws_elems > 0)
        workspace = options.workspace ? options.workspace
                                      : workspace_for(stream, size_t(ws_elems) * lp.workspace_elem_bytes(), lp.main.kernel.name);
    }
    if (rec.groups > 0)
      launch_kernel(loaded.first.function, lp.main, argument_values(lp.main, call, workspace, ws_elems, slots), rec.groups,
                    stream);
    if (lp.finish) {
      const int64_t groups =
          finish_groups(*lp.finish, call.cols);
      launch_kernel(loaded.second.function, *lp.finish, argument_values(*lp.finish, call, workspace, ws_elems, slots),
                    groups, stream);
    }
    return rec;
  }
};

}  // namespace

const Target& cuda_target() {
  static const CudaTarget target;
  return target;
}

}  // namespace tile
