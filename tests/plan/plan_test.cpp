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
  p.cache_format = CacheFormat::packed;
  EXPECT_EQ(MappingPlan::from_json(p.to_json()), p);
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
            R"({"alignment":"scalar_fallback","barrier_scope":"group","cache_format":"f32","caching":"registers","private_budget":64,)"
            R"("programs_per_group":1,"stripe_unroll":1,"stripes":1,"tail":"predicate","vector_elems":4,)"
            R"("width_mode":"automatic","workers_per_program":256})");
}

TEST(MappingPlan, FullPlanJsonNeedsEveryField) {
  EXPECT_THROW(MappingPlan::from_json(R"({"programs_per_group":1})"), Error);
}

TEST(MappingPlan, RequestFromPartialJson) {
  PlanRequest r = PlanRequest::from_json(R"({"programs_per_group":2,"workers_per_program":256,"width_mode":"exact"})");
  EXPECT_EQ(*r.programs_per_group, 2);
  EXPECT_EQ(*r.workers_per_program, 256);
  EXPECT_FALSE(r.stripes.has_value());
  EXPECT_THROW(PlanRequest::from_json(R"({"width_mode":"exact"})"), Error);
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
