// A non-owning view of a row-major matrix whose last dimension is contiguous.
#pragma once

#include <cstdint>

#include "tile/dtype.hpp"

namespace tile {

struct TensorView {
  void* data = nullptr;
  DType dtype = DType::f32;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t row_stride = 0;  // in elements, >= cols
};

// A view of a vector of `cols` elements (weight, bias). data == nullptr means absent.
struct VectorView {
  const void* data = nullptr;
  DType dtype = DType::f32;
  int64_t size = 0;
};

inline TensorView matrix(void* data, DType dtype, int64_t rows, int64_t cols,
                         int64_t row_stride = -1) {
  return TensorView{data, dtype, rows, cols, row_stride < 0 ? cols : row_stride};
}

}  // namespace tile
