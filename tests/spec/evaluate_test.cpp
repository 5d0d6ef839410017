// The float64 evaluation of row programs (src/spec/evaluate.cpp) against the oracle written
// independently of them (src/api/oracle.cpp), for the four built-in programs: two readings of
// what the operators mean must agree.
#include <gtest/gtest.h>

#include <random>

#include "testing/host_tensor.hpp"
#include "tile/tile.hpp"

namespace tile {
namespace {

TEST(Evaluate, BuiltInProgramsAgreeWithTheIndependentOracle) {
  std::mt19937_64 rng(9);
  for (Op op : {Op::softmax, Op::log_softmax, Op::rms_norm, Op::layer_norm})
    for (int64_t cols : {1, 7, 300})
      for (bool weight : {false, true}) {
        testing::HostMatrix x(DType::bf16, 5, cols, cols + 3), y(DType::f32, 5, cols, cols);
        x.fill_random(rng, 2.0);
        testing::HostVector w(DType::f32, cols), b(DType::f16, cols);
        w.fill_random(rng, 1.0, 0.5);
        b.fill_random(rng, 0.0, 0.5);
        Call call{op, x.view(), y.view()};
        if (weight && op != Op::softmax && op != Op::log_softmax) call.weight = w.view();
        if (weight && op == Op::layer_norm) call.bias = b.view();
        const std::vector<double> oracle_y = oracle(call);
        const Reference ref = reference(builtin_program(op), to_args(call));
        ASSERT_EQ(ref.at("y").values.size(), oracle_y.size());
        for (size_t i = 0; i < oracle_y.size(); ++i)
          ASSERT_NEAR(ref.at("y").values[i], oracle_y[i], 1e-9 * std::max(1.0, std::abs(oracle_y[i])))
              << op_name(op) << " cols " << cols << " element " << i;
      }
}

}  // namespace
}  // namespace tile
