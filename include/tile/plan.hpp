// The mapping plan: how the workers (threads) of a group (thread block) cover rows.
//
// A plan is plain data with every field of the mapping family, listed once in
// TILE_PLAN_FIELDS. From that list come the plan and request structs, the JSON printer and
// parser, the hash, the kernel cache key, the per-field range checks and the loop nest's field
// line, so a field cannot be forgotten in one of them. A printed plan parses back to the same
// plan, and given back as a request it yields the identical kernel (tests/plan/plan_test.cpp).
// PlanRequest holds the fields a caller fixed; the analytic policy fills the rest
// (src/plan/policy.cpp). A plan resolved for a call is validated against that call.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace tile {

// How many workers cooperate on a row: set by the caller ("exact") or derived by the policy.
// It records where the width came from and does not change the kernel.
enum class WidthMode : uint8_t { automatic, exact };
// Where a worker keeps its slice of the input rows between passes: in registers, nowhere (each
// pass reads the row again), or in shared memory, filled by asynchronous copies that hold no
// register while in flight (`shared`).
enum class InputCaching : uint8_t { registers, reread, shared };
// Scope of the barriers a multi-warp program uses for its cross-warp reductions.
enum class BarrierScope : uint8_t { group, program };
// What lanes whose elements lie past the row end (and guard programs past the last row) do:
// `predicate` issues no loads for them; `clamp` loads a clamped in-bounds element and
// discards it, so every lane issues the same loads.
enum class TailHandling : uint8_t { predicate, clamp };
// What an access does when its row start is not aligned to the vector width:
// `scalar_fallback` checks each operand's row at run time and takes scalar accesses for a
// misaligned one; `require` launches only when every row of every operand is aligned and cols
// is a multiple of the vector width, and then generates whole-vector accesses only.
enum class Alignment : uint8_t { scalar_fallback, require };
// Where a row's accesses start: at column 0 (`as_is`: a row whose start is not aligned takes
// scalar accesses under scalar_fallback), or at its first column aligned to the vector width
// (`peel`: the elements before it, fewer than vector_elems, are taken one at a time by the
// program's worker 0, so the rest of the row keeps vector accesses where strides are odd).
enum class RowHead : uint8_t { as_is, peel };
// How a register-cached row slice of 16-bit input is held: converted to fp32 when loaded
// (`f32`, one register an element) or as loaded, two elements a register, converted where
// each pass uses it (`packed`).
enum class CacheFormat : uint8_t { f32, packed };
// How a reduction's per-worker parts become the program's: `combine` folds each worker's
// elements into a monoid state and merges states with the monoid's combine (one merge, any
// caching); `staged` merges each sum or max of the monoid's chunk graph across the program on
// its own (only additions and maxima cross workers, one merge per stage of the graph), which
// needs the row cached in registers.
enum class MergeStrategy : uint8_t { combine, staged };
// When a register-cached program loads the per-column inputs of its output pass (a norm's
// weight and bias): `ahead` of the stores that use them (about 16 scalars ahead on a cluster,
// where they are used); `with_row`, right after the cached row slice, so their latency
// overlaps the reductions' merges instead of the output pass (registers held meanwhile); or
// `once`, before a group's loop over row blocks (grid_limit > 0), kept in registers for every
// row it owns: a worker's columns are the same in every row.
enum class ColumnLoads : uint8_t { ahead, with_row, once };
// Whether the next part of the row loads while the current one is worked on (`next`) or only
// when it starts (`none`). A group looping over row blocks (grid_limit > 0) with its row cached
// in registers loads the next row block's row inputs and per-row inputs (into registers counted
// against private_budget): one row at a time otherwise leaves no load in flight during the
// merges and the stores. A re-read loop (caching `reread`) loads the next iteration's stripes
// before working on its own, so its loads stay in flight through the arithmetic.
enum class RowPrefetch : uint8_t { none, next };

// type, name, default, smallest, largest (integers), what it sets
#define TILE_PLAN_FIELDS(X)                                                                          \
  X(int, programs_per_group, 1, 1, 1024, "rows packed into one group (thread block)")               \
  X(int, workers_per_program, 256, 1, 1024, "cooperating width: 1..16 (sub-warp) or a multiple of 32") \
  X(int, ctas_per_program, 1, 1, 16, "groups of one cluster that share each program's row")         \
  X(WidthMode, width_mode, WidthMode::automatic, 0, 1, "where the width came from")                 \
  X(int, vector_elems, 4, 1, 8, "consecutive elements per worker per access")                       \
  X(int, stripes, 1, 1, 2147483647, "passes of all workers over the row")                           \
  X(int, stripe_unroll, 1, 1, 16, "stripes in flight per loop iteration (re-read loops)")          \
  X(InputCaching, caching, InputCaching::registers, 0, 2, "where row input stays between passes")  \
  X(int, private_budget, 64, 1, 255, "cached scalars per worker")                                   \
  X(BarrierScope, barrier_scope, BarrierScope::group, 0, 1, "scope of cross-warp barriers")         \
  X(TailHandling, tail, TailHandling::predicate, 0, 1, "lanes past the row end")                    \
  X(Alignment, alignment, Alignment::scalar_fallback, 0, 1, "vector accesses on unaligned rows")    \
  X(CacheFormat, cache_format, CacheFormat::f32, 0, 1, "register cache of 16-bit input")            \
  X(RowHead, row_head, RowHead::as_is, 0, 1, "elements before the row's first aligned column")       \
  X(MergeStrategy, merge, MergeStrategy::combine, 0, 1, "how reductions merge across workers")      \
  X(ColumnLoads, column_loads, ColumnLoads::ahead, 0, 2, "when a cached row's output pass loads per-column inputs") \
  X(RowPrefetch, row_prefetch, RowPrefetch::none, 0, 1, "loads of the next row block (or re-read iteration) while the current one runs") \
  X(int, resident_groups, 1, 1, 32, "groups per SM the kernel is compiled to fit (launch bounds)")  \
  X(int, grid_limit, 0, 0, 1 << 30, "most row blocks launched (groups, or clusters); each loops over rows (0: one per row block)") \
  X(int, finish_workers, 256, 32, 1024, "workers per group of the second phase of reductions over the rows")

struct MappingPlan {
#define TILE_PLAN_MEMBER(type, name, def, lo, hi, doc) type name = def;
  TILE_PLAN_FIELDS(TILE_PLAN_MEMBER)
#undef TILE_PLAN_MEMBER

  int threads_per_group() const { return programs_per_group * workers_per_program; }
  // Workers of one row: the program's width in each of the ctas_per_program groups it spans.
  int64_t row_workers() const { return int64_t(ctas_per_program) * workers_per_program; }
  int64_t elems_per_stripe() const { return row_workers() * vector_elems; }

  std::string to_json() const;                       // canonical: sorted keys, no spaces
  static MappingPlan from_json(const std::string&);  // every field; throws tile::Error naming it
  std::string hash() const;                          // SHA-256 hex of to_json()
  // Appends every field's value to `key` (a compact cache key, no JSON on the launch path).
  void append_key(std::string& key) const;
  std::string loop_nest() const;                     // human-readable pseudo loop nest
  bool operator==(const MappingPlan&) const = default;
};

// Fields a caller fixes; unset fields are chosen by the analytic policy. A full plan given
// back as a request (PlanRequest::exactly, or its JSON) reproduces it exactly.
struct PlanRequest {
#define TILE_PLAN_MEMBER(type, name, def, lo, hi, doc) std::optional<type> name;
  TILE_PLAN_FIELDS(TILE_PLAN_MEMBER)
#undef TILE_PLAN_MEMBER

  static PlanRequest exactly(const MappingPlan& plan);  // every field fixed
  // A subset of the plan's fields. Errors name `op` and its `argument` ("softmax: argument
  // 'plan.stripes'"), or by default the mapping plan and the field.
  static PlanRequest from_json(const std::string& text, const std::string& op = "mapping plan",
                               const std::string& argument = "");
  std::string to_json() const;                          // the fixed fields only
  void append_key(std::string& key) const;              // each field, set or not, as raw bytes
  bool operator==(const PlanRequest&) const = default;
};

// One plan field, for generic tools (documentation, the CLI's help, the fuzz).
struct PlanFieldInfo {
  std::string name;
  bool is_enum;
  int64_t lo, hi;                    // integers: the accepted range
  std::vector<std::string> values;   // enums: the accepted names, in enum order
  std::string doc;
};
const std::vector<PlanFieldInfo>& plan_fields();

std::string to_string(WidthMode);
std::string to_string(InputCaching);
std::string to_string(BarrierScope);
std::string to_string(TailHandling);
std::string to_string(Alignment);
std::string to_string(CacheFormat);
std::string to_string(RowHead);
std::string to_string(MergeStrategy);
std::string to_string(ColumnLoads);
std::string to_string(RowPrefetch);

}  // namespace tile
