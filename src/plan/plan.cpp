// Everything per plan field comes from TILE_PLAN_FIELDS (include/tile/plan.hpp): JSON in and
// out, the cache key, the range checks and the field list of the loop nest.
#include "tile/plan.hpp"

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>
#include <sstream>
#include <type_traits>

#include "core/sha256.hpp"
#include "core/text.hpp"
#include "tile/error.hpp"

namespace tile {

using nlohmann::json;

std::string to_string(WidthMode v) { return v == WidthMode::exact ? "exact" : "automatic"; }
std::string to_string(InputCaching v) {
  return v == InputCaching::registers ? "registers" : v == InputCaching::shared ? "shared" : "reread";
}
std::string to_string(BarrierScope v) { return v == BarrierScope::group ? "group" : "program"; }
std::string to_string(TailHandling v) { return v == TailHandling::predicate ? "predicate" : "clamp"; }
std::string to_string(Alignment v) { return v == Alignment::require ? "require" : "scalar_fallback"; }
std::string to_string(CacheFormat v) { return v == CacheFormat::packed ? "packed" : "f32"; }
std::string to_string(RowHead v) { return v == RowHead::peel ? "peel" : "as_is"; }
std::string to_string(MergeStrategy v) { return v == MergeStrategy::staged ? "staged" : "combine"; }
std::string to_string(ColumnLoads v) {
  return v == ColumnLoads::with_row ? "with_row" : v == ColumnLoads::once ? "once" : "ahead";
}
std::string to_string(RowPrefetch v) { return v == RowPrefetch::next ? "next" : "none"; }

namespace {

// A plan enum's values are 0 .. its field's largest, each named by to_string.
template <typename T>
constexpr bool kIsEnum = std::is_enum_v<T>;

template <typename T>
std::vector<std::string> enum_names(int64_t hi) {
  std::vector<std::string> names;
  if constexpr (kIsEnum<T>)
    for (int64_t v = 0; v <= hi; ++v) names.push_back(to_string(T(v)));
  return names;
}

// "a" or "b"; "a", "b" or "c".
std::string quoted_choice(const std::vector<std::string>& names) {
  std::string text;
  for (size_t i = 0; i < names.size(); ++i)
    text += (i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") + ("\"" + names[i] + "\"");
  return text;
}

template <typename T>
json to_json_value(T v) {
  if constexpr (kIsEnum<T>)
    return to_string(v);
  else
    return v;
}

// A value of the plan as an error message shows it (printable: escaped, at most 120 bytes).
std::string shown(const json& j) { return printable(j.dump()); }

// Who reads the plan text, as its errors name it: `op`'s argument `argument` (its fields
// `argument.field`), or the mapping plan itself (fields by their names, the text as 'json').
struct PlanText {
  std::string op;
  std::string argument;
  std::string field(const char* name) const { return argument.empty() ? name : argument + "." + name; }
  std::string whole() const { return argument.empty() ? "json" : argument; }
};

template <typename T>
T parse_value(const json& j, const char* name, int64_t lo, int64_t hi, const PlanText& from) {
  const std::string field = from.field(name);
  if constexpr (kIsEnum<T>) {
    if (j.is_string())
      for (int64_t v = lo; v <= hi; ++v)
        if (to_string(T(v)) == j.get<std::string>()) return T(v);
    throw_argument_error(from.op, field, quoted_choice(enum_names<T>(hi)), shown(j));
  } else {
    const std::string range = "an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
    // A float beyond the range (1e30, 2^64) is out of range first; one inside it is not an integer.
    if (j.is_number_float() && !(j.get<double>() >= double(lo) && j.get<double>() <= double(hi)))
      throw_argument_error(from.op, field, range, shown(j));
    if (!j.is_number_integer()) throw_argument_error(from.op, field, "an integer", shown(j));
    // Unsigned values beyond int64 would wrap in get<int64_t>(); they are out of range anyway.
    if (j.is_number_unsigned() && j.get<uint64_t>() > uint64_t(hi)) throw_argument_error(from.op, field, range, shown(j));
    const int64_t v = j.get<int64_t>();
    if (v < lo || v > hi) throw_argument_error(from.op, field, range, shown(j));
    return T(v);
  }
}

json parse_object(const std::string& text, const PlanText& from) {
  if (text.find('\0') != std::string::npos)
    throw_argument_error(from.op, from.whole(), "a JSON object without NUL bytes",
                         "a NUL byte at offset " + std::to_string(text.find('\0')) + " of " + std::to_string(text.size()));
  // A plan is one flat object. Nesting deeper than a few levels is refused while parsing (text
  // nested 100,000 deep once overflowed the stack echoing it), and so is a repeated field,
  // which would otherwise keep its last value silently.
  constexpr int kMaxDepth = 8;
  std::vector<std::string> keys;
  const json::parser_callback_t check = [&](int depth, json::parse_event_t event, json& parsed) {
    if (depth > kMaxDepth)
      throw_argument_error(from.op, from.whole(), "a JSON object of fields", "text nested more than " +
                                                                                  std::to_string(kMaxDepth) + " levels deep");
    if (event == json::parse_event_t::key && depth == 1) {
      const std::string key = parsed.get<std::string>();
      if (std::find(keys.begin(), keys.end(), key) != keys.end())
        throw_argument_error(from.op, from.field(printable(key).c_str()), "a field given once", "it twice");
      keys.push_back(key);
    }
    return true;
  };
  json j;
  try {
    j = json::parse(text, check);
  } catch (const json::exception& e) {
    throw_argument_error(from.op, from.whole(), "a JSON object", "'" + printable(text) + "' (" + e.what() + ")");
  }
  if (!j.is_object()) throw_argument_error(from.op, from.whole(), "a JSON object", shown(j));
  for (auto& [key, value] : j.items()) {
    bool known = false;
    for (const PlanFieldInfo& f : plan_fields()) known |= key == f.name;
    if (!known) throw_argument_error(from.op, from.field(printable(key).c_str()), "a known plan field", "an unknown field");
  }
  return j;
}

}  // namespace

const std::vector<PlanFieldInfo>& plan_fields() {
  static const std::vector<PlanFieldInfo> fields = {
#define TILE_PLAN_INFO(type, name, def, lo, hi, doc) {#name, kIsEnum<type>, lo, hi, enum_names<type>(hi), doc},
      TILE_PLAN_FIELDS(TILE_PLAN_INFO)
#undef TILE_PLAN_INFO
  };
  return fields;
}

std::string MappingPlan::to_json() const {
  json j;
#define TILE_PLAN_PUT(type, name, def, lo, hi, doc) j[#name] = to_json_value(name);
  TILE_PLAN_FIELDS(TILE_PLAN_PUT)
#undef TILE_PLAN_PUT
  return j.dump();  // keys sorted: the text is canonical and hashes stably
}

std::string PlanRequest::to_json() const {
  json j = json::object();
#define TILE_PLAN_PUT(type, name, def, lo, hi, doc) \
  if (name) j[#name] = to_json_value(*name);
  TILE_PLAN_FIELDS(TILE_PLAN_PUT)
#undef TILE_PLAN_PUT
  return j.dump();
}

PlanRequest PlanRequest::from_json(const std::string& text, const std::string& op, const std::string& argument) {
  const PlanText from{op, argument};
  const json j = parse_object(text, from);
  PlanRequest r;
#define TILE_PLAN_GET(type, name, def, lo, hi, doc) \
  if (j.contains(#name)) r.name = parse_value<type>(j[#name], #name, lo, hi, from);
  TILE_PLAN_FIELDS(TILE_PLAN_GET)
#undef TILE_PLAN_GET
  if (r.width_mode == WidthMode::exact && !r.workers_per_program)
    throw_argument_error(op, from.field("workers_per_program"), "a width when width_mode is \"exact\"", "no width");
  return r;
}

MappingPlan MappingPlan::from_json(const std::string& text) {
  const PlanText from{"mapping plan", ""};
  const json j = parse_object(text, from);
  MappingPlan p;
#define TILE_PLAN_GET(type, name, def, lo, hi, doc)                                                      \
  if (!j.contains(#name)) throw_argument_error(from.op, #name, "the field to be present", "a plan without it"); \
  p.name = parse_value<type>(j[#name], #name, lo, hi, from);
  TILE_PLAN_FIELDS(TILE_PLAN_GET)
#undef TILE_PLAN_GET
  return p;
}

PlanRequest PlanRequest::exactly(const MappingPlan& p) {
  PlanRequest r;
#define TILE_PLAN_SET(type, name, def, lo, hi, doc) r.name = p.name;
  TILE_PLAN_FIELDS(TILE_PLAN_SET)
#undef TILE_PLAN_SET
  return r;
}

std::string MappingPlan::hash() const { return sha256_hex(to_json()); }

void MappingPlan::append_key(std::string& key) const {
  // Every field as 4 raw bytes: no formatting on the launch path.
#define TILE_PLAN_KEY(type, name, def, lo, hi, doc)                 \
  {                                                                 \
    const int32_t v = int32_t(name);                                \
    key.append(reinterpret_cast<const char*>(&v), sizeof v);        \
  }
  TILE_PLAN_FIELDS(TILE_PLAN_KEY)
#undef TILE_PLAN_KEY
}

void PlanRequest::append_key(std::string& key) const {
  // A flag byte, then the value's 4 bytes where the field is set; one append.
#define TILE_COUNT_FIELD(type, name, def, lo, hi, doc) +1
  constexpr size_t kFields = 0 TILE_PLAN_FIELDS(TILE_COUNT_FIELD);
#undef TILE_COUNT_FIELD
  char bytes[5 * kFields];
  size_t n = 0;
#define TILE_REQUEST_KEY(type, name, def, lo, hi, doc) \
  bytes[n++] = name ? '+' : '-';                       \
  if (name) {                                          \
    const int32_t v = int32_t(*name);                  \
    std::memcpy(bytes + n, &v, sizeof v);              \
    n += sizeof v;                                     \
  }
  TILE_PLAN_FIELDS(TILE_REQUEST_KEY)
#undef TILE_REQUEST_KEY
  key.append(bytes, n);
}

std::string MappingPlan::loop_nest() const {
  std::ostringstream os;
  const int warps = workers_per_program / 32;
  const bool loops = grid_limit > 0;
  os << "for group in grid" << (loops ? " (at most " + std::to_string(grid_limit) + " groups)" : "") << ":"
     << std::string(loops ? 6 : 23, ' ') << "// " << threads_per_group() << " threads, " << resident_groups
     << " resident per SM\n";
  const std::string in = loops ? "  " : "";
  if (loops)
    os << "  for block in group, group + grid, ...:    // row blocks this group owns"
       << (column_loads == ColumnLoads::once ? "; per-column inputs loaded once before" : "")
       << (row_prefetch == RowPrefetch::next ? "; the next block's rows loaded during this one" : "") << "\n";
  os << in << "  parallel program in 0.." << programs_per_group << ":       // row = block * " << programs_per_group
     << " + program\n";
  if (ctas_per_program > 1)
    os << in << "   parallel cta in 0.." << ctas_per_program << ":          // groups of one cluster share the row\n";
  os << in << "    parallel worker in 0.." << workers_per_program << ":      // "
     << (warps > 0 ? std::to_string(warps) + " warp(s)" : "sub-warp program") << ", width " << to_string(width_mode)
     << "\n";
  if (caching == InputCaching::registers) {
    os << in << "      for stripe in 0.." << stripes << " (unrolled):    // row cached in " << stripes * vector_elems
       << " of " << private_budget << " private scalars per row input"
       << (column_loads == ColumnLoads::with_row ? "; per-column inputs loaded with it" : "") << "\n";
  } else if (caching == InputCaching::shared) {
    os << in << "      for stripe in 0.." << stripes << " (unrolled):    // row staged in shared memory, "
       << stripes * vector_elems << " elements a worker per row input, copied once and read back each pass\n";
  } else {
    os << in << "      for pass in reduction levels + output:   // input re-read each pass\n"
       << in << "        for stripe in 0..ceil(cols/" << elems_per_stripe() << ") step " << stripe_unroll << ":\n";
  }
  os << in << "        access " << vector_elems << " consecutive elements at ((stripe * " << row_workers()
     << (ctas_per_program > 1 ? " + cta * " + std::to_string(workers_per_program) : std::string()) << " + worker) * "
     << vector_elems << ")   // tail: " << to_string(tail) << ", alignment: " << to_string(alignment)
     << (caching == InputCaching::registers ? ", cache format: " + to_string(cache_format) : "") << "\n"
     << in << "      reductions over the row (" << to_string(merge) << "): per worker, warp shuffles"
     << (workers_per_program > 32 ? ", shared memory and a " + to_string(barrier_scope) + "-scope barrier" : "")
     << (ctas_per_program > 1 ? ", then every warp's partials pushed into each group's exchange region of the cluster"
                              : "")
     << "\n";
  if (loops) os << "  reductions over the rows: per group in registers/shared memory, then a second kernel\n";
  return os.str();
}

}  // namespace tile
