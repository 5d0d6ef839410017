// IRVisitor: the dispatch reaches a handler for every node kind, the default recursion
// reaches every node, handler arguments travel as documented, and the printer and the CUDA
// emitter (both visitors) walk the same statements of lowered kernels.
#include "ir/visitor.hpp"

#include <gtest/gtest.h>

#include <array>
#include <map>

#include "backend/cuda/emit_cuda.hpp"
#include "bind/bind.hpp"
#include "ir/printer.hpp"
#include "lower/lower_row_program.hpp"
#include "testing/host_tensor.hpp"

namespace tile::ir {
namespace {

constexpr int kStmtKinds = int(Stmt::Kind::comment) + 1;   // the last kind
constexpr int kExprKinds = int(Expr::Kind::unpack16) + 1;  // the last kind

// A kernel with every statement and expression kind, some nested in loops and branches.
Kernel every_kind() {
  Kernel k;
  k.name = "every_kind";
  k.buffers = {{"x", DType::bf16, false}, {"y", DType::f32, true}};
  k.params = {{"cols", Type::i64}};
  k.shared = {{"partials", 0, 1, 1}};
  const int i = k.add_reg("i", Type::i64), w = k.add_reg("w", Type::i32), v = k.add_reg("v", Type::f32);
  const int t = k.add_reg("t", Type::f32);
  ExprPtr at = binary(BinOp::add, reg(i, Type::i64), cast(Type::i64, special(Special::lane)));
  std::vector<Stmt> loop;
  loop.push_back(comment("one pair a lane"));
  loop.push_back(load_raw({w}, 0, at, param(0, Type::i64), row_aligned(0, at, 4), false));
  loop.push_back(assign(v, unary(UnOp::neg, unpack16(DType::bf16, reg(w, Type::i32), 1))));
  loop.push_back(shfl_xor(t, v, 1, 32));
  loop.push_back(shfl_idx(v, t, 0, 32));
  loop.push_back(if_(binary(BinOp::eq, special(Special::lane), i32_const(0)),
                     {shared_store(0, i32_const(0), reg(t, Type::f32))},
                     {assign(t, select(b1_const(true), f32_const(1.0), reg(v, Type::f32)))}));
  loop.push_back(barrier(Scope::group));
  loop.push_back(shared_load(t, 0, i32_const(0)));
  loop.push_back(store({t}, 1, at, i64_const(1), b1_const(false)));
  k.body.push_back(for_(i, i64_const(0), param(0, Type::i64), loop));
  // The cluster rung: the partial of the cluster's other group, between two cluster barriers.
  k.ctas_per_cluster = 2;
  k.body.push_back(barrier(Scope::cluster));
  k.body.push_back(remote_shared_load(t, 0, i32_const(0), binary(BinOp::sub, i32_const(1), special(Special::cta_in_cluster))));
  k.body.push_back(barrier(Scope::cluster));
  // An exchange: lane 0 pushes to the other group, which waits for it and reads it.
  k.shared.push_back({"exchange", 1, 2, 0, 1});
  k.body.push_back(if_(binary(BinOp::eq, special(Special::lane), i32_const(0)),
                       {remote_shared_push(1, special(Special::cta_in_cluster),
                                           binary(BinOp::sub, i32_const(1), special(Special::cta_in_cluster)), t)}));
  k.body.push_back(exchange_wait(1));
  k.body.push_back(shared_load(t, 1, i32_const(0)));
  // A staged region: each lane copies a pair of x, waits, and reads it back.
  k.staged = {{"xs", DType::bf16, 64}};
  k.body.push_back(async_copy(0, at, 0, at, 2, param(0, Type::i64), row_aligned(0, at, 4)));
  k.body.push_back(async_commit());
  k.body.push_back(async_wait());
  k.body.push_back(staged_load({v, t}, 0, at, param(0, Type::i64), 0.0f));
  return k;
}

// Records the kind of every node its handlers see, then recurses as the default would.
class KindRecorder : public IRVisitor<KindRecorder> {
 public:
  std::array<int, kStmtKinds> stmts{};
  std::array<int, kExprKinds> exprs{};

  void visit_assign(const Stmt& s) { seen(s, Stmt::Kind::assign); }
  void visit_load(const Stmt& s) { seen(s, Stmt::Kind::load); }
  void visit_store(const Stmt& s) { seen(s, Stmt::Kind::store); }
  void visit_shfl_xor(const Stmt& s) { seen(s, Stmt::Kind::shfl_xor); }
  void visit_shfl_idx(const Stmt& s) { seen(s, Stmt::Kind::shfl_idx); }
  void visit_shared_store(const Stmt& s) { seen(s, Stmt::Kind::shared_store); }
  void visit_shared_load(const Stmt& s) { seen(s, Stmt::Kind::shared_load); }
  void visit_remote_shared_load(const Stmt& s) { seen(s, Stmt::Kind::remote_shared_load); }
  void visit_remote_shared_push(const Stmt& s) { seen(s, Stmt::Kind::remote_shared_push); }
  void visit_exchange_wait(const Stmt& s) { seen(s, Stmt::Kind::exchange_wait); }
  void visit_async_copy(const Stmt& s) { seen(s, Stmt::Kind::async_copy); }
  void visit_async_commit(const Stmt& s) { seen(s, Stmt::Kind::async_commit); }
  void visit_async_wait(const Stmt& s) { seen(s, Stmt::Kind::async_wait); }
  void visit_staged_load(const Stmt& s) { seen(s, Stmt::Kind::staged_load); }
  void visit_barrier(const Stmt& s) { seen(s, Stmt::Kind::barrier); }
  void visit_if(const Stmt& s) { seen(s, Stmt::Kind::if_); }
  void visit_for(const Stmt& s) { seen(s, Stmt::Kind::for_); }
  void visit_comment(const Stmt& s) { seen(s, Stmt::Kind::comment); }
  void visit_constant(const Expr& e) { seen(e, Expr::Kind::constant); }
  void visit_reg(const Expr& e) { seen(e, Expr::Kind::reg); }
  void visit_special(const Expr& e) { seen(e, Expr::Kind::special); }
  void visit_param(const Expr& e) { seen(e, Expr::Kind::param); }
  void visit_unary(const Expr& e) { seen(e, Expr::Kind::unary); }
  void visit_binary(const Expr& e) { seen(e, Expr::Kind::binary); }
  void visit_select(const Expr& e) { seen(e, Expr::Kind::select); }
  void visit_cast(const Expr& e) { seen(e, Expr::Kind::cast); }
  void visit_row_aligned(const Expr& e) { seen(e, Expr::Kind::row_aligned); }
  void visit_unpack16(const Expr& e) { seen(e, Expr::Kind::unpack16); }

 private:
  // The handler named after `kind` must be the one the node's own kind dispatched to.
  void seen(const Stmt& s, Stmt::Kind kind) {
    EXPECT_EQ(int(s.kind), int(kind));
    ++stmts[int(kind)];
    visit_children(s);
  }
  void seen(const Expr& e, Expr::Kind kind) {
    EXPECT_EQ(int(e.kind), int(kind));
    ++exprs[int(kind)];
    visit_children(e);
  }
};

// Overrides nothing but two leaves: the default recursion must still find every one of them.
class LeafCounter : public IRVisitor<LeafCounter> {
 public:
  int constants = 0, comments = 0;
  void visit_constant(const Expr&) { ++constants; }
  void visit_comment(const Stmt&) { ++comments; }
};

// The count by kind written out without the visitor: every field that holds a node.
void hand_count(const Expr& e, std::array<int, kExprKinds>& exprs) {
  ++exprs[int(e.kind)];
  for (const ExprPtr& a : e.args) hand_count(*a, exprs);
}
void hand_count(const std::vector<Stmt>& body, std::array<int, kStmtKinds>& stmts, std::array<int, kExprKinds>& exprs) {
  for (const Stmt& s : body) {
    ++stmts[int(s.kind)];
    for (const ExprPtr& e : {s.value, s.index, s.valid, s.aligned, s.cond, s.begin, s.end, s.cta, s.at})
      if (e) hand_count(*e, exprs);
    hand_count(s.body, stmts, exprs);
    hand_count(s.else_body, stmts, exprs);
  }
}

TEST(Visitor, DispatchReachesAHandlerForEveryKind) {
  const Kernel k = every_kind();
  KindRecorder rec;
  for (const Stmt& s : k.body) rec.visit(s);
  for (int kind = 0; kind < kStmtKinds; ++kind) EXPECT_GT(rec.stmts[kind], 0) << "statement kind " << kind;
  for (int kind = 0; kind < kExprKinds; ++kind) EXPECT_GT(rec.exprs[kind], 0) << "expression kind " << kind;
}

TEST(Visitor, DefaultRecursionReachesNestedLeaves) {
  const Kernel k = every_kind();
  std::array<int, kStmtKinds> stmts{};
  std::array<int, kExprKinds> exprs{};
  hand_count(k.body, stmts, exprs);
  LeafCounter leaves;
  for (const Stmt& s : k.body) leaves.visit(s);
  EXPECT_EQ(leaves.constants, exprs[int(Expr::Kind::constant)]);
  EXPECT_EQ(leaves.comments, stmts[int(Stmt::Kind::comment)]);
  EXPECT_EQ(leaves.constants, 13);  // the literals written in every_kind(), one by one
}

// Statement arguments reach the statements of nested blocks; the if and the for handlers
// pass their depth + 1 on, and a barrier inside the if inside the loop sees 2.
class Depth : public IRVisitor<Depth> {
 public:
  std::map<int, int> barriers_at;  // depth -> barriers
  void visit_if(const Stmt& s, int depth) {
    visit_block(s.body, depth + 1);
    visit_block(s.else_body, depth + 1);
  }
  void visit_for(const Stmt& s, int depth) { visit_block(s.body, depth + 1); }
  void visit_barrier(const Stmt&, int depth) { ++barriers_at[depth]; }
};

TEST(Visitor, ArgumentsTravelToNestedStatements) {
  Kernel k = every_kind();
  k.body.push_back(barrier(Scope::group));
  k.body[0].body.push_back(if_(b1_const(true), {}, {barrier(Scope::program)}));
  Depth d;
  for (const Stmt& s : k.body) d.visit(s, 0);
  EXPECT_EQ(d.barriers_at, (std::map<int, int>{{0, 3}, {1, 1}, {2, 1}}));  // two of every_kind()'s cluster barriers
}

// Lowered kernels of the built-in operators and of a reduction over the rows (whose finish
// kernel is a second lowered kernel), over plans that cache or re-read, pack programs, span
// one or several warps or the groups of a cluster and use group or program barriers.
std::vector<Kernel> lowered_kernels() {
  static RowProgram column_sum = [] {
    RowProgram p("column_sum");
    Operand x = p.row_in("x"), dy = p.row_in("dy");
    Operand dw = p.col_out("dw", {DType::f32});
    p.store(dw, p.reduce1(Axis::rows, monoid::sum(), p.load(x) * p.load(dy)));
    return p;
  }();
  testing::HostMatrix x(DType::bf16, 9, 300, 300), dy(DType::bf16, 9, 300, 300), y(DType::f32, 9, 300, 300);
  testing::HostVector w(DType::f32, 300), b(DType::f32, 300), dw(DType::f32, 300);
  std::vector<Kernel> out;
  auto add = [&](const RowProgram& p, const Args& args) {
    const BoundCall call = bind(p, args);
    for (InputCaching caching : {InputCaching::registers, InputCaching::reread})
      for (int workers : {32, 128}) {
        PlanRequest request;  // the policy fills the fields left unset
        request.caching = caching, request.workers_per_program = workers, request.programs_per_group = 2;
        if (caching == InputCaching::registers && workers > 32) request.barrier_scope = BarrierScope::program;
        if (caching == InputCaching::reread) request.tail = TailHandling::clamp;
        LoweredProgram lp = lower_row_program(p, call.signature(), choose_plan(call.plan_inputs(), request));
        out.push_back(lp.main.kernel);
        if (lp.finish) out.push_back(lp.finish->kernel);
      }
  };
  for (Op op : {Op::softmax, Op::log_softmax, Op::rms_norm, Op::layer_norm}) {
    Args args = Args().set("x", x.view()).set("y", y.view());
    if (op == Op::rms_norm || op == Op::layer_norm) args.set("weight", w.view());
    if (op == Op::layer_norm) args.set("bias", b.view());
    add(builtin_program(op), args);
    // The row split over a cluster of 4 groups, cached in registers or staged in shared memory,
    // with either merge; and staged by two programs a group.
    const BoundCall call = bind(builtin_program(op), args);
    for (InputCaching caching : {InputCaching::registers, InputCaching::shared})
      for (MergeStrategy merge : {MergeStrategy::staged, MergeStrategy::combine}) {
        PlanRequest request;
        request.ctas_per_program = 4, request.workers_per_program = 64, request.programs_per_group = 1;
        request.caching = caching, request.merge = merge;
        out.push_back(lower_row_program(builtin_program(op), call.signature(), choose_plan(call.plan_inputs(), request))
                          .main.kernel);
      }
    PlanRequest staged;
    staged.caching = InputCaching::shared, staged.workers_per_program = 64, staged.programs_per_group = 2;
    out.push_back(
        lower_row_program(builtin_program(op), call.signature(), choose_plan(call.plan_inputs(), staged)).main.kernel);
  }
  add(column_sum, Args().set("x", x.view()).set("dy", dy.view()).set("dw", dw.view()));
  return out;
}

size_t occurrences(const std::string& text, const std::string& part) {
  size_t n = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + part.size())) ++n;
  return n;
}

TEST(Visitor, CountsAgreeWithAHandCountAndThePrintedIR) {
  const std::vector<Kernel> kernels = lowered_kernels();
  ASSERT_GE(kernels.size(), 20u);
  std::array<int, kStmtKinds> all{};
  for (const Kernel& k : kernels) {
    SCOPED_TRACE(k.name);
    std::array<int, kStmtKinds> stmts{};
    std::array<int, kExprKinds> exprs{};
    hand_count(k.body, stmts, exprs);
    for (int kind = 0; kind < kStmtKinds; ++kind) all[kind] += stmts[kind];
    KindRecorder rec;
    for (const Stmt& s : k.body) rec.visit(s);
    EXPECT_EQ(rec.stmts, stmts);
    EXPECT_EQ(rec.exprs, exprs);
    // The dump has one line per statement of these kinds.
    const std::string text = to_string(k);
    EXPECT_EQ(occurrences(text, "barrier."), size_t(stmts[int(Stmt::Kind::barrier)]));
    EXPECT_EQ(occurrences(text, "= shfl_xor("), size_t(stmts[int(Stmt::Kind::shfl_xor)]));
    EXPECT_EQ(occurrences(text, "= shfl_idx("), size_t(stmts[int(Stmt::Kind::shfl_idx)]));
    EXPECT_EQ(occurrences(text, "} = load"), size_t(stmts[int(Stmt::Kind::load)]));
    EXPECT_EQ(occurrences(text, "for ("), size_t(stmts[int(Stmt::Kind::for_)]));
    EXPECT_EQ(occurrences(text, "] at cta "), size_t(stmts[int(Stmt::Kind::remote_shared_push)]));
    EXPECT_EQ(occurrences(text, "exchange_wait "), size_t(stmts[int(Stmt::Kind::exchange_wait)]));
    EXPECT_EQ(occurrences(text, "async_copy"), size_t(stmts[int(Stmt::Kind::async_copy)]));
    EXPECT_EQ(occurrences(text, "async_commit"), size_t(stmts[int(Stmt::Kind::async_commit)]));
    EXPECT_EQ(occurrences(text, "} = staged_load"), size_t(stmts[int(Stmt::Kind::staged_load)]));
  }
  // Every kind but the remote load, which hand-written kernels use (the lowering pushes).
  for (int kind = 0; kind < kStmtKinds; ++kind)
    if (kind != int(Stmt::Kind::remote_shared_load)) {
      EXPECT_GT(all[kind], 0) << "no statement of kind " << kind;
    }
}

// The CUDA emitter derives from the printer: the kernel body of the .cu file must have the
// dump's comments in the same order and one CUDA construct per barrier, shuffle and loop.
TEST(Visitor, PrinterAndCudaEmitterWalkTheSameStatements) {
  size_t compared = 0;
  for (const Kernel& k : lowered_kernels()) {
    SCOPED_TRACE(k.name);
    const std::string dump = to_string(k), cu = cuda::emit_cuda(k);
    const std::string ir = dump.substr(dump.find("\n{\n"));                  // past the header
    const std::string body = cu.substr(cu.find("extern \"C\" __global__"));  // past the device helpers
    auto comments = [](const std::string& text) {
      std::vector<std::string> out;
      for (size_t at = text.find("// "); at != std::string::npos; at = text.find("// ", at + 1)) {
        const size_t line_start = text.rfind('\n', at) + 1;
        if (text.find_first_not_of(' ', line_start) == at) out.push_back(text.substr(at, text.find('\n', at) - at));
      }
      return out;
    };
    EXPECT_EQ(comments(body), comments(ir));
    compared += comments(ir).size();
    EXPECT_EQ(occurrences(body, "__syncthreads();"), occurrences(ir, "barrier.group"));
    EXPECT_EQ(occurrences(body, "tile_named_barrier("), occurrences(ir, "barrier.program"));
    EXPECT_EQ(occurrences(body, "__shfl_xor_sync("), occurrences(ir, "= shfl_xor("));
    EXPECT_EQ(occurrences(body, "__shfl_sync("), occurrences(ir, "= shfl_idx("));
    EXPECT_EQ(occurrences(body, "for ("), occurrences(ir, "for ("));
    EXPECT_EQ(occurrences(body, "tile_cluster_barrier();"),
              occurrences(ir, "barrier.cluster") - occurrences(ir, "barrier.cluster."));
    EXPECT_EQ(occurrences(body, "tile_cluster_arrive();"), occurrences(ir, "barrier.cluster.arrive"));
    EXPECT_EQ(occurrences(body, "tile_cluster_wait();"), occurrences(ir, "barrier.cluster.wait"));
    EXPECT_EQ(occurrences(body, " = tile_remote_shared_load(&tile_shared["), occurrences(ir, "] of cta "));
    EXPECT_EQ(occurrences(body, "tile_remote_shared_push(&tile_shared["), occurrences(ir, "] at cta "));
    EXPECT_EQ(occurrences(body, "tile_exchange_wait(&tile_exchange["), occurrences(ir, "exchange_wait "));
    EXPECT_EQ(occurrences(body, " = tile_shared["), occurrences(ir, " = shared ") - occurrences(ir, "] of cta "));
  }
  EXPECT_GT(compared, 0u);
}

}  // namespace
}  // namespace tile::ir
