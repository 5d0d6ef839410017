// The cost model's byte count equals what the CPU backend's loads actually read, for plans
// whose tails and guard programs issue reads (clamp) and plans that mask them (predicate).
#include "cost/cost_model.hpp"

#include "api/call.hpp"
#include "support/cases.hpp"

namespace tile::testing {
namespace {

TEST(CostModel, CountsInactiveTailAndGuardProgramReadsExactly) {
  int checked = 0;
  for (Op op : {Op::softmax, Op::log_softmax, Op::rms_norm, Op::layer_norm})
    for (TailHandling tail : {TailHandling::predicate, TailHandling::clamp})
      for (InputCaching caching : {InputCaching::registers, InputCaching::reread})
        for (auto [rows, cols, programs] : {std::tuple<int64_t, int64_t, int>{37, 1537, 2}, {5, 1000, 3}, {9, 70, 4}}) {
          Case c;
          c.op = op, c.rows = rows, c.cols = cols, c.seed = 8;
          c.plan.programs_per_group = programs, c.plan.workers_per_program = 64, c.plan.tail = tail, c.plan.caching = caching;
          c.plan.stripe_unroll = 2;
          SCOPED_TRACE(c.name() + " " + to_string(tail) + " " + to_string(caching));
          CaseResult r = run_case(c, Backend::cpu);
          ASSERT_TRUE(r.check.ok) << r.check.first_mismatch;
          PlanInputs in;
          in.op = op, in.rows = rows, in.cols = cols, in.x_stride = in.y_stride = cols;
          RowProgram program = make_program(op, true, true);
          CostEstimate cost = estimate_cost(program, in, r.record.plan);
          EXPECT_EQ(cost.bytes_read, r.record.bytes_loaded);
          if (tail == TailHandling::clamp) {
            EXPECT_GT(cost.bytes_read, cost.input_passes * rows * cols * 4);
          }
          ++checked;
        }
  EXPECT_EQ(checked, 48);
}

TEST(CostModel, RereadPlansReadEveryRowTwice) {
  // Softmax's max and sum, and LayerNorm's mean and variance, share one pass; RMSNorm has one
  // reduction: every operator reads a re-read row once for its statistics, once for its output.
  PlanInputs in;
  in.rows = 4, in.cols = 100000, in.x_stride = in.y_stride = in.cols;
  MappingPlan plan;
  plan.caching = InputCaching::reread, plan.workers_per_program = 256, plan.vector_elems = 4;
  for (Op op : {Op::softmax, Op::log_softmax, Op::rms_norm, Op::layer_norm}) {
    in.op = op;
    EXPECT_EQ(estimate_cost(make_program(op, true, true), in, plan).input_passes, 2) << op_name(op);
  }
  plan.caching = InputCaching::registers;
  EXPECT_EQ(estimate_cost(make_program(Op::layer_norm, true, true), in, plan).input_passes, 1);
}

}  // namespace
}  // namespace tile::testing
