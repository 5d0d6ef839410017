#include <cmath>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/sha256.hpp"
#include "tile/error.hpp"
#include "tile/plan.hpp"

namespace tile {

using nlohmann::json;

std::string to_string(WidthMode v) { return v == WidthMode::exact ? "exact" : "automatic"; }
std::string to_string(InputCaching v) { return v == InputCaching::registers ? "registers" : "reread"; }
std::string to_string(BarrierScope v) { return v == BarrierScope::group ? "group" : "program"; }
std::string to_string(TailHandling v) { return v == TailHandling::predicate ? "predicate" : "clamp"; }
std::string to_string(Alignment v) { return v == Alignment::require ? "require" : "scalar_fallback"; }
std::string to_string(CacheFormat v) { return v == CacheFormat::packed ? "packed" : "f32"; }

namespace {

template <typename E>
E parse_enum(const json& j, const char* field, std::initializer_list<E> values) {
  std::string allowed;
  if (j.is_string()) {
    for (E v : values)
      if (to_string(v) == j.get<std::string>()) return v;
  }
  for (E v : values) allowed += (allowed.empty() ? "" : " or ") + ("\"" + to_string(v) + "\"");
  throw_argument_error("mapping plan", field, allowed, j.dump());
}

// Any positive int: every value a plan holds parses back (validate_plan bounds each field).
constexpr int64_t kMaxField = INT32_MAX;

int parse_int(const json& j, const char* field) {
  // An integer beyond 64 bits parses as a float: out of range rather than "not an integer".
  const bool huge = j.is_number_float() && std::abs(j.get<double>()) >= 0x1p63;
  if (!j.is_number_integer() && !huge) throw_argument_error("mapping plan", field, "an integer", j.dump());
  const bool in_range = !huge && (j.is_number_unsigned() ? j.get<uint64_t>() - 1 < uint64_t(kMaxField)
                                                         : j.get<int64_t>() >= 1 && j.get<int64_t>() <= kMaxField);
  if (!in_range) throw_argument_error("mapping plan", field, "an integer in [1, 2147483647]", j.dump());
  return int(j.get<int64_t>());
}

const char* kFields[] = {"programs_per_group", "workers_per_program", "width_mode",
                         "vector_elems",       "stripes",             "stripe_unroll",
                         "caching",            "private_budget",      "barrier_scope",
                         "tail",               "alignment",           "cache_format"};

json parse_object(const std::string& text) {
  // The parser stops at a NUL byte: reject it rather than ignore what follows.
  if (size_t nul = text.find('\0'); nul != std::string::npos)
    throw_argument_error("mapping plan", "json", "a JSON object without NUL bytes",
                         "a NUL byte at offset " + std::to_string(nul) + " of " + std::to_string(text.size()));
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    throw_argument_error("mapping plan", "json", "a JSON object", std::string("'") + text + "' (" + e.what() + ")");
  }
  if (!j.is_object()) throw_argument_error("mapping plan", "json", "a JSON object", j.dump());
  for (auto& [key, value] : j.items()) {
    bool known = false;
    for (const char* f : kFields) known |= key == f;
    if (!known) throw_argument_error("mapping plan", key, "a known plan field", "an unknown field");
  }
  return j;
}

}  // namespace

std::string MappingPlan::to_json() const {
  json j = {{"programs_per_group", programs_per_group},
            {"workers_per_program", workers_per_program},
            {"width_mode", to_string(width_mode)},
            {"vector_elems", vector_elems},
            {"stripes", stripes},
            {"stripe_unroll", stripe_unroll},
            {"caching", to_string(caching)},
            {"private_budget", private_budget},
            {"barrier_scope", to_string(barrier_scope)},
            {"tail", to_string(tail)},
            {"alignment", to_string(alignment)},
            {"cache_format", to_string(cache_format)}};
  return j.dump();  // keys sorted: the text is canonical and hashes stably
}

namespace {
// The fields of a parsed plan object except width_mode, which request and full plan treat apart.
PlanRequest request_fields(const json& j) {
  PlanRequest r;
  if (j.contains("programs_per_group")) r.programs_per_group = parse_int(j["programs_per_group"], "programs_per_group");
  if (j.contains("workers_per_program")) r.workers_per_program = parse_int(j["workers_per_program"], "workers_per_program");
  if (j.contains("vector_elems")) r.vector_elems = parse_int(j["vector_elems"], "vector_elems");
  if (j.contains("stripes")) r.stripes = parse_int(j["stripes"], "stripes");
  if (j.contains("stripe_unroll")) r.stripe_unroll = parse_int(j["stripe_unroll"], "stripe_unroll");
  if (j.contains("private_budget")) r.private_budget = parse_int(j["private_budget"], "private_budget");
  if (j.contains("caching"))
    r.caching = parse_enum(j["caching"], "caching", {InputCaching::registers, InputCaching::reread});
  if (j.contains("barrier_scope"))
    r.barrier_scope = parse_enum(j["barrier_scope"], "barrier_scope", {BarrierScope::group, BarrierScope::program});
  if (j.contains("tail"))
    r.tail = parse_enum(j["tail"], "tail", {TailHandling::predicate, TailHandling::clamp});
  if (j.contains("alignment"))
    r.alignment = parse_enum(j["alignment"], "alignment", {Alignment::scalar_fallback, Alignment::require});
  if (j.contains("cache_format"))
    r.cache_format = parse_enum(j["cache_format"], "cache_format", {CacheFormat::f32, CacheFormat::packed});
  return r;
}
}  // namespace

PlanRequest PlanRequest::from_json(const std::string& text) {
  json j = parse_object(text);
  PlanRequest r = request_fields(j);
  if (j.contains("width_mode")) {
    // "automatic" with a width is a resolved plan given back: the width is fixed all the same
    // and the plan keeps its record. "exact" needs the width it says is exact.
    r.width_mode = parse_enum(j["width_mode"], "width_mode", {WidthMode::automatic, WidthMode::exact});
    if (r.width_mode == WidthMode::exact && !r.workers_per_program)
      throw_argument_error("mapping plan", "workers_per_program",
                           "a width when width_mode is \"exact\"", "no width");
  }
  return r;
}

MappingPlan MappingPlan::from_json(const std::string& text) {
  json j = parse_object(text);
  for (const char* f : kFields)
    if (!j.contains(f)) throw_argument_error("mapping plan", f, "the field to be present", "a plan without it");
  const PlanRequest r = request_fields(j);  // width_mode records where the width came from
  MappingPlan p;
  p.programs_per_group = *r.programs_per_group;
  p.workers_per_program = *r.workers_per_program;
  p.width_mode = parse_enum(j["width_mode"], "width_mode", {WidthMode::automatic, WidthMode::exact});
  p.vector_elems = *r.vector_elems;
  p.stripes = *r.stripes;
  p.stripe_unroll = *r.stripe_unroll;
  p.caching = *r.caching;
  p.private_budget = *r.private_budget;
  p.barrier_scope = *r.barrier_scope;
  p.tail = *r.tail;
  p.alignment = *r.alignment;
  p.cache_format = *r.cache_format;
  return p;
}

std::string MappingPlan::hash() const { return sha256_hex(to_json()); }

std::string MappingPlan::loop_nest() const {
  std::ostringstream os;
  int warps = workers_per_program / 32;
  os << "for group in grid:                       // " << threads_per_group() << " threads\n"
     << "  parallel program in 0.." << programs_per_group << ":       // row = group * "
     << programs_per_group << " + program\n"
     << "    parallel worker in 0.." << workers_per_program << ":      // "
     << (warps > 0 ? std::to_string(warps) + " warp(s)" : "sub-warp program") << ", width "
     << to_string(width_mode) << "\n";
  if (caching == InputCaching::registers) {
    os << "      for stripe in 0.." << stripes << " (unrolled):    // row cached in "
       << cached_scalars() << " of " << private_budget << " private scalars\n";
  } else {
    os << "      for pass in reductions + output:   // input re-read each pass\n"
       << "        for stripe in 0..ceil(cols/" << elems_per_stripe() << ") step " << stripe_unroll
       << ":\n";
  }
  os << "        access " << vector_elems << " consecutive elements at ((stripe * "
     << workers_per_program << " + worker) * " << vector_elems << ")   // tail: "
     << to_string(tail) << ", alignment: " << to_string(alignment)
     << (caching == InputCaching::registers ? ", cache format: " + to_string(cache_format) : "") << "\n"
     << "      cross-worker reductions: warp shuffles"
     << (workers_per_program > 32 ? ", shared memory, " + to_string(barrier_scope) + "-scope barrier" : "")
     << "\n";
  return os.str();
}

PlanRequest PlanRequest::exactly(const MappingPlan& p) {
  PlanRequest r;
  r.programs_per_group = p.programs_per_group;
  r.workers_per_program = p.workers_per_program;
  r.width_mode = p.width_mode;
  r.vector_elems = p.vector_elems;
  r.stripes = p.stripes;
  r.stripe_unroll = p.stripe_unroll;
  r.caching = p.caching;
  r.private_budget = p.private_budget;
  r.barrier_scope = p.barrier_scope;
  r.tail = p.tail;
  r.alignment = p.alignment;
  r.cache_format = p.cache_format;
  return r;
}

}  // namespace tile
