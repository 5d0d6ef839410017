// Through the whole pipeline (src/api/pipeline.cpp): the aliasing the emitted kernels
// assume, and plans given back.
#include <gtest/gtest.h>

#include "bind/bind.hpp"
#include "tile/tile.hpp"

namespace tile {
namespace {

// The kernel's signature: x and y are one buffer in place, so neither is __restrict__; weight
// and bias never overlap the output and are.
TEST(EmittedSource, RestrictOnlyWhereNoAliasingIsAllowed) {
  std::vector<float> x(4 * 64), w(64), bias(64);
  Call call{Op::layer_norm, matrix(x.data(), DType::f32, 4, 64), matrix(x.data(), DType::f32, 4, 64),
            VectorView{w.data(), DType::f32, 64}, VectorView{bias.data(), DType::f32, 64}};
  const std::string src = source_for(call);
  const size_t start = src.find("extern \"C\" __global__");
  ASSERT_NE(start, std::string::npos);
  const std::string sig = src.substr(start, src.find('{', start) - start);
  EXPECT_NE(sig.find("const float* x  /* f32 */"), std::string::npos) << sig;
  EXPECT_NE(sig.find("float* y  /* f32 */"), std::string::npos) << sig;
  EXPECT_NE(sig.find("const float* __restrict__ weight"), std::string::npos) << sig;
  EXPECT_NE(sig.find("const float* __restrict__ bias"), std::string::npos) << sig;
  size_t restricts = 0;
  for (size_t at = sig.find("__restrict__"); at != std::string::npos; at = sig.find("__restrict__", at + 1))
    ++restricts;
  EXPECT_EQ(restricts, 2u) << sig;
}

// A resolved plan given back resolves to the same plan and, lowered afresh, the same source.
TEST(PlanGivenBack, SameKernelSource) {
  int checked = 0;
  for (Op op : {Op::softmax, Op::log_softmax, Op::rms_norm, Op::layer_norm})
    for (DType dt : {DType::f32, DType::bf16})
      for (int64_t cols : {1, 31, 100, 1537, 4096, 10000, 40000}) {
        const int64_t rows = 37;
        std::vector<uint8_t> x(size_t(rows * (cols + 1) * 4 + 64)), w(size_t(cols * 4));
        Call call{op, matrix(x.data(), dt, rows, cols, cols + (cols % 2)),
                  matrix(x.data(), dt, rows, cols, cols + (cols % 2))};
        if (op == Op::rms_norm) call.weight = VectorView{w.data(), DType::f32, cols};
        std::vector<MappingPlan> plans = {plan_for(call)};
        if (cols <= 1537) plans = mapping_family(bind(builtin_program(op), to_args(call)).plan_inputs());
        for (const MappingPlan& p : plans) {
          const std::string source = source_for(call, PlanRequest::exactly(p));
          clear_kernel_caches();
          const PlanRequest given = PlanRequest::from_json(p.to_json());
          EXPECT_EQ(plan_for(call, given), p);
          clear_kernel_caches();
          EXPECT_EQ(source_for(call, given), source) << p.to_json();
          ++checked;
        }
      }
  EXPECT_GT(checked, 500);
}

// A repeated call reuses its first planning (src/api/pipeline.cpp): every call of a set that
// differs in one thing the policy reads (rows, columns, strides, base alignment, dtype, request,
// the optional operands) gets, planned in an interleaved order twice, the plan it gets alone
// with every cache emptied.
TEST(PlannedCalls, RepeatedCallsPlanAsFreshOnes) {
  std::vector<uint8_t> buffer(size_t(1) << 22);
  uint8_t* base = buffer.data() + (16 - reinterpret_cast<uintptr_t>(buffer.data()) % 16);
  struct Case {
    Call call;
    PlanRequest request;
  };
  std::vector<Case> cases;
  for (Op op : {Op::softmax, Op::rms_norm, Op::layer_norm})
    for (DType dt : {DType::f32, DType::bf16})
      for (int64_t rows : {1, 37, 4096})
        for (int64_t cols : {1537, 4096})
          for (int64_t pad : {0, 1})
            for (int64_t offset : {0, 1, 2}) {  // elements past a 16-byte boundary of x's base
              const int64_t stride = cols + pad;
              if ((rows - 1) * stride + cols > 4 * 1024 * 64) continue;
              uint8_t* x = base + offset * dtype_size(dt);
              uint8_t* y = base + (size_t(1) << 21);
              Call call{op, matrix(x, dt, rows, cols, stride), matrix(y, dt, rows, cols, stride)};
              if (op != Op::softmax && pad == 0) call.weight = VectorView{y + (size_t(1) << 20), dt, cols};
              cases.push_back({call, {}});
              if (offset == 0 && pad == 0) {
                PlanRequest narrow;
                narrow.workers_per_program = 64;
                cases.push_back({call, narrow});
              }
            }
  std::vector<MappingPlan> fresh;
  for (const Case& c : cases) {
    clear_kernel_caches();
    fresh.push_back(plan_for(c.call, c.request));
  }
  clear_kernel_caches();
  int differing = 0;
  for (int pass = 0; pass < 2; ++pass)
    for (size_t k = 0; k < cases.size(); ++k) {
      const size_t i = pass == 0 ? k : cases.size() - 1 - k;
      EXPECT_EQ(plan_for(cases[i].call, cases[i].request), fresh[i]) << "case " << i << ", pass " << pass;
      differing += i > 0 && !(fresh[i] == fresh[i - 1]);
    }
  // The set is worth its name: neighbouring cases mostly plan differently.
  EXPECT_GT(differing, int(cases.size()));
}

// A staged plan's record counts the row it stages in its group's shared memory, and its loop
// nest says where the row lives.
TEST(LaunchRecords, StagedRowsCountTheirSharedMemory) {
  const int64_t rows = 2, cols = 65536;
  std::vector<float> x(size_t(rows * cols), 0.5f), y(size_t(rows * cols)), w(size_t(cols), 1.0f);
  Call call{Op::rms_norm, matrix(x.data(), DType::f32, rows, cols), matrix(y.data(), DType::f32, rows, cols),
            VectorView{w.data(), DType::f32, cols}};
  PlanRequest staged;
  staged.caching = InputCaching::shared;
  const LaunchRecord rec = run(call, {staged, nullptr, Backend::cpu});
  ASSERT_EQ(rec.plan.caching, InputCaching::shared) << rec.plan.to_json();
  const int64_t row_bytes = int64_t(rec.plan.stripes) * rec.plan.workers_per_program * rec.plan.vector_elems * 4;
  EXPECT_GE(rec.shared_bytes, row_bytes) << rec.plan.to_json();
  EXPECT_LT(rec.shared_bytes, row_bytes + 4096) << rec.plan.to_json();
  const std::string nest = rec.plan.loop_nest();
  EXPECT_NE(nest.find("row staged in shared memory"), std::string::npos) << nest;
  EXPECT_EQ(nest.find("re-read"), std::string::npos) << nest;

  PlanRequest registers;
  registers.caching = InputCaching::registers;
  registers.ctas_per_program = 16;
  const LaunchRecord cached = run(call, {registers, nullptr, Backend::cpu});
  EXPECT_LT(cached.shared_bytes, 4096) << cached.plan.to_json();
}

}  // namespace
}  // namespace tile
