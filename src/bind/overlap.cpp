#include "bind/overlap.hpp"

#include <algorithm>

namespace tile {

namespace {

// floor(a / b) and ceil(a / b) for b > 0.
int64_t floor_div(int64_t a, int64_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }
int64_t ceil_div(int64_t a, int64_t b) { return -floor_div(-a, b); }

// Whether some row j < b.rows of `b` intersects the byte interval [lo, hi), lo < hi.
bool hits_row(const StridedBytes& b, int64_t lo, int64_t hi) {
  // Row j covers [b0 + j s, b0 + j s + len): it meets [lo, hi) iff b0 + j s < hi and
  // b0 + j s + len > lo, i.e. (lo - len - b0) / s < j < (hi - b0) / s.
  const int64_t b0 = int64_t(b.start);
  if (b.rows == 1) return b0 < hi && b0 + b.length > lo;
  const int64_t j_lo = std::max<int64_t>(0, floor_div(lo - b.length - b0, b.stride) + 1);
  const int64_t j_hi = std::min<int64_t>(b.rows - 1, ceil_div(hi - b0, b.stride) - 1);
  return j_lo <= j_hi;
}

}  // namespace

bool overlaps(const StridedBytes& a, const StridedBytes& b) {
  if (a.rows <= 0 || b.rows <= 0 || a.length <= 0 || b.length <= 0) return false;
  const int64_t a0 = int64_t(a.start), b0 = int64_t(b.start);
  const int64_t a_end = a0 + (a.rows - 1) * (a.rows > 1 ? a.stride : 0) + a.length;
  const int64_t b_end = b0 + (b.rows - 1) * (b.rows > 1 ? b.stride : 0) + b.length;
  if (a_end <= b0 || b_end <= a0) return false;
  if (a.rows > 1 && b.rows > 1 && a.stride == b.stride && a.stride > 0) {
    // Rows i of a and j of b meet iff -a.length < (a0 - b0) + k s < b.length for k = i - j,
    // with k in [-(b.rows - 1), a.rows - 1].
    const int64_t s = a.stride, d = a0 - b0;
    const int64_t k_lo = std::max<int64_t>(-(b.rows - 1), floor_div(-a.length - d, s) + 1);
    const int64_t k_hi = std::min<int64_t>(a.rows - 1, ceil_div(b.length - d, s) - 1);
    return k_lo <= k_hi;
  }
  // Different strides: walk the view with fewer rows, only over rows inside the other's range.
  const StridedBytes& few = a.rows <= b.rows ? a : b;
  const StridedBytes& many = a.rows <= b.rows ? b : a;
  const int64_t f0 = int64_t(few.start);
  for (int64_t i = 0; i < few.rows; ++i) {
    const int64_t lo = f0 + i * (few.rows > 1 ? few.stride : 0);
    if (hits_row(many, lo, lo + few.length)) return true;
  }
  return false;
}

}  // namespace tile
