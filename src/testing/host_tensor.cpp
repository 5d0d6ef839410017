#include "testing/host_tensor.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
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
      store_from_double(data(), r * stride_ + c, dtype_, v);
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
  for (int64_t i = 0; i < size; ++i) store_from_double(data(), i, dtype, dist(rng));
}

const char* pattern_name(RowPattern pattern) {
  static const char* names[] = {"normal", "magnitudes", "huge", "constant", "offset", "tiny", "all_neg_inf"};
  return pattern < RowPattern::count ? names[int(pattern)] : "?";
}

double dtype_max(DType t) {
  switch (t) {
    case DType::f32: return std::numeric_limits<float>::max();
    case DType::f16: return 65504.0;
    case DType::bf16: return 0x1.fep127;
    case DType::f64: return std::numeric_limits<double>::max();
    default: return 0;
  }
}

double dtype_min_subnormal(DType t) {
  switch (t) {
    case DType::f32: return 0x1p-149;
    case DType::f16: return 0x1p-24;
    case DType::bf16: return 0x1p-133;
    case DType::f64: return 0x1p-1074;
    default: return 0;
  }
}

namespace {
double uniform(std::mt19937_64& rng, double lo, double hi) { return std::uniform_real_distribution<double>(lo, hi)(rng); }
double sign(std::mt19937_64& rng) { return rng() % 2 ? 1.0 : -1.0; }
// A value that stores as a finite value of `t` (values past its max would round to inf).
double finite_in(DType t, double v) {
  const double m = dtype_max(t);
  return t == DType::f64 ? std::clamp(v, -m, m) : double(float(std::clamp(v, -m, m)));
}
// Sets `specials` random elements to one of `values`.
void set_specials(std::mt19937_64& rng, int64_t n, int specials, const std::function<void(int64_t, double)>& set,
                  const std::vector<float>& values) {
  for (int k = 0; k < specials && n > 0; ++k) set(int64_t(rng() % uint64_t(n)), values[rng() % values.size()]);
}
const float kInf = std::numeric_limits<float>::infinity(), kNaN = std::numeric_limits<float>::quiet_NaN();
}  // namespace

void HostMatrix::fill_row(std::mt19937_64& rng, int64_t r, RowPattern pattern, int specials) {
  const double lo = std::log2(dtype_min_subnormal(dtype_)), hi = std::log2(dtype_max(dtype_));
  auto set = [&](int64_t c, double v) { store_from_double(data(), r * stride_ + c, dtype_, v); };
  switch (pattern) {
    case RowPattern::normal: {
      std::normal_distribution<double> dist(0.0, std::pow(10.0, uniform(rng, -2, 2)));
      for (int64_t c = 0; c < cols_; ++c) set(c, finite_in(dtype_, dist(rng)));
      break;
    }
    case RowPattern::magnitudes:
      for (int64_t c = 0; c < cols_; ++c)
        set(c, finite_in(dtype_, sign(rng) * (rng() % 8 == 0 ? dtype_max(dtype_) : std::exp2(uniform(rng, lo, hi)))));
      break;
    case RowPattern::huge:
      for (int64_t c = 0; c < cols_; ++c) set(c, finite_in(dtype_, sign(rng) * dtype_max(dtype_) * std::exp2(-uniform(rng, 0, 8))));
      break;
    case RowPattern::constant: {
      const double choices[] = {0.0, dtype_min_subnormal(dtype_), 1.0, dtype_max(dtype_), std::exp2(uniform(rng, lo, hi))};
      const double v = finite_in(dtype_, sign(rng) * choices[rng() % 5]);
      for (int64_t c = 0; c < cols_; ++c) set(c, v);
      break;
    }
    case RowPattern::offset: {
      const double centre = sign(rng) * std::exp2(uniform(rng, -20, std::min(hi - 2, 60.0)));
      std::normal_distribution<double> dist(centre, std::abs(centre) * std::pow(10.0, uniform(rng, -6, -2)));
      for (int64_t c = 0; c < cols_; ++c) set(c, finite_in(dtype_, dist(rng)));
      break;
    }
    case RowPattern::tiny:  // the lowest quarter of the dtype's exponent range, at most 2^30 wide
      for (int64_t c = 0; c < cols_; ++c)
        set(c, (sign(rng) * std::exp2(uniform(rng, lo, lo + std::min(30.0, (hi - lo) / 4)))));
      break;
    case RowPattern::all_neg_inf:
      for (int64_t c = 0; c < cols_; ++c) set(c, -std::numeric_limits<float>::infinity());
      break;
    case RowPattern::count: break;
  }
  set_specials(rng, cols_, specials, set, {kNaN, kInf, -kInf});
}

void HostVector::fill_with_specials(std::mt19937_64& rng, double mean, double scale, int specials, bool infinities) {
  std::normal_distribution<double> dist(mean, scale);
  auto set = [&](int64_t i, double v) { store_from_double(data(), i, dtype, v); };
  for (int64_t i = 0; i < size; ++i) set(i, finite_in(dtype, dist(rng)));
  set_specials(rng, size, specials, set, infinities ? std::vector<float>{kNaN, 0.0f, kInf, -kInf} : std::vector<float>{kNaN, 0.0f});
}

}  // namespace tile::testing
