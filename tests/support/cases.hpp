// One oracle-checked run of a call on either backend, shared by the CPU and GPU sweeps.
#pragma once

#include <gtest/gtest.h>

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

  std::string name() const {
    return op_name(op) + " " + std::to_string(rows) + "x" + std::to_string(cols) + " stride " +
           std::to_string(stride ? stride : cols) + " offset " + std::to_string(offset) + " " +
           std::string(dtype_name(x)) + "->" + std::string(dtype_name(y)) + " w " + std::string(dtype_name(w));
  }
};

struct CaseResult {
  LaunchRecord record;
  OracleCheck check;
  bool outside_untouched = false;
};

// Fresh random inputs (seeded), poisoned output, one launch, full float64 check.
inline CaseResult run_case(const Case& c, Backend backend) {
  const int64_t stride = c.stride ? c.stride : c.cols;
  std::mt19937_64 rng(c.seed);
  HostMatrix x(c.x, c.rows, c.cols, stride, c.offset), y(c.y, c.rows, c.cols, stride, c.offset);
  x.fill_random(rng);
  y.poison();
  HostVector weight(c.w, c.cols), bias(c.w, c.cols);
  weight.fill_random(rng, 1.0, 0.5);
  bias.fill_random(rng, 0.0, 0.5);
  Call call;
  call.op = c.op;
  call.x = x.view();
  call.y = y.view();
  const bool norm = c.op == Op::rms_norm || c.op == Op::layer_norm;
  if (norm && c.weight) call.weight = weight.view();
  if (c.op == Op::layer_norm && c.bias) call.bias = bias.view();

  CaseResult result;
  if (backend == Backend::cpu) {
    result.record = run(call, {c.plan, nullptr, Backend::cpu});
  } else {
#if !TILE_WITH_CUDA
    throw NoDriverError("run_case: the CUDA backend was not built (TILE_WITH_CUDA=OFF)");
#else
    cuda::ensure_context(0);
    cuda::DeviceBuffer dx(x.bytes().size()), dy(y.bytes().size()), dw(weight.bytes.size()), db(bias.bytes.size());
    dx.copy_from_host(x.bytes().data(), x.bytes().size());
    dy.copy_from_host(y.bytes().data(), y.bytes().size());  // poisoned, guard band included
    dw.copy_from_host(weight.bytes.data(), weight.bytes.size());
    db.copy_from_host(bias.bytes.data(), bias.bytes.size());
    const int64_t shift = c.offset * dtype_size(c.x), yshift = c.offset * dtype_size(c.y);
    Call d = call;
    d.x.data = static_cast<char*>(dx.get()) + shift;
    d.y.data = static_cast<char*>(dy.get()) + yshift;
    if (call.weight.data) d.weight.data = dw.get();
    if (call.bias.data) d.bias.data = db.get();
    result.record = run(d, {c.plan, nullptr, Backend::cuda});
    TILE_CU_CHECK(cuda::driver().cuCtxSynchronize());
    dy.copy_to_host(y.bytes().data(), y.bytes().size());
#endif
  }
  result.check = check_against_oracle(call);
  result.outside_untouched = y.outside_untouched();
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

}  // namespace tile::testing
