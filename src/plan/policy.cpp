// The analytic policy. Every choice is a closed form of the call's shape and the device
// limits; nothing is timed. The reasoning behind each constant is in
// docs/source/internals/tile/policy.md.
#include "tile/policy.hpp"

#include <algorithm>
#include <string>

#include "tile/error.hpp"

namespace tile {

namespace {

// Stripes a multi-warp program aims for: enough independent 16-byte loads in flight per
// worker to cover memory latency, few enough that the cached row fits the private budget.
constexpr int64_t kTargetStripes = 4;
// Columns a worker of a program reducing over the rows starts from (see rows_cache_width).
constexpr int64_t kRowsReducingElems = 8;
// Widest automatic program: __launch_bounds__(1024) leaves 64 registers a thread, too few for a
// cached row slice plus its index math (ptxas spills); 512 threads leave 128.
constexpr int kMaxAutomaticWidth = 512;
// Longest input row (bytes) cached in registers. Longer rows are re-read: a cached slice of
// more than about 32 scalars a worker costs occupancy, and a re-read of a row read moments
// earlier mostly hits L2 (H200 measurements: docs/source/internals/tile/policy.md).
constexpr int64_t kRegisterRowBytes = 32 * 1024;
// Input bytes one iteration of a re-read loop covers across the program: half the row, at most
// 64 KiB, in 4 vectors a worker.
constexpr int64_t kRereadIterationBytes = 64 * 1024;
constexpr int kRereadUnroll = 4;
// A cluster program's groups: 256 workers caching up to the 64-scalar private budget each
// (about 124 registers, two groups an SM), so each group keeps 64 KiB of f32 loads in flight.
// H200, kernels timed alone (evidence/cubin-time-h200-clusters-exchange.log): f32 softmax
// 256 x 262144 on 16 groups of 256 took 145 us, of 512 (32 scalars) 187 (before the relaxed
// arrive), of 1024 309.
constexpr int kClusterWidth = 256;
// caching "shared" asked for without a mapping: groups of up to 256 workers staging at most
// 64 KiB of row input each (three such groups fit an H200 SM's 227 KiB), on the smallest
// power-of-two cluster that holds the row that way.
constexpr int kStagedWidth = 256;
constexpr int64_t kStagedGroupBytes = 64 * 1024;
// Shortest row of the norms that the policy stages unasked (the rule and its measurements are in
// choose_plan).
constexpr int64_t kStagedNormCols = 65536;
// Elements a worker of a staged plan holds at most (its unrolled stripes x vector_elems): a bf16
// row of 1,048,576 on 16 groups of 256 takes 256.
constexpr int64_t kMaxStagedElems = 256;
constexpr int64_t kClusterSliceScalars = 64;
// Where 16 such groups cannot hold a row, a request for register caching widens them to 512,
// then 1024 workers of at most 32 scalars (index math needs the rest of their registers).
constexpr int64_t kWideClusterSliceScalars = 32;
constexpr int64_t kClusterCombinedStripes = 4;
// Longest row of all row inputs together that a program reducing over the rows caches where
// its slice and accumulators take more than kWideClusterSliceScalars scalars a worker.
constexpr int64_t kRowsReducingCachedBytes = 64 * 1024;
// Program slots an SM of the partials of a register-cached program reducing over the rows: its
// workspace holds at most kMaxPartialSlotsPerSm x SMs x cols x parts floats.
constexpr int64_t kMaxPartialSlotsPerSm = 8;
// Most workspace slots of row values reduced over the rows before their row blocks loop.
constexpr int64_t kMaxRowValueSlots = 65536;
// Programs reducing over the rows split rows longer than this over a cluster of groups of
// kRowsClusterWidth workers, or half that (the rule and its measurements are in choose_plan).
constexpr int64_t kRowsClusterCols = 8192;
constexpr int kRowsClusterWidth = 512;
// Threads a group of packed short-row programs aims for.
constexpr int kTargetGroupThreads = 256;
// Groups per SM below which packing more rows per group would leave SMs idle.
constexpr int64_t kGroupsPerSm = 2;

// Registers a cached column position costs a worker: one per row input, plus accumulators of
// reductions over the rows, plus the per-column inputs held across rows (column_loads "once");
// two each in f64 (the budget counts 32-bit registers).
int64_t cached_scalars_per_column(const PlanInputs& in, ColumnLoads loads) {
  const int64_t held = loads == ColumnLoads::once ? int64_t(in.column_dtypes.size()) : 0;
  return (in.row_inputs() + in.rows_reduction_parts + held) * (in.real_bytes / 4);
}

// Scalars a worker holds for row_prefetch "next", counted as the register cache counts them (an
// element each, two in f64): every row input's vectors of the next row block.
int64_t prefetch_scalars(const PlanInputs& in, int stripes, int vector_elems) {
  return int64_t(stripes) * vector_elems * in.row_inputs() * (in.real_bytes / 4);
}

// A worker's cached slice of `stripes` vectors (per_elem scalars a column: row inputs and
// accumulators) and the next row block's vectors that row_prefetch "next" adds.
int64_t prefetching_scalars(const PlanInputs& in, int stripes, int vector_elems, int64_t per_elem) {
  return int64_t(stripes) * vector_elems * per_elem + prefetch_scalars(in, stripes, vector_elems);
}

// Whether the program reads row inputs and every one is 16-bit.
bool row_inputs_16bit(const PlanInputs& in) {
  bool all = in.row_inputs() > 0;
  for (const RowOperandInfo& r : in.row_operands)
    if (r.input) all &= dtype_size(r.dtype) == 2;
  return all;
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Bytes of one element of every row input together.
int64_t row_input_bytes(const PlanInputs& in) {
  int64_t b = 0;
  for (const RowOperandInfo& r : in.row_operands) b += r.input ? dtype_size(r.dtype) : 0;
  return b;
}

// caching "shared": each row input's slice of a group (every worker's stripes of vectors, for
// each program), in its own 16-byte-aligned staged region, as the lowering lays them out.
int64_t staged_bytes(const PlanInputs& in, const MappingPlan& p) {
  int64_t bytes = 0;
  const int64_t elems = int64_t(p.stripes) * p.workers_per_program * p.vector_elems * p.programs_per_group;
  for (const RowOperandInfo& r : in.row_operands)
    if (r.input) bytes += ceil_div(elems * dtype_size(r.dtype), 16) * 16;
  return bytes;
}

// Static shared memory of the merges: one slot per warp and part; a cluster's exchange, one per
// warp of every group and part.
int64_t merge_shared_bytes(const PlanInputs& in, const MappingPlan& p) {
  const int C = p.ctas_per_program, P = p.programs_per_group, W = p.workers_per_program;
  return int64_t(std::max(1, in.merge_parts)) * (C > 1 ? C : P) * std::max(1, W / 32) * in.real_bytes;
}
int64_t round_up(int64_t a, int64_t b) { return ceil_div(a, b) * b; }
int pow2_at_least(int64_t v) {
  int p = 1;
  while (p < v) p *= 2;
  return p;
}
std::string strides(const PlanInputs& in) {
  std::string s;
  for (const RowOperandInfo& r : in.row_operands) s += (s.empty() ? "" : ", ") + std::to_string(r.stride);
  return s;
}
bool valid_width(int w) { return (w >= 1 && w <= 16 && (w & (w - 1)) == 0) || (w >= 32 && w <= 1024 && w % 32 == 0); }

}  // namespace

PlanInputs PlanInputs::for_rows(DType x, DType y, int64_t rows, int64_t cols, int64_t x_stride, int64_t y_stride,
                                std::optional<DType> columns) {
  PlanInputs in;
  in.rows = rows, in.cols = cols;
  in.row_operands = {{x, x_stride ? x_stride : cols, true}, {y, y_stride ? y_stride : cols, false}};
  if (columns) in.column_dtypes = {*columns};
  in.real_bytes = x == DType::f64 ? 8 : 4;  // a float64 call computes in f64
  return in;
}

int PlanInputs::row_inputs() const {
  int n = 0;
  for (const RowOperandInfo& r : row_operands) n += r.input;
  return n;
}

int64_t PlanInputs::input_bytes_per_col() const {
  int64_t b = 0;
  for (const RowOperandInfo& r : row_operands) b += r.input ? dtype_size(r.dtype) : 0;
  return std::max<int64_t>(b, 1);
}

int PlanInputs::widest_elem_bytes() const {
  int b = 1;
  for (const RowOperandInfo& r : row_operands) b = std::max(b, dtype_size(r.dtype));
  for (DType t : column_dtypes) b = std::max(b, dtype_size(t));
  return b;
}

bool whole_vectors(const PlanInputs& in, int v) { return rows_aligned(in, v) && in.cols % v == 0; }

namespace {
// Every operand's base address aligned to v elements of its dtype (whatever its row stride).
bool bases_aligned(const PlanInputs& in, int v) {
  auto ok = [&](DType t) { return in.base_alignment % (int64_t(v) * dtype_size(t)) == 0; };
  for (const RowOperandInfo& r : in.row_operands)
    if (!ok(r.dtype)) return false;
  for (DType t : in.column_dtypes)
    if (!ok(t)) return false;
  return true;
}
}  // namespace

bool rows_aligned(const PlanInputs& in, int v) {
  if (!bases_aligned(in, v)) return false;
  for (const RowOperandInfo& r : in.row_operands)
    if (r.stride % v != 0) return false;
  return true;
}

MappingPlan choose_plan(const PlanInputs& in, const PlanRequest& req, const DeviceLimits& limits) {
  // The range a plan's JSON accepts (PlanRequest::from_json), checked before the policy divides.
  for (auto [field, value] : {std::pair{"programs_per_group", req.programs_per_group},
                              {"workers_per_program", req.workers_per_program},
                              {"vector_elems", req.vector_elems},
                              {"stripes", req.stripes},
                              {"stripe_unroll", req.stripe_unroll},
                              {"private_budget", req.private_budget},
                              {"ctas_per_program", req.ctas_per_program}})
    if (value && *value < 1)
      throw_argument_error("mapping plan", field, "an integer in [1, 2147483647]", std::to_string(*value));
  MappingPlan p;
  const int64_t cols = std::max<int64_t>(in.cols, 1);
  // One 16-bit row input without LayerNorm's five parts (softmax, log-softmax, RMSNorm) whose
  // row strides break 16-byte alignment keeps 16-byte vectors past a peeled head. H200, bf16,
  // kernels timed alone (evidence/cubin-time-h200-odd-rows-742346f.log), us, fixed-shape kernel /
  // peeled: softmax 4096 x 3001 29.5 / 26.0, RMSNorm 31.3 / 28.8, 16384 x 1023 36.4 / 40.9 and
  // 37.6 / 37.7 (one-element vectors: 45.6, 39.1); LayerNorm lost 5-28 % to its head slot (the
  // eighth run of the redesign page).
  // Rows fewer than the SMs of at most one group of vectors stay as they are: one group a row
  // under one wave waits on latency, and there the fixed-shape kernel's width (four scalar
  // stripes; now the few-rows widths at stripes_wanted below) beat every peeled mapping. bf16 37 x 1537, kernels alone replayed as CUDA graphs
  // (evidence/cubin-time-h200-seed-graph-4d60d5f.log), us, peeled 224 workers of one vector /
  // as is: softmax 2.17 / 1.87, RMSNorm 2.40 / 1.64 (fixed-shape 1.73, 1.91); peeled 64
  // workers of four vectors 2.99, 4.54.
  const int widest_vector = std::max(1, limits.max_vector_bytes / in.widest_elem_bytes());
  const int64_t row_vectors = ceil_div(cols, widest_vector);
  const bool few_short_rows = in.rows < int64_t(limits.sm_count) && row_vectors <= limits.max_threads_per_group;
  const bool peel_odd_rows = !req.row_head && !req.vector_elems && !req.alignment &&
                             req.ctas_per_program.value_or(1) == 1 && req.caching != InputCaching::shared &&
                             req.tail.value_or(TailHandling::predicate) == TailHandling::predicate &&
                             req.cache_format.value_or(CacheFormat::f32) == CacheFormat::f32 && in.row_inputs() == 1 &&
                             in.input_bytes_per_col() == 2 && in.merge_parts < 5 && !in.loops_over_rows() &&
                             widest_vector > 1 && !rows_aligned(in, widest_vector) &&
                             bases_aligned(in, widest_vector) && cols >= 2 * int64_t(widest_vector) && !few_short_rows;
  const RowHead row_head = req.row_head.value_or(peel_odd_rows ? RowHead::peel : RowHead::as_is);
  // The rule below chooses a peeled row's whole mapping; a request for any of it keeps it off.
  const bool peeled_mapping_free =
      peel_odd_rows && !req.workers_per_program && !req.programs_per_group && !req.stripes && !req.caching;
  // Peeled rows of at most 512 vectors, over two waves of groups or more: eight programs of one
  // warp a group (no barrier, one butterfly), re-reading where the row outgrows the budget. The
  // same run, us: softmax 4096 x 3001 26.0 against 33.3 for 96 workers caching 4 stripes (152
  // bytes spilled), RMSNorm 28.8 against 32.8; 16384 x 1023 (the width the rules below pick) 40.9.
  if (peeled_mapping_free && row_vectors <= 512 && in.rows >= 16 * int64_t(limits.sm_count)) {
    PlanRequest r = req;
    r.row_head = RowHead::peel, r.workers_per_program = 32, r.programs_per_group = 8;
    return choose_plan(in, r, limits);
  }

  // Rows of kStagedNormCols elements or more of one row input whose merges take more than two
  // slots (RMSNorm, LayerNorm; 16-bit LayerNorm from twice that) are staged in shared memory over
  // the smallest cluster that holds them (the caching "shared" request below): read once, and,
  // unlike a register cache, no register holds the slice. H200, ~256 MiB of input, kernels timed
  // alone in one run (evidence/cubin-time-h200-staged-norms-6dc12ef.log), us, re-read / staged:
  // RMSNorm f32 x 65536 188.4 / 155.5, x 131072 206.2 / 168.7, x 262144 206.3 / 194.5; bf16
  // 154.2 / 141.7, 211.2 / 155.7, 227.5 / 167.7; LayerNorm f32 187.7 / 174.0, 207.5 / 187.8,
  // 208.6 / 208.4; bf16 x 65536 191.8 / 197.4 (the one loss), x 131072 227.9 / 200.9, x 262144
  // 243.4 / 222.1. At 32768 re-reading or the register cache was as fast or faster (RMSNorm f32
  // 149.1 / 159.6, bf16 138.7 / 182.2). Register-cached clusters lost to staging
  // (evidence/cubin-time-h200-cluster-norms-9973167.log), and so did staged groups of 32 KiB
  // (evidence/cubin-time-h200-staged-rows-2-6dc12ef.log). Only programs with a per-column
  // input (the norms' weight), as measured: cross-entropy (three merged parts, no per-column
  // input) and RMSNorm without a weight keep re-reading until their staged plans are timed.
  const bool mapping_unasked = !req.caching && !req.stripes && !req.workers_per_program && !req.programs_per_group &&
                               !req.ctas_per_program && !req.vector_elems && !req.row_head && !req.tail &&
                               !req.cache_format && !req.grid_limit && !req.row_prefetch && !req.alignment;
  const int max_cluster = std::min(16, limits.max_cluster_size);
  if (mapping_unasked && in.row_inputs() == 1 && in.merge_parts > 2 && !in.column_dtypes.empty() &&
      !in.loops_over_rows() &&
      in.cols >= (in.merge_parts >= 5 && in.input_bytes_per_col() == 2 ? 2 * kStagedNormCols : kStagedNormCols) &&
      max_cluster > 1 && limits.max_staged_bytes >= kStagedGroupBytes &&
      in.cols * in.input_bytes_per_col() <= int64_t(max_cluster) * kStagedGroupBytes &&
      rows_aligned(in, widest_vector)) {
    PlanRequest r = req;
    r.caching = InputCaching::shared;
    return choose_plan(in, r, limits);
  }

  // Widest access the target allows (16 bytes on CUDA) on every operand whose rows all start
  // aligned to it, and no wider than the row.
  if (req.vector_elems) {
    p.vector_elems = *req.vector_elems;
  } else {
    // A peeled row needs only aligned bases: its accesses start at an aligned column whatever
    // the strides (and validation keeps two vectors a row).
    const bool peel = row_head == RowHead::peel;
    auto fits = [&](int v) {
      return peel ? bases_aligned(in, v) && 2 * int64_t(v) <= cols : rows_aligned(in, v) && v <= cols;
    };
    int v = widest_vector;
    while (v > 1 && !fits(v)) v /= 2;
    p.vector_elems = v;
  }
  const int64_t vectors = ceil_div(cols, p.vector_elems);

  // Cooperating width: one worker per vector up to a warp (sub-warp programs for short rows),
  // then whole warps, about kTargetStripes vectors per worker, at most one group.
  // Bytes of every row input in one column: a register cache holds each input's slice.
  const int64_t xes = in.input_bytes_per_col();
  // One 16-bit row input (the forward operators' bf16 and f16 calls): the rules measured for it below.
  const bool one_16bit_input = in.row_inputs() == 1 && xes == 2;
  const int64_t per_elem = cached_scalars_per_column(in, req.column_loads.value_or(ColumnLoads::ahead));
  // A row too long for one group's registers is split over the groups of a cluster where the
  // target has clusters: the smallest power-of-two cluster whose groups of kClusterWidth
  // workers each cache at most kClusterSliceScalars scalars (asked for register caching, wider
  // groups after that). The row is then read from memory once; where even the largest cluster
  // does not hold it, it is re-read. Unasked, only rows
  // whose merges take at most two slots (softmax's and log-softmax's maximum and sum) go to a
  // cluster. H200, kernels timed alone (evidence/cubin-time-h200-clusters-exchange.log), us,
  // re-read against cluster: softmax f32 1024 x 65536 182 / 134, 512 x 131072 200 / 135,
  // 256 x 262144 203 / 145; bf16 1024 x 131072 186 / 169, 256 x 262144 106 / 97. RMSNorm lost
  // (f32 256 x 262144 206 / 239, bf16 116 / 141) and LayerNorm gained less (f32 208 / 192):
  // they keep re-reading unless the request asks for register caching. Programs of two or more
  // row inputs go to a cluster whatever their merges: a re-read reads every input row twice.
  // H200, training regret (bench/results/train-regret-h200-a322eb9.json), policy's re-read /
  // fastest cluster plan, us: softmax_backward bf16 x 131072 318.6 / 193.3, f32 x 32768
  // 316.2 / 194.9; log_softmax_backward f32 x 32768 246.0 / 189.3; fused_add_rms_norm f32 x
  // 131072 406.0 / 282.3, bf16 x 65536 383.7 / 305.7.
  int cluster = 1, cluster_width = 0;
  bool rows_cluster = false;  // a program reducing over the rows on a cluster (the rule below)
  int rows_cluster_groups = 1;  // its resident groups an SM
  const bool free_mapping = !req.stripes && !req.workers_per_program && req.programs_per_group.value_or(1) == 1 &&
                            req.caching.value_or(InputCaching::registers) == InputCaching::registers;
  const bool cluster_wanted =
      req.caching == InputCaching::registers || (!req.caching && (in.row_inputs() >= 2 || in.merge_parts <= 2));
  if (req.caching == InputCaching::shared && !req.stripes && !req.workers_per_program &&
      req.programs_per_group.value_or(1) == 1 && !in.loops_over_rows()) {
    cluster = req.ctas_per_program.value_or(1);
    if (!req.ctas_per_program)
      while (cluster < std::min(16, limits.max_cluster_size) && ceil_div(cols * xes, cluster) > kStagedGroupBytes)
        cluster *= 2;
    cluster_width = int(std::clamp<int64_t>(round_up(ceil_div(vectors, cluster), 32), 32,
                                            std::min<int64_t>(kStagedWidth, limits.max_threads_per_group)));
  } else if (req.ctas_per_program) {
    cluster = *req.ctas_per_program;
  } else if (limits.max_cluster_size > 1 && cols * xes > kRegisterRowBytes && free_mapping && !in.loops_over_rows() &&
             cluster_wanted && kClusterWidth <= limits.max_threads_per_group && row_head == RowHead::as_is &&
             p.vector_elems == widest_vector) {
    // Only rows of whole-width vectors: softmax bf16 512 x 50257 in scalar accesses over a
    // cluster of 4 took 128 registers and 99.5 us against 54.9 re-read (the same run as above).
    const int64_t budget = req.private_budget.value_or(64);
    const std::pair<int, int64_t> tiers[] = {
        {kClusterWidth, kClusterSliceScalars}, {512, kWideClusterSliceScalars}, {1024, kWideClusterSliceScalars}};
    // Programs of several row inputs whose merges take one exchange (softmax_backward,
    // log_softmax_backward) cache at most kClusterCombinedStripes vectors of each input a
    // worker, in groups of 512 where 256 workers would need more (not 1024: re-reading was as
    // fast or faster at 262144). H200 (the same run), us: f32 x 32768, 4 or 2 stripes against
    // 8, softmax_backward 215 or 195 against 272; x 131072 on 512 workers, 287 against 321
    // re-reading; x 262144 on 1024, 323 against 320 (log_softmax_backward 289 against 261).
    const bool several_combined = in.row_inputs() >= 2 && in.merge_parts <= 2;
    for (auto [w, scalars] : tiers) {
      if (cluster_width || w > limits.max_threads_per_group ||
          (w != kClusterWidth && req.caching != InputCaching::registers && !(several_combined && w <= 512)))
        continue;
      for (int c = 2; c <= std::min(16, limits.max_cluster_size); c *= 2)
        if (const int64_t stripes = ceil_div(vectors, int64_t(c) * w);
            stripes * p.vector_elems * per_elem <= std::min(scalars, budget) &&
            (!several_combined || stripes <= kClusterCombinedStripes)) {
          cluster = c, cluster_width = w;
          break;
        }
    }
  } else if (limits.max_cluster_size > 1 && in.rows_reduction_parts > 0 && free_mapping && cols > kRowsClusterCols &&
             kRowsClusterWidth <= limits.max_threads_per_group && row_head == RowHead::as_is &&
             p.vector_elems == widest_vector) {
    // A program with per-column accumulators (weight gradients) over rows of more than 8192
    // elements, its groups looping over row blocks and keeping the accumulators of their
    // columns (one workspace slot a cluster): rows of up to 16384 on the smallest cluster of
    // groups of 512 whose slice and accumulators fit the budget; longer rows on the smallest
    // cluster of groups of 256 that fit, two resident an SM, else of 512, one an SM. A cluster
    // takes its rows one after another, so the smallest cluster keeps the most rows in flight
    // (bf16 x 16384 on 8 groups of one stripe: 1101-2611 us against 252-384 on 2). H200,
    // training regret subset (bench/results/train-regret-h200-clusters-relaxed-a9012d3.json, every
    // plan below timed there; the re-read plans before it in -clusters-prefetch-571530c.json),
    // before (re-read, or 1024 workers of two stripes) / this plan, us, x 16384 (2 x 512),
    // 32768 (8 x 256), 131072 (16 x 512): rms_norm_backward bf16 325 / 252, 551 / 345,
    // 692 / 555, f32 318 / 231, 415 / 328, 484 / 466; layer_norm_backward bf16 667 / 287,
    // 1130 / 477, 1178 / 745, f32 461 / 243, 630 / 356, 640 / 491; fused_add_rms_norm_backward
    // bf16 657 / 384, 732 / 544, 814 / 738, f32 536 / 377, 627 / 460, 639 / 652. Within the
    // family of that run (clusters of 2-16 groups of 256-1024, one to four resident, prefetching
    // or not) the geometric mean regret of these plans is 2.7 %, the worst 14.6 %.
    const int64_t budget = req.private_budget.value_or(64);
    auto smallest = [&](int w) {
      for (int c = 2; c <= std::min(16, limits.max_cluster_size); c *= 2)
        if (ceil_div(vectors, int64_t(c) * w) * p.vector_elems * per_elem <= budget) return c;
      return 0;
    };
    int w = cols > 2 * kRowsClusterCols ? kRowsClusterWidth / 2 : kRowsClusterWidth;
    int c = w < kRowsClusterWidth ? smallest(w) : 0;
    rows_cluster_groups = c ? 2 : 1;
    if (!c) w = kRowsClusterWidth, c = smallest(w);
    if (c) cluster = c, cluster_width = w, rows_cluster = true;
  }
  // A program with per-column accumulators (a weight gradient: reductions over the rows) keeps
  // them in registers across its rows when the row is cached, and folds them through the
  // workspace, row after row, when it is re-read. So it caches wherever some width up to 1024
  // holds its slice and accumulators in the private budget, widening the usual width as far
  // as needed. H200, bf16 x 16384 (bench/results/train-regret-h200-ed4c333-subset.json): 1024
  // workers caching took rms_norm_backward from 709 to 407 us and layer_norm_backward from 2085
  // to 729 against re-reading with 256.
  //
  // Such a program starts at about kRowsReducingElems columns a worker, whatever the dtype (one
  // bf16 vector, two f32 ones), at least 512 workers (or one a vector, for rows of fewer) and
  // at most the widest: each worker's slice of several rows and its accumulators stay few
  // registers, and with about two groups an SM (the grid limit below) 512 or more workers keep
  // 32 warps an SM in flight. H200 (bench/results/train-regret-h200-9503a07-subset.json,
  // -f42e783-subset.json): at N = 4096, 512 workers rather than 256 took rms_norm_backward
  // from 390 to 305 us (bf16) and 393 to 231 (f32), layer_norm_backward from 745 to 390 and
  // 499 to 238; at N = 8192, 1024 rather than 512 took layer_norm_backward from 784 to 460
  // (bf16) and 641 to 278 (f32), fused_add_rms_norm_backward from 855 to 485 and 865 to 364.
  //
  // Where the row inputs of a column take more than kRowsReducingCachedBytes a row together and
  // the slice with its accumulators more than 32 scalars a worker, it re-reads instead: such a
  // cache spills (ptxas: 92-468 bytes a thread at 1024 workers x 16384), and the workspace's
  // vector accesses made re-reading cheaper. H200, N = 16384, register cache / re-read, us
  // (bench/results/train-regret-h200-f6a80b8-subset.json): f32 rms_norm_backward 420 / 311,
  // layer_norm_backward 661 / 459, fused_add_rms_norm_backward 875 / 531, bf16 863 / 651;
  // bf16 rms_norm_backward (64 KiB) 406 / 486 and layer_norm_backward 731 / 966 keep caching.
  //
  // A row of at most one vector a worker of the widest group takes one stripe when its slice,
  // accumulators and the next row block's vectors fit the budget: the group then loads the
  // next row block while it works on this one (row_prefetch "next", below). H200, f32 x 4096
  // (bench/results/train-regret-h200-5d4b5b2-prefetch.json): 1024 workers prefetching, 217.7
  // us for rms_norm_backward and 235.6 for layer_norm_backward, against 232.1 and 245.8 for
  // 512 workers of two stripes without.
  // A worker's slice, accumulators and prefetched vectors at one stripe.
  const int64_t one_stripe_prefetching = prefetching_scalars(in, 1, p.vector_elems, per_elem);
  int rows_cache_width = 0;
  if (in.rows_reduction_parts > 0 && cluster == 1 && vectors > 16 && !req.workers_per_program && !req.stripes &&
      req.programs_per_group.value_or(1) == 1 && req.caching.value_or(InputCaching::registers) == InputCaching::registers) {
    const int64_t budget = req.private_budget.value_or(64);
    const int64_t widest = std::min<int64_t>(1024, limits.max_threads_per_group);
    const int64_t occupancy_width = std::min<int64_t>(kMaxAutomaticWidth, round_up(vectors, 32));
    if (vectors <= widest && req.row_prefetch.value_or(RowPrefetch::next) == RowPrefetch::next &&
        one_stripe_prefetching <= budget) {
      rows_cache_width = int(round_up(vectors, 32));  // one stripe
    } else {
      // The usual width, then twice that, ..., then the widest.
      for (int64_t w = std::clamp<int64_t>(round_up(ceil_div(cols, kRowsReducingElems), 32), occupancy_width, widest);;
           w *= 2) {
        const int64_t width = std::min(w, widest);
        const int64_t scalars = ceil_div(vectors, width) * p.vector_elems * per_elem;
        if (scalars <= budget && (cols * xes <= kRowsReducingCachedBytes || scalars <= kWideClusterSliceScalars))
          rows_cache_width = int(width);
        if (rows_cache_width || width == widest) break;
      }
    }
  }
  const bool long_row = cluster == 1 && !rows_cache_width && cols * xes > kRegisterRowBytes &&
                        req.caching.value_or(InputCaching::reread) == InputCaching::reread && !req.stripes;
  // Rows fewer than the SMs, one scalar a stripe, one row input (the rule at stripes_wanted
  // below); not f32 LayerNorm (five merged parts or more of 4-byte rows), which lost at 320
  // workers (2.12 us against 1.92 at 416, the same run).
  const bool few_scalar_rows = few_short_rows && p.vector_elems == 1 && cluster == 1 && !long_row &&
                               in.row_inputs() == 1 && !in.loops_over_rows() && (in.merge_parts < 5 || xes == 2);
  // A re-read iteration issues unroll loads of every row input a worker: programs reading
  // several rows (y and dy, x and the residual) unroll less and widen instead. H200, bf16 x
  // 16384: softmax_backward 316 -> 202 us and fused_add_rms_norm 357 -> 275 us with 512
  // workers unrolling 2 rather than 256 unrolling 4 (the same subset).
  //
  // LayerNorm's re-read loop (five merged parts or more: a worker fast path of more
  // accumulators) unrolls 2 for one 16-bit input: at 4 ptxas kept 32 bytes of stack a thread
  // (H200, bf16 x 131072, kernels timed alone: 58.3 us at 2 against 59.9 at 4).
  const int reread_unroll = req.stripe_unroll.value_or(
      one_16bit_input && in.merge_parts >= 5 ? kRereadUnroll / 2 : std::max(1, kRereadUnroll / std::max(1, in.row_inputs())));
  if (req.width_mode == WidthMode::exact && !req.workers_per_program)
    throw_argument_error("mapping plan", "workers_per_program", "a width when width_mode is \"exact\"", "no width");
  if (req.workers_per_program) {
    p.workers_per_program = *req.workers_per_program;
    p.width_mode = req.width_mode.value_or(WidthMode::exact);
  } else if (cluster_width) {
    p.workers_per_program = cluster_width;
    p.width_mode = WidthMode::automatic;
  } else if (rows_cache_width) {
    p.workers_per_program = rows_cache_width;
    p.width_mode = WidthMode::automatic;
  } else if (long_row) {
    // LayerNorm's loop keeps the width of unrolling 4 where it unrolls 2: at bf16 x 32768 the
    // 1024 workers of unrolling 2 fit one group an SM (H200, 1024 x 32768, kernels timed alone,
    // evidence/cubin-time-h200-ln-reread-widths-1de82a0.log: 57.3 us against 46.8-47.1 on 512
    // workers, two groups an SM; the fixed-shape kernel 48.8). Longer rows reach 1024 either way.
    const int width_unroll =
        !req.stripe_unroll && one_16bit_input && in.merge_parts >= 5 ? kRereadUnroll : reread_unroll;
    const int64_t iteration = std::min(kRereadIterationBytes, cols * xes / 2);
    int64_t w = round_up(ceil_div(iteration, int64_t(p.vector_elems) * xes * width_unroll), 32);
    p.workers_per_program = int(std::clamp<int64_t>(w, 32, limits.max_threads_per_group));
    p.width_mode = WidthMode::automatic;
  } else {
    // About kTargetStripes vectors a worker for one row input, fewer for several: a worker's
    // loads of y and dy (x and the residual) are all in flight at once. H200, N = 4096 (the
    // same subset): softmax_backward bf16 186 us with 256 workers of 2 stripes against 260 with
    // 128 of 4, log_softmax_backward 202 against 314; f32 and fused_add_rms_norm within 1 %.
    // Several 16-bit row inputs take one vector of each a worker (eight elements, as f32 rows take
    // two vectors): H200, bf16 (bench/results/train-regret-h200-a322eb9.json), two stripes / one,
    // us: log_softmax_backward x 1024 236 / 194, x 4096 234 / 206; fused_add_rms_norm 264 / 258,
    // 267 / 263; softmax_backward 189 / 188, 187 / 186.
    const bool several_16bit = in.row_inputs() >= 2 && xes == 2 * in.row_inputs();
    // Rows fewer than the SMs of one scalar a stripe (strides that break vector alignment) take
    // longer workers: one group an SM waits on its merges, and fewer warps merge sooner. Seven
    // stripes for merges of at most two parts (softmax's maximum and sum, which then combine:
    // one exchange), five for more (the norms'). H100, 37 x 1537 replayed as CUDA graphs
    // (evidence/cubin-time-h100-seed-variants-cebcca5.log), us, 416 workers of four stripes /
    // this rule: softmax f32 1.92 / 1.70, bf16 1.86 / 1.73; log-softmax 1.84 / 1.73, 1.80 /
    // 1.77; RMSNorm 1.81 / 1.70, 1.61 / 1.59; LayerNorm bf16 1.82 / 1.77.
    int64_t stripes_wanted = req.stripes             ? *req.stripes
                             : few_scalar_rows       ? (in.merge_parts <= 2 ? 7 : 5)
                             : several_16bit && cluster == 1
                                 ? 1
                                 : std::max<int64_t>(1, kTargetStripes / std::max(1, in.row_inputs()));
    // One 16-bit input of 17 to 32 vectors whose merges take at most two parts (softmax's
    // maximum and sum) takes two vectors a worker in half-warp programs: two rows a warp share
    // each butterfly level, one level fewer (H200, bf16 softmax x 256, kernels timed alone:
    // 34.9 us against 36.7 one warp a row). LayerNorm lost 13 % the same way (46.2 against 40.8).
    const bool half_warp = vectors > 16 && vectors <= 32 && one_16bit_input && in.merge_parts <= 2 && !in.loops_over_rows();
    if (vectors <= 16 && !req.stripes && cluster == 1)
      p.workers_per_program = pow2_at_least(vectors);
    else if (half_warp && !req.stripes && cluster == 1)
      p.workers_per_program = 16;
    else  // a cluster's groups share the row's vectors
      p.workers_per_program = int(std::clamp<int64_t>(round_up(ceil_div(ceil_div(vectors, cluster), stripes_wanted), 32), 32,
                                                      std::min(kMaxAutomaticWidth, limits.max_threads_per_group)));
    p.width_mode = WidthMode::automatic;
  }
  p.ctas_per_program = cluster;
  // Clamped to an int: validate_plan rejects a row of more passes.
  p.stripes = req.stripes ? *req.stripes
                          : int(std::clamp<int64_t>(
                                ceil_div(vectors, std::max<int64_t>(p.row_workers(), 1)), 1, INT32_MAX));
  p.private_budget = req.private_budget.value_or(64);
  p.caching = req.caching.value_or(cluster > 1 || (!long_row && int64_t(p.stripes) * p.vector_elems * per_elem <= p.private_budget)
                                       ? InputCaching::registers
                                       : InputCaching::reread);
  if (long_row)
    p.stripe_unroll = std::min(reread_unroll, p.stripes);
  else
    p.stripe_unroll = req.stripe_unroll.value_or(p.caching == InputCaching::reread ? std::min(4, p.stripes) : 1);
  p.barrier_scope = req.barrier_scope.value_or(BarrierScope::group);
  p.tail = req.tail.value_or(TailHandling::predicate);
  // Whole vectors when every row is aligned and cols is a multiple of V (contiguous rows of
  // any aligned tensor): the kernel then has no scalar path and one row test per vector.
  p.alignment = req.alignment.value_or(whole_vectors(in, p.vector_elems) ? Alignment::require : Alignment::scalar_fallback);
  p.row_head = row_head;
  if (p.row_head == RowHead::peel) p.alignment = req.alignment.value_or(Alignment::scalar_fallback);
  // Packed caching: ptxas register counts alone do not favour it for the forward operators
  // (fewer registers for RMSNorm, more for log-softmax), so their default stays f32. A program
  // with per-column accumulators (a weight gradient) that caches two or more stripes of 16-bit
  // row inputs keeps them packed: beside its accumulators, 1024 workers of two f32-converted
  // stripes ran short of registers. H200, bf16 x 16384 (bench/results/train-regret-h200-e20b301-packed.json), us,
  // f32 / packed: rms_norm_backward 395.5 / 332.0, layer_norm_backward 699.5 / 654.3; at one
  // stripe (1K-8K) packed was within -5 to +1 %.
  const bool packed_rows = in.rows_reduction_parts > 0 && p.caching == InputCaching::registers && cluster == 1 &&
                           p.stripes >= 2 && row_inputs_16bit(in) && p.vector_elems % 2 == 0;
  p.cache_format = req.cache_format.value_or(packed_rows ? CacheFormat::packed : CacheFormat::f32);
  // A cached row merges each sum and max on its own: additions and maxima cross workers, not
  // the monoids' combines (divisions, exponentials at every butterfly level). H200: register-
  // cached LayerNorm and RMSNorm lost 5-50 % to combine merges at 1K-16K columns. Except on a
  // cluster whose merges take at most two slots (softmax's maximum and sum): one exchange of
  // combined states costs less than one exchange a stage (H200, kernels timed alone,
  // evidence/cubin-time-h200-cluster-merges-c5eea4d.log, staged / combine us: bf16 softmax
  // 1024 x 131072 169.0 / 158.4, 256 x 262144 97.6 / 90.8, 2048 x 65536 154.8 / 151.7; f32
  // 256 x 262144 144.1 / 137.7), where RMSNorm lost 6-10 % and LayerNorm 21-26 % the same way.
  // So do few scalar rows of softmax's two slots (one group an SM: 37 x 1537 at 224 workers,
  // staged / combine us, f32 1.93 / 1.70, bf16 1.95 / 1.73).
  const bool one_exchange = (p.ctas_per_program > 1 || few_scalar_rows) && in.merge_parts <= 2;
  p.merge = req.merge.value_or(p.caching != InputCaching::reread && !one_exchange ? MergeStrategy::staged
                                                                                  : MergeStrategy::combine);
  p.column_loads = req.column_loads.value_or(ColumnLoads::ahead);

  // Packing: short-row programs share a group of about kTargetGroupThreads threads, unless
  // that would leave fewer than kGroupsPerSm groups per SM; sub-warp programs fill whole warps.
  if (req.programs_per_group) {
    p.programs_per_group = *req.programs_per_group;
  } else if (cluster > 1) {
    p.programs_per_group = 1;  // the groups of a cluster share one row
  } else if (p.workers_per_program > 0 && p.workers_per_program <= limits.max_threads_per_group) {
    int64_t packed = std::max(1, kTargetGroupThreads / p.workers_per_program);
    int64_t spread = std::max<int64_t>(1, ceil_div(in.rows, kGroupsPerSm * limits.sm_count));
    int64_t n = std::min(packed, spread);
    if (p.workers_per_program < 32) n = round_up(n, 32 / p.workers_per_program);
    if (p.barrier_scope == BarrierScope::program) n = std::min<int64_t>(n, limits.named_barriers - 1);
    p.programs_per_group = int(std::max<int64_t>(1, n));
  }
  // Groups of up to 512 threads ask for 1024 threads' worth of resident groups per SM (at most
  // 64 registers a thread): at 68 registers bf16 LayerNorm x 16384 ran one group of 512 per SM
  // (ncu: 25 % occupancy, 53 % of peak DRAM throughput), and at 69 registers bf16 RMSNorm
  // 1024 x 4096 (groups of 256) fit three groups per SM instead of four, two waves instead of
  // one: 9.2 us against 6.6 (ncu); ptxas spills a few bytes instead, to L1.
  // A cluster program's group caches up to kClusterSliceScalars a worker: one group per SM.
  const int64_t threads = p.threads_per_group();
  int64_t resident_threads = 1024;
  // Except where a row's statistics merge five or more sums and maxima (LayerNorm's) over a
  // cached slice of 32 scalars or more, in programs of two warps or more: at 64 registers
  // ptxas spilled 56-72 bytes a thread (bf16 LayerNorm x 4096 and x 2048, groups of 256).
  // There 768 threads' worth (at most 80 registers) wins once the grid spans two waves or
  // more (H200: 8192 x 4096 42.0 us against 46.7, 16384 x 2048 44.1 against 47.2); one wave
  // keeps 1024 threads' worth (1024 x 4096: 8.7 us against 9.3).
  const int64_t cached_scalars = int64_t(p.stripes) * p.vector_elems * per_elem /
                                 (p.cache_format == CacheFormat::packed ? 2 : 1);
  if (p.caching == InputCaching::registers && !in.loops_over_rows() && in.merge_parts >= 5 && cached_scalars >= 32 &&
      p.workers_per_program >= 64 && threads <= 256 && cluster == 1) {
    const int64_t groups = ceil_div(in.rows, std::max(1, p.programs_per_group));
    if (groups >= 2 * limits.sm_count * (1024 / threads)) resident_threads = 768;
  }
  // One 16-bit row input cached in 16 scalars or fewer a worker (rows of up to 512 elements, one
  // warp a row), without LayerNorm's five merged parts, asks for 1536 threads' worth (at most 40
  // registers): at 1024 ptxas took 43-48 registers and the SM held five groups of 256 instead of
  // six (H200, bf16 x 512, kernels timed alone: softmax 36.4 us against 35.1, RMSNorm 36.2
  // against 35.7). Not elsewhere: LayerNorm spilled 20 bytes and lost 3 %, fp32 rows of 16
  // scalars (x 2048 and x 4096) spilled and lost 15-50 %, and x 1024 bf16 lost 40 %.
  const bool cached_16bit = p.caching == InputCaching::registers && !in.loops_over_rows() && one_16bit_input && cluster == 1;
  if (cached_16bit && in.merge_parts < 5 && cached_scalars <= 16 && threads <= 256) resident_threads = 1536;
  // LayerNorm's (five merged parts or more) asks for 1280 (at most 48 registers): at 1024
  // ptxas took 55-56 and the SM held four groups of 256 (H200, bf16 x 512, kernels timed alone
  // in three runs: 39.3-38.8 us at five groups against 40.5-40.9 at four; the fixed-shape
  // kernel 38.7-39.2).
  if (cached_16bit && in.merge_parts >= 5 && cached_scalars <= 16 && threads <= 256) resident_threads = 1280;
  // Scalar accesses (one element a vector: rows of odd stride) of one 16-bit input, cached in
  // 8 scalars or fewer a worker by groups of 257-512 threads, ask for 1536 threads' worth (three
  // groups of 512, 40 registers): at 1024 ptxas took 40-64 registers and the SM held two
  // (H200, bf16 4096 x 3001, kernels timed alone: LayerNorm 36.9 us against 43.6, RMSNorm 32.1
  // against 34.9, softmax 31.0 against 31.3; the fixed-shape kernels 37.6, 31.3, 29.5). Only
  // where the grid fills the SMs twice at two groups each: fewer rows gain no residency.
  if (cached_16bit && p.vector_elems == 1 && cached_scalars <= 8 && threads > 256 && threads <= 512 &&
      ceil_div(in.rows, std::max(1, p.programs_per_group)) >= 4 * limits.sm_count)
    resident_threads = 1536;
  // A staged row holds no register in flight: its groups are bounded by shared memory (an SM's
  // 227 KiB a group may take plus the 1 KiB each group reserves), so launch bounds ask for as
  // many as fit, at most 2048 threads' worth.
  int64_t staged_groups = 0;
  if (p.caching == InputCaching::shared) {
    const int64_t bytes = staged_bytes(in, p) + merge_shared_bytes(in, p) + 1024;
    staged_groups = std::clamp<int64_t>((int64_t(limits.max_staged_bytes) + 1024) / bytes, 1,
                                        std::max<int64_t>(1, limits.max_threads_per_sm / threads));
  }
  // One wave: a grid of no more groups than SMs never holds two groups an SM, so asking launch
  // bounds for more residency only takes registers away (ptxas, bf16 LayerNorm 1 x 4096 on 128
  // workers at 8 resident groups: 64 registers and 40 bytes of stack; at 1, none). Decode-sized
  // calls are that case.
  const bool one_wave = ceil_div(in.rows, int64_t(std::max(1, p.programs_per_group))) * cluster <= limits.sm_count;
  p.resident_groups = req.resident_groups.value_or(one_wave       ? 1
                                                   : staged_groups ? int(std::min<int64_t>(staged_groups, 32))
                                                   : rows_cluster  ? rows_cluster_groups
                                                   : cluster == 1 && threads <= 512
                                                       ? int(std::clamp<int64_t>(resident_threads / threads, 1, 32))
                                                       : 1);
  // Reductions over the rows keep one partial per program slot: about two groups per SM
  // bound that extra memory (slots x cols x parts) while filling the device; groups of fewer
  // than 512 threads get more, about 1024 threads an SM (H200, bf16 x 2048, 256 workers: four
  // groups an SM took rms_norm_backward from 437 to 310 us, layer_norm_backward from 533 to 407,
  // fused_add_rms_norm_backward from 547 to 408). Such groups come from short rows, so the
  // partials stay small.
  //
  // A register-cached row takes one wave of resident groups instead (resident_groups an SM), up
  // to kMaxPartialSlotsPerSm program slots an SM: two groups of 1024 threads an SM ran two waves,
  // and halving the groups for packed programs left the SMs half full. H200, kernels in the
  // training regret (bench/results/train-regret-h200-a322eb9.json), us, before / after: bf16 x
  // 1024 (two programs a group of 256) rms_norm_backward 466 / 349, layer_norm_backward
  // 592 / 495, fused_add_rms_norm_backward 574 / 459; x 8192 (1024 workers) f32 231 / 211,
  // 281 / 250, 372 / 345, bf16 358 / 345, 467 / 449, 486 / 490; bf16 x 16384
  // (-f6a80b8-subset.json) 406 / 384, 731 / 689. Re-read rows keep the rule above: one wave
  // gained 0-5 % at 32768 and lost up to 4 % beyond.
  int64_t grid = 0;  // one group a row block
  if (in.loops_over_rows() && p.caching == InputCaching::registers) {
    // A row block of a cluster takes ctas_per_program groups: a wave holds that many fewer.
    grid = std::min<int64_t>(int64_t(p.resident_groups) * limits.sm_count / p.ctas_per_program,
                             kMaxPartialSlotsPerSm * limits.sm_count / std::max(1, p.programs_per_group));
  } else if (in.loops_over_rows()) {
    const int64_t groups_per_sm = 2 * std::max<int64_t>(1, 512 / std::max<int64_t>(threads, 1));
    grid = ceil_div(groups_per_sm * limits.sm_count, p.programs_per_group);
  }
  // Row values reduced over the rows (no per-column accumulator) take a workspace slot a program
  // of every row block; past kMaxRowValueSlots slots the row blocks loop instead, so the
  // workspace and the second phase's fold stay bounded (512 KiB of two-part f32 slots, 64 loads
  // a worker of a finish group of 1024). Staged rows take one row block a group whatever the
  // count (the request's).
  const int64_t row_blocks = ceil_div(in.rows, int64_t(std::max(1, p.programs_per_group)));
  if (in.reduces_rows && !in.loops_over_rows() && p.caching != InputCaching::shared &&
      row_blocks * p.programs_per_group > kMaxRowValueSlots)
    grid = std::max<int64_t>(1, kMaxRowValueSlots / std::max(1, p.programs_per_group));
  // More row blocks than a grid holds (2^31 - 1 groups): the most row blocks a plan may launch,
  // each looping over the rest, rather than a plan the grid check refuses. Staged rows take one
  // row block a group (and rows that many are beyond any memory).
  if (grid == 0 && p.caching != InputCaching::shared && row_blocks * p.ctas_per_program > INT32_MAX)
    grid = int64_t(1) << 30;
  p.grid_limit = req.grid_limit.value_or(int(grid > 0 || in.loops_over_rows() ? std::max<int64_t>(1, grid) : 0));
  // A group looping over row blocks with one cached vector of each input a worker loads the
  // next row block while it works on this one: otherwise no load is in flight during the
  // merges, barriers and stores. H200 (bench/results/train-regret-h200-5d4b5b2-prefetch.json),
  // us, without / with: rms_norm_backward bf16 x 1024 349.0 / 280.5, x 4096 307.2 / 226.9, x 8192
  // 343.5 / 224.0, f32 x 1024 260.6 / 230.5; layer_norm_backward bf16 x 4096 397.5 / 373.4,
  // x 8192 446.0 / 356.4, f32 x 1024 315.9 / 299.9. Not with two stripes: 1024 workers of
  // two vectors prefetching lost 21-98 % (f32 x 8192 rms_norm_backward 207.1 / 251.7). Packed
  // programs merging two sums a row (layer_norm_backward bf16 x 1024) lost with prefetching
  // while each row ended with a barrier (490-492 / 542-576); with one barrier a row (the
  // merge slots' two copies) they gain: 306.1 / 259.2 (train-regret-h200-616c54f-subset.json).
  const bool prefetch_fits = p.caching == InputCaching::registers && p.grid_limit > 0 && p.stripes == 1 &&
                             p.ctas_per_program == 1 && p.row_head == RowHead::as_is &&
                             one_stripe_prefetching <= p.private_budget;
  // A cluster of the rule above prefetches 16-bit rows within a budget of 128 scalars (H200,
  // bf16 x 16384, layer_norm_backward: 376 us without, 279-287 with, in the relaxed-a9012d3
  // run; f32 rows of four stripes were not measured prefetching).
  const int64_t cluster_prefetched = rows_cluster ? prefetching_scalars(in, p.stripes, p.vector_elems, per_elem) : 0;
  const bool cluster_prefetch = rows_cluster && row_inputs_16bit(in) && !req.row_prefetch &&
                                cluster_prefetched <= req.private_budget.value_or(128);
  if (cluster_prefetch && !req.private_budget)
    p.private_budget = std::max<int>(p.private_budget, int(cluster_prefetched));
  p.row_prefetch = req.row_prefetch.value_or(prefetch_fits || cluster_prefetch ? RowPrefetch::next : RowPrefetch::none);
  // The second phase takes 32 columns a group, its warps splitting the slots: 32 warps fold
  // the 132-1056 slots of the norms' backward passes fastest. H200, us, whole calls with 256 /
  // 1024 (train-regret-h200-616c54f-subset.json): rms_norm_backward bf16 x 1024 233.7 / 214.8,
  // x 4096 210.1 / 204.4, f32 x 1024 213.2 / 199.0, x 4096 225.5 / 224.7; layer_norm_backward
  // bf16 x 4096 274.7 / 273.2, f32 x 1024 215.7 / 206.1, x 4096 230.7 / 230.9.
  p.finish_workers = req.finish_workers.value_or(std::min(1024, limits.max_threads_per_group));
  return p;
}

void validate_plan(const MappingPlan& p, const PlanInputs& in, const DeviceLimits& limits,
                   const std::string& op) {
  auto fail = [&](const char* field, const std::string& expected, const std::string& given) {
    throw_argument_error(op, std::string("plan.") + field, expected, given);
  };
  auto str = [](auto v) { return std::to_string(v); };
  const int W = p.workers_per_program, P = p.programs_per_group, V = p.vector_elems, C = p.ctas_per_program;
  if (!valid_width(W))
    fail("workers_per_program", "1, 2, 4, 8, 16 or a multiple of 32 up to 1024", str(W));
  if (P < 1) fail("programs_per_group", "at least 1", str(P));
  if (int64_t(P) * W > limits.max_threads_per_group)
    fail("programs_per_group", "at most " + str(limits.max_threads_per_group) +
                                   " threads per group (programs_per_group x workers_per_program)",
         str(P) + " x " + str(W) + " = " + str(int64_t(P) * W));
  if ((int64_t(P) * W) % 32 != 0)
    fail("programs_per_group", "whole warps per group (programs_per_group x workers_per_program a multiple of 32)",
         str(P) + " x " + str(W) + " = " + str(int64_t(P) * W));
  if (V != 1 && V != 2 && V != 4 && V != 8) fail("vector_elems", "1, 2, 4 or 8", str(V));
  if (V * in.widest_elem_bytes() > limits.max_vector_bytes)
    fail("vector_elems", "an access of at most " + str(limits.max_vector_bytes) + " bytes on every operand",
         str(V) + " elements of " + str(in.widest_elem_bytes()) + " bytes");
  if (p.stripes < 1) fail("stripes", "at least 1", str(p.stripes));
  // A row split over the groups of a cluster: each group caches its slice (registers, shared
  // memory) or re-reads it, and the partial states merge through distributed shared memory (one
  // program a group, whole warps).
  if (C < 1 || C > 16) fail("ctas_per_program", "1 to 16", str(C));
  if (C > limits.max_cluster_size)
    fail("ctas_per_program",
         "at most " + str(limits.max_cluster_size) + " groups a cluster on this target" +
             (limits.max_cluster_size == 1 ? " (it launches no clusters)" : ""),
         str(C));
  if (C > 1) {
    // One program of whole warps (a group is whole warps): every worker reaches the merges.
    if (P != 1) fail("programs_per_group", "1 when ctas_per_program > 1 (the groups of a cluster share one row)", str(P));
    // A cluster looping over row blocks (grid_limit > 0, as reductions over the rows need) merges
    // each row through its exchange regions' next phase; its groups keep the partials of the
    // columns of their slices in one workspace slot a cluster.
  }
  // The passes of all workers over a row are counted in 32 bits (the stripes field).
  if (ceil_div(in.cols, int64_t(C) * W * V) > INT32_MAX)
    throw_argument_error(op, in.rows_operand,
                         "cols at most 2147483647 passes of ctas_per_program x workers_per_program x vector_elems = " +
                             str(int64_t(C) * W * V) + " elements",
                         str(in.cols));
  if (p.stripe_unroll < 1 || p.stripe_unroll > 16) fail("stripe_unroll", "1 to 16", str(p.stripe_unroll));
  if (p.private_budget < 1 || p.private_budget > 255) fail("private_budget", "1 to 255 scalars", str(p.private_budget));
  if (p.caching != InputCaching::reread) {
    int64_t covered = int64_t(p.stripes) * C * W * V;
    if (covered < in.cols)
      fail("stripes", std::string(C > 1 ? "stripes x ctas_per_program x workers_per_program x vector_elems"
                                        : "stripes x workers_per_program x vector_elems") +
                          " >= cols = " + str(in.cols),
           str(p.stripes) + " x " + (C > 1 ? str(C) + " x " : std::string()) + str(W) + " x " + str(V) + " = " +
               str(covered));
  }
  if (p.caching == InputCaching::shared) {
    // Staged regions are single-phase: one row block a group, nothing reduced over the rows.
    // Per-column accumulators need a loop over row blocks, so say that rather than blame the
    // grid_limit the policy chose for them.
    if (in.rows_reduction_parts > 0)
      fail("caching",
           "\"registers\" or \"reread\" for a program with per-column accumulators over the rows (their partials "
           "need a loop over row blocks; staged regions are single-phase)",
           "\"shared\"");
    if (p.grid_limit > 0 || p.row_head != RowHead::as_is || p.tail != TailHandling::predicate ||
        p.cache_format != CacheFormat::f32)
      fail("caching",
           "\"shared\" only with grid_limit 0 (one row block a group), row_head \"as_is\", tail \"predicate\" and "
           "cache_format \"f32\"",
           "grid_limit " + str(p.grid_limit) + ", row_head \"" + to_string(p.row_head) + "\", tail \"" +
               to_string(p.tail) + "\", cache_format \"" + to_string(p.cache_format) + "\"");
    // Its stripes are unrolled, as a register cache's are: the kernel grows with them.
    if (int64_t(p.stripes) * V > kMaxStagedElems)
      fail("caching",
           "\"shared\" with at most " + str(kMaxStagedElems) +
               " staged elements a worker (stripes x vector_elems; the stripes are unrolled): more workers or groups",
           "stripes x vector_elems = " + str(p.stripes) + " x " + str(V) + " = " + str(int64_t(p.stripes) * V));
    const int64_t staged = staged_bytes(in, p);
    const int64_t merges = merge_shared_bytes(in, p);
    if (staged + merges > limits.max_staged_bytes)
      fail("caching",
           "\"shared\" within " + str(limits.max_staged_bytes) + " bytes of shared memory a group (" + str(merges) +
               " for the merges), or more groups a row (ctas_per_program) or caching \"reread\"",
           "stripes x workers_per_program x vector_elems x programs_per_group x row input bytes = " + str(p.stripes) +
               " x " + str(W) + " x " + str(V) + " x " + str(P) + " x " + str(row_input_bytes(in)) + " = " +
               str(staged) + " bytes staged");
  }
  if (p.caching == InputCaching::registers) {
    const bool held_columns = p.column_loads == ColumnLoads::once && !in.column_dtypes.empty();
    const int64_t per_elem = cached_scalars_per_column(in, p.column_loads);
    // A peeled head is one more cached vector.
    const int64_t vectors = int64_t(p.stripes) + (p.row_head == RowHead::peel ? 1 : 0);
    const int64_t prefetched = p.row_prefetch == RowPrefetch::next ? prefetch_scalars(in, p.stripes, V) : 0;
    if (vectors * V * per_elem + prefetched > p.private_budget)
      fail("caching",
           "a cached row slice within private_budget = " + str(p.private_budget) + " scalars (or caching \"reread\")",
           std::string(p.row_head == RowHead::peel ? "(stripes + 1 for the peeled head)" : "stripes") +
               " x vector_elems x " + str(per_elem) + " (row inputs and row-reduction accumulators" +
               (held_columns ? std::string(", per-column inputs held across rows") : std::string()) +
               (in.real_bytes == 8 ? ", two scalars each in f64" : "") + ")" +
               (prefetched > 0 ? " + " + str(prefetched) + " prefetched (the next row block's row inputs)"
                               : std::string()) +
               " = " + str(vectors * V * per_elem + prefetched) + " scalars per worker");
  }
  if (p.row_head == RowHead::peel) {
    const char* expected =
        "\"as_is\" unless tail is \"predicate\", alignment \"scalar_fallback\", cache_format \"f32\", "
        "ctas_per_program 1, a row input, no per-column accumulators (a reduction over the rows of each column) "
        "and cols >= 2 x vector_elems";
    // A peeled worker's columns move with each row's alignment, so per-column accumulators held
    // across rows cannot follow them; reductions over the rows of per-row values (cross-entropy's
    // summed losses and count) can.
    if (p.tail != TailHandling::predicate || p.alignment != Alignment::scalar_fallback ||
        p.cache_format != CacheFormat::f32 || C != 1 || in.row_inputs() == 0 || in.rows_reduction_parts > 0 ||
        in.cols < 2 * int64_t(V))
      fail("row_head", expected,
           "\"peel\" with tail \"" + to_string(p.tail) + "\", alignment \"" + to_string(p.alignment) +
               "\", cache_format \"" + to_string(p.cache_format) + "\", ctas_per_program " + str(C) +
               (in.row_inputs() == 0 ? ", no row input" : "") +
               (in.rows_reduction_parts > 0 ? ", per-column accumulators" : "") + ", cols " + str(in.cols) +
               ", vector_elems " + str(V));
  }
  const bool inputs_16bit = row_inputs_16bit(in);
  std::string input_dtypes;
  for (const RowOperandInfo& r : in.row_operands)
    if (r.input) input_dtypes += (input_dtypes.empty() ? "" : ", ") + std::string(dtype_name(r.dtype));
  if (p.merge == MergeStrategy::staged && p.caching == InputCaching::reread)
    fail("merge", "\"combine\" unless the rows are cached in registers (a staged merge reads the row once per stage)",
         "\"staged\" with caching \"" + to_string(p.caching) + "\"");
  if (p.column_loads != ColumnLoads::ahead && p.caching == InputCaching::reread)
    fail("column_loads", "\"ahead\" unless the rows are cached in registers (a re-read loop loads them per iteration)",
         "\"" + to_string(p.column_loads) + "\" with caching \"" + to_string(p.caching) + "\"");
  if (p.column_loads == ColumnLoads::once && (p.grid_limit == 0 || p.row_head != RowHead::as_is))
    fail("column_loads",
         "\"once\" only for groups that loop over row blocks (grid_limit > 0) with row_head \"as_is\"",
         "grid_limit " + str(p.grid_limit) + ", row_head \"" + to_string(p.row_head) + "\"");
  // "next": a re-read loop's next iteration, or a looping group's next row block of a row cached
  // in registers.
  if (p.row_prefetch == RowPrefetch::next && p.caching != InputCaching::reread &&
      (p.caching != InputCaching::registers || p.grid_limit == 0 || p.row_head != RowHead::as_is))
    fail("row_prefetch",
         "\"none\" unless the rows are re-read (caching \"reread\": the next iteration's loads) or groups loop over "
         "row blocks (grid_limit > 0) with their rows cached in registers and row_head \"as_is\"",
         "\"next\" with caching \"" + to_string(p.caching) + "\", grid_limit " + str(p.grid_limit) + ", row_head \"" +
             to_string(p.row_head) + "\"");
  if (p.cache_format == CacheFormat::packed && (p.caching != InputCaching::registers || !inputs_16bit || V % 2 != 0))
    fail("cache_format", "\"f32\" unless the rows are cached in registers, every row input is 16-bit and vector_elems is even",
         "\"packed\" with caching \"" + to_string(p.caching) + "\", row inputs " + input_dtypes +
             ", vector_elems " + str(V));
  if (p.barrier_scope == BarrierScope::program) {
    if (W % 32 != 0) fail("barrier_scope", "\"group\" for sub-warp programs (a named barrier counts whole warps)", "\"program\"");
    if (P > limits.named_barriers - 1)
      fail("programs_per_group", "at most " + str(limits.named_barriers - 1) +
                                     " programs with program-scope barriers (one named barrier each)",
           str(P));
  }
  if (p.alignment == Alignment::require && !whole_vectors(in, V))
    fail("alignment", "every row of every operand aligned to vector_elems = " + str(V) +
                          " elements and cols a multiple of it for \"require\"",
         "base alignment " + str(in.base_alignment) + " bytes, row strides " + strides(in) + ", cols " + str(in.cols));
  if (merge_shared_bytes(in, p) > limits.max_shared_bytes)
    fail("programs_per_group", "shared memory within " + str(limits.max_shared_bytes) + " bytes", str(P));
  if (int64_t(p.resident_groups) * P * W > limits.max_threads_per_sm)
    fail("resident_groups", "resident_groups x threads per group <= " + str(limits.max_threads_per_sm) +
                                " (threads an SM holds)",
         str(p.resident_groups) + " x " + str(int64_t(P) * W));
  if (p.finish_workers % 32 != 0 || p.finish_workers > limits.max_threads_per_group)
    fail("finish_workers", "a multiple of 32 up to " + str(limits.max_threads_per_group) + " (whole warps in one group)",
         str(p.finish_workers));
  if (in.loops_over_rows() && p.grid_limit < 1)
    fail("grid_limit",
         "at least 1 for a program with per-column accumulators over the rows (their partials are bounded by the grid)",
         str(p.grid_limit));
  const int64_t blocks = ceil_div(in.rows, P);
  const int64_t groups = (p.grid_limit > 0 ? std::min<int64_t>(blocks, p.grid_limit) : blocks) * C;
  if (groups > limits.max_groups)
    throw_argument_error(op, in.rows_operand,
                         "at most " + str(limits.max_groups) + " groups of " + str(P) + " rows (the grid's limit)" +
                             (C > 1 ? ", " + str(C) + " groups a row block" : std::string()),
                         str(in.rows) + " rows");
}

std::vector<MappingPlan> mapping_family(const PlanInputs& in, const DeviceLimits& limits) {
  std::vector<MappingPlan> family;
  auto add = [&](const MappingPlan& p) {
    try {
      validate_plan(p, in, limits, "tune");
    } catch (const Error&) {
      return;
    }
    for (const MappingPlan& q : family)
      if (q == p) return;
    family.push_back(p);
  };
  const MappingPlan policy = choose_plan(in, {}, limits);
  add(policy);
  const int64_t cols = std::max<int64_t>(in.cols, 1);
  for (int w : {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, policy.workers_per_program})
    for (int v : {1, 2, 4, 8}) {
      // Rows whose strides break v-element alignment keep v-element vectors past a peeled head.
      const bool aligned = v == 1 || rows_aligned(in, v);
      if (!aligned && !bases_aligned(in, v)) continue;
      if (int64_t(w) * v > 2 * int64_t(pow2_at_least(cols))) continue;  // first stripe mostly past the row end
      for (int programs : {1, 2, 4, 8, 16, 32}) {
        if (programs > 1 && programs > in.rows) continue;
        PlanRequest r;
        r.workers_per_program = w, r.vector_elems = v, r.programs_per_group = programs;
        if (!aligned) r.row_head = RowHead::peel;
        for (InputCaching caching : {InputCaching::registers, InputCaching::reread, InputCaching::shared})
          for (int unroll : {1, 2, 4}) {
            if (caching != InputCaching::reread && unroll > 1) continue;
            r.caching = caching, r.stripe_unroll = unroll, r.merge.reset(), r.row_prefetch.reset();
            MappingPlan p = choose_plan(in, r, limits);
            if (p.stripe_unroll > p.stripes && caching == InputCaching::reread) continue;
            add(p);
            if (caching == InputCaching::reread && p.stripe_unroll < p.stripes) {  // the next iteration's loads ahead
              r.row_prefetch = RowPrefetch::next;
              add(choose_plan(in, r, limits));
              r.row_prefetch.reset();
            }
            if (caching != InputCaching::reread) {  // the other merge of a cached row
              r.merge = MergeStrategy::combine;
              add(choose_plan(in, r, limits));
            }
          }
      }
    }
  // Rows split over the groups of a cluster, where the target has clusters: one program a
  // group, the row cached in registers or staged in shared memory, either merge. A program
  // reducing over the rows loops its clusters over row blocks (register caching only): also at
  // two resident groups an SM, and prefetching the next row block within 128 scalars.
  for (int c = 2; c <= std::min(16, limits.max_cluster_size); c *= 2)
    for (int w : {256, 512, 1024}) {
      if (int64_t(c) * w * policy.vector_elems > 2 * int64_t(pow2_at_least(cols))) continue;
      for (InputCaching caching : {InputCaching::registers, InputCaching::shared})
        for (MergeStrategy merge : {MergeStrategy::staged, MergeStrategy::combine}) {
          if (in.loops_over_rows() && caching != InputCaching::registers) continue;
          PlanRequest r;
          r.ctas_per_program = c, r.workers_per_program = w, r.vector_elems = policy.vector_elems;
          r.programs_per_group = 1, r.caching = caching, r.merge = merge;
          add(choose_plan(in, r, limits));
          if (!in.loops_over_rows()) continue;
          for (int groups : {1, 2})
            for (RowPrefetch prefetch : {RowPrefetch::none, RowPrefetch::next}) {
              r.resident_groups = groups, r.row_prefetch = prefetch;
              if (prefetch == RowPrefetch::next) r.private_budget = 128;
              if (int64_t(groups) * w <= limits.max_threads_per_sm) add(choose_plan(in, r, limits));
            }
        }
    }
  return family;
}

}  // namespace tile
