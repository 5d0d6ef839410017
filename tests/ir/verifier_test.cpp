// Typed raw-IR proof cases: small kernels the verifier must accept or reject, each also run
// on the CPU backend, which must agree (a rejected kernel misbehaves when executed).
#include "ir/verifier.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>

#include "backend/cpu/executor.hpp"
#include "ir/printer.hpp"
#include "support/cluster_kernel.hpp"

namespace tile::ir {
namespace {

// Two programs of 64 workers; each sums its row of 64 floats with shuffles, shared memory and
// one barrier, then worker 0 stores the sum. `guard` wraps the reduction in `if (row < rows)`.
// `real`: the kernel's float type (f64: f64 buffers, registers and shared slots).
Kernel row_sum(Scope kind, bool guard_skips_barrier, bool divergent_barrier, int stride, Type real = Type::f32) {
  Kernel k;
  k.name = "row_sum";
  k.programs_per_group = 2;
  k.workers_per_program = 64;
  k.real = real;
  const DType dt = real == Type::f64 ? DType::f64 : DType::f32;
  k.buffers = {{"x", dt, false}, {"y", dt, true}};
  k.params = {{"rows", Type::i64}};
  k.shared = {{"partials", 0, 2, stride}};
  int row = k.add_reg("row", Type::i64), v = k.add_reg("v", real), t = k.add_reg("t", real);
  int total = k.add_reg("total", real);
  auto r = [&](int id) { return reg(id, k.regs[id].type); };
  std::vector<Stmt> work;
  work.push_back(load({v}, 0, binary(BinOp::add, binary(BinOp::mul, r(row), i64_const(64)), cast(Type::i64, special(Special::worker_in_program))),
                      i64_const(1), b1_const(false), false, 0.0f));
  for (int off = 16; off >= 1; off /= 2) {
    work.push_back(shfl_xor(t, v, off, 32));
    work.push_back(assign(v, binary(BinOp::add, r(v), r(t))));
  }
  work.push_back(if_(binary(BinOp::eq, special(Special::lane), i32_const(0)), {shared_store(0, special(Special::warp_in_program), r(v))}));
  Stmt bar = barrier(kind);
  if (divergent_barrier)
    work.push_back(if_(binary(BinOp::eq, special(Special::lane), i32_const(0)), {bar}));
  else
    work.push_back(bar);
  std::vector<Stmt> tail;
  tail.push_back(shared_load(total, 0, i32_const(0)));
  tail.push_back(shared_load(t, 0, i32_const(1)));
  tail.push_back(assign(total, binary(BinOp::add, r(total), r(t))));
  tail.push_back(if_(binary(BinOp::eq, special(Special::worker_in_program), i32_const(0)),
                     {store({total}, 1, r(row), i64_const(1), b1_const(false))}));
  k.body.push_back(assign(row, binary(BinOp::add, binary(BinOp::mul, special(Special::group_index), i64_const(2)),
                                      cast(Type::i64, special(Special::program_in_group)))));
  ExprPtr valid = binary(BinOp::lt, r(row), param(0, Type::i64));
  if (guard_skips_barrier) {
    for (Stmt& s : tail) work.push_back(s);
    k.body.push_back(if_(valid, work));
  } else {
    // Guard programs run everything; only their memory accesses would be masked in real code.
    for (Stmt& s : work) k.body.push_back(s);
    for (Stmt& s : tail) k.body.push_back(s);
  }
  return k;
}

bool mentions(const std::vector<std::string>& errors, const std::string& text) {
  for (const std::string& e : errors)
    if (e.find(text) != std::string::npos) return true;
  return false;
}

cpu::ExecStats execute_rows(const Kernel& k, int64_t rows, std::vector<float>& y) {
  std::vector<float> x(size_t(std::max<int64_t>(rows, 2) + 1) * 64);
  for (size_t i = 0; i < x.size(); ++i) x[i] = float(i % 7);
  y.assign(size_t(rows + 1), -1.0f);
  cpu::LaunchArgs args;
  args.groups = (rows + 1) / 2;
  args.buffers = {{x.data(), 0, int64_t(x.size())}, {y.data(), 0, int64_t(y.size())}};
  args.params = {{0, rows}};
  return cpu::execute(k, args);
}

TEST(VerifierProof, AcceptsPackedProgramsWithUnconditionalGroupBarrier) {
  Kernel k = row_sum(Scope::group, false, false, 2);
  EXPECT_TRUE(verify(k).empty()) << verify(k)[0];
  std::vector<float> y;
  execute_rows(k, 4, y);
  float want = 0;
  for (int i = 64; i < 128; ++i) want += float(i % 7);
  EXPECT_EQ(y[1], want);
}

TEST(VerifierProof, RejectsDivergentGroupBarrier) {
  Kernel k = row_sum(Scope::group, false, true, 2);
  EXPECT_TRUE(mentions(verify(k), "group barrier under control flow that is not uniform"));
  std::vector<float> y;
  EXPECT_THROW(execute_rows(k, 4, y), cpu::ExecutionError);
}

TEST(VerifierProof, RejectsGuardProgramThatSkipsAGroupBarrier) {
  Kernel k = row_sum(Scope::group, true, false, 2);
  EXPECT_TRUE(mentions(verify(k), "guard program"));
  std::vector<float> y;
  EXPECT_NO_THROW(execute_rows(k, 4, y));              // an even row count hides it ...
  EXPECT_THROW(execute_rows(k, 3, y), cpu::ExecutionError);  // ... an odd one does not
}

TEST(VerifierProof, AcceptsProgramBarrierUnderProgramUniformGuard) {
  // A program-scope barrier may sit under `row < rows`: the whole program skips it together.
  Kernel k = row_sum(Scope::program, true, false, 2);
  EXPECT_TRUE(verify(k).empty()) << verify(k)[0];
  std::vector<float> y;
  EXPECT_NO_THROW(execute_rows(k, 3, y));
}

TEST(VerifierProof, RejectsProgramBarrierThatPartOfItsProgramSkips) {
  Kernel k = row_sum(Scope::program, false, true, 2);
  EXPECT_TRUE(mentions(verify(k), "program barrier under control flow that is not uniform across the program"));
}

TEST(VerifierProof, RejectsBarriersOfScopesKernelsDoNotSynchronise) {
  // Warps converge without a barrier and nothing here spans a cluster or the grid: a barrier
  // of those scopes is a lowering bug, whatever control flow it sits on.
  for (Scope scope : {Scope::lane, Scope::warp, Scope::cluster, Scope::grid}) {  // cluster: C = 1 here
    Kernel k = row_sum(scope, false, false, 2);
    EXPECT_TRUE(mentions(verify(k), std::string("barrier of scope ") + scope_name(scope))) << scope_name(scope);
  }
}

TEST(VerifierProof, RejectsOverlappingSharedRegionsOfPackedPrograms) {
  Kernel k = row_sum(Scope::group, false, false, 1);  // stride 1 < 2 slots
  EXPECT_TRUE(mentions(verify(k), "overlaps"));
  std::vector<float> y;
  EXPECT_THROW(execute_rows(k, 4, y), cpu::ExecutionError);  // the programs race on slot 1
}

TEST(VerifierProof, RejectsTypeMismatches) {
  Kernel k = row_sum(Scope::group, false, false, 2);
  k.body.push_back(assign(0, binary(BinOp::add, reg(0, Type::i64), f32_const(1.0))));
  k.body.push_back(if_(i32_const(1), {}));
  std::vector<std::string> errors = verify(k);
  EXPECT_TRUE(mentions(errors, "add of i64 and f32"));
  EXPECT_TRUE(mentions(errors, "if condition"));
}

// One program of one warp storing register v at y[lane] after `body`: the cases of definite
// assignment. The executor starts every float register as NaN, so a lane that reaches the store
// with v never assigned stores NaN.
Kernel store_after(std::vector<Stmt> (*body)(Kernel&, int v)) {
  Kernel k;
  k.name = "store_after";
  k.programs_per_group = 1;
  k.workers_per_program = 32;
  k.buffers = {{"y", DType::f32, true}};
  const int v = k.add_reg("v", Type::f32);
  k.body = body(k, v);
  k.body.push_back(store({v}, 0, cast(Type::i64, special(Special::lane)), i64_const(1), b1_const(false)));
  return k;
}

std::vector<float> run_store_after(const Kernel& k) {
  std::vector<float> y(32, -1.0f);
  cpu::LaunchArgs args;
  args.groups = 1;
  args.buffers = {{y.data(), 0, int64_t(y.size())}};
  cpu::execute(k, args);
  return y;
}

TEST(VerifierProof, AcceptsRegistersAssignedOnEveryPathBeforeTheirReads) {
  // Both arms of an if; before a loop that reads and writes it; a loop's own variable.
  for (auto body : {+[](Kernel&, int v) {
                      return std::vector<Stmt>{if_(binary(BinOp::eq, special(Special::lane), i32_const(0)),
                                                   {assign(v, f32_const(1))}, {assign(v, f32_const(2))})};
                    },
                    +[](Kernel& k, int v) {
                      const int i = k.add_reg("i", Type::i64);
                      return std::vector<Stmt>{
                          assign(v, f32_const(0)),
                          for_(i, i64_const(0), i64_const(3),
                               {assign(v, binary(BinOp::add, reg(v, Type::f32), cast(Type::f32, reg(i, Type::i64))))})};
                    }}) {
    const Kernel k = store_after(body);
    const std::vector<std::string> errors = verify(k);
    EXPECT_TRUE(errors.empty()) << errors[0];
    for (float y : run_store_after(k)) EXPECT_FALSE(std::isnan(y));
  }
}

TEST(VerifierProof, RejectsARegisterReadWhereSomePathLeftItUnassigned) {
  // One arm of an if; only inside a loop (it may run zero times: here it does); read in a loop's first
  // iteration before the body assigns it; the source of a shuffle.
  for (auto body : {+[](Kernel&, int v) {
                      return std::vector<Stmt>{
                          if_(binary(BinOp::eq, special(Special::lane), i32_const(0)), {assign(v, f32_const(1))})};
                    },
                    +[](Kernel& k, int v) {
                      const int i = k.add_reg("i", Type::i64);
                      return std::vector<Stmt>{for_(i, i64_const(0), i64_const(0), {assign(v, f32_const(1))})};
                    },
                    +[](Kernel& k, int v) {
                      const int i = k.add_reg("i", Type::i64), t = k.add_reg("t", Type::f32);
                      return std::vector<Stmt>{for_(i, i64_const(0), i64_const(3),
                                                    {assign(t, binary(BinOp::add, reg(v, Type::f32), f32_const(1))),
                                                     assign(v, reg(t, Type::f32))})};
                    },
                    +[](Kernel& k, int v) {
                      const int t = k.add_reg("t", Type::f32);
                      return std::vector<Stmt>{shfl_xor(v, t, 1, 32)};
                    }}) {
    const Kernel k = store_after(body);
    const std::vector<std::string> errors = verify(k);
    EXPECT_TRUE(mentions(errors, "is read before it is assigned on some path")) << to_string(k);
    // Executed, some lane stores the register's initial NaN.
    bool nan = false;
    for (float y : run_store_after(k)) nan |= std::isnan(y);
    EXPECT_TRUE(nan) << to_string(k);
  }
}

TEST(VerifierProof, AcceptsAFloat64KernelThatTheExecutorRunsInDouble) {
  Kernel k = row_sum(Scope::group, false, false, 2, Type::f64);
  ASSERT_TRUE(verify(k).empty()) << verify(k)[0];
  // 1 + 2^-40 per element: fp32 would round each to 1.
  std::vector<double> x(5 * 64, 1.0 + 0x1p-40), y(5, -1.0);
  cpu::LaunchArgs args;
  args.groups = 2;
  args.buffers = {{x.data(), 0, int64_t(x.size())}, {y.data(), 0, int64_t(y.size())}};
  args.params = {{0, 4}};
  cpu::execute(k, args);
  for (int r = 0; r < 4; ++r) EXPECT_EQ(y[r], 64.0 + 64 * 0x1p-40) << "row " << r;
  EXPECT_EQ(y[4], -1.0);  // the guard program's row
}

TEST(VerifierProof, RejectsFloat32ValuesInAFloat64Kernel) {
  Kernel k = row_sum(Scope::group, false, false, 2, Type::f64);
  k.body.push_back(assign(1, binary(BinOp::add, reg(1, Type::f64), f32_const(1.0))));
  k.add_reg("narrow", Type::f32);
  k.params.push_back({"eps", Type::f32});
  k.buffers.push_back({"w", DType::f32, false});
  std::vector<std::string> errors = verify(k);
  EXPECT_TRUE(mentions(errors, "add of f64 and f32"));
  EXPECT_TRUE(mentions(errors, "f32 value in a kernel whose float type is f64"));
  EXPECT_TRUE(mentions(errors, "register narrow is f32 in a kernel whose float type is f64"));
  EXPECT_TRUE(mentions(errors, "parameter eps is f32 in a kernel whose float type is f64"));
  EXPECT_TRUE(mentions(errors, "buffer w is f32 in a kernel whose float type is f64"));
  // And the converse: an f64 buffer in an f32 kernel.
  Kernel f = row_sum(Scope::group, false, false, 2);
  f.buffers.push_back({"w", DType::f64, false});
  EXPECT_TRUE(mentions(verify(f), "buffer w is f64 in a kernel whose float type is f32"));
}

TEST(VerifierProof, CountsACachedFloat64RegisterAsTwoScalars) {
  Kernel k = row_sum(Scope::group, false, false, 2, Type::f64);
  k.private_budget = 7;
  for (int i = 0; i < 4; ++i) k.add_reg("cached" + std::to_string(i), Type::f64, true);
  EXPECT_TRUE(mentions(verify(k), "cached input registers (8) exceed the private budget of 7"));
  k.private_budget = 8;
  EXPECT_TRUE(verify(k).empty());
}

TEST(VerifierProof, RejectsCachedValuesBeyondThePrivateBudget) {
  Kernel k = row_sum(Scope::group, false, false, 2);
  k.private_budget = 3;
  for (int i = 0; i < 4; ++i) k.add_reg("cached" + std::to_string(i), Type::f32, true);
  EXPECT_TRUE(mentions(verify(k), "exceed the private budget of 3"));
}

TEST(VerifierProof, RejectsShuffleUnderLaneDependentControlFlow) {
  Kernel k = row_sum(Scope::group, false, false, 2);
  k.body.push_back(if_(binary(BinOp::lt, special(Special::lane), i32_const(16)), {shfl_xor(1, 1, 1, 32)}));
  EXPECT_TRUE(mentions(verify(k), "shfl_xor"));
}

// A complete butterfly (t = shfl_xor(v, o) and right after it m = v op t, op commutative, for
// o = 16 .. 1) leaves the same bits in every lane: a shuffle may run under a test of the result.
// An incomplete one, a statement between the shuffle and its use, or a non-commutative op may not.
Kernel butterfly_guard(std::vector<int> offsets, bool gap, BinOp op) {
  Kernel k = row_sum(Scope::group, false, false, 2);
  const int v = 1, t = 2;
  if (k.regs[v].name != "v" || k.regs[t].name != "t") throw std::logic_error("row_sum's registers moved");
  int cur = k.add_reg("m", Type::f32);  // v differs from lane to lane (a load per worker)
  k.body.push_back(assign(cur, binary(BinOp::mul, reg(v, Type::f32), f32_const(2))));
  for (int off : offsets) {
    const int next = k.add_reg("m", Type::f32);
    k.body.push_back(shfl_xor(t, cur, off, 32));
    if (gap) k.body.push_back(assign(v, f32_const(1)));
    k.body.push_back(assign(next, binary(op, reg(cur, Type::f32), reg(t, Type::f32))));
    cur = next;
  }
  k.body.push_back(if_(binary(BinOp::lt, f32_const(0), reg(cur, Type::f32)), {shfl_xor(t, cur, 1, 32)}));
  return k;
}

TEST(VerifierProof, AcceptsAShuffleUnderACompleteButterflysValue) {
  for (BinOp op : {BinOp::add, BinOp::max, BinOp::min, BinOp::mul}) {
    Kernel k = butterfly_guard({16, 8, 4, 2, 1}, false, op);
    EXPECT_TRUE(verify(k).empty()) << verify(k)[0];
  }
  Kernel reordered = butterfly_guard({1, 4, 16, 2, 8}, false, BinOp::add);
  EXPECT_TRUE(verify(reordered).empty()) << verify(reordered)[0];
}

TEST(VerifierProof, RejectsAShuffleUnderAnIncompleteButterfly) {
  EXPECT_TRUE(mentions(verify(butterfly_guard({16, 8, 4, 2}, false, BinOp::add)), "not uniform across the warp"));
  EXPECT_TRUE(mentions(verify(butterfly_guard({16, 8, 4, 2, 2}, false, BinOp::add)), "not uniform across the warp"));
  EXPECT_TRUE(mentions(verify(butterfly_guard({16, 8, 4, 2, 1}, true, BinOp::add)), "not uniform across the warp"));
  EXPECT_TRUE(mentions(verify(butterfly_guard({16, 8, 4, 2, 1}, false, BinOp::sub)), "not uniform across the warp"));
}

// Lanes reading the warps' partials at lane mod 2 (two warps a program) agree across every
// xor-mask from 2 up, so a butterfly over offset 1 alone completes them: a shuffle may run under
// a test of the result. Without it, with the wrong offset, or with the slot read only by some
// lanes, it may not.
enum class SlotFold { butterfly, none, wrong_offset, divergent_read };
Kernel lane_slot_guard(SlotFold fold) {
  Kernel k = row_sum(Scope::group, false, false, 2);
  const int t = 2;
  if (k.regs[t].name != "t") throw std::logic_error("row_sum's registers moved");
  const int part = k.add_reg("part", Type::f32), m = k.add_reg("m", Type::f32);
  Stmt read = shared_load(part, 0, binary(BinOp::rem, special(Special::lane), i32_const(2)));
  if (fold == SlotFold::divergent_read)
    k.body.push_back(if_(binary(BinOp::lt, special(Special::lane), i32_const(16)), {read}));
  else
    k.body.push_back(read);
  if (fold != SlotFold::none) {
    k.body.push_back(shfl_xor(t, part, fold == SlotFold::wrong_offset ? 2 : 1, 32));
    k.body.push_back(assign(m, binary(BinOp::add, reg(part, Type::f32), reg(t, Type::f32))));
  } else {
    k.body.push_back(assign(m, reg(part, Type::f32)));
  }
  k.body.push_back(if_(binary(BinOp::lt, f32_const(0), reg(m, Type::f32)), {shfl_xor(t, m, 1, 32)}));
  return k;
}

TEST(VerifierProof, AcceptsAShuffleUnderAButterflyOverSlotsReadAtLaneModulo) {
  Kernel k = lane_slot_guard(SlotFold::butterfly);
  EXPECT_TRUE(verify(k).empty()) << verify(k)[0];
}

TEST(VerifierProof, RejectsAShuffleUnderSlotsReadAtLaneModuloAndNotFolded) {
  for (SlotFold fold : {SlotFold::none, SlotFold::wrong_offset, SlotFold::divergent_read})
    EXPECT_TRUE(mentions(verify(lane_slot_guard(fold)), "not uniform across the warp")) << int(fold);
}

// A value every lane reads from lane 0 (shfl_idx over the whole warp) is warp-uniform: a shuffle
// may run under a test of it. Over a segment of 16 lanes it is not, and a shfl_idx under
// lane-dependent control flow or with its lane outside its width is rejected.
Kernel broadcast_guard(int width) {
  Kernel k = row_sum(Scope::group, false, false, 2);
  const int v = 1, t = 2;
  if (k.regs[v].name != "v" || k.regs[t].name != "t") throw std::logic_error("row_sum's registers moved");
  const int b = k.add_reg("b", Type::f32);
  k.body.push_back(shfl_idx(b, v, 0, width));
  k.body.push_back(if_(binary(BinOp::lt, f32_const(0), reg(b, Type::f32)), {shfl_xor(t, v, 1, 32)}));
  return k;
}

TEST(VerifierProof, AcceptsAShuffleUnderABroadcastValue) {
  Kernel k = broadcast_guard(32);
  EXPECT_TRUE(verify(k).empty()) << verify(k)[0];
  EXPECT_TRUE(mentions(verify(broadcast_guard(16)), "not uniform across the warp"));
}

TEST(VerifierProof, RejectsABroadcastUnderLaneDependentControlFlowOrOutsideItsWidth) {
  Kernel k = row_sum(Scope::group, false, false, 2);
  k.body.push_back(if_(binary(BinOp::lt, special(Special::lane), i32_const(16)), {shfl_idx(1, 1, 0, 32)}));
  EXPECT_TRUE(mentions(verify(k), "shfl_idx of"));
  Kernel wide = row_sum(Scope::group, false, false, 2);
  wide.body.push_back(shfl_idx(1, 1, 16, 16));
  EXPECT_TRUE(mentions(verify(wide), "shfl_idx lane 16 outside its width 16"));
}

// A value read from shared memory at a uniform index is uniform only as far as the region is
// shared: a packed program's own slice differs from program to program, a group-wide region
// (program stride 0) does not. A barrier may depend on the second only.
TEST(VerifierProof, RejectsAGroupBarrierUnderAValueOfOneProgramsSlice) {
  Kernel k = row_sum(Scope::group, false, false, 2);
  const int total = 3;  // row_sum's register read from the program's own slice
  ASSERT_EQ(k.regs[total].name, "total");
  k.body.push_back(if_(binary(BinOp::lt, f32_const(0), reg(total, Type::f32)), {barrier(Scope::group)}));
  EXPECT_TRUE(mentions(verify(k), "group barrier under control flow that is not uniform"));
}

TEST(VerifierProof, AcceptsAGroupBarrierUnderAGroupWideSharedValue) {
  Kernel k = row_sum(Scope::group, false, false, 2);
  k.shared.push_back({"sums", 4, 4, 0});  // after partials' two slices: [4, 8) for the group
  const int v = 1, all = k.add_reg("all", Type::f32), part = k.add_reg("part", Type::f32);
  ASSERT_EQ(k.regs[v].name, "v");
  ExprPtr slot = binary(BinOp::add, binary(BinOp::mul, special(Special::program_in_group), i32_const(2)),
                        special(Special::warp_in_program));
  k.body.push_back(if_(binary(BinOp::eq, special(Special::lane), i32_const(0)), {shared_store(1, slot, reg(v, Type::f32))}));
  k.body.push_back(barrier(Scope::group));
  k.body.push_back(shared_load(all, 1, i32_const(0)));
  for (int i = 1; i < 4; ++i) {
    k.body.push_back(shared_load(part, 1, i32_const(i)));
    k.body.push_back(assign(all, binary(BinOp::add, reg(all, Type::f32), reg(part, Type::f32))));
  }
  k.body.push_back(if_(binary(BinOp::lt, f32_const(0), reg(all, Type::f32)), {barrier(Scope::group)}));
  EXPECT_TRUE(verify(k).empty()) << verify(k)[0];
  std::vector<float> y;
  EXPECT_NO_THROW(execute_rows(k, 4, y));
}

TEST(VerifierProof, RejectsSharedIndexOutsideItsRegion) {
  Kernel k = row_sum(Scope::group, false, false, 2);
  k.body.push_back(shared_store(0, special(Special::lane), f32_const(0)));
  EXPECT_TRUE(mentions(verify(k), "not provably in [0, 2)"));
}

// Cluster proof cases (tests/support/cluster_kernel.hpp): a row split over the C groups of a
// cluster, partials merged through remote shared loads between two cluster barriers.
using testing::cluster_row_sum;
using testing::ClusterSumFlaws;

// Runs a cluster kernel over `rows` rows of C x 64 columns (x[i] = i % 7) and returns y.
std::vector<float> run_cluster(const Kernel& k, int64_t rows, bool loop = false) {
  const int C = k.ctas_per_cluster;
  std::vector<float> x(size_t(rows) * 64 * C);
  for (size_t i = 0; i < x.size(); ++i) x[i] = float(i % 7);
  std::vector<float> y(size_t(rows), -1.0f);
  cpu::LaunchArgs args;
  args.groups = (loop ? std::min<int64_t>(rows, 2) : rows) * C;
  args.buffers = {{x.data(), 0, int64_t(x.size())}, {y.data(), 0, int64_t(y.size())}};
  args.params = {{0, rows}};
  cpu::execute(k, args);
  for (int64_t r = 0; r < rows; ++r) {
    float want = 0;
    for (int64_t c = 0; c < 64 * C; ++c) want += float((r * 64 * C + c) % 7);
    EXPECT_EQ(y[size_t(r)], want) << "row " << r;
  }
  return y;
}

TEST(VerifierProof, AcceptsClusterMergeBetweenTwoClusterBarriers) {
  for (int C : {2, 4, 16}) {
    Kernel k = cluster_row_sum(C);
    EXPECT_TRUE(verify(k).empty()) << verify(k)[0];
    run_cluster(k, 3);
  }
  // A persistent loop over row blocks: the bound is uniform across the cluster, the barriers
  // inside it are passed by every group, and the last one orders the next block's writes.
  Kernel k = cluster_row_sum(4, {.loop_over_rows = true});
  EXPECT_TRUE(verify(k).empty()) << verify(k)[0];
  run_cluster(k, 5, /*loop=*/true);
}

TEST(VerifierProof, RejectsRemoteReadBeforeAClusterBarrier) {
  Kernel k = cluster_row_sum(2, {.no_first_barrier = true});
  EXPECT_TRUE(mentions(verify(k), "before a cluster barrier on some path"));
  EXPECT_THROW(run_cluster(k, 2), cpu::ExecutionError);  // the owner's write races the read
  // A barrier on one arm of an if does not cover the other arm.
  k = cluster_row_sum(2, {.no_first_barrier = true});
  k.body.insert(k.body.begin(), if_(binary(BinOp::lt, param(0, Type::i64), i64_const(4)), {barrier(Scope::cluster)}));
  EXPECT_TRUE(mentions(verify(k), "before a cluster barrier on some path"));
}

TEST(VerifierProof, RejectsKernelEndingAfterARemoteRead) {
  Kernel k = cluster_row_sum(2, {.no_last_barrier = true});
  EXPECT_TRUE(mentions(verify(k), "not followed by a cluster barrier before the kernel ends"));
  EXPECT_THROW(run_cluster(k, 2), cpu::ExecutionError);  // a group exits while read
}

TEST(VerifierProof, RejectsClusterBarrierThatSomeGroupsSkip) {
  Kernel k = cluster_row_sum(2, {.rank_divergent = true});
  EXPECT_TRUE(mentions(verify(k), "cluster barrier under control flow that is not uniform across the cluster"));
  EXPECT_THROW(run_cluster(k, 2), cpu::ExecutionError);
  // A guard on the group's own index (not the cluster's) is as divergent.
  k = cluster_row_sum(2);
  k.body.insert(k.body.begin(), assign(0, cast(Type::i64, special(Special::group_index))));
  k.body = {if_(binary(BinOp::lt, reg(0, Type::i64), param(0, Type::i64)), k.body)};
  EXPECT_TRUE(mentions(verify(k), "not uniform across the cluster"));
}

TEST(VerifierProof, RejectsRemoteRankOutsideTheCluster) {
  Kernel k = cluster_row_sum(2, {.rank_past_cluster = true});
  EXPECT_TRUE(mentions(verify(k), "remote rank '(cta_in_cluster + 1)' is not provably in [0, 2)"));
  EXPECT_THROW(run_cluster(k, 2), cpu::ExecutionError);
}

// A rank spread over the lanes (lane r reads rank r, as the lowering's cluster merge does) is
// proved in range by the remainder's bound; a divisor past the cluster or a possibly negative
// dividend is not.
TEST(VerifierProof, BoundsRemoteRanksSpreadOverTheLanes) {
  auto with_rank = [](ExprPtr cta) {
    Kernel k = cluster_row_sum(4);
    for (Stmt& s : k.body)
      if (s.kind == Stmt::Kind::remote_shared_load) s.cta = cta;
    return k;
  };
  const ExprPtr lane = special(Special::lane);
  Kernel k = with_rank(binary(BinOp::rem, lane, i32_const(4)));
  EXPECT_TRUE(verify(k).empty()) << verify(k)[0];
  k = with_rank(binary(BinOp::min, binary(BinOp::rem, lane, i32_const(8)), i32_const(3)));
  EXPECT_TRUE(verify(k).empty()) << verify(k)[0];
  k = with_rank(binary(BinOp::rem, lane, i32_const(5)));
  EXPECT_TRUE(mentions(verify(k), "remote rank '(lane % 5)' is not provably in [0, 4)"));
  k = with_rank(binary(BinOp::rem, binary(BinOp::sub, lane, i32_const(1)), i32_const(4)));
  EXPECT_TRUE(mentions(verify(k), "is not provably in [0, 4)"));
}

TEST(VerifierProof, RejectsClusterSynchronisationWithoutClusters) {
  Kernel k = cluster_row_sum(2);
  k.ctas_per_cluster = 1;
  const std::vector<std::string> errors = verify(k);
  EXPECT_TRUE(mentions(errors, "barrier of scope cluster in a kernel without clusters"));
  EXPECT_TRUE(mentions(errors, "remote shared load in a kernel without clusters"));
}

// Exchange proof cases (tests/support/cluster_kernel.hpp): the row sum merged through pushes
// into every group's exchange region, with a split cluster barrier before the first push.
using testing::cluster_exchange_sum;
using testing::ExchangeSumFlaws;

TEST(VerifierProof, AcceptsAnExchangeAfterASplitClusterBarrier) {
  for (int C : {2, 4, 16}) {
    Kernel k = cluster_exchange_sum(C);
    EXPECT_TRUE(verify(k).empty()) << verify(k)[0];
    run_cluster(k, 3);
  }
  // Printed: the arrive, the wait, the push and the exchange wait, one line each.
  const std::string text = to_string(cluster_exchange_sum(2));
  for (const char* line : {"barrier.cluster.arrive", "barrier.cluster.wait", "] at cta min(lane, 1)", "exchange_wait exchange (4 pushes)"})
    EXPECT_NE(text.find(line), std::string::npos) << line << "\n" << text;
}

TEST(VerifierProof, RejectsAPushBeforeTheClusterIsKnownResident) {
  Kernel k = cluster_exchange_sum(2, {.no_wait_before_push = true});
  EXPECT_TRUE(mentions(verify(k), "remote shared push into region 'exchange' before a cluster barrier on some path"));
  EXPECT_TRUE(mentions(verify(k), "a cluster arrive has no cluster wait after it"));
}

// The executor catches what the verifier rejects: a read before the pushes landed is a race, a
// second push into a slot and a push into a group that exited are errors.
TEST(VerifierProof, RejectsReadingAnExchangeRegionBeforeItsWait) {
  Kernel k = cluster_exchange_sum(2, {.read_before_wait = true});
  EXPECT_TRUE(mentions(verify(k), "shared load of exchange region 'exchange' before its exchange wait on some path"));
  try {
    run_cluster(k, 2);
    ADD_FAILURE() << "the racy read ran";
  } catch (const cpu::ExecutionError& e) {
    EXPECT_NE(std::string(e.what()).find("reads it before its exchange wait"), std::string::npos) << e.what();
  }
}

TEST(VerifierProof, RejectsAGroupThatNeverWaitsForItsPushes) {
  Kernel k = cluster_exchange_sum(2, {.no_exchange_wait = true});
  const std::vector<std::string> errors = verify(k);
  EXPECT_TRUE(mentions(errors, "exchange region 'exchange' is not waited on every path"));
  EXPECT_THROW(run_cluster(k, 2), cpu::ExecutionError);
  k = cluster_exchange_sum(2, {.wait_divergent = true});
  EXPECT_TRUE(mentions(verify(k), "exchange wait of 'exchange' under control flow that is not uniform across the cluster"));
  EXPECT_THROW(run_cluster(k, 2), cpu::ExecutionError);
  k = cluster_exchange_sum(2, {.wait_in_loop = true});
  EXPECT_TRUE(mentions(verify(k), "exchange region 'exchange' waited again before its previous phase is retired"));
}

TEST(VerifierProof, TheExecutorRefusesTwoPushesIntoOneSlot) {
  Kernel k = cluster_exchange_sum(2, {.same_slot = true});
  try {
    run_cluster(k, 2);
    ADD_FAILURE() << "two pushes into one slot ran";
  } catch (const cpu::ExecutionError& e) {
    EXPECT_NE(std::string(e.what()).find("second remote shared push into slot 0"), std::string::npos) << e.what();
  }
}

// A cluster looping over row blocks takes one phase of its exchange region a row: accepted, and
// each row's sum right, where an arrive after the reads and a wait before the next pushes
// retire each phase; without them the verifier refuses the next push and the executor reports
// the push racing with the last phase's reads.
TEST(VerifierProof, AcceptsOnePhaseOfAnExchangeRegionARow) {
  for (int C : {2, 4, 16}) {
    Kernel k = cluster_exchange_sum(C, {.loop_over_rows = true});
    EXPECT_TRUE(verify(k).empty()) << verify(k)[0];
    run_cluster(k, 5, /*loop=*/true);
  }
  Kernel k = cluster_exchange_sum(2, {.loop_over_rows = true, .no_retire = true});
  EXPECT_TRUE(
      mentions(verify(k), "remote shared push into exchange region 'exchange' before its previous phase is retired"));
  EXPECT_TRUE(mentions(verify(k), "exchange region 'exchange' waited again before its previous phase is retired"));
  try {
    run_cluster(k, 5, /*loop=*/true);
    ADD_FAILURE() << "pushes of the next phase with no cluster barrier ran";
  } catch (const cpu::ExecutionError& e) {
    EXPECT_NE(std::string(e.what()).find("with no cluster barrier after that group's reads of phase 0"),
              std::string::npos)
        << e.what();
  }
  k = cluster_exchange_sum(2, {.loop_over_rows = true, .read_after_arrive = true});
  EXPECT_TRUE(
      mentions(verify(k), "shared load of exchange region 'exchange' after the cluster arrive that retires its phase"));
}

TEST(VerifierProof, RejectsAnArriveLeftWithoutItsWait) {
  Kernel k = cluster_exchange_sum(2, {.arrive_unwaited = true});
  EXPECT_TRUE(mentions(verify(k), "a cluster arrive has no cluster wait after it before the kernel ends"));
  // A cluster wait with no arrive before it, and a remote load after only a split barrier.
  k = cluster_exchange_sum(2);
  k.body.erase(k.body.begin());
  EXPECT_TRUE(mentions(verify(k), "cluster wait without a cluster arrive before it"));
  Kernel pull = cluster_row_sum(2);
  for (Stmt& st : pull.body)
    if (st.kind == Stmt::Kind::barrier && st.scope == Scope::cluster) {
      st = cluster_wait();
      pull.body.insert(pull.body.begin(), cluster_arrive());
      break;
    }
  EXPECT_TRUE(mentions(verify(pull), "a split barrier publishes none"));
}

TEST(VerifierProof, RejectsExchangeRegionsOutsideClustersOrStoredLocally) {
  Kernel k = cluster_exchange_sum(2);
  k.body.push_back(shared_store(0, i32_const(0), f32_const(1.0)));
  EXPECT_TRUE(mentions(verify(k), "shared store into exchange region 'exchange'"));
  k = cluster_exchange_sum(2);
  k.shared[0].pushes = 0;
  EXPECT_TRUE(mentions(verify(k), "remote shared push into region 'exchange', which is not an exchange region"));
  k = cluster_exchange_sum(2);
  k.ctas_per_cluster = 1;
  EXPECT_TRUE(mentions(verify(k), "exchange region 'exchange' awaits 4 pushes"));
}

// Staged proof cases: worker w of one 64-worker group copies x[4w +: 4] into staged region
// "xs" at 4w, waits, reads the four elements back and stores them to y[4w +: 4]. Statements by
// position: the copy 0, the wait 1, the staged load 2, the store 3.
Kernel staged_copy() {
  Kernel k;
  k.name = "staged_copy";
  k.workers_per_program = 64;
  k.buffers = {{"x", DType::f32, false}, {"y", DType::f32, true}};
  k.params = {{"n", Type::i64}};
  k.staged = {{"xs", DType::f32, 256}};
  std::vector<int> v;
  for (int j = 0; j < 4; ++j) v.push_back(k.add_reg("v" + std::to_string(j), Type::f32));
  const ExprPtr at = binary(BinOp::mul, cast(Type::i64, special(Special::worker_in_program)), i64_const(4));
  const ExprPtr valid = binary(BinOp::sub, param(0, Type::i64), at);
  k.body = {async_copy(0, at, 0, at, 4, valid, row_aligned(0, at, 16)), async_wait(),
            staged_load(v, 0, at, valid, 0.0f), store(v, 1, at, valid, row_aligned(1, at, 16))};
  return k;
}

// Runs a staged kernel over one row of 250 elements (x[i] = i / 4) and checks y.
void run_staged(const Kernel& k) {
  alignas(16) float x[256], y[256];
  for (int i = 0; i < 256; ++i) x[i] = float(i) / 4, y[i] = -1;
  cpu::LaunchArgs args;
  args.groups = 1;
  args.buffers = {{x, 0, 250}, {y, 0, 256}};
  args.params = {{0, 250}};
  cpu::execute(k, args);
  for (int i = 0; i < 256; ++i) ASSERT_EQ(y[i], i < 250 ? x[i] : -1.0f) << i;
}

ExprPtr lane_below(int n) { return binary(BinOp::lt, special(Special::lane), i32_const(n)); }

TEST(VerifierProof, AcceptsStagedLoadsAfterTheWaitOnEveryPath) {
  Kernel k = staged_copy();
  EXPECT_TRUE(verify(k).empty()) << verify(k)[0];
  run_staged(k);
  // The copy on both arms of a branch, then the wait; or the wait on both arms.
  k = staged_copy();
  k.body[0] = if_(lane_below(16), {k.body[0]}, {k.body[0]});
  EXPECT_TRUE(verify(k).empty()) << verify(k)[0];
  run_staged(k);
  k = staged_copy();
  k.body[1] = if_(lane_below(16), {async_wait()}, {async_wait()});
  EXPECT_TRUE(verify(k).empty()) << verify(k)[0];
  run_staged(k);
}

TEST(VerifierProof, RejectsAStagedLoadBeforeItsWait) {
  const std::string msg = "staged load of region 'xs' before an async wait saw its async copy land on some path";
  Kernel k = staged_copy();
  k.body.erase(k.body.begin() + 1);
  EXPECT_TRUE(mentions(verify(k), msg));
  EXPECT_THROW(run_staged(k), cpu::ExecutionError);
  // A wait on one arm only does not cover the other.
  k = staged_copy();
  k.body[1] = if_(lane_below(16), {async_wait()});
  EXPECT_TRUE(mentions(verify(k), msg));
  EXPECT_THROW(run_staged(k), cpu::ExecutionError);
}

// A wait leaving groups in flight lands the older ones only (it closes the open group where
// that holds copies): the load of a copy in one of the newest groups is refused.
TEST(VerifierProof, AsyncWaitsLandOnlyTheOlderGroups) {
  const std::string msg = "staged load of region 'xs' before an async wait saw its async copy land on some path";
  Kernel k = staged_copy();
  k.body[1] = async_wait(1);  // the copy's group is the newest: still in flight
  EXPECT_TRUE(mentions(verify(k), msg));
  k.body.insert(k.body.begin() + 1, async_commit());  // the copy's group alone: still the newest
  EXPECT_TRUE(mentions(verify(k), msg));
  k.body.insert(k.body.begin() + 2, async_commit());  // then an empty group after it
  EXPECT_TRUE(verify(k).empty()) << verify(k)[0];
  run_staged(k);
  k.body[3] = async_wait(2);
  EXPECT_TRUE(mentions(verify(k), msg));
}

TEST(VerifierProof, RejectsACopyIntoAStagedRegionAfterALoadOfIt) {
  Kernel k = staged_copy();
  k.body.push_back(if_(lane_below(16), {k.body[0]}));
  EXPECT_TRUE(mentions(verify(k), "async copy into staged region 'xs' after a staged load of it on some path"));
  EXPECT_THROW(run_staged(k), cpu::ExecutionError);
}

TEST(VerifierProof, RejectsStagedStatementsInsideLoops) {
  Kernel k = staged_copy();
  const int i = k.add_reg("i", Type::i64);
  k.body = {for_(i, i64_const(0), i64_const(2), k.body)};
  const std::vector<std::string> errors = verify(k);
  EXPECT_TRUE(mentions(errors, "async copy into staged region 'xs' inside a loop (staged regions are single-phase)"));
  EXPECT_TRUE(mentions(errors, "async wait inside a loop (staged regions are single-phase)"));
  EXPECT_TRUE(mentions(errors, "staged load from staged region 'xs' inside a loop (staged regions are single-phase)"));
  EXPECT_TRUE(mentions(errors, "async copy into staged region 'xs' after a staged load of it on some path"));
  EXPECT_THROW(run_staged(k), cpu::ExecutionError);  // the second copy follows the first load
}

TEST(VerifierProof, RejectsIllTypedStagedStatements) {
  Kernel k = staged_copy();
  k.body[0].at = special(Special::worker_in_program);
  k.body[0].aligned = i64_const(1);
  k.body[2].valid = i32_const(4);
  k.body[2].dsts[3] = k.add_reg("bad", Type::i64);
  std::vector<std::string> errors = verify(k);
  EXPECT_TRUE(mentions(errors, "staged offset 'worker_in_program' is i32, expected i64"));
  EXPECT_TRUE(mentions(errors, "alignment condition '1' is i64, expected b1"));
  EXPECT_TRUE(mentions(errors, "valid count '4' is i32, expected i64"));
  EXPECT_TRUE(mentions(errors, "staged load destination: register bad is i64, expected f32"));
  EXPECT_THROW(run_staged(k), cpu::ExecutionError);
  k = staged_copy();
  k.body[0].width = 0;
  k.body[2].width = 5;
  errors = verify(k);
  EXPECT_TRUE(mentions(errors, "async copy of width 0"));
  EXPECT_TRUE(mentions(errors, "staged load of width 5 with 4 registers"));
  EXPECT_THROW(run_staged(k), cpu::ExecutionError);
  k = staged_copy();
  k.body[0].region = 3;
  k.body[2].region = -1;
  errors = verify(k);
  EXPECT_TRUE(mentions(errors, "async copy into staged region 3, which does not exist"));
  EXPECT_TRUE(mentions(errors, "staged load from staged region -1, which does not exist"));
  EXPECT_THROW(run_staged(k), cpu::ExecutionError);
}

TEST(VerifierProof, RejectsCopiesFromOutputsOrIntoAnotherDtype) {
  Kernel k = staged_copy();
  k.body[0].buffer = 1;
  EXPECT_TRUE(mentions(verify(k), "async copy from output buffer 'y' (staged regions cache inputs)"));
  k.body[0].buffer = 7;
  EXPECT_TRUE(mentions(verify(k), "async copy from buffer 7, which does not exist"));
  EXPECT_THROW(run_staged(k), cpu::ExecutionError);
  k = staged_copy();
  k.staged[0].dtype = DType::bf16;
  EXPECT_TRUE(mentions(verify(k), "async copy from buffer 'x' of f32 into staged region 'xs' of bf16"));
  EXPECT_THROW(run_staged(k), cpu::ExecutionError);
  k = staged_copy();
  k.staged[0].dtype = DType::i32;
  k.buffers[0].dtype = DType::i32;
  const std::vector<std::string> errors = verify(k);
  EXPECT_TRUE(mentions(errors, "staged region 'xs' holds i32, not a float dtype"));
  k.staged[0].elems = 0;
  EXPECT_TRUE(mentions(verify(k), "staged region 'xs' has no elements"));
}

}  // namespace
}  // namespace tile::ir
