// The normalisation idiom the lowering recognises (norm_idiom) and the shape of the IR it
// emits for it: scaled statistics for fp32 and bf16 input, plain ones for fp16, the same
// barriers as the reductions had, and the online softmax without a seen-guard.
#include "lower/lower_row_program.hpp"

#include <gtest/gtest.h>

#include <sstream>

#include "ir/printer.hpp"

namespace tile {
namespace {

int count(const std::string& text, const std::string& part) {
  int n = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++n;
  return n;
}

std::string lowered(Op op, DType x, InputCaching caching, int workers = 256) {
  RowProgram program = make_program(op, true, true);
  MappingPlan plan;
  plan.workers_per_program = workers, plan.caching = caching, plan.stripe_unroll = 2;
  KernelSignature sig{x, DType::f32, std::vector<DType>(program.columns().size(), DType::f32)};
  return ir::to_string(lower_row_program(program, sig, plan));
}

TEST(NormIdiom, RecognisesRmsNormAndLayerNorm) {
  for (bool weight : {false, true}) {
    RowProgram rms = make_program(Op::rms_norm, weight, false);
    std::optional<NormIdiom> n = norm_idiom(rms);
    ASSERT_TRUE(n);
    EXPECT_FALSE(n->centred());
    EXPECT_EQ(rms.nodes()[n->element].kind, RowNode::Kind::input);
    EXPECT_EQ(n->centered, n->element);
    EXPECT_EQ(rms.nodes()[n->inv].unary, UnaryFn::rsqrt);
    EXPECT_EQ(rms.nodes()[n->eps].kind, RowNode::Kind::scalar);
    EXPECT_EQ(rms.nodes()[n->square_sum].kind, RowNode::Kind::reduce);

    RowProgram ln = make_program(Op::layer_norm, weight, weight);
    n = norm_idiom(ln);
    ASSERT_TRUE(n);
    EXPECT_TRUE(n->centred());
    EXPECT_EQ(ln.nodes()[n->element].kind, RowNode::Kind::input);
    EXPECT_EQ(ln.nodes()[n->centered].binary, BinaryFn::sub);
    EXPECT_EQ(ln.nodes()[n->mean_sum].a, n->element);
    EXPECT_EQ(ln.nodes()[n->product].binary, BinaryFn::mul);
  }
  EXPECT_FALSE(norm_idiom(make_program(Op::softmax, false, false)));
  EXPECT_FALSE(norm_idiom(make_program(Op::log_softmax, false, false)));
}

TEST(NormIdiom, OnlyWhereEveryIntermediateHasTheIdiomsOwnUse) {
  {  // rsqrt used twice: the product is not its only use
    RowProgram p("twice");
    RowExpr x = p.input();
    RowExpr inv = rsqrt(p.reduce(Reduction::sum, x * x) / p.cols() + p.scalar("eps"));
    p.output(x * inv + inv);
    EXPECT_FALSE(norm_idiom(p));
  }
  {  // the centred value used outside C * C and C * inv: a sum of squares of C, not centred
    RowProgram p("centred_elsewhere");
    RowExpr x = p.input();
    RowExpr c = x - p.reduce(Reduction::sum, x) / p.cols();
    RowExpr inv = rsqrt(p.reduce(Reduction::sum, c * c) / p.cols() + p.scalar("eps"));
    p.output(c * inv + c);
    std::optional<NormIdiom> n = norm_idiom(p);
    ASSERT_TRUE(n);
    EXPECT_FALSE(n->centred());
    EXPECT_EQ(n->element, c.id);
  }
  {  // eps fed by a reduction
    RowProgram p("eps_from_a_reduction");
    RowExpr x = p.input();
    RowExpr inv = rsqrt(p.reduce(Reduction::sum, x * x) / p.cols() + p.reduce(Reduction::max, x));
    p.output(x * inv);
    EXPECT_FALSE(norm_idiom(p));
  }
}

TEST(LowerRowProgram, NormsScaleFp32AndBf16InputButNotFp16) {
  for (Op op : {Op::rms_norm, Op::layer_norm})
    for (InputCaching caching : {InputCaching::registers, InputCaching::reread}) {
      for (DType x : {DType::f32, DType::bf16})
        EXPECT_NE(lowered(op, x, caching).find("scaled by a power of two"), std::string::npos) << op_name(op);
      EXPECT_EQ(lowered(op, DType::f16, caching).find("scaled by a power of two"), std::string::npos) << op_name(op);
      EXPECT_EQ(lowered(op, DType::f16, caching).find("%pinv"), std::string::npos) << op_name(op);
    }
}

TEST(LowerRowProgram, NormsKeepTheirBarrierCounts) {
  // Register-cached LayerNorm: the row's largest |x|, then Chan's merge (its two reductions had
  // two barriers); fp16 needs no scale, so one. RMSNorm and every re-read statistics pass: one.
  EXPECT_EQ(count(lowered(Op::layer_norm, DType::f32, InputCaching::registers), "barrier.group"), 2);
  EXPECT_EQ(count(lowered(Op::layer_norm, DType::f16, InputCaching::registers), "barrier.group"), 1);
  EXPECT_EQ(count(lowered(Op::rms_norm, DType::bf16, InputCaching::registers), "barrier.group"), 1);
  for (Op op : {Op::rms_norm, Op::layer_norm})
    EXPECT_EQ(count(lowered(op, DType::f32, InputCaching::reread), "barrier.group"), 1) << op_name(op);
  // Sub-warp programs merge by shuffles alone.
  EXPECT_EQ(count(lowered(Op::layer_norm, DType::f32, InputCaching::registers, 16), "barrier"), 0);
}

TEST(LowerRowProgram, OnlineSoftmaxRescalesToABaseWithoutAGuard) {
  // Every update of the running sum is arithmetic (rescale and add), never a select that
  // could keep the old sum and drop a NaN; the base of each update is the max or 0.
  for (Op op : {Op::softmax, Op::log_softmax}) {
    std::istringstream lines(lowered(op, DType::f32, InputCaching::reread));
    int updates = 0, bases = 0;
    for (std::string line; std::getline(lines, line);) {
      // The running (or merged total) sum's updates: old sum times exp2((old max - base) * log2 e) + ...
      if (line.find(" = ((%") != std::string::npos && line.find(" * exp2(((%") != std::string::npos) {
        ++updates;
        EXPECT_EQ(line.find('?'), std::string::npos) << line;
      }
      if (line.find("= ((-inf < %m") != std::string::npos && line.find(" : 0)") != std::string::npos) ++bases;
    }
    EXPECT_EQ(updates, 1 + 10) << "one update an iteration, ten butterfly levels";
    EXPECT_EQ(bases, updates);
  }
}

}  // namespace
}  // namespace tile
