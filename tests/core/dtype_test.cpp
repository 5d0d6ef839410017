// dtype (include/tile/dtype.hpp, src/core/dtype.cpp): names, sizes and the conversions between
// memory dtypes and register values, fp64 included.
#include "tile/dtype.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "tile/error.hpp"

namespace tile {
namespace {

TEST(DType, NamesSizesAndParsing) {
  EXPECT_EQ(dtype_size(DType::f64), 8);
  EXPECT_TRUE(is_float(DType::f64));
  EXPECT_EQ(dtype_name(DType::f64), "f64");
  for (const char* name : {"f64", "float64", "fp64"}) EXPECT_EQ(parse_dtype(name), DType::f64) << name;
  EXPECT_EQ(parse_dtype("bf16"), DType::bf16);
  try {
    parse_dtype("f8");
    ADD_FAILURE() << "f8 parsed";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "dtype: expected one of f32, f64, f16, bf16, i32, i64, got 'f8'");
  }
  // The earlier dtypes keep their numbers (they name dtypes in cache keys).
  EXPECT_EQ(int(DType::i64), 4);
  EXPECT_EQ(int(DType::f64), 5);
}

TEST(DType, Float64ValuesRoundTripExactly) {
  const double values[] = {0.0, -0.0, 0x1p-1074, 1.0 + 0x1p-52, -1.7976931348623157e308,
                           std::numeric_limits<double>::infinity()};
  double buf[1];
  for (double v : values) {
    store_from_double(buf, 0, DType::f64, v);
    EXPECT_EQ(std::signbit(load_as_double(buf, 0, DType::f64)), std::signbit(v));
    EXPECT_EQ(load_as_double(buf, 0, DType::f64), v);
  }
  store_from_double(buf, 0, DType::f64, std::numeric_limits<double>::quiet_NaN());
  EXPECT_TRUE(std::isnan(load_as_double(buf, 0, DType::f64)));
  store_from_double(buf, 0, DType::f64, -7.9);
  EXPECT_EQ(load_as_int(buf, 0, DType::f64), -7);  // truncated toward zero
}

TEST(DType, DoublesStoreToNarrowerDtypesRoundingOnce) {
  float f[1];
  store_from_double(f, 0, DType::f32, 1.0 + 0x1p-30);  // rounds to nearest: 1
  EXPECT_EQ(f[0], 1.0f);
  uint16_t h[1];
  store_from_double(h, 0, DType::bf16, 3.0);
  EXPECT_EQ(load_as_double(h, 0, DType::bf16), 3.0);
  int64_t i[1];
  store_from_double(i, 0, DType::i64, -7.9);
  EXPECT_EQ(i[0], -7);
  EXPECT_EQ(load_as_double(i, 0, DType::i64), -7.0);
  // fp32 and 16-bit loads widen exactly.
  f[0] = 0x1p-149f;
  EXPECT_EQ(load_as_double(f, 0, DType::f32), 0x1p-149);
}

}  // namespace
}  // namespace tile
