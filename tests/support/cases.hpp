// One oracle-checked run of a call on either backend, shared by the CPU and GPU sweeps.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <optional>
#include <random>
#include <string>

#if TILE_WITH_CUDA
#include "backend/cuda/driver.hpp"
#endif
#include "testing/host_tensor.hpp"
#include "tile/tile.hpp"

namespace tile::testing {

struct Case {
  Op op = Op::softmax;
  DType x = DType::f32, y = DType::f32, w = DType::f32;
  bool weight = true, bias = true;
  int64_t rows = 1, cols = 1, stride = 0;  // stride 0: cols
  int64_t offset = 0;                      // elements the x and y pointers are shifted by
  PlanRequest plan;
  uint64_t seed = 1;
  // The fuzz's extras: y's own stride and offset, eps, and inputs with special values.
  int64_t y_stride = 0;   // 0: like x
  int64_t y_offset = -1;  // -1: like x
  std::optional<float> eps;
  bool special_values = false;  // rows drawn from RowPattern with NaN/inf sprinkled in

  int64_t x_stride_or_cols() const { return stride ? stride : cols; }
  int64_t y_stride_or_x() const { return y_stride ? y_stride : x_stride_or_cols(); }
  int64_t y_offset_or_x() const { return y_offset >= 0 ? y_offset : offset; }
  bool norm() const { return op == Op::rms_norm || op == Op::layer_norm; }
  std::string name() const {
    std::string n = op_name(op) + " " + std::to_string(rows) + "x" + std::to_string(cols) + " stride " +
                    std::to_string(x_stride_or_cols()) + " offset " + std::to_string(offset) + " " +
                    std::string(dtype_name(x)) + "->" + std::string(dtype_name(y)) + " w " + std::string(dtype_name(w));
    if (y_stride_or_x() != x_stride_or_cols() || y_offset_or_x() != offset)
      n += " y stride " + std::to_string(y_stride_or_x()) + " offset " + std::to_string(y_offset_or_x());
    if (norm()) n += std::string(weight ? " weight" : " no weight") + (op == Op::layer_norm ? (bias ? " bias" : " no bias") : "");
    if (eps) n += " eps " + std::to_string(*eps);
    if (special_values) n += " special values";
    return n;
  }
};

// A case's host inputs, drawn from its seed, and its output, poisoned (0xff bytes: NaN) with a
// guard band; `call` views them.
struct CaseData {
  CaseData(const Case& c)
      : x(c.x, c.rows, c.cols, c.x_stride_or_cols(), c.offset),
        y(c.y, c.rows, c.cols, c.y_stride_or_x(), c.y_offset_or_x()),
        weight(c.w, c.cols),
        bias(c.w, c.cols) {
    std::mt19937_64 rng(c.seed);
    if (!c.special_values) {
      x.fill_random(rng);
      weight.fill_random(rng, 1.0, 0.5);
      bias.fill_random(rng, 0.0, 0.5);
    } else {
      // Rows of every pattern, a quarter of them with NaN or infinities; weights and biases
      // mostly N(1, 0.5) and N(0, 0.5), sometimes with NaN and zeros (biases also
      // infinities) or of magnitudes 2^-20 ... 2^20. No infinite weight: x_hat * inf is NaN or
      // inf depending on whether fp32 x_hat underflows, which no float64 oracle decides.
      for (int64_t r = 0; r < c.rows; ++r) {
        patterns.push_back(RowPattern(rng() % uint64_t(RowPattern::count)));
        x.fill_row(rng, r, patterns.back(), rng() % 4 == 0 ? 1 + int(rng() % 3) : 0);
      }
      for (HostVector* v : {&weight, &bias}) {
        const double mean = v == &weight ? 1.0 : 0.0;
        const uint64_t kind = rng() % 8;
        if (kind == 0) v->fill_with_specials(rng, mean, 0.5, 1 + int(rng() % 2), v == &bias);
        else if (kind == 1) v->fill_with_specials(rng, 0.0, std::exp2(std::uniform_real_distribution<double>(-20, 20)(rng)), 0, false);
        else v->fill_random(rng, mean, 0.5);
      }
    }
    y.poison();
    call.op = c.op;
    call.x = x.view();
    call.y = y.view();
    if (c.norm() && c.weight) call.weight = weight.view();
    if (c.op == Op::layer_norm && c.bias) call.bias = bias.view();
    if (c.norm()) call.eps = c.eps;
  }
  HostMatrix x, y;
  HostVector weight, bias;
  std::vector<RowPattern> patterns;
  Call call;
};

struct CaseResult {
  LaunchRecord record;
  OracleCheck check;
  bool outside_untouched = false;
  std::unique_ptr<CaseData> data;  // inputs and the output the launch wrote
};

// Fresh seeded inputs, poisoned output, one launch (with `plan`, else the case's request),
// full float64 check against the plan launched.
inline CaseResult run_case(const Case& c, Backend backend, const std::optional<PlanRequest>& plan = std::nullopt) {
  CaseResult result;
  result.data = std::make_unique<CaseData>(c);
  CaseData& d = *result.data;
  const PlanRequest& request = plan ? *plan : c.plan;
  if (backend == Backend::cpu) {
    result.record = run(d.call, {request, nullptr, Backend::cpu});
  } else {
#if !TILE_WITH_CUDA
    throw NoDriverError("run_case: the CUDA backend was not built (TILE_WITH_CUDA=OFF)");
#else
    cuda::ensure_context(0);
    cuda::DeviceBuffer dx(d.x.bytes().size()), dy(d.y.bytes().size()), dw(d.weight.bytes.size()), db(d.bias.bytes.size());
    dx.copy_from_host(d.x.bytes().data(), d.x.bytes().size());
    dy.copy_from_host(d.y.bytes().data(), d.y.bytes().size());  // poisoned, guard band included
    dw.copy_from_host(d.weight.bytes.data(), d.weight.bytes.size());
    db.copy_from_host(d.bias.bytes.data(), d.bias.bytes.size());
    Call dc = d.call;
    dc.x.data = static_cast<char*>(dx.get()) + d.x.offset_elems() * dtype_size(c.x);
    dc.y.data = static_cast<char*>(dy.get()) + d.y.offset_elems() * dtype_size(c.y);
    if (d.call.weight.data) dc.weight.data = dw.get();
    if (d.call.bias.data) dc.bias.data = db.get();
    result.record = run(dc, {request, nullptr, Backend::cuda});
    TILE_CU_CHECK(cuda::driver().cuCtxSynchronize());
    dy.copy_to_host(d.y.bytes().data(), d.y.bytes().size());
#endif
  }
  result.check = check_against_oracle(d.call, result.record.plan);
  result.outside_untouched = d.y.outside_untouched();
  return result;
}

inline void expect_case_passes(const Case& c, Backend backend) {
  SCOPED_TRACE(c.name());
  CaseResult r = run_case(c, backend);
  EXPECT_TRUE(r.check.ok) << r.check.mismatches << " mismatches; first: " << r.check.first_mismatch
                          << "; plan " << r.record.plan.to_json();
  EXPECT_TRUE(r.outside_untouched) << "memory outside the output rows was written; plan " << r.record.plan.to_json();
}

// The seeded sweep of the core issue: every operator and dtype over the listed cols and rows,
// strided and unaligned rows.
inline std::vector<Case> core_sweep() {
  std::vector<Case> cases;
  uint64_t seed = 1000;
  const Op ops[] = {Op::softmax, Op::log_softmax, Op::rms_norm, Op::layer_norm};
  const DType dtypes[] = {DType::f32, DType::f16, DType::bf16};
  for (Op op : ops)
    for (DType dt : dtypes)
      for (int64_t cols : {1, 2, 3, 31, 33, 1023, 1537, 4097, 65537})
        for (int64_t rows : {0, 1, 37}) {
          if (cols == 65537 && rows == 37) continue;  // one long row per dtype keeps CI short
          Case c;
          c.op = op, c.x = dt, c.y = dt, c.w = dt, c.rows = rows, c.cols = cols, c.seed = seed++;
          cases.push_back(c);
        }
  // Strided rows, misaligned pointers, mixed dtypes (bf16 in, f32 out, fp32 weight).
  for (Op op : ops) {
    Case c;
    c.op = op, c.rows = 37, c.cols = 1000, c.stride = 1031, c.seed = seed++;
    cases.push_back(c);
    c.offset = 1, c.stride = 0, c.cols = 1024, c.seed = seed++;
    cases.push_back(c);
    c.offset = 1, c.x = DType::bf16, c.y = DType::bf16, c.w = DType::f32, c.cols = 4096, c.seed = seed++;
    cases.push_back(c);
    c.offset = 0, c.x = DType::bf16, c.y = DType::f32, c.w = DType::f32, c.cols = 3072, c.stride = 3080, c.seed = seed++;
    cases.push_back(c);
    c.x = DType::f16, c.y = DType::bf16, c.w = DType::f16, c.cols = 777, c.stride = 0, c.seed = seed++;
    cases.push_back(c);
  }
  for (Op op : ops)  // the longest rows the library promises, re-read from memory
    for (DType dt : {DType::f32, DType::bf16}) {
      Case c;
      c.op = op, c.x = dt, c.y = dt, c.w = DType::f32, c.rows = 2, c.cols = 262144, c.seed = seed++;
      cases.push_back(c);
    }
  for (Op op : ops)  // 16-bit rows cached packed: tails, misaligned rows, strided rows
    for (DType dt : {DType::f16, DType::bf16})
      for (auto [cols, stride, offset] : {std::tuple<int64_t, int64_t, int64_t>{1537, 0, 0}, {4096, 0, 1}, {3000, 3008, 0}}) {
        Case c;
        c.op = op, c.x = dt, c.y = dt, c.w = dt, c.rows = 37, c.cols = cols, c.stride = stride;
        c.offset = offset, c.seed = seed++;
        c.plan.cache_format = CacheFormat::packed;
        c.plan.vector_elems = 8;
        cases.push_back(c);
      }
  for (Op op : {Op::rms_norm, Op::layer_norm}) {  // without weight / bias
    Case c;
    c.op = op, c.rows = 37, c.cols = 1537, c.weight = false, c.bias = false, c.seed = seed++;
    cases.push_back(c);
  }
  return cases;
}

// Float64 calls (every float operand f64, float64 registers): every operator over short, odd and
// long rows, strided and misaligned rows (8-byte elements: scalar paths), rows of every value
// pattern across fp64's whole range (the f64 exponent clamps), and the plan classes whose code
// depends on the element size: 2-double vectors, re-read loops, program barriers, packed
// sub-warp programs, clamped tails, staged merges, row-block loops and a cluster split.
inline std::vector<Case> f64_sweep() {
  std::vector<Case> cases;
  uint64_t seed = 14000;
  const Op ops[] = {Op::softmax, Op::log_softmax, Op::rms_norm, Op::layer_norm};
  auto f64_case = [&](Op op, int64_t rows, int64_t cols) {
    Case c;
    c.op = op, c.x = c.y = c.w = DType::f64, c.rows = rows, c.cols = cols, c.seed = seed++;
    return c;
  };
  for (Op op : ops) {
    for (int64_t cols : {1, 2, 3, 33, 1023, 1537, 4097})
      for (int64_t rows : {0, 1, 37}) cases.push_back(f64_case(op, rows, cols));
    Case c = f64_case(op, 37, 1000);
    c.stride = 1031;
    cases.push_back(c);
    c = f64_case(op, 37, 1024);
    c.offset = 1, c.y_offset = 3;
    cases.push_back(c);
    c = f64_case(op, 64, 1537);
    c.special_values = true;
    cases.push_back(c);
    c = f64_case(op, 2, 70000);  // re-read by the policy
    cases.push_back(c);
    if (c.norm()) {
      c = f64_case(op, 37, 1537);
      c.weight = c.bias = false;
      cases.push_back(c);
    }
    struct Variant {
      int64_t rows, cols;
      PlanRequest plan;
    };
    std::vector<Variant> variants(7);
    variants[0] = {37, 4097, {}};
    variants[0].plan.caching = InputCaching::reread, variants[0].plan.workers_per_program = 64;
    variants[0].plan.stripe_unroll = 3;
    variants[1] = {37, 4097, {}};
    variants[1].plan.programs_per_group = 3, variants[1].plan.workers_per_program = 128;
    variants[1].plan.barrier_scope = BarrierScope::program;
    variants[2] = {37, 40, {}};
    variants[2].plan.workers_per_program = 8, variants[2].plan.programs_per_group = 8;
    variants[3] = {37, 1537, {}};
    variants[3].plan.tail = TailHandling::clamp, variants[3].plan.programs_per_group = 2;
    variants[4] = {37, 1536, {}};
    variants[4].plan.merge = MergeStrategy::staged, variants[4].plan.workers_per_program = 96;
    variants[4].plan.tail = TailHandling::clamp;  // whole 2-double vectors, clamped: every lane loads
    variants[5] = {37, 1537, {}};
    variants[5].plan.grid_limit = 4, variants[5].plan.vector_elems = 1;
    variants[6] = {3, 2 * 2 * 64 * 2 - 13, {}};
    variants[6].plan.ctas_per_program = 2, variants[6].plan.workers_per_program = 64;
    variants[6].plan.caching = InputCaching::registers;
    for (Variant& v : variants) {
      c = f64_case(op, v.rows, v.cols);
      c.plan = v.plan;
      cases.push_back(c);
    }
  }
  return cases;
}

// The packing configurations: {softmax, RMSNorm, LayerNorm} x four shapes x 1..3 programs.
inline std::vector<Case> packing_sweep() {
  std::vector<Case> cases;
  uint64_t seed = 5000;
  for (Op op : {Op::softmax, Op::rms_norm, Op::layer_norm})
    for (auto [rows, cols] : {std::pair<int64_t, int64_t>{37, 1537}, {256, 3072}, {768, 6144}, {1024, 4096}})
      for (int programs : {1, 2, 3}) {
        Case c;
        c.op = op, c.rows = rows, c.cols = cols, c.seed = seed++;
        c.plan.programs_per_group = programs;
        c.plan.workers_per_program = 256;
        c.plan.vector_elems = 4;
        c.plan.stripe_unroll = 1;
        c.plan.caching = InputCaching::registers;
        c.plan.private_budget = 64;
        c.plan.barrier_scope = BarrierScope::group;
        cases.push_back(c);
      }
  return cases;
}

// The structural classes of the mapping family: caching, width (sub-warp, one warp, several),
// packing (one program, or several with a guard program), barrier scope, tail, alignment, cache
// format, groups that loop over row blocks, and the merge strategy of cached rows. One case per valid combination, with the operator and the dtype rotating so
// every operator and every dtype appears; used by the sanitizer set and its CPU twin.
struct FamilyCase {
  Case c;
  std::string family;  // "registers w8 packed group clamp require packed-cache", ...
};

inline std::vector<FamilyCase> plan_family_cases() {
  std::vector<FamilyCase> out;
  const Op ops[] = {Op::softmax, Op::log_softmax, Op::rms_norm, Op::layer_norm};
  const DType dtypes[] = {DType::f32, DType::f16, DType::bf16};
  int index = 0;
  for (InputCaching caching : {InputCaching::registers, InputCaching::reread})
    for (int width : {8, 32, 96})  // 96: three warps, so the cross-warp butterfly has idle lanes
      for (bool packed : {false, true})
        for (BarrierScope scope : {BarrierScope::group, BarrierScope::program})
          for (TailHandling tail : {TailHandling::predicate, TailHandling::clamp})
            for (Alignment alignment : {Alignment::scalar_fallback, Alignment::require})
              for (CacheFormat format : {CacheFormat::f32, CacheFormat::packed})
               for (bool loop : {false, true})  // groups that loop over row blocks (grid_limit)
                for (MergeStrategy merge : {MergeStrategy::combine, MergeStrategy::staged}) {
                if (merge == MergeStrategy::staged && caching != InputCaching::registers) continue;
                if (scope == BarrierScope::program && width <= 32) continue;  // no barrier to scope
                if (format == CacheFormat::packed && caching != InputCaching::registers) continue;
                if (width < 32 && !packed) continue;  // sub-warp programs always fill a warp
                Case c;
                c.op = ops[index % 4];
                c.x = format == CacheFormat::packed ? dtypes[1 + index % 2] : dtypes[(index / 4) % 3];
                c.y = dtypes[(index + 1) % 3], c.w = c.x;
                const int v = 16 / std::max(dtype_size(c.x), dtype_size(c.y));  // 16-byte accesses
                // Require: aligned rows, cols a multiple of V; otherwise misaligned rows, odd cols.
                const int64_t base = width < 32 ? 50 : width == 32 ? 300 : 1537;
                c.cols = alignment == Alignment::require ? (base / v + 1) * v : base;
                c.offset = alignment == Alignment::require ? 0 : 1;
                c.y_offset = alignment == Alignment::require ? 0 : 3;
                c.rows = packed ? 7 : 3;  // packed: the last group has a guard program
                c.seed = uint64_t(9000 + index);
                PlanRequest& p = c.plan;
                p.workers_per_program = width, p.vector_elems = v, p.caching = caching;
                p.programs_per_group = packed ? (width < 32 ? 64 / width : 2) : 1;
                p.barrier_scope = scope, p.tail = tail, p.alignment = alignment, p.cache_format = format;
                p.stripe_unroll = caching == InputCaching::reread ? 2 : 1;
                p.grid_limit = loop ? 2 : 0;  // 7 or 3 rows: two groups, each looping
                p.merge = merge;
                p.resident_groups = 1 + index % 2;
                std::string family = to_string(caching) + " w" + std::to_string(width) + (packed ? " packed " : " single ") +
                                     to_string(scope) + " " + to_string(tail) + " " + to_string(alignment) + " " +
                                     to_string(format) + "-cache" + (loop ? " loop" : "") + " " + to_string(merge);
                out.push_back({c, family});
                ++index;
              }
  // Rows staged in shared memory (caching "shared": async copies, one row block a group, tails
  // predicated): one warp or three, packed or not, aligned or not, both merges; then split over
  // clusters of 2 and 16 groups.
  for (int width : {32, 96})
    for (bool packed : {false, true})
      for (Alignment alignment : {Alignment::scalar_fallback, Alignment::require})
        for (MergeStrategy merge : {MergeStrategy::combine, MergeStrategy::staged}) {
          Case c;
          c.op = ops[index % 4];
          c.x = dtypes[(index / 4) % 3], c.y = dtypes[(index + 1) % 3], c.w = c.x;
          const int v = 16 / std::max(dtype_size(c.x), dtype_size(c.y));
          const int64_t base = width == 32 ? 300 : 1537;
          c.cols = alignment == Alignment::require ? (base / v + 1) * v : base;
          c.offset = alignment == Alignment::require ? 0 : 1;
          c.y_offset = alignment == Alignment::require ? 0 : 3;
          c.rows = packed ? 7 : 3;
          c.seed = uint64_t(9000 + index);
          PlanRequest& p = c.plan;
          p.workers_per_program = width, p.vector_elems = v, p.caching = InputCaching::shared;
          p.programs_per_group = packed ? 2 : 1, p.alignment = alignment, p.merge = merge;
          p.barrier_scope = BarrierScope::group, p.tail = TailHandling::predicate, p.cache_format = CacheFormat::f32;
          p.grid_limit = 0, p.stripe_unroll = 1, p.resident_groups = 1 + index % 2;
          out.push_back({c, "shared w" + std::to_string(width) + (packed ? " packed " : " single ") +
                                to_string(alignment) + " " + to_string(merge)});
          ++index;
        }
  // A cluster case: the op and y rotate with the index, 16-byte vectors, two stripes of the whole
  // cluster (13 columns short and misaligned unless `require`), three rows.
  auto cluster_case = [&](int ctas, int width, bool require, DType x) {
    Case c;
    c.op = ops[index % 4];
    c.x = x, c.y = dtypes[(index + 1) % 3], c.w = c.x;
    const int v = 16 / std::max(dtype_size(c.x), dtype_size(c.y));
    const int64_t span = int64_t(ctas) * width * v * 2;
    c.cols = require ? span : span - 13;
    c.offset = require ? 0 : 1;
    c.y_offset = require ? 0 : 3;
    c.rows = 3;
    c.seed = uint64_t(9000 + index);
    c.plan.ctas_per_program = ctas, c.plan.workers_per_program = width, c.plan.vector_elems = v;
    c.plan.programs_per_group = 1;
    return c;
  };
  for (int ctas : {2, 16})
    for (int width : {32, 128})
      for (MergeStrategy merge : {MergeStrategy::combine, MergeStrategy::staged}) {
        const bool require = index % 2 == 0;
        Case c = cluster_case(ctas, width, require, dtypes[(index / 4) % 3]);
        PlanRequest& p = c.plan;
        p.caching = InputCaching::shared, p.alignment = require ? Alignment::require : Alignment::scalar_fallback;
        p.merge = merge, p.barrier_scope = BarrierScope::group, p.tail = TailHandling::predicate;
        p.cache_format = CacheFormat::f32, p.grid_limit = 0, p.stripe_unroll = 1, p.resident_groups = 1;
        out.push_back({c, "shared-cluster" + std::to_string(ctas) + " w" + std::to_string(width) + " " +
                              to_string(*p.alignment) + " " + to_string(merge)});
        ++index;
      }
  // Rows split over the groups of a cluster (one program a group, cached in registers, one row
  // block a cluster): two cluster sizes, one to four warps, both merges; tails, alignment and
  // the cache format rotate. Rows span every group of the cluster.
  for (int ctas : {2, 16})
    for (int width : {32, 64, 96, 128})
      for (MergeStrategy merge : {MergeStrategy::combine, MergeStrategy::staged}) {
        const bool require = index % 2 == 0, packed_cache = index % 3 == 0;
        Case c = cluster_case(ctas, width, require, packed_cache ? DType::bf16 : dtypes[(index / 4) % 3]);
        const int v = *c.plan.vector_elems;
        PlanRequest& p = c.plan;
        p.caching = InputCaching::registers, p.barrier_scope = BarrierScope::group;
        p.tail = index % 4 < 2 ? TailHandling::predicate : TailHandling::clamp;
        p.alignment = require ? Alignment::require : Alignment::scalar_fallback;
        p.cache_format = packed_cache && v % 2 == 0 ? CacheFormat::packed : CacheFormat::f32;
        p.stripe_unroll = 1, p.merge = merge, p.resident_groups = 1;
        out.push_back({c, "cluster" + std::to_string(ctas) + " w" + std::to_string(width) + " " + to_string(*p.tail) +
                              " " + to_string(*p.alignment) + " " + to_string(*p.cache_format) + "-cache" + " " +
                              to_string(merge)});
        ++index;
      }
  return out;
}

// Long rows split over the groups of a cluster, read from memory once: the four operators in
// fp32 and bf16 at 64K, 128K and 256K columns, each with the cluster size the policy picks for
// register caching on a target with clusters of up to 16 groups (the rest of the plan is the
// policy's too), and at 64K and 256K staged in shared memory (caching "shared") instead.
inline std::vector<Case> cluster_sweep() {
  std::vector<Case> cases;
  uint64_t seed = 12000;
  DeviceLimits clusters;
  clusters.max_cluster_size = 16;
  for (Op op : {Op::softmax, Op::log_softmax, Op::rms_norm, Op::layer_norm})
    for (DType dt : {DType::f32, DType::bf16})
      for (int64_t cols : {65536, 131072, 262144}) {
        Case c;
        c.op = op, c.x = dt, c.y = dt, c.w = DType::f32, c.rows = 3, c.cols = cols, c.seed = seed++;
        c.plan.caching = InputCaching::registers;
        c.plan.ctas_per_program =
            choose_plan(PlanInputs::for_rows(dt, dt, c.rows, cols, 0, 0, DType::f32), c.plan, clusters).ctas_per_program;
        cases.push_back(c);
        if (cols == 131072) continue;
        // Staged in shared memory instead, on the policy's staged cluster (64 KiB a group).
        c.plan = {};
        c.plan.caching = InputCaching::shared, c.seed = seed++;
        c.plan.ctas_per_program =
            choose_plan(PlanInputs::for_rows(dt, dt, c.rows, cols, 0, 0, DType::f32), c.plan, clusters)
                .ctas_per_program;
        cases.push_back(c);
      }
  return cases;
}

}  // namespace tile::testing
