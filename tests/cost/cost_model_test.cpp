// The cost model's byte count equals what the CPU backend's loads actually read, for plans
// whose tails and guard programs issue reads (clamp) and plans that mask them (predicate); its
// passes over the row are the lowered kernel's.
#include "cost/cost_model.hpp"

#include <map>

#include "bind/bind.hpp"
#include "ir/visitor.hpp"
#include "lower/lower_row_program.hpp"
#include "support/cases.hpp"

namespace tile::testing {
namespace {

// The load statements of one buffer by their innermost enclosing loop, numbered in visiting
// order (-1: outside every loop). Loops under a branch are counted apart (`branch_loops`): a
// worker's exact fallback from a monoid's fast path, which only rows outside the fast path's
// range take, and which the model leaves out.
class LoadsByLoop : public ir::IRVisitor<LoadsByLoop> {
 public:
  explicit LoadsByLoop(int buffer) : buffer_(buffer) {}
  std::map<int, int> loads;
  int branch_loops = 0;

  // The path where every fast-path test passes is the one counted: the `then` side of
  // `if (all pass) {the rest of the row} else {the exact path, the rest of the row}`; an `if`
  // without `else` (the exact path of an earlier level) is a branch.
  void visit_if(const ir::Stmt& s, int loop) {
    if (!s.else_body.empty()) visit_block(s.body, loop);
    ++branched_;
    visit_block(s.else_body.empty() ? s.body : s.else_body, loop);
    --branched_;
  }
  void visit_for(const ir::Stmt& s, int) {
    if (branched_) {
      ++branch_loops;
      return;
    }
    visit_block(s.body, loops_++);
  }
  void visit_load(const ir::Stmt& s, int loop) {
    if (s.buffer == buffer_) ++loads[loop];
  }

 private:
  int buffer_, loops_ = 0, branched_ = 0;
};

TEST(CostModel, CountsInactiveTailAndGuardProgramReadsExactly) {
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
        }
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

// The model counts a row input's passes from the program (one per level of reductions over the
// columns, plus the output pass); the lowering must issue exactly those: a re-read plan one
// loop per pass with stripe_unroll loads of x each, a cached plan one load per stripe.
TEST(CostModel, InputPassesAreTheLoweredKernelsLoopsOverTheRow) {
  for (Op op : {Op::softmax, Op::log_softmax, Op::rms_norm, Op::layer_norm})
    for (DType dtype : {DType::f32, DType::bf16})
      for (InputCaching caching : {InputCaching::registers, InputCaching::reread})
        for (int unroll : {1, 2}) {
          HostMatrix x(dtype, 6, 1000, 1000), y(dtype, 6, 1000, 1000);
          HostVector w(dtype, 1000), b(dtype, 1000);
          Call call{op, x.view(), y.view()};
          if (op == Op::rms_norm || op == Op::layer_norm) call.weight = w.view();
          if (op == Op::layer_norm) call.bias = b.view();
          const RowProgram& program = builtin_program(op);
          const BoundCall bound = bind(program, to_args(call));
          PlanRequest request;
          request.caching = caching, request.workers_per_program = 64, request.stripe_unroll = unroll;
          const MappingPlan plan = choose_plan(bound.plan_inputs(), request);
          SCOPED_TRACE(op_name(op) + " " + std::string(dtype_name(dtype)) + " " + plan.to_json());
          const CostEstimate cost = estimate_cost(program, bound, plan);
          const ir::Kernel k = lower_row_program(program, bound.signature(), plan).main.kernel;
          int xb = 0;
          while (k.buffers[xb].name != "x") ++xb;
          LoadsByLoop v(xb);
          for (const ir::Stmt& s : k.body) v.visit(s, -1);
          // LayerNorm's program fast path loads the row's head (column 0) once, outside the loops.
          int head = 0;
          for (const std::vector<int>& level : reduction_levels(program)) head += reads_row_head(program, level, plan);
          EXPECT_EQ(head, op == Op::layer_norm ? 1 : 0);
          if (head > 0) {
            EXPECT_EQ(v.loads[-1], (caching == InputCaching::reread ? 0 : plan.stripes) + head);
            if (v.loads[-1] == head) v.loads.erase(-1);
            else v.loads[-1] -= head;
          }
          if (caching == InputCaching::reread) {
            EXPECT_EQ(int(v.loads.size()), cost.input_passes);
            // The norms' statistics have a fast path; their exact path has its own statistics
            // loop and output loop. Softmax has none.
            EXPECT_EQ(v.branch_loops, op == Op::rms_norm || op == Op::layer_norm ? 2 : 0);
            for (auto [loop, loads] : v.loads) {
              EXPECT_GE(loop, 0);
              EXPECT_EQ(loads, plan.stripe_unroll);
            }
          } else {
            EXPECT_EQ(cost.input_passes, 1);
            EXPECT_EQ(v.loads, (std::map<int, int>{{-1, plan.stripes}}));
          }
        }
}

}  // namespace
}  // namespace tile::testing
