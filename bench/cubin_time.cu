// Times one generated kernel from a cubin, the way many back-to-back launches see it: the input
// rotates over enough buffers to exceed the L2 cache (at least 160 MiB, at most 64 buffers), 50
// launches warm up, then 9 event-timed batches of N launches; the median microseconds per
// launch is printed with the spread and a checksum of the first output buffer (so variants of
// one kernel can be compared for identical results). Inputs are N(0, 1) rows of the kernel's
// dtype (bf16 or f32, every operand the same); the norms' weight ~ 1 + 0.1 N(0, 1), bias
// 0.1 N(0, 1). A kernel whose name ends in _k<C> (a cluster plan) is launched in clusters of C
// groups, as the library launches it; SHARED bytes of dynamic shared memory (a staged plan's
// row slices) are given to each group. Built and driven by bench/cubin_time.sh.
//
// With GRAPH=1 in the environment each batch is one CUDA graph of the N launches, captured
// once and replayed: the host's launch path (about 4 us a launch, and as fast as the host is at
// the moment) drops out, so kernels of a few microseconds are timed by what the GPU does.
//
//   cubin_time CUBIN KERNEL softmax|rms|ln bf16|f32 ROWS COLS GRID BLOCK [LAUNCHES [SHARED]]
#include <cuda.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace {

void check(CUresult r, const char* what) {
  if (r == CUDA_SUCCESS) return;
  const char* s = "unknown error";
  cuGetErrorString(r, &s);
  std::fprintf(stderr, "cubin_time: %s: %s\n", what, s);
  std::exit(1);
}

unsigned short to_bf16(float f) {
  unsigned u;
  std::memcpy(&u, &f, 4);
  u += 0x7fff + ((u >> 16) & 1);  // round to nearest even
  return u >> 16;
}

float from_bf16(unsigned short h) {
  unsigned u = unsigned(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// n values of `dtype` (2 or 4 bytes each) in host memory, and back to float.
std::vector<unsigned char> encode(const std::vector<float>& v, bool bf16) {
  std::vector<unsigned char> out(v.size() * (bf16 ? 2 : 4));
  for (size_t i = 0; i < v.size(); ++i) {
    if (bf16) {
      const unsigned short h = to_bf16(v[i]);
      std::memcpy(&out[i * 2], &h, 2);
    } else {
      std::memcpy(&out[i * 4], &v[i], 4);
    }
  }
  return out;
}
float decode(const std::vector<unsigned char>& bytes, size_t i, bool bf16) {
  if (!bf16) {
    float f;
    std::memcpy(&f, &bytes[i * 4], 4);
    return f;
  }
  unsigned short h;
  std::memcpy(&h, &bytes[i * 2], 2);
  return from_bf16(h);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 9) {
    std::fprintf(stderr, "usage: cubin_time CUBIN KERNEL softmax|rms|ln bf16|f32 ROWS COLS GRID BLOCK [LAUNCHES]\n");
    return 2;
  }
  const std::string kind = argv[3], dtype = argv[4];
  if (kind != "softmax" && kind != "rms" && kind != "ln") {
    std::fprintf(stderr, "cubin_time: kind: expected softmax, rms or ln, got '%s'\n", argv[3]);
    return 2;
  }
  if (dtype != "bf16" && dtype != "f32") {
    std::fprintf(stderr, "cubin_time: dtype: expected bf16 or f32, got '%s'\n", argv[4]);
    return 2;
  }
  const bool bf16 = dtype == "bf16";
  const size_t elem = bf16 ? 2 : 4;
  long long rows = std::atoll(argv[5]), cols = std::atoll(argv[6]);
  const int grid = std::atoi(argv[7]), block = std::atoi(argv[8]), launches = argc > 9 ? std::atoi(argv[9]) : 200;
  if (rows < 1 || cols < 1 || grid < 1 || block < 1 || launches < 1) {
    std::fprintf(stderr, "cubin_time: rows, cols, grid, block and launches must be positive\n");
    return 2;
  }
  check(cuInit(0), "cuInit");
  CUdevice dev;
  check(cuDeviceGet(&dev, 0), "cuDeviceGet");
  CUcontext ctx;
  check(cuCtxCreate(&ctx, nullptr, 0, dev), "cuCtxCreate");
  CUmodule mod;
  check(cuModuleLoad(&mod, argv[1]), argv[1]);
  CUfunction fn;
  check(cuModuleGetFunction(&fn, mod, argv[2]), argv[2]);
  // Cluster kernels are named ..._k<C>.
  int cluster = 1;
  {
    const std::string name = argv[2];
    const size_t k = name.rfind("_k");
    if (k != std::string::npos && k + 2 < name.size() && name.find_first_not_of("0123456789", k + 2) == std::string::npos)
      cluster = std::atoi(name.c_str() + k + 2);
  }
  if (cluster > 8) check(cuFuncSetAttribute(fn, CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1), "cluster size");
  const int shared = argc > 10 ? std::atoi(argv[10]) : 0;
  if (shared > 48 * 1024)
    check(cuFuncSetAttribute(fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, shared), "dynamic shared memory");

  const size_t n = size_t(rows) * size_t(cols), bytes = n * elem;
  const int buffers = int(std::clamp<size_t>((size_t(160) << 20) / bytes + 1, 2, 64));
  std::vector<CUdeviceptr> xs(buffers), ys(buffers);
  std::mt19937 gen(1);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<float> values(n);
  for (float& v : values) v = normal(gen);
  const std::vector<unsigned char> host = encode(values, bf16);
  for (int i = 0; i < buffers; ++i) {
    check(cuMemAlloc(&xs[i], bytes), "cuMemAlloc x");
    check(cuMemAlloc(&ys[i], bytes), "cuMemAlloc y");
    check(cuMemcpyHtoD(xs[i], host.data(), bytes), "copy x");
  }
  std::vector<float> weight_values(cols), bias_values(cols);
  for (float& v : weight_values) v = 1.f + 0.1f * normal(gen);
  for (float& v : bias_values) v = 0.1f * normal(gen);
  const std::vector<unsigned char> weight = encode(weight_values, bf16), bias = encode(bias_values, bf16);
  CUdeviceptr w, b;
  check(cuMemAlloc(&w, cols * elem), "cuMemAlloc weight");
  check(cuMemAlloc(&b, cols * elem), "cuMemAlloc bias");
  check(cuMemcpyHtoD(w, weight.data(), cols * elem), "copy weight");
  check(cuMemcpyHtoD(b, bias.data(), cols * elem), "copy bias");
  float eps = kind == "ln" ? 1e-5f : 1e-6f;
  float inv_cols = float(1.0 / double(cols > 0 ? cols : 1));
  const char* graph_env = std::getenv("GRAPH");
  const bool graph = graph_env && std::string(graph_env) == "1";
  // Graph capture needs a stream other than the legacy default one.
  CUstream stream = nullptr;
  if (graph) check(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
  // The generated kernels' parameters: x, y, [weight, [bias]], rows, cols, x stride, y stride, [eps],
  // [tile_inv_cols] (the norms since it was added; the driver reads only as many entries as the
  // kernel declares, so older kernels ignore the last).
  auto launch = [&](int i) {
    std::vector<void*> args{&xs[i], &ys[i]};
    if (kind != "softmax") args.push_back(&w);
    if (kind == "ln") args.push_back(&b);
    for (long long* p : {&rows, &cols, &cols, &cols}) args.push_back(p);
    if (kind != "softmax") args.push_back(&eps), args.push_back(&inv_cols);
    CUlaunchConfig config{};
    config.gridDimX = unsigned(grid), config.gridDimY = 1, config.gridDimZ = 1;
    config.blockDimX = unsigned(block), config.blockDimY = 1, config.blockDimZ = 1;
    config.sharedMemBytes = unsigned(shared);
    config.hStream = stream;
    CUlaunchAttribute attr{};
    attr.id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
    attr.value.clusterDim.x = unsigned(cluster), attr.value.clusterDim.y = 1, attr.value.clusterDim.z = 1;
    config.attrs = &attr, config.numAttrs = cluster > 1 ? 1 : 0;
    check(cuLaunchKernelEx(&config, fn, args.data(), nullptr), "cuLaunchKernelEx");
  };
  for (int i = 0; i < 50; ++i) launch(i % buffers);
  check(cuCtxSynchronize(), "warm-up");
  CUgraphExec batch_graph = nullptr;
  if (graph) {
    CUgraph g;
    check(cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL), "cuStreamBeginCapture");
    for (int i = 0; i < launches; ++i) launch(i % buffers);
    check(cuStreamEndCapture(stream, &g), "cuStreamEndCapture");
    check(cuGraphInstantiate(&batch_graph, g, 0), "cuGraphInstantiate");
    check(cuGraphLaunch(batch_graph, stream), "cuGraphLaunch (warm-up)");
    check(cuStreamSynchronize(stream), "graph warm-up");
  }
  CUevent e0, e1;
  check(cuEventCreate(&e0, 0), "cuEventCreate");
  check(cuEventCreate(&e1, 0), "cuEventCreate");
  std::vector<float> us;
  for (int batch = 0; batch < 9; ++batch) {
    check(cuEventRecord(e0, stream), "cuEventRecord");
    if (graph)
      check(cuGraphLaunch(batch_graph, stream), "cuGraphLaunch");
    else
      for (int i = 0; i < launches; ++i) launch(i % buffers);
    check(cuEventRecord(e1, stream), "cuEventRecord");
    check(cuEventSynchronize(e1), "cuEventSynchronize");
    float ms;
    check(cuEventElapsedTime(&ms, e0, e1), "cuEventElapsedTime");
    us.push_back(ms * 1000.f / float(launches));
  }
  std::sort(us.begin(), us.end());
  std::vector<unsigned char> out(bytes);
  check(cuMemcpyDtoH(out.data(), ys[0], bytes), "copy y");
  double sum = 0;
  for (size_t i = 0; i < n; ++i) sum += decode(out, i, bf16);
  std::printf("%s %s %s %lldx%lld%s: median %.3f us (min %.3f, max %.3f), output sum %.6f\n", argv[1], kind.c_str(),
              dtype.c_str(), rows, cols, graph ? " (graph)" : "", us[us.size() / 2], us.front(), us.back(), sum);
  return 0;
}
