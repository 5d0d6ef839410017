// Shared by the C++ examples: run a row program on the CPU backend over host buffers and check
// every output against the program's float64 evaluation (the Python examples run the same
// programs on the GPU with torch tensors).
#pragma once

#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "tile/tile.hpp"

namespace example {

// Host operands of one call: matrices and vectors by name, with their dtypes and shapes.
struct HostOperand {
  std::vector<unsigned char> bytes;
  tile::DType dtype;
  int64_t rows = 0, cols = 0;  // cols == 0: a vector of `rows` elements
};

inline tile::Args host_args(std::map<std::string, HostOperand>& ops, const std::map<std::string, double>& scalars) {
  tile::Args a;
  for (auto& [name, o] : ops) {
    if (o.cols > 0)
      a.set(name, tile::matrix(o.bytes.data(), o.dtype, o.rows, o.cols));
    else
      a.set(name, tile::VectorView{o.bytes.data(), o.dtype, o.rows});
  }
  for (auto& [name, v] : scalars) a.set(name, v);
  return a;
}

// Runs `program`, checks every output, prints one line; returns the exit status.
inline int run_and_check(const tile::RowProgram& program, std::map<std::string, HostOperand>& ops,
                         const std::map<std::string, double>& scalars) {
  const tile::Args args = host_args(ops, scalars);
  const tile::Reference want = tile::reference(program, args);
  const tile::LaunchRecord rec = tile::run(program, args, {{}, nullptr, tile::Backend::cpu});
  const tile::OracleCheck check = tile::check_against_reference(program, args, want);
  std::printf("%s: %s on the CPU backend, plan %s; %lld values against the float64 evaluation: %s%s\n",
              program.name().c_str(), rec.kernel_name.c_str(), rec.plan.to_json().c_str(), (long long)check.checked,
              check.ok ? "PASS" : "FAIL ", check.first_mismatch.c_str());
  return check.ok ? 0 : 1;
}

inline HostOperand random_matrix(tile::DType dt, int64_t rows, int64_t cols, unsigned seed, double scale = 1.0) {
  HostOperand o{std::vector<unsigned char>(size_t(rows * cols * tile::dtype_size(dt))), dt, rows, cols};
  unsigned s = seed;
  for (int64_t i = 0; i < rows * cols; ++i) {
    s = s * 1664525u + 1013904223u;
    tile::store_from_float(o.bytes.data(), i, dt, float(scale * ((double(s >> 8) / double(1 << 24)) * 2.0 - 1.0)));
  }
  return o;
}

inline HostOperand random_vector(tile::DType dt, int64_t n, unsigned seed, double scale = 1.0) {
  HostOperand o = random_matrix(dt, n, 1, seed, scale);
  o.cols = 0;
  return o;
}

inline HostOperand zeros(tile::DType dt, int64_t rows, int64_t cols = 0) {
  return HostOperand{std::vector<unsigned char>(size_t(rows * std::max<int64_t>(cols, 1) * tile::dtype_size(dt))), dt, rows,
                     cols};
}

}  // namespace example
