// Every bad argument raises tile::Error naming the operator, the argument, what was expected
// and what was given.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <functional>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <type_traits>

#include "api/pipeline.hpp"
#include "bind/bind.hpp"
#include "backend/cpu/executor.hpp"
#include "target/target.hpp"
#include "tile/tile.hpp"
#include "tile/training.hpp"

namespace tile {
namespace {

void expect_error(const Call& call, const PlanRequest& plan, std::vector<std::string> parts) {
  try {
    run(call, {plan, nullptr, Backend::cpu});
    ADD_FAILURE() << "no error; expected one mentioning " << parts[0];
  } catch (const Error& e) {
    for (const std::string& p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what() << "\n  lacks: " << p;
  }
}

struct Buffers {
  std::vector<float> x = std::vector<float>(64 * 100, 1.0f), y = std::vector<float>(64 * 100), w = std::vector<float>(100, 1.0f);
  Call call(Op op) { return Call{op, matrix(x.data(), DType::f32, 64, 100), matrix(y.data(), DType::f32, 64, 100)}; }
};

TEST(ArgumentErrors, NamesOperatorArgumentExpectedAndGiven) {
  Buffers b;
  Call c = b.call(Op::softmax);
  c.x.data = nullptr;
  expect_error(c, {}, {"softmax", "'x'", "non-null", "null"});
  c = b.call(Op::rms_norm);
  c.y.row_stride = 50;
  expect_error(c, {}, {"rms_norm", "'y'", "row_stride >= cols = 100", "50"});
  c = b.call(Op::layer_norm);
  c.x.cols = 0, c.y.cols = 0;
  expect_error(c, {}, {"layer_norm", "'x'", "cols >= 1", "0"});
  c = b.call(Op::softmax);
  c.x.rows = -2;
  expect_error(c, {}, {"softmax", "'x'", "rows >= 0", "-2"});
  c = b.call(Op::softmax);
  c.y.rows = 63;
  expect_error(c, {}, {"softmax", "'y'", "shape (64, 100)", "(63, 100)"});
  c = b.call(Op::softmax);
  c.weight = {b.w.data(), DType::f32, 100};
  expect_error(c, {}, {"softmax", "'weight'", "one of the operands x, y", "unknown operand"});
  c = b.call(Op::rms_norm);
  c.weight = {b.w.data(), DType::f32, 99};
  expect_error(c, {}, {"rms_norm", "'weight'", "100 elements", "99"});
  c = b.call(Op::rms_norm);
  c.eps = -1e-3f;
  expect_error(c, {}, {"rms_norm", "'eps'", "a value in [0, 1e+300]", "-0.001"});
  c = b.call(Op::layer_norm);
  c.y.data = b.x.data() + 50;  // partial overlap
  expect_error(c, {}, {"layer_norm", "'y'", "does not overlap x", "overlapping view"});
  c = b.call(Op::softmax);
  c.y.dtype = DType::bf16, c.y.data = b.x.data();
  expect_error(c, {}, {"softmax", "'y'", "overlap"});
  c = b.call(Op::softmax);
  c.x.data = reinterpret_cast<char*>(b.x.data()) + 1;
  expect_error(c, {}, {"softmax", "'x'", "aligned to its element size"});
}

// Caller mistakes outside a call's operands: each an Error naming what was wrong, none an
// InternalError (kept for the library's own bugs) and none a silent default.
TEST(ArgumentErrors, MistakesAroundACallAreTheCallersToo) {
  Buffers b;
  auto message = [](const std::function<void()>& f) -> std::string {
    try {
      f();
    } catch (const InternalError& e) {
      return std::string("InternalError: ") + e.what();
    } catch (const Error& e) {
      return e.what();
    }
    return "no error";
  };
  EXPECT_EQ(message([&] { check_against(b.call(Op::softmax), std::vector<double>(3)); }),
            "check_against: argument 'reference': expected rows x cols = 64 x 100 values, got 3 values");
  RowProgram r("r");
  const Operand x = r.row_in("x");
  EXPECT_EQ(message([&] { r.binary(BinaryFn::add, r.load(x), RowExpr{&r, 9999}); }),
            "row program 'r': expression node 9999: expected a node of this program, 0 to 0");
  CallOptions cast;
  cast.backend = Backend(5);
  EXPECT_EQ(message([&] { run(b.call(Op::softmax), cast); }),
            "call options: argument 'backend': expected Backend::cuda or Backend::cpu, got the value 5");
  // matrix(): -1 (the default) means contiguous rows; another negative stride is refused by the call.
  EXPECT_EQ(matrix(b.x.data(), DType::f32, 64, 100).row_stride, 100);
  Call c = b.call(Op::softmax);
  c.x = matrix(b.x.data(), DType::f32, 64, 100, -7);
  expect_error(c, {}, {"softmax", "'x'", "-7"});
}

TEST(ArgumentErrors, InvalidPlansNameTheField) {
  Buffers b;
  PlanRequest p;
  p.caching = InputCaching::registers, p.workers_per_program = 32, p.stripes = 1, p.vector_elems = 2;
  expect_error(b.call(Op::softmax), p, {"softmax", "plan.stripes", ">= cols = 100", "1 x 32 x 2 = 64"});
  std::vector<float> x(4 * 8192, 1.0f), y(4 * 8192);
  Call wide{Op::softmax, matrix(x.data(), DType::f32, 4, 8192), matrix(y.data(), DType::f32, 4, 8192)};
  p = {};
  p.caching = InputCaching::registers, p.workers_per_program = 32;
  expect_error(wide, p, {"softmax", "plan.caching", "private_budget = 64", "256 scalars"});
  p = {};
  p.programs_per_group = 2, p.workers_per_program = 1024;
  expect_error(b.call(Op::layer_norm), p, {"layer_norm", "plan.programs_per_group", "1024 threads", "2 x 1024 = 2048"});
  p = {};
  p.programs_per_group = 16, p.workers_per_program = 32, p.barrier_scope = BarrierScope::program;
  expect_error(b.call(Op::rms_norm), p, {"rms_norm", "plan.programs_per_group", "15 programs", "16"});
  p = {};
  p.workers_per_program = 48;
  expect_error(b.call(Op::softmax), p, {"plan.workers_per_program", "multiple of 32", "48"});
  p = {};
  p.vector_elems = 8;
  expect_error(b.call(Op::softmax), p, {"plan.vector_elems", "16 bytes", "8 elements of 4 bytes"});
  p = {};
  p.cache_format = CacheFormat::packed;
  expect_error(b.call(Op::softmax), p, {"softmax", "plan.cache_format", "16-bit", "row inputs f32"});
  p = {};
  p.vector_elems = 4, p.alignment = Alignment::require;
  Call odd = b.call(Op::softmax);
  odd.x.cols = odd.y.cols = 99;
  odd.x.row_stride = odd.y.row_stride = 99;
  expect_error(odd, p, {"plan.alignment", "aligned", "row strides 99, 99"});
}

TEST(ArgumentErrors, GridBeyondItsLimitIsRefused) {
  // Never dereferenced: the call is refused before anything runs.
  const int64_t rows = (int64_t(1) << 31) + 5;
  Call huge{Op::softmax, matrix(reinterpret_cast<void*>(uintptr_t(1) << 44), DType::f32, rows, 1),
            matrix(reinterpret_cast<void*>(uintptr_t(1) << 45), DType::f32, rows, 1)};
  PlanRequest p;
  p.programs_per_group = 1, p.workers_per_program = 32, p.grid_limit = 0;  // one row block a group
  expect_error(huge, p, {"softmax", "'x'", "at most 2147483647 groups of 1 rows", "2147483653 rows"});
  // Unasked, the policy launches at most 2^30 row blocks, each looping over the rest.
  PlanRequest loops = p;
  loops.grid_limit.reset();
  EXPECT_EQ(plan_for(huge, loops).grid_limit, 1 << 30);
  // The introspection entry points refuse what run() refuses, with the same message.
  for (const std::function<void()>& f : std::vector<std::function<void()>>{
           [&] { plan_for(huge, p); }, [&] { ir_for(huge, p); }, [&] { source_for(huge, p); }}) {
    try {
      f();
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("softmax: argument 'x': expected at most 2147483647 groups"),
                std::string::npos)
          << e.what();
    }
  }
  // The mapping family offers no plan beyond the grid either.
  for (const MappingPlan& m :
       mapping_family(PlanInputs::for_rows(DType::f32, DType::f32, rows, 1)))
    EXPECT_LE((rows + m.programs_per_group - 1) / m.programs_per_group, int64_t(INT32_MAX)) << m.to_json();
}

TEST(ArgumentErrors, ExtentOfOneRowIsBoundedToo) {
  // rows = 1 once slipped past the 2^61 guard ((rows - 1) * stride is 0): cols is bounded itself.
  for (int64_t cols : {int64_t(1) << 61, INT64_MAX}) {
    Call c{Op::softmax, matrix(reinterpret_cast<void*>(uintptr_t(1) << 40), DType::f32, 1, cols),
           matrix(reinterpret_cast<void*>(uintptr_t(1) << 44), DType::f32, 1, cols)};
    expect_error(c, {}, {"softmax", "'x'", "cols at most 2^61 - 1", std::to_string(cols)});
  }
}

TEST(ArgumentErrors, EpsMustBeWhatFp32Holds) {
  EXPECT_EQ(checked_eps(Op::rms_norm, 1e-5), 1e-5f);
  EXPECT_EQ(checked_eps(Op::rms_norm, 0.0), 0.0f);
  EXPECT_EQ(checked_eps(Op::layer_norm, 0x1p-149), 0x1p-149f);  // a subnormal fp32 holds exactly
  for (double bad : {1e-50, 1e-40, 1e39, -1e-3, std::nan(""), HUGE_VAL}) {
    try {
      checked_eps(Op::layer_norm, bad);
      ADD_FAILURE() << "no error for " << bad;
    } catch (const Error& e) {
      EXPECT_EQ(
          std::string(e.what()).rfind("layer_norm: argument 'eps': expected 0 or a finite positive value that float32 "
                                      "holds within rounding",
                                      0),
          0u)
          << e.what();
    }
  }
  // eps = 0 is allowed and means what it says: a zero row has no scale (NaN, as in PyTorch).
  std::vector<float> x(2 * 8, 0.0f), y(2 * 8, 1.0f);
  x[8] = 1.0f;
  rms_norm(matrix(x.data(), DType::f32, 2, 8), matrix(y.data(), DType::f32, 2, 8), {}, 0.0f,
           {{}, nullptr, Backend::cpu});
  EXPECT_TRUE(std::isnan(y[0]));
  EXPECT_NEAR(y[8], std::sqrt(8.0f), 1e-5);
}

TEST(ArgumentErrors, ViewsMustEndInsideTheAddressSpace) {
  Buffers b;
  Call c = b.call(Op::softmax);
  c.x = matrix(reinterpret_cast<void*>(UINTPTR_MAX - 15), DType::f32, 1, 4);  // 16 bytes from 2^64 - 16
  c.y = matrix(b.y.data(), DType::f32, 1, 4);
  expect_error(c, {}, {"softmax", "'x'", "a view that ends inside the address space"});
}

// An error of the CPU executor is a library bug: an InternalError, never taken for a bad argument.
TEST(InternalErrors, ExecutorErrorsAreLibraryBugs) {
  static_assert(std::is_base_of_v<InternalError, cpu::ExecutionError>);
  static_assert(!std::is_base_of_v<Error, cpu::ExecutionError>);
  Buffers b;
  const Call call = b.call(Op::softmax);
  const ir::Kernel& k = prepare(builtin_program(Op::softmax), bind(builtin_program(Op::softmax), to_args(call)), {}, {})
                           ->lowered.main.kernel;
  cpu::LaunchArgs args;
  args.groups = 64;
  args.buffers = {{b.x.data(), 0, 10}, {b.y.data(), 0, 64 * 100}};  // x's bounds too small: a bug's out-of-bounds read
  args.params = {{0, 64}, {0, 100}, {0, 100}, {0, 100}};
  try {
    cpu::execute(k, args);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    ADD_FAILURE() << "an executor error taken for a bad argument: " << e.what();
  } catch (const InternalError& e) {
    EXPECT_NE(std::string(e.what()).find("a library bug"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("out-of-bounds"), std::string::npos) << e.what();
  }
}

// docs/source/limits.md, row by row: each value in "accepted" passes, each in "rejected" is
// refused, in the context the row names. A limit enforced here but missing from the page, or
// stated there but not checked here, fails too.
using Check = std::function<void(const std::string&)>;  // throws tile::Error when refused
// What each refusal must say, so that a value is refused by the limit its row states.
const std::map<std::string, std::string> kRefusals = {
    {"rows", "expected rows >= 0"},
    {"cols", "expected cols >= 1"},
    {"row_stride", "expected row_stride >= cols"},
    {"extent", "2^61 - 1 elements"},
    {"grid", "groups of 1 rows (the grid's limit)"},
    {"passes", "2147483647 passes"},
    {"alignment_f32", "aligned to its element size"},
    {"alignment_bf16", "aligned to its element size"},
    {"address_end", "ends inside the address space"},
    {"aliasing", "does not overlap x"},
    {"aliasing_interleaved", "does not overlap x"},
    {"aliasing_weight", "does not overlap weight"},
    {"eps", "argument 'eps'"},
    {"json_integer", "argument 'stripes'"},
    {"workers_per_program", "plan.workers_per_program"},
    {"programs_per_group", "plan.programs_per_group"},
    {"programs_per_group_warps", "whole warps"},
    {"vector_elems", "plan.vector_elems"},
    {"vector_elems_16bit", "plan.vector_elems"},
    {"stripes", "plan.stripes"},
    {"stripes_budget", "private_budget = 64"},
    {"stripe_unroll", "plan.stripe_unroll"},
    {"private_budget", "plan.private_budget"},
    {"barrier_scope_programs", "program-scope barriers"},
    {"finish_workers", "plan.finish_workers"},
    {"workspace_size", "argument 'workspace': expected at least"},
    {"workspace_alignment", "argument 'workspace': expected a pointer aligned to 4 bytes"},
};

void* at(uintptr_t address) { return reinterpret_cast<void*>(address); }
constexpr uintptr_t kX = uintptr_t(1) << 40, kY = uintptr_t(1) << 44;  // never dereferenced

// The page's default call (softmax, fp32, 64 x 1000 contiguous) with `edit` applied, planned.
Check planned(std::function<void(Call&, PlanRequest&, const std::string&)> edit) {
  return [edit](const std::string& v) {
    Call c{Op::softmax, matrix(at(kX), DType::f32, 64, 1000), matrix(at(kY), DType::f32, 64, 1000)};
    PlanRequest p;
    edit(c, p, v);
    plan_for(c, p);
  };
}

// rms_norm_backward with dweight, 64 x 1000 fp32, run on the CPU backend with a workspace of
// tile::workspace_bytes + `extra` bytes at `offset` bytes past a 16-byte boundary.
void run_with_workspace(int64_t extra, int64_t offset) {
  static std::vector<float> dy(64 * 1000, 1.0f), x(64 * 1000, 1.0f), w(1000, 1.0f), rstd(64, 1.0f), dx(64 * 1000),
      dw(1000);
  const Args a = Args()
                     .set("dy", matrix(dy.data(), DType::f32, 64, 1000))
                     .set("x", matrix(x.data(), DType::f32, 64, 1000))
                     .set("weight", VectorView{w.data(), DType::f32, 1000})
                     .set("rstd", VectorView{rstd.data(), DType::f32, 64})
                     .set("dx", matrix(dx.data(), DType::f32, 64, 1000))
                     .set("dweight", VectorView{dw.data(), DType::f32, 1000});
  const RowProgram& p = training_program("rms_norm_backward");
  CallOptions o{{}, nullptr, Backend::cpu};
  const int64_t bytes = workspace_bytes(p, a, o);
  std::vector<float> ws(size_t(bytes / 4) + 16);
  char* base = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(ws.data()) + 15) & ~uintptr_t(15));
  o.workspace = base + offset;
  o.workspace_size = size_t(bytes + extra);
  run(p, a, o);
}

std::map<std::string, Check> limit_checks() {
  auto i64 = [](const std::string& v) { return int64_t(std::stoll(v)); };
  auto shape = [](Call& c, int64_t rows, int64_t cols, int64_t stride) {
    c.x.rows = c.y.rows = rows, c.x.cols = c.y.cols = cols, c.x.row_stride = c.y.row_stride = stride;
  };
  std::map<std::string, Check> m;
  m["rows"] = planned([=](Call& c, PlanRequest&, const std::string& v) { shape(c, i64(v), 1000, 1000); });
  m["cols"] = planned([=](Call& c, PlanRequest&, const std::string& v) { shape(c, 64, i64(v), 1000); });
  m["row_stride"] = planned([=](Call& c, PlanRequest&, const std::string& v) { shape(c, 64, 100, i64(v)); });
  m["extent"] = planned([=](Call& c, PlanRequest&, const std::string& v) {
    c.x.dtype = c.y.dtype = DType::bf16, c.y.data = at(uintptr_t(1) << 63);  // 2^62 bytes each, apart
    shape(c, int64_t(1) << 20, i64(v), int64_t(1) << 41);
  });
  m["grid"] = planned([=](Call& c, PlanRequest& p, const std::string& v) {
    shape(c, i64(v), 1, 1), p.programs_per_group = 1, p.workers_per_program = 32, p.grid_limit = 0;
  });
  m["passes"] = planned([=](Call& c, PlanRequest& p, const std::string& v) {
    shape(c, 1, i64(v), i64(v)), p.workers_per_program = 32, p.vector_elems = 1, p.caching = InputCaching::reread;
  });
  m["alignment_f32"] = planned([=](Call& c, PlanRequest&, const std::string& v) { c.x.data = at(kX + i64(v)); });
  m["alignment_bf16"] = planned([=](Call& c, PlanRequest&, const std::string& v) {
    c.x.dtype = c.y.dtype = DType::bf16, c.x.data = at(kX + i64(v));
  });
  m["address_end"] = planned([=](Call& c, PlanRequest&, const std::string& v) {
    shape(c, 1, 4, 4), c.x.data = at(uintptr_t(std::stoull(v)));
  });
  m["aliasing"] =
      planned([=](Call& c, PlanRequest&, const std::string& v) { shape(c, 4, 64, 64), c.y.data = at(kX + i64(v)); });
  m["aliasing_interleaved"] =
      planned([=](Call& c, PlanRequest&, const std::string& v) { shape(c, 4, 64, 128), c.y.data = at(kX + i64(v)); });
  m["aliasing_weight"] = planned([=](Call& c, PlanRequest&, const std::string& v) {
    c.op = Op::rms_norm, shape(c, 4, 64, 64), c.weight = VectorView{at(kY + i64(v)), DType::f32, 64};
  });
  m["eps"] = [](const std::string& v) { checked_eps(Op::rms_norm, std::strtod(v.c_str(), nullptr)); };
  m["json_integer"] = [](const std::string& v) { PlanRequest::from_json("{\"stripes\":" + v + "}"); };
  m["workers_per_program"] =
      planned([=](Call&, PlanRequest& p, const std::string& v) { p.workers_per_program = int(i64(v)); });
  m["programs_per_group"] = planned([=](Call&, PlanRequest& p, const std::string& v) {
    p.workers_per_program = 32, p.programs_per_group = int(i64(v));
  });
  m["programs_per_group_warps"] = planned([=](Call&, PlanRequest& p, const std::string& v) {
    p.workers_per_program = 16, p.programs_per_group = int(i64(v));
  });
  m["vector_elems"] = planned([=](Call&, PlanRequest& p, const std::string& v) { p.vector_elems = int(i64(v)); });
  m["vector_elems_16bit"] = planned([=](Call& c, PlanRequest& p, const std::string& v) {
    c.x.dtype = c.y.dtype = DType::bf16, p.vector_elems = int(i64(v));
  });
  m["stripes"] = planned([=](Call&, PlanRequest& p, const std::string& v) {
    p.caching = InputCaching::registers, p.workers_per_program = 32, p.vector_elems = 4, p.stripes = int(i64(v));
  });
  m["stripes_budget"] = m["stripes"];
  m["stripe_unroll"] = planned([=](Call&, PlanRequest& p, const std::string& v) {
    p.caching = InputCaching::reread, p.stripe_unroll = int(i64(v));
  });
  m["private_budget"] = planned([=](Call&, PlanRequest& p, const std::string& v) {
    p.caching = InputCaching::reread, p.private_budget = int(i64(v));
  });
  m["finish_workers"] = planned([=](Call&, PlanRequest& p, const std::string& v) { p.finish_workers = int(i64(v)); });
  m["barrier_scope_programs"] = planned([=](Call&, PlanRequest& p, const std::string& v) {
    p.barrier_scope = BarrierScope::program, p.workers_per_program = 32, p.programs_per_group = int(i64(v));
  });
  m["workspace_size"] = [=](const std::string& v) { run_with_workspace(i64(v), 0); };
  m["workspace_alignment"] = [=](const std::string& v) { run_with_workspace(0, i64(v)); };
  return m;
}

std::vector<std::string> backticked(const std::string& cell) {
  std::vector<std::string> out;
  const std::regex tick("`([^`]+)`");
  for (auto it = std::sregex_iterator(cell.begin(), cell.end(), tick); it != std::sregex_iterator(); ++it)
    out.push_back((*it)[1]);
  return out;
}

TEST(Limits, EveryStatedLimitHoldsAtItsBoundary) {
  std::ifstream page(TILE_LIMITS_DOC);
  ASSERT_TRUE(page) << "cannot read " << TILE_LIMITS_DOC;
  std::map<std::string, Check> checks = limit_checks();
  std::set<std::string> stated;
  int values = 0;
  for (std::string line; std::getline(page, line);) {
    if (line.rfind("| `", 0) != 0) continue;
    std::vector<std::string> cells;
    std::stringstream row(line.substr(1));
    for (std::string cell; std::getline(row, cell, '|');) cells.push_back(cell);
    ASSERT_EQ(cells.size(), 4u) << line;
    const std::string key = backticked(cells[0]).at(0);
    stated.insert(key);
    auto check = checks.find(key);
    if (check == checks.end()) {
      ADD_FAILURE() << "limits.md states '" << key << "', which no check here enforces";
      continue;
    }
    for (int col : {2, 3}) {
      const std::vector<std::string> vs = backticked(cells[col]);
      EXPECT_FALSE(vs.empty()) << line;
      for (const std::string& v : vs) {
        ++values;
        std::string refused;
        try {
          check->second(v);
        } catch (const Error& e) {
          refused = e.what();
        }
        if (col == 2) {
          EXPECT_EQ(refused, "") << key << " = " << v << " is stated as accepted";
        } else {
          EXPECT_NE(refused.find(kRefusals.at(key)), std::string::npos)
              << key << " = " << v << " is stated as rejected by '" << kRefusals.at(key) << "'; got: " << refused;
        }
      }
    }
  }
  for (const auto& [key, check] : checks) {
    EXPECT_TRUE(stated.count(key)) << "'" << key << "' is checked but not in limits.md";
    EXPECT_TRUE(kRefusals.count(key)) << key;
  }
  EXPECT_GT(values, 80);
}

TEST(ArgumentErrors, PlanJsonNamesTheField) {
  EXPECT_THROW(PlanRequest::from_json(R"({"programs_per_group": "two"})"), Error);
  try {
    PlanRequest::from_json(R"({"stripes": 2, "colour": 3})");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'colour'"), std::string::npos) << e.what();
  }
  try {
    PlanRequest::from_json(R"({"caching": "sometimes"})");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("expected \"registers\", \"reread\" or \"shared\", got \"sometimes\""),
              std::string::npos)
        << e.what();
  }
}

TEST(ArgumentErrors, GpuLaunchWithoutDriverSaysSo) {
  if (cuda_target().caps().can_launch) GTEST_SKIP() << "a CUDA driver is present";
  // Without CUDA in the build the stub says so, naming the operator and the way out.
  const std::string expected = TILE_WITH_CUDA ? "no CUDA driver" : "softmax: no CUDA backend: Tile was built without CUDA (TILE_WITH_CUDA=OFF)";
  Buffers b;
  try {
    run(b.call(Op::softmax));
    ADD_FAILURE() << "no error";
  } catch (const NoDriverError& e) {
    EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tile
