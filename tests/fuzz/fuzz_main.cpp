// The seeded fuzz: random calls (operator, dtypes, shapes, strides, offsets, weights, eps,
// special values) under random valid plans from the whole mapping family, each checked
// against the float64 oracle with its output poisoned and its guard band watched.
//
//   fuzz_main [--cases N] [--seed S] [--jobs J]        CPU backend (CTest: fuzz.cpu)
//   fuzz_main --backend cuda [--cases N] [--seed S]    GPU, also compared with the CPU executor
//   fuzz_main --replay S:I [--backend cuda] [--dump]   one case, verbosely
//
// Case I of seed S is a pure function of (S, I), so a failure replays alone. The rules the
// outputs are checked by are in docs/source/numerics.md.
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>

#include "bind/bind.hpp"
#include "support/cases.hpp"
#if TILE_WITH_CUDA
#include "backend/cuda/jit_module.hpp"
#endif

namespace tile::testing {
namespace {

constexpr uint64_t kDefaultSeed = 20261130;
constexpr double kUnit = 0x1p-24;

// SplitMix64: the generator of case I of seed S is seeded with mix(S, I), independent of every
// other case.
uint64_t mix(uint64_t a, uint64_t b) {
  uint64_t z = a * 0x9e3779b97f4a7c15ull + b + 0x632be59bd9b4e5f9ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

struct Rng {
  explicit Rng(uint64_t seed) : gen(seed) {}
  std::mt19937_64 gen;
  int below(int n) { return int(gen() % uint64_t(n)); }
  bool chance(double p) { return std::uniform_real_distribution<double>(0, 1)(gen) < p; }
  int64_t log_uniform(int64_t lo, int64_t hi) {  // in [lo, hi]
    double v = std::exp(std::uniform_real_distribution<double>(std::log(double(lo)), std::log(double(hi) + 1))(gen));
    return std::clamp<int64_t>(int64_t(v), lo, hi);
  }
  template <typename T>
  T pick(std::initializer_list<T> options) {
    return *(options.begin() + below(int(options.size())));
  }
};

struct FuzzCase {
  Case c;
  MappingPlan plan;
  std::string origin;  // how the plan was drawn
};

// The CPU executor interprets the IR lane by lane: a case costs about (workers) x (elements a
// worker touches + per-worker reduction work). Plans far above the budget are redrawn so
// 10,000 cases stay within CI's time.
double executor_cost(const Case& c, const MappingPlan& p) {
  const int64_t programs = (c.rows + p.programs_per_group - 1) / p.programs_per_group * p.programs_per_group;
  const int64_t per_worker = (c.cols + p.elems_per_stripe() - 1) / p.elems_per_stripe() * p.vector_elems;
  const int passes = p.caching == InputCaching::registers ? 1 : 2;
  return double(programs) * double(p.row_workers()) * (double(per_worker) * (4 + passes * 6) + 400);
}

// The plan inputs of the case's call: host buffers start 16-byte aligned (operator new), so
// only the pointer offsets matter; no memory is touched.
PlanInputs inputs_of(const Case& c) {
  // Disjoint 16-byte aligned bases 1 GiB apart (no case spans more), plus the offsets.
  auto at = [](int buffer, int64_t offset, DType t) {
    return reinterpret_cast<void*>((uintptr_t(buffer) << 30) + uintptr_t(offset * dtype_size(t)));
  };
  Call call;
  call.op = c.op;
  call.x = matrix(at(1, c.offset, c.x), c.x, c.rows, c.cols, c.x_stride_or_cols());
  call.y = matrix(at(2, c.y_offset_or_x(), c.y), c.y, c.rows, c.cols, c.y_stride_or_x());
  if (c.norm() && c.weight) call.weight = {at(3, 0, c.w), c.w, c.cols};
  if (c.op == Op::layer_norm && c.bias) call.bias = {at(4, 0, c.w), c.w, c.cols};
  return bind(builtin_program(c.op), to_args(call)).plan_inputs();
}

// The device the plans are drawn for: H200-like, with clusters of up to 16 groups, so both plan
// generators draw rows split over a cluster (and the policy picks them for long rows).
const DeviceLimits kLimits = [] {
  DeviceLimits l;
  l.max_cluster_size = 16;
  return l;
}();

bool valid(const MappingPlan& p, const PlanInputs& in) {
  try {
    validate_plan(p, in, kLimits, "fuzz");
    return true;
  } catch (const Error&) {
    return false;
  }
}

// Varies the fields mapping_family leaves at the policy's choice, keeping the plan valid.
MappingPlan perturb(MappingPlan p, const PlanInputs& in, Rng& rng) {
  auto attempt = [&](auto change) {
    MappingPlan q = p;
    change(q);
    if (valid(q, in)) p = q;
  };
  attempt([&](MappingPlan& q) { q.barrier_scope = rng.chance(0.5) ? BarrierScope::program : BarrierScope::group; });
  attempt([&](MappingPlan& q) { q.tail = rng.chance(0.5) ? TailHandling::clamp : TailHandling::predicate; });
  attempt([&](MappingPlan& q) { q.alignment = rng.chance(0.5) ? Alignment::require : Alignment::scalar_fallback; });
  attempt([&](MappingPlan& q) { q.cache_format = rng.chance(0.7) ? CacheFormat::packed : CacheFormat::f32; });
  if (p.caching == InputCaching::registers && rng.chance(0.3))  // more stripes than the row needs
    attempt([&](MappingPlan& q) { q.stripes += 1 + rng.below(3); });
  if (p.caching == InputCaching::reread && rng.chance(0.3))
    attempt([&](MappingPlan& q) { q.stripe_unroll = 1 + rng.below(16); });
  if (rng.chance(0.2)) attempt([&](MappingPlan& q) { q.private_budget = q.stripes * q.vector_elems + rng.below(64); });
  if (p.caching == InputCaching::registers && p.workers_per_program % 32 == 0 && rng.chance(0.2))
    attempt([&](MappingPlan& q) {  // the row split over a cluster, its stripes shared out
      q.ctas_per_program = rng.pick({2, 3, 4, 8, 16});
      q.programs_per_group = 1;
      q.stripes = (q.stripes + q.ctas_per_program - 1) / q.ctas_per_program;
    });
  if (rng.chance(0.3)) attempt([&](MappingPlan& q) { q.resident_groups = 1 + rng.below(4); });
  attempt([&](MappingPlan& q) { q.merge = rng.chance(0.5) ? MergeStrategy::staged : MergeStrategy::combine; });
  if (rng.chance(0.3)) attempt([&](MappingPlan& q) { q.grid_limit = 1 + rng.below(8); });  // groups loop over rows
  return p;
}

// A plan with every field drawn at random, resolved by the policy where a field stays unset.
std::optional<MappingPlan> random_plan(const PlanInputs& in, Rng& rng) {
  PlanRequest r;
  if (rng.chance(0.8)) r.workers_per_program = rng.pick({1, 2, 4, 8, 16, 32, 64, 96, 128, 160, 256, 384, 512, 1024});
  if (rng.chance(0.6)) r.vector_elems = rng.pick({1, 2, 4, 8});
  if (rng.chance(0.5)) r.programs_per_group = 1 + rng.below(rng.chance(0.5) ? 4 : 32);
  if (rng.chance(0.5)) r.caching = rng.chance(0.5) ? InputCaching::reread : InputCaching::registers;
  if (rng.chance(0.3)) r.stripes = 1 + rng.below(16);
  if (rng.chance(0.4)) r.stripe_unroll = 1 + rng.below(rng.chance(0.8) ? 4 : 16);
  if (rng.chance(0.2)) r.private_budget = 1 + rng.below(128);
  if (rng.chance(0.4)) r.barrier_scope = rng.chance(0.5) ? BarrierScope::program : BarrierScope::group;
  if (rng.chance(0.4)) r.tail = rng.chance(0.5) ? TailHandling::clamp : TailHandling::predicate;
  if (rng.chance(0.4)) r.alignment = rng.chance(0.5) ? Alignment::require : Alignment::scalar_fallback;
  if (rng.chance(0.3)) r.cache_format = rng.chance(0.5) ? CacheFormat::packed : CacheFormat::f32;
  if (rng.chance(0.2)) r.resident_groups = 1 + rng.below(4);
  if (rng.chance(0.2)) r.grid_limit = rng.below(8);
  if (rng.chance(0.3)) r.merge = rng.chance(0.5) ? MergeStrategy::staged : MergeStrategy::combine;
  if (rng.chance(0.2)) {  // a cluster: mostly with the one program a group and the caching it needs
    r.ctas_per_program = rng.pick({2, 3, 4, 8, 16});
    if (rng.chance(0.8)) r.programs_per_group = 1;
    if (rng.chance(0.8)) r.caching = InputCaching::registers;
  }
  MappingPlan p = choose_plan(in, r, kLimits);
  if (!valid(p, in)) return std::nullopt;
  return p;
}

FuzzCase draw_case(uint64_t seed, uint64_t index, double budget) {
  Rng rng(mix(seed, index));
  FuzzCase f;
  Case& c = f.c;
  c.op = Op(rng.below(4));
  const DType dtypes[] = {DType::f32, DType::f16, DType::bf16};
  c.x = dtypes[rng.below(3)], c.y = dtypes[rng.below(3)], c.w = dtypes[rng.below(3)];
  c.weight = rng.chance(0.7), c.bias = rng.chance(0.6);
  // Columns 1 ... 40,000: many short rows (sub-warp programs, tails), long rows fewer.
  const int kind = rng.below(10);
  if (kind < 4) c.cols = 1 + rng.below(64);
  else if (kind < 7) c.cols = rng.log_uniform(65, 4096);
  else if (kind < 9) c.cols = rng.log_uniform(4097, 40000);
  else c.cols = std::max<int64_t>(1, (int64_t(1) << rng.below(16)) + rng.pick({-1, 0, 1}));
  const int64_t max_rows = c.cols <= 64 ? 200 : c.cols <= 1024 ? 64 : c.cols <= 8192 ? 16 : 6;
  c.rows = rng.chance(0.02) ? 0 : 1 + rng.below(int(max_rows));
  c.stride = rng.chance(0.5) ? 0 : c.cols + rng.pick({1, 2, 3, 4, 7, 8, 16, 17});
  c.offset = rng.chance(0.6) ? 0 : rng.pick({1, 2, 3, 4, 7, 8});
  if (rng.chance(0.3)) c.y_stride = c.cols + rng.below(9);
  if (rng.chance(0.3)) c.y_offset = rng.pick({0, 1, 2, 4, 8});
  if (c.norm() && rng.chance(0.5))
    c.eps = rng.pick({0.0f, 1e-12f, 1e-6f, 1e-5f, 1e-3f, 1.0f, 0x1p-149f, 0x1p-126f, 1e30f});
  c.special_values = rng.chance(0.85);
  c.seed = mix(~seed, index);
  const PlanInputs in = inputs_of(c);

  // Random valid plans: from the tuner's mapping family with the remaining fields varied,
  // with every field drawn at random, or the policy's choice.
  std::vector<MappingPlan> family;
  for (int attempt = 0; attempt < 40; ++attempt) {
    std::optional<MappingPlan> p;
    const int source = rng.below(10);
    if (source < 5) {
      if (family.empty()) family = mapping_family(in, kLimits);
      p = perturb(family[size_t(rng.below(int(family.size())))], in, rng);
      f.origin = "family";
    } else if (source < 9) {
      p = random_plan(in, rng);
      f.origin = "random";
    } else {
      p = choose_plan(in, {}, kLimits);
      f.origin = "policy";
    }
    if (p && valid(*p, in) && executor_cost(c, *p) <= budget) {
      c.plan = PlanRequest::exactly(*p);
      f.plan = choose_plan(in, c.plan, kLimits);  // as launched: the width is then exact
      return f;
    }
  }
  c.plan = PlanRequest::exactly(choose_plan(in, {}, kLimits));
  f.plan = choose_plan(in, c.plan, kLimits);
  f.origin = "policy (budget)";
  return f;
}

struct Options {
  uint64_t seed = kDefaultSeed;
  int64_t cases = 10000;
  int jobs = 0;
  Backend backend = Backend::cpu;
  bool replay = false, dump = false;
  uint64_t replay_index = 0;
  double budget = 3e7;  // executor cost per case (see executor_cost)
  std::string argv0;
};

// GPU and CPU outputs of one plan: the same IR, so they differ only by exp2.approx, rsqrtf and
// fused multiply-adds against the host's exp2, 1/sqrt and separate roundings, a few units
// roundoff per operation along the merge depth, plus one step of the output dtype (its
// subnormal step near zero) where the two fp32 values round to neighbours. LayerNorm subtracts
// the mean from x: those units count against max |x| / std (times the largest |weight|), as
// the oracle's conditioning allowance does. docs/source/numerics.md states the rule.
std::string compare_outputs(const Call& gpu, const Call& cpu, const MappingPlan& plan) {
  const int64_t rows = cpu.x.rows, cols = cpu.x.cols;
  const double depth = merge_depth(plan, cols);
  const double rel = (16 + 2 * depth) * kUnit;
  const double out_ulp = cpu.y.dtype == DType::f16 ? 0x1p-10 : cpu.y.dtype == DType::bf16 ? 0x1p-7 : 0x1p-23;
  const double out_step = cpu.y.dtype == DType::f16 ? 0x1p-24 : cpu.y.dtype == DType::bf16 ? 0x1p-133 : 0x1p-149;
  double wmax = 1;
  if (cpu.weight.data) {
    wmax = 0;
    for (int64_t c = 0; c < cols; ++c) wmax = std::max(wmax, std::abs(double(load_as_float(cpu.weight.data, c, cpu.weight.dtype))));
  }
  for (int64_t r = 0; r < rows; ++r) {
    double row_max = 0, amax = 0, sum = 0, n = 0;
    for (int64_t c = 0; c < cols; ++c) {
      double v = load_as_float(cpu.y.data, r * cpu.y.row_stride + c, cpu.y.dtype);
      if (std::isfinite(v)) row_max = std::max(row_max, std::abs(v));
      double x = load_as_float(cpu.x.data, r * cpu.x.row_stride + c, cpu.x.dtype);
      if (std::isfinite(x)) amax = std::max(amax, std::abs(x)), sum += x, n += 1;
    }
    double conditioning = 0;  // LayerNorm: max |x| / std, times the largest |weight|
    if (cpu.op == Op::layer_norm && n > 0) {
      const double mean = sum / n;
      double var = 0;
      for (int64_t c = 0; c < cols; ++c) {
        double x = load_as_float(cpu.x.data, r * cpu.x.row_stride + c, cpu.x.dtype);
        if (std::isfinite(x)) var += (x - mean) * (x - mean);
      }
      const double eps = cpu.eps ? double(*cpu.eps) : double(kLayerNormEps);
      conditioning = amax / std::sqrt(var / n + eps) * wmax;
      if (!std::isfinite(conditioning)) conditioning = 0;
    }
    for (int64_t c = 0; c < cols; ++c) {
      const double a = load_as_float(gpu.y.data, r * gpu.y.row_stride + c, gpu.y.dtype);
      const double b = load_as_float(cpu.y.data, r * cpu.y.row_stride + c, cpu.y.dtype);
      bool ok;
      double tol = 0;
      if (std::isnan(b) || std::isinf(b)) {
        ok = std::isnan(b) ? std::isnan(a) : a == b;
      } else {
        tol = rel * (std::abs(b) + row_max + conditioning) + out_ulp * std::abs(b) + out_step + 0x1p-126;
        ok = std::abs(a - b) <= tol;
      }
      if (!ok) {
        std::ostringstream os;
        os.precision(9);
        os << "GPU and CPU differ at row " << r << " col " << c << ": gpu " << a << ", cpu " << b << " (tolerance " << tol << ")";
        return os.str();
      }
    }
  }
  return "";
}

// Runs one case; returns "" or what failed.
std::string run_one(const FuzzCase& f, Backend backend, bool dump) {
  try {
    CaseResult cpu = run_case(f.c, Backend::cpu);
    std::string fail;
    if (!(cpu.record.plan == f.plan)) fail = "CPU launched plan " + cpu.record.plan.to_json();
    else if (!cpu.check.ok) fail = "CPU: " + std::to_string(cpu.check.mismatches) + " mismatches; first: " + cpu.check.first_mismatch;
    else if (!cpu.outside_untouched) fail = "CPU wrote outside the output rows";
    CaseResult gpu;
    if (fail.empty() && backend == Backend::cuda) {
      gpu = run_case(f.c, Backend::cuda);
      if (!(gpu.record.plan == f.plan)) fail = "GPU launched plan " + gpu.record.plan.to_json();
      else if (!gpu.check.ok) fail = "GPU: " + std::to_string(gpu.check.mismatches) + " mismatches; first: " + gpu.check.first_mismatch;
      else if (!gpu.outside_untouched) fail = "GPU wrote outside the output rows";
      else fail = compare_outputs(gpu.data->call, cpu.data->call, f.plan);
    }
    if (dump) {
      const CaseData& d = *cpu.data;
      std::vector<double> ref = oracle(d.call);
      for (int64_t r = 0; r < d.call.x.rows; ++r) {
        std::printf("row %lld (%s):\n", (long long)r, d.patterns.empty() ? "normal" : pattern_name(d.patterns[size_t(r)]));
        for (int64_t c = 0; c < d.call.x.cols; ++c) {
          std::printf("  [%lld] x %.9g  cpu %.9g", (long long)c, double(load_as_float(d.call.x.data, r * d.call.x.row_stride + c, d.call.x.dtype)),
                      double(load_as_float(d.call.y.data, r * d.call.y.row_stride + c, d.call.y.dtype)));
          if (gpu.data) std::printf("  gpu %.9g", double(load_as_float(gpu.data->call.y.data, r * gpu.data->call.y.row_stride + c, gpu.data->call.y.dtype)));
          std::printf("  ref %.9g\n", ref[size_t(r * d.call.x.cols + c)]);
        }
      }
    }
    return fail;
  } catch (const std::exception& e) {
    return std::string("exception: ") + e.what();
  }
}

std::string describe(const FuzzCase& f) { return f.c.name() + ", plan " + f.plan.to_json() + " (" + f.origin + ")"; }

std::string replay_command(const Options& o, uint64_t index) {
  return o.argv0 + " --replay " + std::to_string(o.seed) + ":" + std::to_string(index) +
         (o.backend == Backend::cuda ? " --backend cuda" : "");
}

#if TILE_WITH_CUDA
// GPU mode compiles every distinct kernel first, on all host threads (NVRTC dominates).
void precompile(const std::vector<FuzzCase>& cases, int jobs) {
  const std::string arch = cuda::arch_name(cuda::device_info(0));
  std::vector<std::string> sources;
  {
    std::map<std::string, bool> seen;
    for (const FuzzCase& f : cases) {
      CaseData d(f.c);
      std::string src = source_for(d.call, f.c.plan);
      if (!seen.count(src)) seen[src] = true, sources.push_back(std::move(src));
    }
  }
  std::atomic<size_t> next{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < jobs; ++t)
    threads.emplace_back([&] {
      for (size_t i; (i = next++) < sources.size();) cuda::compile_cubin(sources[i], arch);
    });
  for (std::thread& t : threads) t.join();
  std::printf("fuzz: %zu distinct kernels compiled\n", sources.size());
}

bool gpu_available() { return cuda::driver_available(); }
#else
void precompile(const std::vector<FuzzCase>&, int) {}
bool gpu_available() { return false; }
#endif

int fuzz(const Options& o) {
  const auto start = std::chrono::steady_clock::now();
  if (o.backend == Backend::cuda && !gpu_available()) {
    std::printf("[  SKIPPED ] no CUDA driver (or a build without CUDA): the GPU fuzz needs a GPU\n");
    return 0;
  }
  std::vector<FuzzCase> cases;
  for (int64_t i = 0; i < o.cases; ++i) cases.push_back(draw_case(o.seed, uint64_t(i), o.budget));
  if (o.backend == Backend::cuda) precompile(cases, o.jobs);

  std::atomic<int64_t> next{0}, failures{0};
  std::mutex mutex;
  std::map<std::string, int> tally;  // op, caching, pattern counts for the log
  auto work = [&] {
    for (int64_t i; (i = next++) < o.cases && failures < 10;) {
      const FuzzCase& f = cases[size_t(i)];
      std::string fail = run_one(f, o.backend, false);
      std::lock_guard<std::mutex> lock(mutex);
      const MappingPlan& p = f.plan;
      ++tally[op_name(f.c.op)], ++tally[to_string(p.caching)], ++tally["plan from " + f.origin];
      ++tally[f.c.cols <= 64 ? "cols 1-64" : f.c.cols <= 4096 ? "cols 65-4096" : "cols 4097-40000"];
      if (p.workers_per_program < 32) ++tally["sub-warp"];
      if (p.programs_per_group > 1) ++tally["packed programs"];
      if (p.barrier_scope == BarrierScope::program) ++tally["program barriers"];
      if (p.tail == TailHandling::clamp) ++tally["clamp tail"];
      if (p.alignment == Alignment::require) ++tally["whole vectors"];
      if (p.cache_format == CacheFormat::packed) ++tally["packed cache"];
      if (p.merge == MergeStrategy::staged) ++tally["staged merges"];
      if (p.grid_limit > 0) ++tally["row-block loops"];
      if (p.ctas_per_program > 1) ++tally["cluster programs"];
      if (f.c.special_values) ++tally["special values"];
      if (!fail.empty()) {
        ++failures;
        std::printf("FAIL seed %llu case %lld: %s\n  %s\n  replay: %s\n", (unsigned long long)o.seed, (long long)i,
                    describe(f).c_str(), fail.c_str(), replay_command(o, uint64_t(i)).c_str());
        std::fflush(stdout);
      }
    }
  };
  // The GPU runs one case at a time (one context, default stream); the CPU on every job.
  const int threads = o.backend == Backend::cuda ? 1 : o.jobs;
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) pool.emplace_back(work);
  for (std::thread& t : pool) t.join();

  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::string counts;
  for (auto& [k, v] : tally) counts += (counts.empty() ? "" : ", ") + k + " " + std::to_string(v);
  std::printf("fuzz: seed %llu, backend %s, %lld cases run, %lld failed, %.1f s (%s)\n", (unsigned long long)o.seed,
              o.backend == Backend::cuda ? "cuda (each also on the CPU executor)" : "cpu", (long long)std::min<int64_t>(next, o.cases),
              (long long)failures.load(), seconds, counts.c_str());
  return failures ? 1 : 0;
}

int replay(const Options& o) {
  FuzzCase f = draw_case(o.seed, o.replay_index, o.budget);
  std::printf("case %llu:%llu: %s\n", (unsigned long long)o.seed, (unsigned long long)o.replay_index, describe(f).c_str());
  if (o.backend == Backend::cuda && !gpu_available()) std::printf("no CUDA driver: replaying on the CPU backend only\n");
  const Backend backend = o.backend == Backend::cuda && gpu_available() ? Backend::cuda : Backend::cpu;
  std::string fail = run_one(f, backend, o.dump);
  std::printf("%s\n", fail.empty() ? "passed" : ("FAIL: " + fail).c_str());
  return fail.empty() ? 0 : 1;
}

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr,
               "fuzz_main: %s\nusage: fuzz_main [--cases N] [--seed S] [--jobs J] [--backend cpu|cuda] "
               "[--budget COST]\n       fuzz_main --replay SEED:CASE [--backend cpu|cuda] [--dump]\n",
               why.c_str());
  std::exit(2);
}

uint64_t parse_u64(const std::string& flag, const std::string& v) {
  size_t used = 0;
  unsigned long long n = 0;
  try {
    n = std::stoull(v, &used);
  } catch (const std::exception&) {
  }
  if (v.empty() || used != v.size() || v[0] == '-') usage(flag + ": expected a non-negative integer, got '" + v + "'");
  return n;
}

}  // namespace
}  // namespace tile::testing

int main(int argc, char** argv) {
  using namespace tile::testing;
  Options o;
  o.argv0 = argv[0];
  if (const char* s = std::getenv("TILE_FUZZ_SEED"); s && *s) o.seed = parse_u64("TILE_FUZZ_SEED", s);
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(a + " needs a value");
      return argv[++i];
    };
    if (a == "--cases") o.cases = int64_t(parse_u64(a, value()));
    else if (a == "--seed") o.seed = parse_u64(a, value());
    else if (a == "--jobs") o.jobs = int(parse_u64(a, value()));
    else if (a == "--budget") o.budget = double(parse_u64(a, value()));
    else if (a == "--dump") o.dump = true;
    else if (a == "--backend") {
      std::string b = value();
      if (b != "cpu" && b != "cuda") usage("--backend: expected cpu or cuda, got '" + b + "'");
      o.backend = b == "cuda" ? tile::Backend::cuda : tile::Backend::cpu;
    } else if (a == "--replay") {
      std::string v = value();
      size_t colon = v.find(':');
      if (colon == std::string::npos) usage("--replay: expected SEED:CASE, got '" + v + "'");
      o.seed = parse_u64(a, v.substr(0, colon));
      o.replay_index = parse_u64(a, v.substr(colon + 1));
      o.replay = true;
    } else if (a == "--help" || a == "-h") {
      std::printf("fuzz_main: the seeded fuzz of Tile's operators and plans (docs/source/numerics.md)\n");
      return 0;
    } else {
      usage("unknown argument '" + a + "'");
    }
  }
  if (o.jobs <= 0) o.jobs = int(std::max(1u, std::thread::hardware_concurrency()));
  return o.replay ? replay(o) : fuzz(o);
}
