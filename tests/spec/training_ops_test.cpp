// The training operators' row programs (src/spec/training_ops.cpp) on the CPU backend: each
// against float64 references written with plain loops (tests/support/training_cases.hpp) over
// a seeded sweep and over plans that take every lowering path; finite-difference gradients of
// float64 forward references against every backward; weight gradients and reduced losses
// bitwise identical from run to run.
#include <gtest/gtest.h>

#include <functional>

#include "support/training_cases.hpp"

namespace tile::testing {
namespace {

TEST(TrainingOps, ProgramsValidateAndNameThemselves) {
  for (const std::string& name : training_program_names()) {
    const RowProgram& p = training_program(name);
    EXPECT_EQ(p.name(), name);
    EXPECT_NO_THROW(p.validate());
  }
  for (int pass = 0; pass < 3; ++pass)
    for (bool ls : {false, true})
      for (bool cap : {false, true}) {
        const RowProgram& p = cross_entropy_program(CrossEntropyPass(pass), ls, cap);
        EXPECT_EQ(p.find_operand("label_smoothing") >= 0, ls);
        EXPECT_EQ(p.find_operand("softcap") >= 0, cap);
        EXPECT_EQ(&p, &cross_entropy_program(CrossEntropyPass(pass), ls, cap));  // built once
      }
  EXPECT_THROW(training_program("softmax"), Error);
}

TEST(TrainingOps, SeededSweepOnTheCpuBackend) {
  const std::vector<TrainCase> cases = train_sweep(4096);
  EXPECT_GT(cases.size(), 300u);
  for (const TrainCase& c : cases) expect_train_case_passes(c, Backend::cpu);
}

TEST(TrainingOps, Float64CallsOnTheCpuBackend) {
  const std::vector<TrainCase> cases = train_sweep_f64(4096);
  EXPECT_GT(cases.size(), 150u);
  for (const TrainCase& c : cases) expect_train_case_passes(c, Backend::cpu);
}

TEST(TrainingOps, EveryOperatorOnEveryLoweringPath) {
  uint64_t seed = 9000;
  for (int op = 0; op <= int(TrainOp::cross_entropy_fused); ++op)
    for (const PlanRequest& plan : plan_variants())
      for (auto [rows, cols, pad, offset] :
           {std::tuple<int64_t, int64_t, int64_t, int64_t>{9, 1537, 0, 1}, {5, 256, 3, 0}}) {
        TrainCase c;
        c.op = TrainOp(op), c.rows = rows, c.cols = cols, c.pad = pad, c.offset = offset, c.plan = plan,
        c.seed = seed++;
        c.special = true;
        c.ce.label_smoothing = 0.05, c.ce.z_loss = 1e-4;
        c.ce.reduction = Reduction(seed % 3);
        expect_train_case_passes(c, Backend::cpu);
      }
  // 16-bit rows cached as loaded, two a register.
  for (int op = 0; op <= int(TrainOp::cross_entropy_fused); ++op) {
    TrainCase c;
    c.op = TrainOp(op), c.rows = 7, c.cols = 1000, c.in = c.out = c.res = c.w = DType::bf16, c.seed = seed++;
    c.plan.cache_format = CacheFormat::packed, c.plan.vector_elems = 8, c.plan.caching = InputCaching::registers;
    c.plan.workers_per_program = 128;
    expect_train_case_passes(c, Backend::cpu);
  }
}

// A peeled head (16-byte vectors from each row's own first aligned column: aligned bases, rows
// of odd strides) for every operator without per-column accumulators, cross-entropy's sums over
// the rows included: cached, re-read, and groups looping over row blocks (each block's heads differ).
TEST(TrainingOps, PeeledHeadsOnOperatorsWithoutPerColumnAccumulators) {
  uint64_t seed = 9400;
  std::vector<PlanRequest> plans(3);
  for (PlanRequest& p : plans) p.row_head = RowHead::peel, p.vector_elems = 8, p.workers_per_program = 256;
  plans[1].caching = InputCaching::reread, plans[1].stripe_unroll = 2, plans[1].workers_per_program = 64;
  plans[2].grid_limit = 2;
  for (TrainOp op : {TrainOp::softmax_backward, TrainOp::log_softmax_backward, TrainOp::fused_add_rms_norm,
                     TrainOp::cross_entropy, TrainOp::cross_entropy_backward, TrainOp::cross_entropy_fused})
    for (const PlanRequest& plan : plans)
      for (auto [rows, cols, pad] : {std::tuple<int64_t, int64_t, int64_t>{9, 1537, 0}, {6, 1001, 3}}) {
        TrainCase c;
        c.op = op, c.rows = rows, c.cols = cols, c.pad = pad, c.plan = plan, c.seed = seed++;
        c.in = c.out = c.res = c.w = DType::bf16;
        c.special = seed % 2 == 0;
        c.ce.label_smoothing = 0.05, c.ce.reduction = Reduction(seed % 3);
        expect_train_case_passes(c, Backend::cpu);
      }
}

// Per-column accumulators cannot follow a peeled worker's columns from row to row.
TEST(TrainingOps, PeeledHeadsAreRefusedWithPerColumnAccumulators) {
  TrainCase c;
  c.op = TrainOp::rms_norm_backward, c.rows = 4, c.cols = 1537, c.in = c.out = c.w = DType::bf16;
  c.plan.row_head = RowHead::peel;
  try {
    run_train_case(c, Backend::cpu);
    ADD_FAILURE() << "a peeled rms_norm_backward plan ran";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("rms_norm_backward: argument 'plan.row_head'"), std::string::npos) << m;
    EXPECT_NE(m.find("per-column accumulators"), std::string::npos) << m;
  }
}

TEST(TrainingOps, CrossEntropyOptionsOneByOne) {
  uint64_t seed = 9500;
  for (TrainOp op : {TrainOp::cross_entropy, TrainOp::cross_entropy_backward, TrainOp::cross_entropy_fused})
    for (Reduction red : {Reduction::none, Reduction::sum, Reduction::mean})
      for (int variant = 0; variant < 6; ++variant) {
        TrainCase c;
        c.op = op, c.rows = 13, c.cols = 501, c.seed = seed++, c.special = variant == 5;
        c.ce.reduction = red;
        if (variant == 1) c.ce.label_smoothing = 0.2;
        if (variant == 2) c.ce.z_loss = 1e-2;
        if (variant == 3) c.ce.softcap = 5.0;
        if (variant == 4) c.ce.label_smoothing = 1.0, c.ce.softcap = 30.0, c.ce.z_loss = 0.5, c.ce.ignore_index = 0;
        if (variant == 5) c.ce.label_smoothing = 0.1, c.ce.softcap = 2.0;
        c.second = variant != 2;  // dloss absent: 1
        c.in_place = variant == 3;
        expect_train_case_passes(c, Backend::cpu);
      }
}

// ---- finite differences ----

// Central differences of f at x, in float64.
std::vector<double> numeric_gradient(const std::function<double(const std::vector<double>&)>& f,
                                     std::vector<double> x) {
  std::vector<double> g(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double v = x[i], h = 1e-6 * std::max(1.0, std::abs(v));
    x[i] = v + h;
    const double up = f(x);
    x[i] = v - h;
    const double down = f(x);
    x[i] = v;
    g[i] = (up - down) / (2 * h);
  }
  return g;
}

// got (a kernel's fp32 output, or a float64 formula) against the numeric gradient: within
// `rtol` of each value plus `rtol` of the largest, or of `terms` when the gradient is a
// difference of larger terms (fp32 rounds those, not their small difference).
void expect_gradient(const std::string& what, const std::vector<double>& got, const std::vector<double>& numeric,
                     double rtol, double terms = 0) {
  ASSERT_EQ(got.size(), numeric.size()) << what;
  double scale = terms;
  for (double v : numeric) scale = std::max(scale, std::abs(v));
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_NEAR(got[i], numeric[i], rtol * (std::abs(numeric[i]) + scale)) << what << " [" << i << "]";
}

std::vector<double> values(const Buf& b) {
  std::vector<double> v;
  for (int64_t r = 0; r < b.rows; ++r)
    for (int64_t c = 0; c < b.width(); ++c) v.push_back(b.at(r, c));
  return v;
}

Buf matrix_of(const std::vector<double>& v, int64_t rows, int64_t cols) {
  Buf b = Buf::matrix(DType::f32, rows, cols, cols);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) b.set(r, c, v[size_t(r * cols + c)]);
  return b;
}

Buf vector_of(const std::vector<double>& v) {
  Buf b = Buf::vector(DType::f32, int64_t(v.size()));
  for (size_t i = 0; i < v.size(); ++i) b.set(int64_t(i), 0, v[i]);
  return b;
}

std::vector<double> random_values(std::mt19937_64& rng, size_t n, double mean, double scale) {
  std::normal_distribution<double> d(mean, scale);
  std::vector<double> v(n);
  for (double& x : v) x = double(float(d(rng)));  // fp32 values: the kernels read these exactly
  return v;
}

double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// Forward references in float64, one row at a time.
std::vector<double> softmax_rows(const std::vector<double>& x, int64_t rows, int64_t cols, bool log) {
  std::vector<double> y(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    double m = -kInf, s = 0;
    for (int64_t c = 0; c < cols; ++c) m = std::max(m, x[size_t(r * cols + c)]);
    for (int64_t c = 0; c < cols; ++c) s += std::exp(x[size_t(r * cols + c)] - m);
    for (int64_t c = 0; c < cols; ++c) {
      const double v = x[size_t(r * cols + c)] - m;
      y[size_t(r * cols + c)] = log ? v - std::log(s) : std::exp(v) / s;
    }
  }
  return y;
}

std::vector<double> norm_rows(const std::vector<double>& x, const std::vector<double>& w, const std::vector<double>& b,
                              int64_t rows, int64_t cols, bool layer) {
  std::vector<double> y(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<double> h(x.begin() + r * cols, x.begin() + (r + 1) * cols);
    double mean = 0, rstd = rms_rstd(h, 1e-6);
    if (layer) std::tie(mean, rstd) = ln_stats(h, 1e-5);
    for (int64_t c = 0; c < cols; ++c)
      y[size_t(r * cols + c)] = (h[size_t(c)] - mean) * rstd * w[size_t(c)] + (layer ? b[size_t(c)] : 0.0);
  }
  return y;
}

TEST(TrainingGradients, SoftmaxAndLogSoftmaxBackwardAreTheForwardsDerivatives) {
  std::mt19937_64 rng(1);
  for (bool log : {false, true})
    for (auto [rows, cols] : {std::pair<int64_t, int64_t>{3, 7}, {2, 33}, {2, 1}}) {
      SCOPED_TRACE(std::string(log ? "log_softmax" : "softmax") + " " + std::to_string(cols));
      const std::vector<double> x = random_values(rng, size_t(rows * cols), 0, 2),
                                dy = random_values(rng, x.size(), 0, 1);
      auto loss = [&](const std::vector<double>& v) { return dot(dy, softmax_rows(v, rows, cols, log)); };
      const std::vector<double> numeric = numeric_gradient(loss, x);
      Env env(Backend::cpu);
      env.add("y", matrix_of(softmax_rows(x, rows, cols, log), rows, cols));
      env.add("dy", matrix_of(dy, rows, cols));
      env.add("dx", Buf::matrix(DType::f32, rows, cols, cols));
      (log ? log_softmax_backward : softmax_backward)(env.mat("y"), env.mat("dy"), env.mat("dx"),
                                                      {{}, nullptr, Backend::cpu});
      expect_gradient("kernel dx", values(env["dx"]), numeric, 1e-5);
      expect_gradient("reference dx", softmax_backward_ref(env["y"], env["dy"], log).want, numeric, 1e-6);
    }
}

TEST(TrainingGradients, NormBackwardsAreTheForwardsDerivatives) {
  std::mt19937_64 rng(2);
  for (bool layer : {false, true})
    for (auto [rows, cols] : {std::pair<int64_t, int64_t>{3, 7}, {2, 33}, {4, 2}}) {
      SCOPED_TRACE(std::string(layer ? "layer_norm" : "rms_norm") + " " + std::to_string(cols));
      // Rows of mean 0.25 (to within rounding): the saved fp32 mean then errs by far less than
      // the rows' spread, which a float64 gradient with exact statistics would otherwise see.
      std::vector<double> x = random_values(rng, size_t(rows * cols), 0, 1.5);
      for (int64_t r = 0; r < rows; ++r) {
        double s = 0;
        for (int64_t c = 0; c + 1 < cols; ++c) s += x[size_t(r * cols + c)];
        if (cols > 1) x[size_t(r * cols + cols - 1)] = double(float(-s));
        for (int64_t c = 0; c < cols; ++c) x[size_t(r * cols + c)] += 0.25;
      }
      const std::vector<double> dy = random_values(rng, x.size(), 0, 1);
      const std::vector<double> w = random_values(rng, size_t(cols), 1, 0.5),
                                b = random_values(rng, size_t(cols), 0, 0.5);
      const std::vector<double> dx_num = numeric_gradient(
          [&](const std::vector<double>& v) { return dot(dy, norm_rows(v, w, b, rows, cols, layer)); }, x);
      const std::vector<double> dw_num = numeric_gradient(
          [&](const std::vector<double>& v) { return dot(dy, norm_rows(x, v, b, rows, cols, layer)); }, w);
      const std::vector<double> db_num = numeric_gradient(
          [&](const std::vector<double>& v) { return dot(dy, norm_rows(x, w, v, rows, cols, layer)); }, b);
      Env env(Backend::cpu);
      env.add("dy", matrix_of(dy, rows, cols)), env.add("x", matrix_of(x, rows, cols));
      env.add("weight", vector_of(w));
      std::vector<double> mean, rstd;
      for (int64_t r = 0; r < rows; ++r) {
        std::vector<double> h(x.begin() + r * cols, x.begin() + (r + 1) * cols);
        auto [mu, rs] = layer ? ln_stats(h, 1e-5) : std::pair<double, double>{0.0, rms_rstd(h, 1e-6)};
        mean.push_back(mu), rstd.push_back(rs);
      }
      env.add("mean", vector_of(mean)), env.add("rstd", vector_of(rstd));
      env.add("dx", Buf::matrix(DType::f32, rows, cols, cols));
      env.add("dweight", Buf::vector(DType::f32, cols)), env.add("dbias", Buf::vector(DType::f32, cols));
      const CallOptions cpu{{}, nullptr, Backend::cpu};
      if (layer)
        layer_norm_backward(env.mat("dy"), env.mat("x"), env.vec("weight"), env.vec("mean"), env.vec("rstd"),
                            env.mat("dx"), env.vec("dweight"), env.vec("dbias"), cpu);
      else
        rms_norm_backward(env.mat("dy"), env.mat("x"), env.vec("weight"), env.vec("rstd"), env.mat("dx"),
                          env.vec("dweight"), cpu);
      // dx is rstd times a difference of terms of the size of dy * weight.
      double terms = 0;
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c)
          terms = std::max(terms, rstd[size_t(r)] * std::abs(dy[size_t(r * cols + c)] * w[size_t(c)]));
      expect_gradient("kernel dx", values(env["dx"]), dx_num, 2e-5, terms);
      expect_gradient("kernel dweight", values(env["dweight"]), dw_num, 2e-5);
      if (layer) expect_gradient("kernel dbias", values(env["dbias"]), db_num, 2e-5);
      Expected dx, dw, db;
      if (layer)
        layer_norm_backward_ref(env["dy"], env["x"], &env["weight"], env["mean"], env["rstd"], dx, dw, db);
      else
        rms_norm_backward_ref(env["dy"], env["x"], &env["weight"], env["rstd"], nullptr, dx, dw);
      expect_gradient("reference dx", dx.want, dx_num, 1e-6, terms);
      expect_gradient("reference dweight", dw.want, dw_num, 1e-6);
    }
}

TEST(TrainingGradients, FusedAddRmsNormBackwardIsTheForwardsDerivative) {
  std::mt19937_64 rng(3);
  const int64_t rows = 3, cols = 9;
  const std::vector<double> x = random_values(rng, size_t(rows * cols), 0, 1),
                            res = random_values(rng, x.size(), 0.2, 1);
  const std::vector<double> w = random_values(rng, size_t(cols), 1, 0.5);
  const std::vector<double> dy = random_values(rng, x.size(), 0, 1), dres = random_values(rng, x.size(), 0, 1);
  // The loss of both outputs: dy . y + dres . residual_out, y = rms_norm(x + residual) * w.
  auto loss = [&](const std::vector<double>& xv, const std::vector<double>& rv, const std::vector<double>& wv) {
    std::vector<double> h(xv.size());
    for (size_t i = 0; i < h.size(); ++i) h[i] = xv[i] + rv[i];
    return dot(dy, norm_rows(h, wv, {}, rows, cols, false)) + dot(dres, h);
  };
  const std::vector<double> dx_num = numeric_gradient([&](const std::vector<double>& v) { return loss(v, res, w); }, x);
  const std::vector<double> dr_num = numeric_gradient([&](const std::vector<double>& v) { return loss(x, v, w); }, res);
  const std::vector<double> dw_num = numeric_gradient([&](const std::vector<double>& v) { return loss(x, res, v); }, w);
  // The forward pass on the CPU backend saves residual_out and rstd; the backward reads them.
  Env env(Backend::cpu);
  env.add("x", matrix_of(x, rows, cols)), env.add("residual", matrix_of(res, rows, cols)),
      env.add("weight", vector_of(w));
  env.add("y", Buf::matrix(DType::f32, rows, cols, cols)),
      env.add("residual_out", Buf::matrix(DType::f32, rows, cols, cols));
  env.add("rstd", Buf::vector(DType::f32, rows));
  env.add("dy", matrix_of(dy, rows, cols)), env.add("dresidual_out", matrix_of(dres, rows, cols));
  env.add("dx", Buf::matrix(DType::f32, rows, cols, cols)),
      env.add("dresidual", Buf::matrix(DType::f32, rows, cols, cols));
  env.add("dweight", Buf::vector(DType::f32, cols));
  const CallOptions cpu{{}, nullptr, Backend::cpu};
  fused_add_rms_norm(env.mat("x"), env.mat("residual"), env.mat("y"), env.mat("residual_out"), env.vec("weight"), 1e-6f,
                     env.vec("rstd"), cpu);
  fused_add_rms_norm_backward(env.mat("dy"), env.mat("dresidual_out"), env.mat("residual_out"), env.vec("weight"),
                              env.vec("rstd"), env.mat("dx"), env.mat("dresidual"), env.vec("dweight"), cpu);
  expect_gradient("kernel dx", values(env["dx"]), dx_num, 2e-5);
  expect_gradient("kernel dresidual", values(env["dresidual"]), dr_num, 2e-5);
  expect_gradient("kernel dweight", values(env["dweight"]), dw_num, 2e-5);
}

TEST(TrainingGradients, CrossEntropyBackwardAndFusedAreTheLossDerivative) {
  std::mt19937_64 rng(4);
  const int64_t rows = 5, cols = 9;
  const std::vector<int64_t> target = {0, cols - 1, -100, 4, 2};  // one ignored row
  for (Reduction red : {Reduction::none, Reduction::sum, Reduction::mean})
    for (int variant = 0; variant < 4; ++variant) {
      CrossEntropyOptions ce;
      ce.reduction = red;
      if (variant >= 1) ce.label_smoothing = 0.15;
      if (variant >= 2) ce.z_loss = 0.02;
      if (variant >= 3) ce.softcap = 2.5;
      SCOPED_TRACE(reduction_name(red) + " variant " + std::to_string(variant));
      const std::vector<double> z = random_values(rng, size_t(rows * cols), 0, 2);
      const bool none = red == Reduction::none;
      const std::vector<double> dloss = random_values(rng, none ? size_t(rows) : 1, 0.5, 1);
      // The upstream gradient times the loss: sum_r dloss_r loss_r, or dloss times the sum or mean.
      auto loss = [&](const std::vector<double>& v) {
        double total = 0, count = 0;
        for (int64_t r = 0; r < rows; ++r) {
          const std::vector<double> row(v.begin() + r * cols, v.begin() + (r + 1) * cols);
          const double l = cross_entropy_row(row, target[size_t(r)], ce, false).loss;
          total += none ? dloss[size_t(r)] * l : l;
          count += target[size_t(r)] != ce.ignore_index;
        }
        return none ? total : dloss[0] * (red == Reduction::mean ? total / count : total);
      };
      const std::vector<double> numeric = numeric_gradient(loss, z);
      Env env(Backend::cpu);
      env.add("logits", matrix_of(z, rows, cols));
      Buf t = Buf::vector(DType::i64, rows);
      for (int64_t r = 0; r < rows; ++r) t.set(r, 0, double(target[size_t(r)]));
      env.add("target", t), env.add("dloss", vector_of(dloss));
      env.add("loss", Buf::vector(DType::f32, none ? rows : 1)), env.add("lse", Buf::vector(DType::f32, rows));
      env.add("count", Buf::vector(DType::f32, 1));
      env.add("dlogits", Buf::matrix(DType::f32, rows, cols, cols)),
          env.add("fused", Buf::matrix(DType::f32, rows, cols, cols));
      const CallOptions cpu{{}, nullptr, Backend::cpu};
      cross_entropy(env.mat("logits"), env.vec("target"), env.vec("loss"), ce, env.vec("lse"), env.vec("count"), cpu);
      EXPECT_NEAR(env["loss"].at(0),
                  none ? cross_entropy_row(std::vector<double>(z.begin(), z.begin() + cols), 0, ce, false).loss
                       : loss(z) / dloss[0],
                  1e-5 * std::abs(env["loss"].at(0)) + 1e-5);
      EXPECT_EQ(env["count"].at(0), 4.0);
      cross_entropy_backward(env.vec("dloss"), env.mat("logits"), env.vec("target"), env.vec("lse"), env.mat("dlogits"),
                             ce, env.vec("count"), cpu);
      expect_gradient("cross_entropy_backward dlogits", values(env["dlogits"]), numeric, 2e-5);
      cross_entropy_fused(env.mat("logits"), env.vec("target"), env.vec("loss"), env.mat("fused"), ce, env.vec("dloss"),
                          {}, env.vec("count"), cpu);
      expect_gradient("cross_entropy_fused dlogits", values(env["fused"]), numeric, 2e-5);
      // The reference's own gradient, per unit upstream gradient, scaled as the kernels scale it.
      std::vector<double> ref;
      for (int64_t r = 0; r < rows; ++r) {
        const std::vector<double> row(z.begin() + r * cols, z.begin() + (r + 1) * cols);
        const double scale = none ? dloss[size_t(r)] : red == Reduction::mean ? dloss[0] / 4.0 : dloss[0];
        for (double g : cross_entropy_row(row, target[size_t(r)], ce, true).grad) ref.push_back(scale * g);
      }
      expect_gradient("reference dlogits", ref, numeric, 1e-6);
    }
}

// ---- repeatability and special rules ----

TEST(TrainingOps, ReductionsOverTheRowsAreBitwiseIdenticalFromRunToRun) {
  uint64_t seed = 9900;
  for (TrainOp op : {TrainOp::rms_norm_backward, TrainOp::layer_norm_backward, TrainOp::fused_add_rms_norm_backward,
                     TrainOp::cross_entropy, TrainOp::cross_entropy_fused})
    for (InputCaching caching : {InputCaching::registers, InputCaching::reread}) {
      TrainCase c;
      c.op = op, c.rows = 67, c.cols = 515, c.in = DType::bf16, c.w = DType::f32, c.seed = seed++;
      c.ce.reduction = Reduction::mean;
      c.plan.caching = caching, c.plan.grid_limit = 5;
      SCOPED_TRACE(c.name());
      const TrainResult a = run_train_case(c, Backend::cpu), b = run_train_case(c, Backend::cpu);
      EXPECT_TRUE(a.cmp.ok) << a.cmp.first;
      for (const char* name : {"dweight", "dbias", "loss", "count"})
        if (a.outputs.count(name)) {
          EXPECT_EQ(a.outputs.at(name), b.outputs.at(name)) << name;
        }
    }
}

TEST(TrainingOps, AnOutOfRangeTargetMakesItsRowNaNInTheKernel) {
  // The entry points refuse such a target on the CPU backend; the program itself (what the GPU
  // runs) gives NaN for the row's loss and gradient, and so for the sum.
  const int64_t rows = 3, cols = 5;
  std::vector<float> z(rows * cols, 0.5f), dz(rows * cols), loss(rows), total(1);
  std::vector<int64_t> t = {1, 5, -1};
  for (const RowProgram* p :
       {&cross_entropy_program(CrossEntropyPass::forward), &cross_entropy_program(CrossEntropyPass::fused)}) {
    Args a;
    a.set("logits", matrix(z.data(), DType::f32, rows, cols)).set("target", VectorView{t.data(), DType::i64, rows});
    a.set("loss", VectorView{loss.data(), DType::f32, rows}).set("loss_sum", VectorView{total.data(), DType::f32, 1});
    if (p->find_operand("dlogits") >= 0) a.set("dlogits", matrix(dz.data(), DType::f32, rows, cols));
    run(*p, a, {{}, nullptr, Backend::cpu});
    EXPECT_NEAR(loss[0], std::log(5.0), 1e-6);
    EXPECT_TRUE(std::isnan(loss[1]) && std::isnan(loss[2]));
    EXPECT_TRUE(std::isnan(total[0]));
    if (p->find_operand("dlogits") >= 0) {
      EXPECT_NEAR(dz[0], 0.2, 1e-6);
      EXPECT_NEAR(dz[1], -0.8, 1e-6);
      for (int64_t i = cols; i < rows * cols; ++i) EXPECT_TRUE(std::isnan(dz[size_t(i)])) << i;
    }
  }
}

}  // namespace
}  // namespace tile::testing
