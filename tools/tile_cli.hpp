// Options of the `tile` command's subcommands. tile_main.cpp parses and checks every one of
// them (sizes included) before any memory is allocated; tile_bench.cpp runs the GPU ones.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "tile/tile.hpp"

namespace tile::cli {

// The most host memory one call of a subcommand may ask for (its matrices, weight, bias and
// the float64 reference); larger shapes are refused before anything is allocated.
constexpr int64_t kHostBytesLimit = int64_t(16) << 30;

struct Shape {
  int64_t rows = 0, cols = 0;
};

// `tile bench`: the default (or --plan) plans of every operator on each shape; --host alone
// measures host and launch-bound times of small calls instead.
struct BenchOptions {
  tile::PlanRequest request;
  std::vector<Shape> shapes;
  std::vector<tile::Op> ops;        // empty: all four
  std::vector<tile::DType> dtypes;  // empty: f32 and bf16
  bool host = false;
};

// `tile tune`: every plan of the mapping family for one call. The texts are printed as given.
struct TuneOptions {
  tile::Op op = tile::Op::softmax;
  tile::DType dtype = tile::DType::f32;
  Shape shape;
  std::string op_text, shape_text, dtype_text, out_path;
};

int bench_main(const BenchOptions& options);
int tune_main(const TuneOptions& options);

}  // namespace tile::cli
