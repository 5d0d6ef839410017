// Host matrices of the tests and the `tile` command: sizes computed without overflow, bad
// arguments refused by name before anything is allocated, the guard band catching stray writes.
#include "testing/host_tensor.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <limits>
#include <string>

#include "tile/error.hpp"

namespace tile::testing {
namespace {

constexpr int64_t kMax = std::numeric_limits<int64_t>::max();

// The message of the tile::Error that `f` throws; fails the test when it throws nothing else.
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected tile::Error";
  return "";
}

TEST(HostMatrix, AllocationBytesCountOffsetRowsAndGuard) {
  // (offset + (rows - 1) * stride + cols + guard) * element size
  EXPECT_EQ(HostMatrix::allocation_bytes(DType::f32, 3, 5, 8, 1, 64), size_t((1 + 2 * 8 + 5 + 64) * 4));
  EXPECT_EQ(HostMatrix::allocation_bytes(DType::bf16, 37, 1537, 1537), size_t((36 * 1537 + 1537 + 64) * 2));
  EXPECT_EQ(HostMatrix::allocation_bytes(DType::f16, 0, 4, 4, 3, 64), size_t((3 + 64) * 2));  // no rows
  EXPECT_EQ(HostMatrix::allocation_bytes(DType::f32, 1, 4, kMax, 0, 0), size_t(16));          // one row: stride unused
  HostMatrix m(DType::f32, 3, 5, 8, 1, 64);
  EXPECT_EQ(m.bytes().size(), HostMatrix::allocation_bytes(DType::f32, 3, 5, 8, 1, 64));
}

TEST(HostMatrix, LargestSizeBelow2To63BytesIsAccepted) {
  // kMax / 4 elements of 4 bytes is the last size that fits; one more element does not.
  EXPECT_EQ(HostMatrix::allocation_bytes(DType::f32, 1, kMax / 4, kMax / 4, 0, 0), size_t(kMax / 4 * 4));
  EXPECT_NE(error_of([] { HostMatrix::allocation_bytes(DType::f32, 1, kMax / 4, kMax / 4, 0, 1); }), "");
}

TEST(HostMatrix, NegativeArgumentsAreNamed) {
  EXPECT_NE(error_of([] { HostMatrix::allocation_bytes(DType::f32, -1, 4, 4); }).find("argument 'rows'"),
            std::string::npos);
  EXPECT_NE(error_of([] { HostMatrix::allocation_bytes(DType::f32, 2, -4, 4); }).find("argument 'cols'"),
            std::string::npos);
  EXPECT_NE(error_of([] { HostMatrix::allocation_bytes(DType::f32, 2, 4, 4, -1); }).find("argument 'offset_elems'"),
            std::string::npos);
  EXPECT_NE(error_of([] { HostMatrix::allocation_bytes(DType::f32, 2, 4, 4, 0, -64); }).find("argument 'guard_elems'"),
            std::string::npos);
}

TEST(HostMatrix, StrideBelowColsIsRefused) {
  const std::string message = error_of([] { HostMatrix(DType::f32, 10, 4, -1); });
  EXPECT_NE(message.find("argument 'row_stride'"), std::string::npos) << message;
  EXPECT_NE(message.find("row stride >= cols = 4"), std::string::npos) << message;
  EXPECT_NE(message.find("got -1"), std::string::npos) << message;
  EXPECT_NE(error_of([] { HostMatrix(DType::f32, 2, 8, 7); }), "");
}

// The shapes that once overflowed the size arithmetic: each is refused before any allocation.
TEST(HostMatrix, OverflowingSizesAreRefusedNotWrapped) {
  struct Case {
    DType dtype;
    int64_t rows, cols, stride, offset, guard;
  };
  const Case cases[] = {
      {DType::f32, 4611686018427387905, 4, 4, 0, 64},                    // rows * stride wraps
      {DType::f32, 3, 4611686018427387904, 4611686018427387904, 0, 64},  // (rows - 1) * stride wraps
      {DType::f32, 2, 4, kMax, 0, 64},                                   // the stride alone
      {DType::f32, 1, kMax, kMax, 0, 0},                                 // elements fit, bytes do not
      {DType::bf16, 1, kMax - 10, kMax - 10, 5, 20},                     // offset and guard push it over
      {DType::f16, 1, kMax / 2 + 1, kMax / 2 + 1, 0, 0},                 // bytes exactly 2^63
  };
  for (const Case& c : cases) {
    const std::string message = error_of([&] { HostMatrix m(c.dtype, c.rows, c.cols, c.stride, c.offset, c.guard); });
    EXPECT_NE(message.find("HostMatrix: argument 'rows, cols, row_stride'"), std::string::npos) << message;
    EXPECT_NE(message.find("below 2^63"), std::string::npos) << message;
    EXPECT_NE(message.find("rows = " + std::to_string(c.rows)), std::string::npos) << message;
  }
}

TEST(HostVector, SizesAreCheckedAndNamed) {
  EXPECT_EQ(HostVector::allocation_bytes(DType::f16, 10), size_t(10 * 2 + 16));
  EXPECT_EQ(HostVector(DType::f32, 3).bytes.size(), size_t(3 * 4 + 16));
  std::string message = error_of([] { HostVector v(DType::f32, -1); });
  EXPECT_NE(message.find("HostVector: argument 'size'"), std::string::npos) << message;
  message = error_of([] { HostVector v(DType::f32, kMax / 4); });  // * 4 + 16 passes 2^63
  EXPECT_NE(message.find("HostVector: argument 'size'"), std::string::npos) << message;
  EXPECT_NE(message.find("below 2^63"), std::string::npos) << message;
  EXPECT_NE(error_of([] { HostVector v(DType::bf16, kMax); }), "");
}

TEST(HostMatrix, GuardBandCatchesWritesOutsideTheRows) {
  HostMatrix m(DType::f32, 3, 5, 8, 1, 16);
  EXPECT_TRUE(m.outside_untouched());
  for (int64_t r = 0; r < 3; ++r)
    for (int64_t c = 0; c < 5; ++c) store_from_float(m.data(), r * 8 + c, DType::f32, 1.0f);
  EXPECT_TRUE(m.outside_untouched());               // writes inside the rows are allowed
  store_from_float(m.data(), 5, DType::f32, 1.0f);  // the stride gap after row 0
  EXPECT_FALSE(m.outside_untouched());
  m.poison();
  store_from_float(m.data(), 2 * 8 + 5, DType::f32, 1.0f);  // just past the last row
  EXPECT_FALSE(m.outside_untouched());
  m.poison();
  store_from_float(m.data(), -1, DType::f32, 1.0f);  // the offset before the first row
  EXPECT_FALSE(m.outside_untouched());
}

}  // namespace
}  // namespace tile::testing
