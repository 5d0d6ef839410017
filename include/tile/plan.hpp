// The mapping plan: how the workers (threads) of a group (thread block) cover rows.
//
// A plan is plain data with every field of the mapping family. It prints (as JSON and as a
// pseudo loop nest), parses and hashes stably, so a run can record exactly what it launched.
// PlanRequest holds the fields a caller fixed; the analytic policy fills the rest
// (src/plan/policy.cpp). A plan resolved for a call is validated against that call.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace tile {

// How many workers cooperate on a row: set by the caller ("exact") or derived by the policy.
enum class WidthMode : uint8_t { automatic, exact };
// Where a worker keeps its slice of the input row between passes.
enum class InputCaching : uint8_t { registers, reread };
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
// How a register-cached row slice of 16-bit input is held: converted to fp32 when loaded
// (`f32`, one register an element) or as loaded, two elements a register, converted where
// each pass uses it (`packed`).
enum class CacheFormat : uint8_t { f32, packed };

struct MappingPlan {
  int programs_per_group = 1;    // rows packed into one group (thread block)
  int workers_per_program = 256; // cooperating width: 1..16 (sub-warp) or a multiple of 32
  WidthMode width_mode = WidthMode::automatic;
  int vector_elems = 4;          // consecutive elements per worker per access
  int stripes = 1;               // passes of all workers over the row
  int stripe_unroll = 1;         // stripes in flight per loop iteration (re-read loops)
  InputCaching caching = InputCaching::registers;
  int private_budget = 64;       // cached scalars per worker
  BarrierScope barrier_scope = BarrierScope::group;
  TailHandling tail = TailHandling::predicate;
  Alignment alignment = Alignment::scalar_fallback;
  CacheFormat cache_format = CacheFormat::f32;

  int threads_per_group() const { return programs_per_group * workers_per_program; }
  int64_t elems_per_stripe() const { return int64_t(workers_per_program) * vector_elems; }
  int cached_scalars() const { return caching == InputCaching::registers ? stripes * vector_elems : 0; }

  std::string to_json() const;                       // canonical: sorted keys, no spaces
  static MappingPlan from_json(const std::string&);  // throws tile::Error naming the field
  std::string hash() const;                          // SHA-256 hex of to_json()
  std::string loop_nest() const;                     // human-readable pseudo loop nest
  bool operator==(const MappingPlan&) const = default;
};

// Fields a caller fixes; unset fields are chosen by the analytic policy.
struct PlanRequest {
  std::optional<int> programs_per_group;
  std::optional<int> workers_per_program;
  // Where a fixed width is recorded as coming from: exact unless the request says automatic, as
  // a resolved plan given back does (its width was the policy's); the width is fixed either
  // way, so a printed plan given back resolves to the identical plan and kernel.
  std::optional<WidthMode> width_mode;
  std::optional<int> vector_elems;
  std::optional<int> stripes;
  std::optional<int> stripe_unroll;
  std::optional<InputCaching> caching;
  std::optional<int> private_budget;
  std::optional<BarrierScope> barrier_scope;
  std::optional<TailHandling> tail;
  std::optional<Alignment> alignment;
  std::optional<CacheFormat> cache_format;

  // Every field of `plan` fixed, width_mode included: resolves to `plan` itself.
  static PlanRequest exactly(const MappingPlan& plan);
  // A subset of the plan's fields; a full plan's JSON is a request for exactly that plan.
  static PlanRequest from_json(const std::string&);
};

std::string to_string(WidthMode);
std::string to_string(InputCaching);
std::string to_string(BarrierScope);
std::string to_string(TailHandling);
std::string to_string(Alignment);
std::string to_string(CacheFormat);

}  // namespace tile
