#include "testing/host_tensor.hpp"

#include <cstring>
#include <string>

#include "tile/error.hpp"

namespace tile::testing {

namespace {

void check_non_negative(const char* owner, const char* arg, int64_t value) {
  if (value < 0) throw_argument_error(owner, arg, "a value >= 0", std::to_string(value));
}

// a * b + c, or false when an intermediate result leaves int64_t.
bool mul_add(int64_t a, int64_t b, int64_t c, int64_t* out) {
  int64_t product;
  return !__builtin_mul_overflow(a, b, &product) && !__builtin_add_overflow(product, c, out);
}

}  // namespace

size_t HostMatrix::allocation_bytes(DType dtype, int64_t rows, int64_t cols, int64_t row_stride, int64_t offset_elems,
                                    int64_t guard_elems) {
  check_non_negative("HostMatrix", "rows", rows);
  check_non_negative("HostMatrix", "cols", cols);
  check_non_negative("HostMatrix", "offset_elems", offset_elems);
  check_non_negative("HostMatrix", "guard_elems", guard_elems);
  if (row_stride < cols)
    throw_argument_error("HostMatrix", "row_stride", "a row stride >= cols = " + std::to_string(cols),
                         std::to_string(row_stride));
  // (offset + (rows - 1) * row_stride + cols + guard) * element size, each step checked.
  int64_t span = 0, elems = 0, bytes = 0;
  const bool fits = (rows == 0 || mul_add(rows - 1, row_stride, cols, &span)) &&
                    !__builtin_add_overflow(span, offset_elems, &elems) &&
                    !__builtin_add_overflow(elems, guard_elems, &elems) && mul_add(elems, dtype_size(dtype), 0, &bytes);
  if (!fits)
    throw_argument_error("HostMatrix", "rows, cols, row_stride",
                         "(offset_elems + (rows - 1) * row_stride + cols + guard_elems) * " +
                             std::to_string(dtype_size(dtype)) + " bytes below 2^63",
                         "rows = " + std::to_string(rows) + ", cols = " + std::to_string(cols) + ", row_stride = " +
                             std::to_string(row_stride) + ", offset_elems = " + std::to_string(offset_elems) +
                             ", guard_elems = " + std::to_string(guard_elems));
  return size_t(bytes);
}

HostMatrix::HostMatrix(DType dtype, int64_t rows, int64_t cols, int64_t row_stride, int64_t offset_elems,
                       int64_t guard_elems)
    : dtype_(dtype), rows_(rows), cols_(cols), stride_(row_stride), offset_(offset_elems) {
  bytes_.assign(allocation_bytes(dtype, rows, cols, row_stride, offset_elems, guard_elems), 0xff);
}

size_t HostVector::allocation_bytes(DType dtype, int64_t size) {
  check_non_negative("HostVector", "size", size);
  int64_t bytes = 0;
  if (!mul_add(size, dtype_size(dtype), 16, &bytes))
    throw_argument_error("HostVector", "size", "size * " + std::to_string(dtype_size(dtype)) + " + 16 bytes below 2^63",
                         std::to_string(size));
  return size_t(bytes);
}

void HostMatrix::fill_random(std::mt19937_64& rng, double scale) {
  std::normal_distribution<double> dist(0.0, scale);
  for (int64_t r = 0; r < rows_; ++r)
    for (int64_t c = 0; c < cols_; ++c) {
      double v = dist(rng);
      if (v == 0.0) v = scale * 0.5;  // never zeros
      store_from_float(data(), r * stride_ + c, dtype_, float(v));
    }
}

void HostMatrix::poison() { std::memset(bytes_.data(), 0xff, bytes_.size()); }

bool HostMatrix::outside_untouched() const {
  const int es = dtype_size(dtype_);
  const int64_t total = int64_t(bytes_.size()) / es;
  for (int64_t e = 0; e < total; ++e) {
    int64_t rel = e - offset_;
    bool inside = rel >= 0 && rel < span_elems() && rel % stride_ < cols_;
    if (inside) continue;
    for (int b = 0; b < es; ++b)
      if (bytes_[size_t(e * es + b)] != 0xff) return false;
  }
  return true;
}

void HostVector::fill_random(std::mt19937_64& rng, double mean, double scale) {
  std::normal_distribution<double> dist(mean, scale);
  for (int64_t i = 0; i < size; ++i) store_from_float(data(), i, dtype, float(dist(rng)));
}

}  // namespace tile::testing
