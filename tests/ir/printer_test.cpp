#include "ir/printer.hpp"

#include <gtest/gtest.h>

#include "bind/bind.hpp"
#include "lower/lower_row_program.hpp"

namespace tile::ir {
namespace {

TEST(Printer, DumpNamesTheMappingAndEveryNodeKind) {
  MappingPlan plan;
  plan.programs_per_group = 2, plan.workers_per_program = 64, plan.stripes = 2;
  plan.cache_format = CacheFormat::packed;
  const RowProgram& program = builtin_program(Op::layer_norm);
  // x bf16, y f32, weight and bias f32, eps; no mean or rstd outputs.
  KernelSignature sig{{true, true, true, true, true, false, false},
                      {DType::bf16, DType::f32, DType::f32, DType::f32, DType::f32, DType::f32, DType::f32}};
  Kernel k = lower_row_program(program, sig, plan).main.kernel;
  std::string text = to_string(k);
  for (const char* part : {"kernel tile_layer_norm_bf16_f32_p2w64", "in bf16* x", "out f32* y", "shared f32 sums0[4] per group at 0", "] per program at ",
                           "shfl_xor(", "barrier.group", "load.raw x[", "unpack_bf16_hi(", "load weight[", "store y[", "aligned(&x["})
    EXPECT_NE(text.find(part), std::string::npos) << part << "\n" << text;
}

TEST(Printer, Float64KernelsPrintTheirFloatTypeAndExactConstants) {
  MappingPlan plan;
  plan.workers_per_program = 64, plan.stripes = 8, plan.vector_elems = 2;
  const RowProgram& program = builtin_program(Op::rms_norm);
  // x, y, weight f64; eps (a float scalar of a float64 call: f64); rstd f64.
  KernelSignature sig{{true, true, true, true, true}, {DType::f64, DType::f64, DType::f64, DType::f64, DType::f64}};
  Kernel k = lower_row_program(program, sig, plan).main.kernel;
  EXPECT_EQ(k.real, Type::f64);
  std::string text = to_string(k);
  // The f64 exponent clamps and the smallest normal double, not fp32's.
  for (const char* part : {"in f64* x", "f64 eps", "shared f64 partials", "-970", "1021", "2.2250738585072014e-308"})
    EXPECT_NE(text.find(part), std::string::npos) << part << "\n" << text;
  EXPECT_EQ(text.find("-103"), std::string::npos) << text;
  EXPECT_EQ(to_string(k, *f64_const(0.1)), "0.10000000000000001");  // every f64 constant prints as itself
  EXPECT_EQ(to_string(k, *f32_const(0.1)), "0.1");
}

}  // namespace
}  // namespace tile::ir
