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

}  // namespace
}  // namespace tile
