// The `tile` command: show the plan, the raw IR and the generated CUDA source for an operator
// and shape, run it (GPU when there is one, else the CPU backend) and check it against the
// float64 oracle; `bench` and `tune` time kernels on a GPU (tile_bench.cpp). Every option,
// sizes included, is checked before any memory is allocated.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <charconv>
#include <cstdio>
#include <filesystem>
#include <new>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#if TILE_WITH_CUDA
#include "backend/cuda/driver.hpp"
#endif
#include "target/target.hpp"
#include "testing/host_tensor.hpp"
#include "tile/tile.hpp"
#include "tile_cli.hpp"

namespace {

using tile::cli::Shape;

// The command line is wrong (exit status 2); the message names the option.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

[[noreturn]] void bad_option(const std::string& option, const std::string& expected, const std::string& given) {
  throw UsageError(option + ": expected " + expected + ", got " + given);
}

std::string in_quotes(const std::string& text) { return "'" + text + "'"; }

// A whole decimal integer: optional '-' then digits, nothing else, within int64_t.
std::optional<int64_t> parse_int(std::string_view text) {
  int64_t value = 0;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (text.empty() || ec != std::errc{} || ptr != end) return std::nullopt;
  return value;
}

bool all_digits(std::string_view text) {
  return !text.empty() && std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// "RxC": two decimal integers joined by one 'x'; cols >= 1 as every operator needs, rows >=
// min_rows (1 where a kernel is timed).
Shape parse_shape(const std::string& option, const std::string& text, int64_t min_rows = 0) {
  const size_t x = text.find('x');
  const std::string_view rows_text = std::string_view(text).substr(0, x);
  const std::string_view cols_text = x == std::string::npos ? std::string_view() : std::string_view(text).substr(x + 1);
  if (!all_digits(rows_text) || !all_digits(cols_text))
    bad_option(option, "RxC with rows and cols non-negative decimal integers (e.g. 37x1537)", in_quotes(text));
  const std::optional<int64_t> rows = parse_int(rows_text), cols = parse_int(cols_text);
  if (!rows || !cols) bad_option(option, "rows and cols below 2^63", in_quotes(text));
  if (*cols < 1) bad_option(option, "cols >= 1", in_quotes(text));
  if (*rows < min_rows) bad_option(option, "rows >= " + std::to_string(min_rows), in_quotes(text));
  return {*rows, *cols};
}

tile::Op parse_op(const std::string& option, const std::string& text) {
  try {
    return tile::parse_op(text);
  } catch (const tile::Error&) {
    bad_option(option, "one of softmax, log_softmax, rms_norm, layer_norm", in_quotes(text));
  }
}

// The operators' float dtypes only: the library also parses i32 and i64 (targets, indices),
// which no operator here takes as x, y or weight.
tile::DType parse_dtype(const std::string& option, const std::string& text) {
  std::optional<tile::DType> dtype;
  try {
    dtype = tile::parse_dtype(text);
  } catch (const tile::Error&) {
  }
  if (!dtype || !tile::DTypeSet::floats().contains(*dtype)) bad_option(option, "one of f32, f64, f16, bf16", in_quotes(text));
  return *dtype;
}

tile::PlanRequest parse_plan(const std::string& option, const std::string& text) {
  try {
    return tile::PlanRequest::from_json(text);
  } catch (const std::exception& e) {
    throw UsageError(option + ": " + e.what());
  }
}

// The host bytes one call needs: x and y as HostMatrix allocates them (`guard` elements after
// the last row), weight and bias, and the float64 reference the oracle computes. Refused above
// kHostBytesLimit; the sum is overflow-safe, so absurd shapes are refused too.
void check_host_bytes(const std::string& option, Shape shape, int64_t stride, tile::DType x, tile::DType y,
                      tile::DType columns, int64_t guard) {
  namespace testing = tile::testing;
  int64_t total = 0;
  bool fits = true;
  auto add = [&](int64_t bytes) { fits = fits && !__builtin_add_overflow(total, bytes, &total); };
  try {
    add(int64_t(testing::HostMatrix::allocation_bytes(x, shape.rows, shape.cols, stride, 0, guard)));
    add(int64_t(testing::HostMatrix::allocation_bytes(y, shape.rows, shape.cols, stride, 0, guard)));
    const int64_t column_bytes = int64_t(testing::HostVector::allocation_bytes(columns, shape.cols));
    add(column_bytes);  // weight
    add(column_bytes);  // bias
    int64_t reference = 0;
    fits = fits && !__builtin_mul_overflow(shape.rows, shape.cols, &reference) &&
           !__builtin_mul_overflow(reference, int64_t(sizeof(double)), &reference);
    add(reference);
  } catch (const tile::Error&) {
    fits = false;  // a size beyond 2^63 bytes
  }
  if (fits && total <= tile::cli::kHostBytesLimit) return;
  const std::string given = std::to_string(shape.rows) + "x" + std::to_string(shape.cols) + " with row stride " +
                            std::to_string(stride) + ", which needs " +
                            (fits ? std::to_string(total) + " bytes" : std::string("2^63 bytes or more"));
  bad_option(option,
             "a shape whose host buffers (x, y, weight, bias and the float64 reference) fit in " +
                 std::to_string(tile::cli::kHostBytesLimit >> 30) + " GiB",
             given);
}

struct RunOptions {
  tile::Op op = tile::Op::softmax;
  Shape shape;
  int64_t stride = 0;
  tile::DType x_dtype = tile::DType::f32, y_dtype = tile::DType::f32, weight_dtype = tile::DType::f32;
  bool no_weight = false;
  tile::PlanRequest request;
  std::string backend;  // auto, cuda or cpu
  uint64_t seed = 1;
  std::vector<std::string> show;
};

constexpr const char* kShowItems[] = {"plan", "ir", "source", "check"};

int run_main(const RunOptions& o) {
  tile::Call call;
  call.op = o.op;
  const int64_t rows = o.shape.rows, cols = o.shape.cols, stride = o.stride;
  auto shows = [&](const char* what) { return std::find(o.show.begin(), o.show.end(), what) != o.show.end(); };
  std::string backend = o.backend;
  if (backend == "auto") backend = tile::cuda_target().caps().can_launch ? "cuda" : "cpu";

  std::mt19937_64 rng(o.seed);
  tile::testing::HostMatrix x(o.x_dtype, rows, cols, stride), y(o.y_dtype, rows, cols, stride);
  x.fill_random(rng);
  tile::testing::HostVector weight(o.weight_dtype, cols), bias(o.weight_dtype, cols);
  weight.fill_random(rng, 1.0, 0.5);
  bias.fill_random(rng, 0.0, 0.5);
  const bool norm = call.op == tile::Op::rms_norm || call.op == tile::Op::layer_norm;
  call.x = x.view();
  call.y = y.view();
  if (norm && !o.no_weight) call.weight = weight.view();
  if (call.op == tile::Op::layer_norm && !o.no_weight) call.bias = bias.view();

  tile::MappingPlan plan = tile::plan_for(call, o.request);
  std::printf("tile run: %s %lldx%lld (row stride %lld), x %s, y %s, backend %s\n", tile::op_name(o.op).c_str(),
              (long long)rows, (long long)cols, (long long)stride, std::string(tile::dtype_name(o.x_dtype)).c_str(),
              std::string(tile::dtype_name(o.y_dtype)).c_str(), backend.c_str());
  if (shows("plan")) std::printf("\nplan %s\n%s", plan.to_json().c_str(), plan.loop_nest().c_str());
  if (shows("ir")) std::printf("\n%s", tile::ir_for(call, o.request).c_str());
  if (shows("source")) std::printf("\n%s", tile::source_for(call, o.request).c_str());

  tile::CallOptions options{o.request};
  tile::LaunchRecord rec;
  if (backend == "cpu") {
    options.backend = tile::Backend::cpu;
    rec = tile::run(call, options);
  } else {
#if !TILE_WITH_CUDA
    options.backend = tile::Backend::cuda;
    rec = tile::run(call, options);  // throws NoDriverError: this build has no CUDA backend
#else
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
    std::printf("\ndevice %s, kernel %s, %s, cubin sha256 %s\n", cu::device_info(0).name.c_str(),
                rec.kernel_name.c_str(), rec.arch.c_str(), rec.cubin_sha256.c_str());
#endif
  }
  std::printf("\nlaunch: %lld group(s) x %d thread(s), %d shared bytes, source sha256 %s\n", (long long)rec.groups,
              rec.threads_per_group, rec.shared_bytes, rec.source_sha256.c_str());
  // Checked with the allowance of the plan that ran (a deep plan merges through more roundings).
  tile::OracleCheck check = tile::check_against_oracle(call, rec.plan);
  bool untouched = y.outside_untouched();
  std::printf("oracle (float64): %s, %lld elements, max abs error %.3g, max rel error %.3g%s%s\n",
              check.ok ? "PASS" : "FAIL", (long long)check.checked, check.max_abs_error, check.max_rel_error,
              check.ok ? "" : ", first mismatch: ", check.first_mismatch.c_str());
  std::printf("memory outside the output rows: %s\n", untouched ? "untouched" : "WRITTEN (bug)");
  return check.ok && untouched ? 0 : 1;
}

// The command line as typed (strings), turned into checked options once CLI11 has parsed it.
struct RunArgs {
  std::string op = "softmax", shape = "37x1537", dtype = "f32", out_dtype, weight_dtype, stride, plan;
  std::string backend = "auto", seed = "1", show = "plan,source,check";
  bool no_weight = false;
  CLI::Option *out_dtype_opt = nullptr, *weight_dtype_opt = nullptr, *stride_opt = nullptr, *plan_opt = nullptr;

  void add_to(CLI::App& app) {
    app.add_option("--op", op, "softmax | log_softmax | rms_norm | layer_norm")
        ->type_name("NAME")
        ->capture_default_str();
    app.add_option("--shape", shape, "rows x cols, e.g. 37x1537")->type_name("RxC")->capture_default_str();
    app.add_option("--dtype", dtype, "input dtype: f32 | f64 | f16 | bf16")->type_name("T")->capture_default_str();
    out_dtype_opt = app.add_option("--out-dtype", out_dtype, "output dtype (default: the input dtype)")->type_name("T");
    weight_dtype_opt =
        app.add_option("--weight-dtype", weight_dtype, "weight and bias dtype of the norms (default: the input dtype)")
            ->type_name("T");
    app.add_flag("--no-weight", no_weight, "norms without weight (and bias)")
        ->disable_flag_override()
        ->multi_option_policy(CLI::MultiOptionPolicy::Throw);  // repeated, as every option is refused
    stride_opt =
        app.add_option("--stride", stride, "row stride of input and output in elements, >= cols (default: cols)")
            ->type_name("N");
    plan_opt =
        app.add_option("--plan", plan, "plan fields to fix, e.g. '{\"programs_per_group\":2}'")->type_name("JSON");
    app.add_option("--backend", backend, "auto | cuda | cpu (auto: cuda where a driver is present)")
        ->type_name("B")
        ->capture_default_str();
    app.add_option("--seed", seed, "input seed, 0 to 2^64 - 1")->type_name("N")->capture_default_str();
    app.add_option("--show", show, "comma list of plan, ir, source, check (the oracle check is always run and printed)")
        ->type_name("WHAT")
        ->capture_default_str();
  }

  RunOptions check() const {
    RunOptions o;
    o.op = parse_op("--op", op);
    o.shape = parse_shape("--shape", shape);
    o.x_dtype = parse_dtype("--dtype", dtype);
    o.y_dtype = out_dtype_opt->count() ? parse_dtype("--out-dtype", out_dtype) : o.x_dtype;
    o.weight_dtype = weight_dtype_opt->count() ? parse_dtype("--weight-dtype", weight_dtype) : o.x_dtype;
    o.no_weight = no_weight;
    // Options that would change nothing are refused rather than ignored.
    const bool norm = o.op == tile::Op::rms_norm || o.op == tile::Op::layer_norm;
    if (weight_dtype_opt->count() && (!norm || no_weight))
      bad_option("--weight-dtype", std::string("no weight dtype for ") + (norm ? "--no-weight" : "an operator without weight"),
                 in_quotes(weight_dtype) + " with --op " + op + (no_weight ? " --no-weight" : ""));
    if (no_weight && !norm) bad_option("--no-weight", "a norm (rms_norm or layer_norm)", "--op " + op);
    o.stride = o.shape.cols;
    if (stride_opt->count()) {
      const std::optional<int64_t> value = parse_int(stride);
      if (!value || *value < o.shape.cols)
        bad_option("--stride", "an integer from cols = " + std::to_string(o.shape.cols) + " to 2^63 - 1",
                   in_quotes(stride));
      o.stride = *value;
    }
    if (plan_opt->count()) o.request = parse_plan("--plan", plan);
    if (backend != "auto" && backend != "cuda" && backend != "cpu")
      bad_option("--backend", "one of auto, cuda, cpu", in_quotes(backend));
    o.backend = backend;
    uint64_t seed_value = 0;
    auto [ptr, ec] = std::from_chars(seed.data(), seed.data() + seed.size(), seed_value);
    if (!all_digits(seed) || ec != std::errc{} || ptr != seed.data() + seed.size())
      bad_option("--seed", "an integer from 0 to 2^64 - 1", in_quotes(seed));
    o.seed = seed_value;
    for (size_t begin = 0; begin <= show.size();) {
      size_t end = std::min(show.find(',', begin), show.size());
      std::string item = show.substr(begin, end - begin);
      if (std::find(std::begin(kShowItems), std::end(kShowItems), item) == std::end(kShowItems))
        bad_option("--show", "a comma list of plan, ir, source, check",
                   in_quotes(show) + (item == show ? "" : " (item " + in_quotes(item) + ")"));
      o.show.push_back(item);
      begin = end + 1;
    }
    const std::string size_option = stride_opt->count() ? "--shape, --stride" : "--shape";
    check_host_bytes(size_option, o.shape, o.stride, o.x_dtype, o.y_dtype, o.weight_dtype, 64);
    return o;
  }
};

struct BenchArgs {
  std::string plan;
  std::vector<std::string> shapes, ops, dtypes;
  bool host = false;
  CLI::Option* plan_opt = nullptr;

  void add_to(CLI::App& app) {
    plan_opt =
        app.add_option("--plan", plan, "plan fields to fix for every call, e.g. '{\"stripes\":2}'")->type_name("JSON");
    CLI::Option* shape_opt =
        app.add_option("--shape", shapes,
                       "a shape to time, rows x cols; repeat for more (default: 37x1537 256x3072 768x6144 1024x4096 "
                       "32768x4096 4096x32768)")
            ->type_name("RxC")
            ->allow_extra_args(false);
    CLI::Option* op_opt = app.add_option("--op", ops, "an operator to time; repeat for more (default: all four)")
                              ->type_name("NAME")
                              ->allow_extra_args(false);
    CLI::Option* dtype_opt = app.add_option("--dtype", dtypes, "an input dtype to time; repeat for more (default: f32 bf16)")
                                 ->type_name("T")
                                 ->allow_extra_args(false);
    app.add_flag("--host", host,
                 "host microseconds per call and GPU microseconds per launch of small calls, against the "
                 "empty-kernel launch floor")
        ->disable_flag_override()
        ->multi_option_policy(CLI::MultiOptionPolicy::Throw)
        ->excludes(plan_opt)
        ->excludes(shape_opt)
        ->excludes(op_opt)
        ->excludes(dtype_opt);
  }

  tile::cli::BenchOptions check() const {
    tile::cli::BenchOptions o;
    o.host = host;
    if (plan_opt->count()) o.request = parse_plan("--plan", plan);
    for (const std::string& text : shapes) {
      Shape shape = parse_shape("--shape", text, 1);
      // f32 is the larger of the two dtypes bench times.
      check_host_bytes("--shape", shape, shape.cols, tile::DType::f32, tile::DType::f32, tile::DType::f32, 0);
      o.shapes.push_back(shape);
    }
    for (const std::string& text : ops) o.ops.push_back(parse_op("--op", text));
    for (const std::string& text : dtypes) o.dtypes.push_back(parse_dtype("--dtype", text));
    return o;
  }
};

struct TuneArgs {
  std::string op = "softmax", shape = "1024x4096", dtype = "f32", out;
  CLI::Option* out_opt = nullptr;

  void add_to(CLI::App& app) {
    app.add_option("--op", op, "softmax | log_softmax | rms_norm | layer_norm")
        ->type_name("NAME")
        ->capture_default_str();
    app.add_option("--shape", shape, "rows x cols")->type_name("RxC")->capture_default_str();
    app.add_option("--dtype", dtype, "input, output and weight dtype: f32 | f64 | f16 | bf16")
        ->type_name("T")
        ->capture_default_str();
    out_opt = app.add_option("--out", out, "also write every plan's time as JSON to FILE")->type_name("FILE");
  }

  tile::cli::TuneOptions check() const {
    tile::cli::TuneOptions o;
    o.op = parse_op("--op", op);
    o.shape = parse_shape("--shape", shape, 1);
    o.dtype = parse_dtype("--dtype", dtype);
    check_host_bytes("--shape", o.shape, o.shape.cols, o.dtype, o.dtype, o.dtype, 0);
    if (out_opt->count()) {
      namespace fs = std::filesystem;
      std::error_code ec;
      const fs::path parent = fs::absolute(fs::path(out), ec).parent_path();
      if (out.empty() || fs::is_directory(fs::path(out), ec) || !fs::is_directory(parent, ec))
        bad_option("--out", "a file path in an existing folder", in_quotes(out));
    }
    o.op_text = op, o.shape_text = shape, o.dtype_text = dtype, o.out_path = out;
    return o;
  }
};

// Arguments CLI11 could not place: the first unknown option or stray value, as a usage error.
void reject_extras(const CLI::App& app) {
  const std::vector<std::string> extras = app.remaining();
  if (extras.empty()) return;
  const std::string& first = extras.front();
  if (!first.empty() && first[0] == '-') throw UsageError("unknown option " + in_quotes(first));
  throw UsageError("unexpected argument " + in_quotes(first));
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Tile: generated GPU kernels for row-wise reductions (softmax, log_softmax, rms_norm, layer_norm).",
               "tile"};
  app.allow_extras()->require_subcommand(0, 1);  // one command; the rest is checked below
  CLI::App* run = app.add_subcommand(
      "run",
      "show the plan, raw IR and CUDA source of one call, run it (on the GPU where there is one, else on the "
      "CPU backend) and check it against the float64 oracle");
  CLI::App* bench = app.add_subcommand(
      "bench", "GPU only: bandwidth of the analytic (or --plan) plans against a device copy of the same bytes");
  CLI::App* tune = app.add_subcommand(
      "tune", "GPU only: time every plan of the mapping family for one call and report the policy's regret");
  const std::string limits = "Host buffers of one call (x, y, weight, bias, the float64 reference) are limited to " +
                             std::to_string(tile::cli::kHostBytesLimit >> 30) +
                             " GiB. Exit status: 0 success, 1 failure (oracle mismatch, library or device error), 2 "
                             "usage error.";
  app.footer("Run 'tile COMMAND --help' for a command's options. " + limits);
  for (CLI::App* sub : {run, bench, tune}) sub->allow_extras()->footer(limits);
  RunArgs run_args;
  BenchArgs bench_args;
  TuneArgs tune_args;
  run_args.add_to(*run);
  bench_args.add_to(*bench);
  tune_args.add_to(*tune);

  auto chosen = [&]() -> CLI::App* {
    for (CLI::App* sub : {run, bench, tune})
      if (sub->parsed()) return sub;
    return nullptr;
  };
  auto usage_failure = [](const CLI::App* command, const std::string& message) {
    const std::string name = command ? "tile " + command->get_name() : "tile";
    std::fprintf(stderr, "%s: %s\nRun '%s --help' for the options.\n", name.c_str(), message.c_str(), name.c_str());
    return 2;
  };
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help
    return usage_failure(chosen(), e.what());
  }
  CLI::App* command = chosen();

  // Every option is checked here, before any allocation.
  RunOptions run_options;
  tile::cli::BenchOptions bench_options;
  tile::cli::TuneOptions tune_options;
  try {
    if (!command && app.remaining().empty()) {
      std::fprintf(stderr, "tile: missing command\n%s", app.help().c_str());
      return 2;
    }
    if (!command && app.remaining().front()[0] != '-')
      throw UsageError("unknown command " + in_quotes(app.remaining().front()) + " (expected run, bench or tune)");
    // The options' values first: `--op --shape 2x3` gives --op the value '--shape', and that is
    // the error to name, not the '2x3' left over.
    if (command == run) run_options = run_args.check();
    if (command == bench) bench_options = bench_args.check();
    if (command == tune) tune_options = tune_args.check();
    reject_extras(app);
    reject_extras(*command);
  } catch (const UsageError& e) {
    return usage_failure(command, e.what());
  }

  const std::string name = "tile " + command->get_name();
  try {
    if (command == run) return run_main(run_options);
#if TILE_WITH_CUDA
    if (!tile::cuda::driver_available()) throw tile::NoDriverError("no CUDA driver: " + name + " times GPU kernels");
    return command == bench ? tile::cli::bench_main(bench_options) : tile::cli::tune_main(tune_options);
#else
    throw tile::NoDriverError("no CUDA backend: Tile was built without CUDA (TILE_WITH_CUDA=OFF); " + name +
                              " times GPU kernels");
#endif
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "%s: out of host memory for the call's buffers\n", name.c_str());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", name.c_str(), e.what());
    return 1;
  }
}
