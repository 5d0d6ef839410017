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
  for (const char* part : {"kernel tile_layer_norm_bf16_f32_p2w64", "in bf16* x", "out f32* y", "shared f32 partials0[2] per program",
                           "shfl_xor(", "barrier.group", "load.raw x[", "unpack_bf16_hi(", "load weight[", "store y[", "aligned(&x["})
    EXPECT_NE(text.find(part), std::string::npos) << part << "\n" << text;
}

}  // namespace
}  // namespace tile::ir
