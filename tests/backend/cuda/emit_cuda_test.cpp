// emit_cuda (src/backend/cuda/emit_cuda.cpp): how the IR's nodes are spelled in CUDA C++ —
// the kernel signature (const, __restrict__ only where no aliasing is allowed, element types),
// launch bounds from the plan, vector words, NaN-propagating min and max, exact power-of-two
// scaling, integer operands, barriers and shuffles. Text only: runs without CUDA headers.
#include "backend/cuda/emit_cuda.hpp"

#include <gtest/gtest.h>

#include <vector>

#include "tile/tile.hpp"

namespace tile {
namespace {

std::string signature_of(const std::string& src) {
  const size_t start = src.find("extern \"C\" __global__");
  return src.substr(start, src.find('{', start) - start);
}

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

TEST(EmitCuda, SignatureFollowsTheDeclarations) {
  // Cross-entropy-shaped: a row input that its output may alias, an integer per-row input, a
  // per-row output, an optional per-column input.
  RowProgram p("xent");
  Operand logits = p.row_in("logits"), target = p.row_scalar_in("target", DTypeSet::integers());
  Operand grad = p.row_out("dlogits", DTypeSet::floats(), logits), loss = p.row_scalar_out("loss", {DType::f32}, false);
  Operand w = p.col_in("w", DTypeSet::floats(), true);
  RowExpr x = p.load(logits) * p.load_or(w, 1.0);
  auto [m, e] = p.reduce2(Axis::cols, monoid::online_softmax(), x);
  RowExpr hit = eq(p.col_index(), p.load(target));
  p.store(loss, m + log(e) - p.reduce1(Axis::cols, monoid::sum(), p.select(hit, x, p.constant(0.0))));
  p.store(grad, exp(x - m) / e - p.select(hit, p.constant(1.0), p.constant(0.0)));
  std::vector<uint16_t> lg(8 * 64);
  std::vector<int32_t> t(8);
  std::vector<float> l(8), wv(64);
  Args a;
  a.set("logits", matrix(lg.data(), DType::bf16, 8, 64)).set("dlogits", matrix(lg.data(), DType::bf16, 8, 64))
      .set("target", VectorView{t.data(), DType::i32, 8}).set("loss", VectorView{l.data(), DType::f32, 8})
      .set("w", VectorView{wv.data(), DType::f32, 64});
  const std::string src = source_for(p, a);
  const std::string sig = signature_of(src);
  // logits and dlogits may be one buffer: neither is __restrict__; the rest are.
  EXPECT_TRUE(has(sig, "const unsigned short* logits  /* bf16 */")) << sig;
  EXPECT_TRUE(has(sig, "unsigned short* dlogits  /* bf16 */")) << sig;
  EXPECT_TRUE(has(sig, "const int* __restrict__ target  /* i32 */")) << sig;
  EXPECT_TRUE(has(sig, "float* __restrict__ loss  /* f32 */")) << sig;
  EXPECT_TRUE(has(sig, "const float* __restrict__ w  /* f32 */")) << sig;
  EXPECT_TRUE(has(sig, "long long rows, long long cols, long long logits_stride")) << sig;
  // The integer target is read element by element as a 64-bit value.
  EXPECT_TRUE(has(src, "(long long)target[")) << src;
  // max over the row propagates NaN (fmaxf, which drops NaN, only in the helpers' fallback).
  const std::string body = src.substr(src.find("extern \"C\" __global__"));
  EXPECT_TRUE(has(body, "tile_max(")) << body;
  EXPECT_FALSE(has(body, "fmaxf(")) << body;
}

TEST(EmitCuda, PlanSetsLaunchBoundsBarriersAndVectors) {
  std::vector<float> x(64 * 4096), y(64 * 4096), w(4096);
  Call c{Op::rms_norm, matrix(x.data(), DType::f32, 64, 4096), matrix(y.data(), DType::f32, 64, 4096),
         VectorView{w.data(), DType::f32, 4096}};
  PlanRequest req;
  req.workers_per_program = 256, req.programs_per_group = 2, req.resident_groups = 2;
  req.barrier_scope = BarrierScope::program;
  const std::string src = source_for(c, req);
  EXPECT_TRUE(has(src, "__launch_bounds__(512, 2)")) << signature_of(src);
  EXPECT_TRUE(has(src, "tile_named_barrier(1 + program_in_group, 256)"));
  EXPECT_FALSE(has(src, "__syncthreads()"));
  EXPECT_TRUE(has(src, "__shfl_xor_sync(0xffffffffu,"));
  EXPECT_TRUE(has(src, "*reinterpret_cast<const uint4*>(x + tile_i)")) << "16-byte loads of 4 floats";
  // The scaled sum of squares scales by exact powers of two.
  EXPECT_TRUE(has(src, "tile_exponent(") && has(src, "tile_ldexp(")) << src;
  req.resident_groups = 1, req.barrier_scope = BarrierScope::group;
  const std::string one = source_for(c, req);
  EXPECT_TRUE(has(one, "__launch_bounds__(512)\n")) << signature_of(one);
  EXPECT_TRUE(has(one, "__syncthreads();  // group barrier"));
}

TEST(EmitCuda, SixteenBitVectorsAndPackedCaches) {
  std::vector<uint16_t> x(16 * 2048), y(16 * 2048);
  Call c{Op::softmax, matrix(x.data(), DType::bf16, 16, 2048), matrix(y.data(), DType::bf16, 16, 2048)};
  PlanRequest req;
  req.vector_elems = 8, req.workers_per_program = 128, req.cache_format = CacheFormat::packed;
  const std::string src = source_for(c, req);
  EXPECT_TRUE(has(src, "*reinterpret_cast<const uint4*>(x + tile_i)")) << "8 bf16 in one 16-byte word";
  EXPECT_TRUE(has(src, "tile_bf16_to_f32(((unsigned)")) << "packed halves converted where used";
  EXPECT_TRUE(has(src, "tile_pack2(")) << "bf16 output pairs packed into 32-bit words";
  EXPECT_TRUE(has(src, "tile_exp2(")) << "exp as the hardware's base-2 exponential";
}

TEST(EmitCuda, Float64KernelsComputeInDouble) {
  std::vector<double> x(16 * 2048), y(16 * 2048), w(2048), b(2048);
  Call c{Op::layer_norm, matrix(x.data(), DType::f64, 16, 2048), matrix(y.data(), DType::f64, 16, 2048),
         VectorView{w.data(), DType::f64, 2048}, VectorView{b.data(), DType::f64, 2048}};
  PlanRequest req;
  req.workers_per_program = 128;
  const std::string src = source_for(c, req);
  const std::string sig = signature_of(src);
  EXPECT_TRUE(has(sig, "const double* x  /* f64 */")) << sig;  // y may alias it
  EXPECT_TRUE(has(sig, "double eps")) << sig;
  const std::string body = src.substr(src.find("extern \"C\" __global__"));
  EXPECT_TRUE(has(body, "__shared__ double tile_shared[")) << "8-byte shared slots";
  EXPECT_TRUE(has(body, "*reinterpret_cast<const double2*>(x + tile_i)")) << "16-byte loads of 2 doubles";
  EXPECT_TRUE(has(body, "= make_double2(")) << "16-byte stores of 2 doubles";
  EXPECT_TRUE(has(body, "tile_exponent(") && has(body, "tile_ldexp(")) << "the double overloads";
  EXPECT_TRUE(has(body, "rsqrt(") && !has(body, "rsqrtf(")) << "double-precision library functions";
  EXPECT_TRUE(has(body, "-0x1.e5p+9")) << "the f64 exponent clamp, -970, exactly";
  EXPECT_FALSE(has(body, "float ")) << "no float value in a float64 kernel";
  Call s{Op::softmax, matrix(x.data(), DType::f64, 16, 2048), matrix(y.data(), DType::f64, 16, 2048)};
  const std::string soft = source_for(s, req);
  EXPECT_TRUE(has(soft, " exp(")) << "exp itself: no exp2(x log2 e) product to round";
  EXPECT_FALSE(has(soft.substr(soft.find("extern \"C\" __global__")), "tile_exp2(")) << "not the fp32 MUFU.EX2";
}

}  // namespace
}  // namespace tile
