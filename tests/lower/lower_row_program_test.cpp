// Property test of the lowering: random row programs x random valid plans, run by the CPU
// executor, against the float64 evaluation of the same program (tile::reference). Programs mix
// several row inputs, per-column and per-row inputs, reductions of every monoid over the
// columns (at one or two levels, the second sometimes with a fast path of its own or over values
// the first level's chunk graph computes too), reductions over the rows, per-row and per-column
// outputs; the
// plans come from the whole mapping family (caching, widths, vectors, packing, barrier scopes,
// tails, alignment, cache formats).
#include "lower/lower_row_program.hpp"

#include <gtest/gtest.h>

#include <cstdlib>
#include <functional>
#include <limits>
#include <random>

#include "bind/bind.hpp"
#include "ir/printer.hpp"
#include "ir/visitor.hpp"
#include "support/error_of.hpp"
#include "testing/host_tensor.hpp"
#include "tile/tile.hpp"
#include "tile/training.hpp"

namespace tile {
namespace {

struct Generated {
  RowProgram program{"generated"};
  bool has_col = false, has_row_scalar = false, has_col_out = false, has_row_scalar_out = false, has_total = false;
  int row_inputs = 1;
};

// Element expressions defined for every input of N(0, 1) and free of overflow: no exp of large
// values, no log, root or division near zero. They may cancel (a - b, log(|a| + 1) of a tiny
// a): the reference's simulated rounding follows that.
RowExpr random_element(std::mt19937_64& rng, RowProgram& p, const std::vector<RowExpr>& leaves, int depth) {
  auto pick = [&](int n) { return int(rng() % uint64_t(n)); };
  if (depth == 0 || pick(3) == 0) return leaves[pick(int(leaves.size()))];
  RowExpr a = random_element(rng, p, leaves, depth - 1), b = random_element(rng, p, leaves, depth - 1);
  switch (pick(13)) {
    case 0: return a + b;
    case 1: return a - b;
    case 2: return a * b;
    case 3: return a / (abs(b) + 1.0);
    case 4: return tanh(a);
    case 5: return max(a, b);
    case 6: return log(abs(a) + 1.0);
    case 7: return exp(tanh(a) * 2.0);
    case 8: return sqrt(a * a + 0.25);
    case 9: return rsqrt(abs(a) + 0.5);
    case 10: return min(a, -b);
    case 11: return p.select(logical_or(le(a, b * 0.5), logical_and(ne(a, b), logical_not(lt(b, a)))), a * b, -a);
    default: return p.select(lt(a, b), a, b * 0.5);
  }
}

Generated generate(uint64_t seed) {
  std::mt19937_64 rng(seed);
  auto pick = [&](int n) { return int(rng() % uint64_t(n)); };
  Generated g;
  RowProgram& p = g.program;
  g.row_inputs = 1 + pick(2);
  std::vector<RowExpr> leaves;
  std::vector<Operand> row_ins;
  for (int i = 0; i < g.row_inputs; ++i) {
    row_ins.push_back(p.row_in("x" + std::to_string(i)));
    leaves.push_back(p.load(row_ins.back()));
  }
  Operand y = p.row_out("y", DTypeSet::floats(), pick(2) ? row_ins[0] : Operand{});
  g.has_col = pick(2);
  if (g.has_col) leaves.push_back(p.load_or(p.col_in("w", DTypeSet::floats(), true), 1.0));
  g.has_row_scalar = pick(3) == 0;
  if (g.has_row_scalar) leaves.push_back(leaves[0] * p.load(p.row_scalar_in("r", DTypeSet::floats())));
  Operand s = p.scalar_in("s", ValueType::f32, 0.5);
  leaves.push_back(leaves[0] * p.load(s));
  if (pick(3) == 0) leaves.push_back(to_f32(p.col_index()) / p.cols());

  // Reductions over the columns: one level, sometimes a second that uses the first.
  std::vector<RowExpr> row_values;
  std::vector<RowExpr> squares;  // x * x of a sum of squares' input x: a node its chunk graph shares
  const int reductions = 1 + pick(2);
  for (int k = 0; k < reductions; ++k) {
    RowExpr in = random_element(rng, p, leaves, 2);
    switch (pick(6)) {
      case 0: row_values.push_back(p.reduce1(Axis::cols, monoid::sum(), in) / p.cols()); break;
      case 1: row_values.push_back(p.reduce1(Axis::cols, monoid::max(), in)); break;
      case 2: {
        auto [m, e] = p.reduce2(Axis::cols, monoid::online_softmax(), in);
        row_values.push_back(m + log(e));
        break;
      }
      case 3: {
        std::vector<RowExpr> st = p.reduce(Axis::cols, monoid::mean_m2(), {in});
        row_values.push_back(st[1] + sqrt(st[2] / p.cols()));
        break;
      }
      case 4: {  // LayerNorm's: mean 2^e and m2 4^e
        std::vector<RowExpr> st = p.reduce(Axis::cols, monoid::scaled_mean_m2(), {in});
        row_values.push_back(ldexp(st[2], st[1]) + sqrt(ldexp(st[3], st[1] * 2.0) / p.cols()));
        break;
      }
      default: {
        auto [m, q] = p.reduce2(Axis::cols, monoid::scaled_sum_squares(), in);
        row_values.push_back(ldexp(sqrt(q / p.cols()), m));  // the rms, whichever exponent holds it
        squares.push_back(in * in);
        break;
      }
    }
  }
  if (pick(2)) {  // a second level
    RowExpr centered = leaves[0] - row_values[0];
    if (pick(2)) {
      row_values.push_back(p.reduce1(Axis::cols, monoid::sum(), centered * centered) / p.cols());
    } else {  // a second level with a fast path of its own
      auto [m, q] = p.reduce2(Axis::cols, monoid::scaled_sum_squares(), centered);
      row_values.push_back(ldexp(sqrt(q / p.cols()), m));
    }
  } else if (!squares.empty() && pick(2)) {  // a second level over the squares the first one took
    row_values.push_back(p.reduce1(Axis::cols, monoid::sum(), squares[0] * tanh(row_values[0])) / p.cols());
  }
  RowExpr row_value = row_values[pick(int(row_values.size()))];
  for (size_t k = 0; k < row_values.size(); ++k) row_value = row_value + row_values[k] * 0.25;
  p.store(y, random_element(rng, p, leaves, 1) * tanh(row_value) + row_value);
  g.has_row_scalar_out = pick(2);
  if (g.has_row_scalar_out) p.store(p.row_scalar_out("stat", {DType::f32}, false), row_value);
  g.has_col_out = pick(3) == 0;
  if (g.has_col_out) {
    RowExpr grad = p.reduce1(Axis::rows, monoid::sum(), leaves[0] * random_element(rng, p, leaves, 1));
    // Sometimes plus a row value's total over the rows, one value in every column.
    if (p.nodes()[size_t(row_value.id)].shape.rows && pick(3) == 0)
      grad = grad + p.reduce1(Axis::rows, monoid::sum(), row_value) * 0.5;
    p.store(p.col_out("grad"), grad);
  }
  // A row value that does not vary along the rows (made of the column index and constants
  // alone) cannot be reduced over the rows: the spec refuses it, so such a program has no total.
  g.has_total = pick(4) == 0 && p.nodes()[size_t(row_value.id)].shape.rows;
  if (g.has_total) p.store(p.scalar_out("total"), p.reduce1(Axis::rows, monoid::max(), row_value));
  return g;
}

// TILE_RANDOM_PROGRAMS=N and TILE_RANDOM_PROGRAMS_SEED=S run N programs from seed S instead of
// 200 from 1000 (a longer search; the counts below scale with N).
int64_t env_or(const char* name, int64_t fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::stoll(v) : fallback;
}

TEST(LowerRowProgram, RandomProgramsOnRandomPlansMatchTheFloat64Evaluation) {
  const int kPrograms = int(env_or("TILE_RANDOM_PROGRAMS", 200)), kPlansEach = 8;
  const uint64_t first_seed = uint64_t(env_or("TILE_RANDOM_PROGRAMS_SEED", 1000));
  int cases = 0, cluster_cases = 0, unlooped_totals = 0;
  for (int n = 0; n < kPrograms; ++n) {
    const uint64_t seed = first_seed + n;
    Generated g = generate(seed);
    std::mt19937_64 rng(seed * 7);
    auto pick = [&](int64_t lo, int64_t hi) { return lo + int64_t(rng() % uint64_t(hi - lo + 1)); };
    const int64_t rows = pick(1, 9), cols = pick(0, 2) == 0 ? pick(1, 40) : pick(41, 3000);
    const DType dt = pick(0, 2) == 0 ? DType::bf16 : DType::f32;
    std::vector<testing::HostMatrix> xs;
    for (int i = 0; i < g.row_inputs; ++i) {
      xs.emplace_back(dt, rows, cols, cols + (pick(0, 1) ? 0 : 4));
      xs.back().fill_random(rng);
    }
    testing::HostMatrix y(DType::f32, rows, cols, cols);
    testing::HostVector w(DType::f32, cols), r(DType::f32, rows), stat(DType::f32, rows), grad(DType::f32, cols),
        total(DType::f32, 1);
    w.fill_random(rng, 1.0, 0.5);
    r.fill_random(rng, 1.0, 0.5);
    Args args;
    for (int i = 0; i < g.row_inputs; ++i) args.set("x" + std::to_string(i), xs[i].view());
    args.set("y", y.view());
    if (g.has_col) args.set("w", w.view());
    if (g.has_row_scalar) args.set("r", r.view());
    if (g.has_row_scalar_out) args.set("stat", stat.view());
    if (g.has_col_out) args.set("grad", grad.view());
    if (g.has_total) args.set("total", total.view());
    const Reference want = reference(g.program, args);
    const BoundCall call = bind(g.program, args);
    std::vector<MappingPlan> family = mapping_family(call.plan_inputs());
    ASSERT_FALSE(family.empty());
    for (int k = 0; k < kPlansEach; ++k) {
      MappingPlan plan = family[size_t(rng() % family.size())];
      // Variations the family leaves at their defaults.
      PlanRequest req = PlanRequest::exactly(plan);
      if (pick(0, 1)) req.tail = TailHandling::clamp;
      if (pick(0, 2) == 0 && plan.workers_per_program % 32 == 0 && plan.programs_per_group < 16)
        req.barrier_scope = BarrierScope::program;
      if (dt == DType::bf16 && plan.caching == InputCaching::registers && plan.vector_elems % 2 == 0 && pick(0, 1))
        req.cache_format = CacheFormat::packed;
      if (plan.caching == InputCaching::registers && pick(0, 2) == 0)
        req.column_loads = plan.grid_limit > 0 && pick(0, 1) ? ColumnLoads::once : ColumnLoads::with_row;
      // The row split over the groups of a cluster (stripes recomputed to cover the row once), its
      // slice cached or re-read.
      if (plan.caching != InputCaching::shared && plan.programs_per_group == 1 && plan.workers_per_program % 32 == 0 &&
          !g.has_col_out && pick(0, 2) == 0) {
        req.ctas_per_program = int(pick(2, 5));
        req.stripes.reset();
        ++cluster_cases;
      }
      // A total alone (a row value reduced over the rows) runs on a looping grid or on one row
      // block a group, a workspace slot each.
      if (g.has_total && !g.has_col_out && pick(0, 1)) req.grid_limit = pick(0, 1) ? 0 : int(pick(1, 4));
      y.poison();
      SCOPED_TRACE("program seed " + std::to_string(seed) + ", " + std::to_string(rows) + " x " + std::to_string(cols) +
                   " " + std::string(dtype_name(dt)) + ", plan " + PlanRequest::exactly(plan).to_json() + "\n" +
                   g.program.to_string());
      try {
        run(g.program, args, {req, nullptr, Backend::cpu});
      } catch (const Error& e) {
        // A variation may be invalid for this call (e.g. program barriers at this packing).
        EXPECT_NE(std::string(e.what()).find("plan."), std::string::npos) << e.what();
        continue;
      }
      OracleCheck check = check_against_reference(g.program, args, want);
      EXPECT_TRUE(check.ok) << check.first_mismatch;
      EXPECT_TRUE(y.outside_untouched());
      ++cases;
      unlooped_totals += g.has_total && req.grid_limit == 0;
    }
  }
  std::printf("%d random programs, %d program x plan cases checked (%d on clusters, %d totals on one row block a group)\n",
              kPrograms, cases, cluster_cases, unlooped_totals);
  EXPECT_GT(cases, kPrograms * kPlansEach / 2);
  EXPECT_GT(cluster_cases, kPrograms / 10);
  EXPECT_GT(unlooped_totals, kPrograms / 10);
}

// Statements of `kind` (of buffer `buffer` where it is a load), nested ones included.
int count_stmts(const std::vector<ir::Stmt>& body, ir::Stmt::Kind kind, int buffer = -1) {
  int n = 0;
  for (const ir::Stmt& s : body) {
    n += s.kind == kind && (buffer < 0 || s.buffer == buffer);
    n += count_stmts(s.body, kind, buffer) + count_stmts(s.else_body, kind, buffer);
  }
  return n;
}

// A group that loops over row blocks (grid_limit) merges each block's reductions through two
// copies of its shared slots, alternating by row: a row's stores never meet the previous row's
// loads (the executor reports a race where one could overtake the other), so the merge's barrier
// is the row's only one. After it every warp folds the warps' partials over the fewest lanes that
// hold them: two shuffle steps for four warps, and for three (a lane past the last warp takes the
// identity), after the five of the warp's own butterfly.
TEST(LowerRowProgram, RowBlockLoopsAlternateTwoCopiesOfTheMergeSlots) {
  RowProgram p("centered");
  Operand x = p.row_in("x"), y = p.row_out("y");
  RowExpr v = p.load(x);
  p.store(y, v - p.reduce1(Axis::cols, monoid::sum(), v) / p.cols());
  std::mt19937_64 rng(6);
  testing::HostMatrix a(DType::f32, 9, 1000, 1000), out(DType::f32, 9, 1000, 1000);
  a.fill_random(rng);
  Args args;
  args.set("x", a.view()).set("y", out.view());
  const BoundCall call = bind(p, args);
  for (BarrierScope scope : {BarrierScope::group, BarrierScope::program})
    for (int workers : {128, 96}) {
      PlanRequest req;
      req.grid_limit = 2, req.programs_per_group = 2, req.workers_per_program = workers, req.barrier_scope = scope;
      req.merge = MergeStrategy::combine;
      const MappingPlan plan = choose_plan(call.plan_inputs(), req);
      SCOPED_TRACE(plan.to_json());
      const ir::Kernel k = lower_row_program(p, call.signature(), plan).main.kernel;
      int loops = 0;
      for (const ir::Stmt& s : k.body) {
        if (s.kind != ir::Stmt::Kind::for_) continue;
        ++loops;
        EXPECT_EQ(count_stmts(s.body, ir::Stmt::Kind::barrier, -1), 1);
        EXPECT_EQ(count_stmts(s.body, ir::Stmt::Kind::shfl_xor, -1), 5 + 2);
      }
      EXPECT_EQ(loops, 1);
      out.poison();
      const LaunchRecord rec = run(p, args, {req, nullptr, Backend::cpu});
      EXPECT_EQ(rec.groups, 2);
      EXPECT_TRUE(check_against_reference(p, args).ok);
      EXPECT_TRUE(out.outside_untouched());
    }
}

// A row split over the C groups of a cluster: each group caches (or re-reads) its slice, and the partial
// states merge through exchange regions in distributed shared memory, every warp pushing its
// states to every group (the executor reports a read before the wait, a second push into a slot
// and a push into a group that exited). Two clusters looping over the five rows (grid_limit 2)
// take one phase of their exchange regions a row.
TEST(LowerRowProgram, ClusterProgramsSplitEachRowOverTheGroupsOfACluster) {
  RowProgram p("centered_softmax");
  Operand x = p.row_in("x"), y = p.row_out("y");
  Operand stat = p.row_scalar_out("stat", {DType::f32}, false);
  RowExpr v = p.load(x);
  auto [m, e] = p.reduce2(Axis::cols, monoid::online_softmax(), v);
  RowExpr centered = v - p.reduce1(Axis::cols, monoid::sum(), v) / p.cols();
  RowExpr var = p.reduce1(Axis::cols, monoid::sum(), centered * centered) / p.cols();
  p.store(y, exp(v - m) / e + centered * rsqrt(var + 1.0));
  p.store(stat, m + log(e));
  std::mt19937_64 rng(12);
  int launched = 0;
  for (int64_t cols : {100, 4099, 16384}) {
    testing::HostMatrix a(DType::bf16, 5, cols, cols), out(DType::f32, 5, cols, cols);
    testing::HostVector s(DType::f32, 5);
    a.fill_random(rng);
    Args args;
    args.set("x", a.view()).set("y", out.view()).set("stat", s.view());
    for (int C : {2, 3, 16})
      for (int workers : {32, 128})
        for (MergeStrategy merge : {MergeStrategy::staged, MergeStrategy::combine})
          for (int grid_limit : {0, 2})
            for (InputCaching caching : {InputCaching::registers, InputCaching::reread}) {
              if (caching == InputCaching::reread && merge == MergeStrategy::staged) continue;  // refused: one pass a stage
              PlanRequest req;
              req.ctas_per_program = C, req.workers_per_program = workers, req.programs_per_group = 1;
              req.caching = caching, req.merge = merge, req.grid_limit = grid_limit;
              SCOPED_TRACE(std::to_string(cols) + " cols, plan " + req.to_json());
              out.poison();
              LaunchRecord rec;
              try {
                rec = run(p, args, {req, nullptr, Backend::cpu});
              } catch (const Error& e) {  // a slice beyond the private budget at this width
                EXPECT_NE(std::string(e.what()).find("plan.caching': expected a cached row slice"), std::string::npos) << e.what();
                continue;
              }
              ++launched;
              EXPECT_EQ(rec.groups, (grid_limit > 0 ? grid_limit : 5) * C);
              EXPECT_EQ(rec.plan.stripes, (cols + C * workers * rec.plan.vector_elems - 1) / (C * workers * rec.plan.vector_elems));
              const OracleCheck check = check_against_reference(p, args);
              EXPECT_TRUE(check.ok) << check.first_mismatch;
              EXPECT_TRUE(out.outside_untouched());
            }
  }
  EXPECT_GE(launched, 90);  // 36 of them re-reading
  // The IR: lanes 0 .. C-1 of every warp push its states to the C groups (one exchange region a
  // merge), one wait a region, a fold over segments of 8 lanes (C x 2 warps partials: 6 for
  // C = 3, the rest the identity), one split cluster barrier around the row's loads and local
  // reductions (its wait before the first push), no group barrier.
  testing::HostMatrix a(DType::f32, 2, 4096, 4096), out(DType::f32, 2, 4096, 4096);
  testing::HostVector s(DType::f32, 2);
  Args args;
  args.set("x", a.view()).set("y", out.view()).set("stat", s.view());
  PlanRequest req;
  req.ctas_per_program = 4, req.workers_per_program = 64, req.merge = MergeStrategy::combine;
  req.caching = InputCaching::registers;
  const BoundCall call = bind(p, args);
  auto count = [](const std::string& text, const std::string& what) {
    int n = 0;
    for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
    return n;
  };
  std::string ir = ir::to_string(lower_row_program(p, call.signature(), choose_plan(call.plan_inputs(), req)).main.kernel);
  EXPECT_NE(ir.find("cluster of 4 groups"), std::string::npos) << ir;
  const int regions = count(ir, "exchange_wait ");
  EXPECT_GT(regions, 0) << ir;
  EXPECT_EQ(count(ir, "  shared f32 exchange"), regions) << ir;
  EXPECT_GE(count(ir, "] at cta min(lane, 3)"), regions) << ir;
  EXPECT_EQ(count(ir, "] at cta min(lane, 3)"), count(ir, "] at cta ")) << ir;
  EXPECT_NE(ir.find("4, width 8)"), std::string::npos) << ir;
  EXPECT_EQ(ir.find(", width 16)"), std::string::npos) << ir;
  EXPECT_EQ(count(ir, "barrier.cluster"), 2) << ir;  // an arrive at the start, its wait before the first push
  EXPECT_LT(ir.find("barrier.cluster.arrive"), ir.find("barrier.cluster.wait")) << ir;
  EXPECT_LT(ir.find("barrier.cluster.wait"), ir.find("] at cta ")) << ir;
  EXPECT_EQ(count(ir, "barrier.group"), 0) << ir;
  EXPECT_EQ(count(ir, " of cta "), 0) << ir;  // no remote loads
  req.ctas_per_program = 3;
  ir = ir::to_string(lower_row_program(p, call.signature(), choose_plan(call.plan_inputs(), req)).main.kernel);
  EXPECT_EQ(count(ir, "] at cta min(lane, 2)"), count(ir, "] at cta ")) << ir;
  EXPECT_NE(ir.find("((lane % 8) < 6) ?"), std::string::npos) << ir;
}

// A level before the last on the program fast path (its exact path under a uniform test) must
// not leave the exact path's element values for later passes: the staged merge there shares
// its chunk graph's x * x with the program, and a later level and the output pass that read
// it would read a register the fast path never wrote. Rows where every group or program takes
// the fast path, and rows where the exact path runs, against the float64 evaluation.
TEST(LowerRowProgram, ExactPathValuesOfAnEarlierLevelStayInItsBranch) {
  RowProgram p("squares_after_rms");
  Operand x = p.row_in("x"), y = p.row_out("y");
  RowExpr v = p.load(x);
  auto [e, q] = p.reduce2(Axis::cols, monoid::scaled_sum_squares(), v);
  RowExpr rms = ldexp(sqrt(q / p.cols()), e);
  RowExpr later = p.reduce1(Axis::cols, monoid::sum(), v * v / (rms * rms + 1.0));
  p.store(y, v * v + later);
  std::mt19937_64 rng(46);
  testing::HostMatrix a(DType::f32, 4, 1000, 1000), out(DType::f32, 4, 1000, 1000);
  a.fill_random(rng);
  store_from_double(a.data(), 1 * 1000 + 7, DType::f32, 2e15);  // row 1 takes the exact path (S > 2^100)
  for (int64_t c = 0; c < 1000; ++c) store_from_double(a.data(), 2 * 1000 + c, DType::f32, 1e-17);
  Args args;
  args.set("x", a.view()).set("y", out.view());
  const Reference want = reference(p, args);
  int launched = 0;
  for (int C : {1, 2})
    for (int workers : {32, 64})
      for (MergeStrategy merge : {MergeStrategy::staged, MergeStrategy::combine}) {
        PlanRequest req;
        req.ctas_per_program = C, req.workers_per_program = workers, req.caching = InputCaching::registers;
        req.merge = merge, req.private_budget = 255;
        SCOPED_TRACE(req.to_json());
        out.poison();
        run(p, args, {req, nullptr, Backend::cpu});
        ++launched;
        const OracleCheck check = check_against_reference(p, args, want);
        EXPECT_TRUE(check.ok) << check.first_mismatch;
      }
  EXPECT_EQ(launched, 8);
}

// The norms on a cluster take each group's program fast path: plain sums over the group's
// slice (LayerNorm's mean over the group's own elements, fewer in the last group of an odd
// row), the group's exact path where its test fails (under a group-uniform condition, no
// cluster operation in it), and one exchange of the groups' states: warp 0 pushes each part
// once, C x parts slots. Rows with a huge element in one group's slice only, a tiny row, a
// zero row, a NaN and a huge first element take the exact path in some groups and not in
// others, and every plan matches the float64 oracle, in f32, bf16 and f64.
TEST(LowerRowProgram, ClusterNormsMergeEachGroupsFastStatesThroughOneExchange) {
  std::mt19937_64 rng(44);
  const int64_t cols = 4099;
  for (DType dt : {DType::f32, DType::bf16, DType::f64}) {
    SCOPED_TRACE(dtype_name(dt));
    // Huge and tiny for the dtype's fast-path bounds (f32 and bf16: 2^-60 <= sum < 2^100; f64:
    // 2^-956 <= sum < 2^900).
    const double huge = dt == DType::f64 ? 1e200 : 1e30, tiny = dt == DType::f64 ? 1e-150 : 1e-30;
    testing::HostMatrix x(dt, 7, cols, cols), y(dt, 7, cols, cols);
    testing::HostVector w(dt, cols), b(dt, cols);
    x.fill_random(rng, 2.0), w.fill_random(rng, 1.0, 0.5), b.fill_random(rng, 0.0, 1.0);
    for (int64_t c = 0; c < cols; ++c)  // row 6: a mean far from zero (LayerNorm's shifted sums)
      store_from_double(x.data(), 6 * cols + c, dt, 1000.0 + x.at(6, c));
    store_from_double(x.data(), 1 * cols + cols - 3, dt, huge);  // the last group's slice
    for (int64_t c = 0; c < cols; ++c) {
      store_from_double(x.data(), 2 * cols + c, dt, tiny * (1 + c % 7));
      store_from_double(x.data(), 3 * cols + c, dt, 0.0);
    }
    store_from_double(x.data(), 4 * cols + 2000, dt, std::nan(""));
    store_from_double(x.data(), 5 * cols, dt, huge * 3e-10);
    for (Op op : {Op::rms_norm, Op::layer_norm}) {
      const RowProgram& p = builtin_program(op);
      // The operator's own oracle: its tolerance holds LayerNorm's mean rounded through the merges
      // (row 6 is ill-conditioned: mean 1000, deviation 2).
      const Call norm{op, x.view(), y.view(), w.view(), op == Op::layer_norm ? b.view() : VectorView{}, {}};
      const BoundCall call = bind(p, to_args(norm));
      const int parts = op == Op::layer_norm ? 4 : 2;
      int launched = 0;
      for (int C : {2, 3, 4})
        for (int workers : {32, 128})
          for (InputCaching caching : {InputCaching::registers, InputCaching::shared}) {
            PlanRequest req;
            req.ctas_per_program = C, req.workers_per_program = workers, req.caching = caching, req.private_budget = 255;
            const MappingPlan plan = choose_plan(call.plan_inputs(), req);
            SCOPED_TRACE(p.name() + " " + plan.to_json());
            const ir::Kernel k = lower_row_program(p, call.signature(), plan).main.kernel;
            EXPECT_EQ(count_stmts(k.body, ir::Stmt::Kind::remote_shared_push), parts);
            EXPECT_EQ(count_stmts(k.body, ir::Stmt::Kind::exchange_wait), 1);
            int exact_paths = 0;
            for (const ir::Stmt& s : k.body)
              if (s.kind == ir::Stmt::Kind::if_ && !s.body.empty() && s.body[0].kind == ir::Stmt::Kind::comment &&
                  s.body[0].text.find("the exact path, merged within the group") != std::string::npos) {
                ++exact_paths;
                EXPECT_EQ(count_stmts(s.body, ir::Stmt::Kind::remote_shared_push), 0);
                EXPECT_EQ(count_stmts(s.body, ir::Stmt::Kind::exchange_wait), 0);
                EXPECT_EQ(count_stmts(s.body, ir::Stmt::Kind::barrier) > 0, workers > 32);
              }
            EXPECT_EQ(exact_paths, 1);
            y.poison();
            const LaunchRecord rec = run(norm, {req, nullptr, Backend::cpu});
            EXPECT_EQ(rec.plan.to_json(), plan.to_json());
            ++launched;
            const OracleCheck check = check_against_oracle(norm, rec.plan);
            EXPECT_TRUE(check.ok) << check.first_mismatch;
            EXPECT_TRUE(y.outside_untouched());
          }
      EXPECT_EQ(launched, 12);
    }
  }
}

// The most float registers live at once in a kernel: each from its first definition to its last
// use in statement order (the branches of an if one after the other), as a register allocator
// without rematerialisation would have to hold them.
class PeakLiveFloats : public ir::IRVisitor<PeakLiveFloats> {
 public:
  explicit PeakLiveFloats(const ir::Kernel& k) : k_(k), first_(k.regs.size(), -1), last_(k.regs.size(), -1) {}
  int run() {
    visit_block(k_.body);
    std::vector<int> delta(size_t(at_) + 2, 0);
    for (size_t r = 0; r < k_.regs.size(); ++r)
      if (first_[r] >= 0 && last_[r] > first_[r] && (k_.regs[r].type == ir::Type::f32 || k_.regs[r].type == ir::Type::f64))
        ++delta[size_t(first_[r])], --delta[size_t(last_[r])];
    int live = 0, peak = 0;
    for (int d : delta) peak = std::max(peak, live += d);
    return peak;
  }
  void visit_block(const std::vector<ir::Stmt>& body) {
    for (const ir::Stmt& s : body) {
      ++at_;
      if (s.kind == ir::Stmt::Kind::store || s.kind == ir::Stmt::Kind::remote_shared_push) {
        for (int d : s.dsts) use(d);
        use(s.src);
      } else {
        use(s.src);
        def(s.dst);
        for (int d : s.dsts) def(d);
      }
      visit(s);
    }
  }
  void visit_reg(const ir::Expr& e) { use(e.id); }

 private:
  void def(int r) {
    if (r >= 0 && first_[size_t(r)] < 0) first_[size_t(r)] = at_;
  }
  void use(int r) {
    if (r >= 0) last_[size_t(r)] = at_;
  }
  const ir::Kernel& k_;
  std::vector<int> first_, last_;
  int at_ = 0;
};

// A staged plan (caching "shared") holds its row in shared memory, not registers: each fold of
// a chunk graph reads the slice again and keeps what it computes from it for that fold only —
// LayerNorm's shifted x for its sum, then again for its sum of squares; cross-entropy's logit at
// the target, computed from the staged row, for its fold alone. So no point of the kernel holds
// a worker's slice (stripes x vector_elems values) in registers; the same plans cached in
// registers do, as they must.
TEST(LowerRowProgram, StagedPlansHoldNoSliceInRegistersBetweenFolds) {
  const std::vector<std::pair<std::string, int64_t>> cases = {
      {"layer_norm", 65536}, {"rms_norm", 65536}, {"softmax", 65536}, {"cross_entropy_fused", 128256}};
  int checked = 0;
  for (const auto& [name, cols] : cases)
    for (DType dt : {DType::f32, DType::bf16}) {
      const RowProgram& p =
          name == "cross_entropy_fused" ? training_program(name) : builtin_program(parse_op(name));
      testing::HostMatrix x(dt, 4, cols, cols), y(dt, 4, cols, cols);
      testing::HostVector w(dt, cols), b(dt, cols), target(DType::i64, 4), loss(DType::f32, 4), lse(DType::f32, 4);
      Args args;
      if (name == "cross_entropy_fused") {
        args.set("logits", x.view()), args.set("target", target.view()), args.set("loss", loss.view());
        args.set("lse", lse.view()), args.set("dlogits", x.view());
      } else {
        args.set("x", x.view()), args.set("y", y.view());
        if (name != "softmax") args.set("weight", w.view());
        if (name == "layer_norm") args.set("bias", b.view());
      }
      const BoundCall call = bind(p, args);
      DeviceLimits clusters;
      clusters.max_cluster_size = 16;
      for (int C : {1, 2, 4}) {
        PlanRequest req;
        req.caching = InputCaching::shared, req.ctas_per_program = C;
        MappingPlan plan;
        try {
          plan = choose_plan(call.plan_inputs(), req, clusters);
          validate_plan(plan, call.plan_inputs(), clusters, name);
        } catch (const Error&) {
          continue;  // a slice too large for one group's shared memory
        }
        SCOPED_TRACE(name + " " + std::string(dtype_name(dt)) + " " + plan.to_json());
        const int slice = plan.stripes * plan.vector_elems;
        ASSERT_GE(slice, 32);
        const int staged = PeakLiveFloats(lower_row_program(p, call.signature(), plan).main.kernel).run();
        EXPECT_LT(staged, slice);
        ++checked;
        PlanRequest cached = PlanRequest::exactly(plan);
        cached.caching = InputCaching::registers, cached.private_budget = 255;
        cached.merge.reset(), cached.resident_groups.reset();
        const MappingPlan reg = choose_plan(call.plan_inputs(), cached, clusters);
        if (int64_t(reg.stripes) * reg.vector_elems > 255) continue;
        EXPECT_GE(PeakLiveFloats(lower_row_program(p, call.signature(), reg).main.kernel).run(), slice) << reg.to_json();
      }
    }
  EXPECT_GE(checked, 16);
}

// Optional row and per-row inputs left out read as their constants and are never loaded;
// given, they are read like any other.
TEST(LowerRowProgram, OptionalRowInputsPresentOrAbsent) {
  RowProgram p("optional_inputs");
  Operand x = p.row_in("x"), extra = p.row_in("extra", DTypeSet::floats(), "", true);
  Operand scale = p.row_scalar_in("scale", DTypeSet::floats(), "", true);
  Operand y = p.row_out("y"), more = p.row_out("more", DTypeSet::floats(), extra, "", true);
  RowExpr v = p.load(x) + p.load_or(extra, 0.5);
  p.store(y, (v - p.reduce1(Axis::cols, monoid::sum(), v) / p.cols()) * p.load_or(scale, 2.0));
  p.store(more, v * 3.0);
  std::mt19937_64 rng(8);
  testing::HostMatrix a(DType::f32, 5, 300, 300), b(DType::bf16, 5, 300, 304), out(DType::f32, 5, 300, 300);
  testing::HostVector s(DType::f32, 5);
  a.fill_random(rng), b.fill_random(rng), s.fill_random(rng, 1.0, 0.5);
  for (bool given : {false, true})
    for (InputCaching caching : {InputCaching::registers, InputCaching::reread}) {
      Args args;
      args.set("x", a.view()).set("y", out.view());
      if (given) args.set("extra", b.view()).set("scale", s.view()).set("more", b.view());  // more: in place
      PlanRequest req;
      req.caching = caching;
      out.poison();
      const Reference want = reference(p, args);
      const LaunchRecord rec = run(p, args, {req, nullptr, Backend::cpu});
      const OracleCheck check = check_against_reference(p, args, want);
      EXPECT_TRUE(check.ok) << check.first_mismatch;
      EXPECT_EQ(check.checked, given ? 2 * 5 * 300 : 5 * 300);
      // Absent: only x is read (once per pass that needs it), and no per-row value.
      if (!given) {
        EXPECT_EQ(rec.bytes_loaded, (caching == InputCaching::registers ? 1 : 2) * 5 * 300 * 4);
      }
    }
}

// Four plans of a call (programs of one warp or two, register-cached or re-read): each plan
// and its lowered kernel go to `inspect`; then, where `want` is given, the call runs on the CPU
// backend under the plan (output poisoned first) and is checked against the reference.
void for_each_small_plan(const RowProgram& p, const Args& args, const Reference* want, testing::HostMatrix& y,
                         const std::function<void(const MappingPlan&, const ir::Kernel&)>& inspect) {
  const BoundCall call = bind(p, args);
  for (int workers : {32, 64})
    for (InputCaching caching : {InputCaching::registers, InputCaching::reread}) {
      PlanRequest req;
      req.workers_per_program = workers, req.caching = caching;
      const MappingPlan plan = choose_plan(call.plan_inputs(), req);
      SCOPED_TRACE(p.name() + " " + plan.to_json());
      inspect(plan, lower_row_program(p, call.signature(), plan).main.kernel);
      if (!want) continue;
      y.poison();
      run(p, args, {req, nullptr, Backend::cpu});
      const OracleCheck check = check_against_reference(p, args, *want);
      EXPECT_TRUE(check.ok) << check.first_mismatch;
    }
}

// LayerNorm's program fast path shifts its sums by the row's first element: a register-cached
// program of one warp broadcasts it from lane 0's cache (one shfl_idx, no load), wider ones
// load it. Rows whose first element is huge, tiny, NaN or the only large one take the exact
// path or not, and every plan matches the float64 oracle.
TEST(LowerRowProgram, RowHeadIsBroadcastFromTheCacheOfAOneWarpProgram) {
  const RowProgram& p = builtin_program(Op::layer_norm);
  std::mt19937_64 rng(21);
  testing::HostMatrix x(DType::bf16, 6, 300, 300), y(DType::bf16, 6, 300, 300);
  testing::HostVector w(DType::bf16, 300), b(DType::bf16, 300);
  x.fill_random(rng), w.fill_random(rng, 1.0, 0.5), b.fill_random(rng, 0.0, 1.0);
  for (auto [row, v] : {std::pair{1, 1e30}, {2, 1e-30}, {3, std::nan("")}, {4, 1e4}}) store_from_double(x.data(), row * 300, DType::bf16, v);
  Args args;
  args.set("x", x.view()).set("y", y.view()).set("weight", w.view()).set("bias", b.view());
  const Reference want = reference(p, args);
  for_each_small_plan(p, args, &want, y, [](const MappingPlan& plan, const ir::Kernel& k) {
    int xb = 0;
    while (k.buffers[xb].name != "x") ++xb;
    const bool broadcast = plan.workers_per_program == 32 && plan.caching == InputCaching::registers;
    EXPECT_EQ(count_stmts(k.body, ir::Stmt::Kind::shfl_idx), broadcast ? 1 : 0);
    if (plan.caching == InputCaching::registers) {  // the cache's stripes, and the head unless broadcast
      EXPECT_EQ(count_stmts(k.body, ir::Stmt::Kind::load, xb), plan.stripes + (broadcast ? 0 : 1));
    }
  });
}

// Loads and stores of `buffer` that may take the vector path (their alignment is not the
// constant false), and those that never do.
std::pair<int, int> vector_and_scalar_accesses(const std::vector<ir::Stmt>& body, int buffer) {
  std::pair<int, int> n{0, 0};
  for (const ir::Stmt& s : body) {
    if ((s.kind == ir::Stmt::Kind::load || s.kind == ir::Stmt::Kind::store) && s.buffer == buffer) {
      const bool never = s.aligned->kind == ir::Expr::Kind::constant && s.aligned->i == 0;
      (never ? n.second : n.first) += 1;
    }
    for (const auto* b : {&s.body, &s.else_body}) {
      auto [v, sc] = vector_and_scalar_accesses(*b, buffer);
      n.first += v, n.second += sc;
    }
  }
  return n;
}

// row_head "peel": rows of an odd stride start at every alignment, and the plan still takes
// 16-byte vectors from each row's first aligned column, worker 0 taking the elements before it
// one at a time. Each built-in operator, bf16 and f32, programs of one warp or two, cached or
// re-read, with huge, tiny, NaN and infinite elements in the head, at the first aligned column
// and at the row end, matches the float64 oracle; the CPU executor refuses any vector access
// whose address is not aligned, so every vector it takes is aligned.
TEST(LowerRowProgram, PeeledRowsKeepVectorAccessesWhateverTheStride) {
  for (Op op : {Op::softmax, Op::log_softmax, Op::rms_norm, Op::layer_norm})
    for (DType dt : {DType::bf16, DType::f32}) {
      const RowProgram& p = builtin_program(op);
      const int64_t rows = 9, cols = 301;  // row r starts r x 301 elements in: every residue
      std::mt19937_64 rng(uint64_t(op) * 7 + uint64_t(dt));
      testing::HostMatrix x(dt, rows, cols, cols), y(dt, rows, cols, cols);
      testing::HostVector w(dt, cols), b(dt, cols);
      x.fill_random(rng), w.fill_random(rng, 1.0, 0.5), b.fill_random(rng, 0.0, 1.0);
      const double inf = std::numeric_limits<double>::infinity();
      for (auto [row, col, v] : {std::tuple{1, 0, 1e30}, {2, 2, 1e-30}, {3, 5, std::nan("")}, {4, 7, inf},
                                 {5, 6, -inf}, {6, 300, 1e30}, {7, 1, 3e4}})
        store_from_double(x.data(), row * cols + col, dt, v);
      Args args;
      args.set("x", x.view()).set("y", y.view());
      if (op == Op::rms_norm || op == Op::layer_norm) args.set("weight", w.view());
      if (op == Op::layer_norm) args.set("bias", b.view());
      const Reference want = reference(p, args);
      const BoundCall call = bind(p, args);
      for (int workers : {32, 64})
        for (InputCaching caching : {InputCaching::registers, InputCaching::reread}) {
          PlanRequest req;
          req.workers_per_program = workers, req.caching = caching, req.row_head = RowHead::peel;
          const MappingPlan plan = choose_plan(call.plan_inputs(), req);
          SCOPED_TRACE(op_name(op) + " " + std::string(dtype_name(dt)) + " " + plan.to_json());
          EXPECT_EQ(plan.vector_elems, 16 / dtype_size(dt));  // the bases are aligned, the stride odd
          EXPECT_EQ(plan.alignment, Alignment::scalar_fallback);
          const ir::Kernel k = lower_row_program(p, call.signature(), plan).main.kernel;
          int xb = 0, yb = 0;
          while (k.buffers[xb].name != "x") ++xb;
          while (k.buffers[yb].name != "y") ++yb;
          // Every stripe (or loop slot) is a vector access; the head's and column 0's are scalar.
          auto [xv, xs] = vector_and_scalar_accesses(k.body, xb);
          auto [yv, ys] = vector_and_scalar_accesses(k.body, yb);
          EXPECT_GE(xv, 1);
          EXPECT_GE(xs, 1);
          EXPECT_GE(yv, 1);
          EXPECT_GE(ys, 1);
          y.poison();
          const LaunchRecord rec = run(p, args, {req, nullptr, Backend::cpu});
          const OracleCheck check = check_against_reference(p, args, want);
          EXPECT_TRUE(check.ok) << check.first_mismatch;
          // At run time: x's vectors of every row (its body holds at least cols / V - 1 whole
          // ones), once for a cached row, at least once for a re-read one.
          const int64_t V = plan.vector_elems;
          EXPECT_GE(rec.vector_accesses, rows * (cols / V - 1));
          if (op == Op::softmax || op == Op::log_softmax) {
            // Scalars only in the heads (fewer than V elements of x a pass, and of y) and tails.
            const int64_t passes = caching == InputCaching::registers ? 1 : 2;
            EXPECT_LE(rec.scalar_accesses, rows * ((passes + 1) * (V - 1) + (passes + 1) * V));
          }
        }
    }
}

// A peeled plan is refused where its head cannot be taken apart from the vectors: clamped
// tails, whole-vector plans, clusters, packed caches and rows shorter than two vectors.
TEST(LowerRowProgram, PeeledPlansNeedPredicatedTailsAndTwoVectorsARow) {
  const RowProgram& p = builtin_program(Op::softmax);
  testing::HostMatrix x(DType::f32, 4, 301, 301), y(DType::f32, 4, 301, 301), tiny(DType::f32, 4, 7, 7);
  Args args;
  args.set("x", x.view()).set("y", y.view());
  PlanRequest req;
  req.row_head = RowHead::peel, req.tail = TailHandling::clamp;
  EXPECT_THROW(run(p, args, {req, nullptr, Backend::cpu}), Error);
  req.tail = TailHandling::predicate, req.alignment = Alignment::require;
  EXPECT_THROW(run(p, args, {req, nullptr, Backend::cpu}), Error);
  req.alignment.reset(), req.ctas_per_program = 2;
  EXPECT_THROW(run(p, args, {req, nullptr, Backend::cpu}), Error);
  req.ctas_per_program.reset(), req.vector_elems = 4;
  Args short_rows;
  short_rows.set("x", tiny.view()).set("y", testing::HostMatrix(DType::f32, 4, 7, 7).view());
  try {
    run(p, short_rows, {req, nullptr, Backend::cpu});
    ADD_FAILURE() << "a peeled plan of 4-element vectors ran on rows of 7";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("row_head"), std::string::npos) << e.what();
  }
}

// Expressions `op` in a kernel's statements, nested ones included.
int count_unary(const ir::ExprPtr& e, ir::UnOp op) {
  if (!e) return 0;
  int n = e->kind == ir::Expr::Kind::unary && e->unop == op;
  for (const ir::ExprPtr& a : e->args) n += count_unary(a, op);
  return n;
}
int count_unary(const std::vector<ir::Stmt>& body, ir::UnOp op) {
  int n = 0;
  for (const ir::Stmt& s : body) {
    for (const ir::ExprPtr& e : {s.value, s.index, s.valid, s.aligned, s.cond, s.begin, s.end}) n += count_unary(e, op);
    n += count_unary(s.body, op) + count_unary(s.else_body, op);
  }
  return n;
}

// Softmax's output exp(x - max) is the value its sum of exponentials already computed at each
// cached element: a register-cached row takes one exponential an element. Rows of -inf (NaN
// out), rows holding +inf or NaN, and -inf elements among finite ones match the float64 oracle
// on every plan, re-read ones too.
TEST(LowerRowProgram, SoftmaxTakesOneExponentialACachedElement) {
  const RowProgram& p = builtin_program(Op::softmax);
  std::mt19937_64 rng(5);
  testing::HostMatrix x(DType::f32, 6, 300, 300), y(DType::f32, 6, 300, 300);
  x.fill_random(rng, 3.0);
  const double inf = std::numeric_limits<double>::infinity();
  for (int64_t c = 0; c < 300; ++c) store_from_double(x.data(), 1 * 300 + c, DType::f32, -inf);
  store_from_double(x.data(), 2 * 300 + 17, DType::f32, inf);
  store_from_double(x.data(), 3 * 300 + 299, DType::f32, std::nan(""));
  for (int64_t c = 0; c < 300; c += 3) store_from_double(x.data(), 4 * 300 + c, DType::f32, -inf);
  Args args;
  args.set("x", x.view()).set("y", y.view());
  const Reference want = reference(p, args);
  for_each_small_plan(p, args, &want, y, [](const MappingPlan& plan, const ir::Kernel& k) {
    if (plan.caching == InputCaching::registers) {  // re-read rows also merge states, with exponentials
      EXPECT_EQ(count_unary(k.body, ir::UnOp::exp2), plan.stripes * plan.vector_elems);
    }
  });
}

// The norms' fast branch has its exponent at 0: the eps clamp max(eps, min(eps, 2^-126)) is
// eps, and the two rstd forms (eps dominant or not) are the same operations, one register, so
// it takes one rsqrt where the exact branch keeps both forms.
TEST(LowerRowProgram, NormsFastBranchTakesOneReciprocalSquareRoot) {
  std::mt19937_64 rng(9);
  testing::HostMatrix x(DType::bf16, 4, 512, 512), y(DType::bf16, 4, 512, 512);
  testing::HostVector w(DType::bf16, 512), b(DType::bf16, 512);
  x.fill_random(rng), w.fill_random(rng, 1.0, 0.5), b.fill_random(rng, 0.0, 1.0);
  for (Op op : {Op::rms_norm, Op::layer_norm}) {
    const RowProgram& p = builtin_program(op);
    Args args;
    args.set("x", x.view()).set("y", y.view()).set("weight", w.view());
    if (op == Op::layer_norm) args.set("bias", b.view());
    for_each_small_plan(p, args, nullptr, y, [](const MappingPlan&, const ir::Kernel& k) {
      int in_fast = -1, in_exact = -1;
      for (const ir::Stmt& s : k.body)
        if (s.kind == ir::Stmt::Kind::if_ && !s.body.empty() && s.body[0].kind == ir::Stmt::Kind::comment &&
            s.body[0].text.rfind("every program read passed", 0) == 0) {
          in_fast = count_unary(s.body, ir::UnOp::rsqrt);
          in_exact = count_unary(s.else_body, ir::UnOp::rsqrt);
        }
      EXPECT_EQ(in_fast, 1);
      EXPECT_EQ(in_exact, 2);
    });
  }
}

// Float operations `op` (integer ones, such as a re-read loop's trip count, are not counted).
int count_binary(const ir::ExprPtr& e, ir::BinOp op) {
  if (!e) return 0;
  int n = e->kind == ir::Expr::Kind::binary && e->binop == op && (e->type == ir::Type::f32 || e->type == ir::Type::f64);
  for (const ir::ExprPtr& a : e->args) n += count_binary(a, op);
  return n;
}
int count_binary(const std::vector<ir::Stmt>& body, ir::BinOp op) {
  int n = 0;
  for (const ir::Stmt& s : body) {
    for (const ir::ExprPtr& e : {s.value, s.index, s.valid, s.aligned, s.cond, s.begin, s.end})
      n += count_binary(e, op);
    n += count_binary(s.body, op) + count_binary(s.else_body, op);
  }
  return n;
}

// The norms' program fast path divides by nothing: its mean (LayerNorm's S1 / n) and the mean
// square or variance (a row value over cols) multiply by the launch's 1 / max(cols, 1), a
// parameter only kernels that need it declare; rows of 300 (not a power of two: the product
// rounds differently from the quotient) and rows past the end (guard programs, n = 0) still
// match the float64 oracle on every plan.
TEST(LowerRowProgram, NormsFastPathMultipliesByTheReciprocalOfTheRowLength) {
  std::mt19937_64 rng(31);
  testing::HostMatrix x(DType::bf16, 5, 300, 300), y(DType::bf16, 5, 300, 300);
  testing::HostVector w(DType::bf16, 300), b(DType::bf16, 300);
  x.fill_random(rng, 3.0), w.fill_random(rng, 1.0, 0.5), b.fill_random(rng, 0.0, 1.0);
  for (Op op : {Op::rms_norm, Op::layer_norm}) {
    const RowProgram& p = builtin_program(op);
    Args args;
    args.set("x", x.view()).set("y", y.view()).set("weight", w.view());
    if (op == Op::layer_norm) args.set("bias", b.view());
    const Reference want = reference(p, args);
    int fast_paths = 0;
    for_each_small_plan(p, args, &want, y, [&](const MappingPlan&, const ir::Kernel& k) {
      EXPECT_GE(k.param_index("tile_inv_cols"), 0);
      for (size_t i = 0; i < k.body.size(); ++i) {
        const ir::Stmt& s = k.body[i];
        if (s.kind != ir::Stmt::Kind::if_ || s.body.empty() || s.body[0].kind != ir::Stmt::Kind::comment ||
            s.body[0].text.rfind("every program read passed", 0) != 0)
          continue;
        ++fast_paths;
        // The fast branch and the statistics before it (the exact branch divides by chunk counts).
        EXPECT_EQ(count_binary(s.body, ir::BinOp::div), 0);
        EXPECT_EQ(count_binary(std::vector<ir::Stmt>(k.body.begin(), k.body.begin() + i), ir::BinOp::div), 0);
      }
    });
    EXPECT_GT(fast_paths, 0) << p.name();
  }
  // Softmax divides by its sum of exponentials, never by the row length: no such parameter.
  testing::HostMatrix sx(DType::f32, 2, 300, 300), sy(DType::f32, 2, 300, 300);
  sx.fill_random(rng);
  Args args;
  args.set("x", sx.view()).set("y", sy.view());
  const BoundCall call = bind(builtin_program(Op::softmax), args);
  const MappingPlan plan = choose_plan(call.plan_inputs(), {});
  EXPECT_EQ(
      lower_row_program(builtin_program(Op::softmax), call.signature(), plan).main.kernel.param_index("tile_inv_cols"),
      -1);
}

// max(a, min(a, c)) is a only where c is not NaN: with c = NaN both min and max are NaN. A row
// scalar of each form, against the float64 evaluation, on every plan.
TEST(LowerRowProgram, MaxOfMinFoldsOnlyForAConstantThatIsNotNaN) {
  RowProgram p("clamped_mean");
  Operand x = p.row_in("x"), y = p.row_out("y");
  Operand kept = p.row_scalar_out("kept", DTypeSet::statistics(), false);
  Operand poisoned = p.row_scalar_out("poisoned", DTypeSet::statistics(), false);
  RowExpr v = p.load(x);
  RowExpr mean = p.reduce1(Axis::cols, monoid::sum(), v) / p.cols();
  p.store(y, v - mean);
  p.store(kept, max(mean, min(mean, p.constant(0.25))));
  p.store(poisoned, min(max(p.constant(std::nan("")), mean), mean));
  std::mt19937_64 rng(3);
  testing::HostMatrix xs(DType::f32, 5, 300, 300), ys(DType::f32, 5, 300, 300);
  testing::HostVector k(DType::f32, 5), q(DType::f32, 5);
  xs.fill_random(rng);
  Args args;
  args.set("x", xs.view()).set("y", ys.view()).set("kept", k.view()).set("poisoned", q.view());
  const Reference want = reference(p, args);
  for_each_small_plan(p, args, &want, ys, [&](const MappingPlan&, const ir::Kernel&) {});
  for (int64_t r = 0; r < 5; ++r) {
    EXPECT_TRUE(std::isnan(load_as_double(q.data(), r, DType::f32))) << r;
    EXPECT_FALSE(std::isnan(load_as_double(k.data(), r, DType::f32))) << r;
  }
}

// x * rstd * w + b over a scaled sum of squares, with required weight and bias: a norm whose
// output pass reads two per-column inputs.
RowProgram affine_rms_program() {
  RowProgram p("affine_rms");
  Operand x = p.row_in("x"), y = p.row_out("y");
  Operand w = p.col_in("w", DTypeSet::floats(), false), b = p.col_in("b", DTypeSet::floats(), false);
  RowExpr v = p.load(x);
  auto [e, q] = p.reduce2(Axis::cols, monoid::scaled_sum_squares(), v);
  // Σ x² = q 4^e for any exponent the state holds: only ldexp(q, 2e) is the program's value.
  p.store(y, v * rsqrt(ldexp(q / p.cols(), e + e) + 1e-6) * p.load(w) + p.load(b));
  return p;
}

// Random x (of `x_dtype`) and weight and bias (the bias of `bias_dtype`) for it, y in f32.
struct AffineRmsCall {
  testing::HostMatrix x, y;
  testing::HostVector w, b;
  Args args;
  AffineRmsCall(DType x_dtype, DType bias_dtype, int64_t rows, int64_t cols, uint64_t seed)
      : x(x_dtype, rows, cols, cols), y(DType::f32, rows, cols, cols), w(DType::f32, cols), b(bias_dtype, cols) {
    std::mt19937_64 rng(seed);
    x.fill_random(rng), w.fill_random(rng, 1.0, 0.5), b.fill_random(rng, 0.0, 0.5);
    args.set("x", x.view()).set("y", y.view()).set("w", w.view()).set("b", b.view());
  }
};

// column_loads "with_row": the output pass's per-column inputs (weight, bias) are loaded right
// after the cached row, before the first merge, and the results are bitwise those of "ahead";
// a re-read plan refuses it by name.
TEST(LowerRowProgram, ColumnLoadsWithTheRowPrecedeTheMergesAndChangeNoResult) {
  const RowProgram p = affine_rms_program();
  AffineRmsCall c(DType::bf16, DType::bf16, 3, 3001, 21);
  const Args& args = c.args;
  testing::HostMatrix& out = c.y;
  const BoundCall call = bind(p, args);
  for (int C : {1, 4}) {
    PlanRequest req;
    req.ctas_per_program = C, req.workers_per_program = 128, req.caching = InputCaching::registers;
    SCOPED_TRACE("ctas_per_program " + std::to_string(C));
    std::vector<std::vector<uint8_t>> results;
    for (ColumnLoads loads : {ColumnLoads::ahead, ColumnLoads::with_row}) {
      req.column_loads = loads;
      const std::string ir =
          ir::to_string(lower_row_program(p, call.signature(), choose_plan(call.plan_inputs(), req)).main.kernel);
      const size_t first_w = ir.find("= load.whole w[") != std::string::npos ? ir.find("= load.whole w[") : ir.find("= load w[");
      const size_t merge = C > 1 ? ir.find("exchange_wait ") : ir.find("shfl_xor(");
      ASSERT_NE(first_w, std::string::npos) << ir;
      ASSERT_NE(merge, std::string::npos) << ir;
      EXPECT_EQ(first_w < merge, loads == ColumnLoads::with_row) << ir;
      out.poison();
      run(p, args, {req, nullptr, Backend::cpu});
      const OracleCheck check = check_against_reference(p, args);
      EXPECT_TRUE(check.ok) << check.first_mismatch;
      EXPECT_TRUE(out.outside_untouched());
      results.push_back(out.bytes());
    }
    EXPECT_EQ(results[0], results[1]);
  }
  PlanRequest reread;
  reread.caching = InputCaching::reread, reread.column_loads = ColumnLoads::with_row;
  const std::string error = testing::error_of([&] { run(p, args, {reread, nullptr, Backend::cpu}); });
  EXPECT_NE(error.find("plan.column_loads': expected \"ahead\" unless the rows are cached"), std::string::npos) << error;
}


// column_loads "once": in a group looping over row blocks the weight and bias are loaded before
// the loop, once a group, and every row reuses them: the same bits as loading them each row,
// with (rows - groups) x stripes x workers fewer vector loads of each.
TEST(LowerRowProgram, ColumnsLoadedOnceServeEveryRowBlockOfAGroup) {
  const RowProgram p = affine_rms_program();
  const int64_t rows = 300, groups = 8;
  AffineRmsCall c(DType::f32, DType::f32, rows, 4096, 22);
  const Args& args = c.args;
  testing::HostMatrix& out = c.y;
  const BoundCall call = bind(p, args);
  PlanRequest req;
  req.workers_per_program = 256, req.caching = InputCaching::registers, req.grid_limit = int(groups);
  std::vector<std::vector<uint8_t>> results;
  std::vector<LaunchRecord> records;
  for (ColumnLoads loads : {ColumnLoads::ahead, ColumnLoads::once}) {
    req.column_loads = loads;
    const MappingPlan plan = choose_plan(call.plan_inputs(), req);
    ASSERT_EQ(plan.stripes, 4);
    ASSERT_EQ(plan.vector_elems, 4);
    const std::string ir = ir::to_string(lower_row_program(p, call.signature(), plan).main.kernel);
    const size_t first_w = ir.find("= load.whole w["), loop = ir.find("for (");
    ASSERT_NE(first_w, std::string::npos) << ir;
    ASSERT_NE(loop, std::string::npos) << ir;
    EXPECT_EQ(first_w < loop, loads == ColumnLoads::once) << ir;
    out.poison();
    records.push_back(run(p, args, {req, nullptr, Backend::cpu}));
    const OracleCheck check = check_against_reference(p, args);
    EXPECT_TRUE(check.ok) << check.first_mismatch;
    results.push_back(out.bytes());
  }
  EXPECT_EQ(results[0], results[1]);
  EXPECT_EQ(records[0].vector_accesses - records[1].vector_accesses, (rows - groups) * 4 * 256 * 2);
  // Refused by name without a loop over row blocks, and where the slice and columns exceed the budget.
  auto refusal = [&] { return testing::error_of([&] { run(p, args, {req, nullptr, Backend::cpu}); }); };
  req.grid_limit = 0;
  std::string error = refusal();
  EXPECT_NE(error.find("plan.column_loads': expected \"once\" only for groups that loop over row blocks"), std::string::npos)
      << error;
  req.grid_limit = int(groups), req.workers_per_program = 64;  // 64 scalars of slice and two held columns
  error = refusal();
  EXPECT_NE(error.find("per-column inputs held across rows) = 192 scalars"), std::string::npos) << error;
}

// dweight = the sum over the rows of x * dy (a weight gradient's shape), f32, on random rows.
struct WeightGradientCall {
  RowProgram p{"weight_gradient"};
  testing::HostMatrix a, b;
  testing::HostVector out;
  Args args;
  WeightGradientCall(int64_t rows, int64_t cols, uint64_t seed)
      : a(DType::f32, rows, cols, cols), b(DType::f32, rows, cols, cols), out(DType::f32, cols) {
    Operand x = p.row_in("x"), dy = p.row_in("dy");
    p.store(p.col_out("dweight"), p.reduce1(Axis::rows, monoid::sum(), p.load(x) * p.load(dy)));
    std::mt19937_64 rng(seed);
    a.fill_random(rng), b.fill_random(rng);
    args.set("x", a.view()).set("dy", b.view()).set("dweight", out.view());
  }
};

// Reductions over the rows are bitwise identical from run to run and across plans of the same
// grid (partials folded in slot order).
TEST(LowerRowProgram, ReductionsOverRowsAreBitwiseRepeatable) {
  WeightGradientCall c(300, 257, 5);
  const RowProgram& p = c.p;
  const Args& args = c.args;
  testing::HostVector& out = c.out;
  for (InputCaching caching : {InputCaching::registers, InputCaching::reread}) {
    PlanRequest req;
    req.caching = caching;
    run(p, args, {req, nullptr, Backend::cpu});
    const std::vector<uint8_t> first(out.bytes.begin(), out.bytes.begin() + 257 * 4);
    EXPECT_TRUE(check_against_reference(p, args).ok);
    for (int k = 0; k < 3; ++k) {
      std::fill(out.bytes.begin(), out.bytes.end(), 0xff);
      run(p, args, {req, nullptr, Backend::cpu});
      EXPECT_EQ(std::vector<uint8_t>(out.bytes.begin(), out.bytes.begin() + 257 * 4), first) << to_string(caching);
    }
  }
}

// The second phase splits the slots over its group's warps (warp w folds slots w, w + S, ...)
// and folds their states in warp order after one barrier a reduction: finish groups of one to 32
// warps, slots that are no multiple of the warps, columns that are no multiple of 32, a
// per-column sum and a scalar of a two-part monoid, against the float64 reference and bitwise
// from run to run.
TEST(LowerRowProgram, SecondPhaseSplitsTheSlotsOverItsWarps) {
  RowProgram p("two_phase");
  Operand x = p.row_in("x"), dy = p.row_in("dy");
  Operand grad = p.col_out("grad"), lse = p.scalar_out("lse");
  RowExpr vx = p.load(x);
  p.store(grad, p.reduce1(Axis::rows, monoid::sum(), vx * p.load(dy)));
  auto [m, s] = p.reduce2(Axis::rows, monoid::online_softmax(), p.reduce1(Axis::cols, monoid::max(), vx));
  p.store(lse, m + log(s));
  std::mt19937_64 rng(41);
  testing::HostMatrix a(DType::f32, 300, 257, 257), b(DType::f32, 300, 257, 257);
  testing::HostVector g(DType::f32, 257), l(DType::f32, 1);
  a.fill_random(rng), b.fill_random(rng);
  Args args;
  args.set("x", a.view()).set("dy", b.view()).set("grad", g.view()).set("lse", l.view());
  const BoundCall call = bind(p, args);
  for (int finish : {32, 96, 256, 1024}) {
    PlanRequest req;
    req.grid_limit = 7, req.finish_workers = finish;
    const MappingPlan plan = choose_plan(call.plan_inputs(), req);
    SCOPED_TRACE(plan.to_json());
    const LoweredProgram lowered = lower_row_program(p, call.signature(), plan);
    ASSERT_TRUE(lowered.finish.has_value());
    EXPECT_EQ(count_stmts(lowered.finish->kernel.body, ir::Stmt::Kind::barrier), finish == 32 ? 0 : 2);
    auto poison = [&] {
      std::fill(g.bytes.begin(), g.bytes.end(), 0xff);
      std::fill(l.bytes.begin(), l.bytes.end(), 0xff);
    };
    poison();
    run(p, args, {req, nullptr, Backend::cpu});
    const OracleCheck check = check_against_reference(p, args);
    EXPECT_TRUE(check.ok) << check.first_mismatch;
    const std::vector<uint8_t> first_g = g.bytes, first_l = l.bytes;
    poison();
    run(p, args, {req, nullptr, Backend::cpu});
    EXPECT_EQ(g.bytes, first_g);
    EXPECT_EQ(l.bytes, first_l);
  }
}

// A row value reduced over the rows is one value a call; stored to a per-column output it fills
// every column. The second phase folds it as the scalar it is (its one slot part a program),
// beside a per-column accumulator in the same store: it read the workspace a column per lane
// as if the sum had column parts, past the workspace's end on every plan.
TEST(LowerRowProgram, ARowValueReducedOverTheRowsFillsAPerColumnOutput) {
  RowProgram p("total_in_every_column");
  Operand x = p.row_in("x"), dy = p.row_in("dy");
  Operand total = p.col_out("total"), shifted = p.col_out("shifted");
  RowExpr vx = p.load(x);
  RowExpr row_sum = p.reduce1(Axis::cols, monoid::sum(), vx);
  RowExpr all = p.reduce1(Axis::rows, monoid::sum(), row_sum);
  p.store(total, all);
  p.store(shifted, p.reduce1(Axis::rows, monoid::sum(), vx * p.load(dy)) + p.reduce1(Axis::rows, monoid::max(), row_sum));
  std::mt19937_64 rng(43);
  for (int64_t rows : {1, 5, 300})
    for (int64_t cols : {1, 7, 257}) {
      testing::HostMatrix a(DType::f32, rows, cols, cols), b(DType::f32, rows, cols, cols);
      testing::HostVector t(DType::f32, cols), sh(DType::f32, cols);
      a.fill_random(rng), b.fill_random(rng);
      Args args;
      args.set("x", a.view()).set("dy", b.view()).set("total", t.view()).set("shifted", sh.view());
      const Reference want = reference(p, args);
      for (int finish : {32, 1024})
        for (InputCaching caching : {InputCaching::registers, InputCaching::reread}) {
          PlanRequest req;
          req.finish_workers = finish, req.caching = caching, req.grid_limit = 3;
          SCOPED_TRACE(std::to_string(rows) + " x " + std::to_string(cols) + " " + req.to_json());
          std::fill(t.bytes.begin(), t.bytes.end(), 0xff);
          std::fill(sh.bytes.begin(), sh.bytes.end(), 0xff);
          run(p, args, {req, nullptr, Backend::cpu});
          const OracleCheck check = check_against_reference(p, args, want);
          EXPECT_TRUE(check.ok) << check.first_mismatch;
          for (int64_t c = 1; c < cols; ++c) EXPECT_EQ(static_cast<const float*>(t.data())[c], static_cast<const float*>(t.data())[0]);
        }
    }
}

// Newton's iteration for 1 / sqrt(a) reads v three times a step: 3^40 paths through 40 steps.
// Building, planning, lowering and the reference each reach a node once (walks of every path
// took seconds at 16 steps and tripled with each), and the result is right.
TEST(LowerRowProgram, ProgramsThatReuseValuesLowerInTimeLinearInTheirNodes) {
  RowProgram p("newton_rsqrt");
  Operand x = p.row_in("x"), y = p.row_out("y");
  RowExpr a = p.load(x) * p.load(x) + 1.0;
  RowExpr v = a * 0.0 + 0.5;
  for (int step = 0; step < 40; ++step) v = v * (1.5 - 0.5 * a * v * v);
  p.store(y, v);
  std::mt19937_64 rng(47);
  testing::HostMatrix xm(DType::f32, 3, 33, 33), ym(DType::f32, 3, 33, 33);
  xm.fill_random(rng);
  Args args;
  args.set("x", xm.view()).set("y", ym.view());
  run(p, args, {{}, nullptr, Backend::cpu});
  const OracleCheck check = check_against_reference(p, args);
  EXPECT_TRUE(check.ok) << check.first_mismatch;
  const float* xs = static_cast<const float*>(xm.data());
  const float* ys = static_cast<const float*>(ym.data());
  for (int i = 0; i < 3 * 33; ++i) EXPECT_NEAR(ys[i], 1.0 / std::sqrt(double(xs[i]) * xs[i] + 1.0), 1e-6) << i;
}

// Re-read plans read and write their partials of reductions over the rows in vector accesses
// where the workspace row is aligned, and sum them as register-cached plans of the same grid do.
TEST(LowerRowProgram, ReReadPartialsOfReductionsOverRowsMoveInVectorAccesses) {
  WeightGradientCall c(300, 256, 6);
  const RowProgram& p = c.p;
  const Args& args = c.args;
  testing::HostVector& out = c.out;
  std::vector<std::vector<uint8_t>> results;
  for (InputCaching caching : {InputCaching::reread, InputCaching::registers}) {
    PlanRequest req;
    req.caching = caching, req.workers_per_program = 64, req.vector_elems = 4, req.grid_limit = 7;
    std::fill(out.bytes.begin(), out.bytes.end(), 0xff);
    const LaunchRecord record = run(p, args, {req, nullptr, Backend::cpu});
    EXPECT_EQ(record.scalar_accesses, 0) << to_string(caching);
    EXPECT_GT(record.vector_accesses, 0) << to_string(caching);
    const OracleCheck check = check_against_reference(p, args);
    EXPECT_TRUE(check.ok) << check.first_mismatch;
    results.push_back(out.bytes);
  }
  EXPECT_EQ(results[0], results[1]);
}

// Load statements of `buffer` inside more than `outer` nested loops (`inside`), or inside at
// most `outer` (a loop over row blocks is one).
int loads_in_loops(const std::vector<ir::Stmt>& body, int buffer, bool inside, int outer, int depth = 0) {
  int n = 0;
  for (const ir::Stmt& s : body) {
    n += s.kind == ir::Stmt::Kind::load && s.buffer == buffer && (depth > outer) == inside;
    const int nested = depth + (s.kind == ir::Stmt::Kind::for_);
    n += loads_in_loops(s.body, buffer, inside, outer, nested) + loads_in_loops(s.else_body, buffer, inside, outer, nested);
  }
  return n;
}

// Load statements of `buffer` in `body` itself, outside its loops and branches.
int top_level_loads(const std::vector<ir::Stmt>& body, int buffer) {
  int n = 0;
  for (const ir::Stmt& s : body) n += s.kind == ir::Stmt::Kind::load && s.buffer == buffer;
  return n;
}

// row_prefetch "next": a group looping over row blocks loads the next block's row inputs and
// per-row inputs (rstd) before its loop and during each block, and computes what loading each
// block in turn computes, bit for bit: rms_norm_backward in bf16, f32 and f64, odd and even
// columns (scalar and vector accesses), predicated and clamped tails, one or two programs a
// group, row counts that leave guard programs and groups without a last block.
TEST(LowerRowProgram, PrefetchedRowBlocksComputeWhatLoadingEachInTurnComputes) {
  const RowProgram& p = training_program("rms_norm_backward");
  for (DType dt : {DType::bf16, DType::f32, DType::f64})
    for (auto [rows, cols] : {std::pair<int64_t, int64_t>{37, 300}, {50, 257}, {64, 256}}) {
      std::mt19937_64 rng(uint64_t(rows * cols) + uint64_t(dt));
      testing::HostMatrix dy(dt, rows, cols, cols), x(dt, rows, cols, cols), dx(dt, rows, cols, cols);
      testing::HostVector w(dt, cols), dw(dt, cols), rstd(dt == DType::f64 ? DType::f64 : DType::f32, rows);
      dy.fill_random(rng), x.fill_random(rng), w.fill_random(rng, 1.0, 0.5), rstd.fill_random(rng, 1.0, 0.2);
      Args args;
      args.set("dy", dy.view()).set("x", x.view()).set("weight", w.view()).set("rstd", rstd.view());
      args.set("dx", dx.view()).set("dweight", dw.view());
      const BoundCall call = bind(p, args);
      const Reference want = reference(p, args);
      for (TailHandling tail : {TailHandling::predicate, TailHandling::clamp})
        for (int programs : {1, 2}) {
          std::vector<std::vector<uint8_t>> results;
          for (RowPrefetch prefetch : {RowPrefetch::none, RowPrefetch::next}) {
            PlanRequest req;
            req.workers_per_program = 32, req.programs_per_group = programs, req.grid_limit = 3, req.tail = tail;
            req.caching = InputCaching::registers, req.private_budget = 128, req.row_prefetch = prefetch;
            const MappingPlan plan = choose_plan(call.plan_inputs(), req);
            SCOPED_TRACE(std::string(dtype_name(dt)) + " " + std::to_string(rows) + "x" + std::to_string(cols) + " " +
                         plan.to_json());
            ASSERT_EQ(plan.row_prefetch, prefetch);
            const ir::Kernel k = lower_row_program(p, call.signature(), plan).main.kernel;
            int xb = 0, rb = 0;
            while (k.buffers[xb].name != "x") ++xb;
            while (k.buffers[rb].name != "rstd") ++rb;
            // Before the loop: the first block's slice of x (a vector or a word a stripe) and rstd.
            EXPECT_EQ(top_level_loads(k.body, xb), prefetch == RowPrefetch::next ? plan.stripes : 0);
            EXPECT_EQ(top_level_loads(k.body, rb), prefetch == RowPrefetch::next ? 1 : 0);
            dx.poison();
            std::fill(dw.bytes.begin(), dw.bytes.end(), 0xff);
            run(p, args, {req, nullptr, Backend::cpu});
            const OracleCheck check = check_against_reference(p, args, want);
            EXPECT_TRUE(check.ok) << check.first_mismatch;
            std::vector<uint8_t> out(dx.bytes());
            out.insert(out.end(), dw.bytes.begin(), dw.bytes.end());
            results.push_back(std::move(out));
          }
          EXPECT_EQ(results[0], results[1]) << dtype_name(dt) << " " << rows << "x" << cols;
        }
    }
}

// A cluster looping over row blocks reduces over the rows: each group keeps the partials of
// its slice's columns in registers across its rows and writes them to its cluster's workspace
// slot. rms_norm_backward and layer_norm_backward (dweight, dbias) in bf16, f32 and f64 against
// the float64 oracle, over odd columns and row counts that leave clusters without a last row
// block (grid limits 3 and 7 over 5 and 37 rows), both merges, clusters of 2, 3 and 4; the
// same plan twice gives the same bits, as does it with the next row block prefetched
// (row_prefetch), and the workspace holds one slot a cluster.
TEST(LowerRowProgram, ClustersLoopingOverRowBlocksReduceOverTheRows) {
  DeviceLimits clusters;
  clusters.max_cluster_size = 16;
  int launched = 0;
  for (const char* name : {"rms_norm_backward", "layer_norm_backward"})
    for (DType dt : {DType::bf16, DType::f32, DType::f64})
      for (auto [rows, cols] : {std::pair<int64_t, int64_t>{37, 300}, {5, 1001}}) {
        const RowProgram& p = training_program(name);
        std::mt19937_64 rng(uint64_t(rows * cols) + uint64_t(dt));
        const DType stat = dt == DType::f64 ? DType::f64 : DType::f32;
        testing::HostMatrix dy(dt, rows, cols, cols), x(dt, rows, cols, cols), dx(dt, rows, cols, cols);
        testing::HostVector w(dt, cols), dw(dt, cols), db(dt, cols), rstd(stat, rows), mean(stat, rows);
        dy.fill_random(rng), x.fill_random(rng), w.fill_random(rng, 1.0, 0.5), rstd.fill_random(rng, 1.0, 0.2);
        mean.fill_random(rng, 0.0, 0.3);
        Args args;
        args.set("dy", dy.view()).set("x", x.view()).set("weight", w.view()).set("rstd", rstd.view());
        args.set("dx", dx.view()).set("dweight", dw.view());
        if (std::string(name) == "layer_norm_backward") args.set("mean", mean.view()).set("dbias", db.view());
        const BoundCall call = bind(p, args);
        const Reference want = reference(p, args);
        for (int C : {2, 3, 4})
          for (int grid_limit : {3, 7})
            for (MergeStrategy merge : {MergeStrategy::staged, MergeStrategy::combine}) {
              std::vector<std::vector<uint8_t>> results;
              for (int k = 0; k < 3; ++k) {
                PlanRequest req;
                req.ctas_per_program = C, req.workers_per_program = 32, req.grid_limit = grid_limit, req.merge = merge;
                req.caching = InputCaching::registers, req.private_budget = 255;
                req.row_prefetch = k == 2 ? RowPrefetch::next : RowPrefetch::none;
                const MappingPlan plan = choose_plan(call.plan_inputs(), req, clusters);
                SCOPED_TRACE(std::string(name) + " " + std::string(dtype_name(dt)) + " " + std::to_string(rows) + "x" +
                             std::to_string(cols) + " " + plan.to_json());
                dx.poison();
                std::fill(dw.bytes.begin(), dw.bytes.end(), 0xff);
                std::fill(db.bytes.begin(), db.bytes.end(), 0xff);
                const LaunchRecord rec = run(p, args, {req, nullptr, Backend::cpu});
                EXPECT_EQ(rec.groups, std::min<int64_t>(rows, grid_limit) * C);
                EXPECT_EQ(workspace_slots(rec.plan, rec.groups), std::min<int64_t>(rows, grid_limit));
                const OracleCheck check = check_against_reference(p, args, want);
                EXPECT_TRUE(check.ok) << check.first_mismatch;
                EXPECT_TRUE(dx.outside_untouched());
                std::vector<uint8_t> out(dx.bytes());
                out.insert(out.end(), dw.bytes.begin(), dw.bytes.end());
                out.insert(out.end(), db.bytes.begin(), db.bytes.end());
                results.push_back(std::move(out));
              }
              EXPECT_EQ(results[0], results[1]);
              EXPECT_EQ(results[0], results[2]);  // the next row block prefetched: the same bits
              ++launched;
            }
      }
  EXPECT_EQ(launched, 2 * 3 * 2 * 3 * 2 * 2);
}

// row_prefetch "next" on a re-read row: every re-read loop loads its first iteration's stripes
// before it and each iteration the next one's before its work. The arithmetic is the same, so
// the results are bitwise those of the loop loading each iteration in turn: the forward
// operators, softmax_backward and rms_norm_backward (its weight gradient's partials re-read
// through the workspace) in f32, bf16 and f64, odd and unaligned rows (scalar accesses, a
// peeled head), unroll 1, 2 and 3, predicated and clamped tails, one or two programs a group;
// the row input's loads are twice those of the plain loop (a prologue each) on rows as they are.
TEST(LowerRowProgram, ReReadLoopsLoadingTheNextIterationComputeTheSameBits) {
  std::mt19937_64 rng(53);
  int compared = 0;
  for (const char* name : {"softmax", "log_softmax", "rms_norm", "layer_norm", "softmax_backward", "rms_norm_backward"})
    for (DType dt : {DType::f32, DType::bf16, DType::f64})
      for (auto [rows, cols, stride] : {std::tuple{5, 1000, 1000}, std::tuple{3, 3001, 3003}, std::tuple{9, 70, 72}}) {
        const bool training = std::string(name).find("backward") != std::string::npos;
        const RowProgram& p = training ? training_program(name) : builtin_program(parse_op(name));
        const DType stat = dt == DType::f64 ? DType::f64 : DType::f32;
        testing::HostMatrix x(dt, rows, cols, stride, 1), dy(dt, rows, cols, stride), y(dt, rows, cols, stride);
        testing::HostVector w(dt, cols), b(dt, cols), dw(dt, cols), rstd(stat, rows);
        x.fill_random(rng, 2.0), dy.fill_random(rng), w.fill_random(rng, 1.0, 0.5), b.fill_random(rng, 0.0, 0.5);
        rstd.fill_random(rng, 1.0, 0.2);
        Args args;
        const std::string n = name;
        if (n == "softmax_backward") {
          args.set("y", x.view()).set("dy", dy.view()).set("dx", y.view());
        } else if (n == "rms_norm_backward") {
          args.set("x", x.view()).set("dy", dy.view()).set("dx", y.view()).set("weight", w.view());
          args.set("rstd", rstd.view()).set("dweight", dw.view());
        } else {
          args.set("x", x.view()).set("y", y.view());
          if (n == "rms_norm" || n == "layer_norm") args.set("weight", w.view());
          if (n == "layer_norm") args.set("bias", b.view());
        }
        const BoundCall call = bind(p, args);
        const Reference want = reference(p, args);
        for (int unroll : {1, 2, 3})
          for (TailHandling tail : {TailHandling::predicate, TailHandling::clamp})
            for (int programs : {1, 2}) {
              std::vector<std::vector<uint8_t>> results;
              std::vector<int> loads;
              for (RowPrefetch prefetch : {RowPrefetch::none, RowPrefetch::next}) {
                PlanRequest req;
                req.caching = InputCaching::reread, req.workers_per_program = 64, req.stripe_unroll = unroll;
                req.tail = tail, req.programs_per_group = programs, req.row_prefetch = prefetch;
                if (n == "rms_norm_backward") req.grid_limit = 2;
                const MappingPlan plan = choose_plan(call.plan_inputs(), req);
                SCOPED_TRACE(n + " " + std::string(dtype_name(dt)) + " " + std::to_string(rows) + "x" +
                             std::to_string(cols) + " " + plan.to_json());
                ASSERT_EQ(plan.row_prefetch, prefetch);
                const ir::Kernel k = lower_row_program(p, call.signature(), plan).main.kernel;
                const int outer = plan.grid_limit > 0;
                loads.push_back(loads_in_loops(k.body, 0, false, outer));
                loads.push_back(loads_in_loops(k.body, 0, true, outer));
                y.poison();
                std::fill(dw.bytes.begin(), dw.bytes.end(), 0xff);
                run(p, args, {req, nullptr, Backend::cpu});
                const OracleCheck check = check_against_reference(p, args, want);
                EXPECT_TRUE(check.ok) << check.first_mismatch;
                EXPECT_TRUE(y.outside_untouched());
                std::vector<uint8_t> out(y.bytes());
                out.insert(out.end(), dw.bytes.begin(), dw.bytes.end());
                results.push_back(std::move(out));
              }
              EXPECT_EQ(results[0], results[1]) << n << " " << dtype_name(dt) << " " << cols << " unroll " << unroll;
              // The loops load as many as before, and their prologues as many more (besides any
              // load of the row's head, outside the loops either way).
              EXPECT_EQ(loads[3], loads[1]) << n << " " << cols;
              EXPECT_EQ(loads[2] - loads[0], loads[1]) << n << " " << cols;
              ++compared;
            }
      }
  EXPECT_EQ(compared, 6 * 3 * 3 * 3 * 2 * 2);
}

// Row values reduced over the rows (cross-entropy's summed and mean losses) need no loop over
// row blocks: a grid of one row block a group (or a cluster) writes a workspace slot for each of
// its programs, and the second phase folds them in slot order, its workers splitting the
// slots. cross_entropy_fused in f32, bf16 and f64, ignored rows and targets at both ends of the
// row, on register-cached, re-read and staged rows, packed programs and clusters of 2 and 3,
// against the float64 oracle; a slot a program of every row block, one finish group, and the
// same bits from run to run. A per-column accumulator still needs the loop (grid_limit >= 1).
TEST(LowerRowProgram, RowValuesReducedOverTheRowsTakeASlotARowBlock) {
  DeviceLimits clusters;
  clusters.max_cluster_size = 16;
  const RowProgram& p = training_program("cross_entropy_fused");
  int launched = 0;
  for (DType dt : {DType::f32, DType::bf16, DType::f64})
    for (auto [rows, cols] : {std::pair<int64_t, int64_t>{37, 300}, {5, 1001}, {1, 64}, {1500, 40}}) {
      std::mt19937_64 rng(uint64_t(rows * cols) + uint64_t(dt));
      const DType stat = dt == DType::f64 ? DType::f64 : DType::f32;
      testing::HostMatrix logits(dt, rows, cols, cols), dlogits(dt, rows, cols, cols);
      logits.fill_random(rng, 2.0);
      testing::HostVector target(DType::i64, rows), count(stat, 1), loss(stat, rows), sum(stat, 1), mean(stat, 1);
      int64_t counted = 0;
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t t = r % 5 == 3 ? -100 : r % 7 == 1 ? 0 : r % 7 == 2 ? cols - 1 : int64_t(rng() % uint64_t(cols));
        store_from_int(target.data(), r, DType::i64, t);
        counted += t != -100;
      }
      store_from_double(count.data(), 0, stat, double(counted));
      Args args;
      args.set("logits", logits.view()).set("dlogits", dlogits.view()).set("target", target.view());
      args.set("count", VectorView{count.data(), stat, rows, 0}).set("ignore_index", -100.0);
      args.set("loss", loss.view()).set("loss_sum", sum.view()).set("loss_mean", mean.view());
      const BoundCall call = bind(p, args);
      const Reference want = reference(p, args);
      struct Mapping {
        InputCaching caching;
        int C, P;
      };
      for (Mapping m : {Mapping{InputCaching::registers, 1, 1}, Mapping{InputCaching::registers, 1, 4},
                        Mapping{InputCaching::reread, 1, 1}, Mapping{InputCaching::reread, 1, 2},
                        Mapping{InputCaching::shared, 1, 1}, Mapping{InputCaching::registers, 2, 1},
                        Mapping{InputCaching::registers, 3, 1}, Mapping{InputCaching::shared, 2, 1}}) {
        PlanRequest req;
        req.caching = m.caching, req.ctas_per_program = m.C, req.programs_per_group = m.P, req.grid_limit = 0;
        req.workers_per_program = m.C > 1 ? 64 : 32, req.private_budget = 255, req.finish_workers = 64;
        const MappingPlan plan = choose_plan(call.plan_inputs(), req, clusters);
        SCOPED_TRACE(std::string(dtype_name(dt)) + " " + std::to_string(rows) + "x" + std::to_string(cols) + " " +
                     plan.to_json());
        const LoweredProgram lowered = lower_row_program(p, call.signature(), plan);
        ASSERT_TRUE(lowered.finish.has_value());
        EXPECT_EQ(finish_groups(*lowered.finish, cols), 1);  // scalar outputs only
        std::vector<std::vector<uint8_t>> results;
        for (int k = 0; k < 2; ++k) {
          dlogits.poison();
          for (testing::HostVector* v : {&loss, &sum, &mean}) std::fill(v->bytes.begin(), v->bytes.end(), 0xff);
          const LaunchRecord rec = run(p, args, {req, nullptr, Backend::cpu});
          const int64_t blocks = (rows + m.P - 1) / m.P;
          EXPECT_EQ(rec.groups, blocks * m.C);
          EXPECT_EQ(workspace_slots(rec.plan, rec.groups), blocks * m.P);
          EXPECT_EQ(rec.kernels, 2);
          const OracleCheck check = check_against_reference(p, args, want);
          EXPECT_TRUE(check.ok) << check.first_mismatch;
          EXPECT_TRUE(dlogits.outside_untouched());
          std::vector<uint8_t> out(dlogits.bytes());
          for (testing::HostVector* v : {&loss, &sum, &mean}) out.insert(out.end(), v->bytes.begin(), v->bytes.end());
          results.push_back(std::move(out));
        }
        EXPECT_EQ(results[0], results[1]);
        ++launched;
      }
    }
  EXPECT_EQ(launched, 3 * 4 * 8);
  // A weight gradient: per-column accumulators need a looping grid.
  WeightGradientCall c(30, 64, 2);
  PlanRequest req;
  req.grid_limit = 0;
  const std::string e = testing::error_of([&] { run(c.p, c.args, {req, nullptr, Backend::cpu}); });
  EXPECT_NE(e.find("plan.grid_limit': expected at least 1 for a program with per-column accumulators over the rows"),
            std::string::npos)
      << e;
}

// caching "shared": the row slices go to shared memory through async copies, a group of them
// a stripe, and every pass reads them back from there. The results are bitwise those of the same plan caching in
// registers (the same chunk graphs over the same elements), over packed programs, clusters,
// both merges, odd and unaligned rows (the copies' scalar path) and every float dtype; the
// row is read from memory once; x is never loaded but by the copies (and a group's first vector
// where a cluster's LayerNorm shifts its sums by it).
TEST(LowerRowProgram, StagedRowsComputeWhatRegisterCachedRowsCompute) {
  std::mt19937_64 rng(31);
  DeviceLimits clusters;
  clusters.max_cluster_size = 16;
  for (Op op : {Op::softmax, Op::log_softmax, Op::rms_norm, Op::layer_norm})
    for (DType dt : {DType::f32, DType::bf16, DType::f64})
      for (auto [rows, cols, stride] : {std::tuple{5, 1000, 1000}, std::tuple{3, 3001, 3003}, std::tuple{4, 64, 64}})
        for (auto [C, P] : {std::pair{1, 1}, std::pair{1, 2}, std::pair{4, 1}})
          for (MergeStrategy merge : {MergeStrategy::staged, MergeStrategy::combine}) {
            SCOPED_TRACE(std::string(op_name(op)) + " " + std::string(dtype_name(dt)) + " " + std::to_string(rows) +
                         "x" + std::to_string(cols) + " C " + std::to_string(C) + " P " + std::to_string(P) + " " +
                         to_string(merge));
            const RowProgram& p = builtin_program(op);
            testing::HostMatrix x(dt, rows, cols, stride, 1), y(dt, rows, cols, stride);
            testing::HostVector w(dt, cols), b(dt, cols);
            x.fill_random(rng, 3.0), w.fill_random(rng, 1.0, 0.5), b.fill_random(rng, 0.0, 0.5);
            Args args = Args().set("x", x.view()).set("y", y.view());
            if (op == Op::rms_norm || op == Op::layer_norm) args.set("weight", w.view());
            if (op == Op::layer_norm) args.set("bias", b.view());
            const BoundCall call = bind(p, args);
            std::vector<std::vector<uint8_t>> results;
            std::vector<int64_t> loaded;
            for (InputCaching caching : {InputCaching::registers, InputCaching::shared}) {
              PlanRequest req;
              req.caching = caching, req.merge = merge, req.ctas_per_program = C, req.programs_per_group = P;
              req.workers_per_program = C > 1 ? 64 : 32, req.private_budget = 255;
              const MappingPlan plan = choose_plan(call.plan_inputs(), req, clusters);
              const ir::Kernel k = lower_row_program(p, call.signature(), plan).main.kernel;
              if (caching == InputCaching::shared) {
                EXPECT_EQ(count_stmts(k.body, ir::Stmt::Kind::async_copy), plan.stripes);
                // x only through the copies, but for LayerNorm's shift on a cluster (the group's
                // first vector, loaded by every worker).
                EXPECT_EQ(count_stmts(k.body, ir::Stmt::Kind::load, 0), C > 1 && op == Op::layer_norm ? 1 : 0);
                // A group a stripe, and a wait before each stripe's first read at most.
                EXPECT_EQ(count_stmts(k.body, ir::Stmt::Kind::async_commit), plan.stripes);
                EXPECT_GE(count_stmts(k.body, ir::Stmt::Kind::async_wait), 1);
                EXPECT_LE(count_stmts(k.body, ir::Stmt::Kind::async_wait), plan.stripes);
                EXPECT_GE(count_stmts(k.body, ir::Stmt::Kind::staged_load), 2 * plan.stripes);  // a pass each
              }
              y.poison();
              const LaunchRecord rec = run(p, args, {req, nullptr, Backend::cpu});
              const OracleCheck check = check_against_reference(p, args);
              EXPECT_TRUE(check.ok) << check.first_mismatch;
              EXPECT_TRUE(y.outside_untouched());
              results.push_back(y.bytes());
              loaded.push_back(rec.bytes_loaded);
            }
            EXPECT_EQ(results[0], results[1]);
            EXPECT_EQ(loaded[0], loaded[1]);
          }
}

}  // namespace
}  // namespace tile
