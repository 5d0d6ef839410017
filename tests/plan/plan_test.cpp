#include "tile/plan.hpp"

#include <gtest/gtest.h>

#include <functional>

#include "core/sha256.hpp"
#include "tile/error.hpp"
#include "tile/policy.hpp"
#include "support/error_of.hpp"

namespace tile {
namespace {

TEST(MappingPlan, JsonRoundTripsEveryField) {
  MappingPlan p;
  p.programs_per_group = 3, p.workers_per_program = 96, p.width_mode = WidthMode::exact, p.vector_elems = 2;
  p.stripes = 5, p.stripe_unroll = 2, p.caching = InputCaching::reread, p.private_budget = 40;
  p.barrier_scope = BarrierScope::program, p.tail = TailHandling::clamp, p.alignment = Alignment::require;
  p.cache_format = CacheFormat::packed, p.resident_groups = 2, p.grid_limit = 264, p.row_head = RowHead::peel;
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
  EXPECT_EQ(
      a.to_json(),
      R"({"alignment":"scalar_fallback","barrier_scope":"group","cache_format":"f32","caching":"registers","column_loads":"ahead",")"
      R"(ctas_per_program":1,"finish_workers":256,"grid_limit":0,"merge":"combine",)"
      R"("private_budget":64,"programs_per_group":1,"resident_groups":1,"row_head":"as_is","row_prefetch":"none","stripe_unroll":1,"stripes":1,"tail":"predicate",)"
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
  EXPECT_EQ(plan_fields().size(), 20u);
}

using tile::testing::error_of;

PlanInputs inputs(DType dt, int64_t rows, int64_t cols, int64_t stride, int64_t alignment, bool columns) {
  PlanInputs in = PlanInputs::for_rows(dt, dt, rows, cols, stride, stride);
  if (columns) in.column_dtypes = {DType::f32};
  in.base_alignment = alignment;
  return in;
}

// Every plan a caller can print (the policy's over a sweep of calls, every plan of the mapping
// family) given back as a request resolves to itself: the same plan, the same JSON.
TEST(MappingPlan, EveryResolvedPlanGivenBackResolvesToItself) {
  int checked = 0;
  for (bool columns : {false, true})
    for (DType dt : {DType::f32, DType::bf16})
      for (int64_t rows : {1, 7, 300, 100000})
        for (int64_t cols : {1, 3, 8, 31, 100, 1537, 4096, 8192, 10000, 40000, 262144})
          for (int64_t pad : {0, 1, 8})
            for (int64_t alignment : {16, 2}) {
              const PlanInputs in = inputs(dt, rows, cols, cols + pad, alignment, columns);
              std::vector<MappingPlan> plans = {choose_plan(in, {})};
              if (rows != 300 && cols <= 10000 && pad == 0) plans = mapping_family(in);
              for (const MappingPlan& p : plans) {
                const PlanRequest given = PlanRequest::from_json(p.to_json());
                EXPECT_EQ(choose_plan(in, given), p) << p.to_json();
                EXPECT_EQ(choose_plan(in, PlanRequest::exactly(p)), p) << p.to_json();
                EXPECT_EQ(MappingPlan::from_json(p.to_json()), p);
                ++checked;
              }
            }
  EXPECT_GT(checked, 5000);
}

TEST(MappingPlan, WidthModeRecordsWhereTheWidthCameFrom) {
  const PlanInputs in = inputs(DType::f32, 64, 1000, 1000, 16, false);
  PlanRequest r = PlanRequest::from_json(R"({"workers_per_program":64})");
  EXPECT_EQ(choose_plan(in, r).width_mode, WidthMode::exact);
  r = PlanRequest::from_json(R"({"workers_per_program":64,"width_mode":"automatic"})");  // a plan given back
  EXPECT_EQ(choose_plan(in, r).workers_per_program, 64);
  EXPECT_EQ(choose_plan(in, r).width_mode, WidthMode::automatic);
  r = PlanRequest::from_json(R"({"width_mode":"automatic"})");
  EXPECT_EQ(choose_plan(in, r), choose_plan(in, {}));
  // "exact" needs the width it calls exact, from JSON and from C++ alike.
  EXPECT_NE(error_of([] { PlanRequest::from_json(R"({"width_mode":"exact"})"); })
                .find("mapping plan: argument 'workers_per_program': expected a width when width_mode is \"exact\", "
                      "got no width"),
            std::string::npos);
  PlanRequest exact_without_width;
  exact_without_width.width_mode = WidthMode::exact;
  EXPECT_NE(error_of([&] { choose_plan(in, exact_without_width); }).find("'workers_per_program'"), std::string::npos);
}

TEST(MappingPlanErrors, PlanTextIsReadWholeOrRefused) {
  // The JSON parser stops at a NUL byte; what follows it must not be silently dropped.
  const std::string text("{\"stripes\":1}\0{\"garbage\"", 25);
  EXPECT_EQ(
      error_of([&] { PlanRequest::from_json(text); }),
      "mapping plan: argument 'json': expected a JSON object without NUL bytes, got a NUL byte at offset 13 of 25");
  EXPECT_NE(error_of([&] { MappingPlan::from_json(MappingPlan{}.to_json() + std::string(1, '\0')); }).find("NUL"),
            std::string::npos);
}

// A plan is one flat object: text nested deeper than eight levels is refused as it is parsed (at
// 100,000 levels echoing it overflowed the stack), a field given twice is refused rather than
// its last value kept, and an error shows at most 120 characters of what it was given.
TEST(MappingPlanErrors, PlanTextIsFlatWithEachFieldOnce) {
  for (const std::string& text : {std::string(100000, '[') + std::string(100000, ']'),
                                  "{\"stripes\":" + std::string(100000, '[') + std::string(100000, ']') + "}"})
    EXPECT_EQ(error_of([&] { PlanRequest::from_json(text); }),
              "mapping plan: argument 'json': expected a JSON object of fields, got text nested more than 8 levels deep");
  EXPECT_EQ(error_of([&] { PlanRequest::from_json(R"({"programs_per_group":1,"programs_per_group":2})"); }),
            "mapping plan: argument 'programs_per_group': expected a field given once, got it twice");
  EXPECT_EQ(error_of([&] { PlanRequest::from_json("{\"stripes\":\"" + std::string(1000, 'a') + "\"}"); }),
            "mapping plan: argument 'stripes': expected an integer, got \"" + std::string(119, 'a') + "... (1002 bytes)");
  // A field name holding a NUL (a JSON escape) is shown escaped, not cut at the NUL.
  EXPECT_EQ(error_of([&] { PlanRequest::from_json(R"({"stripes\u0000x":1})"); }),
            "mapping plan: argument 'stripes\\x00x': expected a known plan field, got an unknown field");
  EXPECT_EQ(error_of([&] { PlanRequest::from_json(R"({"a\u0000":1,"a\u0000":2})"); }),
            "mapping plan: argument 'a\\x00': expected a field given once, got it twice");
  EXPECT_EQ(error_of([&] { PlanRequest::from_json(R"({"stripes":[[1]]})"); }),
            "mapping plan: argument 'stripes': expected an integer, got [[1]]");
}

// Read as an operator's argument, the same errors name the operator and the argument's fields.
TEST(MappingPlanErrors, PlanTextReadForAnOperatorNamesItsArgument) {
  EXPECT_EQ(error_of([] { PlanRequest::from_json("[1]", "softmax", "plan"); }),
            "softmax: argument 'plan': expected a JSON object, got [1]");
  EXPECT_EQ(error_of([] { PlanRequest::from_json(R"({"stripes":0})", "rms_norm_backward", "plan"); }),
            "rms_norm_backward: argument 'plan.stripes': expected an integer in [1, 2147483647], got 0");
  EXPECT_EQ(error_of([] { PlanRequest::from_json(R"({"merge":"late"})", "softmax", "plan"); }),
            "softmax: argument 'plan.merge': expected \"combine\" or \"staged\", got \"late\"");
  EXPECT_EQ(error_of([] { PlanRequest::from_json(R"({"bogus":1})", "layer_norm", "plan"); }),
            "layer_norm: argument 'plan.bogus': expected a known plan field, got an unknown field");
  EXPECT_EQ(error_of([] { PlanRequest::from_json(R"({"width_mode":"exact"})", "softmax", "plan"); }),
            "softmax: argument 'plan.workers_per_program': expected a width when width_mode is \"exact\", got no width");
}

TEST(MappingPlanErrors, IntegerFieldsAreInOneToIntMax) {
  EXPECT_EQ(*PlanRequest::from_json(R"({"stripes":1})").stripes, 1);
  EXPECT_EQ(*PlanRequest::from_json(R"({"stripes":2147483647})").stripes, 2147483647);
  for (const char* bad : {"0", "-1", "2147483648", "18446744073709551615", "18446744073709551616", "1e30"})
    EXPECT_EQ(error_of([&] {
                PlanRequest::from_json(std::string(R"({"stripes":)") + bad + "}");
              }).find("mapping plan: argument 'stripes': expected an integer in [1, 2147483647], got "),
              0u)
        << bad;
  for (const char* bad : {"1.5", "2.0", "true", "null", "\"2\"", "[2]"})
    EXPECT_EQ(error_of([&] {
                PlanRequest::from_json(std::string(R"({"stripes":)") + bad + "}");
              }).find("mapping plan: argument 'stripes': expected an integer, got "),
              0u)
        << bad;
}

TEST(MappingPlanErrors, RequestsOutOfRangeAreRefusedBeforeThePolicyDividesByThem) {
  const PlanInputs in = inputs(DType::f32, 64, 1000, 1000, 16, false);
  for (int v : {0, -4}) {
    PlanRequest r;
    r.vector_elems = v;
    EXPECT_EQ(
        error_of([&] { choose_plan(in, r); }),
        "mapping plan: argument 'vector_elems': expected an integer in [1, 2147483647], got " + std::to_string(v));
    r = {};
    r.workers_per_program = v;
    EXPECT_NE(error_of([&] { choose_plan(in, r); }).find("'workers_per_program'"), std::string::npos);
    r = {};
    r.stripe_unroll = v;
    EXPECT_NE(error_of([&] { choose_plan(in, r); }).find("'stripe_unroll'"), std::string::npos);
  }
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
