#include "tile/policy.hpp"

#include <gtest/gtest.h>

#include <set>

#include "support/error_of.hpp"
#include "tile/error.hpp"

namespace tile {
namespace {

PlanInputs inputs(int64_t rows, int64_t cols, DType dt = DType::f32) { return PlanInputs::for_rows(dt, dt, rows, cols); }

// What validate_plan says of `q` for a softmax call of `in` ("" when it accepts it).
std::string error(const MappingPlan& q, const DeviceLimits& limits, const PlanInputs& in) {
  try {
    validate_plan(q, in, limits, "softmax");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Policy, ShortRowsGetPackedSubWarpPrograms) {
  MappingPlan p = choose_plan(inputs(100000, 32), {});
  EXPECT_EQ(p.vector_elems, 4);
  EXPECT_EQ(p.workers_per_program, 8);
  EXPECT_EQ(p.programs_per_group, 32);  // 256 threads
  EXPECT_EQ(p.width_mode, WidthMode::automatic);
}

TEST(Policy, LongRowsGetMultiWarpProgramsWithCachedRows) {
  MappingPlan p = choose_plan(inputs(1024, 4096), {});
  EXPECT_EQ(p.workers_per_program, 256);
  EXPECT_EQ(p.stripes, 4);
  EXPECT_EQ(p.caching, InputCaching::registers);
  EXPECT_EQ(p.programs_per_group, 1);
  p = choose_plan(inputs(64, 8192), {});
  EXPECT_EQ(p.workers_per_program, 512);  // 32 KiB rows: the last length cached in registers
  EXPECT_EQ(p.stripes * p.vector_elems, 16);
  EXPECT_EQ(p.caching, InputCaching::registers);
  p = choose_plan(inputs(64, 16384), {});
  EXPECT_EQ(p.caching, InputCaching::reread);  // 64 KiB rows are re-read, half a row per iteration
  EXPECT_EQ(p.workers_per_program, 512);
  EXPECT_EQ(p.stripe_unroll, 4);
  p = choose_plan(inputs(64, 262144, DType::bf16), {});
  EXPECT_EQ(p.caching, InputCaching::reread);
  EXPECT_EQ(p.vector_elems, 8);
  EXPECT_EQ(p.workers_per_program, 1024);  // 64 KiB per iteration at most
  EXPECT_EQ(p.stripe_unroll, 4);
  PlanRequest cached;
  cached.caching = InputCaching::registers;  // a caller may still cache a long row
  p = choose_plan(inputs(64, 32768), cached);
  EXPECT_EQ(p.workers_per_program, 512);  // the automatic width stops at 512
  EXPECT_EQ(p.stripes * p.vector_elems, 64);
}

// `row_inputs` row inputs of one dtype (a backward pass's dy and x, fused_add_rms_norm's x and
// residual, fused_add_rms_norm_backward's three), with `accumulators` per-element accumulators
// of reductions over the rows (weight gradients); a row of a norm's backward pass merges one sum
// per accumulator (rms_norm_backward one, layer_norm_backward two).
PlanInputs several_inputs(DType dtype, int64_t rows, int64_t cols, int row_inputs, int accumulators) {
  PlanInputs in = PlanInputs::for_rows(dtype, dtype, rows, cols);
  for (int i = 1; i < row_inputs; ++i) in.row_operands.push_back(in.row_operands.front());  // front(): x
  in.rows_reduction_parts = accumulators;
  in.reduces_rows = accumulators > 0;
  if (accumulators > 0) in.merge_parts = accumulators;
  return in;
}

PlanInputs two_inputs(int64_t rows, int64_t cols, int accumulators) {
  return several_inputs(DType::bf16, rows, cols, 2, accumulators);
}

TEST(Policy, RowsReducingProgramsCacheTheirRowWideningUpTo1024Workers) {
  // bf16 x 16384, two inputs and one accumulator a column: 512 workers would cache
  // 4 x 8 x 3 = 96 scalars, over the budget of 64; 1024 workers cache 48 (H200: 407 us against
  // 709 for re-reading with 256 workers).
  MappingPlan p = choose_plan(two_inputs(8192, 16384, 1), {});
  EXPECT_EQ(p.caching, InputCaching::registers);
  EXPECT_EQ(p.workers_per_program, 1024);
  EXPECT_EQ(p.stripes, 2);
  p = choose_plan(two_inputs(8192, 8192, 2), {});  // LayerNorm's two accumulators: 1 x 8 x 4 = 32
  EXPECT_EQ(p.caching, InputCaching::registers);
  EXPECT_EQ(p.workers_per_program, 1024);
  // Where no width up to 1024 holds it, the row is re-read.
  p = choose_plan(two_inputs(8192, 32768, 1), {});
  EXPECT_EQ(p.caching, InputCaching::reread);
  // And where the row inputs take more than 64 KiB a row together and the slice more than 32
  // scalars: f32 x 16384 (128 KiB, 48 scalars at 1024 workers; H200: 311 us against 420
  // caching), three bf16 rows (96 KiB, 64 scalars: 651 against 863); the same three rows of
  // f32 x 8192 (96 KiB) cache 32 scalars.
  p = choose_plan(several_inputs(DType::f32, 4096, 16384, 2, 1), {});
  EXPECT_EQ(p.caching, InputCaching::reread);
  EXPECT_EQ(p.workers_per_program, 1024);
  EXPECT_EQ(choose_plan(several_inputs(DType::bf16, 8192, 16384, 3, 1), {}).caching, InputCaching::reread);
  EXPECT_EQ(choose_plan(several_inputs(DType::f32, 8192, 8192, 3, 1), {}).caching, InputCaching::registers);
  // A request for re-reading, or for a width, is kept.
  PlanRequest reread;
  reread.caching = InputCaching::reread;
  EXPECT_EQ(choose_plan(two_inputs(8192, 16384, 1), reread).caching, InputCaching::reread);
  PlanRequest narrow;
  narrow.workers_per_program = 256;
  EXPECT_EQ(choose_plan(two_inputs(8192, 16384, 1), narrow).caching, InputCaching::reread);
}

TEST(Policy, RowsReducingProgramsStartAtEightColumnsAWorker) {
  // Eight columns a worker (one bf16 vector, two f32 ones), at least 512 workers, at most 1024
  // (H200: rms_norm_backward bf16 x 4096 305 us with 512 workers against 390 with 256;
  // layer_norm_backward f32 x 8192 278 us with 1024 against 641 with 512).
  MappingPlan p = choose_plan(two_inputs(32768, 4096, 1), {});
  EXPECT_EQ(p.caching, InputCaching::registers);
  EXPECT_EQ(p.workers_per_program, 512);
  EXPECT_EQ(p.stripes, 1);
  // f32 x 4096 (1024 vectors) takes one vector a worker and prefetches (RowsReducingProgramsOf
  // OneVectorAWorkerPrefetchTheNextRowBlock); without prefetching, two stripes of 512 workers.
  p = choose_plan(several_inputs(DType::f32, 16384, 4096, 2, 1), {});
  EXPECT_EQ(p.workers_per_program, 1024);
  EXPECT_EQ(p.stripes, 1);
  PlanRequest no_prefetch;
  no_prefetch.row_prefetch = RowPrefetch::none;
  p = choose_plan(several_inputs(DType::f32, 16384, 4096, 2, 1), no_prefetch);
  EXPECT_EQ(p.workers_per_program, 512);
  EXPECT_EQ(p.stripes, 2);
  p = choose_plan(two_inputs(16384, 8192, 1), {});
  EXPECT_EQ(p.workers_per_program, 1024);
  EXPECT_EQ(p.stripes, 1);
  p = choose_plan(several_inputs(DType::f32, 8192, 8192, 3, 1), {});  // fused_add_rms_norm_backward's three rows
  EXPECT_EQ(p.workers_per_program, 1024);
  EXPECT_EQ(p.stripes, 2);
  const int grid_512 = choose_plan(two_inputs(32768, 4096, 1), {}).grid_limit;
  EXPECT_EQ(grid_512, 2 * DeviceLimits{}.sm_count);  // about two groups an SM
  // Rows of fewer vectors than 512: one worker a vector, and twice the groups an SM, about 1024
  // threads (H200, bf16 x 2048: rms_norm_backward 310 us against 437 with two groups an SM).
  p = choose_plan(two_inputs(65536, 2048, 1), {});
  EXPECT_EQ(p.workers_per_program, 256);
  EXPECT_EQ(p.stripes, 1);
  EXPECT_EQ(p.grid_limit, 2 * grid_512);
  // A register-cached row takes one wave of resident groups, at most 8 program slots an SM:
  // 1024 workers one group an SM (H200, f32 x 8192: layer_norm_backward 250 us against 281 on
  // two), two programs of 128 in a group of 256 four groups an SM (bf16 x 1024:
  // rms_norm_backward 349 against 466 on two), four programs of 64 capped at two groups an SM.
  const int sms = DeviceLimits{}.sm_count;
  p = choose_plan(two_inputs(16384, 8192, 1), {});
  EXPECT_EQ(p.resident_groups, 1);
  EXPECT_EQ(p.grid_limit, sms);
  p = choose_plan(two_inputs(131072, 1024, 1), {});
  ASSERT_EQ(p.threads_per_group(), 256) << p.to_json();
  EXPECT_EQ(p.programs_per_group, 2);
  EXPECT_EQ(p.grid_limit, 4 * sms);
  p = choose_plan(two_inputs(131072, 512, 1), {});
  ASSERT_EQ(p.programs_per_group, 4) << p.to_json();
  EXPECT_EQ(p.grid_limit, 2 * sms) << p.to_json();
  // Re-read rows keep about two groups an SM.
  p = choose_plan(two_inputs(4096, 65536, 1), {});
  ASSERT_EQ(p.caching, InputCaching::reread);
  EXPECT_EQ(p.grid_limit, 2 * sms);
  PlanRequest grid;
  grid.grid_limit = 7;  // a requested grid limit is kept
  EXPECT_EQ(choose_plan(two_inputs(65536, 2048, 1), grid).grid_limit, 7);
}

TEST(Policy, RowsReducingProgramsOfOneVectorAWorkerPrefetchTheNextRowBlock) {
  // One stripe of cached row, looping over row blocks: the next block's row loads go out during
  // this one (H200: rms_norm_backward bf16 x 8192 224 us against 344, x 1024 281 against 349).
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{131072, 1024}, {32768, 4096}, {16384, 8192}}) {
    const MappingPlan p = choose_plan(two_inputs(rows, cols, 1), {});
    EXPECT_EQ(p.stripes, 1) << cols;
    EXPECT_GT(p.grid_limit, 0) << cols;
    EXPECT_EQ(p.row_prefetch, RowPrefetch::next) << cols << " " << p.to_json();
  }
  // Two stripes do not (1024 workers of two vectors prefetching lost 21-98 %), nor programs
  // without a reduction over the rows (one row block a group), nor re-read rows.
  EXPECT_EQ(choose_plan(two_inputs(8192, 16384, 1), {}).row_prefetch, RowPrefetch::none);
  EXPECT_EQ(choose_plan(several_inputs(DType::f32, 8192, 8192, 2, 1), {}).row_prefetch, RowPrefetch::none);
  EXPECT_EQ(choose_plan(two_inputs(32768, 4096, 0), {}).row_prefetch, RowPrefetch::none);
  EXPECT_EQ(choose_plan(two_inputs(4096, 65536, 1), {}).row_prefetch, RowPrefetch::none);
  // Packed programs (two of 128 a group at 1024 columns) prefetch whatever their row merges:
  // one sum (rms_norm_backward, fused_add_rms_norm_backward) or two (layer_norm_backward: H200,
  // 306.1 us without against 259.2 with, now that a row takes one barrier).
  const MappingPlan rms = choose_plan(two_inputs(131072, 1024, 1), {});
  ASSERT_EQ(rms.programs_per_group, 2);
  EXPECT_EQ(rms.row_prefetch, RowPrefetch::next);
  const MappingPlan ln = choose_plan(two_inputs(131072, 1024, 2), {});
  ASSERT_EQ(ln.programs_per_group, 2);
  EXPECT_EQ(ln.row_prefetch, RowPrefetch::next);
  EXPECT_EQ(choose_plan(several_inputs(DType::bf16, 131072, 1024, 3, 1), {}).row_prefetch, RowPrefetch::next);
  EXPECT_EQ(choose_plan(two_inputs(32768, 4096, 2), {}).row_prefetch, RowPrefetch::next);  // one program a group
  // A slice, accumulators and prefetched vectors over the budget: none.
  PlanRequest small;
  small.private_budget = 40;  // bf16 one stripe: 8 x 3 + 16 = 40 fits, 39 does not
  EXPECT_EQ(choose_plan(two_inputs(16384, 8192, 1), small).row_prefetch, RowPrefetch::next);
  small.private_budget = 39;
  EXPECT_EQ(choose_plan(two_inputs(16384, 8192, 1), small).row_prefetch, RowPrefetch::none);
}

// Where the target has clusters, a program with per-column accumulators over rows of more than
// 8192 elements splits them over the smallest cluster whose slice and accumulators fit 64
// scalars: groups of 512 (one an SM) for rows of up to 16384, else groups of 256 (two an SM)
// where a cluster of 16 holds the row, else of 512; 16-bit rows prefetch the next row block
// within 128 scalars. The grid is one wave of row blocks; none on a target without clusters,
// nor at 8192 columns, nor where no cluster of 16 holds the slice (re-read).
TEST(Policy, RowsReducingProgramsOfLongRowsSplitThemOverASmallCluster) {
  DeviceLimits clusters;
  clusters.max_cluster_size = 16;
  const int sms = clusters.sm_count;
  MappingPlan p = choose_plan(two_inputs(8192, 16384, 1), {}, clusters);
  EXPECT_EQ(p.ctas_per_program, 2) << p.to_json();
  EXPECT_EQ(p.workers_per_program, 512);
  EXPECT_EQ(p.stripes, 2);  // 2 x 8 x 3 = 48 scalars
  EXPECT_EQ(p.caching, InputCaching::registers);
  EXPECT_EQ(p.resident_groups, 1);
  EXPECT_EQ(p.row_prefetch, RowPrefetch::next);  // 48 + 2 x 8 x 2 = 80 within 128
  EXPECT_EQ(p.grid_limit, sms / 2);
  EXPECT_NO_THROW(validate_plan(p, two_inputs(8192, 16384, 1), clusters, "rms_norm_backward"));
  p = choose_plan(several_inputs(DType::f32, 4096, 16384, 2, 1), {}, clusters);
  EXPECT_EQ(p.ctas_per_program, 2) << p.to_json();
  EXPECT_EQ(p.stripes, 4);                       // 4 x 4 x 3 = 48
  EXPECT_EQ(p.row_prefetch, RowPrefetch::none);  // f32 rows do not prefetch here
  // 32768 columns: 8 groups of 256, two an SM (4 would need 4 x 8 x 3 = 96 scalars).
  for (int accumulators : {1, 2}) {
    p = choose_plan(two_inputs(4096, 32768, accumulators), {}, clusters);
    EXPECT_EQ(p.ctas_per_program, 8) << p.to_json();
    EXPECT_EQ(p.workers_per_program, 256);
    EXPECT_EQ(p.stripes, 2);
    EXPECT_EQ(p.resident_groups, 2);
    EXPECT_EQ(p.grid_limit, 2 * sms / 8);
    EXPECT_NO_THROW(validate_plan(p, two_inputs(4096, 32768, accumulators), clusters, "layer_norm_backward"));
  }
  // 131072: no cluster of 16 groups of 256 holds 8 x 8 x 3 scalars a worker; 16 of 512 do.
  p = choose_plan(two_inputs(1024, 131072, 1), {}, clusters);
  EXPECT_EQ(p.ctas_per_program, 16) << p.to_json();
  EXPECT_EQ(p.workers_per_program, 512);
  EXPECT_EQ(p.resident_groups, 1);
  EXPECT_EQ(choose_plan(two_inputs(512, 262144, 1), {}, clusters).caching, InputCaching::reread);
  // Not at 8192 columns, nor without clusters.
  EXPECT_EQ(choose_plan(two_inputs(16384, 8192, 1), {}, clusters).ctas_per_program, 1);
  EXPECT_EQ(choose_plan(two_inputs(8192, 16384, 1), {}).ctas_per_program, 1);
  // A request for a mapping keeps the single-group rules.
  PlanRequest wide;
  wide.workers_per_program = 1024;
  EXPECT_EQ(choose_plan(two_inputs(8192, 16384, 1), wide, clusters).ctas_per_program, 1);
}

TEST(Policy, RowsReducingProgramsOfTwoStripesOfSixteenBitRowsKeepThemPacked) {
  // bf16 x 16384 on 1024 workers, two stripes (H200: rms_norm_backward 332 us packed against
  // 396); one stripe, f32 rows and programs without per-column accumulators stay f32.
  EXPECT_EQ(choose_plan(two_inputs(8192, 16384, 1), {}).cache_format, CacheFormat::packed);
  EXPECT_EQ(choose_plan(two_inputs(8192, 16384, 2), {}).cache_format, CacheFormat::packed);
  EXPECT_EQ(choose_plan(two_inputs(16384, 8192, 1), {}).cache_format, CacheFormat::f32);
  EXPECT_EQ(choose_plan(several_inputs(DType::f32, 8192, 8192, 2, 1), {}).cache_format, CacheFormat::f32);
  EXPECT_EQ(choose_plan(two_inputs(8192, 16384, 0), {}).cache_format, CacheFormat::f32);
  PlanRequest f32;
  f32.cache_format = CacheFormat::f32;  // a request is kept
  EXPECT_EQ(choose_plan(two_inputs(8192, 16384, 1), f32).cache_format, CacheFormat::f32);
}

// The second phase of a reduction over the rows folds 32 columns a group with as many warps as
// a group holds splitting the slots (H200: rms_norm_backward bf16 x 1024 214.8 us against 233.7
// with 8 warps); a narrower target gets its widest group, and a request is kept.
TEST(Policy, SecondPhaseTakesTheWidestGroup) {
  EXPECT_EQ(choose_plan(two_inputs(131072, 1024, 1), {}).finish_workers, 1024);
  DeviceLimits narrow;
  narrow.max_threads_per_group = 512;
  EXPECT_EQ(choose_plan(two_inputs(131072, 1024, 2), {}, narrow).finish_workers, 512);
  PlanRequest req;
  req.finish_workers = 128;
  EXPECT_EQ(choose_plan(two_inputs(131072, 1024, 1), req).finish_workers, 128);
}

// Row values reduced over the rows (cross-entropy's summed loss) take a workspace slot a
// program of every row block, up to 65536 slots; past that their row blocks loop, 65536 slots'
// worth of them at once. Staged rows, one row block a group by validation, keep it.
TEST(Policy, RowValuesReducedOverTheRowsLoopOnlyPastTheirSlotBound) {
  PlanInputs in = PlanInputs::for_rows(DType::bf16, DType::bf16, 4096, 32000);
  in.reduces_rows = true;
  EXPECT_EQ(choose_plan(in, {}).grid_limit, 0);
  in.rows = 65536;
  EXPECT_EQ(choose_plan(in, {}).grid_limit, 0);
  in.rows = 65537;
  EXPECT_EQ(choose_plan(in, {}).grid_limit, 65536);
  in.cols = 64, in.rows = 1 << 20;  // short rows, packed programs: slots = blocks x programs
  const MappingPlan packed = choose_plan(in, {});
  ASSERT_GT(packed.programs_per_group, 1);
  EXPECT_EQ(packed.grid_limit, 65536 / packed.programs_per_group);
  EXPECT_LE(int64_t(packed.grid_limit) * packed.programs_per_group, 65536);  // the workspace's slots
  PlanRequest staged;
  staged.caching = InputCaching::shared;
  in.cols = 32000, in.rows = 100000;
  EXPECT_EQ(choose_plan(in, staged).grid_limit, 0);
  // Without the reduction, nothing loops.
  in.reduces_rows = false;
  EXPECT_EQ(choose_plan(in, {}).grid_limit, 0);
}

TEST(Policy, RowPrefetchIsValidatedAgainstItsLoopAndBudget) {
  const PlanInputs in = two_inputs(16384, 8192, 1);
  const MappingPlan p = choose_plan(in, {});
  ASSERT_EQ(p.row_prefetch, RowPrefetch::next);
  auto refused = [&](MappingPlan q) { return testing::error_of([&] { validate_plan(q, in, DeviceLimits{}, "op"); }); };
  auto refused_for = [](const PlanInputs& call, MappingPlan q) {
    return testing::error_of([&] { validate_plan(q, call, DeviceLimits{}, "op"); });
  };
  MappingPlan q = p;
  q.grid_limit = 0;
  EXPECT_NE(refused(q).find("'plan.row_prefetch': expected \"none\" unless the rows are re-read (caching \"reread\": "
                            "the next iteration's loads) or groups loop over row blocks"),
            std::string::npos)
      << refused(q);
  // Re-read rows may load their next iteration ahead, looping over row blocks or not; staged
  // rows may not.
  q = p;
  q.caching = InputCaching::reread, q.merge = MergeStrategy::combine;
  EXPECT_EQ(refused(q), "");
  q.grid_limit = 0;
  EXPECT_EQ(refused_for(two_inputs(16384, 8192, 0), q), "");
  q = choose_plan(two_inputs(16384, 8192, 0), {}), q.caching = InputCaching::shared, q.row_prefetch = RowPrefetch::next;
  EXPECT_NE(refused_for(two_inputs(16384, 8192, 0), q).find("plan.row_prefetch"), std::string::npos)
      << refused_for(two_inputs(16384, 8192, 0), q);
  q = p;
  q.stripes = 2, q.private_budget = 64;  // 2 x 8 x 3 + 32 = 80 scalars
  EXPECT_NE(refused(q).find("+ 32 prefetched (the next row block's row inputs) = 80 scalars per worker"),
            std::string::npos)
      << refused(q);
  q.private_budget = 80;
  EXPECT_EQ(refused(q), "");
}

TEST(Policy, SeveralRowInputsTakeFewerStripesAWorker) {
  // Two bf16 row inputs of 4096 columns, no reduction over the rows: one vector of each a worker,
  // 512 workers (H200: log_softmax_backward 206 us against 234 for 256 workers of 2 stripes,
  // 314 for 128 of 4).
  MappingPlan p = choose_plan(two_inputs(32768, 4096, 0), {});
  EXPECT_EQ(p.caching, InputCaching::registers);
  EXPECT_EQ(p.workers_per_program, 512);
  EXPECT_EQ(p.stripes, 1);
  EXPECT_EQ(p.programs_per_group, 1);
  // bf16 x 1024: two programs of 128 a group; x 8192: the automatic width stops at 512, 2 stripes.
  p = choose_plan(two_inputs(131072, 1024, 0), {});
  EXPECT_EQ(p.workers_per_program, 128);
  EXPECT_EQ(p.stripes, 1);
  EXPECT_EQ(p.programs_per_group, 2);
  EXPECT_EQ(choose_plan(two_inputs(16384, 8192, 0), {}).stripes, 2);
  // f32 rows keep two vectors of each a worker: eight elements.
  p = choose_plan(several_inputs(DType::f32, 16384, 4096, 2, 0), {});
  EXPECT_EQ(p.workers_per_program, 512);
  EXPECT_EQ(p.stripes, 2);
  // One input keeps 4 stripes (the forward operators' plans).
  p = choose_plan(PlanInputs::for_rows(DType::bf16, DType::bf16, 32768, 4096), {});
  EXPECT_EQ(p.workers_per_program, 128);
  EXPECT_EQ(p.stripes, 4);
}

TEST(Policy, RereadingSeveralRowInputsUnrollsLessAndWidens) {
  // 2 inputs: unroll 2 with twice the workers of one input's unroll 4, the same bytes an
  // iteration (H200, bf16 x 16384: softmax_backward 316 -> 202 us, fused_add_rms_norm 357 -> 275).
  MappingPlan p = choose_plan(two_inputs(8192, 16384, 0), {});
  EXPECT_EQ(p.caching, InputCaching::reread);
  EXPECT_EQ(p.stripe_unroll, 2);
  EXPECT_EQ(p.workers_per_program, 512);
  // One input keeps unroll 4 (the forward operators' measured optimum).
  p = choose_plan(PlanInputs::for_rows(DType::bf16, DType::bf16, 8192, 32768), {});
  EXPECT_EQ(p.stripe_unroll, 4);
  EXPECT_EQ(p.workers_per_program, 512);
}

// One 16-bit row input with `parts` merged slots (2: softmax's maximum and sum; 5 or more:
// LayerNorm's).
PlanInputs merged_parts(DType dtype, int64_t rows, int64_t cols, int parts) {
  PlanInputs in = PlanInputs::for_rows(dtype, dtype, rows, cols);
  in.merge_parts = parts;
  return in;
}

TEST(Policy, ShortSixteenBitRowsTakeWidthAndResidencyByTheirMergedParts) {
  // 32 vectors of bf16 (x 256): two merged parts take half-warp programs of two vectors a
  // worker; three (RMSNorm's) and LayerNorm's keep one warp a row.
  MappingPlan p = choose_plan(merged_parts(DType::bf16, 131072, 256, 2), {});
  EXPECT_EQ(p.workers_per_program, 16);
  EXPECT_EQ(p.stripes, 2);
  EXPECT_EQ(p.programs_per_group, 16);
  EXPECT_EQ(p.resident_groups, 6);  // 1536 threads' worth
  for (int parts : {3, 5}) {
    p = choose_plan(merged_parts(DType::bf16, 131072, 256, parts), {});
    EXPECT_EQ(p.workers_per_program, 32) << parts;
    EXPECT_EQ(p.stripes, 1) << parts;
  }
  // fp32 rows of 32 vectors (x 128) and rows of 33 vectors keep whole warps.
  EXPECT_EQ(choose_plan(merged_parts(DType::f32, 131072, 128, 2), {}).workers_per_program, 32);
  EXPECT_EQ(choose_plan(merged_parts(DType::bf16, 131072, 264, 2), {}).workers_per_program % 32, 0);
  // A requested width or stripe count is kept.
  PlanRequest stripes;
  stripes.stripes = 1;
  EXPECT_EQ(choose_plan(merged_parts(DType::bf16, 131072, 256, 2), stripes).workers_per_program, 32);
  // x 512: LayerNorm's parts ask for five groups of 256 an SM, the others for six.
  EXPECT_EQ(choose_plan(merged_parts(DType::bf16, 65536, 512, 5), {}).resident_groups, 5);
  EXPECT_EQ(choose_plan(merged_parts(DType::bf16, 65536, 512, 3), {}).resident_groups, 6);
  EXPECT_EQ(choose_plan(merged_parts(DType::f32, 65536, 512, 5), {}).resident_groups, 4);
}

TEST(Policy, OddSixteenBitRowsPeelTheirHeadOrAskForThreeGroupsOf512) {
  // Odd strides: bf16 x 3001 without LayerNorm's five parts peels each row's head for 16-byte
  // vectors, in eight programs of one warp a group; with them it takes one-element vectors, 6
  // cached scalars a worker in groups of 512, three an SM where the rows fill the SMs twice
  // over; fp32 and few rows keep two.
  for (int parts : {2, 3}) {
    const MappingPlan p = choose_plan(merged_parts(DType::bf16, 4096, 3001, parts), {});
    EXPECT_EQ(p.row_head, RowHead::peel) << parts;
    EXPECT_EQ(p.vector_elems, 8) << parts;
    EXPECT_EQ(p.workers_per_program, 32) << parts;
    EXPECT_EQ(p.programs_per_group, 8) << parts;
  }
  // Long odd rows peel too, at the width of the rules below, and never over a cluster.
  const MappingPlan long_row = choose_plan(merged_parts(DType::bf16, 512, 50257, 2), {});
  EXPECT_EQ(long_row.row_head, RowHead::peel);
  EXPECT_EQ(long_row.ctas_per_program, 1);
  const MappingPlan p = choose_plan(merged_parts(DType::bf16, 4096, 3001, 5), {});
  EXPECT_EQ(p.row_head, RowHead::as_is);
  EXPECT_EQ(p.vector_elems, 1);
  EXPECT_EQ(p.workers_per_program, 512);
  EXPECT_EQ(p.resident_groups, 3);
  EXPECT_EQ(choose_plan(merged_parts(DType::bf16, 512, 3001, 5), {}).resident_groups, 2);
  EXPECT_EQ(choose_plan(merged_parts(DType::f32, 4096, 3001, 5), {}).resident_groups, 2);
  // Fewer rows than SMs: one wave, so launch bounds ask for one group an SM (see below).
  EXPECT_EQ(choose_plan(merged_parts(DType::bf16, 37, 1537, 5), {}).resident_groups, 1);
}

// A grid of no more groups than SMs holds one group an SM whatever launch bounds ask, so the
// policy asks for one (more only takes registers away: decode-sized LayerNorm spilled); a
// request still sets it, and a cluster's groups count.
TEST(Policy, OneWaveOfGroupsAsksForOneResidentGroup) {
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{1, 4096}, {64, 16384}, {132, 4096}}) {
    const MappingPlan p = choose_plan(merged_parts(DType::bf16, rows, cols, 5), {});
    EXPECT_EQ(p.ctas_per_program, 1);
    EXPECT_EQ(p.resident_groups, 1) << rows << " x " << cols;
  }
  EXPECT_GT(choose_plan(merged_parts(DType::bf16, 133, 4096, 5), {}).resident_groups, 1);
  PlanRequest two;
  two.resident_groups = 2;
  EXPECT_EQ(choose_plan(merged_parts(DType::bf16, 1, 4096, 5), two).resident_groups, 2);
  // Staged rows ask for as many groups as shared memory holds, unless one wave holds them all.
  PlanRequest staged;
  staged.caching = InputCaching::shared;
  EXPECT_GT(choose_plan(merged_parts(DType::bf16, 4096, 4096, 2), staged).resident_groups, 1);
  EXPECT_EQ(choose_plan(merged_parts(DType::bf16, 8, 4096, 2), staged).resident_groups, 1);
}

// More row blocks than a grid holds (2^31 - 1 groups): the policy launches the most row blocks a
// plan may (grid_limit 2^30) and each group loops over the rest, where its plan was one the
// grid check refused. Fewer keep one row block a group.
TEST(Policy, MoreRowBlocksThanAGridHoldsLoopOverThem) {
  const DeviceLimits limits;
  for (int64_t rows : {int64_t(1) << 40, int64_t(1) << 50}) {
    const PlanInputs in = inputs(rows, 1);
    const MappingPlan p = choose_plan(in, {});
    EXPECT_EQ(p.grid_limit, 1 << 30) << rows;
    EXPECT_NO_THROW(validate_plan(p, in, limits, "softmax"));
    EXPECT_LE(std::min<int64_t>((rows + p.programs_per_group - 1) / p.programs_per_group, p.grid_limit) *
                  p.ctas_per_program,
              INT32_MAX);
  }
  EXPECT_EQ(choose_plan(inputs(int64_t(1) << 30, 1), {}).grid_limit, 0);
}

TEST(Policy, OddRowsFewerThanTheSmsOfAtMostAGroupOfVectorsAreNotPeeled) {
  // bf16 37 x 1537 (a seed shape): 193 vectors a row, fewer rows than SMs, so the row stays as it
  // is, one element a stripe: seven stripes a worker (224 workers) with combined merges for
  // merges of two parts, five (320 workers) with staged merges for more.
  const DeviceLimits limits;
  for (DType dtype : {DType::bf16, DType::f32}) {
    const MappingPlan two = choose_plan(merged_parts(dtype, 37, 1537, 2), {});
    EXPECT_EQ(two.row_head, RowHead::as_is);
    EXPECT_EQ(two.vector_elems, 1);
    EXPECT_EQ(two.workers_per_program, 224);
    EXPECT_EQ(two.stripes, 7);
    EXPECT_EQ(two.merge, MergeStrategy::combine);
    for (int parts : {3, 5}) {
      const MappingPlan more = choose_plan(merged_parts(dtype, 37, 1537, parts), {});
      // f32 LayerNorm's five parts keep four stripes.
      const bool kept = parts == 5 && dtype == DType::f32;
      EXPECT_EQ(more.row_head, RowHead::as_is) << parts;
      EXPECT_EQ(more.workers_per_program, kept ? 416 : 320) << parts;
      EXPECT_EQ(more.stripes, kept ? 4 : 5) << parts;
      EXPECT_EQ(more.merge, MergeStrategy::staged) << parts;
    }
  }
  // As many rows as SMs keep four stripes (and peel, in bf16); so do rows of whole vectors; a
  // request for stripes or a merge is kept.
  const MappingPlan wave = choose_plan(merged_parts(DType::f32, limits.sm_count, 1537, 2), {});
  EXPECT_EQ(wave.stripes, 4);
  EXPECT_EQ(wave.merge, MergeStrategy::staged);
  const MappingPlan aligned = choose_plan(merged_parts(DType::bf16, 37, 4096, 2), {});
  EXPECT_EQ(aligned.vector_elems, 8);
  EXPECT_EQ(aligned.workers_per_program, 128);
  EXPECT_EQ(aligned.merge, MergeStrategy::staged);
  PlanRequest fixed;
  fixed.stripes = 4;
  fixed.merge = MergeStrategy::staged;
  const MappingPlan kept = choose_plan(merged_parts(DType::bf16, 37, 1537, 2), fixed);
  EXPECT_EQ(kept.workers_per_program, 416);
  EXPECT_EQ(kept.merge, MergeStrategy::staged);
  // As many rows as SMs peel; so does a row of more vectors than a group holds.
  ASSERT_GT(limits.sm_count, 37);
  EXPECT_EQ(choose_plan(merged_parts(DType::bf16, limits.sm_count, 1537, 2), {}).row_head, RowHead::peel);
  EXPECT_EQ(choose_plan(merged_parts(DType::bf16, limits.sm_count - 1, 1537, 2), {}).row_head, RowHead::as_is);
  const int64_t over_a_group = 8 * int64_t(limits.max_threads_per_group) + 1;
  EXPECT_EQ(choose_plan(merged_parts(DType::bf16, 37, over_a_group, 2), {}).row_head, RowHead::peel);
  EXPECT_EQ(choose_plan(merged_parts(DType::bf16, 37, over_a_group - 2, 2), {}).row_head, RowHead::as_is);
  // A request for the peel keeps it.
  PlanRequest peel;
  peel.row_head = RowHead::peel;
  const MappingPlan asked = choose_plan(merged_parts(DType::bf16, 37, 1537, 2), peel);
  EXPECT_EQ(asked.row_head, RowHead::peel);
  EXPECT_EQ(asked.vector_elems, 8);
}

TEST(Policy, RereadingLayerNormsSixteenBitRowsUnrollsTwo) {
  MappingPlan p = choose_plan(merged_parts(DType::bf16, 256, 131072, 5), {});
  EXPECT_EQ(p.caching, InputCaching::reread);
  EXPECT_EQ(p.stripe_unroll, 2);
  EXPECT_EQ(p.workers_per_program, 1024);
  EXPECT_EQ(choose_plan(merged_parts(DType::bf16, 256, 131072, 3), {}).stripe_unroll, 4);
  EXPECT_EQ(choose_plan(merged_parts(DType::f32, 256, 131072, 5), {}).stripe_unroll, 4);
  // At x 32768 it keeps the width of unrolling 4: 512 workers of eight stripes, two groups an SM.
  p = choose_plan(merged_parts(DType::bf16, 1024, 32768, 5), {});
  EXPECT_EQ(p.caching, InputCaching::reread);
  EXPECT_EQ(p.workers_per_program, 512);
  EXPECT_EQ(p.stripes, 8);
  EXPECT_EQ(p.stripe_unroll, 2);
  EXPECT_EQ(p.resident_groups, 2);
  EXPECT_EQ(choose_plan(merged_parts(DType::bf16, 512, 65536, 5), {}).workers_per_program, 1024);
  // Softmax's and RMSNorm's merges unroll 4 at the same width.
  EXPECT_EQ(choose_plan(merged_parts(DType::bf16, 1024, 32768, 3), {}).workers_per_program, 512);
}

TEST(Policy, VectorWidthFollowsRowAlignment) {
  EXPECT_EQ(choose_plan(inputs(37, 1537), {}).vector_elems, 1);
  EXPECT_EQ(choose_plan(inputs(37, 1538), {}).vector_elems, 2);
  PlanInputs in = inputs(37, 1024);
  in.base_alignment = 4;  // a pointer offset by one fp32 element
  EXPECT_EQ(choose_plan(in, {}).vector_elems, 1);
}

// A target with 8-byte accesses (TargetCaps::vector_bytes, folded into the limits): the policy
// picks at most 8 bytes and validation refuses wider, naming the target's bound.
TEST(Policy, VectorWidthStaysWithinTheTargetsAccess) {
  DeviceLimits narrow;
  narrow.max_vector_bytes = 8;
  EXPECT_EQ(choose_plan(inputs(37, 1024), {}, narrow).vector_elems, 2);
  EXPECT_EQ(choose_plan(inputs(37, 1024, DType::bf16), {}, narrow).vector_elems, 4);
  EXPECT_EQ(choose_plan(inputs(37, 1024), {}).vector_elems, 4);  // 16 bytes by default
  PlanRequest wide;
  wide.vector_elems = 4;
  const PlanInputs in = inputs(37, 1024);
  EXPECT_NO_THROW(validate_plan(choose_plan(in, wide), in, {}, "softmax"));
  try {
    validate_plan(choose_plan(in, wide, narrow), in, narrow, "softmax");
    ADD_FAILURE() << "a 16-byte access passed an 8-byte target";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("plan.vector_elems': expected an access of at most 8 bytes"), std::string::npos)
        << e.what();
  }
  for (const MappingPlan& p : mapping_family(in, narrow)) EXPECT_LE(p.vector_elems * 4, 8) << p.to_json();
}

// Float64 rows: two 8-byte elements fill a 16-byte access, and a cached element costs two
// 32-bit registers of the private budget.
TEST(Policy, Float64RowsTakeTwoElementVectorsAndTwoScalarsACachedElement) {
  PlanInputs in = inputs(37, 1024, DType::f64);
  EXPECT_EQ(in.real_bytes, 8);
  MappingPlan p = choose_plan(in, {});
  EXPECT_EQ(p.vector_elems, 2);
  EXPECT_LE(int64_t(p.stripes) * p.vector_elems * 2, p.private_budget);
  PlanRequest wide;
  wide.vector_elems = 4;
  EXPECT_THROW(validate_plan(choose_plan(in, wide), in, {}, "softmax"), Error);
  PlanRequest cached;
  cached.caching = InputCaching::registers, cached.workers_per_program = 32, cached.vector_elems = 2;
  cached.stripes = 16;  // 32 elements a worker: 64 scalars in f64, 32 in f32
  in = inputs(1, 1024, DType::f64);
  EXPECT_NO_THROW(validate_plan(choose_plan(in, cached), in, {}, "softmax"));
  cached.stripes = 17, cached.private_budget = 64;
  in.cols = 1088;
  try {
    validate_plan(choose_plan(in, cached), in, {}, "softmax");
    ADD_FAILURE() << "68 scalars passed a budget of 64";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("two scalars each in f64) = 68 scalars per worker"), std::string::npos) << e.what();
  }
}

TEST(Policy, RequestedFieldsAreKeptExactly) {
  PlanRequest r;
  r.programs_per_group = 2, r.workers_per_program = 256, r.vector_elems = 4;
  MappingPlan p = choose_plan(inputs(37, 1537), r);
  EXPECT_EQ(p.programs_per_group, 2);
  EXPECT_EQ(p.workers_per_program, 256);
  EXPECT_EQ(p.width_mode, WidthMode::exact);
  EXPECT_EQ(p.vector_elems, 4);
  EXPECT_EQ(p.stripes, 2);
  EXPECT_NO_THROW(validate_plan(p, inputs(37, 1537), {}, "softmax"));
}

TEST(Policy, EveryPolicyPlanValidatesAcrossShapes) {
  for (DType dt : {DType::f32, DType::bf16})
    for (int64_t cols : {1, 2, 3, 17, 31, 33, 100, 255, 1023, 1537, 4097, 8192, 32768, 65537, 131072, 262144})
      for (int64_t rows : {0, 1, 37, 4096, 1000000}) {
        PlanInputs in = inputs(rows, cols, dt);
        EXPECT_NO_THROW(validate_plan(choose_plan(in, {}), in, {}, "softmax")) << rows << "x" << cols;
      }
}

TEST(Policy, MappingFamilyHoldsValidPlansAndThePolicysOwn) {
  for (auto [rows, cols, dt] : {std::tuple<int64_t, int64_t, DType>{37, 1537, DType::f32}, {1024, 4096, DType::bf16},
                                {4096, 32768, DType::f32}, {100000, 64, DType::f32}}) {
    PlanInputs in = inputs(rows, cols, dt);
    std::vector<MappingPlan> family = mapping_family(in);
    EXPECT_GT(family.size(), 10u) << rows << "x" << cols;
    EXPECT_EQ(family.front(), choose_plan(in, {}));
    for (const MappingPlan& p : family) EXPECT_NO_THROW(validate_plan(p, in, {}, "tune")) << p.to_json();
  }
}

// Rows of odd stride get one-element vectors from the policy; the family also times the wider
// vectors that a peeled head keeps aligned, and never a vector the strides break without a peel.
TEST(Policy, MappingFamilyPeelsOddRowsForWiderVectors) {
  const PlanInputs in = merged_parts(DType::bf16, 16384, 1023, 5);  // LayerNorm's parts: no peel unasked
  EXPECT_EQ(choose_plan(in, {}).vector_elems, 1);
  int peeled_wide = 0;
  for (const MappingPlan& p : mapping_family(in)) {
    if (p.vector_elems > 1) {
      EXPECT_EQ(p.row_head, RowHead::peel) << p.to_json();
    }
    if (p.vector_elems == 8 && p.row_head == RowHead::peel) ++peeled_wide;
  }
  EXPECT_GT(peeled_wide, 0);
}

// A plan whose row spans a cluster: refused on a target without clusters, and unless each group
// is one program of whole warps; errors name the field.
TEST(Policy, ClusterPlansAreValidatedFieldByField) {
  const PlanInputs in = inputs(8, 65536);
  DeviceLimits clusters;
  clusters.max_cluster_size = 16;
  PlanRequest r;
  r.ctas_per_program = 4, r.workers_per_program = 512, r.vector_elems = 4, r.caching = InputCaching::registers;
  r.programs_per_group = 1;
  const MappingPlan p = choose_plan(in, r, clusters);
  EXPECT_EQ(p.stripes, 8);  // 65536 / (4 x 512 x 4)
  EXPECT_NO_THROW(validate_plan(p, in, clusters, "softmax"));
  EXPECT_NE(error(p, {}, in).find("'plan.ctas_per_program': expected at most 1 groups a cluster on this target (it launches no clusters), got 4"),
            std::string::npos)
      << error(p, {}, in);
  MappingPlan q = p;
  q.programs_per_group = 2, q.workers_per_program = 256;
  EXPECT_NE(error(q, clusters, in).find("plan.programs_per_group': expected 1 when ctas_per_program > 1"), std::string::npos);
  // A re-read row on a cluster: each group reads its slice once a pass (the passes shared out
  // as stripes are).
  q = p, q.caching = InputCaching::reread, q.merge = MergeStrategy::combine;
  EXPECT_EQ(error(q, clusters, in), "");
  q = p, q.stripes = 7;
  EXPECT_NE(error(q, clusters, in).find("stripes x ctas_per_program x workers_per_program x vector_elems >= cols = 65536"),
            std::string::npos)
      << error(q, clusters, in);
  q = p, q.ctas_per_program = 17;
  EXPECT_NE(error(q, clusters, in).find("plan.ctas_per_program': expected 1 to 16, got 17"), std::string::npos);
  PlanInputs rows_in = in;
  rows_in.reduces_rows = true;
  // A cluster may loop over row blocks, and so reduce over the rows; not re-reading.
  q = p, q.grid_limit = 4;
  EXPECT_EQ(error(q, clusters, rows_in), "");
  EXPECT_EQ(error(q, clusters, in), "");
  // One row block a cluster (grid_limit 0) may reduce row values over the rows (a workspace slot
  // a row block), not per-column accumulators (whose slots the grid bounds).
  q = p, q.grid_limit = 0;
  EXPECT_EQ(error(q, clusters, rows_in), "");
  rows_in.rows_reduction_parts = 1;
  EXPECT_NE(error(q, clusters, rows_in)
                .find("plan.grid_limit': expected at least 1 for a program with per-column accumulators over the rows"),
            std::string::npos)
      << error(q, clusters, rows_in);
}

// Long rows cached in registers on a target with clusters: the smallest power-of-two cluster
// whose 256-worker groups cache at most 64 scalars a worker (512 or 1024 workers of 32 where 16
// groups of 256 cannot, when the request asks for caching), so the row is read once; re-read
// where 16 groups cannot hold it and on targets without clusters. Unasked, a program whose
// merges take two slots (softmax's) goes to the same cluster; one of three (RMSNorm's) re-reads.
// A program of two row inputs goes to a cluster either way: at most four vectors of each input
// a worker, on 256 or 512 workers, where its merges take one exchange (softmax_backward's), else
// the smallest cluster of 256 caching 64 scalars (fused_add_rms_norm's).
TEST(Policy, StagedRowsSplitOverClustersOfAtMost64KiBAGroup) {
  DeviceLimits clusters;
  clusters.max_cluster_size = 16;
  PlanRequest r;
  r.caching = InputCaching::shared;
  // f32 x 262144 = 1 MiB a row: 16 groups of 256 staging 64 KiB each; three fit an SM.
  MappingPlan p = choose_plan(inputs(512, 262144), r, clusters);
  EXPECT_EQ(p.ctas_per_program, 16);
  EXPECT_EQ(p.workers_per_program, 256);
  EXPECT_EQ(int64_t(p.stripes) * p.vector_elems * p.workers_per_program, 16384);
  EXPECT_EQ(p.caching, InputCaching::shared);
  EXPECT_EQ(p.grid_limit, 0);
  EXPECT_EQ(p.resident_groups, 3);
  EXPECT_NO_THROW(validate_plan(p, inputs(512, 262144), clusters, "softmax"));
  // bf16 x 65536 = 128 KiB a row: two groups. A row of 64 KiB or less: one group.
  EXPECT_EQ(choose_plan(inputs(512, 65536, DType::bf16), r, clusters).ctas_per_program, 2);
  EXPECT_EQ(choose_plan(inputs(512, 16384), r, clusters).ctas_per_program, 1);
  // Without clusters the group stages the whole row where it fits.
  EXPECT_EQ(choose_plan(inputs(512, 32768), r).ctas_per_program, 1);
}

// The norms' long rows (one row input, a per-column weight, more than two merged parts, 65536
// elements or more; 16-bit LayerNorm's five parts from 131072) are staged unasked over the
// smallest cluster of groups staging at most 64 KiB; shorter rows, softmax's two parts, programs
// without a per-column input (cross-entropy), rows 16 such groups cannot hold, unaligned rows,
// targets without clusters and requests for any of the mapping keep the rules they had.
TEST(Policy, NormRowsOf65536ElementsOrMoreAreStagedOverACluster) {
  DeviceLimits clusters;
  clusters.max_cluster_size = 16;
  // A norm's inputs: one row input, a per-column weight, `parts` merged parts.
  auto norm = [](DType dt, int64_t rows, int64_t cols, int parts) {
    PlanInputs in = merged_parts(dt, rows, cols, parts);
    in.column_dtypes = {dt};
    return in;
  };
  struct Want {
    int64_t cols;
    DType dt;
    int ctas;
  };
  for (int parts : {3, 5})
    for (Want w : {Want{65536, DType::f32, 4}, {131072, DType::f32, 8}, {262144, DType::f32, 16},
                   {65536, DType::bf16, 2}, {131072, DType::bf16, 4}, {262144, DType::bf16, 8},
                   {524288, DType::bf16, 16}})
      for (int64_t rows : {1, 37, 4096}) {
        if (parts == 5 && w.dt == DType::bf16 && w.cols < 131072) continue;
        const PlanInputs in = norm(w.dt, rows, w.cols, parts);
        const MappingPlan p = choose_plan(in, {}, clusters);
        SCOPED_TRACE(std::to_string(parts) + " parts, " + std::to_string(rows) + " x " + std::to_string(w.cols) +
                     " " + std::string(dtype_name(w.dt)) + ": " + p.to_json());
        EXPECT_EQ(p.caching, InputCaching::shared);
        EXPECT_EQ(p.ctas_per_program, w.ctas);
        EXPECT_EQ(p.workers_per_program, 256);
        EXPECT_EQ(p.grid_limit, 0);
        EXPECT_NO_THROW(validate_plan(p, in, clusters, parts == 5 ? "layer_norm" : "rms_norm"));
      }
  auto caching = [&](const PlanInputs& in, const PlanRequest& r, const DeviceLimits& limits) {
    return choose_plan(in, r, limits).caching;
  };
  for (DType dt : {DType::f32, DType::bf16}) {
    // One element short of the bound, and softmax's two parts (a register-cached cluster).
    EXPECT_NE(caching(norm(dt, 4096, 65535, 3), {}, clusters), InputCaching::shared);
    EXPECT_EQ(caching(norm(dt, 4096, 32768, 3), {}, clusters), InputCaching::reread);
    EXPECT_EQ(caching(norm(dt, 4096, 131072, 2), {}, clusters), InputCaching::registers);
    // No per-column input (RMSNorm without a weight; cross-entropy's three parts): re-read.
    EXPECT_EQ(caching(merged_parts(dt, 4096, 131072, 3), {}, clusters), InputCaching::reread);
    // Without clusters: re-read.
    EXPECT_EQ(caching(norm(dt, 4096, 131072, 3), {}, {}), InputCaching::reread);
    // A row of 2 MiB or more: more than 16 groups of 64 KiB.
    EXPECT_NE(caching(norm(dt, 64, dt == DType::f32 ? 524288 : 1048576, 3), {}, clusters),
              InputCaching::shared);
  }
  // 16-bit LayerNorm below 131072 elements: its re-read beat staging at 65536.
  EXPECT_EQ(caching(norm(DType::bf16, 2048, 65536, 5), {}, clusters), InputCaching::reread);
  EXPECT_EQ(caching(norm(DType::bf16, 2048, 131064, 5), {}, clusters), InputCaching::reread);
  EXPECT_EQ(caching(norm(DType::f32, 2048, 65536, 5), {}, clusters), InputCaching::shared);
  // Rows whose stride breaks 16-byte alignment, and a program reducing over the rows.
  PlanInputs odd = norm(DType::bf16, 4096, 131072, 3);
  for (RowOperandInfo& r : odd.row_operands) r.stride = 131073;
  EXPECT_NE(caching(odd, {}, clusters), InputCaching::shared);
  PlanInputs rows_in = norm(DType::bf16, 4096, 131072, 3);
  rows_in.reduces_rows = true, rows_in.rows_reduction_parts = 1;
  EXPECT_NE(caching(rows_in, {}, clusters), InputCaching::shared);
  // Any request for the mapping keeps the rule off; other fields keep it on.
  const PlanInputs in = norm(DType::bf16, 4096, 131072, 3);
  PlanRequest reread;
  reread.caching = InputCaching::reread;
  EXPECT_EQ(caching(in, reread, clusters), InputCaching::reread);
  PlanRequest workers;
  workers.workers_per_program = 1024;
  EXPECT_NE(caching(in, workers, clusters), InputCaching::shared);
  PlanRequest budget;
  budget.private_budget = 32;
  EXPECT_EQ(caching(in, budget, clusters), InputCaching::shared);
}

TEST(Policy, StagedPlansAreValidatedFieldByField) {
  const PlanInputs in = inputs(8, 65536);
  DeviceLimits clusters;
  clusters.max_cluster_size = 16;
  PlanRequest r;
  r.caching = InputCaching::shared;
  const MappingPlan p = choose_plan(in, r, clusters);
  ASSERT_EQ(p.ctas_per_program, 4);
  EXPECT_EQ(error(p, clusters, in), "");
  // One group a row (a cluster plan refuses a grid limit on its own account).
  const PlanInputs short_rows = inputs(8, 4096);
  MappingPlan q = choose_plan(short_rows, r, clusters);
  ASSERT_EQ(q.ctas_per_program, 1);
  q.grid_limit = 4;
  EXPECT_NE(error(q, clusters, short_rows)
                .find("'plan.caching': expected \"shared\" only with grid_limit 0 (one row block a group), "
                      "row_head \"as_is\", tail \"predicate\" and cache_format \"f32\", got grid_limit 4"),
            std::string::npos)
      << error(q, clusters, short_rows);
  // A weight gradient's per-column accumulators: the refusal names caching, not the grid limit
  // the policy chose for them, and names it with grid_limit 0 asked too.
  const PlanInputs rows_in = two_inputs(64, 4096, 1);
  q = choose_plan(rows_in, r, clusters);
  EXPECT_NE(error(q, clusters, rows_in)
                .find("'plan.caching': expected \"registers\" or \"reread\" for a program with per-column "
                      "accumulators over the rows"),
            std::string::npos)
      << error(q, clusters, rows_in);
  EXPECT_EQ(error(q, clusters, rows_in).find("grid_limit"), std::string::npos) << error(q, clusters, rows_in);
  q.grid_limit = 0;
  EXPECT_NE(error(q, clusters, rows_in).find("per-column accumulators over the rows"), std::string::npos)
      << error(q, clusters, rows_in);
  q = choose_plan(short_rows, r, clusters), q.tail = TailHandling::clamp;
  EXPECT_NE(error(q, clusters, short_rows).find("tail \"clamp\""), std::string::npos) << error(q, clusters, short_rows);
  // The whole row on one group: 256 KiB, more than a group's shared memory.
  q = p, q.ctas_per_program = 1, q.stripes *= 4;
  EXPECT_NE(
      error(q, clusters, in).find("'plan.caching': expected \"shared\" within 232448 bytes of shared memory a group"),
      std::string::npos)
      << error(q, clusters, in);
  EXPECT_NE(error(q, clusters, in).find("= 262144 bytes staged"), std::string::npos) << error(q, clusters, in);
  // One worker a row, 1024 stripes: the unrolled kernel would be huge.
  q = choose_plan(short_rows, r, clusters), q.workers_per_program = 1, q.programs_per_group = 32, q.stripes = 1024;
  EXPECT_NE(error(q, clusters, short_rows)
                .find("'plan.caching': expected \"shared\" with at most 256 staged elements a worker (stripes x "
                      "vector_elems; the stripes are unrolled): more workers or groups, got stripes x vector_elems = "
                      "1024 x 4 = 4096"),
            std::string::npos)
      << error(q, clusters, short_rows);
  DeviceLimits small = clusters;
  small.max_staged_bytes = 32 * 1024;
  EXPECT_NE(error(p, small, in).find("within 32768 bytes"), std::string::npos) << error(p, small, in);
}

TEST(Policy, LongRowsSplitOverTheSmallestClusterThatCachesThem) {
  DeviceLimits clusters;
  clusters.max_cluster_size = 16;
  PlanRequest cached;
  cached.caching = InputCaching::registers;
  struct Want {
    int64_t cols;
    DType dt;
    int ctas, workers;
    int two_inputs_combined_ctas, two_inputs_combined_workers, two_inputs_staged_ctas;
  };
  for (Want w : {Want{16384, DType::f32, 2, 256, 4, 256, 2},
                 {32768, DType::f32, 2, 256, 8, 256, 4},
                 {65536, DType::f32, 4, 256, 16, 256, 8},
                 {131072, DType::f32, 8, 256, 16, 512, 16},
                 {262144, DType::f32, 16, 256, 1, 0, 1},
                 {524288, DType::f32, 16, 1024, 1, 0, 1},
                 {32768, DType::bf16, 2, 256, 4, 256, 4},
                 {65536, DType::bf16, 4, 256, 8, 256, 8},
                 {262144, DType::bf16, 16, 256, 1, 0, 1},
                 {524288, DType::bf16, 16, 1024, 1, 0, 1}}) {
    const PlanInputs in = inputs(4096, w.cols, w.dt);
    // Unasked, three merged parts and no per-column input (RMSNorm without a weight,
    // cross-entropy's shape): re-read. With a weight: staged from 65536 elements to 1 MiB a row.
    EXPECT_EQ(choose_plan(in, {}, clusters).caching, InputCaching::reread);
    PlanInputs weighted = in;
    weighted.column_dtypes = {w.dt};
    const MappingPlan unasked = choose_plan(weighted, {}, clusters);
    const bool staged_rows = w.cols >= 65536 && w.cols * int64_t(dtype_size(w.dt)) <= 1024 * 1024;
    EXPECT_EQ(unasked.caching, staged_rows ? InputCaching::shared : InputCaching::reread) << unasked.to_json();
    PlanInputs two = in;
    two.merge_parts = 2;
    EXPECT_EQ(choose_plan(two, {}, clusters).ctas_per_program, w.workers == 256 ? w.ctas : 1);
    // One exchange of combined states where the merges take two slots (also when re-read, as
    // every re-read plan); on a cluster, a stage each otherwise.
    EXPECT_EQ(choose_plan(two, {}, clusters).merge, MergeStrategy::combine);
    EXPECT_EQ(choose_plan(two, cached, clusters).merge, MergeStrategy::combine);
    EXPECT_EQ(choose_plan(in, cached, clusters).merge, MergeStrategy::staged);
    two.row_operands.insert(two.row_operands.begin(), two.row_operands.front());  // a second row input
    const MappingPlan combined = choose_plan(two, {}, clusters);
    EXPECT_EQ(combined.ctas_per_program, w.two_inputs_combined_ctas) << combined.to_json();
    if (w.two_inputs_combined_workers) {
      EXPECT_EQ(combined.workers_per_program, w.two_inputs_combined_workers) << combined.to_json();
      EXPECT_LE(combined.stripes, 4) << combined.to_json();
      EXPECT_EQ(combined.merge, MergeStrategy::combine);
      EXPECT_NO_THROW(validate_plan(combined, two, clusters, "softmax_backward"));
    }
    PlanInputs staged = in;
    staged.row_operands.insert(staged.row_operands.begin(), staged.row_operands.front());
    const MappingPlan s = choose_plan(staged, {}, clusters);
    EXPECT_EQ(s.ctas_per_program, w.two_inputs_staged_ctas) << s.to_json();
    if (w.two_inputs_staged_ctas > 1) {
      EXPECT_EQ(s.workers_per_program, 256) << s.to_json();
      EXPECT_EQ(s.merge, MergeStrategy::staged);
      EXPECT_NO_THROW(validate_plan(s, staged, clusters, "fused_add_rms_norm"));
    }
    const MappingPlan p = choose_plan(in, cached, clusters);
    SCOPED_TRACE(std::to_string(w.cols) + " " + std::string(dtype_name(w.dt)) + ": " + p.to_json());
    EXPECT_EQ(p.ctas_per_program, w.ctas);
    EXPECT_EQ(p.workers_per_program, w.workers);
    EXPECT_EQ(p.caching, InputCaching::registers);
    EXPECT_EQ(p.programs_per_group, 1);
    EXPECT_LE(int64_t(p.stripes) * p.vector_elems, w.workers == 256 ? 64 : 32);
    EXPECT_GE(int64_t(p.stripes) * p.vector_elems * p.ctas_per_program * p.workers_per_program, w.cols);
    EXPECT_NO_THROW(validate_plan(p, in, clusters, "softmax"));
    // Without clusters the row is re-read.
    const MappingPlan q = choose_plan(in, {}, {});
    EXPECT_EQ(q.ctas_per_program, 1);
    EXPECT_EQ(q.caching, InputCaching::reread);
  }
  // Rows a cluster of 16 cannot cache, rows that fit one group.
  EXPECT_EQ(choose_plan(inputs(64, 1048576, DType::bf16), cached, clusters).ctas_per_program, 1);
  EXPECT_EQ(choose_plan(inputs(64, 4096), cached, clusters).ctas_per_program, 1);
  // Row values reduced over the rows (cross-entropy's summed losses) leave the mapping as it is,
  // one row block a cluster, a workspace slot each; per-column accumulators loop over row blocks.
  PlanInputs rows_in = inputs(64, 262144);
  rows_in.reduces_rows = true;
  const MappingPlan row_values = choose_plan(rows_in, cached, clusters);
  EXPECT_EQ(row_values.to_json(), choose_plan(inputs(64, 262144), cached, clusters).to_json());
  EXPECT_EQ(row_values.ctas_per_program, 16);
  EXPECT_EQ(row_values.grid_limit, 0);
  rows_in.rows_reduction_parts = 1;
  EXPECT_GT(choose_plan(rows_in, cached, clusters).grid_limit, 0);
  // A smaller cluster limit: the largest cluster allowed, else re-read.
  DeviceLimits eight = clusters;
  eight.max_cluster_size = 8;
  EXPECT_EQ(choose_plan(inputs(64, 262144), cached, eight).ctas_per_program, 8);
  EXPECT_EQ(choose_plan(inputs(64, 262144), cached, eight).workers_per_program, 1024);
  // A requested cluster keeps the rest automatic: one program, cached, stripes over C x W.
  PlanRequest r;
  r.ctas_per_program = 4;
  const MappingPlan p = choose_plan(inputs(64, 65536), r, clusters);
  EXPECT_EQ(p.ctas_per_program, 4);
  EXPECT_EQ(p.caching, InputCaching::registers);
  EXPECT_NO_THROW(validate_plan(p, inputs(64, 65536), clusters, "softmax"));
}

TEST(Policy, EveryPolicyPlanValidatesOnATargetWithClusters) {
  DeviceLimits clusters;
  clusters.max_cluster_size = 16;
  for (DType dt : {DType::f32, DType::bf16})
    for (int64_t cols : {1, 33, 1537, 8192, 32768, 65537, 131072, 200000, 262144, 1048576})
      for (int64_t rows : {0, 1, 37, 4096}) {
        PlanInputs in = inputs(rows, cols, dt);
        EXPECT_NO_THROW(validate_plan(choose_plan(in, {}, clusters), in, clusters, "softmax")) << rows << "x" << cols;
      }
  const PlanInputs in = inputs(64, 131072);
  int cluster_plans = 0;
  for (const MappingPlan& p : mapping_family(in, clusters)) {
    EXPECT_NO_THROW(validate_plan(p, in, clusters, "tune")) << p.to_json();
    cluster_plans += p.ctas_per_program > 1;
  }
  EXPECT_GE(cluster_plans, 12);
  for (const MappingPlan& p : mapping_family(in)) EXPECT_EQ(p.ctas_per_program, 1);
  // A program reducing over the rows, and every policy plan of such programs: its family holds
  // clusters looping over row blocks, at one and two resident groups, prefetching or not.
  for (int64_t cols : {4096, 16384, 32768, 131072, 262144, 65537})
    for (int accumulators : {1, 2}) {
      PlanInputs rows_in = two_inputs(1024, cols, accumulators);
      EXPECT_NO_THROW(validate_plan(choose_plan(rows_in, {}, clusters), rows_in, clusters, "rms_norm_backward"))
          << cols;
    }
  const PlanInputs rows_in = two_inputs(1024, 32768, 1);
  std::set<std::pair<int, RowPrefetch>> looping;
  for (const MappingPlan& p : mapping_family(rows_in, clusters)) {
    EXPECT_NO_THROW(validate_plan(p, rows_in, clusters, "tune")) << p.to_json();
    if (p.ctas_per_program > 1) {
      EXPECT_GT(p.grid_limit, 0) << p.to_json();
      looping.insert({p.resident_groups, p.row_prefetch});
    }
  }
  EXPECT_EQ(looping.size(), 4u);
}

}  // namespace
}  // namespace tile
