// RowProgram (src/spec/spec.cpp): declarations, types, shapes and stores are checked when a
// program is built, each error naming the program and what was wrong.
#include <gtest/gtest.h>

#include <limits>

#include "bind/bind.hpp"
#include "tile/tile.hpp"
#include "support/error_of.hpp"

namespace tile {
namespace {

using tile::testing::error_of;

#define EXPECT_ERROR(stmt, text) EXPECT_NE(error_of([&] { stmt; }).find(text), std::string::npos) << error_of([&] { stmt; })

TEST(RowProgram, DeclarationsAreCheckedOnce) {
  RowProgram p("demo");
  Operand x = p.row_in("x");
  EXPECT_ERROR(p.row_in("x"), "row program 'demo': operand 'x' is declared twice");
  EXPECT_ERROR(p.row_in("rows"), "expected an identifier that is not rows, cols or tile_*");
  EXPECT_ERROR(p.row_in("tile_a"), "not rows, cols or tile_*");
  EXPECT_ERROR(p.row_in("2x"), "operand name '2x'");
  EXPECT_ERROR(p.row_in("mixed", {DType::f32, DType::i32}), "expected float dtypes or integer dtypes");
  Operand t = p.row_scalar_in("target", DTypeSet::integers());
  EXPECT_ERROR(p.row_out("y", DTypeSet::floats(), t), "may alias only a row input");
  EXPECT_ERROR(RowProgram("bad name"), "expected an identifier");
  // A name holding a NUL or another unprintable byte is shown escaped, whole: a NUL would end
  // the message wherever it is read as a C string.
  using namespace std::string_literals;
  EXPECT_ERROR(RowProgram("a\0b"s), "got 'a\\x00b'");
  EXPECT_ERROR(p.row_in("x\0tail"s), "operand name 'x\\x00tail': expected an identifier");
  EXPECT_ERROR(p.scalar_in("s\n"s, ValueType::b1), "scalar 's\\x0a': expected type f32 or i64");
  EXPECT_ERROR(p.row_in(std::string(500, '\x01')), "... (500 bytes)");
  (void)x;
}

// Optional row and per-row operands: read with load_or, and rows come from a row operand that
// is always given.
TEST(RowProgram, OptionalRowOperands) {
  RowProgram p("demo");
  Operand extra = p.row_in("extra", DTypeSet::floats(), "", /*optional=*/true);
  Operand scale = p.row_scalar_in("scale", {DType::f32}, "", /*optional=*/true);
  Operand maybe = p.row_out("maybe", DTypeSet::floats(), extra, "", /*optional=*/true);
  EXPECT_TRUE(p.operands()[extra.id].optional && p.operands()[scale.id].optional && p.operands()[maybe.id].optional);
  EXPECT_ERROR(p.load(extra), "load of optional operand 'extra': use load_or");
  EXPECT_ERROR(p.load(scale), "load of optional operand 'scale': use load_or");
  p.store(maybe, p.load_or(extra, 0.0) * p.load_or(scale, 1.0));
  // Without a row operand that is always present, a call has no rows to run: refused as the
  // program is validated (a Python call reached an internal check first).
  EXPECT_ERROR(p.validate(), "row program 'demo': expected at least one row input or output operand that is not optional");
  EXPECT_ERROR(bind(p, Args()), "expected at least one row input or output operand that is not optional");
  // An i64 scalar's default is checked when it is declared, as a call's value would be.
  EXPECT_ERROR(p.scalar_in("k", ValueType::i64, 2.5), "scalar 'k': default 2.5: expected an integer of magnitude at most 2^53");
  EXPECT_ERROR(p.scalar_in("k", ValueType::i64, 0x1p60), "scalar 'k': default 1.152921504606847e+18: expected an integer");
  EXPECT_ERROR(p.scalar_in("t", ValueType::f32, std::numeric_limits<double>::infinity()),
               "scalar 't': default inf: expected a finite value");
  EXPECT_ERROR(p.row_out("z", DTypeSet::floats(), Operand{42}), "may alias only a row input");
}

// A program holds at most RowProgram::kMaxNodes nodes (the passes recurse over its graph; a
// chain of some 12,000 overflowed the stack); the next one is refused with the program's name.
TEST(RowProgram, NodesAreBounded) {
  RowProgram p("chain");
  Operand x = p.row_in("x");
  RowExpr v = p.load(x), one = p.constant(1.0);
  while (int(p.nodes().size()) < RowProgram::kMaxNodes) v = v + one;
  EXPECT_ERROR(v + one, "row program 'chain': more than 4096 nodes (a row program holds at most that many)");
}

TEST(RowProgram, ExpressionsAreTypedAndShaped) {
  RowProgram p("demo");
  Operand x = p.row_in("x"), w = p.col_in("w", DTypeSet::floats(), true), t = p.row_scalar_in("t", DTypeSet::integers());
  Operand y = p.row_out("y"), dw = p.col_out("dw"), total = p.scalar_out("total"), per_row = p.row_scalar_out("r");
  RowExpr v = p.load(x);
  EXPECT_ERROR(p.load(w), "load of optional operand 'w': use load_or");
  EXPECT_ERROR(p.load(y), "load of 'y', which is an output");
  RowExpr target = p.load(t);  // i64, one per row
  EXPECT_ERROR(v + target, "add of f32 and i64: convert with to_f32 first");
  EXPECT_ERROR(exp(target), "exp of a i64 value: expected f32");
  // Integer division would truncate in a kernel and divide exactly in the reference.
  EXPECT_ERROR(p.col_index() / target, "div of i64 values: integer division is not defined in row programs; "
                                       "convert with to_f32 first");
  // Integer constants are exact in the reference's doubles: |v| <= 2^53, INT64_MIN included.
  for (int64_t v : {(int64_t(1) << 53) + 1, -(int64_t(1) << 53) - 1, std::numeric_limits<int64_t>::min(),
                    std::numeric_limits<int64_t>::max()})
    EXPECT_ERROR(p.integer(v), "integer constant " + std::to_string(v) + " is not exactly representable (|v| <= 2^53)");
  EXPECT_NO_THROW(p.integer(int64_t(1) << 53));
  EXPECT_NO_THROW(p.integer(-(int64_t(1) << 53)));
  EXPECT_ERROR(p.select(v, v, v), "select condition of type f32: expected b1");
  RowExpr hit = eq(p.col_index(), target);  // the element at the target column
  EXPECT_EQ(p.nodes()[hit.id].type, ValueType::b1);
  EXPECT_TRUE(p.nodes()[hit.id].shape.rows && p.nodes()[hit.id].shape.cols);
  RowExpr logit = p.reduce1(Axis::cols, monoid::sum(), p.select(hit, v, p.constant(0.0)));
  EXPECT_ERROR(p.reduce1(Axis::cols, monoid::sum(), logit), "reduce over the columns of a per-row value");
  EXPECT_ERROR(p.reduce1(Axis::rows, monoid::sum(), p.load_or(w, 1.0)), "reduce over the rows of a per-column value");
  EXPECT_ERROR(p.reduce1(Axis::cols, monoid::online_softmax(), v), "reduce1 with online_softmax, which has 2 parts");
  RowExpr grad = p.reduce1(Axis::rows, monoid::sum(), v);
  EXPECT_ERROR(grad + v, "a reduction over the rows is combined with a value that varies along the rows");
  EXPECT_ERROR(p.store(y, grad), "store of a reduction over the rows to row output 'y'");
  EXPECT_ERROR(p.store(per_row, v), "store of a element value to per-row output 'r'");
  EXPECT_ERROR(p.store(dw, v), "not reduced over the rows");
  EXPECT_ERROR(p.store(total, grad), "not a reduction over the rows to one value");
  EXPECT_ERROR(p.store(x, v), "store to 'x', which is an input");
  EXPECT_ERROR(p.store(y, hit), "store of a b1 value");
  p.store(y, v - logit);
  EXPECT_ERROR(p.store(y, v), "'y' is stored twice");
  EXPECT_ERROR(p.validate(), "output 'dw' is never stored");
  p.store(dw, grad * 2.0);
  p.store(total, p.reduce1(Axis::rows, monoid::sum(), logit));
  p.store(per_row, logit);
  EXPECT_NO_THROW(p.validate());
  // The printed program names every operand and node.
  const std::string text = p.to_string();
  for (const char* part : {"row input x", "per-column input w: f32, f64, f16 or bf16 (optional)", "per-row input t: i32 or i64",
                           "col_index", "reduce_cols sum", "reduce_rows sum", "store dw"})
    EXPECT_NE(text.find(part), std::string::npos) << part << "\n" << text;
}

TEST(RowProgram, EveryChangeGivesANewSerial) {
  RowProgram p("demo");
  const uint64_t a = p.serial();
  Operand x = p.row_in("x");
  const uint64_t b = p.serial();
  p.store(p.row_out("y"), p.load(x));
  EXPECT_NE(a, b);
  EXPECT_NE(b, p.serial());
  EXPECT_NE(RowProgram("demo").serial(), RowProgram("demo").serial());
}

// A moved-from program is empty under a serial of its own: running it is refused as a program
// that stores nothing (it crashed reading the caches of the program it was moved into).
TEST(RowProgram, AMovedFromProgramIsEmpty) {
  std::vector<float> x(4 * 100, 1.0f), y(4 * 100);
  CallOptions cpu;
  cpu.backend = Backend::cpu;
  RowProgram p("scale2");
  const Operand xo = p.row_in("x"), yo = p.row_out("y");
  p.store(yo, p.load(xo) * 2.0);
  Args args;
  args.set("x", matrix(x.data(), DType::f32, 4, 100)).set("y", matrix(y.data(), DType::f32, 4, 100));
  run(p, args, cpu);
  const uint64_t serial = p.serial();
  RowProgram q = std::move(p);
  EXPECT_EQ(q.serial(), serial);
  EXPECT_NE(p.serial(), serial);
  EXPECT_TRUE(p.operands().empty() && p.nodes().empty() && p.stores().empty());
  EXPECT_EQ(p.name(), "scale2");
  EXPECT_ERROR(run(p, Args(), cpu), "row program 'scale2'");
  std::fill(y.begin(), y.end(), 0.0f);
  run(q, args, cpu);
  EXPECT_EQ(y[399], 2.0f);
}

TEST(RowProgram, ScalarsHaveDefaultsAndRanges) {
  RowProgram p("demo");
  Operand x = p.row_in("x"), y = p.row_out("y");
  Operand s = p.scalar_in("s", ValueType::f32, 2.0);
  Operand k = p.scalar_in("k", ValueType::i64);
  p.scalar_range(s, 0.0, 10.0);
  EXPECT_ERROR(p.scalar_range(x, 0, 1), "scalar_range of an operand that is not a scalar input");
  EXPECT_ERROR(p.scalar_in("b", ValueType::b1), "expected type f32 or i64");
  p.store(y, p.load(x) * p.load(s) + to_f32(p.load(k)));
  std::vector<float> in(8, 1.0f), out(8);
  Args args;
  args.set("x", matrix(in.data(), DType::f32, 2, 4)).set("y", matrix(out.data(), DType::f32, 2, 4)).set("k", 3.0);
  run(p, args, {{}, nullptr, Backend::cpu});
  EXPECT_EQ(out[0], 5.0f);
  EXPECT_ERROR(run(p, Args(args).set("s", 11.0), {{}, nullptr, Backend::cpu}), "demo: argument 's': expected a value in [0, 10], got 11");
  EXPECT_ERROR(run(p, Args(args).set("k", 1.5), {{}, nullptr, Backend::cpu}), "demo: argument 'k': expected an integer");
  Args missing;
  missing.set("x", matrix(in.data(), DType::f32, 2, 4)).set("y", matrix(out.data(), DType::f32, 2, 4));
  EXPECT_ERROR(run(p, missing, {{}, nullptr, Backend::cpu}), "demo: argument 'k': expected a number (the scalar has no default), got nothing");
}

// An Op cast from an integer past the enum is refused by name, not read past the table.
TEST(BuiltinProgram, UnknownOpIsAnError) {
  EXPECT_EQ(builtin_program(Op::layer_norm).name(), "layer_norm");
  EXPECT_ERROR(builtin_program(Op(4)),
               "built-in operator: expected one of softmax, log_softmax, rms_norm, layer_norm, got Op(4)");
  Call call{Op(200)};
  EXPECT_ERROR(run(call, {{}, nullptr, Backend::cpu}),
               "built-in operator: expected one of softmax, log_softmax, rms_norm, layer_norm, got Op(200)");
}

}  // namespace
}  // namespace tile
