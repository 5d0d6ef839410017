#include "tile/plan.hpp"

#include <gtest/gtest.h>

#include "core/sha256.hpp"
#include "tile/error.hpp"

namespace tile {
namespace {

TEST(MappingPlan, JsonRoundTripsEveryField) {
  MappingPlan p;
  p.programs_per_group = 3, p.workers_per_program = 96, p.width_mode = WidthMode::exact, p.vector_elems = 2;
  p.stripes = 5, p.stripe_unroll = 2, p.caching = InputCaching::reread, p.private_budget = 40;
  p.barrier_scope = BarrierScope::program, p.tail = TailHandling::clamp, p.alignment = Alignment::require;
  p.cache_format = CacheFormat::packed, p.resident_groups = 2, p.grid_limit = 264;
  EXPECT_EQ(MappingPlan::from_json(p.to_json()), p);
  // Given back as a request, the plan is reproduced field for field.
  PlanRequest r = PlanRequest::from_json(p.to_json());
  EXPECT_EQ(r, PlanRequest::exactly(p));
  EXPECT_EQ(PlanRequest::from_json(r.to_json()), r);
  EXPECT_EQ(MappingPlan::from_json(MappingPlan{}.to_json()), MappingPlan{});
}

TEST(MappingPlan, HashIsTheSha256OfTheCanonicalJson) {
  MappingPlan a, b;
  EXPECT_EQ(a.hash(), b.hash());
  EXPECT_EQ(a.hash(), sha256_hex(a.to_json()));
  b.programs_per_group = 2;
  EXPECT_NE(a.hash(), b.hash());
  // The canonical text has sorted keys and no spaces, so the hash is stable across builds.
  EXPECT_EQ(a.to_json(),
            R"({"alignment":"scalar_fallback","barrier_scope":"group","cache_format":"f32","caching":"registers","grid_limit":0,)"
            R"("private_budget":64,"programs_per_group":1,"resident_groups":1,"stripe_unroll":1,"stripes":1,"tail":"predicate",)"
            R"("vector_elems":4,"width_mode":"automatic","workers_per_program":256})");
}

TEST(MappingPlan, FullPlanJsonNeedsEveryField) {
  EXPECT_THROW(MappingPlan::from_json(R"({"programs_per_group":1})"), Error);
}

TEST(MappingPlan, RequestFromPartialJson) {
  PlanRequest r = PlanRequest::from_json(R"({"programs_per_group":2,"workers_per_program":256,"width_mode":"exact"})");
  EXPECT_EQ(*r.programs_per_group, 2);
  EXPECT_EQ(*r.workers_per_program, 256);
  EXPECT_FALSE(r.stripes.has_value());
  // "exact" records a width the caller fixed: without one it is a contradiction. "automatic"
  // with a width is what a printed plan says of a width the policy chose; it is accepted so the
  // plan round-trips.
  EXPECT_THROW(PlanRequest::from_json(R"({"width_mode":"exact"})"), Error);
  EXPECT_EQ(*PlanRequest::from_json(R"({"width_mode":"automatic","workers_per_program":64})").width_mode, WidthMode::automatic);
}

TEST(MappingPlan, EveryFieldIsInTheTable) {
  // The field table drives JSON, the key and the range checks: each field's range is enforced.
  for (const PlanFieldInfo& f : plan_fields()) {
    if (f.is_enum) {
      EXPECT_THROW(PlanRequest::from_json("{\"" + f.name + "\":\"bogus\"}"), Error) << f.name;
      for (const std::string& v : f.values)
        EXPECT_NO_THROW(PlanRequest::from_json("{\"workers_per_program\":64,\"" + f.name + "\":\"" + v + "\"}")) << f.name;
    } else {
      EXPECT_THROW(PlanRequest::from_json("{\"" + f.name + "\":" + std::to_string(f.hi + 1) + "}"), Error) << f.name;
      EXPECT_THROW(PlanRequest::from_json("{\"" + f.name + "\":" + std::to_string(f.lo - 1) + "}"), Error) << f.name;
      EXPECT_NO_THROW(PlanRequest::from_json("{\"" + f.name + "\":" + std::to_string(f.lo) + "}")) << f.name;
    }
  }
  EXPECT_EQ(plan_fields().size(), 14u);
}

TEST(MappingPlan, LoopNestNamesTheMapping) {
  MappingPlan p;
  p.programs_per_group = 2;
  std::string nest = p.loop_nest();
  EXPECT_NE(nest.find("512 threads"), std::string::npos) << nest;
  EXPECT_NE(nest.find("8 warp(s)"), std::string::npos) << nest;
}

}  // namespace
}  // namespace tile
