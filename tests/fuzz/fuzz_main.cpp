// The seeded fuzz: random calls (operator, dtypes, shapes, strides, offsets, weights, eps,
// special values) under random valid plans from the whole mapping family, each checked
// against the float64 oracle with its output poisoned and its guard band watched. One case in
// five calls a training operator (include/tile/training.hpp) instead, checked against the
// float64 references of tests/support/training_cases.hpp.
//
//   fuzz_main [--cases N] [--seed S] [--jobs J]        CPU backend (CTest: fuzz.cpu)
//   fuzz_main --backend cuda [--cases N] [--seed S]    GPU, also compared with the CPU executor
//   fuzz_main ... --verbose                            names each case before it runs
//   fuzz_main --replay S:I [--backend cuda] [--dump]   one case, verbosely (--dump: a forward case's elements)
//   fuzz_main --compile-only sm_90 [--cases N]         the GPU fuzz's NVRTC compiles alone (no GPU needed)
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
#include <tuple>

#include "bind/bind.hpp"
#include "support/cases.hpp"
#include "support/training_cases.hpp"
#if TILE_WITH_CUDA
#include "backend/cuda/jit_module.hpp"
#endif

namespace tile::testing {
namespace {

constexpr uint64_t kDefaultSeed = 20261130;
constexpr double kUnit = 0x1p-24;

// The arithmetic's unit roundoff and an output dtype's ulp, subnormal step and smallest normal:
// a float64 call computes in fp64, the others in fp32.
struct Precision {
  double unit, out_ulp, out_step, normal;
};
Precision precision_of(DType out) {
  if (out == DType::f64) return {0x1p-53, 0x1p-52, 0x1p-1074, 0x1p-1022};
  return {kUnit, out == DType::f16 ? 0x1p-10 : out == DType::bf16 ? 0x1p-7 : 0x1p-23,
          out == DType::f16 ? 0x1p-24 : out == DType::bf16 ? 0x1p-133 : 0x1p-149, 0x1p-126};
}

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
  const int passes = p.caching == InputCaching::reread ? 2 : 1;
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
  if (rng.chance(0.3)) attempt([&](MappingPlan& q) { q.row_head = RowHead::peel; });
  if (p.caching != InputCaching::reread && rng.chance(0.3))  // more stripes than the row needs
    attempt([&](MappingPlan& q) { q.stripes += 1 + rng.below(3); });
  if (p.caching == InputCaching::reread && rng.chance(0.3))
    attempt([&](MappingPlan& q) { q.stripe_unroll = 1 + rng.below(16); });
  if (rng.chance(0.2)) attempt([&](MappingPlan& q) { q.private_budget = q.stripes * q.vector_elems + rng.below(64); });
  if (p.workers_per_program % 32 == 0 && rng.chance(0.2))
    attempt([&](MappingPlan& q) {  // the row split over a cluster, its stripes (or passes) shared out
      q.ctas_per_program = rng.pick({2, 3, 4, 8, 16});
      q.programs_per_group = 1;
      q.stripes = (q.stripes + q.ctas_per_program - 1) / q.ctas_per_program;
    });
  if (rng.chance(0.2))  // the row staged in shared memory instead
    attempt([&](MappingPlan& q) {
      q.caching = q.caching == InputCaching::shared ? InputCaching::registers : InputCaching::shared;
    });
  if (rng.chance(0.3)) attempt([&](MappingPlan& q) { q.resident_groups = 1 + rng.below(4); });
  attempt([&](MappingPlan& q) { q.merge = rng.chance(0.5) ? MergeStrategy::staged : MergeStrategy::combine; });
  if (rng.chance(0.3)) attempt([&](MappingPlan& q) { q.column_loads = ColumnLoads::with_row; });
  if (rng.chance(0.3)) attempt([&](MappingPlan& q) { q.grid_limit = 1 + rng.below(8); });  // groups loop over rows
  if (rng.chance(0.4)) attempt([&](MappingPlan& q) { q.column_loads = ColumnLoads::once; });  // valid where they loop
  if (rng.chance(0.5))  // valid where they loop over cached rows, or re-read
    attempt([&](MappingPlan& q) { q.row_prefetch = rng.chance(0.7) ? RowPrefetch::next : RowPrefetch::none; });
  return p;
}

// A plan with every field drawn at random, resolved by the policy where a field stays unset.
std::optional<MappingPlan> random_plan(const PlanInputs& in, Rng& rng) {
  PlanRequest r;
  if (rng.chance(0.8)) r.workers_per_program = rng.pick({1, 2, 4, 8, 16, 32, 64, 96, 128, 160, 256, 384, 512, 1024});
  if (rng.chance(0.6)) r.vector_elems = rng.pick({1, 2, 4, 8});
  if (rng.chance(0.5)) r.programs_per_group = 1 + rng.below(rng.chance(0.5) ? 4 : 32);
  if (rng.chance(0.5)) r.caching = InputCaching(rng.below(3));
  if (rng.chance(0.3)) r.stripes = 1 + rng.below(16);
  if (rng.chance(0.4)) r.stripe_unroll = 1 + rng.below(rng.chance(0.8) ? 4 : 16);
  if (rng.chance(0.2)) r.private_budget = 1 + rng.below(128);
  if (rng.chance(0.4)) r.barrier_scope = rng.chance(0.5) ? BarrierScope::program : BarrierScope::group;
  if (rng.chance(0.4)) r.tail = rng.chance(0.5) ? TailHandling::clamp : TailHandling::predicate;
  if (rng.chance(0.4)) r.alignment = rng.chance(0.5) ? Alignment::require : Alignment::scalar_fallback;
  if (rng.chance(0.3)) r.cache_format = rng.chance(0.5) ? CacheFormat::packed : CacheFormat::f32;
  if (rng.chance(0.25)) r.row_head = RowHead::peel;  // vectors from the bases' alignment, whatever the strides
  if (rng.chance(0.2)) r.resident_groups = 1 + rng.below(4);
  if (rng.chance(0.2)) r.grid_limit = rng.below(8);
  if (rng.chance(0.3)) r.merge = rng.chance(0.5) ? MergeStrategy::staged : MergeStrategy::combine;
  if (rng.chance(0.2)) r.column_loads = ColumnLoads(rng.below(3));
  if (rng.chance(0.2)) r.row_prefetch = RowPrefetch(rng.below(2));
  if (rng.chance(0.2)) {  // a cluster: mostly with the one program a group it needs
    r.ctas_per_program = rng.pick({2, 3, 4, 8, 16});
    if (rng.chance(0.8)) r.programs_per_group = 1;
    if (rng.chance(0.8)) r.caching = InputCaching(rng.below(3));
  }
  MappingPlan p = choose_plan(in, r, kLimits);
  if (!valid(p, in)) return std::nullopt;
  return p;
}

// One draw of a plan for `in`: half the time a perturbed plan of the tuner's mapping family
// (computed into `family` on first use), 40 % a plan with every field drawn at random, else the
// policy's; `origin` names which.
std::optional<MappingPlan> draw_plan(const PlanInputs& in, Rng& rng, std::vector<MappingPlan>& family,
                                     std::string& origin) {
  const int source = rng.below(10);
  if (source < 5) {
    if (family.empty()) family = mapping_family(in, kLimits);
    origin = "family";
    return perturb(family[size_t(rng.below(int(family.size())))], in, rng);
  }
  if (source < 9) {
    origin = "random";
    return random_plan(in, rng);
  }
  origin = "policy";
  return choose_plan(in, {}, kLimits);
}

// One case in ten is a float64 call (every float operand f64), decided by a stream of its own
// so the other draws stay as they were.
bool float64_call(uint64_t seed, uint64_t index) { return Rng(mix(seed ^ 0x663634ull, index)).chance(0.1); }

FuzzCase draw_case(uint64_t seed, uint64_t index, double budget) {
  Rng rng(mix(seed, index));
  FuzzCase f;
  Case& c = f.c;
  c.op = Op(rng.below(4));
  const DType dtypes[] = {DType::f32, DType::f16, DType::bf16};
  c.x = dtypes[rng.below(3)], c.y = dtypes[rng.below(3)], c.w = dtypes[rng.below(3)];
  if (float64_call(seed, index)) c.x = c.y = c.w = DType::f64;
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
    const std::optional<MappingPlan> p = draw_plan(in, rng, family, f.origin);
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

// ---- training operators ----
//
// A training case is a TrainCase of tests/support/training_cases.hpp (its float64 references,
// seeded inputs, poisoned outputs) with drawn shapes, dtypes, options and plan, plus two forward
// calls that also write their statistics: rms_norm with rstd, layer_norm with mean and rstd.
enum class TrainKind : uint8_t { rms_norm_stats = uint8_t(TrainOp::cross_entropy_fused) + 1, layer_norm_stats };
constexpr int kTrainKinds = int(TrainKind::layer_norm_stats) + 1;

const char* train_kind_name(int kind) {
  if (kind == int(TrainKind::rms_norm_stats)) return "rms_norm with rstd";
  if (kind == int(TrainKind::layer_norm_stats)) return "layer_norm with mean/rstd";
  return train_op_name(TrainOp(kind));
}

struct TrainFuzz {
  int kind = 0;
  TrainCase c;  // c.op is meaningful for kind < rms_norm_stats
  bool mean_out = true, rstd_out = true;  // layer_norm (mean, rstd): which statistics are written
  bool repeat = false;                    // run twice: the reductions over rows must be bitwise equal
};

// The program and operands of a training call, bound like its entry point binds them
// (src/api/training.cpp) with the buffers at disjoint 16-byte aligned bases plus the case's
// offsets; no memory is touched. `count_pass`: the small counting pass cross_entropy_fused runs
// first for a mean.
std::pair<const RowProgram*, Args> train_call(const TrainFuzz& t, bool count_pass = false) {
  const TrainCase& c = t.c;
  const int64_t R = c.rows, C = c.cols, S = c.cols + c.pad;
  int next = 1;
  std::map<std::string, int> base;
  auto at = [&](const std::string& name, int64_t offset, DType d) {
    if (!base.count(name)) base[name] = next++;
    return reinterpret_cast<void*>((uintptr_t(base[name]) << 30) + uintptr_t(offset * dtype_size(d)));
  };
  const DType stat = c.in == DType::f64 ? DType::f64 : DType::f32;  // statistics of a float64 call: f64
  auto mat = [&](const std::string& name, DType d) { return TensorView{at(name, c.offset, d), d, R, C, S}; };
  auto vec = [&](const std::string& name, DType d, int64_t n, int64_t stride = 1) {
    return VectorView{at(name, 0, d), d, n, stride};
  };
  const auto io = [&](const char* out, const char* in) { return c.in_place ? in : out; };
  Args a;
  const RowProgram* program = nullptr;
  if (t.kind == int(TrainKind::rms_norm_stats) || t.kind == int(TrainKind::layer_norm_stats)) {
    const bool ln = t.kind == int(TrainKind::layer_norm_stats);
    a.set("x", mat("x", c.in)).set("y", mat("y", c.out)).set("eps", ln ? 1e-5 : 1e-6);
    if (c.weight) a.set("weight", vec("weight", c.w, C));
    if (ln && c.second) a.set("bias", vec("bias", c.w, C));
    if (ln && t.mean_out) a.set("mean", vec("mean", stat, R));
    if (t.rstd_out) a.set("rstd", vec("rstd", stat, R));
    program = &builtin_program(ln ? Op::layer_norm : Op::rms_norm);
    return {program, a};
  }
  switch (c.op) {
    case TrainOp::softmax_backward:
    case TrainOp::log_softmax_backward:
      a.set("y", mat("y", c.in)).set("dy", mat("dy", c.in)).set("dx", mat(io("dx", "dy"), c.in_place ? c.in : c.out));
      break;
    case TrainOp::rms_norm_backward:
    case TrainOp::layer_norm_backward: {
      const bool ln = c.op == TrainOp::layer_norm_backward;
      a.set("dy", mat("dy", c.in)).set("x", mat("x", c.in)).set("dx", mat(io("dx", "dy"), c.in_place ? c.in : c.out));
      a.set("rstd", vec("rstd", stat, R));
      if (ln) a.set("mean", vec("mean", stat, R));
      if (c.weight) a.set("weight", vec("weight", c.w, C)).set("dweight", vec("dweight", c.w, C));
      if (ln && c.second) a.set("dbias", vec("dbias", c.w, C));
      break;
    }
    case TrainOp::fused_add_rms_norm:
      a.set("x", mat("x", c.in)).set("residual", mat("residual", c.res));
      a.set("y", mat(io("y", "x"), c.in_place ? c.in : c.out)).set("residual_out", mat(io("residual_out", "residual"), c.res));
      a.set("eps", 1e-6).set("rstd", vec("rstd", stat, R));
      if (c.weight) a.set("weight", vec("weight", c.w, C));
      break;
    case TrainOp::fused_add_rms_norm_backward:
      a.set("dy", mat("dy", c.in)).set("residual_out", mat("residual_out", c.res));
      a.set("dx", mat(io("dx", "dy"), c.in_place ? c.in : c.out)).set("rstd", vec("rstd", stat, R));
      if (c.second) a.set("dresidual_out", mat("dresidual_out", c.res)).set("dresidual", mat(io("dresidual", "dresidual_out"), c.res));
      if (c.weight) a.set("weight", vec("weight", c.w, C)).set("dweight", vec("dweight", c.w, C));
      break;
    case TrainOp::cross_entropy:
    case TrainOp::cross_entropy_backward:
    case TrainOp::cross_entropy_fused: {
      const CrossEntropyOptions& ce = c.ce;
      const bool none = ce.reduction == Reduction::none;
      a.set("logits", mat("logits", c.in)).set("target", vec("target", c.target, R));
      a.set("ignore_index", double(ce.ignore_index)).set("z_loss", ce.z_loss);
      if (ce.label_smoothing != 0.0) a.set("label_smoothing", ce.label_smoothing);
      if (ce.softcap) a.set("softcap", *ce.softcap);
      CrossEntropyPass pass = c.op == TrainOp::cross_entropy ? CrossEntropyPass::forward
                              : c.op == TrainOp::cross_entropy_fused ? CrossEntropyPass::fused
                                                                     : CrossEntropyPass::backward;
      if (count_pass) {
        a.set("count", vec("count", stat, 1));
        pass = CrossEntropyPass::forward;
      } else {
        if (c.op != TrainOp::cross_entropy_backward) {
          const char* loss = none ? "loss" : ce.reduction == Reduction::sum ? "loss_sum" : "loss_mean";
          a.set(loss, vec("loss", stat, none ? R : 1)).set("lse", vec("lse_out", stat, R));
        } else {
          a.set("lse", vec("lse", stat, R));
        }
        if (c.op != TrainOp::cross_entropy)
          a.set("dlogits", mat(io("dlogits", "logits"), c.in_place ? c.in : c.out));
        if (c.op != TrainOp::cross_entropy && c.second) a.set("dloss", vec("dloss", c.w, R, none ? 1 : 0));
        if (c.op == TrainOp::cross_entropy) a.set("count", vec("count", stat, 1));
        else if (ce.reduction == Reduction::mean) a.set("count", vec("count", stat, R, 0));
      }
      program = &cross_entropy_program(pass, ce.label_smoothing != 0.0, ce.softcap.has_value());
      return {program, a};
    }
  }
  program = &training_program(train_op_name(c.op));
  return {program, a};
}

PlanInputs train_inputs(const TrainFuzz& t, bool count_pass = false) {
  const auto [program, args] = train_call(t, count_pass);
  return bind(*program, args).plan_inputs();
}

// rms_norm with rstd, layer_norm with mean and rstd, against float64 values built from the
// statistics helpers of training_cases.hpp; same inputs, comparison and guard bands.
TrainResult run_stats_case(const TrainFuzz& t, Backend backend) {
  using namespace detail;
  const TrainCase& c = t.c;
  const bool ln = t.kind == int(TrainKind::layer_norm_stats);
  const double eps = double(float(ln ? 1e-5 : 1e-6));  // as the entry points below pass it (fp32)
  std::mt19937_64 rng(c.seed);
  Env env(backend);
  const int64_t R = c.rows, C = c.cols;
  env.add("x", random_matrix(rng, c.in, c, 0.5, 2));
  if (c.special && R > 1)
    for (int64_t k = 0; k < C; ++k) env["x"].set(1, k, ln ? 3.0 : 0.0);  // a constant row, a zero row
  if (c.special && R > 2 && c.in != DType::f16)
    for (int64_t k = 0; k < C; ++k) env["x"].set(2, k, env["x"].at(2, k) * 1e30);  // huge values
  if (c.special && R > 3) {  // subnormal values of x's dtype: x^2 underflows in fp32, eps decides
    const double tiny = c.in == DType::f16 ? 0x1p-20 : 0x1p-130;
    for (int64_t k = 0; k < C; ++k) env["x"].set(3, k, env["x"].at(3, k) * tiny);
  }
  if (c.special && R > 4) env["x"].set(4, C / 2, kNaN);  // one NaN: its whole row and statistics
  if (c.weight) env.add("weight", random_vector(rng, c.w, C, 1, 0.5));
  if (ln && c.second) env.add("bias", random_vector(rng, c.w, C, 0, 1));
  env.add("y", output_matrix(c.out, c));
  const DType stat = c.in == DType::f64 ? DType::f64 : DType::f32;
  if (ln && t.mean_out) env.add("mean", Buf::vector(stat, R));
  if (t.rstd_out) env.add("rstd", Buf::vector(stat, R));
  Expectations want;
  Expected& y = want["y"];
  Expected mean, rstd;
  for (int64_t r = 0; r < R; ++r) {
    const std::vector<double> h = row_of(env["x"], r);
    double mu = 0, rs;
    if (ln) std::tie(mu, rs) = ln_stats(h, eps);
    else rs = rms_rstd(h, eps);
    double abs_mean = 0;
    for (double v : h) abs_mean += std::abs(v) / double(C);
    mean.want.push_back(mu), mean.mag.push_back(abs_mean);
    // The variance of a row far from zero mean loses bits to the mean's rounding.
    rstd.want.push_back(rs), rstd.mag.push_back(rs * (1 + (ln ? mu * mu * rs * rs : 0.0)));
    for (int64_t k = 0; k < C; ++k) {
      const double wk = c.weight ? env["weight"].at(k) : 1.0, bk = ln && c.second ? env["bias"].at(k) : 0.0;
      y.want.push_back((h[size_t(k)] - mu) * rs * wk + bk);
      y.mag.push_back((std::abs(h[size_t(k)]) + std::abs(mu)) * rs * std::abs(wk) * (1 + (ln ? mu * mu * rs * rs : 0.0)) + std::abs(bk));
    }
  }
  std::vector<std::string> outputs = {"y"};
  if (ln && t.mean_out) want["mean"] = mean, outputs.push_back("mean");
  if (t.rstd_out) want["rstd"] = rstd, outputs.push_back("rstd");
  env.upload();
  const CallOptions opts{c.plan, nullptr, backend};
  if (ln)
    layer_norm(env.mat("x"), env.mat("y"), env.vec("weight"), env.vec("bias"), env.vec("mean"), env.vec("rstd"),
               float(eps), opts);
  else
    rms_norm(env.mat("x"), env.mat("y"), env.vec("weight"), env.vec("rstd"), float(eps), opts);
  env.download();
  return train_result(env, want, outputs, R);
}

TrainResult run_train(const TrainFuzz& t, Backend backend) {
  return t.kind >= int(TrainKind::rms_norm_stats) ? run_stats_case(t, backend) : run_train_case(t.c, backend);
}

// The outputs reduced over the rows: fp32 partials folded in a fixed order.
bool reduced_over_rows(const std::string& name) { return name == "dweight" || name == "dbias" || name == "loss"; }

// The executor's cost of a training call: executor_cost's estimate for the row loop, times 3
// (the backward programs read two or three row operands and sweep the row twice or more).
double train_cost(const TrainCase& c, const MappingPlan& p) {
  Case shape;
  shape.rows = c.rows, shape.cols = c.cols;
  return 3 * executor_cost(shape, p);
}

TrainFuzz draw_train(uint64_t seed, uint64_t index, double budget, std::string& origin, MappingPlan& plan) {
  Rng rng(mix(seed ^ 0x747261696e696e67ull, index));  // a stream of its own ("training")
  TrainFuzz t;
  TrainCase& c = t.c;
  t.kind = rng.below(kTrainKinds);
  if (t.kind < int(TrainKind::rms_norm_stats)) c.op = TrainOp(t.kind);
  const DType dtypes[] = {DType::f32, DType::f16, DType::bf16};
  c.in = dtypes[rng.below(3)], c.out = dtypes[rng.below(3)], c.w = dtypes[rng.below(3)], c.res = dtypes[rng.below(3)];
  if (rng.chance(0.3) && c.in != DType::f32) c.res = DType::f32;  // fp32 residual (or dresidual) with 16-bit x
  if (float64_call(seed ^ 0x747261696e696e67ull, index)) c.in = c.out = c.w = c.res = DType::f64;
  c.target = rng.chance(0.5) ? DType::i32 : DType::i64;
  // Columns 1 ... 70,000 (vocabularies for cross-entropy), mostly short.
  const int kind = rng.below(10);
  if (kind < 4) c.cols = 1 + rng.below(64);
  else if (kind < 7) c.cols = rng.log_uniform(65, 4096);
  else if (kind < 9) c.cols = rng.log_uniform(4097, 70000);
  else c.cols = std::max<int64_t>(1, (int64_t(1) << rng.below(17)) + rng.pick({-1, 0, 1}));
  const int64_t max_rows = c.cols <= 64 ? 64 : c.cols <= 1024 ? 24 : c.cols <= 8192 ? 8 : 3;
  c.rows = rng.chance(0.03) ? 0 : rng.chance(0.1) ? 1 : 1 + rng.below(int(max_rows));
  c.pad = rng.chance(0.5) ? 0 : rng.pick({1, 2, 3, 4, 7, 8, 16, 17});
  c.offset = rng.chance(0.6) ? 0 : rng.pick({1, 2, 3, 4, 7, 8});
  c.weight = rng.chance(0.7), c.second = rng.chance(0.7);
  c.in_place = rng.chance(0.25) && c.op != TrainOp::cross_entropy && t.kind < int(TrainKind::rms_norm_stats);
  c.special = rng.chance(0.85);  // the forward fuzz's rate; the patterns are the case builder's
  CrossEntropyOptions& ce = c.ce;
  ce.reduction = Reduction(rng.below(3));
  if (rng.chance(0.3)) ce.label_smoothing = rng.pick({0.05, 0.1, 0.5, 1.0});
  if (rng.chance(0.3)) ce.z_loss = rng.pick({1e-4, 1e-3, 0.1});
  if (rng.chance(0.3)) ce.softcap = rng.pick({1.0, 15.0, 30.0});
  if (rng.chance(0.2)) ce.ignore_index = rng.pick<int64_t>({0, c.cols - 1, rng.below(int(c.cols)), -1});
  if (t.kind == int(TrainKind::layer_norm_stats)) {
    t.mean_out = rng.chance(0.7);
    t.rstd_out = !t.mean_out || rng.chance(0.7);
  }
  const bool reduces = c.weight || (c.op >= TrainOp::cross_entropy && ce.reduction != Reduction::none);
  t.repeat = reduces && t.kind < int(TrainKind::rms_norm_stats) && rng.chance(0.05);
  c.seed = mix(~seed ^ 0x747261696e696e67ull, index);

  // Random valid plans, as for the forward cases; cross_entropy_fused with a mean launches its
  // counting pass with the same plan, so the plan must be valid for both.
  const PlanInputs in = train_inputs(t);
  const bool count_pass = c.op == TrainOp::cross_entropy_fused && ce.reduction == Reduction::mean &&
                          t.kind < int(TrainKind::rms_norm_stats);
  const std::optional<PlanInputs> in2 = count_pass ? std::optional<PlanInputs>(train_inputs(t, true)) : std::nullopt;
  std::vector<MappingPlan> family;
  for (int attempt = 0; attempt < 40; ++attempt) {
    const std::optional<MappingPlan> p = draw_plan(in, rng, family, origin);
    if (p && valid(*p, in) && (!in2 || valid(*p, *in2)) && train_cost(c, *p) <= budget) {
      c.plan = PlanRequest::exactly(*p);
      plan = *p;
      return t;
    }
  }
  c.plan = {};  // the policy's plan for each pass
  plan = choose_plan(in, {}, kLimits);
  origin = "policy (budget)";
  return t;
}

std::string describe_train(const TrainFuzz& t) {
  std::string s = t.c.name();
  if (t.kind >= int(TrainKind::rms_norm_stats)) {
    s = std::string(train_kind_name(t.kind)) + s.substr(s.find(' '));
    if (t.kind == int(TrainKind::layer_norm_stats))
      s += std::string(t.mean_out ? " mean" : "") + (t.rstd_out ? " rstd" : "");
  }
  return s + (t.repeat ? " repeat" : "");
}

// GPU and CPU outputs of a training call under the forward rule (compare_outputs): a few units
// roundoff per operation along the merge depth, relative to the value and to its row's largest
// value, plus one step of the output dtype. Values reduced over the rows (dweight, dbias, a
// summed loss) fold fp32 partials in the same order on both: their depth grows by the rows,
// and their scale is the largest value of the vector times the rows. A result computed by
// cancellation (a norm's backward at one column: 1 - x^2 rstd^2) also gets the float64 rule's
// allowance for it, twice (each side is within it of the float64 value): there the GPU's
// rsqrt and the executor's differ by an ulp that the cancellation amplifies.
std::string compare_train_outputs(const TrainResult& gpu, const TrainResult& cpu, const TrainFuzz& t,
                                  const MappingPlan& plan) {
  const int64_t R = t.c.rows;
  double row_bits = 0;
  for (int64_t n = R; n > 1; n = (n + 1) / 2) ++row_bits;
  for (const auto& [name, b] : cpu.buffers) {
    const Buf& a = gpu.buffers.at(name);
    const bool across = reduced_over_rows(name) && !(name == "loss" && t.c.ce.reduction == Reduction::none);
    const double depth = merge_depth(plan, t.c.cols) + (across ? double(R) : 0.0);
    const Precision pr = precision_of(b.dtype);
    const double rel = (16 + 2 * depth) * pr.unit;
    const double out_ulp = pr.out_ulp, out_step = pr.out_step;
    const int64_t lines = b.is_matrix() ? b.rows : 1, width = b.is_matrix() ? b.cols : b.rows;
    for (int64_t r = 0; r < lines; ++r) {
      auto value = [&](const Buf& buf, int64_t k) { return buf.is_matrix() ? buf.at(r, k) : buf.at(k); };
      double scale = 0;  // a per-row vector (rstd, mean, lse, a loss per row) is its own scale
      if (b.is_matrix() || across)
        for (int64_t k = 0; k < width; ++k)
          if (std::isfinite(value(b, k))) scale = std::max(scale, std::abs(value(b, k)));
      if (across) scale *= 1 + double(R);
      for (int64_t k = 0; k < width; ++k) {
        const double x = value(a, k), y = value(b, k);
        double tol = 0;
        bool ok;
        if (std::isnan(y) || std::isinf(y)) {
          ok = std::isnan(y) ? std::isnan(x) : x == y;
        } else {
          tol = rel * (std::abs(y) + scale) + out_ulp * std::abs(y) + out_step + pr.normal;
          if (auto m = cpu.magnitudes.find(name); m != cpu.magnitudes.end() && size_t(r * width + k) < m->second.size())
            tol += 2 * (256 + double(R)) * pr.unit * m->second[size_t(r * width + k)];
          ok = std::abs(x - y) <= tol;
        }
        if (!ok) {
          std::ostringstream os;
          os.precision(9);
          os << "GPU and CPU differ in " << name << " at " << (b.is_matrix() ? "row " + std::to_string(r) + " col " : "")
             << k << ": gpu " << x << ", cpu " << y << " (tolerance " << tol << ")";
          return os.str();
        }
      }
    }
  }
  return "";
}

// Runs one training case; returns "" or what failed.
std::string run_train_one(const TrainFuzz& t, const MappingPlan& plan, Backend backend) {
  try {
    auto check = [](const char* where, const TrainResult& r, int64_t rows) -> std::string {
      if (!r.cmp.ok)
        return std::string(where) + ": " + std::to_string(r.cmp.mismatches) + " of " + std::to_string(r.cmp.checked) +
               " values off; first: " + r.cmp.first;
      if (rows > 0 && r.cmp.checked < rows) return std::string(where) + ": fewer values checked than rows";
      if (!r.outside_untouched) return std::string(where) + " wrote outside an output's view";
      return "";
    };
    const TrainResult cpu = run_train(t, Backend::cpu);
    std::string fail = check("CPU", cpu, t.c.rows);
    if (fail.empty() && t.repeat) {  // weight gradients and reduced losses: bitwise equal on a rerun
      const TrainResult again = run_train(t, Backend::cpu);
      for (const auto& [name, bytes] : cpu.outputs)
        if (reduced_over_rows(name) && again.outputs.at(name) != bytes) fail = "CPU: " + name + " differs bitwise on a rerun";
    }
    if (fail.empty() && backend == Backend::cuda) {
      const TrainResult gpu = run_train(t, Backend::cuda);
      fail = check("GPU", gpu, t.c.rows);
      if (fail.empty() && t.repeat) {
        const TrainResult again = run_train(t, Backend::cuda);
        for (const auto& [name, bytes] : gpu.outputs)
          if (reduced_over_rows(name) && again.outputs.at(name) != bytes) fail = "GPU: " + name + " differs bitwise on a rerun";
      }
      if (fail.empty()) fail = compare_train_outputs(gpu, cpu, t, plan);
    }
    return fail;
  } catch (const std::exception& e) {
    return std::string("exception: ") + e.what();
  }
}

// Case I of seed S is a training case with probability kTrainShare, drawn from a stream of its
// own; the others are the forward cases they always were at the same (S, I).
constexpr double kTrainShare = 0.2;

struct Drawn {
  bool training = false;
  FuzzCase f;   // forward
  TrainFuzz t;  // training; its plan and origin in f.plan, f.origin
};

Drawn draw(uint64_t seed, uint64_t index, double budget) {
  Drawn d;
  d.training = Rng(mix(seed ^ 0x73706c6974ull, index)).chance(kTrainShare);
  if (d.training) d.t = draw_train(seed, index, budget, d.f.origin, d.f.plan);
  else d.f = draw_case(seed, index, budget);
  return d;
}

struct Options {
  uint64_t seed = kDefaultSeed;
  int64_t cases = 10000;
  int jobs = 0;
  Backend backend = Backend::cpu;
  bool replay = false, dump = false, verbose = false;
  uint64_t replay_index = 0;
  double budget = 3e7;  // executor cost per case (see executor_cost)
  std::string compile_only;  // an arch: compile the GPU fuzz's kernels with NVRTC, run nothing
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
  const Precision pr = precision_of(cpu.y.dtype);
  const double rel = (16 + 2 * depth) * pr.unit;
  const double out_ulp = pr.out_ulp, out_step = pr.out_step;
  double wmax = 1;
  if (cpu.weight.data) {
    wmax = 0;
    for (int64_t c = 0; c < cols; ++c) wmax = std::max(wmax, std::abs((load_as_double(cpu.weight.data, c, cpu.weight.dtype))));
  }
  for (int64_t r = 0; r < rows; ++r) {
    double row_max = 0, amax = 0, sum = 0, n = 0;
    for (int64_t c = 0; c < cols; ++c) {
      double v = load_as_double(cpu.y.data, r * cpu.y.row_stride + c, cpu.y.dtype);
      if (std::isfinite(v)) row_max = std::max(row_max, std::abs(v));
      double x = load_as_double(cpu.x.data, r * cpu.x.row_stride + c, cpu.x.dtype);
      if (std::isfinite(x)) amax = std::max(amax, std::abs(x)), sum += x, n += 1;
    }
    double conditioning = 0;  // LayerNorm: max |x| / std, times the largest |weight|
    if (cpu.op == Op::layer_norm && n > 0) {
      const double mean = sum / n;
      double var = 0;
      for (int64_t c = 0; c < cols; ++c) {
        double x = load_as_double(cpu.x.data, r * cpu.x.row_stride + c, cpu.x.dtype);
        if (std::isfinite(x)) var += (x - mean) * (x - mean);
      }
      const double eps = cpu.eps ? double(*cpu.eps) : double(kLayerNormEps);
      conditioning = amax / std::sqrt(var / n + eps) * wmax;
      if (!std::isfinite(conditioning)) conditioning = 0;
    }
    for (int64_t c = 0; c < cols; ++c) {
      const double a = load_as_double(gpu.y.data, r * gpu.y.row_stride + c, gpu.y.dtype);
      const double b = load_as_double(cpu.y.data, r * cpu.y.row_stride + c, cpu.y.dtype);
      bool ok;
      double tol = 0;
      if (std::isnan(b) || std::isinf(b)) {
        ok = std::isnan(b) ? std::isnan(a) : a == b;
      } else {
        tol = rel * (std::abs(b) + row_max + conditioning) + out_ulp * std::abs(b) + out_step + pr.normal;
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
          std::printf("  [%lld] x %.17g  cpu %.17g", (long long)c, (load_as_double(d.call.x.data, r * d.call.x.row_stride + c, d.call.x.dtype)),
                      (load_as_double(d.call.y.data, r * d.call.y.row_stride + c, d.call.y.dtype)));
          if (gpu.data) std::printf("  gpu %.9g", (load_as_double(gpu.data->call.y.data, r * gpu.data->call.y.row_stride + c, gpu.data->call.y.dtype)));
          std::printf("  ref %.17g\n", ref[size_t(r * d.call.x.cols + c)]);
        }
      }
    }
    return fail;
  } catch (const std::exception& e) {
    return std::string("exception: ") + e.what();
  }
}

std::string describe(const Drawn& d) {
  if (d.training) return describe_train(d.t) + " (" + d.f.origin + ")";  // its name holds the plan
  return d.f.c.name() + ", plan " + d.f.plan.to_json() + " (" + d.f.origin + ")";
}

std::string replay_command(const Options& o, uint64_t index) {
  return o.argv0 + " --replay " + std::to_string(o.seed) + ":" + std::to_string(index) +
         (o.backend == Backend::cuda ? " --backend cuda" : "");
}

#if TILE_WITH_CUDA
// GPU mode compiles every distinct kernel first, on all host threads (NVRTC dominates). Prints
// how long that took and the slowest compile's case, so a plan family that compiles slowly shows.
void precompile(const std::vector<Drawn>& cases, int jobs, const std::string& arch) {
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::string> sources;
  std::vector<size_t> first_case;  // a case that needs each source
  {
    std::map<std::string, bool> seen;
    for (size_t i = 0; i < cases.size(); ++i) {
      const Drawn& drawn = cases[i];
      std::string src;
      if (drawn.training) {  // the main pass (a second phase or a counting pass compiles when first run)
        const auto [program, args] = train_call(drawn.t);
        src = source_for(*program, args, drawn.t.c.plan);
      } else {
        CaseData d(drawn.f.c);
        src = source_for(d.call, drawn.f.c.plan);
      }
      if (!seen.count(src)) seen[src] = true, sources.push_back(std::move(src)), first_case.push_back(i);
    }
  }
  std::atomic<size_t> next{0};
  std::mutex mutex;  // guards done, slowest and slowest_case
  size_t done = 0;
  double slowest = 0;
  size_t slowest_case = 0;
  std::vector<std::thread> threads;
  for (int t = 0; t < jobs; ++t)
    threads.emplace_back([&] {
      for (size_t i; (i = next++) < sources.size();) {
        const auto t0 = std::chrono::steady_clock::now();
        cuda::compile_cubin(sources[i], arch);
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        std::lock_guard<std::mutex> lock(mutex);
        if (s > slowest) slowest = s, slowest_case = first_case[i];
        if (++done % 200 == 0)
          std::printf("fuzz: compiled %zu of %zu kernels\n", done, sources.size()), std::fflush(stdout);
      }
    });
  for (std::thread& t : threads) t.join();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("fuzz: %zu distinct kernels compiled for %s in %.1f s on %d threads; slowest %.2f s (case %zu: %s)\n",
              sources.size(), arch.c_str(), seconds, jobs, slowest, slowest_case,
              sources.empty() ? "none" : describe(cases[slowest_case]).c_str());
  std::fflush(stdout);
}

bool gpu_available() { return cuda::driver_available(); }
#else
bool gpu_available() { return false; }
#endif

int fuzz(const Options& o) {
  const auto start = std::chrono::steady_clock::now();
  if (o.backend == Backend::cuda && !gpu_available()) {
    std::printf("[  SKIPPED ] no CUDA driver (or a build without CUDA): the GPU fuzz needs a GPU\n");
    return 0;
  }
  std::vector<Drawn> cases;
  for (int64_t i = 0; i < o.cases; ++i) cases.push_back(draw(o.seed, uint64_t(i), o.budget));
#if TILE_WITH_CUDA
  if (o.backend == Backend::cuda) precompile(cases, o.jobs, cuda::arch_name(cuda::device_info(0)));
#endif

  std::atomic<int64_t> next{0}, failures{0};
  int64_t finished = 0;  // under mutex; a progress line every tenth of the cases
  const int64_t progress_every = std::max<int64_t>(1, o.cases / 10);
  std::mutex mutex;
  std::map<std::string, int> tally;  // op, caching, pattern counts for the log
  auto work = [&] {
    for (int64_t i; (i = next++) < o.cases && failures < 10;) {
      const Drawn& d = cases[size_t(i)];
      const FuzzCase& f = d.f;
      if (o.verbose) {  // before the case runs, so the last line names a case that hangs or crashes
        std::lock_guard<std::mutex> lock(mutex);
        std::printf("fuzz: case %lld: %s\n", (long long)i, describe(d).c_str());
        std::fflush(stdout);
      }
      std::string fail = d.training ? run_train_one(d.t, f.plan, o.backend) : run_one(f, o.backend, false);
      std::lock_guard<std::mutex> lock(mutex);
      if (++finished % progress_every == 0) {
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        std::printf("fuzz: %lld of %lld cases, %.1f s\n", (long long)finished, (long long)o.cases, s);
        std::fflush(stdout);
      }
      if (d.training) {  // per training operator, and the reruns that checked bitwise equality
        ++tally[train_kind_name(d.t.kind)], ++tally["plan from " + f.origin];
        if (d.t.repeat) ++tally["bitwise reruns"];
        if (f.plan.ctas_per_program > 1) ++tally["training cluster programs"];
        if (f.plan.ctas_per_program > 1 && f.plan.caching == InputCaching::reread) ++tally["re-read cluster programs"];
        if (d.t.c.in == DType::f64) ++tally["float64 calls"];
        if (!fail.empty()) {
          ++failures;
          std::printf("FAIL seed %llu case %lld: %s\n  %s\n  replay: %s\n", (unsigned long long)o.seed, (long long)i,
                      describe(d).c_str(), fail.c_str(), replay_command(o, uint64_t(i)).c_str());
          std::fflush(stdout);
        }
        continue;
      }
      const MappingPlan& p = f.plan;
      ++tally[op_name(f.c.op)], ++tally[to_string(p.caching)], ++tally["plan from " + f.origin];
      ++tally[f.c.cols <= 64 ? "cols 1-64" : f.c.cols <= 4096 ? "cols 65-4096" : "cols 4097-40000"];
      if (p.workers_per_program < 32) ++tally["sub-warp"];
      if (p.programs_per_group > 1) ++tally["packed programs"];
      if (p.barrier_scope == BarrierScope::program) ++tally["program barriers"];
      if (p.tail == TailHandling::clamp) ++tally["clamp tail"];
      if (p.alignment == Alignment::require) ++tally["whole vectors"];
      if (p.cache_format == CacheFormat::packed) ++tally["packed cache"];
      if (p.row_head == RowHead::peel) ++tally["peeled rows"];
      if (p.merge == MergeStrategy::staged) ++tally["staged merges"];
      if (p.column_loads == ColumnLoads::with_row) ++tally["column loads with the row"];
      if (p.column_loads == ColumnLoads::once) ++tally["column loads once a group"];
      if (p.grid_limit > 0) ++tally["row-block loops"];
      if (p.row_prefetch == RowPrefetch::next)
        ++tally[p.caching == InputCaching::reread ? "next re-read iteration loaded ahead" : "next row block prefetched"];
      if (p.ctas_per_program > 1) ++tally["cluster programs"];
      if (p.ctas_per_program > 1 && p.caching == InputCaching::reread) ++tally["re-read cluster programs"];
      if (p.ctas_per_program > 1 && p.grid_limit > 0) ++tally["clusters looping over row blocks"];
      if (f.c.special_values) ++tally["special values"];
      if (f.c.x == DType::f64) ++tally["float64 calls"];
      if (!fail.empty()) {
        ++failures;
        std::printf("FAIL seed %llu case %lld: %s\n  %s\n  replay: %s\n", (unsigned long long)o.seed, (long long)i,
                    describe(d).c_str(), fail.c_str(), replay_command(o, uint64_t(i)).c_str());
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

// The GPU fuzz's compile step alone, for an arch named on the command line: needs NVRTC, no
// GPU, so the compile time of a change's kernels can be measured before it reaches a GPU.
int compile_only(const Options& o) {
#if TILE_WITH_CUDA
  std::vector<Drawn> cases;
  for (int64_t i = 0; i < o.cases; ++i) cases.push_back(draw(o.seed, uint64_t(i), o.budget));
  precompile(cases, o.jobs, o.compile_only);
  return 0;
#else
  (void)o;
  std::fprintf(stderr, "fuzz_main: --compile-only needs a build with CUDA (TILE_WITH_CUDA=ON, for NVRTC)\n");
  return 2;
#endif
}

int replay(const Options& o) {
  const Drawn d = draw(o.seed, o.replay_index, o.budget);
  std::printf("case %llu:%llu: %s\n", (unsigned long long)o.seed, (unsigned long long)o.replay_index, describe(d).c_str());
  if (o.backend == Backend::cuda && !gpu_available()) std::printf("no CUDA driver: replaying on the CPU backend only\n");
  const Backend backend = o.backend == Backend::cuda && gpu_available() ? Backend::cuda : Backend::cpu;
  std::string fail = d.training ? run_train_one(d.t, d.f.plan, backend) : run_one(d.f, backend, o.dump);
  std::printf("%s\n", fail.empty() ? "passed" : ("FAIL: " + fail).c_str());
  return fail.empty() ? 0 : 1;
}

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr,
               "fuzz_main: %s\nusage: fuzz_main [--cases N] [--seed S] [--jobs J] [--backend cpu|cuda] "
               "[--budget COST] [--verbose]\n       fuzz_main --compile-only ARCH [--cases N] [--seed S] [--jobs J]\n  "
               "     fuzz_main --replay SEED:CASE [--backend cpu|cuda] [--dump]\n",
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
    else if (a == "--compile-only")
      o.compile_only = value();
    else if (a == "--verbose")
      o.verbose = true;
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
  if (!o.compile_only.empty()) return compile_only(o);
  return o.replay ? replay(o) : fuzz(o);
}
