// overlaps: whether two strided byte views share a byte.
//
// A view is `rows` intervals [start + i * stride, start + i * stride + length), i < rows. Two
// views of one allocation may interleave without sharing a byte (x = b[:, :64], y = b[:, 64:]):
// the test is exact and O(log) in the strides, never a loop over rows.
// Tested by tests/bind/overlap_test.cpp.
#pragma once

#include <cstdint>

namespace tile {

struct StridedBytes {
  uintptr_t start = 0;
  int64_t stride = 0;  // bytes between rows (any value when rows == 1)
  int64_t length = 0;  // bytes in each row
  int64_t rows = 0;
};

bool overlaps(const StridedBytes& a, const StridedBytes& b);

}  // namespace tile
