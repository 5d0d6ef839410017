// Softmax and RMSNorm of a small matrix on the CPU backend through an installed Tile, each
// checked against the float64 oracle; and a bad argument caught as tile::Error across the
// library boundary. Exits non-zero on any failure.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <tile/tile.hpp>
#include <vector>

namespace {

bool run_and_check(const char* what, const tile::Call& call) {
  const tile::LaunchRecord record = tile::run(call, {.backend = tile::Backend::cpu});
  const tile::OracleCheck check = tile::check_against_oracle(call);
  std::printf("%s: kernel %s, %lld elements checked, max abs error %.3g: %s %s\n", what, record.kernel_name.c_str(),
              static_cast<long long>(check.checked), check.max_abs_error, check.ok ? "ok" : "MISMATCH",
              check.first_mismatch.c_str());
  return check.ok && check.checked == call.x.rows * call.x.cols;
}

}  // namespace

int main() {
  const int64_t rows = 5, cols = 300, stride = 320;  // strided rows, a ragged tail
  std::vector<float> x(rows * stride), weight(cols);
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.37f * float(i)) * 4.0f;
  for (int64_t c = 0; c < cols; ++c) weight[c] = 0.5f + float(c % 7) * 0.25f;
  // Poisoned: an element the kernel fails to write is NaN and fails the check.
  std::vector<float> y(rows * stride, std::numeric_limits<float>::quiet_NaN());

  bool ok = true;
  tile::Call softmax{.op = tile::Op::softmax,
                     .x = tile::matrix(x.data(), tile::DType::f32, rows, cols, stride),
                     .y = tile::matrix(y.data(), tile::DType::f32, rows, cols, stride)};
  ok &= run_and_check("softmax", softmax);

  std::fill(y.begin(), y.end(), std::numeric_limits<float>::quiet_NaN());
  tile::Call rms_norm = softmax;
  rms_norm.op = tile::Op::rms_norm;
  rms_norm.weight = tile::VectorView{weight.data(), tile::DType::f32, cols};
  ok &= run_and_check("rms_norm", rms_norm);

  rms_norm.weight.size = cols - 1;
  try {
    tile::run(rms_norm, {.backend = tile::Backend::cpu});
    std::printf("a weight of the wrong length was accepted\n");
    ok = false;
  } catch (const tile::Error& e) {
    std::printf("rejected as expected: %s\n", e.what());
  }
  return ok ? 0 : 1;
}
