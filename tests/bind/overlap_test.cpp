// overlaps (src/bind/overlap.cpp): the exact test for strided row views that bind() uses for
// aliasing, against the definition row pair by row pair, and through run() on real memory.
#include "bind/overlap.hpp"

#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "testing/host_tensor.hpp"
#include "tile/tile.hpp"

namespace tile {
namespace {

StridedBytes bytes_of(const TensorView& t) {
  const int64_t es = dtype_size(t.dtype);
  return {reinterpret_cast<uintptr_t>(t.data), t.row_stride * es, t.cols * es, t.rows};
}
StridedBytes bytes_of(const VectorView& v) {
  const int64_t n = v.data ? v.size * dtype_size(v.dtype) : 0;
  return {reinterpret_cast<uintptr_t>(v.data), n, n, 1};
}
template <typename A, typename B>
bool views_overlap(const A& a, const B& b) {
  return overlaps(bytes_of(a), bytes_of(b));
}

TensorView view_at(uintptr_t address, DType dt, int64_t rows, int64_t cols, int64_t stride) {
  return TensorView{reinterpret_cast<void*>(address), dt, rows, cols, stride};
}

// The definition, row pair by row pair: some byte of a row of a lies in a row of b.
bool overlap_by_rows(const TensorView& a, const TensorView& b) {
  const auto at = [](const TensorView& t, int64_t r) {
    return int64_t(reinterpret_cast<uintptr_t>(t.data)) + r * t.row_stride * dtype_size(t.dtype);
  };
  for (int64_t i = 0; i < a.rows; ++i)
    for (int64_t j = 0; j < b.rows; ++j)
      if (at(a, i) < at(b, j) + b.cols * dtype_size(b.dtype) && at(b, j) < at(a, i) + a.cols * dtype_size(a.dtype))
        return true;
  return false;
}

TEST(ViewsOverlap, AgreesWithEveryRowPairOnRandomViews) {
  std::mt19937_64 rng(12);
  auto pick = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  int overlapping = 0, disjoint = 0;
  for (int n = 0; n < 200000; ++n) {
    TensorView v[2];
    for (TensorView& t : v) {
      const DType dt = pick(0, 1) ? DType::f32 : DType::bf16;
      const int64_t cols = pick(1, 24);
      // Strides from dense to sparse, often equal or a multiple of the other view's.
      const int64_t stride = pick(0, 3) == 0 ? cols : cols + pick(0, 40);
      t = view_at(uintptr_t(pick(0, 600)) * dtype_size(dt), dt, pick(1, 12), cols, stride);
    }
    const bool want = overlap_by_rows(v[0], v[1]);
    ASSERT_EQ(views_overlap(v[0], v[1]), want)
        << "a at " << v[0].data << " (" << v[0].rows << ", " << v[0].cols << ") stride " << v[0].row_stride << " "
        << dtype_name(v[0].dtype) << "; b at " << v[1].data << " (" << v[1].rows << ", " << v[1].cols << ") stride "
        << v[1].row_stride << " " << dtype_name(v[1].dtype);
    ASSERT_EQ(views_overlap(v[1], v[0]), want);
    (want ? overlapping : disjoint)++;
  }
  EXPECT_GT(overlapping, 20000);
  EXPECT_GT(disjoint, 20000);
}

TEST(ViewsOverlap, VectorsAreOneRow) {
  const TensorView y = view_at(4096, DType::f32, 4, 8, 16);  // rows at 4096, 4160, 4224, 4288; 32 bytes each
  EXPECT_FALSE(views_overlap(y, VectorView{reinterpret_cast<void*>(4096 + 32), DType::f32, 8}));   // the gap
  EXPECT_TRUE(views_overlap(y, VectorView{reinterpret_cast<void*>(4096 + 34), DType::bf16, 16}));  // into row 1
  EXPECT_FALSE(views_overlap(y, VectorView{reinterpret_cast<void*>(4096 + 320), DType::f32, 8}));  // past the end
  EXPECT_FALSE(views_overlap(y, VectorView{}));
}

TEST(ViewsOverlap, HugeRowCountsTakeNoTimeAndStayExact) {
  // Interleaved halves of 2^40 rows of 128 elements: disjoint; one element more and they touch.
  const int64_t rows = int64_t(1) << 40;
  EXPECT_FALSE(
      views_overlap(view_at(1 << 20, DType::f32, rows, 64, 128), view_at((1 << 20) + 256, DType::f32, rows, 64, 128)));
  EXPECT_TRUE(
      views_overlap(view_at(1 << 20, DType::f32, rows, 65, 128), view_at((1 << 20) + 256, DType::f32, rows, 64, 128)));
  // Strides of 1000 and 1001 f32 elements drift by 4 bytes a row: the views first share a byte
  // after hundreds of rows. Compared with a walk over the rows of a (the only candidate row of
  // b for row i is the one starting at or below it).
  int outcomes[2] = {0, 0};
  for (int64_t shift : {2, 402, 1602, 2402, 3998}) {
    for (int64_t n : {10, 100, 399, 400, 401, 1000, 5000}) {
      const TensorView a = view_at(1 << 20, DType::f32, n, 1, 1000);
      const TensorView b = view_at((1 << 20) + shift, DType::bf16, n, 1, 2002);
      bool walk = false;
      for (int64_t i = 0; i < n && !walk; ++i) {
        const int64_t start = i * 4000 - shift, j = start < 0 ? -1 : start / 4004;
        for (int64_t k : {j, j + 1})
          walk |= k >= 0 && k < n && k * 4004 + shift < i * 4000 + 4 && i * 4000 < k * 4004 + shift + 2;
      }
      EXPECT_EQ(views_overlap(a, b), walk) << "shift " << shift << " rows " << n;
      ++outcomes[walk];
    }
  }
  EXPECT_GT(outcomes[0], 10);  // shift 2402: rows 400 and 401 of a are the first to meet b
  EXPECT_GT(outcomes[1], 10);
}

// Real memory through run(): disjoint column halves of one buffer are accepted and computed
// right; views that share one element are refused.
TEST(ViewsOverlap, InterleavedHalvesOfOneBufferRun) {
  std::mt19937_64 rng(3);
  testing::HostMatrix b(DType::f32, 6, 128, 128);
  b.fill_random(rng);
  const std::vector<uint8_t> before = b.bytes();
  float* base = static_cast<float*>(b.data());
  Call call{Op::softmax, matrix(base, DType::f32, 6, 64, 128), matrix(base + 64, DType::f32, 6, 64, 128)};
  testing::HostMatrix copy(DType::f32, 6, 64, 128);
  copy.bytes() = before;
  const std::vector<double> want = oracle(Call{Op::softmax, copy.view(), copy.view()});
  run(call, {{}, nullptr, Backend::cpu});
  EXPECT_TRUE(check_against(call, want).ok);
  for (int64_t r = 0; r < 6; ++r)  // x, the left halves, untouched
    EXPECT_EQ(std::memcmp(base + r * 128, before.data() + r * 512, 256), 0) << "row " << r;

  Call shifted = call;
  shifted.y.data = base + 63;
  try {
    run(shifted, {{}, nullptr, Backend::cpu});
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("softmax: argument 'y': expected memory that does not overlap x"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace tile
