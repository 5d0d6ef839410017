// Every bad argument raises tile::Error naming the operator, the argument, what was expected
// and what was given.
#include <gtest/gtest.h>

#include "backend/cuda/driver.hpp"
#include "tile/tile.hpp"

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
  expect_error(c, {}, {"rms_norm", "'eps'", "a finite value >= 0", "-0.001"});
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
  p.programs_per_group = 1, p.workers_per_program = 32;
  expect_error(huge, p, {"softmax", "'x'", "2^31 - 1 groups", "2147483653 rows"});
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
    EXPECT_NE(std::string(e.what()).find("\"registers\" or \"reread\""), std::string::npos) << e.what();
  }
}

TEST(ArgumentErrors, GpuLaunchWithoutDriverSaysSo) {
  if (cuda::driver_available()) GTEST_SKIP() << "a CUDA driver is present";
  Buffers b;
  try {
    run(b.call(Op::softmax));
    ADD_FAILURE() << "no error";
  } catch (const NoDriverError& e) {
    EXPECT_NE(std::string(e.what()).find("no CUDA driver"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tile
