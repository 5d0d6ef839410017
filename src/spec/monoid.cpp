// The built-in monoids and the monoid builder. The semantics of each (NaN, ±inf, empty parts)
// are written here once; tests/spec/monoid_test.cpp checks them against float64 folds.
#include "tile/monoid.hpp"

#include <limits>

#include "tile/error.hpp"

namespace tile {

const char* unary_fn_name(UnaryFn fn) {
  static const char* names[] = {"neg", "exp", "log", "sqrt", "rsqrt", "abs", "tanh", "not", "to_f32", "exponent"};
  return names[int(fn)];
}
const char* binary_fn_name(BinaryFn fn) {
  static const char* names[] = {"add", "sub", "mul", "div", "max", "min", "lt", "le", "eq", "ne", "and", "or", "ldexp"};
  return names[int(fn)];
}

MonoidBuilder::MonoidBuilder(std::string name, std::vector<std::string> parts, std::vector<double> identity,
                             int inputs) {
  TILE_CHECK(parts.size() == identity.size() && !parts.empty() && inputs >= 1, "monoid ", name,
             ": parts and identity differ in length");
  m_.name = std::move(name);
  m_.parts = std::move(parts);
  m_.identity = std::move(identity);
  m_.inputs = inputs;
}

int MonoidBuilder::add(MonoidNode n) {
  m_.nodes.push_back(n);
  return int(m_.nodes.size()) - 1;
}

MonoidExpr MonoidBuilder::mine(int part) { return {this, add({MonoidNode::Kind::mine, false, false, part})}; }
MonoidExpr MonoidBuilder::other(int part) { return {this, add({MonoidNode::Kind::other, false, false, part})}; }
MonoidExpr MonoidBuilder::element(int input) {
  return {this, add({MonoidNode::Kind::element, false, true, input})};
}
MonoidExpr MonoidBuilder::count() { return {this, add({MonoidNode::Kind::count})}; }
MonoidExpr MonoidBuilder::chunk_sum(MonoidExpr e) {
  MonoidNode n{MonoidNode::Kind::chunk_sum};
  n.a = e.id;
  return {this, add(n)};
}
MonoidExpr MonoidBuilder::chunk_max(MonoidExpr e) {
  MonoidNode n{MonoidNode::Kind::chunk_max};
  n.a = e.id;
  return {this, add(n)};
}
MonoidExpr MonoidBuilder::first(MonoidExpr e) {
  MonoidNode n{MonoidNode::Kind::first};
  n.a = e.id;
  return {this, add(n)};
}
MonoidExpr MonoidBuilder::constant(double value) {
  MonoidNode n{MonoidNode::Kind::constant};
  n.value = value;
  return {this, add(n)};
}
MonoidExpr MonoidBuilder::constant(double f32, double f64) {
  MonoidNode n{MonoidNode::Kind::constant};
  n.value = f32, n.f64_value = f64;
  return {this, add(n)};
}
MonoidExpr MonoidBuilder::unary(UnaryFn fn, MonoidExpr a) {
  MonoidNode n{MonoidNode::Kind::unary};
  n.unary = fn, n.a = a.id;
  n.boolean = fn == UnaryFn::logical_not;
  n.element = m_.nodes[a.id].element;
  return {this, add(n)};
}
MonoidExpr MonoidBuilder::binary(BinaryFn fn, MonoidExpr a, MonoidExpr b) {
  MonoidNode n{MonoidNode::Kind::binary};
  n.binary = fn, n.a = a.id, n.b = b.id;
  n.boolean = is_comparison(fn) || is_logical(fn);
  n.element = m_.nodes[a.id].element || m_.nodes[b.id].element;
  return {this, add(n)};
}
MonoidExpr MonoidBuilder::select(MonoidExpr c, MonoidExpr a, MonoidExpr b) {
  MonoidNode n{MonoidNode::Kind::select};
  n.a = c.id, n.b = a.id, n.c = b.id;
  n.element = m_.nodes[c.id].element || m_.nodes[a.id].element || m_.nodes[b.id].element;
  return {this, add(n)};
}

Monoid MonoidBuilder::build(std::vector<MonoidExpr> combine, std::vector<MonoidExpr> chunk) {
  for (MonoidExpr e : combine) m_.combine.push_back(e.id);
  for (MonoidExpr e : chunk) m_.chunk.push_back(e.id);
  m_.check();
  return m_;
}

Monoid MonoidBuilder::build(std::vector<MonoidExpr> combine, std::vector<MonoidExpr> chunk,
                            std::vector<MonoidExpr> fast, MonoidExpr fast_exact) {
  for (MonoidExpr e : fast) m_.fast.push_back(e.id);
  m_.fast_exact = fast_exact.id;
  return build(std::move(combine), std::move(chunk));
}

MonoidExpr operator+(MonoidExpr a, MonoidExpr b) { return a.builder->binary(BinaryFn::add, a, b); }
MonoidExpr operator-(MonoidExpr a, MonoidExpr b) { return a.builder->binary(BinaryFn::sub, a, b); }
MonoidExpr operator*(MonoidExpr a, MonoidExpr b) { return a.builder->binary(BinaryFn::mul, a, b); }
MonoidExpr operator/(MonoidExpr a, MonoidExpr b) { return a.builder->binary(BinaryFn::div, a, b); }

void Monoid::check() const {
  const size_t k = parts.size();
  TILE_CHECK(combine.size() == k && chunk.size() == k && identity.size() == k, "monoid ", name,
             ": one combine and one chunk node per part");
  // Which kinds each graph may read: combine reads states, chunk reads elements.
  auto walk = [&](auto&& self, int id, bool in_combine, bool in_chunk_reduction) -> void {
    TILE_CHECK(id >= 0 && id < int(nodes.size()), "monoid ", name, ": node ", id, " does not exist");
    const MonoidNode& n = nodes[id];
    using K = MonoidNode::Kind;
    switch (n.kind) {
      case K::mine:
      case K::other:
        TILE_CHECK(in_combine && n.index >= 0 && n.index < int(k), "monoid ", name, ": state read outside combine");
        break;
      case K::element:
        TILE_CHECK(!in_combine && in_chunk_reduction && n.index >= 0 && n.index < inputs, "monoid ", name,
                   ": element read outside a chunk reduction");
        break;
      case K::count: TILE_CHECK(!in_combine, "monoid ", name, ": count in combine"); break;
      case K::chunk_sum:
      case K::chunk_max:
        // A chunk reduction inside another one's element expression is a finished chunk value.
        TILE_CHECK(!in_combine, "monoid ", name, ": chunk reduction in combine");
        self(self, n.a, false, true);
        break;
      case K::first: TILE_CHECK(false, "monoid ", name, ": first outside the fast graph"); break;
      case K::constant: break;
      case K::unary: self(self, n.a, in_combine, in_chunk_reduction); break;
      case K::binary:
        self(self, n.a, in_combine, in_chunk_reduction);
        self(self, n.b, in_combine, in_chunk_reduction);
        break;
      case K::select:
        TILE_CHECK(nodes[n.a].boolean && nodes[n.b].boolean == nodes[n.c].boolean, "monoid ", name, ": ill-typed select");
        self(self, n.a, in_combine, in_chunk_reduction);
        self(self, n.b, in_combine, in_chunk_reduction);
        self(self, n.c, in_combine, in_chunk_reduction);
        break;
    }
  };
  for (int id : combine) {
    walk(walk, id, true, false);
    TILE_CHECK(!nodes[id].boolean, "monoid ", name, ": a part is boolean");
  }
  for (int id : chunk) {
    walk(walk, id, false, false);
    TILE_CHECK(!nodes[id].boolean && !nodes[id].element, "monoid ", name, ": a chunk part varies per element");
  }
  if (fast.empty() && fast_exact < 0) return;
  // The fast graph: its sums and maxima range over all of a worker's elements in one pass, so
  // their arguments may read elements, constants and `first`, never another such value.
  TILE_CHECK(fast.size() == k && fast_exact >= 0 && fast_exact < int(nodes.size()) && nodes[fast_exact].boolean,
             "monoid ", name, ": a fast path needs one node per part and a boolean exactness test");
  auto walk_fast = [&](auto&& self, int id, bool in_reduction) -> void {
    TILE_CHECK(id >= 0 && id < int(nodes.size()), "monoid ", name, ": node ", id, " does not exist");
    const MonoidNode& n = nodes[id];
    using K = MonoidNode::Kind;
    switch (n.kind) {
      case K::mine:
      case K::other: TILE_CHECK(false, "monoid ", name, ": state read in the fast graph"); break;
      case K::element:
        TILE_CHECK(in_reduction && n.index >= 0 && n.index < inputs, "monoid ", name,
                   ": element read outside a reduction of the fast graph");
        break;
      case K::count:
        TILE_CHECK(!in_reduction, "monoid ", name, ": count inside a reduction of the fast graph");
        break;
      case K::chunk_sum:
      case K::chunk_max:
        TILE_CHECK(!in_reduction, "monoid ", name, ": nested reductions in the fast graph");
        self(self, n.a, true);
        break;
      case K::first:
        TILE_CHECK(nodes[n.a].element, "monoid ", name, ": first of a value that is not an element's");
        self(self, n.a, true);
        break;
      case K::constant: break;
      case K::unary: self(self, n.a, in_reduction); break;
      case K::binary:
        self(self, n.a, in_reduction);
        self(self, n.b, in_reduction);
        break;
      case K::select:
        TILE_CHECK(nodes[n.a].boolean && nodes[n.b].boolean == nodes[n.c].boolean, "monoid ", name, ": ill-typed select");
        self(self, n.a, in_reduction);
        self(self, n.b, in_reduction);
        self(self, n.c, in_reduction);
        break;
    }
  };
  for (int id : fast) {
    walk_fast(walk_fast, id, false);
    TILE_CHECK(!nodes[id].boolean && !nodes[id].element, "monoid ", name, ": a fast part varies per element");
  }
  walk_fast(walk_fast, fast_exact, false);
}

namespace monoid {

namespace {
MonoidExpr min_exponent(MonoidBuilder& b) { return b.constant(kF32Exponents.lo, kF64Exponents.lo); }
MonoidExpr max_exponent(MonoidBuilder& b) { return b.constant(kF32Exponents.hi, kF64Exponents.hi); }
}  // namespace

namespace {
constexpr double kInf = std::numeric_limits<double>::infinity();
}

Monoid sum() {
  MonoidBuilder b("sum", {"sum"}, {0.0});
  return b.build({b.mine(0) + b.other(0)}, {b.chunk_sum(b.element())});
}

Monoid max() {
  MonoidBuilder b("max", {"max"}, {-kInf});
  return b.build({b.binary(BinaryFn::max, b.mine(0), b.other(0))}, {b.chunk_max(b.element())});
}

// (m, s) with s = Σ exp(x - m). Merged states take exponents against a base that is 0 while m
// is -inf (nothing finite seen yet), so an empty side adds 0 instead of exp(-inf + inf) = NaN;
// a chunk whose max is -inf (only -inf elements) has s = 0 by a select on the chunk, so each
// element costs exp(x - m) alone, the value softmax's output computes again (the lowering
// shares it). A NaN or +inf element still makes s NaN through the arithmetic, as PyTorch's
// softmax does.
Monoid online_softmax() {
  MonoidBuilder b("online_softmax", {"max", "sum_exp"}, {-kInf, 0.0});
  auto base_of = [&](MonoidExpr m) {
    return b.select(b.binary(BinaryFn::eq, m, b.constant(-kInf)), b.constant(0.0), m);
  };
  MonoidExpr merged = b.binary(BinaryFn::max, b.mine(0), b.other(0));
  MonoidExpr base = base_of(merged);
  MonoidExpr sum = b.mine(1) * b.unary(UnaryFn::exp, b.mine(0) - base) +
                   b.other(1) * b.unary(UnaryFn::exp, b.other(0) - base);
  MonoidExpr chunk_m = b.chunk_max(b.element());
  MonoidExpr chunk_s = b.select(b.binary(BinaryFn::eq, chunk_m, b.constant(-kInf)), b.constant(0.0),
                                b.chunk_sum(b.unary(UnaryFn::exp, b.element() - chunk_m)));
  return b.build({merged, sum}, {chunk_m, chunk_s});
}

// (n, mean, m2): the count, mean and sum of squared deviations (Chan et al.). An empty side
// contributes nothing and is never used in arithmetic, so extreme values on the other side
// cannot meet 0 * inf.
Monoid mean_m2() {
  MonoidBuilder b("mean_m2", {"count", "mean", "m2"}, {0.0, 0.0, 0.0});
  MonoidExpr n = b.mine(0), on = b.other(0);
  MonoidExpr total = n + on;
  MonoidExpr share = on / total;
  MonoidExpr delta = b.other(1) - b.mine(1);
  MonoidExpr other_empty = b.binary(BinaryFn::eq, on, b.constant(0.0));
  MonoidExpr mine_empty = b.binary(BinaryFn::eq, n, b.constant(0.0));
  auto pick = [&](MonoidExpr merged, MonoidExpr mine, MonoidExpr other) {
    return b.select(other_empty, mine, b.select(mine_empty, other, merged));
  };
  // An infinite mean on either side: the sum's semantics (inf + finite = inf, inf - inf = NaN),
  // where the update would take inf + (finite - inf) * share = NaN.
  auto infinite = [&](MonoidExpr v) { return b.binary(BinaryFn::eq, b.unary(UnaryFn::abs, v), b.constant(kInf)); };
  MonoidExpr any_infinite = b.binary(BinaryFn::logical_or, infinite(b.mine(1)), infinite(b.other(1)));
  MonoidExpr mean = pick(b.select(any_infinite, b.mine(1) + b.other(1), b.mine(1) + delta * share), b.mine(1), b.other(1));
  MonoidExpr m2 = pick(b.mine(2) + b.other(2) + delta * delta * (n * share), b.mine(2), b.other(2));

  // A chunk: its mean from the sum of x / k (no overflow of the sum for |x| near the dtype's
  // max), then squared deviations from that mean; an empty chunk is (0, 0, 0).
  MonoidExpr k = b.count();
  MonoidExpr any = b.binary(BinaryFn::lt, b.constant(0.0), k);
  MonoidExpr inv_k = b.select(any, b.constant(1.0) / k, b.constant(0.0));
  MonoidExpr chunk_mean = b.chunk_sum(b.element() * inv_k);
  MonoidExpr d = b.element() - chunk_mean;
  MonoidExpr chunk_m2 = b.chunk_sum(d * d);
  return b.build({total, mean, m2}, {k, chunk_mean, chunk_m2});
}

// (e, s): Σ x^2 = s 4^e with max |x| < 2^(e+1), e at least max |x|'s exponent (clamped to
// [-103, 125] in f32, [-970, 1021] in f64: kF32Exponents, kF64Exponents; taken from the sum,
// so often one more), so nothing overflows or underflows for finite x. Scales are exact powers of two (ldexp): merging parts
// costs no division and no rounding of the scale. A part with s = 0 (only zeros, or nothing)
// does not set the merged scale; +inf makes s infinite (x^2 would be), so RMSNorm keeps
// PyTorch's result there (y = x * 0); NaN propagates.
Monoid scaled_sum_squares() {
  MonoidBuilder b("scaled_sum_squares", {"exponent", "sum"}, {0.0, 0.0});
  const MonoidExpr zero = b.constant(0.0), two = b.constant(2.0);
  auto nonzero = [&](MonoidExpr s) { return b.binary(BinaryFn::ne, s, zero); };  // NaN counts
  MonoidExpr has_mine = nonzero(b.mine(1)), has_other = nonzero(b.other(1));
  MonoidExpr merged = b.select(has_mine, b.select(has_other, b.binary(BinaryFn::max, b.mine(0), b.other(0)), b.mine(0)),
                               b.other(0));
  auto rescaled = [&](MonoidExpr e, MonoidExpr s, MonoidExpr has) {
    return b.select(has, b.binary(BinaryFn::ldexp, s, two * (e - merged)), zero);
  };
  MonoidExpr sum = rescaled(b.mine(0), b.mine(1), has_mine) + rescaled(b.other(0), b.other(1), has_other);
  // A chunk's state from three sums taken side by side, so a staged merge needs one stage (one
  // barrier) and no exponent precedes any sum: the plain S = Σ x^2 (one multiply-add an element),
  // T = Σ (x 2^90)^2 and H = Σ (x 2^-80)^2. S is exact where 2^-60 <= S < inf (no square
  // overflowed; those that underflow, below 2^-126 each, are negligible beside S). Where
  // S < 2^-60 every |x| < 2^-30, so T has no square above 2^120 and none below fp32's smallest
  // normal (|x| >= 2^-149). Where S is inf or NaN, H holds every finite row without overflow
  // (squares below 2^96) and with negligible underflow, and ±inf or NaN where the row has them.
  // In f64 the same at that format's range: S exact from 2^-956, T = Σ (x 2^600)^2 where
  // |x| < 2^-478 (squares in [2^-948, 2^244]), H = Σ (x 2^-600)^2 (squares below 2^848).
  // With Q the sum taken and Σ x^2 = Q 4^-k: e = exponent(sqrt(Q)) + 1 - k, which bounds every
  // |x|, clamped as the exponent of max |x| was; s = Q 4^-(k + e), exact. A zero or empty chunk
  // is the identity (0, 0).
  const MonoidExpr x = b.element();
  auto scaled_sq = [&](double f32, double f64) {
    return b.chunk_sum((x * b.constant(f32, f64)) * (x * b.constant(f32, f64)));
  };
  MonoidExpr plain = b.chunk_sum(x * x), tiny = scaled_sq(0x1p90, 0x1p600), huge = scaled_sq(0x1p-80, 0x1p-600);
  MonoidExpr is_tiny = b.binary(BinaryFn::lt, plain, b.constant(0x1p-60, 0x1p-956));
  MonoidExpr is_plain = b.binary(BinaryFn::lt, plain, b.constant(kInf));
  MonoidExpr q = b.select(is_tiny, tiny, b.select(is_plain, plain, huge));
  MonoidExpr k = b.select(is_tiny, b.constant(90, 600), b.select(is_plain, zero, b.constant(-80, -600)));
  MonoidExpr e_raw = b.unary(UnaryFn::exponent, b.unary(UnaryFn::sqrt, q)) + b.constant(1.0) - k;
  MonoidExpr e = b.select(b.binary(BinaryFn::lt, zero, q),
                          b.binary(BinaryFn::min, b.binary(BinaryFn::max, e_raw, min_exponent(b)), max_exponent(b)),
                          zero);
  MonoidExpr chunk_s = b.binary(BinaryFn::ldexp, q, zero - two * (k + e));

  // A worker's fast path: the plain S = Σ x^2 (one multiply-add an element, no exponent before
  // the sum). Where 2^-60 <= S < 2^100 no square overflowed and those that underflow (below
  // 2^-126 each) are negligible, so it is the state at exponent 0: (0, S). Those bounds keep
  // what reads the state finite without the exponent's scalings (the normalisation's S / n +
  // eps, a merge of up to 2^20 such states) and let the exponent fold away where the state is
  // used directly. Elsewhere (huge, tiny or zero x, ±inf, NaN) the worker takes the exact chunk
  // graph; a worker without elements keeps the identity. In f64: 2^-956 <= S < 2^900.
  MonoidExpr n = b.count();
  MonoidExpr fast_e = zero;
  MonoidExpr fast_s = plain;
  MonoidExpr in_range = b.binary(BinaryFn::logical_and, b.binary(BinaryFn::le, b.constant(0x1p-60, 0x1p-956), plain),
                                 b.binary(BinaryFn::lt, plain, b.constant(0x1p100, 0x1p900)));
  MonoidExpr exact = b.binary(BinaryFn::logical_or, b.binary(BinaryFn::eq, n, zero), in_range);
  return b.build({merged, sum}, {e, chunk_s}, {fast_e, fast_s}, exact);
}

// (n, e, mean, m2): the count, and the mean and sum of squared deviations of x 2^-e, with e the
// exponent of the part's largest |x| clamped to kF32Exponents or kF64Exponents (so 2^-e is a normal float and one
// multiply scales an element exactly); merged by Chan et al.'s formulas at the larger exponent,
// the other side rescaled by ldexp (exact). Nothing overflows or underflows for finite x. A
// chunk's mean is clamped into [min x, max x] 2^-e, so a constant chunk has its exact mean and
// m2 = 0, and Chan's merge of equal means is exact: a constant row normalises to exactly 0. An
// empty side contributes nothing and is never used in arithmetic.
Monoid scaled_mean_m2() {
  MonoidBuilder b("scaled_mean_m2", {"count", "exponent", "mean", "m2"}, {0.0, 0.0, 0.0, 0.0});
  const MonoidExpr zero = b.constant(0.0), one = b.constant(1.0);
  MonoidExpr n = b.mine(0), on = b.other(0);
  MonoidExpr other_empty = b.binary(BinaryFn::eq, on, zero), mine_empty = b.binary(BinaryFn::eq, n, zero);
  auto pick = [&](MonoidExpr both, MonoidExpr mine, MonoidExpr other) {
    return b.select(other_empty, mine, b.select(mine_empty, other, both));
  };
  // Each side's factor 2^(e - merged) <= 1, one of them 1: exact scaling (a side so much smaller
  // that its factor squared underflows is negligible beside the other).
  MonoidExpr merged = b.binary(BinaryFn::max, b.mine(1), b.other(1));
  MonoidExpr fm = b.binary(BinaryFn::ldexp, one, b.mine(1) - merged), fo = b.binary(BinaryFn::ldexp, one, b.other(1) - merged);
  MonoidExpr mm = b.mine(2) * fm, om = b.other(2) * fo;
  MonoidExpr total = n + on;
  MonoidExpr share = on / b.binary(BinaryFn::max, total, one);
  MonoidExpr delta = om - mm;
  MonoidExpr both_m2 = b.mine(3) * (fm * fm) + b.other(3) * (fo * fo) + delta * delta * (n * share);
  MonoidExpr mean = pick(mm + delta * share, b.mine(2), b.other(2));
  MonoidExpr m2 = pick(both_m2, b.mine(3), b.other(3));
  MonoidExpr exponent = pick(merged, b.mine(1), b.other(1));

  // A chunk's mean: Σ x 2^-e over the count, clamped into the chunk's range. Σ x is taken at two
  // fixed scales in the same stage as the range, so a staged merge (each chunk sum merged across
  // the program on its own) needs no stage for e before it: Σ x 2^-64 cannot overflow and loses
  // only elements below 2^-62, negligible beside a largest |x| above 2^-30; Σ x 2^64 is exact
  // for the rest. Both become Σ x 2^-e by exact multiplications.
  MonoidExpr k = b.count();
  MonoidExpr hi = b.chunk_max(b.element()), lo = b.unary(UnaryFn::neg, b.chunk_max(b.unary(UnaryFn::neg, b.element())));
  MonoidExpr amax = b.binary(BinaryFn::max, zero, b.binary(BinaryFn::max, hi, b.unary(UnaryFn::neg, lo)));
  MonoidExpr e = b.binary(BinaryFn::min, b.binary(BinaryFn::max, b.unary(UnaryFn::exponent, amax), min_exponent(b)),
                          max_exponent(b));
  MonoidExpr inv = b.binary(BinaryFn::ldexp, one, zero - e);
  MonoidExpr sum_hi = b.chunk_sum(b.element() * b.constant(0x1p-64)), sum_lo = b.chunk_sum(b.element() * b.constant(0x1p64));
  // sum_hi 2^-e stays normal where it is used (largest |x| above 2^-30), sum_lo 2^-e below 2^65 n.
  MonoidExpr sum = b.select(b.binary(BinaryFn::lt, b.constant(0x1p-30), amax), sum_hi * inv * b.constant(0x1p64),
                            sum_lo * inv * b.constant(0x1p-64));
  MonoidExpr raw_mean = sum / b.binary(BinaryFn::max, k, one);
  MonoidExpr clamped = b.binary(BinaryFn::min, b.binary(BinaryFn::max, raw_mean, lo * inv), hi * inv);
  MonoidExpr chunk_mean = b.select(b.binary(BinaryFn::lt, zero, k), clamped, zero);
  // The squared deviations at half scale (x 2^-e / 2 - mean / 2, m2 = 4 Σ d^2: the same values,
  // but no product x 2^-e for the compiler to share with another pass and keep live beside a
  // cached row).
  MonoidExpr d = b.element() * (inv * b.constant(0.5)) - chunk_mean * b.constant(0.5);
  MonoidExpr chunk_m2 = b.chunk_sum(d * d) * b.constant(4.0);

  // A worker's fast path: sums shifted by the worker's first element K, S1 = Σ (x - K) and
  // S2 = Σ (x - K)^2 (three operations an element, no exponent, no per-chunk merge); then the
  // state at exponent 0: mean = K + S1 / n and m2 = S2 - S1^2 / n. Exact enough where
  //  - S2 < 2^60 and |K| < 2^30: no deviation or sum overflowed (and no x or K is ±inf or NaN),
  //    and what reads the state stays finite without the exponent's scalings (Chan's merge of
  //    such states: deviations of means below 2^32, their squares times a count below 2^95);
  //  - 2^-60 <= S2 or 2^-30 <= |K|: squares that underflow are negligible beside S2, or there
  //    are none (x and K of magnitude 2^-31 or more differ by 2^-54 or more, or not at all);
  //  - S1^2 / n <= 64 m2: the subtraction cancels at most 6 bits (K is one of the elements,
  //    so this always holds for up to 65 elements; K lies more than 8 standard deviations
  //    from the worker's mean otherwise). Tested as 65 S1^2 <= 64 n S2 (the same where
  //    m2 = S2 - S1^2 / n, and both products finite under the bounds above): no division, so
  //    a group that tests every program's totals divides only for its own state.
  // A constant worker has S1 = S2 = 0: its exact mean K and m2 = 0, as the chunk graph gives.
  // In f64: S2 < 2^900 and |K| < 2^440 (the squares of deviations of means, times a count,
  // below 2^933), 2^-956 <= S2 or 2^-400 <= |K|.
  MonoidExpr shift = b.first(b.element());
  MonoidExpr dev = b.element() - shift;
  MonoidExpr s1 = b.chunk_sum(dev), s2 = b.chunk_sum(dev * dev);
  MonoidExpr q = s1 / b.binary(BinaryFn::max, k, one);
  MonoidExpr fast_m2 = b.binary(BinaryFn::max, s2 - s1 * q, zero);
  MonoidExpr fast_e = zero;
  MonoidExpr fast_mean = shift + q;
  auto all = [&](std::vector<MonoidExpr> cs) {
    MonoidExpr r = cs[0];
    for (size_t i = 1; i < cs.size(); ++i) r = b.binary(BinaryFn::logical_and, r, cs[i]);
    return r;
  };
  MonoidExpr magnitude = b.unary(UnaryFn::abs, shift);
  MonoidExpr exact = b.binary(
      BinaryFn::logical_or, b.binary(BinaryFn::eq, k, zero),
      all({b.binary(BinaryFn::lt, s2, b.constant(0x1p60, 0x1p900)),
           b.binary(BinaryFn::lt, magnitude, b.constant(0x1p30, 0x1p440)),
           b.binary(BinaryFn::logical_or, b.binary(BinaryFn::le, b.constant(0x1p-60, 0x1p-956), s2),
                    b.binary(BinaryFn::le, b.constant(0x1p-30, 0x1p-400), magnitude)),
           b.binary(BinaryFn::le, b.constant(65.0) * s1 * s1, b.constant(64.0) * k * s2)}));
  return b.build({total, exponent, mean, m2}, {k, e, chunk_mean, chunk_m2}, {k, fast_e, fast_mean, fast_m2}, exact);
}

}  // namespace monoid
}  // namespace tile
