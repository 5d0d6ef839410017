// Host-side matrices for checks: random fill, poisoning and a guard band, used by the tests
// and by the `tile` command.
#pragma once

#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

#include "tile/tensor.hpp"

namespace tile::testing {

// The value patterns the fuzz draws a row from (docs/source/numerics.md lists them).
enum class RowPattern : uint8_t {
  normal,       // N(0, s), s = 10^U(-2, 2)
  magnitudes,   // each element +-2^U over the dtype's whole range, some exactly +-max
  huge,         // each element within 2^-8 of +-max: sums and squares overflow the dtype
  constant,     // one value, from 0 and the smallest subnormal to +-max
  offset,       // c + N(0, |c| 10^U(-6, -2)): ill-conditioned for LayerNorm
  tiny,         // subnormal and barely normal magnitudes
  all_neg_inf,  // every element -inf
  count
};
const char* pattern_name(RowPattern pattern);
double dtype_max(DType t);            // largest finite value
double dtype_min_subnormal(DType t);  // smallest positive value

// A host buffer for a (rows, cols) matrix with row_stride, starting `offset_elems` elements
// into the allocation (to make misaligned rows), with `guard_elems` poisoned elements after
// the last row to detect writes past it.
class HostMatrix {
 public:
  HostMatrix(DType dtype, int64_t rows, int64_t cols, int64_t row_stride, int64_t offset_elems = 0,
             int64_t guard_elems = 64);
  // The bytes such a matrix allocates, computed without overflow; throws tile::Error naming
  // the argument when one is negative, row_stride < cols, or the size exceeds 2^63 - 1 bytes.
  static size_t allocation_bytes(DType dtype, int64_t rows, int64_t cols, int64_t row_stride, int64_t offset_elems = 0,
                                 int64_t guard_elems = 64);
  TensorView view() { return {data(), dtype_, rows_, cols_, stride_}; }
  void* data() { return bytes_.data() + (offset_ * dtype_size(dtype_)); }
  std::vector<uint8_t>& bytes() { return bytes_; }
  int64_t offset_elems() const { return offset_; }
  int64_t span_elems() const { return rows_ == 0 ? 0 : (rows_ - 1) * stride_ + cols_; }

  void fill_random(std::mt19937_64& rng, double scale = 1.0);  // N(0, scale), never all zeros
  // Row r drawn from `pattern`, then `specials` random elements set to NaN, +inf or -inf.
  void fill_row(std::mt19937_64& rng, int64_t r, RowPattern pattern, int specials);
  double at(int64_t r, int64_t c) { return load_as_double(data(), r * stride_ + c, dtype_); }
  void poison();                                               // every byte 0xff (NaN in each dtype)
  // True when no byte outside the rows' [0, cols) elements differs from the poison.
  bool outside_untouched() const;

 private:
  DType dtype_;
  int64_t rows_, cols_, stride_, offset_;
  std::vector<uint8_t> bytes_;
};

struct HostVector {
  HostVector(DType dtype, int64_t size) : dtype(dtype), bytes(allocation_bytes(dtype, size)), size(size) {}
  // As HostMatrix::allocation_bytes, for `size` elements and 16 bytes of slack.
  static size_t allocation_bytes(DType dtype, int64_t size);
  DType dtype;
  std::vector<uint8_t> bytes;
  int64_t size;
  void* data() { return bytes.data(); }
  VectorView view() { return {bytes.data(), dtype, size}; }
  void fill_random(std::mt19937_64& rng, double mean, double scale);
  // N(mean, scale) within the dtype's finite range, then `specials` random elements set to
  // NaN or 0 (or +-inf when `infinities`).
  void fill_with_specials(std::mt19937_64& rng, double mean, double scale, int specials, bool infinities);
};

}  // namespace tile::testing
