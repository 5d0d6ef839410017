// NVRTC compiles the training operators' kernels (main and second phase) for sm_90 without a
// GPU: every program, with every optional operand given and none, in fp32, bf16 and fp64, under
// plans that take the lowering's paths.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <set>

#include "api/pipeline.hpp"
#include "backend/cuda/emit_cuda.hpp"
#include "backend/cuda/jit_module.hpp"
#include "target/target.hpp"
#include "tile/training.hpp"

namespace tile {
namespace {

// Host buffers for one call of `p`, made from its declarations: every operand, or only those
// that are not optional.
struct Operands {
  std::vector<std::vector<uint8_t>> storage;
  Args args;
  Operands(const RowProgram& p, int64_t rows, int64_t cols, DType rows_dtype, bool optional) {
    for (const OperandDecl& d : p.operands()) {
      if (d.role == Role::scalar_in) {
        if (!d.default_value) args.set(d.name, 30.0);  // softcap
        continue;
      }
      if (d.optional && !optional) continue;
      DType t = d.dtypes.contains(rows_dtype) ? rows_dtype : d.dtypes.contains(DType::f32) ? DType::f32 : DType::i64;
      const bool matrix_role = d.role == Role::row_in || d.role == Role::row_out;
      const int64_t n = matrix_role                                                       ? rows * cols
                        : d.role == Role::row_scalar_in || d.role == Role::row_scalar_out ? rows
                        : d.role == Role::col_in || d.role == Role::col_out               ? cols
                                                                                          : 1;
      storage.emplace_back(size_t(n * dtype_size(t) + 64));
      void* data = storage.back().data();
      if (matrix_role)
        args.set(d.name, matrix(data, t, rows, cols));
      else
        args.set(d.name, VectorView{data, t, n});
    }
  }
};

TEST(TrainingSource, NvrtcCompilesEveryProgramForSm90) {
  std::filesystem::path dir = std::filesystem::temp_directory_path() / "tile-training-nvrtc-test";
  setenv("TILE_CACHE_DIR", dir.c_str(), 1);
  setenv("TILE_DISABLE_DISK_CACHE", "1", 1);
  std::vector<const RowProgram*> programs;
  for (const std::string& name : training_program_names()) programs.push_back(&training_program(name));
  for (int pass = 0; pass < 3; ++pass) programs.push_back(&cross_entropy_program(CrossEntropyPass(pass), true, true));
  std::vector<PlanRequest> plans(1);
  plans.emplace_back().caching = InputCaching::reread;
  PlanRequest named;
  named.barrier_scope = BarrierScope::program, named.programs_per_group = 2, named.workers_per_program = 64;
  plans.push_back(named);
  std::set<std::string> sources;
  for (const RowProgram* p : programs)
    for (DType t : {DType::f32, DType::bf16, DType::f64})
      for (bool optional : {false, true})
        for (const PlanRequest& plan : plans) {
          Operands ops(*p, 37, 1500, t, optional);
          auto pk = prepare(*p, bind(*p, ops.args), plan, cuda_target().limits(CallOptions{}));
          sources.insert(cuda::emit_cuda(pk->lowered.main.kernel));
          if (pk->lowered.finish) sources.insert(cuda::emit_cuda(pk->lowered.finish->kernel));
        }
  int compiled = 0, finish = 0;
  for (const std::string& src : sources) {
    auto result = cuda::compile_cubin(src, "sm_90");
    ASSERT_EQ(result->cubin.compare(0, 4,
                                    "\x7f"
                                    "ELF"),
              0);
    ++compiled;
    finish += src.find("_finish") != std::string::npos;
  }
  std::printf("NVRTC %s compiled %d training sources (%d with a second phase) for sm_90\n",
              cuda::nvrtc_version().c_str(), compiled, finish);
  EXPECT_GT(compiled, 100);
  EXPECT_GT(finish, 5);
}

}  // namespace
}  // namespace tile
