#include "testing/host_tensor.hpp"

#include <cstring>

namespace tile::testing {

HostMatrix::HostMatrix(DType dtype, int64_t rows, int64_t cols, int64_t row_stride, int64_t offset_elems,
                       int64_t guard_elems)
    : dtype_(dtype), rows_(rows), cols_(cols), stride_(row_stride), offset_(offset_elems) {
  int64_t elems = offset_ + (rows == 0 ? 0 : (rows - 1) * row_stride + cols) + guard_elems;
  bytes_.assign(size_t(elems * dtype_size(dtype)), 0xff);
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
