// The cost model's byte count equals what the CPU backend's loads actually read, for plans
// whose tails and guard programs issue reads (clamp) and plans that mask them (predicate).
#include "cost/cost_model.hpp"

#include "bind/bind.hpp"
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
          HostMatrix x(c.x, rows, cols, cols), y(c.y, rows, cols, cols);
          HostVector w(c.w, cols), b(c.w, cols);
          Call call{op, x.view(), y.view()};
          if (op == Op::rms_norm || op == Op::layer_norm) call.weight = w.view();
          if (op == Op::layer_norm) call.bias = b.view();
          CostEstimate cost = estimate_cost(builtin_program(op), bind(builtin_program(op), to_args(call)), r.record.plan);
          EXPECT_EQ(cost.bytes_read, r.record.bytes_loaded);
          if (tail == TailHandling::clamp) {
            EXPECT_GT(cost.bytes_read, cost.input_passes * rows * cols * 4);
          }
          ++checked;
        }
  EXPECT_EQ(checked, 48);
}

TEST(CostModel, RereadPlansReadEveryRowTwice) {
  // Softmax's max and sum, and LayerNorm's mean and variance, are one reduction each; RMSNorm
  // has one: every operator reads a re-read row once for its statistics, once for its output.
  HostMatrix x(DType::f32, 4, 100000, 100000), y(DType::f32, 4, 100000, 100000);
  HostVector w(DType::f32, 100000), b(DType::f32, 100000);
  MappingPlan plan;
  plan.caching = InputCaching::reread, plan.workers_per_program = 256, plan.vector_elems = 4;
  for (Op op : {Op::softmax, Op::log_softmax, Op::rms_norm, Op::layer_norm}) {
    Call call{op, x.view(), y.view()};
    if (op == Op::rms_norm || op == Op::layer_norm) call.weight = w.view();
    if (op == Op::layer_norm) call.bias = b.view();
    EXPECT_EQ(estimate_cost(builtin_program(op), bind(builtin_program(op), to_args(call)), plan).input_passes, 2) << op_name(op);
  }
  plan.caching = InputCaching::registers;
  Call ln{Op::layer_norm, x.view(), y.view(), w.view(), b.view()};
  EXPECT_EQ(estimate_cost(builtin_program(Op::layer_norm), bind(builtin_program(Op::layer_norm), to_args(ln)), plan).input_passes, 1);
}

}  // namespace
}  // namespace tile::testing
