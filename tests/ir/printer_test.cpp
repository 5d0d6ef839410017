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

TEST(Printer, StagedRegionsAndTheirStatements) {
  Kernel k;
  k.name = "staged";
  k.buffers = {{"x", DType::f32, false}, {"h", DType::bf16, false}};
  k.staged = {{"xs", DType::f32, 6}, {"hs", DType::bf16, 8}};  // xs: 24 bytes, so hs starts at 32
  const int a = k.add_reg("a", Type::f32), b = k.add_reg("b", Type::f32);
  const ExprPtr at = cast(Type::i64, special(Special::lane));
  k.body = {async_copy(1, at, 1, i64_const(8), 2, i64_const(2), b1_const(true)), async_wait(),
            staged_load({a, b}, 1, at, i64_const(1), -1.0f)};
  const std::string text = to_string(k);
  for (const char* part : {"  staged f32 xs[6] per group at byte 0\n", "  staged bf16 hs[8] per group at byte 32\n",
                           "  async_copy staged hs[i64(lane) +: 2] = h[8 +: 2] valid 2 vector_if true\n",
                           "  async_wait\n", "  {%a, %b} = staged_load hs[i64(lane) +: 2] valid 1 fill -1.000000\n"})
    EXPECT_NE(text.find(part), std::string::npos) << part << "\n" << text;
}

}  // namespace
}  // namespace tile::ir
