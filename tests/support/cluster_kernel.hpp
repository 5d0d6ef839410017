// Hand-built cluster kernels for the verifier's proof cases and the CPU executor's tests: the
// sum of each row of a (rows, C x 64) f32 matrix, the row split over the C groups (64 workers,
// two warps each) of a cluster, merged by remote loads (cluster_row_sum) or through an exchange
// region (cluster_exchange_sum, below). In cluster_row_sum each group sums its 64 elements
// (warp butterfly, shared slots, group barrier), stores its partial in shared memory, and after
// a cluster barrier every worker reads the C partials remotely in rank order; worker 0 of rank 0
// stores the sum, and a last cluster barrier keeps every group's shared memory alive until the
// others have read it. Each flag breaks one rule the verifier proves (or the executor catches).
#pragma once

#include <vector>

#include "ir/ir.hpp"

namespace tile::testing {

struct ClusterSumFlaws {
  bool no_first_barrier = false;     // remote reads with no cluster barrier before them
  bool no_last_barrier = false;      // the kernel ends right after the remote reads
  bool rank_divergent = false;       // the first cluster barrier only on rank 0
  bool rank_past_cluster = false;    // reads rank cta_in_cluster + 1
  bool rewrite_after_read = false;   // the last rank overwrites its partial before the last barrier
  bool loop_over_rows = false;       // each cluster loops over row blocks cluster_index, + clusters
};

inline ir::Kernel cluster_row_sum(int C, ClusterSumFlaws f = {}) {
  using namespace ir;
  Kernel k;
  k.name = "cluster_row_sum";
  k.programs_per_group = 1;
  k.workers_per_program = 64;
  k.ctas_per_cluster = C;
  k.buffers = {{"x", DType::f32, false}, {"y", DType::f32, true}};
  k.params = {{"rows", Type::i64}};
  k.shared = {{"warps", 0, 2, 2}, {"cluster_part", 2, 1, 1}};
  const int row = k.add_reg("row", Type::i64), v = k.add_reg("v", Type::f32), t = k.add_reg("t", Type::f32);
  const int part = k.add_reg("part", Type::f32), total = k.add_reg("total", Type::f32);
  const int it = k.add_reg("it", Type::i64);
  auto r = [&](int id) { return reg(id, k.regs[id].type); };
  auto add = [](ExprPtr a, ExprPtr b) { return binary(BinOp::add, std::move(a), std::move(b)); };
  auto eq = [](ExprPtr a, ExprPtr b) { return binary(BinOp::eq, std::move(a), std::move(b)); };
  const ExprPtr cols = i64_const(64 * C);
  const ExprPtr valid = select(binary(BinOp::lt, r(row), param(0, Type::i64)), i64_const(1), i64_const(0));

  std::vector<Stmt> b;
  // Column of this worker: rank x 64 + worker, so the C groups cover the row once.
  const ExprPtr col = add(binary(BinOp::mul, cast(Type::i64, special(Special::cta_in_cluster)), i64_const(64)),
                          cast(Type::i64, special(Special::worker_in_program)));
  b.push_back(load({v}, 0, add(binary(BinOp::mul, r(row), cols), col), valid, b1_const(false), false, 0.0f));
  for (int off = 16; off >= 1; off /= 2) {
    b.push_back(shfl_xor(t, v, off, 32));
    b.push_back(assign(v, add(r(v), r(t))));
  }
  b.push_back(if_(eq(special(Special::lane), i32_const(0)), {shared_store(0, special(Special::warp_in_program), r(v))}));
  b.push_back(barrier(Scope::group));
  b.push_back(shared_load(part, 0, i32_const(0)));
  b.push_back(shared_load(t, 0, i32_const(1)));
  b.push_back(assign(part, add(r(part), r(t))));
  b.push_back(if_(eq(special(Special::worker_in_program), i32_const(0)), {shared_store(1, i32_const(0), r(part))}));
  if (f.rank_divergent)
    b.push_back(if_(eq(special(Special::cta_in_cluster), i32_const(0)), {barrier(Scope::cluster)}));
  else if (!f.no_first_barrier)
    b.push_back(barrier(Scope::cluster));
  for (int rank = 0; rank < C; ++rank) {
    ExprPtr cta = f.rank_past_cluster ? binary(BinOp::add, special(Special::cta_in_cluster), i32_const(rank + 1))
                                      : i32_const(rank);
    b.push_back(remote_shared_load(rank == 0 ? total : t, 1, i32_const(0), cta));
    if (rank > 0) b.push_back(assign(total, add(r(total), r(t))));
  }
  if (f.rewrite_after_read)
    b.push_back(if_(binary(BinOp::and_, eq(special(Special::worker_in_program), i32_const(0)),
                           eq(special(Special::cta_in_cluster), i32_const(C - 1))),
                    {shared_store(1, i32_const(0), f32_const(0.0))}));
  b.push_back(if_(binary(BinOp::and_, eq(special(Special::worker_in_program), i32_const(0)),
                         eq(special(Special::cta_in_cluster), i32_const(0))),
                  {store({total}, 1, r(row), valid, b1_const(false))}));
  if (!f.no_last_barrier) b.push_back(barrier(Scope::cluster));

  if (f.loop_over_rows) {
    // Row blocks cluster_index, cluster_index + clusters, ...: a bound uniform across the cluster.
    const ExprPtr clusters = binary(BinOp::div, special(Special::group_count), i64_const(C));
    std::vector<Stmt> loop = {assign(row, add(special(Special::cluster_index), binary(BinOp::mul, r(it), clusters)))};
    for (Stmt& s : b) loop.push_back(std::move(s));
    const ExprPtr count = binary(BinOp::div, add(binary(BinOp::sub, param(0, Type::i64), special(Special::cluster_index)),
                                                 binary(BinOp::sub, clusters, i64_const(1))),
                                 clusters);
    k.body.push_back(for_(it, i64_const(0), count, std::move(loop)));
  } else {
    k.body.push_back(assign(row, special(Special::cluster_index)));
    for (Stmt& s : b) k.body.push_back(std::move(s));
  }
  return k;
}

}  // namespace tile::testing

namespace tile::testing {

// The same row sum merged through an exchange region instead: a split cluster barrier (arrive
// first, wait before the first push), then lane r < C of each warp pushes the warp's sum to the
// group of rank r (slot rank x 2 + warp), each group waits for its 2 x C pushes and every
// worker folds the slots in order; worker 0 of rank 0 stores the sum. With loop_over_rows each
// cluster loops over row blocks cluster_index, + clusters, ..., one phase of the region a row:
// an arrive after the row's reads, the wait before the next row's pushes, and a wait after the
// loop for the last arrive. Each flag breaks one rule.
struct ExchangeSumFlaws {
  bool loop_over_rows = false;       // (not a flaw) rows looped over, as described above
  bool no_retire = false;            // in the loop: no arrive and wait between a row's reads and the next pushes
  bool read_after_arrive = false;    // in the loop: the row's last slot read after its arrive
  bool no_wait_before_push = false;  // pushes with no cluster barrier (split or whole) before them
  bool read_before_wait = false;     // a slot read before the exchange wait
  bool no_exchange_wait = false;     // the group never waits for its pushes
  bool same_slot = false;            // every warp pushes into slot 0 of each rank
  bool wait_divergent = false;       // only rank 0 waits
  bool wait_in_loop = false;         // the wait runs inside a loop of one iteration
  bool arrive_unwaited = false;      // a second arrive, never waited
};

inline ir::Kernel cluster_exchange_sum(int C, ExchangeSumFlaws f = {}) {
  using namespace ir;
  Kernel k;
  k.name = "cluster_exchange_sum";
  k.programs_per_group = 1;
  k.workers_per_program = 64;
  k.ctas_per_cluster = C;
  k.buffers = {{"x", DType::f32, false}, {"y", DType::f32, true}};
  k.params = {{"rows", Type::i64}};
  k.shared = {{"exchange", 0, 2 * C, 0, 2 * C}};
  const int row = k.add_reg("row", Type::i64), v = k.add_reg("v", Type::f32), t = k.add_reg("t", Type::f32);
  const int total = k.add_reg("total", Type::f32), it = k.add_reg("it", Type::i64);
  auto r = [&](int id) { return reg(id, k.regs[id].type); };
  auto add = [](ExprPtr a, ExprPtr b) { return binary(BinOp::add, std::move(a), std::move(b)); };
  auto eq = [](ExprPtr a, ExprPtr b) { return binary(BinOp::eq, std::move(a), std::move(b)); };
  const ExprPtr cols = i64_const(64 * C);
  const ExprPtr valid = select(binary(BinOp::lt, r(row), param(0, Type::i64)), i64_const(1), i64_const(0));
  std::vector<Stmt> b;
  if (!f.loop_over_rows) b.push_back(assign(row, special(Special::cluster_index)));
  const ExprPtr col = add(binary(BinOp::mul, cast(Type::i64, special(Special::cta_in_cluster)), i64_const(64)),
                          cast(Type::i64, special(Special::worker_in_program)));
  b.push_back(load({v}, 0, add(binary(BinOp::mul, r(row), cols), col), valid, b1_const(false), false, 0.0f));
  for (int off = 16; off >= 1; off /= 2) {
    b.push_back(shfl_xor(t, v, off, 32));
    b.push_back(assign(v, add(r(v), r(t))));
  }
  if (!f.no_wait_before_push && !f.no_retire) b.push_back(cluster_wait());
  const ExprPtr slot = f.same_slot ? i32_const(0)
                                   : add(binary(BinOp::mul, special(Special::cta_in_cluster), i32_const(2)),
                                         special(Special::warp_in_program));
  b.push_back(if_(binary(BinOp::lt, special(Special::lane), i32_const(C)),
                  {remote_shared_push(0, slot, binary(BinOp::min, special(Special::lane), i32_const(C - 1)), v)}));
  if (f.read_before_wait) b.push_back(shared_load(t, 0, i32_const(0)));
  if (f.wait_divergent)
    b.push_back(if_(eq(special(Special::cta_in_cluster), i32_const(0)), {exchange_wait(0)}));
  else if (f.wait_in_loop)
    b.push_back(for_(it, i64_const(0), i64_const(1), {exchange_wait(0)}));
  else if (!f.no_exchange_wait)
    b.push_back(exchange_wait(0));
  if (f.arrive_unwaited) b.push_back(cluster_arrive());
  b.push_back(shared_load(total, 0, i32_const(0)));
  for (int s = 1; s < 2 * C; ++s) {
    if (f.read_after_arrive && s == 2 * C - 1) b.push_back(cluster_arrive());
    b.push_back(shared_load(t, 0, i32_const(s)));
    b.push_back(assign(total, add(r(total), r(t))));
  }
  b.push_back(if_(binary(BinOp::and_, eq(special(Special::worker_in_program), i32_const(0)),
                         eq(special(Special::cta_in_cluster), i32_const(0))),
                  {store({total}, 1, r(row), valid, b1_const(false))}));
  k.body.push_back(cluster_arrive());
  if (!f.loop_over_rows) {
    for (Stmt& st : b) k.body.push_back(std::move(st));
    return k;
  }
  if (f.no_retire) k.body.push_back(cluster_wait());  // resident, then never again
  const ExprPtr clusters = binary(BinOp::div, special(Special::group_count), i64_const(C));
  std::vector<Stmt> loop = {assign(row, add(special(Special::cluster_index), binary(BinOp::mul, r(it), clusters)))};
  for (Stmt& st : b) loop.push_back(std::move(st));
  if (!f.no_retire && !f.read_after_arrive) loop.push_back(cluster_arrive());
  const ExprPtr count = binary(BinOp::div,
                               add(binary(BinOp::sub, param(0, Type::i64), special(Special::cluster_index)),
                                   binary(BinOp::sub, clusters, i64_const(1))),
                               clusters);
  k.body.push_back(for_(it, i64_const(0), count, std::move(loop)));
  if (!f.no_retire) k.body.push_back(cluster_wait());
  return k;
}

}  // namespace tile::testing
