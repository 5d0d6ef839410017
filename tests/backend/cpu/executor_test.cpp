// Hand-built IR kernels run by the CPU reference executor (src/backend/cpu/executor.cpp).
#include "backend/cpu/executor.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <functional>
#include <iostream>
#include <vector>

#include "support/cluster_kernel.hpp"

namespace tile::cpu {
namespace {

using namespace tile::ir;

ExprPtr add(ExprPtr a, ExprPtr b) { return binary(BinOp::add, std::move(a), std::move(b)); }
ExprPtr sub(ExprPtr a, ExprPtr b) { return binary(BinOp::sub, std::move(a), std::move(b)); }
ExprPtr mul(ExprPtr a, ExprPtr b) { return binary(BinOp::mul, std::move(a), std::move(b)); }
ExprPtr lt(ExprPtr a, ExprPtr b) { return binary(BinOp::lt, std::move(a), std::move(b)); }
ExprPtr eq(ExprPtr a, ExprPtr b) { return binary(BinOp::eq, std::move(a), std::move(b)); }
ExprPtr wide(Special s) { return cast(Type::i64, special(s)); }
ExprPtr lane_f32() { return cast(Type::f32, special(Special::lane)); }

// The message of the ExecutionError `f` throws, or "" when it throws none.
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const ExecutionError& e) {
    return e.what();
  }
  return "";
}

Kernel make_kernel(int programs, int workers) {
  Kernel k;
  k.name = "test";
  k.programs_per_group = programs;
  k.workers_per_program = workers;
  return k;
}

// Sums of a (rows, cols) f32 matrix: each worker loads 4 elements per stripe, a warp
// butterfly reduces 32 lanes, lane 0 of each warp stages its partial in shared memory, and
// after a group barrier worker 0 of the program adds the partials. Rows past `rows` (guard
// programs of the last group) issue no loads.
Kernel row_sum_kernel(int programs, int workers) {
  Kernel k = make_kernel(programs, workers);
  k.name = "row_sum";
  k.buffers = {{"x", DType::f32, false}, {"y", DType::f32, true}};
  k.params = {{"rows", Type::i64}, {"cols", Type::i64}};
  const int row = k.add_reg("row", Type::i64), s = k.add_reg("s", Type::i64);
  const int col = k.add_reg("col", Type::i64), acc = k.add_reg("acc", Type::f32);
  const int t = k.add_reg("t", Type::f32), w = k.add_reg("w", Type::i32);
  std::vector<int> v;
  for (int j = 0; j < 4; ++j) v.push_back(k.add_reg("v" + std::to_string(j), Type::f32, true));
  k.shared = {{"partials", 0, workers / 32, workers / 32}};
  const ExprPtr rows = param(0, Type::i64), cols = param(1, Type::i64);
  const ExprPtr R = reg(row, Type::i64);
  const ExprPtr per_stripe = i64_const(4 * workers);
  const ExprPtr stripes = binary(BinOp::div, add(cols, i64_const(4 * workers - 1)), per_stripe);
  const ExprPtr index = add(mul(R, cols), reg(col, Type::i64));
  const ExprPtr valid = select(lt(R, rows), sub(cols, reg(col, Type::i64)), i64_const(0));
  const ExprPtr A = reg(acc, Type::f32);
  std::vector<Stmt> stripe = {
      assign(col,
             mul(add(mul(reg(s, Type::i64), i64_const(workers)), wide(Special::worker_in_program)),
                 i64_const(4))),
      load(v, 0, index, valid, row_aligned(0, index, 16), false, 0.0f),
      assign(acc, add(A, add(add(reg(v[0], Type::f32), reg(v[1], Type::f32)),
                             add(reg(v[2], Type::f32), reg(v[3], Type::f32))))),
  };
  k.body = {
      assign(row, add(mul(special(Special::group_index), i64_const(programs)),
                      wide(Special::program_in_group))),
      assign(acc, f32_const(0)),
      for_(s, i64_const(0), stripes, stripe),
  };
  for (int off = 16; off >= 1; off /= 2) {
    k.body.push_back(shfl_xor(t, acc, off, 32));
    k.body.push_back(assign(acc, add(A, reg(t, Type::f32))));
  }
  k.body.push_back(if_(eq(special(Special::lane), i32_const(0)),
                       {shared_store(0, special(Special::warp_in_program), A)}));
  k.body.push_back(barrier(Scope::group));
  k.body.push_back(
      if_(binary(BinOp::and_, eq(special(Special::worker_in_program), i32_const(0)), lt(R, rows)),
          {assign(acc, f32_const(0)),
           for_(w, i32_const(0), i32_const(workers / 32),
                {shared_load(t, 0, reg(w, Type::i32)), assign(acc, add(A, reg(t, Type::f32)))}),
           store({acc}, 1, R, i64_const(1), b1_const(true))}));
  return k;
}

TEST(Executor, RowSumWithShuffleButterflyAndSharedPartials) {
  const int64_t rows = 5, cols = 301;  // odd cols: every other row start is misaligned
  std::vector<float> x(rows * cols), y(rows, -1.0f);
  std::vector<double> expect(rows, 0.0);
  for (int64_t i = 0; i < rows * cols; ++i) {
    x[i] = float(i % 7 - 3);
    expect[i / cols] += x[i];
  }
  const Kernel k = row_sum_kernel(2, 64);
  LaunchArgs args{3, {{x.data(), 0, rows * cols}, {y.data(), 0, rows}}, {{0, rows}, {0, cols}}};
  const ExecStats st = execute(k, args);
  for (int64_t r = 0; r < rows; ++r) EXPECT_EQ(y[r], float(expect[r])) << "row " << r;
  EXPECT_EQ(st.bytes_loaded, rows * cols * 4);
  EXPECT_EQ(st.bytes_stored, rows * 4);
  EXPECT_EQ(st.barriers, 3);          // one group barrier per group
  EXPECT_EQ(st.shuffles, 3 * 4 * 5);  // groups x warps x butterfly steps
  EXPECT_GT(st.vector_accesses, 0);
  EXPECT_GT(st.scalar_accesses, rows);  // misaligned rows take the scalar path
  EXPECT_NE(describe(st).find("3 barriers"), std::string::npos) << describe(st);
}

// Copies n floats: worker w moves elements [4w, 4w + 4) with one width-4 load and store.
Kernel copy_kernel(ExprPtr load_aligned, ExprPtr store_aligned) {
  Kernel k = make_kernel(1, 32);
  k.buffers = {{"x", DType::f32, false}, {"y", DType::f32, true}};
  k.params = {{"n", Type::i64}};
  std::vector<int> v;
  for (int j = 0; j < 4; ++j) v.push_back(k.add_reg("v" + std::to_string(j), Type::f32));
  const ExprPtr index = mul(wide(Special::worker_in_program), i64_const(4));
  const ExprPtr valid = sub(param(0, Type::i64), index);
  if (!load_aligned) load_aligned = row_aligned(0, index, 16);
  if (!store_aligned) store_aligned = row_aligned(1, index, 16);
  k.body = {load(v, 0, index, valid, load_aligned, false, 0.0f),
            store(v, 1, index, valid, store_aligned)};
  return k;
}

TEST(Executor, VectorPathWhenAlignedScalarPathOtherwise) {
  alignas(16) float in[132], out[128];
  for (int i = 0; i < 132; ++i) in[i] = float(i);
  {
    const ExecStats st =
        execute(copy_kernel(nullptr, nullptr), {1, {{in, 0, 128}, {out, 0, 128}}, {{0, 128}}});
    EXPECT_EQ(st.vector_accesses, 64);
    EXPECT_EQ(st.scalar_accesses, 0);
    EXPECT_EQ(st.bytes_loaded, 512);
    EXPECT_EQ(st.bytes_stored, 512);
    EXPECT_EQ(out[127], 127.0f);
  }
  // A row starting one element past an aligned address: forcing the vector path is an error,
  // checking row_aligned takes the scalar path.
  const std::string err = error_of([&] {
    execute(copy_kernel(b1_const(true), nullptr),
            {1, {{in + 1, 0, 128}, {out, 0, 128}}, {{0, 128}}});
  });
  EXPECT_NE(err.find("misaligned vector access"), std::string::npos) << err;
  const ExecStats st =
      execute(copy_kernel(nullptr, nullptr), {1, {{in + 1, 0, 128}, {out, 0, 128}}, {{0, 128}}});
  EXPECT_EQ(st.scalar_accesses, 128);
  EXPECT_EQ(st.vector_accesses, 32);
  for (int i = 0; i < 128; ++i) ASSERT_EQ(out[i], float(i + 1)) << i;
}

// One worker loads 4 elements with `valid` from a parameter and stores all 4 registers.
Kernel masked_load_kernel(bool clamp) {
  Kernel k = make_kernel(1, 1);
  k.buffers = {{"x", DType::f32, false}, {"y", DType::f32, true}};
  k.params = {{"valid", Type::i64}};
  std::vector<int> v;
  for (int j = 0; j < 4; ++j) v.push_back(k.add_reg("v" + std::to_string(j), Type::f32));
  k.body = {load(v, 0, i64_const(0), param(0, Type::i64), b1_const(true), clamp, -1.0f),
            store(v, 1, i64_const(0), i64_const(4), b1_const(true))};
  return k;
}

TEST(Executor, TailMaskingAndClampLoads) {
  alignas(16) float in[4] = {10, 11, 12, 13}, out[4];
  LaunchArgs args{1, {{in, 0, 3}, {out, 0, 4}}, {{0, 3}}};  // element 3 is not accessible
  ExecStats st = execute(masked_load_kernel(false), args);
  EXPECT_EQ(std::vector<float>(out, out + 4), (std::vector<float>{10, 11, 12, -1}));
  EXPECT_EQ(st.bytes_loaded, 12);
  EXPECT_EQ(st.scalar_accesses, 3);
  EXPECT_EQ(st.vector_accesses, 1);  // the store

  st = execute(masked_load_kernel(true), args);  // reads 10, 11, 12, 12 and keeps three
  EXPECT_EQ(std::vector<float>(out, out + 4), (std::vector<float>{10, 11, 12, -1}));
  EXPECT_EQ(st.bytes_loaded, 16);
  EXPECT_EQ(st.scalar_accesses, 4);

  args.params[0].i = 0;
  st = execute(masked_load_kernel(false), args);
  EXPECT_EQ(std::vector<float>(out, out + 4), (std::vector<float>{-1, -1, -1, -1}));
  EXPECT_EQ(st.bytes_loaded, 0);
}

// Loads x[index +: 4] as one whole vector and stores it to y[0 +: 4].
Kernel whole_load_kernel(bool clamp) {
  Kernel k = masked_load_kernel(clamp);
  k.params = {{"valid", Type::i64}, {"index", Type::i64}};
  k.body[0].index = param(1, Type::i64);
  k.body[0].whole = true;
  return k;
}

TEST(Executor, WholeVectorAccessesAreAllOrNothing) {
  alignas(16) float in[8] = {10, 11, 12, 13, 14, 15, 16, 17}, out[4];
  LaunchArgs args{1, {{in, 0, 8}, {out, 0, 4}}, {{0, 4}, {0, 4}}};
  ExecStats st = execute(whole_load_kernel(false), args);
  EXPECT_EQ(std::vector<float>(out, out + 4), (std::vector<float>{14, 15, 16, 17}));
  EXPECT_EQ(st.vector_accesses, 2);

  args.params[0].i = 0;  // past the row end: fill, and no access
  st = execute(whole_load_kernel(false), args);
  EXPECT_EQ(std::vector<float>(out, out + 4), (std::vector<float>{-1, -1, -1, -1}));
  EXPECT_EQ(st.bytes_loaded, 0);

  args.params[0].i = -4, args.params[1].i = 12;  // clamped: reads x[4 +: 4] (ending at index + valid), keeps fill
  st = execute(whole_load_kernel(true), args);
  EXPECT_EQ(std::vector<float>(out, out + 4), (std::vector<float>{-1, -1, -1, -1}));
  EXPECT_EQ(st.bytes_loaded, 16);

  args.params[0].i = 3, args.params[1].i = 4;  // a whole access that is partly in the row is an error, not a mask
  EXPECT_NE(error_of([&] { execute(whole_load_kernel(false), args); }).find("partial whole-vector load"),
            std::string::npos);
}

// Thread `a` of the group writes slot 0 of region "s", then `between` runs, then thread `b`
// reads (storing what it read to y[0]) or writes the slot.
Kernel two_accesses(bool b_reads, std::vector<Stmt> between, int programs = 1, int stride = 1,
                    int a = 0, int b = 1) {
  Kernel k = make_kernel(programs, 64);
  k.buffers = {{"y", DType::f32, true}};
  const int r = k.add_reg("r", Type::f32);
  k.shared = {{"s", 0, 1, stride}};
  const ExprPtr thread = add(mul(special(Special::program_in_group), i32_const(64)),
                             special(Special::worker_in_program));
  k.body = {if_(eq(thread, i32_const(a)), {shared_store(0, i32_const(0), f32_const(7))})};
  for (Stmt& s : between) k.body.push_back(std::move(s));
  k.body.push_back(
      if_(eq(thread, i32_const(b)),
          {b_reads ? shared_load(r, 0, i32_const(0)) : shared_store(0, i32_const(0), f32_const(8)),
           store({r}, 0, i64_const(0), i64_const(1), b1_const(true))}));
  return k;
}

TEST(Executor, SharedMemoryRacesNeedABarrierBetweenAccesses) {
  float y[1] = {0};
  const LaunchArgs args{2, {{y, 0, 1}}, {}};
  std::string err = error_of([&] { execute(two_accesses(false, {}), args); });
  EXPECT_NE(err.find("data race on shared region 's' slot 0"), std::string::npos) << err;
  EXPECT_NE(err.find("in group 0"), std::string::npos) << err;
  err = error_of([&] { execute(two_accesses(true, {}), args); });
  EXPECT_NE(err.find("worker 0 write and worker 1 read"), std::string::npos) << err;
  err = error_of([&] { execute(two_accesses(false, {}, 1, 1, 1, 0), args); });  // read, then write
  EXPECT_NE(err.find("data race"), std::string::npos) << err;

  EXPECT_NO_THROW(execute(two_accesses(false, {barrier(Scope::group)}), args));
  execute(two_accesses(true, {barrier(Scope::program)}), args);
  EXPECT_EQ(y[0], 7.0f);

  // With a stride of 0 both programs share slot 0: a program barrier orders only its own
  // program, so worker 65 (program 1) still races with worker 0; a group barrier orders all.
  err = error_of(
      [&] { execute(two_accesses(true, {barrier(Scope::program)}, 2, 0, 0, 65), args); });
  EXPECT_NE(err.find("data race"), std::string::npos) << err;
  y[0] = 0;
  execute(two_accesses(true, {barrier(Scope::group)}, 2, 0, 0, 65), args);
  EXPECT_EQ(y[0], 7.0f);
}

TEST(Executor, UnwrittenSharedSlotsReadAsNaN) {
  float y[1] = {0};
  Kernel k = two_accesses(true, {barrier(Scope::group)}, 1, 1, 999, 1);  // no thread 999
  execute(k, {1, {{y, 0, 1}}, {}});
  EXPECT_TRUE(std::isnan(y[0]));
}

TEST(Executor, GroupBarrierOnDivergentPathIsReported) {
  Kernel k = make_kernel(1, 64);
  k.body = {if_(eq(special(Special::lane), i32_const(0)), {barrier(Scope::group)})};
  const std::string err = error_of([&] { execute(k, {1, {}, {}}); });
  EXPECT_NE(err.find("group barrier #0 in group 0 skipped"), std::string::npos) << err;
  EXPECT_NE(err.find("worker(s) 1-31, 33-63 finished"), std::string::npos) << err;

  // Half the workers wait at another barrier.
  k.body = {if_(lt(special(Special::worker_in_program), i32_const(32)),
                {barrier(Scope::group)}, {barrier(Scope::group)})};
  const std::string err2 = error_of([&] { execute(k, {1, {}, {}}); });
  EXPECT_NE(err2.find("worker(s) 32-63 are waiting at group barrier #1"), std::string::npos)
      << err2;
}

// Clusters (tests/support/cluster_kernel.hpp): the groups of a cluster run together, each
// with its own shared memory; remote reads are checked against their owners' writes and exits.
LaunchArgs cluster_args(std::vector<float>& x, std::vector<float>& y, int64_t rows, int C) {
  x.assign(size_t(rows) * 64 * C, 0.0f);
  for (size_t i = 0; i < x.size(); ++i) x[i] = float(int(i % 11) - 5);
  y.assign(size_t(rows), -1.0f);
  return {rows * C, {{x.data(), 0, int64_t(x.size())}, {y.data(), 0, rows}}, {{0, rows}}};
}

TEST(Executor, ClusterGroupsShareARowThroughRemoteSharedLoads) {
  for (int C : {2, 3, 8}) {
    std::vector<float> x, y;
    const int64_t rows = 3;
    const ExecStats st = execute(testing::cluster_row_sum(C), cluster_args(x, y, rows, C));
    for (int64_t r = 0; r < rows; ++r) {
      float want = 0;  // the kernel's order: each group's 64 elements, groups in rank order
      std::vector<float> parts(C, 0.0f);
      for (int c = 0; c < C; ++c) {
        double p = 0;
        for (int j = 0; j < 64; ++j) p += x[size_t(r * 64 * C + c * 64 + j)];
        parts[c] = float(p);  // small integers: exact in any order
      }
      for (int c = 0; c < C; ++c) want += parts[c];
      EXPECT_EQ(y[size_t(r)], want) << "C " << C << " row " << r;
    }
    EXPECT_EQ(st.remote_loads, rows * C * 64 * C);  // every worker reads every rank
    EXPECT_EQ(st.barriers, rows * (C + 2));         // a group barrier per group, two cluster barriers
    EXPECT_NE(describe(st).find("remote shared loads"), std::string::npos) << describe(st);
  }
}

TEST(Executor, RemoteReadRacingItsOwnersWriteIsReported) {
  // Rank 1 overwrites its partial after reading the others', before the last cluster barrier:
  // rank 0's reads of that slot are unordered with the write.
  std::vector<float> x, y;
  std::string err = error_of([&] {
    execute(testing::cluster_row_sum(2, {.rewrite_after_read = true}), cluster_args(x, y, 2, 2));
  });
  EXPECT_NE(err.find("data race on shared region 'cluster_part' slot 2: worker 63 of group 0 remote read and worker 0 "
                     "of group 1 write with no cluster barrier between them"),
            std::string::npos)
      << err;
  // No barrier before the remote reads: they race with the owners' writes.
  err = error_of([&] { execute(testing::cluster_row_sum(2, {.no_first_barrier = true}), cluster_args(x, y, 1, 2)); });
  EXPECT_NE(err.find("data race on shared region 'cluster_part'"), std::string::npos) << err;
  // No barrier after them: a group exits while another may still read its shared memory.
  err = error_of([&] { execute(testing::cluster_row_sum(2, {.no_last_barrier = true}), cluster_args(x, y, 1, 2)); });
  EXPECT_NE(err.find("from group 0, which has exited (a cluster barrier must follow the last remote read)"),
            std::string::npos)
      << err;
  // Only rank 0 reads, rank 1 exits: the exit is unordered with the read.
  Kernel k = make_kernel(1, 32);
  k.ctas_per_cluster = 2;
  k.shared = {{"s", 0, 1, 1}};
  const int v = k.add_reg("v", Type::f32);
  k.body = {barrier(Scope::cluster),
            if_(eq(special(Special::cta_in_cluster), i32_const(0)), {remote_shared_load(v, 0, i32_const(0), i32_const(1))})};
  err = error_of([&] { execute(k, {2, {}, {}}); });
  EXPECT_NE(err.find("group 1 exited while worker 31 of group 0 read its shared memory with no cluster barrier"),
            std::string::npos)
      << err;
  k.body.push_back(barrier(Scope::cluster));
  EXPECT_NO_THROW(execute(k, {4, {}, {}}));
}

TEST(Executor, SkippedClusterBarrierIsReported) {
  Kernel k = make_kernel(1, 64);
  k.ctas_per_cluster = 2;
  k.body = {if_(eq(special(Special::cta_in_cluster), i32_const(0)), {barrier(Scope::cluster)})};
  const std::string err = error_of([&] { execute(k, {4, {}, {}}); });
  EXPECT_NE(err.find("cluster barrier #0 in cluster 0 skipped: worker(s) 0-63 of group 1 finished the kernel"),
            std::string::npos)
      << err;
  k.body = {if_(eq(special(Special::cta_in_cluster), i32_const(0)), {barrier(Scope::cluster)}, {barrier(Scope::cluster)})};
  const std::string err1 = error_of([&] { execute(k, {2, {}, {}}); });
  EXPECT_NE(err1.find("worker(s) 0-63 of group 1 are waiting at cluster barrier #1"), std::string::npos) << err1;
  std::vector<float> x, y;
  // A remote rank outside the cluster, and a grid that is not whole clusters.
  std::string err2 = error_of(
      [&] { execute(testing::cluster_row_sum(2, {.rank_past_cluster = true}), cluster_args(x, y, 1, 2)); });
  EXPECT_NE(err2.find("from rank 2, outside the cluster of 2 groups"), std::string::npos) << err2;
  LaunchArgs odd = cluster_args(x, y, 1, 2);
  odd.groups = 3;
  EXPECT_THROW(execute(testing::cluster_row_sum(2), odd), ExecutionError);
}

TEST(Executor, ProgramBarrierNeedsOnlyItsOwnProgram) {
  Kernel k = make_kernel(2, 32);
  k.body = {
      if_(eq(special(Special::program_in_group), i32_const(0)), {barrier(Scope::program)})};
  const ExecStats st = execute(k, {3, {}, {}});
  EXPECT_EQ(st.barriers, 3);

  k.body = {
      if_(eq(special(Special::worker_in_program), i32_const(0)), {barrier(Scope::program)})};
  const std::string err = error_of([&] { execute(k, {1, {}, {}}); });
  EXPECT_NE(err.find("program barrier #0 of program 0 in group 0 skipped"), std::string::npos)
      << err;
}

TEST(Executor, OutOfBoundsStoreIsReported) {
  Kernel k = make_kernel(1, 32);
  k.buffers = {{"y", DType::f32, true}};
  const int r = k.add_reg("r", Type::f32);
  k.body = {assign(r, f32_const(1)),
            store({r}, 0, wide(Special::worker_in_program), i64_const(1), b1_const(true))};
  std::vector<float> y(32);
  EXPECT_NO_THROW(execute(k, {1, {{y.data(), 0, 32}}, {}}));
  const std::string err = error_of([&] { execute(k, {1, {{y.data(), 0, 31}}, {}}); });
  EXPECT_NE(err.find("out-of-bounds store of buffer 'y' element 31 (accessible [0, 31))"),
            std::string::npos)
      << err;
  EXPECT_NE(err.find("by worker 31"), std::string::npos) << err;
}

// Every lane stores the lane number it reads through one shuffle: shfl_xor(offset, width), or
// shfl_idx (lane `offset` of its segment) where `indexed`.
std::vector<float> shuffled(int offset, int width, bool indexed = false) {
  Kernel k = make_kernel(1, 32);
  k.buffers = {{"y", DType::f32, true}};
  const int v = k.add_reg("v", Type::f32), t = k.add_reg("t", Type::f32);
  k.body = {assign(v, lane_f32()), indexed ? shfl_idx(t, v, offset, width) : shfl_xor(t, v, offset, width),
            store({t}, 0, wide(Special::lane), i64_const(1), b1_const(true))};
  std::vector<float> y(32, -1.0f);
  const ExecStats st = execute(k, {1, {{y.data(), 0, 32}}, {}});
  EXPECT_EQ(st.shuffles, 1);
  return y;
}

TEST(Executor, SubWarpShuffleStaysInItsSegment) {
  std::vector<float> y = shuffled(4, 8);
  for (int l = 0; l < 32; ++l) EXPECT_EQ(y[l], float(l ^ 4)) << l;
  y = shuffled(8, 8);  // PTX shfl.bfly: a later segment is out of reach, an earlier one is not
  for (int l = 0; l < 32; ++l) EXPECT_EQ(y[l], float((l & 8) ? l ^ 8 : l)) << l;
}

TEST(Executor, IndexedShuffleReadsOneLaneOfEachSegment) {
  std::vector<float> y = shuffled(0, 32, true);
  for (int l = 0; l < 32; ++l) EXPECT_EQ(y[l], 0.0f) << l;
  y = shuffled(5, 32, true);
  for (int l = 0; l < 32; ++l) EXPECT_EQ(y[l], 5.0f) << l;
  y = shuffled(3, 8, true);
  for (int l = 0; l < 32; ++l) EXPECT_EQ(y[l], float((l & ~7) | 3)) << l;
}

TEST(Executor, IndexedShuffleOutsideItsWidthIsAnError) {
  Kernel k = make_kernel(1, 32);
  const int v = k.add_reg("v", Type::f32);
  k.body = {shfl_idx(v, v, 8, 8)};
  const std::string err = error_of([&] { execute(k, {1, {}, {}}); });
  EXPECT_NE(err.find("shfl_idx lane 8 is not in [0, 8)"), std::string::npos) << err;
}

TEST(Executor, ShuffleSkippedByPartOfTheWarpIsReported) {
  Kernel k = make_kernel(1, 64);
  const int v = k.add_reg("v", Type::f32);
  k.body = {if_(lt(special(Special::lane), i32_const(16)), {shfl_xor(v, v, 1, 32)})};
  const std::string err = error_of([&] { execute(k, {1, {}, {}}); });
  EXPECT_NE(err.find("shfl_xor #0 of 'v' (offset 1, width 32) not reached by lanes of warp 0"),
            std::string::npos)
      << err;
  EXPECT_NE(err.find("lane(s) 16-31 finished"), std::string::npos) << err;
}

TEST(Executor, ForLoopWithDynamicBound) {
  Kernel k = make_kernel(1, 1);
  k.buffers = {{"y", DType::f32, true}};
  k.params = {{"n", Type::i32}};
  const int i = k.add_reg("i", Type::i32), s = k.add_reg("s", Type::i32),
            f = k.add_reg("f", Type::f32);
  k.body = {assign(s, i32_const(0)),
            for_(i, i32_const(0), param(0, Type::i32),
                 {assign(s, add(reg(s, Type::i32), reg(i, Type::i32)))}),
            assign(f, cast(Type::f32, reg(s, Type::i32))),
            store({f}, 0, i64_const(0), i64_const(1), b1_const(true))};
  float y = -1;
  for (int n : {0, 1, 1000}) {
    execute(k, {1, {{&y, 0, 1}}, {{0, n}}});
    EXPECT_EQ(y, float(n * (n - 1) / 2)) << n;
  }
}

TEST(Executor, I64IndexArithmeticBeyond32Bits) {
  Kernel k = make_kernel(1, 1);
  k.buffers = {{"x", DType::f32, false}, {"y", DType::f32, true}};
  const int big = k.add_reg("big", Type::i64), w = k.add_reg("wrapped", Type::i32);
  const int f = k.add_reg("f", Type::f32), g = k.add_reg("g", Type::f32),
            v = k.add_reg("v", Type::f32);
  const ExprPtr two_pow_33 =
      mul(cast(Type::i64, i32_const(1 << 17)), cast(Type::i64, i32_const(1 << 16)));
  k.body = {assign(big, add(two_pow_33, i64_const(3))),          // 2^33 + 3
            assign(w, mul(i32_const(65536), i32_const(65537))),  // wraps to 65536
            assign(f, cast(Type::f32, sub(reg(big, Type::i64), i64_const(int64_t(1) << 33)))),
            assign(g, cast(Type::f32, reg(w, Type::i32))),
            load({v}, 0, reg(big, Type::i64), i64_const(1), b1_const(true), false, 0.0f),
            store({f, g, v}, 1, i64_const(0), i64_const(3), b1_const(false))};
  // x's element 2^33 + 3 is real: x's base points 2^33 elements before a small array.
  float real[4] = {0, 1, 2, 42}, y[3] = {0, 0, 0};
  const int64_t off = int64_t(1) << 33;
  void* x = reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(real) - uintptr_t(off) * 4);
  execute(k, {1, {{x, off, off + 4}, {y, 0, 3}}, {}});
  EXPECT_EQ(y[0], 3.0f);
  EXPECT_EQ(y[1], 65536.0f);
  EXPECT_EQ(y[2], 42.0f);
  const std::string err = error_of([&] { execute(k, {1, {{x, off, off + 3}, {y, 0, 3}}, {}}); });
  EXPECT_NE(err.find("element 8589934595 (accessible [8589934592, 8589934595))"), std::string::npos)
      << err;
}

TEST(Executor, ArithmeticFollowsCudaAndC) {
  Kernel k = make_kernel(1, 1);
  k.buffers = {{"y", DType::f32, true}};
  k.params = {{"zero", Type::i32}, {"nan", Type::f32}};
  std::vector<int> r;
  for (int j = 0; j < 6; ++j) r.push_back(k.add_reg("r" + std::to_string(j), Type::f32));
  const ExprPtr nan = param(1, Type::f32);
  k.body = {assign(r[0], binary(BinOp::min, nan, f32_const(2))),
            assign(r[1], binary(BinOp::max, f32_const(-3), nan)),
            assign(r[2], cast(Type::f32, cast(Type::i32, f32_const(-2.75)))),
            assign(r[3], cast(Type::f32, binary(BinOp::rem, i32_const(-7), i32_const(2)))),
            assign(r[4], unary(UnOp::rsqrt, f32_const(4))),
            assign(r[5], cast(Type::f32, binary(BinOp::div, i32_const(-7), i32_const(2)))),
            store(r, 0, i64_const(0), i64_const(6), b1_const(false))};
  float y[6];
  execute(k, {1, {{y, 0, 6}}, {{0, 1}, {std::nan(""), 0}}});
  // f32 min and max propagate NaN (PTX min.NaN / max.NaN, torch.minimum / torch.maximum).
  EXPECT_TRUE(std::isnan(y[0]) && std::isnan(y[1])) << y[0] << " " << y[1];
  EXPECT_EQ(std::vector<float>(y + 2, y + 6), (std::vector<float>{-2, -1, 0.5f, -3}));

  k.body.insert(
      k.body.begin(),
      assign(r[0], cast(Type::f32, binary(BinOp::div, i32_const(1), param(0, Type::i32)))));
  const std::string err = error_of([&] { execute(k, {1, {{y, 0, 6}}, {{0, 0}, {0, 0}}}); });
  EXPECT_NE(err.find("integer division by zero"), std::string::npos) << err;
}

TEST(Executor, MalformedIrIsRejected) {
  Kernel k = make_kernel(1, 32);
  const int r = k.add_reg("r", Type::f32);
  k.body = {assign(r, i32_const(1))};
  std::string err = error_of([&] { execute(k, {1, {}, {}}); });
  EXPECT_NE(err.find("malformed IR in kernel 'test': assign of i32 to register 'r'"),
            std::string::npos)
      << err;
  k.body = {shfl_xor(r, r, 1, 12)};
  err = error_of([&] { execute(k, {1, {}, {}}); });
  EXPECT_NE(err.find("shfl_xor width 12"), std::string::npos) << err;
  err = error_of([&] { execute(k, {1, {{nullptr}}, {}}); });
  EXPECT_NE(err.find("expected 0 buffers, got 1"), std::string::npos) << err;
}

// Staged regions: group g stages row g of an f32 and a bf16 input (worker w copies columns
// [4w, 4w + 4) of each into the region at 4w), waits, reads them back and stores all four
// registers of each to y and z at (g * 64 + w) * 4, fill included. Statements by position:
// copies 2 and 3, the wait 4, the staged loads 5 and 6.
Kernel staged_copy_kernel() {
  Kernel k = make_kernel(1, 64);
  k.name = "staged_copy";
  k.buffers = {{"x", DType::f32, false}, {"h", DType::bf16, false}, {"y", DType::f32, true}, {"z", DType::f32, true}};
  k.params = {{"cols", Type::i64}};
  k.staged = {{"xs", DType::f32, 256}, {"hs", DType::bf16, 256}};
  const int col = k.add_reg("col", Type::i64), idx = k.add_reg("idx", Type::i64);
  std::vector<int> a, b;
  for (int j = 0; j < 4; ++j) a.push_back(k.add_reg("a" + std::to_string(j), Type::f32));
  for (int j = 0; j < 4; ++j) b.push_back(k.add_reg("b" + std::to_string(j), Type::f32));
  const ExprPtr cols = param(0, Type::i64), C = reg(col, Type::i64), I = reg(idx, Type::i64);
  const ExprPtr valid = sub(cols, C);
  const ExprPtr out =
      mul(add(mul(special(Special::group_index), i64_const(64)), wide(Special::worker_in_program)), i64_const(4));
  k.body = {
      assign(col, mul(wide(Special::worker_in_program), i64_const(4))),
      assign(idx, add(mul(special(Special::group_index), cols), C)),
      async_copy(0, C, 0, I, 4, valid, row_aligned(0, I, 16)),
      async_copy(1, C, 1, I, 4, valid, row_aligned(1, I, 8)),
      async_wait(),
      staged_load(a, 0, C, valid, -1.0f),
      staged_load(b, 1, C, valid, -2.0f),
      store(a, 2, out, i64_const(4), b1_const(true)),
      store(b, 3, out, i64_const(4), b1_const(true)),
  };
  return k;
}

// Two rows of 250 columns: the last two workers copy 2 and 0 elements; row 1 starts at byte
// 1000 of x (500 of h), so its copies take the scalar path.
struct StagedRows {
  static constexpr int64_t kRows = 2, kCols = 250;
  alignas(16) float x[kRows * kCols];
  alignas(16) uint16_t h[kRows * kCols];
  alignas(16) float y[kRows * 256], z[kRows * 256];
  StagedRows() {
    for (int64_t i = 0; i < kRows * kCols; ++i) {
      x[i] = float(i) * 0.37f - 40.0f;
      h[i] = uint16_t(0x3c00 + i * 37 % 0x3000);  // bits that f32 -> bf16 rounding would not make
    }
  }
  LaunchArgs args() {
    return {
        kRows, {{x, 0, kRows * kCols}, {h, 0, kRows * kCols}, {y, 0, kRows * 256}, {z, 0, kRows * 256}}, {{0, kCols}}};
  }
};

TEST(Executor, StagedRegionsHoldTheBitsAsStoredAndConvertOnLoad) {
  StagedRows rows;
  const ExecStats st = execute(staged_copy_kernel(), rows.args());
  for (int64_t g = 0; g < StagedRows::kRows; ++g)
    for (int64_t c = 0; c < 256; ++c) {
      const bool in = c < StagedRows::kCols;
      const int64_t e = g * StagedRows::kCols + c, o = g * 256 + c;
      ASSERT_EQ(rows.y[o], in ? rows.x[e] : -1.0f) << "row " << g << " column " << c;
      ASSERT_EQ(rows.z[o], in ? bf16_bits_to_float(rows.h[e]) : -2.0f) << "row " << g << " column " << c;
    }
  EXPECT_EQ(st.bytes_loaded, StagedRows::kRows * StagedRows::kCols * (4 + 2));
  // Row 0: 62 whole vectors of each input and two scalar elements each; row 1 all scalar.
  EXPECT_EQ(st.vector_accesses, 2 * 62 + 2 * 2 * 64);
  EXPECT_EQ(st.scalar_accesses, 2 * 2 + 2 * StagedRows::kCols);
}

// Groups of copies: with the xs copy committed first and the hs copy after, a wait leaving one
// group in flight lands xs only; reading hs then is a race, and a wait leaving none lands it.
TEST(Executor, AsyncWaitsLandTheOlderGroups) {
  StagedRows rows;
  Kernel k = staged_copy_kernel();
  k.body.insert(k.body.begin() + 3, async_commit());  // [2] xs copy, [3] commit, [4] hs copy, [5] wait
  k.body[5] = async_wait(1);
  Kernel reads_xs_only = k;  // up to the xs staged load
  reads_xs_only.body.erase(reads_xs_only.body.begin() + 7, reads_xs_only.body.end());
  EXPECT_NO_THROW(execute(reads_xs_only, rows.args()));
  const std::string err = error_of([&] { execute(k, rows.args()); });
  EXPECT_NE(err.find("data race on staged region 'hs' element 0: worker 0 of group 0 reads it before an async wait saw "
                     "its copy land"),
            std::string::npos)
      << err;
  k.body[5] = async_wait(0);
  EXPECT_NO_THROW(execute(k, rows.args()));
}

TEST(Executor, StagedLoadsReadOnlyTheWorkersOwnLandedCopies) {
  StagedRows rows;
  auto error = [&](const std::function<void(Kernel&)>& flaw) {
    Kernel k = staged_copy_kernel();
    flaw(k);
    return error_of([&] { execute(k, rows.args()); });
  };
  const ExprPtr col = reg(0, Type::i64);
  // Read before the async wait: the copy may not have landed.
  std::string err = error([](Kernel& k) { k.body.erase(k.body.begin() + 4); });
  EXPECT_NE(err.find("data race on staged region 'xs' element 0: worker 0 of group 0 reads it before an async wait saw "
                     "its copy land"),
            std::string::npos)
      << err;
  // Another worker's element, even after a group barrier: only its copier waited for it.
  err = error([&](Kernel& k) {
    k.body.insert(k.body.begin() + 5, barrier(Scope::group));
    k.body[6].at = binary(BinOp::rem, add(col, i64_const(4)), i64_const(256));
  });
  EXPECT_NE(err.find("data race on staged region 'xs' element 4: worker 0 of group 0 reads it, but worker 1 copied it"),
            std::string::npos)
      << err;
  // Elements past the row end were never copied (worker 62 copied 248 and 249 only).
  err = error([](Kernel& k) { k.body[5].valid = i64_const(4); });
  EXPECT_NE(err.find("staged load of staged region 'xs' element 250, which no async copy wrote, by worker 62"),
            std::string::npos)
      << err;
  // An offset past the region.
  err = error([&](Kernel& k) { k.body[6].at = add(col, i64_const(256)); });
  EXPECT_NE(err.find("out-of-bounds staged load from staged region 'hs' element 256 (size 256), by worker 0"),
            std::string::npos)
      << err;
  // A second copy into an element before the wait, and a copy after the worker read it.
  err = error([](Kernel& k) {
    const Stmt copy = k.body[2];
    k.body.insert(k.body.begin() + 3, copy);
  });
  EXPECT_NE(err.find("second async copy into staged region 'xs' element 0 before the first landed"), std::string::npos)
      << err;
  err = error([](Kernel& k) {
    const Stmt copy = k.body[2];
    k.body.push_back(copy);
  });
  EXPECT_NE(err.find("async copy into staged region 'xs' element 0 after this worker read it"), std::string::npos)
      << err;
}

TEST(Executor, AsyncCopiesAreCheckedAsLoads) {
  StagedRows rows;
  // A forced vector copy of row 1 (x + 1000 bytes) is misaligned; the scalar path is not.
  Kernel k = staged_copy_kernel();
  k.body[2].aligned = b1_const(true);
  std::string err = error_of([&] { execute(k, rows.args()); });
  EXPECT_NE(err.find("misaligned vector access: async copy of 4 x f32 at buffer 'x' element 250"), std::string::npos)
      << err;
  k.body[2].aligned = b1_const(false);
  EXPECT_NO_THROW(execute(k, rows.args()));
  // Global bounds, as loads check them.
  LaunchArgs args = rows.args();
  args.buffers[1].hi = 300;
  err = error_of([&] { execute(staged_copy_kernel(), args); });
  EXPECT_NE(err.find("out-of-bounds async copy of buffer 'h' element 300"), std::string::npos) << err;
  // A vector copy into the staged region needs its 16-byte words aligned there too.
  k = staged_copy_kernel();
  k.body[2].at = add(reg(0, Type::i64), i64_const(1));
  k.body[5].at = k.body[2].at;
  err = error_of([&] { execute(k, rows.args()); });
  EXPECT_NE(err.find("misaligned vector async copy into staged region 'xs' element 1 (byte 4 of staged memory)"),
            std::string::npos)
      << err;
}

// Not a correctness test: reports the executor's speed on the row-sum kernel.
TEST(Executor, RowSumThroughput) {
  const int64_t rows = 1024, cols = 4096;
  std::vector<float> x(rows * cols, 1.0f), y(rows);
  const Kernel k = row_sum_kernel(1, 256);
  const auto t0 = std::chrono::steady_clock::now();
  const ExecStats st =
      execute(k, {rows, {{x.data(), 0, rows * cols}, {y.data(), 0, rows}}, {{0, rows}, {0, cols}}});
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(y[rows - 1], float(cols));
  std::cout << "row_sum " << rows << "x" << cols << " with 256 workers per row: " << s * 1e3
            << " ms, " << rows * cols / s / 1e6 << " M elements/s; " << describe(st) << "\n";
}

}  // namespace
}  // namespace tile::cpu
