#include "ir/printer.hpp"

#include <gtest/gtest.h>

#include "lower/lower_row_program.hpp"

namespace tile::ir {
namespace {

TEST(Printer, DumpNamesTheMappingAndEveryNodeKind) {
  MappingPlan plan;
  plan.programs_per_group = 2, plan.workers_per_program = 64, plan.stripes = 2;
  plan.cache_format = CacheFormat::packed;
  RowProgram program = make_program(Op::layer_norm, true, true);
  Kernel k = lower_row_program(program, {DType::bf16, DType::f32, {DType::f32, DType::f32}}, plan);
  std::string text = to_string(k);
  for (const char* part : {"kernel tile_layer_norm_bf16_f32_p2w64", "in bf16* x", "out f32* y", "shared f32 partials0[2] per program",
                           "shfl_xor(", "barrier.group", "load.raw x[", "unpack_bf16_hi(", "load weight[", "store y[", "aligned(&x["})
    EXPECT_NE(text.find(part), std::string::npos) << part << "\n" << text;
}

}  // namespace
}  // namespace tile::ir
