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

// A view of a vector: one value per column (weight, bias, dweight), one per row (a target,
// rstd; `stride` elements apart) or a single value (a loss). data == nullptr means absent.
// Vectors bound to outputs are written.
struct VectorView {
  const void* data = nullptr;
  DType dtype = DType::f32;
  int64_t size = 0;
  int64_t stride = 1;  // elements between consecutive values
};

// A rows x cols matrix; row_stride -1 (the default) means contiguous rows (cols). Any other
// negative stride is kept, so the call refuses it as it refuses one in a TensorView.
inline TensorView matrix(void* data, DType dtype, int64_t rows, int64_t cols,
                         int64_t row_stride = -1) {
  return TensorView{data, dtype, rows, cols, row_stride == -1 ? cols : row_stride};
}

}  // namespace tile
