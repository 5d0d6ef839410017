#include "bind/overlap.hpp"

#include <algorithm>
#include <utility>

namespace tile {

namespace {

using i128 = __int128;  // byte offsets and their products, exact
using u128 = unsigned __int128;

i128 floor_div(i128 a, i128 b) { return a / b - (a % b != 0 && a < 0); }  // b > 0
i128 ceil_div(i128 a, i128 b) { return -floor_div(-a, b); }

// sum_{i < n} floor((a * i + b) / m) modulo 2^128 (a, b >= 0, m > 0, a * n + b < 2^127): the
// Euclid-like reduction, O(log m) steps.
u128 floor_sum(u128 n, u128 m, u128 a, u128 b) {
  u128 sum = 0;
  while (n > 0) {
    if (a >= m) sum += (n % 2 == 0 ? n / 2 * (n - 1) : (n - 1) / 2 * n) * (a / m), a %= m;
    if (b >= m) sum += n * (b / m), b %= m;
    const u128 y = a * n + b;
    if (y < m) break;
    n = y / m, b = y % m;
    std::swap(m, a);
  }
  return sum;
}

}  // namespace

// Rows ra of a and rb of b share a byte iff rb * Sb lies in I(ra) = [lo + ra * Sa, hi + ra * Sa]
// (lo, hi from the bases and widths). Over the ra whose I(ra) meets [0, E], E the last row's
// offset, an I(ra) reaching past either end holds that end (a row of b); otherwise the question
// is whether some I(ra) holds a multiple of Sb: (hi + ra * Sa) mod Sb <= hi - lo, counted with
// floor sums. Exact, O(log) in the strides, never per row.
bool overlaps(const StridedBytes& va, const StridedBytes& vb) {
  if (va.rows <= 0 || vb.rows <= 0 || va.length <= 0 || vb.length <= 0) return false;
  // A single row's stride is irrelevant; give it one that keeps the arithmetic well defined.
  const i128 sa = va.rows > 1 ? va.stride : std::max<int64_t>(va.length, 1);
  const i128 sb = vb.rows > 1 ? vb.stride : std::max<int64_t>(vb.length, 1);
  // Disjoint spans (separate allocations, the common case) need no arithmetic on the strides.
  if (i128(va.start) + (va.rows - 1) * sa + va.length <= i128(vb.start) ||
      i128(vb.start) + (vb.rows - 1) * sb + vb.length <= i128(va.start))
    return false;
  const i128 d = i128(va.start) - i128(vb.start);
  const i128 lo = d - vb.length + 1, hi = d + va.length - 1, end = i128(vb.rows - 1) * sb;
  const i128 first = std::max<i128>(0, ceil_div(-hi, sa));
  const i128 last = std::min<i128>(va.rows - 1, floor_div(end - lo, sa));
  if (first > last) return false;
  if (lo + first * sa < 0 || hi + last * sa > end) return true;
  const i128 w = hi - lo, m = sb;
  if (w + 1 >= m) return true;  // every interval of m integers holds a multiple of m
  // i = ra - first in [0, n): x_i = c + s * i (mod m); x_i > w iff floor((x_i + m - 1 - w) / m) > floor(x_i / m).
  const i128 n = last - first + 1, s = sa % m, c = (hi + first * sa) % m;
  const u128 above = floor_sum(u128(n), u128(m), u128(s), u128(c + m - 1 - w)) - floor_sum(u128(n), u128(m), u128(s), u128(c));
  return above < u128(n);
}

}  // namespace tile
