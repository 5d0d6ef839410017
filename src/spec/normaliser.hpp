// scaled_normaliser: the row scalars that normalise x by statistics kept at an exponent (the
// scaled monoids' parts), shared by the built-in norms and the training programs so they compute
// rstd the same way. Tested through tests/api/cpu_sweep_test.cpp and tests/spec/training_ops_test.cpp.
#pragma once

#include "tile/spec.hpp"

namespace tile {

// The normalisation of statistics kept at exponent e (ms: the mean square of x 2^-e) as row
// scalars: the output is (x a - mean 2^(e - ec)) b, and rstd. With ec = e clamped to
// [-103, 125] ([-970, 1021] in f64: monoid::kF32Exponents), a = 2^-ec is a normal float and
// x a is exact and below 8, and b = rsqrt(ms + eps 4^-e) 2^(ec - e) stays finite even where
// rstd = 2^-e rsqrt(...) exceeds the float type (a tiny row with eps = 0), so the output is
// right wherever the float type holds it. Where eps 4^-e >= 1e30 the statistics no longer
// matter (ms < 2^37 is below eps's last bit in f32 and f64): b = 2^ec rsqrt(eps + ms 4^e) (the
// second term only carries a NaN). Where eps 4^-e underflows (a huge row), a floor of the
// smallest normal (2^-126, 2^-1022) for eps > 0, below ms of any row that is not constant,
// keeps a constant row's 0 * b at 0 rather than 0 * inf.
struct Normaliser {
  RowExpr a, b, rstd;
};
Normaliser scaled_normaliser(RowProgram& p, RowExpr e, RowExpr mean_square, RowExpr eps);

}  // namespace tile
