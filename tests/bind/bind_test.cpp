// bind (src/bind/bind.cpp): one check of a call's operands for every entry point, derived from
// the program's declarations; each error names the program, the operand, what was expected and
// what was given.
#include "bind/bind.hpp"

#include <gtest/gtest.h>

#include "tile/tile.hpp"

namespace tile {
namespace {

std::string error_of(const RowProgram& p, const Args& a) {
  try {
    bind(p, a);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// cross-entropy-like: logits in, an integer target per row, a per-row loss, a mean loss.
struct Program {
  RowProgram p{"xent"};
  Program() {
    Operand logits = p.row_in("logits");
    Operand target = p.row_scalar_in("target", DTypeSet::integers());
    Operand grad = p.row_out("dlogits", DTypeSet::floats(), logits);
    Operand loss = p.row_scalar_out("loss", {DType::f32}, true);
    Operand mean = p.scalar_out("mean", {DType::f32}, true);
    Operand w = p.col_in("w", DTypeSet::floats(), true);
    Operand s = p.scalar_in("smoothing", ValueType::f32, 0.0);
    p.scalar_range(s, 0.0, 1.0);
    RowExpr x = p.load(logits) * p.load_or(w, 1.0);
    auto [m, e] = p.reduce2(Axis::cols, monoid::online_softmax(), x);
    RowExpr lse = m + log(e);
    RowExpr hit = eq(p.col_index(), p.load(target));
    RowExpr picked = p.reduce1(Axis::cols, monoid::sum(), p.select(hit, x, p.constant(0.0)));
    RowExpr l = lse - picked * (1.0 - p.load(s));
    p.store(loss, l);
    p.store(mean, p.reduce1(Axis::rows, monoid::sum(), l) / p.reduce1(Axis::rows, monoid::sum(), p.constant(1.0) + l * 0.0));
    p.store(grad, exp(x - lse) - p.select(hit, p.constant(1.0), p.constant(0.0)));
  }
};

TEST(Bind, OperandsAreCheckedByRole) {
  Program prog;
  std::vector<float> x(6 * 10), g(6 * 10), loss(6), mean(1), w(10);
  std::vector<int64_t> t(6, 3);
  std::vector<int32_t> t32(6, 3);
  Args ok;
  ok.set("logits", matrix(x.data(), DType::f32, 6, 10))
      .set("dlogits", matrix(g.data(), DType::f32, 6, 10))
      .set("target", VectorView{t.data(), DType::i64, 6});
  const BoundCall call = bind(prog.p, ok);
  EXPECT_EQ(call.rows, 6);
  EXPECT_EQ(call.cols, 10);
  EXPECT_FALSE(call.operand("loss").present);
  EXPECT_EQ(call.operand("smoothing").value, 0.0);  // the default
  EXPECT_EQ(error_of(prog.p, Args(ok).set("tgt", 1.0)),
            "xent: argument 'tgt': expected one of the operands logits, target, dlogits, loss, mean, w, smoothing, got an "
            "unknown operand");
  // A name holding a NUL is shown whole, escaped.
  EXPECT_NE(error_of(prog.p, Args(ok).set(std::string("tg\0t", 4), 1.0)).find("argument 'tg\\x00t'"), std::string::npos)
      << error_of(prog.p, Args(ok).set(std::string("tg\0t", 4), 1.0));
  Args no_target;
  no_target.set("logits", matrix(x.data(), DType::f32, 6, 10)).set("dlogits", matrix(g.data(), DType::f32, 6, 10));
  EXPECT_EQ(error_of(prog.p, no_target), "xent: argument 'target': expected a vector (per-row input), got nothing");
  EXPECT_EQ(error_of(prog.p, Args(ok).set("target", VectorView{t.data(), DType::i64, 5})),
            "xent: argument 'target': expected 6 elements (one per row), got 5");
  EXPECT_EQ(error_of(prog.p, Args(ok).set("target", VectorView{x.data(), DType::f32, 6})),
            "xent: argument 'target': expected dtype i32 or i64, got f32");
  EXPECT_NO_THROW(bind(prog.p, Args(ok).set("target", VectorView{t32.data(), DType::i32, 6})));
  // A strided column of a matrix is one value per row.
  EXPECT_NO_THROW(bind(prog.p, Args(ok).set("target", matrix(t.data(), DType::i64, 6, 1, 1))));
  EXPECT_EQ(error_of(prog.p, Args(ok).set("dlogits", matrix(g.data(), DType::f32, 6, 9))),
            "xent: argument 'dlogits': expected shape (6, 10) like logits, got (6, 9)");
  EXPECT_EQ(error_of(prog.p, Args(ok).set("w", VectorView{w.data(), DType::f32, 9})),
            "xent: argument 'w': expected 10 elements (one per column), got 9");
  EXPECT_EQ(error_of(prog.p, Args(ok).set("mean", VectorView{mean.data(), DType::f32, 2})),
            "xent: argument 'mean': expected 1 element, got 2");
  EXPECT_EQ(error_of(prog.p, Args(ok).set("smoothing", 1.5)),
            "xent: argument 'smoothing': expected a value in [0, 1], got 1.5");
  EXPECT_EQ(error_of(prog.p, Args(ok).set("smoothing", VectorView{w.data(), DType::f32, 1})),
            "xent: argument 'smoothing': expected a number, got a vector (VectorView)");
  EXPECT_EQ(error_of(prog.p, Args(ok).set("logits", VectorView{x.data(), DType::f32, 10})),
            "xent: argument 'logits': expected a matrix (TensorView), got a vector (VectorView)");
}

TEST(Bind, AFloat64CallHasEveryFloatOperandInFloat64) {
  RowProgram p("norm");
  Operand x = p.row_in("x"), y = p.row_out("y"), w = p.col_in("w", DTypeSet::floats(), true);
  Operand rstd = p.row_scalar_out("rstd"), eps = p.scalar_in("eps", ValueType::f32, 1e-6);
  RowExpr v = p.load(x);
  RowExpr r = rsqrt(p.reduce1(Axis::cols, monoid::sum(), v * v) / p.cols() + p.load(eps));
  p.store(y, v * r * p.load_or(w, 1.0));
  p.store(rstd, r);
  std::vector<double> x64(4 * 8), y64(4 * 8), w64(8), r64(4);
  std::vector<float> x32(4 * 8), y32(4 * 8), w32(8), r32(4);
  Args a;
  a.set("x", matrix(x64.data(), DType::f64, 4, 8)).set("y", matrix(y64.data(), DType::f64, 4, 8));
  a.set("w", VectorView{w64.data(), DType::f64, 8}).set("rstd", VectorView{r64.data(), DType::f64, 4});
  a.set("eps", 1e-300);  // no fp32 would hold it: a float64 call reads scalars as doubles
  const BoundCall call = bind(p, a);
  EXPECT_TRUE(call.f64);
  EXPECT_TRUE(call.signature().f64());
  EXPECT_EQ(call.operand("eps").dtype, DType::f64);
  EXPECT_EQ(call.plan_inputs().real_bytes, 8);
  EXPECT_EQ(error_of(p, Args(a).set("w", VectorView{w32.data(), DType::f32, 8})),
            "norm: argument 'w': expected dtype f64 like x (f64): a float64 call has every float operand in f64, got f32");
  EXPECT_EQ(error_of(p, Args(a).set("rstd", VectorView{r32.data(), DType::f32, 4})),
            "norm: argument 'rstd': expected dtype f64 like x (f64): a float64 call has every float operand in f64, got f32");
  Args b;
  b.set("x", matrix(x32.data(), DType::bf16, 4, 8)).set("y", matrix(y64.data(), DType::f64, 4, 8));
  EXPECT_EQ(error_of(p, b),
            "norm: argument 'y': expected a float dtype other than f64 like x (bf16), or every float operand in f64, "
            "got f64");
  // An fp32 call keeps its fp32 scalars and refuses f64 statistics.
  Args c;
  c.set("x", matrix(x32.data(), DType::f32, 4, 8)).set("y", matrix(y32.data(), DType::f32, 4, 8));
  EXPECT_FALSE(bind(p, c).f64);
  EXPECT_EQ(bind(p, c).operand("eps").dtype, DType::f32);
  EXPECT_NE(error_of(p, Args(c).set("eps", 1e-300)).find("a value that float32 holds"), std::string::npos);
  EXPECT_EQ(error_of(p, Args(c).set("rstd", VectorView{r64.data(), DType::f64, 4})),
            "norm: argument 'rstd': expected a float dtype other than f64 like x (f32), or every float operand in f64, "
            "got f64");
}

TEST(Bind, AliasingFollowsTheDeclarations) {
  Program prog;
  std::vector<float> x(6 * 10), loss(6);
  std::vector<int64_t> t(6, 3);
  Args a;
  a.set("logits", matrix(x.data(), DType::f32, 6, 10)).set("target", VectorView{t.data(), DType::i64, 6});
  // dlogits may be logits itself (the fused in-place form), but not a shifted view of it.
  EXPECT_NO_THROW(bind(prog.p, Args(a).set("dlogits", matrix(x.data(), DType::f32, 6, 10))));
  EXPECT_EQ(error_of(prog.p, Args(a).set("dlogits", matrix(x.data() + 1, DType::f32, 6, 10, 10))),
            "xent: argument 'dlogits': expected memory that does not overlap logits, or exactly logits (same pointer, "
            "stride and dtype), got an overlapping view");
  // The per-row loss may not live inside the logits.
  std::vector<float> g(6 * 10);
  EXPECT_EQ(error_of(prog.p, Args(a).set("dlogits", matrix(g.data(), DType::f32, 6, 10))
                                 .set("loss", VectorView{x.data() + 5, DType::f32, 6})),
            "xent: argument 'loss': expected memory that does not overlap logits, got an overlapping view");
  // Interleaved but disjoint: the loss in a spare column of the gradient's rows.
  std::vector<float> wide(6 * 11);
  EXPECT_NO_THROW(bind(prog.p, Args(a).set("dlogits", matrix(wide.data(), DType::f32, 6, 10, 11))
                                   .set("loss", VectorView{wide.data() + 10, DType::f32, 6, 11})));
}

// A per-row input of stride 0 gives every row one value (a device scalar broadcast, as
// torch's expand makes it); an output of stride 0 would have every row write one place.
TEST(Bind, PerRowInputsMayBroadcastOneValue) {
  Program prog;
  std::vector<float> x(6 * 10), g(6 * 10), loss(6);
  std::vector<int64_t> t(6, 3);
  Args a;
  a.set("logits", matrix(x.data(), DType::f32, 6, 10)).set("dlogits", matrix(g.data(), DType::f32, 6, 10));
  const BoundCall call = bind(prog.p, Args(a).set("target", VectorView{t.data(), DType::i64, 6, 0}));
  EXPECT_EQ(call.operand("target").stride, 0);
  EXPECT_EQ(call.operand("target").extent, 1);
  a.set("target", VectorView{t.data(), DType::i64, 6});
  EXPECT_EQ(error_of(prog.p, Args(a).set("loss", VectorView{loss.data(), DType::f32, 6, 0})),
            "xent: argument 'loss': expected a stride >= 1, got 0");
  EXPECT_EQ(error_of(prog.p, Args(a).set("target", VectorView{t.data(), DType::i64, 6, -1})),
            "xent: argument 'target': expected a stride >= 0, got -1");
  // The broadcast value is one element: it may sit beside an output, not inside it.
  std::vector<float> f(6 * 11);
  RowProgram q("scaled");
  Operand xq = q.row_in("x"), s = q.row_scalar_in("s", {DType::f32}), yq = q.row_out("y");
  q.store(yq, q.load(xq) * q.load(s));
  Args b;
  b.set("x", matrix(x.data(), DType::f32, 6, 10)).set("y", matrix(f.data(), DType::f32, 6, 10, 11));
  EXPECT_NO_THROW(bind(q, Args(b).set("s", VectorView{f.data() + 10, DType::f32, 6, 0})));
  EXPECT_EQ(error_of(q, Args(b).set("s", VectorView{f.data() + 12, DType::f32, 6, 0})),
            "scaled: argument 'y': expected memory that does not overlap s, got an overlapping view");
}

// The plan sees only the reductions over the rows that the call's present outputs need: the
// per-row loss alone computes no mean (nothing over the rows), the mean is row values over the
// rows (no per-column accumulator), and a weight gradient is one accumulator a column.
TEST(Bind, PlanInputsCountTheReductionsOverTheRowsTheCallNeeds) {
  Program prog;
  std::vector<float> x(6 * 10), g(6 * 10), loss(6), mean(1), dw(10);
  std::vector<int64_t> t(6, 3);
  Args a;
  a.set("logits", matrix(x.data(), DType::f32, 6, 10)).set("dlogits", matrix(g.data(), DType::f32, 6, 10));
  a.set("target", VectorView{t.data(), DType::i64, 6}).set("loss", VectorView{loss.data(), DType::f32, 6});
  PlanInputs in = bind(prog.p, a).plan_inputs();
  EXPECT_FALSE(in.reduces_rows);
  EXPECT_FALSE(in.loops_over_rows());
  in = bind(prog.p, Args(a).set("mean", VectorView{mean.data(), DType::f32, 1})).plan_inputs();
  EXPECT_TRUE(in.reduces_rows);
  EXPECT_EQ(in.rows_reduction_parts, 0);
  EXPECT_FALSE(in.loops_over_rows());
  RowProgram wg("weight_gradient");
  Operand xw = wg.row_in("x"), dy = wg.row_in("dy");
  Operand dweight = wg.col_out("dweight", DTypeSet::floats(), /*optional=*/true);
  Operand dx = wg.row_out("dx");
  wg.store(dx, wg.load(dy));
  wg.store(dweight, wg.reduce1(Axis::rows, monoid::sum(), wg.load(xw) * wg.load(dy)));
  Args b;
  b.set("x", matrix(x.data(), DType::f32, 6, 10)).set("dy", matrix(x.data(), DType::f32, 6, 10));
  b.set("dx", matrix(g.data(), DType::f32, 6, 10));
  EXPECT_FALSE(bind(wg, b).plan_inputs().reduces_rows);
  in = bind(wg, Args(b).set("dweight", VectorView{dw.data(), DType::f32, 10})).plan_inputs();
  EXPECT_TRUE(in.reduces_rows);
  EXPECT_EQ(in.rows_reduction_parts, 1);
  EXPECT_TRUE(in.loops_over_rows());
}

// Rows and columns come from the first row operand that is not optional, whatever the order of
// the declarations; an optional row operand given must agree with it.
TEST(Bind, OptionalRowOperandsFollowTheRequiredOne) {
  RowProgram p("residual");
  Operand extra = p.row_in("extra", DTypeSet::floats(), "", /*optional=*/true);
  Operand x = p.row_in("x"), y = p.row_out("y");
  p.store(y, p.load(x) + p.load_or(extra, 0.0));
  std::vector<float> a(4 * 8), b(4 * 8), out(4 * 8);
  Args args;
  args.set("x", matrix(a.data(), DType::f32, 4, 8)).set("y", matrix(out.data(), DType::f32, 4, 8));
  const BoundCall call = bind(p, args);
  EXPECT_EQ(call.rows, 4);
  EXPECT_FALSE(call.operand("extra").present);
  EXPECT_EQ(error_of(p, Args(args).set("extra", matrix(b.data(), DType::f32, 4, 7))),
            "residual: argument 'extra': expected shape (4, 8) like x, got (4, 7)");
  EXPECT_TRUE(bind(p, Args(args).set("extra", matrix(b.data(), DType::f32, 4, 8))).operand("extra").present);
}

TEST(Bind, AProgramRunsEndToEndAgainstItsReference) {
  Program prog;
  const int64_t rows = 9, cols = 37;
  std::vector<float> x(rows * cols), g(rows * cols), loss(rows), mean(1);
  std::vector<int64_t> t(rows);
  for (int64_t i = 0; i < rows * cols; ++i) x[i] = float((i * 37) % 23) / 7.0f - 1.5f;
  for (int64_t r = 0; r < rows; ++r) t[r] = (r * 5) % cols;
  Args a;
  a.set("logits", matrix(x.data(), DType::f32, rows, cols))
      .set("target", VectorView{t.data(), DType::i64, rows})
      .set("dlogits", matrix(g.data(), DType::f32, rows, cols))
      .set("loss", VectorView{loss.data(), DType::f32, rows})
      .set("mean", VectorView{mean.data(), DType::f32, 1})
      .set("smoothing", 0.1);
  for (InputCaching caching : {InputCaching::registers, InputCaching::reread}) {
    PlanRequest req;
    req.caching = caching;
    const Reference want = reference(prog.p, a);
    run(prog.p, a, {req, nullptr, Backend::cpu});
    const OracleCheck check = check_against_reference(prog.p, a, want);
    EXPECT_TRUE(check.ok) << check.first_mismatch;
    EXPECT_EQ(check.checked, rows * cols + rows + 1);
  }
}

}  // namespace
}  // namespace tile
