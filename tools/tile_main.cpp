// The `tile` command: show the plan, the raw IR and the generated CUDA source for an operator
// and shape, run it (GPU when there is one, else the CPU backend) and check it against the
// float64 oracle.
#include <cstdio>
#include <cstring>
#include <iostream>
#include <map>
#include <random>
#include <string>

#include "backend/cuda/driver.hpp"
#include "testing/host_tensor.hpp"
#include "tile/tile.hpp"

namespace {

const char* kUsage = R"(usage: tile run [options]     (or, on a GPU: tile bench [--plan JSON] [--shape RxC]..., tile bench --host, tile tune --op OP --shape RxC [--dtype T] [--out FILE])
  --op NAME          softmax | log_softmax | rms_norm | layer_norm   (default softmax)
  --shape RxC        rows x cols                                     (default 37x1537)
  --dtype T          input dtype f32 | f16 | bf16                    (default f32)
  --out-dtype T      output dtype                                    (default: input dtype)
  --weight-dtype T   weight/bias dtype for the norms                 (default: input dtype)
  --no-weight        norms without weight (and bias)
  --stride N         row stride of input and output in elements      (default: cols)
  --plan JSON        plan fields to fix, e.g. '{"programs_per_group":2}'
  --backend B        auto | cuda | cpu                               (default auto)
  --seed N           input seed                                      (default 1)
  --show WHAT        comma list of plan, ir, source, check           (default plan,source,check)
)";

[[noreturn]] void usage_error(const std::string& msg) {
  std::fprintf(stderr, "tile: %s\n%s", msg.c_str(), kUsage);
  std::exit(2);
}

}  // namespace

int bench_main(int argc, char** argv);
int tune_main(int argc, char** argv);

int main(int argc, char** argv) {
  if (argc >= 2 && (std::string(argv[1]) == "bench" || std::string(argv[1]) == "tune")) {
    try {
      if (!tile::cuda::driver_available())
        throw tile::NoDriverError("no CUDA driver: tile " + std::string(argv[1]) + " times GPU kernels");
      return std::string(argv[1]) == "bench" ? bench_main(argc, argv) : tune_main(argc, argv);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "tile: %s\n", e.what());
      return 1;
    }
  }
  if (argc < 2 || std::string(argv[1]) != "run") usage_error(argc < 2 ? "missing command" : "unknown command '" + std::string(argv[1]) + "'");
  std::map<std::string, std::string> opt = {{"op", "softmax"}, {"shape", "37x1537"}, {"dtype", "f32"},
                                            {"backend", "auto"}, {"seed", "1"}, {"show", "plan,source,check"}};
  bool no_weight = false;
  for (int i = 2; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--no-weight") { no_weight = true; continue; }
    if (a == "-h" || a == "--help") { std::fputs(kUsage, stdout); return 0; }
    if (a.rfind("--", 0) != 0 || i + 1 >= argc) usage_error("bad argument '" + a + "'");
    opt[a.substr(2)] = argv[++i];
  }
  try {
    tile::Call call;
    call.op = tile::parse_op(opt["op"]);
    long long rows = 0, cols = 0;
    if (std::sscanf(opt["shape"].c_str(), "%lldx%lld", &rows, &cols) != 2) usage_error("--shape must be RxC");
    const long long stride = opt.count("stride") ? std::stoll(opt["stride"]) : cols;
    const tile::DType xt = tile::parse_dtype(opt["dtype"]);
    const tile::DType yt = opt.count("out-dtype") ? tile::parse_dtype(opt["out-dtype"]) : xt;
    const tile::DType wt = opt.count("weight-dtype") ? tile::parse_dtype(opt["weight-dtype"]) : xt;
    tile::PlanRequest request = opt.count("plan") ? tile::PlanRequest::from_json(opt["plan"]) : tile::PlanRequest{};
    const std::string show = opt["show"];
    auto shows = [&](const char* what) { return show.find(what) != std::string::npos; };

    std::string backend = opt["backend"];
    if (backend == "auto") backend = tile::cuda::driver_available() ? "cuda" : "cpu";
    if (backend != "cuda" && backend != "cpu") usage_error("--backend must be auto, cuda or cpu");

    std::mt19937_64 rng(std::stoull(opt["seed"]));
    tile::testing::HostMatrix x(xt, rows, cols, stride), y(yt, rows, cols, stride);
    x.fill_random(rng);
    tile::testing::HostVector weight(wt, cols), bias(wt, cols);
    weight.fill_random(rng, 1.0, 0.5);
    bias.fill_random(rng, 0.0, 0.5);
    const bool norm = call.op == tile::Op::rms_norm || call.op == tile::Op::layer_norm;
    call.x = x.view();
    call.y = y.view();
    if (norm && !no_weight) call.weight = weight.view();
    if (call.op == tile::Op::layer_norm && !no_weight) call.bias = bias.view();

    tile::MappingPlan plan = tile::plan_for(call, request);
    std::printf("tile run: %s %lldx%lld (row stride %lld), x %s, y %s, backend %s\n", opt["op"].c_str(), rows, cols,
                stride, std::string(tile::dtype_name(xt)).c_str(), std::string(tile::dtype_name(yt)).c_str(),
                backend.c_str());
    if (shows("plan")) std::printf("\nplan %s\n%s", plan.to_json().c_str(), plan.loop_nest().c_str());
    if (shows("ir")) std::printf("\n%s", tile::ir_for(call, request).c_str());
    if (shows("source")) std::printf("\n%s", tile::source_for(call, request).c_str());

    tile::CallOptions options{request};
    tile::LaunchRecord rec;
    if (backend == "cpu") {
      options.backend = tile::Backend::cpu;
      rec = tile::run(call, options);
    } else {
      namespace cu = tile::cuda;
      cu::ensure_context(0);
      cu::DeviceBuffer dx(x.bytes().size()), dy(y.bytes().size()), dw(weight.bytes.size()), db(bias.bytes.size());
      dx.copy_from_host(x.bytes().data(), x.bytes().size());
      dy.fill_byte(0xff);  // poison
      dw.copy_from_host(weight.bytes.data(), weight.bytes.size());
      db.copy_from_host(bias.bytes.data(), bias.bytes.size());
      tile::Call dcall = call;
      dcall.x.data = dx.get();
      dcall.y.data = dy.get();
      if (call.weight.data) dcall.weight.data = dw.get();
      if (call.bias.data) dcall.bias.data = db.get();
      rec = tile::run(dcall, options);
      TILE_CU_CHECK(cu::driver().cuCtxSynchronize());
      dy.copy_to_host(y.bytes().data(), y.bytes().size());
      std::printf("\ndevice %s, kernel %s, %s, cubin sha256 %s\n", cu::device_info(0).name.c_str(), rec.kernel_name.c_str(),
                  rec.arch.c_str(), rec.cubin_sha256.c_str());
    }
    std::printf("\nlaunch: %lld group(s) x %d thread(s), %d shared bytes, source sha256 %s\n", (long long)rec.groups,
                rec.threads_per_group, rec.shared_bytes, rec.source_sha256.c_str());
    tile::OracleCheck check = tile::check_against_oracle(call);
    bool untouched = y.outside_untouched();
    std::printf("oracle (float64): %s, %lld elements, max abs error %.3g, max rel error %.3g%s%s\n",
                check.ok ? "PASS" : "FAIL", (long long)check.checked, check.max_abs_error, check.max_rel_error,
                check.ok ? "" : ", first mismatch: ", check.first_mismatch.c_str());
    std::printf("memory outside the output rows: %s\n", untouched ? "untouched" : "WRITTEN (bug)");
    return check.ok && untouched ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tile: %s\n", e.what());
    return 1;
  }
}
