// Monoids: what a reduction folds, as data.
//
// A monoid has a state of one or more float parts (f32, or f64 in a float64 call), an identity, and two small expression graphs:
// `combine` merges two states (this side's and the other side's), and `chunk` gives the state
// of a chunk of elements directly (a worker's cached slice, or one iteration of a re-read
// loop), using sums and maxima over the chunk. The lowering instantiates `chunk` per worker and
// `combine` at every scope a reduction crosses (warp shuffles, shared memory, across groups);
// the CPU executor and the float64 reference evaluate the same graphs. So NaN and ±inf
// semantics are properties of the monoid, written and tested once (tests/spec/monoid_test.cpp).
//
//   sum             x                  -> (s)
//   max             x                  -> (m)             NaN if any element is NaN
//   online_softmax  x                  -> (m, Σ exp(x - m))  one pass; all -inf rows give s = 0
//   mean_m2         x                  -> (n, mean, Σ (x - mean)^2)  Chan et al.'s merge
//   scaled_sum_squares x               -> (e, s) with Σ x^2 = s 4^e, max |x| < 2^(e+1), e at least
//                                         the exponent of max |x| (often one more: it is taken from
//                                         the sum): no overflow or underflow for any finite x,
//                                         scaled by exact powers of two; +inf gives s = +inf, NaN NaN
//   scaled_mean_m2  x                  -> (n, e, mean, m2) of x 2^-e, Chan's merge at the larger
//                                         exponent; a constant row has its exact mean and m2 = 0
//
// A monoid may also give a re-read worker's state a cheaper way (`fast`): plain sums over all of
// the worker's elements (accumulated by addition from chunk to chunk, so a re-read loop carries no
// per-chunk merge), the state derived from them once, and a test (`fast_exact`) of whether that
// state is as exact as the chunk graph's. A worker whose test fails folds its elements with
// `chunk` and `combine` instead; a worker's state is the same either way, up to rounding and to
// its representation (the scaled monoids' fast states sit at exponent 0, which their tests
// keep in range: a constant part folds away where the lowering uses the state directly).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace tile {

// exponent(x): floor(log2 |x|) as an integer-valued float for finite nonzero x, else 0. ldexp(a, b):
// a * 2^b, exact, for integer-valued b. Exact powers of two scale without division or rounding.
enum class UnaryFn : uint8_t { neg, exp, log, sqrt, rsqrt, abs, tanh, logical_not, to_f32, exponent };
enum class BinaryFn : uint8_t { add, sub, mul, div, max, min, lt, le, eq, ne, logical_and, logical_or, ldexp };
const char* unary_fn_name(UnaryFn fn);
const char* binary_fn_name(BinaryFn fn);
inline bool is_comparison(BinaryFn fn) {
  return fn == BinaryFn::lt || fn == BinaryFn::le || fn == BinaryFn::eq || fn == BinaryFn::ne;
}
inline bool is_logical(BinaryFn fn) { return fn == BinaryFn::logical_and || fn == BinaryFn::logical_or; }

struct MonoidNode {
  enum class Kind : uint8_t {
    mine,       // combine: part `index` of this side's state
    other,      // combine: part `index` of the other side's state
    element,    // chunk: monoid input `index` at one element of the chunk (varies per element)
    count,      // chunk: the number of elements in the chunk, a float
    chunk_sum,  // chunk: sum over the chunk's elements of element node `a`
    chunk_max,  // chunk: maximum (NaN if any is NaN) over the chunk's elements of node `a`
    first,      // fast: element node `a` at the worker's first element (0 when it has none)
    constant,   // `value`, or `f64_value` where given in a float64 kernel (an exponent clamp)
    unary,
    binary,
    select,     // a ? b : c
  };
  Kind kind;
  bool boolean = false;  // the value is b1 (a comparison or logical op), else a float
  bool element = false;  // chunk graphs: varies per element (reads `element`)
  int index = -1, a = -1, b = -1, c = -1;
  double value = 0.0;
  UnaryFn unary = UnaryFn::neg;
  BinaryFn binary = BinaryFn::add;
  std::optional<double> f64_value;
  double value_in(bool f64) const { return f64 && f64_value ? *f64_value : value; }
};

struct Monoid {
  std::string name;
  std::vector<std::string> parts;  // names of the state's parts
  std::vector<double> identity;    // one per part
  int inputs = 1;                  // element expressions folded together
  std::vector<MonoidNode> nodes;
  std::vector<int> combine;  // one node per part: the merged state
  std::vector<int> chunk;    // one node per part: the state of a chunk of elements
  // Optional fast graph: one node per part, over any set of the row's elements — a worker's, or
  // the whole row's on the program fast path (chunk_sum, chunk_max and count range over the
  // set, first reads one element of it) — and a b1 node that holds where that state is exact
  // enough. Empty when the monoid has none.
  std::vector<int> fast;
  int fast_exact = -1;
  // Throws tile::InternalError when the graphs are malformed (wrong kinds in a graph, types).
  void check() const;
  bool operator==(const Monoid& o) const { return name == o.name; }
};

// Builds a monoid's graphs; see src/spec/monoid.cpp for the built-in ones.
class MonoidBuilder;
struct MonoidExpr {
  MonoidBuilder* builder = nullptr;
  int id = -1;
};

class MonoidBuilder {
 public:
  MonoidBuilder(std::string name, std::vector<std::string> parts, std::vector<double> identity,
                int inputs = 1);
  MonoidExpr mine(int part);
  MonoidExpr other(int part);
  MonoidExpr element(int input = 0);
  MonoidExpr count();
  MonoidExpr chunk_sum(MonoidExpr element_expr);
  MonoidExpr chunk_max(MonoidExpr element_expr);
  MonoidExpr first(MonoidExpr element_expr);  // fast graphs only
  MonoidExpr constant(double value);
  // A constant whose value depends on the float precision: `f32` in an f32 kernel, `f64` in
  // an f64 one (the limits of a format's exponent range).
  MonoidExpr constant(double f32, double f64);
  MonoidExpr unary(UnaryFn fn, MonoidExpr a);
  MonoidExpr binary(BinaryFn fn, MonoidExpr a, MonoidExpr b);
  MonoidExpr select(MonoidExpr cond, MonoidExpr a, MonoidExpr b);
  Monoid build(std::vector<MonoidExpr> combine, std::vector<MonoidExpr> chunk);
  // With a fast graph: `fast` (one per part) where `fast_exact` holds.
  Monoid build(std::vector<MonoidExpr> combine, std::vector<MonoidExpr> chunk, std::vector<MonoidExpr> fast,
               MonoidExpr fast_exact);

 private:
  int add(MonoidNode n);
  Monoid m_;
};

MonoidExpr operator+(MonoidExpr a, MonoidExpr b);
MonoidExpr operator-(MonoidExpr a, MonoidExpr b);
MonoidExpr operator*(MonoidExpr a, MonoidExpr b);
MonoidExpr operator/(MonoidExpr a, MonoidExpr b);

namespace monoid {
// The exponents the scaled monoids clamp a scale 2^e to, per float precision: 2^-e stays a
// normal number and a subnormal x scaled by it squares to a normal one (f32: [-126 + 23,
// 127 - 2]; f64: [-1022 + 52, 1023 - 2]).
struct ExponentRange {
  double lo, hi;
};
inline constexpr ExponentRange kF32Exponents{-103, 125}, kF64Exponents{-970, 1021};

Monoid sum();
Monoid max();
Monoid online_softmax();
Monoid mean_m2();
Monoid scaled_sum_squares();
Monoid scaled_mean_m2();
}  // namespace monoid

}  // namespace tile
