#include "lower/lower_row_program.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <tuple>
#include <utility>

#include "bind/bind.hpp"
#include "ir/printer.hpp"
#include "spec/graph.hpp"
#include "tile/error.hpp"

namespace tile {

using namespace ir;

namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();
constexpr double kLog2e = 1.4426950408889634;

// A value type of the row program in a kernel whose float type is `real`.
Type ir_type(ValueType t, Type real) {
  switch (t) {
    case ValueType::f32: return real;
    case ValueType::i64: return Type::i64;
    case ValueType::b1: return Type::b1;
  }
  return real;
}

bool is_const(const ExprPtr& e, double v) {
  return e->kind == Expr::Kind::constant && is_real(e->type) && e->f == v && !std::signbit(e->f) == !std::signbit(v);
}

// The same register, parameter, special or constant (type and bits).
bool same_leaf(const ExprPtr& a, const ExprPtr& b) {
  if (a == b) return true;
  if (a->kind != b->kind || a->type != b->type) return false;
  switch (a->kind) {
    case Expr::Kind::reg:
    case Expr::Kind::param:
    case Expr::Kind::special: return a->id == b->id;
    case Expr::Kind::constant:
      return is_real(a->type) ? (a->f == b->f && std::signbit(a->f) == std::signbit(b->f)) || (a->f != a->f && b->f != b->f)
                              : a->i == b->i;
    default: return false;
  }
}

// Shared by the row kernel and the finish kernel: registers, constants and the element-wise
// operators of row programs and monoids.
class Emitter {
 public:
  explicit Emitter(Kernel& k) : k_(k) {}

  // The kernel's float type (f32, or f64 in a float64 call) and its constants.
  Type real() const { return k_.real; }
  bool f64() const { return k_.real == Type::f64; }
  ExprPtr fc(double v) const { return float_const(k_.real, v); }
  // A row program's constant node: a float in the kernel's type (its f64 value in f64), or an i64.
  ExprPtr constant(const RowNode& n) const {
    return n.type == ValueType::f32 ? fc(n.value_in(f64())) : i64_const(int64_t(n.value));
  }

  ExprPtr r(int id) const { return reg(id, k_.regs[id].type); }
  int temp(const std::string& name, Type t) { return k_.add_reg(name + std::to_string(k_.regs.size()), t); }
  int assign_new(std::vector<Stmt>& out, const std::string& name, ExprPtr value) {
    int id = temp(name, value->type);
    out.push_back(assign(id, std::move(value)));
    return id;
  }
  // A register holding `value` (itself when it already is one).
  int materialize(std::vector<Stmt>& out, const ExprPtr& value, const std::string& name = "v") {
    if (value->kind == Expr::Kind::reg) return value->id;
    return assign_new(out, name, value);
  }
  // A leaf stays an expression; anything computed goes to a register so it is evaluated once.
  ExprPtr keep(std::vector<Stmt>& out, ExprPtr value, const std::string& name = "e") {
    if (value->kind == Expr::Kind::constant || value->kind == Expr::Kind::reg || value->kind == Expr::Kind::param ||
        value->kind == Expr::Kind::special)
      return value;
    return r(assign_new(out, name, std::move(value)));
  }

  // exp(a) is computed as exp2(a * log2(e)): one multiply and the hardware's base-2 exponential.
  // In f64 there is no such hardware, and the product's rounding would cost |a| log2(e) units
  // (up to ~1000 across f64's range): exp itself.
  ExprPtr unary_fn(UnaryFn fn, ExprPtr a) {
    switch (fn) {
      case UnaryFn::neg: return unary(UnOp::neg, a);
      case UnaryFn::exp: return f64() ? unary(UnOp::exp, a) : unary(UnOp::exp2, binary(BinOp::mul, a, fc(kLog2e)));
      case UnaryFn::log: return unary(UnOp::log, a);
      case UnaryFn::sqrt: return unary(UnOp::sqrt, a);
      case UnaryFn::rsqrt: return unary(UnOp::rsqrt, a);
      case UnaryFn::abs: return unary(UnOp::abs, a);
      case UnaryFn::tanh: return unary(UnOp::tanh, a);
      case UnaryFn::exponent: return unary(UnOp::exponent, a);
      case UnaryFn::logical_not: return unary(UnOp::not_, a);
      case UnaryFn::to_f32: return a->type == real() ? a : cast(real(), a);
    }
    return a;
  }

  // x * 1, x + 0 and x - 0 fold to x, so an absent weight or bias costs nothing (and x + 0
  // does not turn -0 into +0 where the operator would not have added anything).
  ExprPtr binary_fn(BinaryFn fn, ExprPtr a, ExprPtr b) {
    if (fn == BinaryFn::mul && is_const(b, 1.0)) return a;
    if (fn == BinaryFn::mul && is_const(a, 1.0)) return b;
    if ((fn == BinaryFn::add || fn == BinaryFn::sub) && is_const(b, 0.0)) return a;
    if (fn == BinaryFn::add && is_const(a, 0.0)) return b;
    if (fn == BinaryFn::ldexp && (is_const(b, 0.0) || is_const(b, -0.0))) return a;
    if (ExprPtr folded = fold(fn, a, b)) return folded;
    static const BinOp ops[] = {BinOp::add, BinOp::sub, BinOp::mul, BinOp::div, BinOp::max, BinOp::min,
                                BinOp::lt,  BinOp::le,  BinOp::eq,  BinOp::ne,  BinOp::and_, BinOp::or_,
                                BinOp::ldexp};
    return binary(ops[int(fn)], std::move(a), std::move(b));
  }

  // Two finite constants: +, -, * rounded once to the kernel's type (exact in double, or
  // double-rounded for f32 operands, which still rounds correctly), min and max; ldexp of 1 by
  // an integer where 2^n is a normal value of the type. Anything else stays an operation.
  ExprPtr fold(BinaryFn fn, const ExprPtr& a, const ExprPtr& b) const {
    auto finite_const = [](const ExprPtr& e) { return e->kind == Expr::Kind::constant && is_real(e->type) && std::isfinite(e->f); };
    if (!finite_const(a) || !finite_const(b)) return nullptr;
    const double x = a->f, y = b->f;
    auto typed = [&](double v) -> ExprPtr {
      if (!f64()) v = double(float(v));
      return std::isfinite(v) ? fc(v) : nullptr;
    };
    switch (fn) {
      case BinaryFn::add: return typed(x + y);
      case BinaryFn::sub: return typed(x - y);
      case BinaryFn::mul: return typed(x * y);
      case BinaryFn::max: return x == y && std::signbit(x) != std::signbit(y) ? nullptr : fc(std::max(x, y));
      case BinaryFn::min: return x == y && std::signbit(x) != std::signbit(y) ? nullptr : fc(std::min(x, y));
      case BinaryFn::ldexp: {
        const int lo = f64() ? -1022 : -126, hi = f64() ? 1023 : 127;
        if (x != 1.0 || y != std::trunc(y) || y < lo || y > hi) return nullptr;
        return fc(std::ldexp(1.0, int(y)));
      }
      default: return nullptr;
    }
  }

  // regs[i] = values[i] for every i at once: a value that is one of `regs` is copied first, so
  // no assignment reads another's new value.
  void assign_all(std::vector<Stmt>& out, const std::vector<int>& regs, std::vector<ExprPtr> values) {
    for (ExprPtr& v : values)
      if (v->kind == Expr::Kind::reg && std::find(regs.begin(), regs.end(), v->id) != regs.end())
        v = r(assign_new(out, "c", v));
    for (size_t i = 0; i < regs.size(); ++i)
      if (!(values[i]->kind == Expr::Kind::reg && values[i]->id == regs[i])) out.push_back(assign(regs[i], values[i]));
  }

  // values[0] op values[1] ..., as a balanced tree of registers.
  ExprPtr pairwise(std::vector<Stmt>& out, std::vector<ExprPtr> level, BinOp op) {
    TILE_CHECK(!level.empty(), "pairwise of nothing");
    while (level.size() > 1) {
      std::vector<ExprPtr> next;
      for (size_t i = 0; i + 1 < level.size(); i += 2) next.push_back(r(assign_new(out, "p", binary(op, level[i], level[i + 1]))));
      if (level.size() % 2) next.push_back(level.back());
      level = std::move(next);
    }
    return level[0];
  }

  // A monoid's combine graph with this side's and the other side's state bound.
  std::vector<ExprPtr> combine(std::vector<Stmt>& out, const Monoid& m, const std::vector<ExprPtr>& mine,
                               const std::vector<ExprPtr>& other) {
    std::map<int, ExprPtr> memo;
    std::function<ExprPtr(int)> eval = [&](int id) -> ExprPtr {
      if (auto it = memo.find(id); it != memo.end()) return it->second;
      const MonoidNode& n = m.nodes[id];
      ExprPtr v;
      switch (n.kind) {
        case MonoidNode::Kind::mine: v = mine[n.index]; break;
        case MonoidNode::Kind::other: v = other[n.index]; break;
        case MonoidNode::Kind::constant: v = fc(n.value_in(f64())); break;
        case MonoidNode::Kind::unary: v = keep(out, unary_fn(n.unary, eval(n.a))); break;
        case MonoidNode::Kind::binary: v = keep(out, binary_fn(n.binary, eval(n.a), eval(n.b))); break;
        case MonoidNode::Kind::select: v = keep(out, select(eval(n.a), eval(n.b), eval(n.c))); break;
        default: TILE_CHECK(false, "monoid ", m.name, ": chunk node in combine");
      }
      return memo[id] = v;
    };
    std::vector<ExprPtr> result;
    for (int id : m.combine) result.push_back(eval(id));
    return result;
  }

  Kernel& k_;
};

// A chunk of elements folded by a monoid's chunk graph. Elements come in groups that share
// one validity test (a whole vector) or test each element (a vector with a partial tail).
struct ChunkElement {
  std::vector<ExprPtr> inputs;  // one per monoid input
  ExprPtr valid;                // b1, when the group has no common test
};
struct ChunkGroup {
  ExprPtr all_valid;  // b1: every element valid, or none; null: per-element tests
  ExprPtr count;      // float: valid elements in the group
  std::vector<ChunkElement> elems;
  // Staged rows (caching "shared"): monoid input k's values of every element read again from
  // shared memory, for inputs that are a row input as loaded (empty for the others). Each node
  // of the chunk graph built over the elements reads them afresh, so no register holds a
  // vector from one node to the next (softmax's maximum, then its sum of exponentials).
  std::function<std::vector<ExprPtr>(int k)> reload;
  std::vector<bool> reloaded;  // per monoid input: read through `reload`
};

// Evaluates a monoid's chunk graph over a chunk. Chunk-level values may be given (set) before
// they are asked for: staged merges give each chunk sum or max its value over the whole program.
class ChunkEvaluator {
 public:
  ChunkEvaluator(Emitter& em, std::vector<Stmt>& out, const Monoid& m, std::vector<ChunkGroup> groups)
      : em_(em), out_(out), m_(m), groups_(std::move(groups)) {}

  void set(int id, ExprPtr value) { chunk_memo_[id] = std::move(value); }
  // 1 / max(count, 1) for count node `id` (set to a uniform value), made on first use: a
  // division by max(that count, 1) becomes a multiplication by it.
  void set_reciprocal(int id, std::function<ExprPtr()> inv) { reciprocal_[id] = std::move(inv); }
  ExprPtr value(int id) { return elem(id, 0, 0); }
  // Element node `id` at every element of group g.
  std::vector<ExprPtr> values_at(int id, int g) {
    std::vector<ExprPtr> out;
    for (size_t e = 0; e < groups_.at(size_t(g)).elems.size(); ++e) out.push_back(elem(id, g, int(e)));
    return out;
  }
  // Element node `id` at the chunk's first element, 0 when that element lies outside the row
  // (then the worker has no element at all: its first is its lowest column).
  ExprPtr first(int id) {
    const ChunkGroup& g = groups_.at(0);
    ExprPtr valid = g.all_valid ? g.all_valid : g.elems.at(0).valid;
    return em_.keep(out_, select(valid, elem(id, 0, 0), em_.fc(0.0)));
  }
  std::vector<ExprPtr> state() {
    std::vector<ExprPtr> parts;
    for (int id : m_.chunk) parts.push_back(value(id));
    return parts;
  }

 private:
  // Element-level nodes: one value per element (group g, element e); chunk-level nodes: one.
  ExprPtr elem(int id, int g, int e) {
    const MonoidNode& n = m_.nodes[id];
    if (!n.element) {
      if (auto it = chunk_memo_.find(id); it != chunk_memo_.end()) return it->second;
      return chunk_memo_[id] = eval_at(n, g, e);
    }
    if (n.kind == MonoidNode::Kind::element && reloaded(g, n.index)) {
      auto key = std::make_tuple(g, n.index, generation_);
      auto it = reload_memo_.find(key);
      if (it == reload_memo_.end()) it = reload_memo_.emplace(key, groups_[size_t(g)].reload(n.index)).first;
      return it->second.at(size_t(e));
    }
    if (groups_[size_t(g)].reload) {
      // Staged: a node's values are kept for the chunk node being built (the generation that
      // asks), not past it, so LayerNorm's shifted x feeds its sum and its sum of squares from
      // two reads of shared memory instead of holding the slice in registers between them.
      auto key = std::make_tuple(id, g, generation_);
      if (auto it = staged_memo_.find(key); it != staged_memo_.end()) return it->second.at(size_t(e));
      const int outer = generation_;
      generation_ = ++generations_;
      std::vector<ExprPtr> vals;
      for (size_t e2 = 0; e2 < groups_[size_t(g)].elems.size(); ++e2) vals.push_back(eval_at(n, g, int(e2)));
      generation_ = outer;
      return staged_memo_.emplace(key, std::move(vals)).first->second.at(size_t(e));
    }
    if (auto it = elem_memo_.find(id); it != elem_memo_.end() && !it->second[size_t(g)].empty())
      return it->second[g][e];
    std::vector<std::vector<ExprPtr>>& table = elem_memo_[id];
    table.resize(groups_.size());
    const int outer = generation_;
    generation_ = ++generations_;  // this node's values read reloaded inputs once
    // The whole table at once, staged groups left to the branch above.
    for (size_t g2 = 0; g2 < groups_.size(); ++g2) {
      if (groups_[g2].reload || !table[g2].empty()) continue;
      for (size_t e2 = 0; e2 < groups_[g2].elems.size(); ++e2) table[g2].push_back(eval_at(n, int(g2), int(e2)));
    }
    generation_ = outer;
    return table[g][e];
  }
  bool reloaded(int g, int k) const {
    const ChunkGroup& grp = groups_.at(size_t(g));
    return grp.reload && size_t(k) < grp.reloaded.size() && grp.reloaded[size_t(k)];
  }

  ExprPtr eval_at(const MonoidNode& n, int g, int e) {
    switch (n.kind) {
      case MonoidNode::Kind::element: return groups_[g].elems[e].inputs[n.index];
      case MonoidNode::Kind::constant: return em_.fc(n.value_in(em_.f64()));
      case MonoidNode::Kind::unary: return em_.keep(out_, em_.unary_fn(n.unary, elem(n.a, g, e)));
      case MonoidNode::Kind::binary:
        if (ExprPtr inv = reciprocal_of(n)) return em_.keep(out_, em_.binary_fn(BinaryFn::mul, elem(n.a, g, e), inv));
        return em_.keep(out_, em_.binary_fn(n.binary, elem(n.a, g, e), elem(n.b, g, e)));
      case MonoidNode::Kind::select: return em_.keep(out_, select(elem(n.a, g, e), elem(n.b, g, e), elem(n.c, g, e)));
      case MonoidNode::Kind::count: {
        std::vector<ExprPtr> counts;
        for (const ChunkGroup& grp : groups_) counts.push_back(grp.count);
        return em_.pairwise(out_, counts, BinOp::add);
      }
      case MonoidNode::Kind::chunk_sum:
      case MonoidNode::Kind::chunk_max: {
        const int outer = generation_;
        generation_ = ++generations_;
        struct Restore {
          int& g;
          int v;
          ~Restore() { g = v; }
        } restore{generation_, outer};
        const bool sum = n.kind == MonoidNode::Kind::chunk_sum;
        const BinOp op = sum ? BinOp::add : BinOp::max;
        const ExprPtr identity = em_.fc(sum ? 0.0 : kNegInf);
        std::vector<ExprPtr> terms;
        for (size_t g2 = 0; g2 < groups_.size(); ++g2) {
          const ChunkGroup& grp = groups_[g2];
          if (grp.all_valid) {
            // The group is in the row or not as a whole: combine its elements, then test once.
            std::vector<ExprPtr> xs;
            for (size_t e2 = 0; e2 < grp.elems.size(); ++e2) xs.push_back(elem(n.a, int(g2), int(e2)));
            terms.push_back(em_.keep(out_, select(grp.all_valid, em_.pairwise(out_, xs, op), identity)));
          } else {
            for (size_t e2 = 0; e2 < grp.elems.size(); ++e2)
              terms.push_back(em_.keep(out_, select(grp.elems[e2].valid, elem(n.a, int(g2), int(e2)), identity)));
          }
        }
        return em_.pairwise(out_, terms, op);
      }
      case MonoidNode::Kind::first: TILE_CHECK(false, "monoid ", m_.name, ": first read before it was set"); break;
      default: TILE_CHECK(false, "monoid ", m_.name, ": state node in chunk");
    }
    return nullptr;
  }

  // The reciprocal set for d where n is a / d and d is max(count, 1) of a count with one.
  ExprPtr reciprocal_of(const MonoidNode& n) {
    if (n.binary != BinaryFn::div || reciprocal_.empty()) return nullptr;
    const MonoidNode& d = m_.nodes[n.b];
    if (d.kind != MonoidNode::Kind::binary || d.binary != BinaryFn::max) return nullptr;
    for (auto [c, one] : {std::pair{d.a, d.b}, std::pair{d.b, d.a}}) {
      const MonoidNode& k = m_.nodes[one];
      if (k.kind != MonoidNode::Kind::constant || k.value_in(em_.f64()) != 1.0) continue;
      if (auto it = reciprocal_.find(c); it != reciprocal_.end()) return it->second();
    }
    return nullptr;
  }

  Emitter& em_;
  std::vector<Stmt>& out_;
  const Monoid& m_;
  std::vector<ChunkGroup> groups_;
  std::map<int, std::function<ExprPtr()>> reciprocal_;
  std::map<int, std::vector<std::vector<ExprPtr>>> elem_memo_;
  std::map<int, ExprPtr> chunk_memo_;
  std::map<std::tuple<int, int, int>, std::vector<ExprPtr>> reload_memo_;  // (group, input, generation)
  std::map<std::tuple<int, int, int>, std::vector<ExprPtr>> staged_memo_;  // (node, group, generation)
  int generation_ = 0, generations_ = 0;
};

std::vector<ExprPtr> chunk_state(Emitter& em, std::vector<Stmt>& out, const Monoid& m,
                                 const std::vector<ChunkGroup>& groups) {
  return ChunkEvaluator(em, out, m, groups).state();
}

// The values a monoid's fast graph reads from a worker's elements: its sums and maxima, counts
// and firsts (node ids), each computed over all of the worker's elements.
struct FastLeaves {
  std::vector<int> reductions, counts, firsts;
};
FastLeaves fast_leaves(const Monoid& m) {
  FastLeaves leaves;
  std::set<int> seen;
  std::function<void(int)> walk = [&](int id) {
    if (id < 0 || !seen.insert(id).second) return;
    const MonoidNode& n = m.nodes[id];
    switch (n.kind) {
      case MonoidNode::Kind::chunk_sum:
      case MonoidNode::Kind::chunk_max: leaves.reductions.push_back(id); walk(n.a); return;
      case MonoidNode::Kind::count: leaves.counts.push_back(id); return;
      case MonoidNode::Kind::first: leaves.firsts.push_back(id); return;
      default: walk(n.a), walk(n.b), walk(n.c);
    }
  };
  for (int id : m.fast) walk(id);
  walk(m.fast_exact);
  return leaves;
}

// The stage of each chunk sum and max of a monoid's chunk graph: 0 when its argument uses no
// other, else one more than the latest it uses. Staged merges run one merge per stage.
std::map<int, int> chunk_stages(const Monoid& m) {
  std::map<int, int> stage;
  std::function<int(int)> latest = [&](int id) -> int {  // latest stage id depends on, -1 if none
    const MonoidNode& n = m.nodes[id];
    int l = -1;
    for (int o : {n.a, n.b, n.c})
      if (o >= 0) l = std::max(l, latest(o));
    if (n.kind == MonoidNode::Kind::chunk_sum || n.kind == MonoidNode::Kind::chunk_max) {
      if (!stage.count(id)) stage[id] = l + 1;
      return stage[id];
    }
    return l;
  };
  for (int id : m.chunk) latest(id);
  return stage;
}

// Reductions (their program indices) reachable from node `id`; row values stop at results.
void reductions_used(const RowProgram& p, int id, std::set<int>& out) {
  visit_once(p.nodes(), id, [&](int v) {
    const RowNode& n = p.nodes()[size_t(v)];
    if (n.kind == RowNode::Kind::result) out.insert(n.reduction);
    return n.kind != RowNode::Kind::result;
  });
}

}  // namespace

std::set<int> live_reductions(const RowProgram& p, const std::vector<bool>& present) {
  std::set<int> used;
  for (const RowStore& s : p.stores())
    if (present[s.operand]) reductions_used(p, s.value, used);
  // Reductions needed by other reductions' inputs.
  for (bool grew = true; grew;) {
    grew = false;
    for (int red : std::set<int>(used))
      for (int in : p.reductions()[red].inputs) {
        size_t before = used.size();
        reductions_used(p, in, used);
        grew |= used.size() != before;
      }
  }
  return used;
}

namespace {

class RowLowering {
 public:
  RowLowering(const RowProgram& program, const KernelSignature& sig, const MappingPlan& plan)
      : prog_(program), sig_(sig), plan_(plan), em_(k_) {}

  LoweredProgram run();

 private:
  struct Slot {
    ExprPtr col;           // i64 column of element 0
    ExprPtr in_row_count;  // i32: how many of the V elements lie in the row
    ExprPtr live;          // b1, whole-vector plans: the vector lies in the row
    std::map<int, std::vector<int>> values;  // row input operand -> registers
    std::map<int, std::vector<int>> words;   // or raw 16-bit pairs (packed register cache)
    std::map<int, std::vector<int>> column;  // loaded per-column operands
    std::map<int, std::vector<ExprPtr>> memo;
    // The row's peeled head (row_head "peel"): `limit` elements from `col` lie in the row (worker
    // 0's, 0 for the others) and every access is scalar (the row start is not aligned).
    ExprPtr limit;
    bool scalar = false;
    ExprPtr at;  // caching "shared": the slot's first element in its staged regions (i64)
    int stripe = -1;  // and its stripe: its copies are that stripe's group
  };

  ExprPtr r(int id) const { return em_.r(id); }
  ExprPtr i64(int64_t v) { return i64_const(v); }
  ExprPtr fc(double v) const { return em_.fc(v); }
  Type real() const { return k_.real; }
  int assign_new(std::vector<Stmt>& out, const std::string& name, ExprPtr v) { return em_.assign_new(out, name, v); }
  bool present(int operand) const { return sig_.present[operand]; }
  // The row's slots are cached (in registers, or staged in shared memory) rather than re-read.
  bool cached_slots() const { return plan_.caching != InputCaching::reread; }
  bool staged() const { return plan_.caching == InputCaching::shared; }
  DType dtype(int operand) const { return sig_.dtypes[operand]; }
  const OperandDecl& decl(int operand) const { return prog_.operands()[operand]; }
  // The scope whose barrier merges the warps of a program: the group's (every worker of the
  // thread block) or the program's own (a named barrier over its warps).
  Scope merge_scope() const { return plan_.barrier_scope == BarrierScope::group ? Scope::group : Scope::program; }
  Stmt whole(Stmt access) const {
    if (whole_) access.whole = true, access.aligned = b1_const(true);
    return access;
  }

  void declare_arguments();
  void analyse();
  std::vector<Stmt> row_body();
  void begin_row(std::vector<Stmt>& out, ExprPtr block);
  ExprPtr stripe_col(ExprPtr stripe);
  Slot head_slot();
  // Elements of the slot in the row (its peeled head's limit, else cols - col) and whether an
  // operand's access at it may be a vector (never for the head).
  ExprPtr slot_count(const Slot& slot, int cols_reg) const {
    return slot.limit ? slot.limit : binary(BinOp::sub, r(cols_reg), slot.col);
  }
  ExprPtr slot_aligned(const Slot& slot, int operand) const {
    return slot.scalar ? b1_const(false) : r(aligned_.at(operand));
  }
  // Whether a vector access of `buffer` at element `offset` may be one instruction.
  ExprPtr vector_aligned(int buffer, ExprPtr offset) const {
    if (whole_) return b1_const(true);
    return row_aligned(buffer, std::move(offset), plan_.vector_elems * dtype_size(k_.buffers[buffer].dtype));
  }
  // One vector of a per-column input at `col`, `valid` of it in the row; `held` registers count
  // against the private budget (kept across row blocks).
  std::vector<int> load_column(std::vector<Stmt>& out, int operand, ExprPtr col, ExprPtr valid, ExprPtr aligned, bool held);
  // `from`: the operands' registers of this row block as prefetched (row_prefetch "next"),
  // copied instead of loaded.
  void load_slot(std::vector<Stmt>& out, Slot& slot, const std::set<int>& inputs, bool cache,
                 const std::map<int, std::vector<int>>* from = nullptr);
  // caching "shared": stripe `stripe`'s async copies of every cached row input into its staged
  // region, and (after the async wait) the slot's values read back from there into fresh
  // registers, its memoised values forgotten: each pass reads the worker's elements again, so
  // no register holds them across a merge.
  // The slot's column, and how much of its vector lies in the row, in registers.
  void place_slot(std::vector<Stmt>& out, Slot& slot);
  void stage_slot(std::vector<Stmt>& out, Slot& slot, int stripe);
  void load_staged(std::vector<Stmt>& out, Slot& slot, int operand);
  // Forgets a staged slot's values and what was computed from them: the next use reads them
  // again (where it is, so they are live only from there).
  // A staged slot's copies landed before its first read: an async wait leaving the later
  // stripes' groups in flight, so the first pass starts on stripe 0 while the rest arrive.
  void land_staged(std::vector<Stmt>& out, const Slot& slot) {
    if (slot.stripe < staged_landed_) return;
    out.push_back(async_wait(plan_.stripes - 1 - slot.stripe));
    staged_landed_ = slot.stripe + 1;
  }
  void land_all_staged(std::vector<Stmt>& out) {
    if (!staged() || staged_landed_ >= plan_.stripes) return;
    out.push_back(async_wait(0));
    staged_landed_ = plan_.stripes;
  }
  void forget_staged(Slot& slot) {
    slot.values.clear();
    slot.memo.clear();
  }
  // Whether element node `node` reads a staged row input (caching "shared").
  bool reads_staged(int node) const {
    if (node < 0) return false;
    const RowNode& n = prog_.nodes()[node];
    if (!n.shape.cols) return false;
    if (n.kind == RowNode::Kind::load) return staged_of_.count(n.operand) > 0 && present(n.operand);
    return reads_staged(n.a) || reads_staged(n.b) || reads_staged(n.c);
  }
  // row_prefetch "next": loads of row block `block`'s cached row inputs and per-row inputs into
  // the prefetch registers.
  void prefetch_rows(std::vector<Stmt>& out, ExprPtr block);
  // A per-row input's element of row `load_row` into `reg`: 0 where `row_valid` is false, unless
  // the tail is clamped (guard programs then read the last row).
  Stmt load_row_scalar(int operand, int reg, ExprPtr load_row, ExprPtr row_valid) {
    ExprPtr index = binary(BinOp::mul, std::move(load_row), param(stride_of_.at(operand), Type::i64));
    ExprPtr valid = plan_.tail == TailHandling::clamp ? i64(1) : select(std::move(row_valid), i64(1), i64(0));
    return load({reg}, buffer_of_.at(operand), index, valid, b1_const(false), false, 0.0f);
  }
  ExprPtr in_row(const Slot& slot, int j) const { return whole_ ? slot.live : binary(BinOp::lt, i32_const(j), slot.in_row_count); }
  ExprPtr row_value(std::vector<Stmt>& out, int node);
  // 1 / max(cols, 1), a parameter added on first use: a division by the row length is a
  // multiplication by it (one rounding more, no division's instructions or slow-path call).
  ExprPtr inv_cols() {
    if (p_inv_cols_ < 0) {
      k_.params.push_back({"tile_inv_cols", real()});
      lowered_.main.params.push_back({ParamSource::Kind::inv_cols});
      p_inv_cols_ = int(k_.params.size()) - 1;
    }
    return param(p_inv_cols_, real());
  }
  void hoist_row_values(std::vector<Stmt>& out, int node);
  const std::vector<ExprPtr>& element(std::vector<Stmt>& out, Slot& slot, int node);
  void row_inputs_of(int node, std::set<int>& out) const;
  void column_inputs_of(int node, std::set<int>& out) const;  // per-column inputs (present) a node reads
  std::set<int> output_column_inputs() const;  // per-column inputs of the output pass's row stores
  void hold_columns(std::vector<Stmt>& body);
  void load_columns_with_row(std::vector<Stmt>& body);
  std::vector<ChunkGroup> slot_groups(std::vector<Stmt>& out, std::vector<Slot*> slots, const std::vector<int>& inputs);
  void level_pass(std::vector<Stmt>& out, const std::vector<int>& reductions);
  enum class LeafKind { sum, max, uniform };
  bool program_fast(const std::vector<int>& reductions) const;
  std::vector<std::vector<int>> exact_states(std::vector<Stmt>& out, const std::vector<int>& reductions,
                                             const std::set<int>& inputs, bool worker_fast);
  // The program fast path up to its exactness tests: each reduction's fast state (expressions over
  // registers and constants), the worker's own program's test and the group's (or program's).
  struct FastSplit {
    std::vector<std::vector<ExprPtr>> fast;
    ExprPtr own_exact, all_exact;
    int programs = 1;
  };
  FastSplit program_fast_split(std::vector<Stmt>& out, const std::vector<int>& reductions, const std::set<int>& inputs);
  std::vector<std::vector<int>> program_fast_states(std::vector<Stmt>& out, const std::vector<int>& reductions,
                                                    const std::set<int>& inputs);
  void split_pass(std::vector<Stmt>& out, const std::vector<int>& reductions);
  // Runs `emit`, which lowers a branch, then forgets what it memoised (row values, the slots'
  // element values): code after the branch runs whether or not the branch did.
  void branch_local(const std::function<void()>& emit);
  std::set<int> level_inputs(std::vector<Stmt>& out, const std::vector<int>& reductions);
  void bind_results(const std::vector<int>& reductions, const std::vector<std::vector<ExprPtr>>& states);
  void rest_of_row(std::vector<Stmt>& body);
  std::vector<std::vector<ExprPtr>> fold_leaves(std::vector<Stmt>& out, const std::vector<std::pair<LeafKind, int>>& partials,
                                                bool all_programs);
  std::vector<std::vector<int>> merge_across_workers(std::vector<Stmt>& out, const std::vector<const Monoid*>& monoids,
                                                     std::vector<std::vector<int>> states);
  // This row's copy of a merge region slot (odd_row_).
  int region_copies() const { return odd_row_ >= 0 ? 2 : 1; }
  ExprPtr row_copy(ExprPtr index, int elems) const {
    return odd_row_ < 0 ? index : binary(BinOp::add, index, select(r(odd_row_), i32_const(elems), i32_const(0)));
  }
  void butterfly(std::vector<Stmt>& out, const std::vector<const Monoid*>& monoids,
                 std::vector<std::vector<int>>& states, int width, const std::string& name, int shuffle_width = 0);
  // `group_uniform`: the states are already the group's (the same in every warp), so warp 0
  // alone pushes them.
  std::vector<std::vector<int>> merge_through_exchange(std::vector<Stmt>& out, const std::vector<const Monoid*>& monoids,
                                                     std::vector<std::vector<int>> states, bool group_uniform = false);
  std::vector<std::vector<int>> staged_states(std::vector<Stmt>& out, const std::vector<int>& reductions);
  void share_chunk_elements(int reduction, ChunkEvaluator& ev);
  ExprPtr absorbed(std::vector<Stmt>& out, const RowNode& n);
  std::vector<int> reread_fast_state(std::vector<Stmt>& out, int red, const std::map<int, int>& acc);
  void output_pass(std::vector<Stmt>& out, Slot& slot);
  const std::vector<int>& column_values(std::vector<Stmt>& out, Slot& slot, int operand);
  std::vector<Stmt> reread_loop(const std::set<int>& inputs, const std::function<void(std::vector<Stmt>&, std::vector<Slot*>&)>& body);
  void store_row_scalars(std::vector<Stmt>& out);
  void accumulate_rows(std::vector<Stmt>& out, Slot& slot);
  void flush_rows(std::vector<Stmt>& out);
  ExprPtr slot_base() const;
  // This program's partial of part q of reduction red at column col, in the workspace.
  ExprPtr partial_index(int red, size_t q, ExprPtr col) const;
  // Elements of a workspace access: at most 16 bytes (the widest vector access), at most a vector.
  int partial_width() const { return std::min(plan_.vector_elems, 16 / dtype_size(workspace_dtype(real()))); }
  ExprPtr partial_aligned(ExprPtr index) const {
    return row_aligned(ws_buffer_, std::move(index), partial_width() * dtype_size(workspace_dtype(real())));
  }
  LoweredKernel lower_finish();

  const RowProgram& prog_;
  const KernelSignature& sig_;
  const MappingPlan& plan_;
  Kernel k_;
  Emitter em_;
  LoweredProgram lowered_;

  // Kernel arguments.
  int p_rows_ = -1, p_cols_ = -1, p_inv_cols_ = -1, ws_buffer_ = -1;
  std::map<int, int> buffer_of_, stride_of_, scalar_of_;  // operand -> buffer / param
  // What the program needs.
  std::vector<int> live_stores_;                 // indices into prog_.stores()
  std::vector<std::vector<int>> levels_;         // reductions over the columns, by level
  std::vector<int> rows_reductions_;             // reductions over the rows, in order
  std::map<int, int> ws_offset_;                 // rows reduction -> first part's offset (in parts)
  std::set<int> cached_inputs_;                  // row inputs the register cache holds
  // Per row.
  int row_ = -1, row_valid_ = -1, load_cols_ = -1, store_cols_ = -1, first_row_ = -1;
  std::map<int, int> load_off_, store_off_, aligned_;  // operand -> register
  std::map<int, ExprPtr> row_values_;
  // Row values by their expression: two program nodes that lower to the same operations on the
  // same operands (the norms' two rstd forms at exponent 0) share one register.
  std::map<std::string, ExprPtr> row_exprs_;
  std::vector<Slot> cached_;
  // Accumulators of reductions over the rows: [reduction][part] registers for row values;
  // [reduction][slot * V + j][part] for elements of register-cached plans.
  std::map<int, std::vector<int>> row_acc_;
  std::map<int, std::vector<std::vector<int>>> elem_acc_;
  bool whole_ = false;
  std::map<int, int> staged_of_;  // caching "shared": row input -> staged region
  int staged_landed_ = 0;         // stripes whose copies an emitted async wait saw land
  int next_shared_ = 0;
  // A group looping over row blocks keeps two copies of each merge region, the odd rows' after
  // the even ones': a row's stores never meet the previous row's loads, so no barrier need end
  // the row (b1 register, flipped after each row; -1 where the group takes one row block).
  int odd_row_ = -1;
  bool cluster_resident_ = false;  // the cluster wait before the first push is emitted
  // Merges stop at the group (a cluster's fast path's exact fallback, under a group-uniform test).
  bool group_merges_only_ = false;
  int loop_it_ = -1;        // the iteration register of the re-read loop being built
  int head_ = -1;           // row_head "peel": elements before the row's first aligned column
  // column_loads "once": per stripe, the output pass's per-column inputs loaded before the loop
  // over row blocks (operand -> registers), shared by every row the group owns.
  std::vector<std::map<int, std::vector<int>>> held_columns_;
  bool peel_ = false;
  // row_prefetch "next": per stripe, each cached row input's registers of the next row block (raw
  // 16-bit pairs where the vector is even, values otherwise); each per-row input's register;
  // the block after the current one.
  bool prefetch_ = false;
  // row_prefetch "next" on a re-read row: each iteration of a re-read loop loads the next
  // iteration's stripes before it works on its own (reread_loop).
  bool reread_ahead_ = false;
  std::vector<std::map<int, std::vector<int>>> prefetched_;
  std::map<int, int> prefetched_scalars_;
  ExprPtr next_block_;
};

LoweredProgram RowLowering::run() {
  whole_ = plan_.alignment == Alignment::require;
  peel_ = plan_.row_head == RowHead::peel;
  prefetch_ = plan_.row_prefetch == RowPrefetch::next && plan_.caching == InputCaching::registers;
  reread_ahead_ = plan_.row_prefetch == RowPrefetch::next && plan_.caching == InputCaching::reread;
  TILE_CHECK(!prefetch_ || (plan_.grid_limit > 0 && !peel_), "a prefetching plan that validation should have refused");
  TILE_CHECK(plan_.row_prefetch == RowPrefetch::none || prefetch_ || reread_ahead_,
             "a prefetching plan that validation should have refused");
  TILE_CHECK(!staged() || (plan_.grid_limit == 0 && !peel_ && plan_.tail == TailHandling::predicate &&
                           plan_.cache_format == CacheFormat::f32),
             "a staged plan that validation should have refused");
  const int W = plan_.workers_per_program;
  // tile_<program>_<dtypes of the row operands>_p<P>w<W>v<V>s<S><c|r>
  std::string dtypes;
  for (size_t i = 0; i < prog_.operands().size(); ++i) {
    const Role role = decl(int(i)).role;
    if ((role == Role::row_in || role == Role::row_out) && present(int(i))) dtypes += "_" + std::string(dtype_name(dtype(int(i))));
  }
  const int C = plan_.ctas_per_program;
  k_.name = "tile_" + prog_.name() + dtypes + "_p" + std::to_string(plan_.programs_per_group) + "w" +
            std::to_string(W) + "v" + std::to_string(plan_.vector_elems) + "s" + std::to_string(plan_.stripes) +
            (plan_.caching == InputCaching::registers ? "c"
             : staged()                               ? "s"
                                                      : "r") +
            (C > 1 ? "_k" + std::to_string(C) : "");
  TILE_CHECK(C == 1 || (plan_.programs_per_group == 1 && W % 32 == 0),
             "a cluster plan that validation should have refused");
  k_.ctas_per_cluster = C;
  k_.programs_per_group = plan_.programs_per_group;
  k_.workers_per_program = W;
  k_.private_budget = plan_.private_budget;
  k_.resident_groups = plan_.resident_groups;
  k_.real = sig_.f64() ? Type::f64 : Type::f32;
  analyse();
  declare_arguments();

  // Row blocks are indexed by group, or by cluster when the groups of a cluster share a row.
  const ExprPtr owner = special(C > 1 ? Special::cluster_index : Special::group_index);
  const ExprPtr owners = C > 1 ? binary(BinOp::div, special(Special::group_count), i64(C)) : special(Special::group_count);
  std::vector<Stmt>& body = k_.body;
  if (plan_.grid_limit > 0) {
    // Each group (cluster) owns row blocks owner, owner + owners, ...
    body.push_back(comment(C > 1 ? "row blocks owned by this cluster" : "row blocks owned by this group"));
    ExprPtr P = i64(plan_.programs_per_group);
    ExprPtr blocks = binary(BinOp::div, binary(BinOp::add, param(p_rows_, Type::i64), binary(BinOp::sub, P, i64(1))), P);
    ExprPtr count = binary(BinOp::div, binary(BinOp::add, binary(BinOp::sub, blocks, owner), binary(BinOp::sub, owners, i64(1))),
                           owners);
    for (int red : rows_reductions_) {
      const RowReduction& rr = prog_.reductions()[red];
      const bool elem = prog_.nodes()[rr.inputs[0]].shape.cols;
      if (elem && plan_.caching == InputCaching::registers) {
        auto& acc = elem_acc_[red];
        for (int s = 0; s < plan_.stripes; ++s)
          for (int j = 0; j < plan_.vector_elems; ++j) {
            std::vector<int> parts;
            for (size_t q = 0; q < rr.monoid.parts.size(); ++q)
              parts.push_back(assign_new(body, "racc", fc(rr.monoid.identity[q])));
            for (int id : parts) k_.regs[id].cached = true;  // counted against the private budget
            acc.push_back(parts);
          }
      } else if (!elem) {
        for (size_t q = 0; q < rr.monoid.parts.size(); ++q)
          row_acc_[red].push_back(assign_new(body, "racc", fc(rr.monoid.identity[q])));
      }
    }
    if (plan_.column_loads == ColumnLoads::once) hold_columns(body);
    int it = em_.temp("block_it", Type::i64);
    first_row_ = assign_new(body, "first", b1_const(true));
    odd_row_ = assign_new(body, "odd_row", b1_const(false));
    std::vector<Stmt> loop;
    ExprPtr block = binary(BinOp::add, owner, binary(BinOp::mul, r(it), owners));
    if (prefetch_) {
      prefetch_rows(body, owner);  // the group's first row block
      next_block_ = binary(BinOp::add, block, owners);
    }
    begin_row(loop, block);
    for (Stmt& s : row_body()) loop.push_back(std::move(s));
    // The next row block stores into the other copy of the merges' shared slots (odd_row_), and
    // the row after it into this copy again: every warp has read this row's partials before any
    // warp overwrites them where a barrier stands unconditionally in every row (the next row's
    // merge), else one ends the row. On a cluster, the exchange regions take one phase a row:
    // each group arrives once it has consumed an exchange's reads and waits before the next
    // exchange's pushes (merge_through_exchange), so the arrive's latency overlaps the row's
    // output pass and the next row's loads; the first wait pairs with an arrive before the
    // loop, and a wait after it ends the last arrive.
    const bool other_shared =
        std::any_of(k_.shared.begin(), k_.shared.end(), [](const SharedRegion& r) { return r.pushes == 0; });
    const bool row_barrier = std::any_of(loop.begin(), loop.end(), [&](const Stmt& s) {
      return s.kind == Stmt::Kind::barrier && (s.scope == merge_scope() || s.scope == Scope::group);
    });
    if (other_shared && !row_barrier) loop.push_back(barrier(merge_scope()));
    loop.push_back(assign(first_row_, b1_const(false)));
    loop.push_back(assign(odd_row_, unary(UnOp::not_, r(odd_row_))));
    if (cluster_resident_) body.push_back(cluster_arrive());
    body.push_back(for_(it, i64(0), count, std::move(loop)));
    if (cluster_resident_) body.push_back(cluster_wait());
    flush_rows(body);
  } else {
    // One row block a group (cluster). Reductions over the rows here take row values only
    // (validation keeps per-column accumulators to looping groups): each program's value goes
    // to a workspace slot of its own, one a program of every row block, which the second phase
    // folds in slot order as it folds a looping grid's.
    for (int red : rows_reductions_)
      for (double id : prog_.reductions()[red].monoid.identity) row_acc_[red].push_back(assign_new(body, "racc", fc(id)));
    std::vector<Stmt> row;
    begin_row(row, owner);
    for (Stmt& s : row_body()) row.push_back(std::move(s));
    // A cluster's groups arrive at once and wait before their first push (a row that merges
    // nothing has none): the row's loads and the groups' own reductions overlap the others' start.
    if (cluster_resident_) body.push_back(cluster_arrive());
    for (Stmt& s : row) body.push_back(std::move(s));
    flush_rows(body);
  }
  lowered_.main.kernel = std::move(k_);
  if (!rows_reductions_.empty()) lowered_.finish = lower_finish();
  return std::move(lowered_);
}

// Which stores, reductions and row inputs the call needs, and where partials go.
void RowLowering::analyse() {
  for (size_t i = 0; i < prog_.stores().size(); ++i)
    if (present(prog_.stores()[i].operand)) live_stores_.push_back(int(i));  // absent outputs: nothing computes them
  const std::set<int> used = live_reductions(prog_, sig_.present);
  for (const std::vector<int>& level : reduction_levels(prog_)) {
    std::vector<int> kept;
    for (int red : level)
      if (used.count(red)) kept.push_back(red);
    if (!kept.empty()) levels_.push_back(kept);
  }
  int col_parts = 0, fixed = 0;
  for (size_t red = 0; red < prog_.reductions().size(); ++red) {
    const RowReduction& rr = prog_.reductions()[red];
    if (rr.axis != Axis::rows || !used.count(int(red))) continue;
    rows_reductions_.push_back(int(red));
    const bool elem = prog_.nodes()[rr.inputs[0]].shape.cols;
    int& counter = elem ? col_parts : fixed;
    ws_offset_[int(red)] = counter;
    counter += int(rr.monoid.parts.size());
  }
  lowered_.col_parts = col_parts;
  lowered_.fixed_parts = fixed;
  TILE_CHECK(col_parts == 0 || plan_.grid_limit > 0, "per-column accumulators over the rows need a grid limit");
  // The register cache holds the row inputs some pass reads.
  for (int i : live_stores_) row_inputs_of(prog_.stores()[i].value, cached_inputs_);
  for (int red : used)
    for (int in : prog_.reductions()[red].inputs) row_inputs_of(in, cached_inputs_);
}

void RowLowering::declare_arguments() {
  // Buffers: present operands the row kernel touches, in declaration order, then the workspace.
  for (size_t i = 0; i < prog_.operands().size(); ++i) {
    const OperandDecl& d = decl(int(i));
    if (!present(int(i)) || d.role == Role::scalar_in || d.role == Role::col_out || d.role == Role::scalar_out) continue;
    buffer_of_[int(i)] = int(k_.buffers.size());
    k_.buffers.push_back({d.name, dtype(int(i)), is_output(d.role)});
    lowered_.main.buffers.push_back(int(i));
  }
  // An output that may alias an input loses __restrict__ on both.
  for (size_t i = 0; i < prog_.operands().size(); ++i) {
    const OperandDecl& d = decl(int(i));
    if (d.may_alias >= 0 && buffer_of_.count(int(i)) && buffer_of_.count(d.may_alias)) {
      k_.buffers[buffer_of_[int(i)]].noalias = false;
      k_.buffers[buffer_of_[d.may_alias]].noalias = false;
    }
  }
  if (!rows_reductions_.empty()) {
    ws_buffer_ = int(k_.buffers.size());
    k_.buffers.push_back({"tile_workspace", workspace_dtype(k_.real), true});
    lowered_.main.buffers.push_back(-1);
  }
  auto add_param = [&](const std::string& name, Type t, ParamSource src) {
    k_.params.push_back({name, t});
    lowered_.main.params.push_back(src);
    return int(k_.params.size()) - 1;
  };
  p_rows_ = add_param("rows", Type::i64, {ParamSource::Kind::rows});
  p_cols_ = add_param("cols", Type::i64, {ParamSource::Kind::cols});
  for (auto& [operand, buffer] : buffer_of_) {
    Role role = decl(operand).role;
    if (role == Role::row_in || role == Role::row_out || role == Role::row_scalar_in || role == Role::row_scalar_out)
      stride_of_[operand] = add_param(decl(operand).name + "_stride", Type::i64, {ParamSource::Kind::stride, operand});
  }
  for (size_t i = 0; i < prog_.operands().size(); ++i)
    if (decl(int(i)).role == Role::scalar_in)
      scalar_of_[int(i)] =
          add_param(decl(int(i)).name, ir_type(decl(int(i)).scalar_type, real()), {ParamSource::Kind::scalar, int(i)});
}

ExprPtr RowLowering::stripe_col(ExprPtr stripe) {
  // (stripe * W + worker) * V: worker w owns vector_elems consecutive elements per stripe. A
  // row spanning the C groups of a cluster has C x W workers, worker cta x W + w of group cta.
  ExprPtr w = cast(Type::i64, special(Special::worker_in_program));
  if (plan_.ctas_per_program > 1)
    w = binary(BinOp::add, binary(BinOp::mul, cast(Type::i64, special(Special::cta_in_cluster)), i64(plan_.workers_per_program)), w);
  ExprPtr col = binary(BinOp::mul, binary(BinOp::add, binary(BinOp::mul, stripe, i64(plan_.row_workers())), w),
                       i64(plan_.vector_elems));
  return peel_ ? binary(BinOp::add, col, r(head_)) : col;
}

// The peeled head: columns [0, head) of the row, worker 0's (validation keeps cols >= 2 V, so
// every worker's first slot starts in the row's aligned part, and its first element is the
// chunk's first).
RowLowering::Slot RowLowering::head_slot() {
  Slot s;
  s.col = i64(0);
  s.limit = select(binary(BinOp::eq, special(Special::worker_in_program), i32_const(0)),
                   binary(BinOp::min, r(head_), r(load_cols_)), i64(0));
  s.scalar = true;
  return s;
}

void RowLowering::begin_row(std::vector<Stmt>& b, ExprPtr block) {
  const int P = plan_.programs_per_group, V = plan_.vector_elems;
  b.push_back(comment("row owned by this program; guard programs past the last row run masked"));
  row_ = assign_new(b, "row", binary(BinOp::add, binary(BinOp::mul, block, i64(P)), cast(Type::i64, special(Special::program_in_group))));
  row_valid_ = assign_new(b, "row_valid", binary(BinOp::lt, r(row_), param(p_rows_, Type::i64)));
  ExprPtr cols = param(p_cols_, Type::i64);
  store_cols_ = assign_new(b, "store_cols", select(r(row_valid_), cols, i64(0)));
  ExprPtr load_row = r(row_);
  if (plan_.tail == TailHandling::clamp) {
    // Guard programs read the last row and discard it; every lane issues the same loads.
    load_row = binary(BinOp::min, r(row_), binary(BinOp::sub, param(p_rows_, Type::i64), i64(1)));
    load_cols_ = assign_new(b, "load_cols", cols);
  } else {
    load_cols_ = store_cols_;
  }
  for (auto& [operand, buffer] : buffer_of_) {
    const Role role = decl(operand).role;
    if (role == Role::row_in)
      load_off_[operand] = assign_new(b, decl(operand).name + "_off", binary(BinOp::mul, load_row, param(stride_of_[operand], Type::i64)));
    else if (role == Role::row_out)
      store_off_[operand] = assign_new(b, decl(operand).name + "_off", binary(BinOp::mul, r(row_), param(stride_of_[operand], Type::i64)));
  }
  // row_head "peel": the head runs up to the first row input's first column a vector from its
  // row start in elements (from an aligned base: the run-time tests below catch any other).
  ExprPtr start = i64(0);
  if (peel_) {
    for (auto& [operand, buffer] : buffer_of_) {
      if (decl(operand).role != Role::row_in) continue;
      ExprPtr in_vector = binary(BinOp::rem, r(load_off_[operand]), i64(V));
      head_ = assign_new(b, "head", binary(BinOp::rem, binary(BinOp::sub, i64(V), in_vector), i64(V)));
      break;
    }
    TILE_CHECK(head_ >= 0, "a peeled plan for a program with no row input");
    start = r(head_);
  }
  auto at_start = [&](ExprPtr offset) { return peel_ ? binary(BinOp::add, std::move(offset), start) : offset; };
  for (auto& [operand, buffer] : buffer_of_) {
    const Role role = decl(operand).role;
    if (role == Role::row_in)
      aligned_[operand] = assign_new(b, decl(operand).name + "_aligned", vector_aligned(buffer, at_start(r(load_off_[operand]))));
    else if (role == Role::row_out)
      aligned_[operand] = assign_new(b, decl(operand).name + "_aligned", vector_aligned(buffer, at_start(r(store_off_[operand]))));
    else if (role == Role::col_in)
      aligned_[operand] = assign_new(b, decl(operand).name + "_aligned", vector_aligned(buffer, start));
  }
  // Per-row inputs: one load per program row (every worker reads the same address).
  for (auto& [operand, buffer] : buffer_of_) {
    if (decl(operand).role != Role::row_scalar_in) continue;
    const Type t = value_type(dtype(operand), real());
    int v = em_.temp(decl(operand).name, t);
    if (prefetch_)
      b.push_back(assign(v, r(prefetched_scalars_.at(operand))));
    else
      b.push_back(load_row_scalar(operand, v, load_row, r(row_valid_)));
    for (size_t n = 0; n < prog_.nodes().size(); ++n) {
      const RowNode& node = prog_.nodes()[n];
      if (node.kind == RowNode::Kind::load && node.operand == operand) row_values_[int(n)] = r(v);
    }
  }
}

void RowLowering::column_inputs_of(int node, std::set<int>& out) const {
  visit_once(prog_.nodes(), node, [&](int id) {
    const RowNode& n = prog_.nodes()[size_t(id)];
    if (n.kind == RowNode::Kind::load && decl(n.operand).role == Role::col_in && present(n.operand)) out.insert(n.operand);
    return n.kind != RowNode::Kind::result;
  });
}

// column_loads "once": a worker's columns are the same in every row, so the output pass's
// per-column inputs are loaded once, before the loop over row blocks, against cols (in bounds
// whatever the row), and kept in registers counted against the private budget.
void RowLowering::hold_columns(std::vector<Stmt>& body) {
  body.push_back(comment("the output pass's per-column inputs, loaded once for every row block"));
  const std::set<int> columns = output_column_inputs();
  ExprPtr cols = param(p_cols_, Type::i64);
  std::map<int, ExprPtr> aligned;
  for (int operand : columns)
    aligned[operand] = em_.keep(body, vector_aligned(buffer_of_.at(operand), i64(0)), decl(operand).name + "_aligned");
  for (int s = 0; s < plan_.stripes; ++s) {
    ExprPtr col = r(assign_new(body, "col", stripe_col(i64(s))));
    std::map<int, std::vector<int>> held;
    for (int operand : columns)
      held[operand] = load_column(body, operand, col, binary(BinOp::sub, cols, col), aligned[operand], /*held=*/true);
    held_columns_.push_back(std::move(held));
  }
}

std::set<int> RowLowering::output_column_inputs() const {
  std::set<int> columns;
  for (int i : live_stores_)
    if (decl(prog_.stores()[i].operand).role == Role::row_out) column_inputs_of(prog_.stores()[i].value, columns);
  return columns;
}

void RowLowering::row_inputs_of(int node, std::set<int>& out) const {
  visit_once(prog_.nodes(), node, [&](int id) {
    const RowNode& n = prog_.nodes()[size_t(id)];
    // An absent optional input is its constant (element()): nothing to load.
    if (n.kind == RowNode::Kind::load && decl(n.operand).role == Role::row_in && present(n.operand)) out.insert(n.operand);
    return n.kind != RowNode::Kind::result;  // a row value, computed in an earlier pass
  });
}

void RowLowering::load_slot(std::vector<Stmt>& out, Slot& slot, const std::set<int>& inputs, bool cache,
                            const std::map<int, std::vector<int>>* from) {
  place_slot(out, slot);
  const bool clamp = plan_.tail == TailHandling::clamp;
  for (int operand : inputs) {
    const int buffer = buffer_of_.at(operand);
    const DType dt = dtype(operand);
    ExprPtr index = binary(BinOp::add, r(load_off_[operand]), slot.col);
    ExprPtr valid = slot_count(slot, load_cols_);
    ExprPtr is_aligned = slot_aligned(slot, operand);
    // cache_format packed: 16-bit input stays as loaded, two elements a register, and is
    // converted where each pass uses it.
    const bool raw = cache && plan_.cache_format == CacheFormat::packed && dtype_size(dt) == 2;
    std::vector<int> regs;
    for (int j = 0; j < plan_.vector_elems; j += raw ? 2 : 1)
      regs.push_back(k_.add_reg(decl(operand).name + std::to_string(k_.regs.size()), raw ? Type::i32 : value_type(dt, real()), cache));
    if (from) {
      // The prefetched registers hold raw pairs or values; the slot holds what cache_format asks.
      const std::vector<int>& src = from->at(operand);
      const bool src_raw = k_.regs[src[0]].type == Type::i32;
      for (size_t i = 0; i < regs.size(); ++i) {
        const int j = int(i) * (raw ? 2 : 1);
        out.push_back(assign(regs[i], raw || !src_raw ? r(src[i]) : unpack16(dt, r(src[size_t(j / 2)]), j % 2)));
      }
      (raw ? slot.words : slot.values)[operand] = regs;
    } else if (raw) {
      out.push_back(whole(load_raw(regs, buffer, index, valid, is_aligned, clamp)));
      slot.words[operand] = regs;
    } else {
      out.push_back(whole(load(regs, buffer, index, valid, is_aligned, clamp, 0.0f)));
      slot.values[operand] = regs;
    }
  }
}

void RowLowering::place_slot(std::vector<Stmt>& out, Slot& slot) {
  slot.col = r(assign_new(out, "col", slot.col));
  // min(max(load_cols - col, 0), V) as i32: one compare per element instead of i64 math.
  if (whole_) {
    slot.live = r(assign_new(out, "live", binary(BinOp::lt, slot.col, r(load_cols_))));
  } else {
    if (slot.limit) slot.limit = r(assign_new(out, "n", slot.limit));
    ExprPtr count =
        binary(BinOp::min, binary(BinOp::max, slot_count(slot, load_cols_), i64(0)), i64(plan_.vector_elems));
    slot.in_row_count = r(assign_new(out, "n", cast(Type::i32, count)));
  }
}

void RowLowering::stage_slot(std::vector<Stmt>& out, Slot& slot, int stripe) {
  const int P = plan_.programs_per_group, W = plan_.workers_per_program, V = plan_.vector_elems;
  const int64_t per_program = int64_t(plan_.stripes) * W * V;
  if (staged_of_.empty())
    for (int operand : cached_inputs_) {
      staged_of_[operand] = int(k_.staged.size());
      k_.staged.push_back({decl(operand).name + "_slice", dtype(operand), P * per_program});
    }
  place_slot(out, slot);
  // Worker w's vector of stripe s in program p's part of the region: consecutive workers take
  // consecutive vectors, so a warp's shared accesses are conflict-free.
  ExprPtr worker = binary(BinOp::add, i64(int64_t(stripe) * W), cast(Type::i64, special(Special::worker_in_program)));
  ExprPtr program = binary(BinOp::mul, cast(Type::i64, special(Special::program_in_group)), i64(per_program));
  slot.at = r(assign_new(out, "at", binary(BinOp::add, P > 1 ? program : i64(0), binary(BinOp::mul, worker, i64(V)))));
  slot.stripe = stripe;
  for (int operand : cached_inputs_)
    out.push_back(whole(async_copy(staged_of_.at(operand), slot.at, buffer_of_.at(operand),
                                   binary(BinOp::add, r(load_off_[operand]), slot.col), V, slot_count(slot, load_cols_),
                                   slot_aligned(slot, operand))));
}

void RowLowering::load_staged(std::vector<Stmt>& out, Slot& slot, int operand) {
  land_staged(out, slot);
  std::vector<int> regs;
  for (int j = 0; j < plan_.vector_elems; ++j)
    regs.push_back(k_.add_reg(decl(operand).name + std::to_string(k_.regs.size()), value_type(dtype(operand), real())));
  Stmt load = staged_load(regs, staged_of_.at(operand), slot.at, slot_count(slot, load_cols_), 0.0f);
  load.whole = whole_;
  out.push_back(std::move(load));
  slot.values[operand] = regs;
}

ExprPtr RowLowering::row_value(std::vector<Stmt>& out, int node) {
  if (auto it = row_values_.find(node); it != row_values_.end()) return it->second;
  const RowNode& n = prog_.nodes()[node];
  TILE_CHECK(!n.shape.cols, "row_value of a node varying along the columns");
  ExprPtr value;
  switch (n.kind) {
    case RowNode::Kind::constant: return em_.constant(n);
    case RowNode::Kind::cols: value = cast(real(), param(p_cols_, Type::i64)); break;
    case RowNode::Kind::load:
      if (decl(n.operand).role == Role::scalar_in) return param(scalar_of_.at(n.operand), ir_type(n.type, real()));
      if (!present(n.operand)) return row_values_[node] = em_.constant(n);
      TILE_CHECK(false, "per-row input '", decl(n.operand).name, "' was not loaded");
      break;
    case RowNode::Kind::unary: value = em_.unary_fn(n.unary, row_value(out, n.a)); break;
    case RowNode::Kind::binary:
      if (ExprPtr kept = absorbed(out, n)) return row_values_[node] = kept;
      if (n.binary == BinaryFn::div && prog_.nodes()[n.b].kind == RowNode::Kind::cols) {
        value = em_.binary_fn(BinaryFn::mul, row_value(out, n.a), inv_cols());
        break;
      }
      value = em_.binary_fn(n.binary, row_value(out, n.a), row_value(out, n.b));
      break;
    case RowNode::Kind::select: {
      ExprPtr c = row_value(out, n.a), a = row_value(out, n.b), b = row_value(out, n.c);
      value = same_leaf(a, b) ? a : select(c, a, b);
      break;
    }
    case RowNode::Kind::result: TILE_CHECK(false, "reduction result %", node, " used before its pass"); break;
    default: TILE_CHECK(false, "unexpected row node kind");
  }
  if (value->kind == Expr::Kind::constant || value->kind == Expr::Kind::param || value->kind == Expr::Kind::reg)
    return row_values_[node] = value;
  const std::string key = to_string(k_, *value);
  if (auto it = row_exprs_.find(key); it != row_exprs_.end()) return row_values_[node] = it->second;
  return row_values_[node] = row_exprs_[key] = r(assign_new(out, "s", value));
}

// max(a, min(a, c)) and min(a, max(a, c)), in either order, are a where c is a constant that is
// not NaN, a NaN a included (min and max propagate NaN): the norms' eps clamp once their
// exponent is 0. Null where the node is not of that form.
ExprPtr RowLowering::absorbed(std::vector<Stmt>& out, const RowNode& n) {
  if (n.binary != BinaryFn::max && n.binary != BinaryFn::min) return nullptr;
  const BinaryFn inner = n.binary == BinaryFn::max ? BinaryFn::min : BinaryFn::max;
  for (auto [x, y] : {std::pair{n.a, n.b}, std::pair{n.b, n.a}}) {
    const RowNode& in = prog_.nodes()[y];
    if (in.kind != RowNode::Kind::binary || in.binary != inner || in.shape.cols) continue;
    for (auto [same, c] : {std::pair{in.a, in.b}, std::pair{in.b, in.a}}) {
      const RowNode& k = prog_.nodes()[c];
      if (k.kind != RowNode::Kind::constant || std::isnan(k.value_in(em_.f64()))) continue;
      ExprPtr v = row_value(out, x);
      if (same_leaf(row_value(out, same), v)) return v;
    }
  }
  return nullptr;
}

// Computes every row value an element expression uses before the pass that needs it, so none
// is first defined inside a stripe loop.
void RowLowering::hoist_row_values(std::vector<Stmt>& out, int node) {
  visit_once(prog_.nodes(), node, [&](int id) {
    if (prog_.nodes()[size_t(id)].shape.cols) return true;
    row_value(out, id);
    return false;
  });
}

const std::vector<ExprPtr>& RowLowering::element(std::vector<Stmt>& out, Slot& slot, int node) {
  if (auto it = slot.memo.find(node); it != slot.memo.end()) return it->second;
  const RowNode& n = prog_.nodes()[node];
  const int V = plan_.vector_elems;
  std::vector<ExprPtr> vals;
  if (!n.shape.cols) {
    vals.assign(V, row_value(out, node));
    return slot.memo[node] = vals;
  }
  switch (n.kind) {
    case RowNode::Kind::load: {
      const Role role = decl(n.operand).role;
      if (!present(n.operand)) {
        vals.assign(V, em_.constant(n));
      } else if (role == Role::row_in) {
        if (auto w = slot.words.find(n.operand); w != slot.words.end()) {
          for (int j = 0; j < V; ++j)
            vals.push_back(r(assign_new(out, "x", unpack16(dtype(n.operand), r(w->second[j / 2]), j % 2))));
        } else {
          if (slot.at && !slot.values.count(n.operand)) load_staged(out, slot, n.operand);
          for (int reg_id : slot.values.at(n.operand)) vals.push_back(r(reg_id));
        }
      } else {  // per-column input: loaded once per slot
        for (int reg_id : column_values(out, slot, n.operand)) vals.push_back(r(reg_id));
      }
      break;
    }
    case RowNode::Kind::col_index:
      for (int j = 0; j < V; ++j) vals.push_back(em_.keep(out, binary(BinOp::add, slot.col, i64(j)), "c"));
      break;
    case RowNode::Kind::unary: {
      std::vector<ExprPtr> a = element(out, slot, n.a);
      for (int j = 0; j < V; ++j) vals.push_back(em_.keep(out, em_.unary_fn(n.unary, a[j])));
      break;
    }
    case RowNode::Kind::binary: {
      std::vector<ExprPtr> a = element(out, slot, n.a), b = element(out, slot, n.b);
      for (int j = 0; j < V; ++j) vals.push_back(em_.keep(out, em_.binary_fn(n.binary, a[j], b[j])));
      break;
    }
    case RowNode::Kind::select: {
      std::vector<ExprPtr> c = element(out, slot, n.a), a = element(out, slot, n.b), b = element(out, slot, n.c);
      for (int j = 0; j < V; ++j) vals.push_back(em_.keep(out, select(c[j], a[j], b[j])));
      break;
    }
    default: TILE_CHECK(false, "node %", node, " is not an element node");
  }
  return slot.memo[node] = vals;
}

std::vector<ChunkGroup> RowLowering::slot_groups(std::vector<Stmt>& out, std::vector<Slot*> slots,
                                                 const std::vector<int>& inputs) {
  std::vector<ChunkGroup> groups;
  const int V = plan_.vector_elems;
  for (Slot* slot : slots) {
    ChunkGroup g;
    std::vector<std::vector<ExprPtr>> values;
    for (int in : inputs) {
      // A staged slot's inputs that read the staged row — the row as loaded, or an expression
      // of it (cross-entropy's logit at the target, a user's x / t + mask) — are read again
      // for each node that asks (`reload`), so none is held from one fold to the next. (A slot
      // loaded from memory, the row's head, keeps its values.)
      const bool reread = slot->at && reads_staged(in);
      g.reloaded.push_back(reread);
      // A reloaded input's values come from `reload`; these stand in for them, unread.
      values.push_back(reread ? std::vector<ExprPtr>(size_t(V), fc(0.0)) : element(out, *slot, in));
    }
    if (slot->at)
      g.reload = [this, &out, slot, inputs](int k) {
        // Read as load_staged reads them, into fresh registers, and computed from them afresh:
        // a copy of the slot that has loaded and memoised nothing; the slot keeps its own.
        Slot copy = *slot;
        forget_staged(copy);
        return std::vector<ExprPtr>(element(out, copy, inputs.at(size_t(k))));
      };
    if (whole_) {
      g.all_valid = slot->live;
      g.count = em_.keep(out, select(slot->live, fc(V), fc(0.0)), "k");
    } else {
      g.count = em_.keep(out, cast(real(), slot->in_row_count), "k");
    }
    for (int j = 0; j < V; ++j) {
      ChunkElement e;
      for (auto& v : values) e.inputs.push_back(v[j]);
      if (!whole_) e.valid = in_row(*slot, j);
      g.elems.push_back(std::move(e));
    }
    groups.push_back(std::move(g));
  }
  return groups;
}

// One pass over the row for the reductions of one level: the program fast path where it
// applies, else per-worker chunk states and one merge of every part across the program.
void RowLowering::level_pass(std::vector<Stmt>& out, const std::vector<int>& reductions) {
  std::set<int> inputs = level_inputs(out, reductions);
  std::vector<std::vector<int>> states = program_fast(reductions) ? program_fast_states(out, reductions, inputs)
                                                                  : exact_states(out, reductions, inputs, true);
  std::vector<std::vector<ExprPtr>> values(states.size());
  for (size_t i = 0; i < states.size(); ++i)
    for (int reg : states[i]) values[i].push_back(r(reg));
  bind_results(reductions, values);
}

// The last level on the program fast path: the rest of the row is lowered twice, once from the
// fast states where every program read passed its test (their constant parts fold, e.g. the
// norms' exponent 0 removes every scaling from the normalisation) and once after the exact path.
void RowLowering::split_pass(std::vector<Stmt>& out, const std::vector<int>& reductions) {
  std::set<int> inputs = level_inputs(out, reductions);
  FastSplit split = program_fast_split(out, reductions, inputs);
  land_all_staged(out);  // both paths below read staged slots
  std::vector<Stmt> fast{comment("every program read passed its test: the rest of the row from the fast states")};
  std::vector<std::vector<ExprPtr>> values(split.fast.size());
  branch_local([&] {
    for (size_t i = 0; i < split.fast.size(); ++i)
      for (const ExprPtr& v : split.fast[i]) values[i].push_back(em_.keep(fast, v, "acc"));
    bind_results(reductions, values);
    rest_of_row(fast);
  });
  std::vector<Stmt> slow{comment("the fast path is not exact enough here: the exact path")};
  // Staged slots are read again here, so the fast path's values die before its merges.
  if (staged())
    for (Slot& slot : cached_) forget_staged(slot);
  std::vector<std::vector<int>> exact = exact_states(slow, reductions, inputs, false);
  for (size_t i = 0; i < exact.size(); ++i) {
    values[i].clear();
    for (size_t k = 0; k < exact[i].size(); ++k)
      values[i].push_back(split.programs == 1 ? r(exact[i][k])
                                              : em_.keep(slow, select(split.own_exact, split.fast[i][k], r(exact[i][k])), "acc"));
  }
  bind_results(reductions, values);
  rest_of_row(slow);
  out.push_back(if_(split.all_exact, std::move(fast), std::move(slow)));
}

void RowLowering::branch_local(const std::function<void()>& emit) {
  const std::map<int, ExprPtr> row_values = row_values_;
  const std::map<std::string, ExprPtr> row_exprs = row_exprs_;
  const std::vector<Slot> cached = cached_;
  emit();
  row_values_ = row_values;
  row_exprs_ = row_exprs;
  cached_ = cached;
}

std::set<int> RowLowering::level_inputs(std::vector<Stmt>& out, const std::vector<int>& reductions) {
  std::string names;
  for (int red : reductions) names += (names.empty() ? "" : ", ") + prog_.reductions()[red].monoid.name;
  out.push_back(comment("reductions over the row: " + names));
  std::set<int> inputs;
  for (int red : reductions)
    for (int in : prog_.reductions()[red].inputs) {
      hoist_row_values(out, in);
      row_inputs_of(in, inputs);
    }
  return inputs;
}

void RowLowering::bind_results(const std::vector<int>& reductions, const std::vector<std::vector<ExprPtr>>& states) {
  for (size_t i = 0; i < reductions.size(); ++i) {
    const RowReduction& rr = prog_.reductions()[reductions[i]];
    for (size_t q = 0; q < rr.results.size(); ++q) row_values_[rr.results[q]] = states[i][q];
  }
}

// The program fast path serves a level whose monoids all have a fast graph, in programs of
// whole warps (one or more): there the sums and maxima its fast graphs read are merged across
// the program (on a cluster, across each group) as plain sums and maxima, and the program's (or
// the group's) exactness test is uniform, so the exact path can run under it, barriers and all.
bool RowLowering::program_fast(const std::vector<int>& reductions) const {
  return program_fast_path(prog_, reductions, plan_);
}

// The states of a level's reductions with no program fast path: per-worker chunk states (or,
// for re-read plans with `worker_fast`, a monoid's worker fast path) and one merge of every
// part across the program; for register-cached plans with the staged merge, stage by stage.
std::vector<std::vector<int>> RowLowering::exact_states(std::vector<Stmt>& out, const std::vector<int>& reductions,
                                                        const std::set<int>& inputs, bool worker_fast) {
  // A monoid's worker fast path serves re-read plans only: there it replaces a scaled merge per
  // loop iteration by additions. A register-cached worker folds its chunk once, and its fallback
  // over the cached registers would bloat the kernel and force the combine merge across workers
  // (the fast path is per worker), so cached plans keep the chunk graph and the plan's merge.
  bool fast = false;
  if (worker_fast && plan_.caching == InputCaching::reread)
    for (int red : reductions) fast |= !prog_.reductions()[red].monoid.fast.empty();
  const bool staged = plan_.merge == MergeStrategy::staged && !fast && !group_merges_only_;
  std::vector<std::vector<int>> states;
  if (staged) {
    states = staged_states(out, reductions);
  } else if (cached_slots()) {
    std::vector<Slot*> slots;
    for (Slot& s : cached_) slots.push_back(&s);
    for (int red : reductions) {
      const RowReduction& rr = prog_.reductions()[red];
      std::vector<ChunkGroup> groups = slot_groups(out, slots, rr.inputs);
      std::vector<ExprPtr> st = chunk_state(em_, out, rr.monoid, groups);
      std::vector<int> regs;
      for (const ExprPtr& v : st) regs.push_back(assign_new(out, "acc", v));
      states.push_back(regs);
    }
  } else {
    // Fast paths accumulate their sums, maxima and counts (acc[i]: node -> register) instead
    // of a state; the others fold chunk states with combine.
    std::vector<std::map<int, int>> acc(reductions.size());
    for (size_t i = 0; i < reductions.size(); ++i) {
      const Monoid& m = prog_.reductions()[reductions[i]].monoid;
      std::vector<int> regs;
      if (!fast || m.fast.empty()) {
        for (double id : m.identity) regs.push_back(assign_new(out, "acc", fc(id)));
      } else {
        FastLeaves leaves = fast_leaves(m);
        for (int id : leaves.reductions)
          acc[i][id] = assign_new(out, "fs", fc(m.nodes[id].kind == MonoidNode::Kind::chunk_sum ? 0.0 : kNegInf));
        for (int id : leaves.counts) acc[i][id] = assign_new(out, "fk", fc(0.0));
        for (int id : leaves.firsts) acc[i][id] = assign_new(out, "ff", fc(0.0));
      }
      states.push_back(regs);
    }
    for (Stmt& s : reread_loop(inputs, [&](std::vector<Stmt>& body, std::vector<Slot*>& slots) {
           for (size_t i = 0; i < reductions.size(); ++i) {
             const RowReduction& rr = prog_.reductions()[reductions[i]];
             if (!acc[i].empty()) {
               // The worker's first element comes in the first iteration; sums and maxima
               // accumulate by addition and max, one chunk at a time.
               ChunkEvaluator ev(em_, body, rr.monoid, slot_groups(body, slots, rr.inputs));
               for (auto& [id, reg] : acc[i]) {
                 const MonoidNode& n = rr.monoid.nodes[id];
                 if (n.kind != MonoidNode::Kind::first) continue;
                 body.push_back(assign(reg, select(binary(BinOp::eq, r(loop_it_), i64(0)), ev.first(n.a), r(reg))));
                 ev.set(id, r(reg));
               }
               for (auto& [id, reg] : acc[i]) {
                 const MonoidNode& n = rr.monoid.nodes[id];
                 if (n.kind == MonoidNode::Kind::first) continue;
                 const BinOp op = n.kind == MonoidNode::Kind::chunk_max ? BinOp::max : BinOp::add;
                 body.push_back(assign(reg, binary(op, r(reg), ev.value(id))));
               }
               continue;
             }
             std::vector<ExprPtr> chunk = chunk_state(em_, body, rr.monoid, slot_groups(body, slots, rr.inputs));
             std::vector<ExprPtr> mine;
             for (int reg_id : states[i]) mine.push_back(r(reg_id));
             em_.assign_all(body, states[i], em_.combine(body, rr.monoid, mine, chunk));
           }
         }))
      out.push_back(std::move(s));
    for (size_t i = 0; i < reductions.size(); ++i)
      if (!acc[i].empty()) states[i] = reread_fast_state(out, reductions[i], acc[i]);
  }
  if (!staged) {
    std::vector<const Monoid*> monoids;
    for (int red : reductions) monoids.push_back(&prog_.reductions()[red].monoid);
    states = merge_across_workers(out, monoids, std::move(states));
  }
  return states;
}

// The program fast path: every worker folds the sums and maxima the level's fast graphs read
// over its elements (the register cache, or one re-read loop), with `first` the row's element
// at column 0 (one element shared by the whole program); fold_leaves merges them across the
// program and every worker evaluates the fast graphs on the totals. Where a program's totals
// fail their exactness test (huge, tiny or non-finite elements: rare), the exact path runs
// under a uniform condition and that program takes its states.
RowLowering::FastSplit RowLowering::program_fast_split(std::vector<Stmt>& out, const std::vector<int>& reductions,
                                                       const std::set<int>& inputs) {
  out.push_back(comment("program fast path: plain sums and maxima merged across the program"));
  struct Leaf {
    size_t reduction;
    int node;
    LeafKind kind;
    int reg;
  };
  std::vector<Leaf> leaves;
  // The row's first element, for the fast graphs' `first` nodes: every worker loads the vector
  // at column 0 (one address for the whole warp), where reads_row_head (the cost model's count)
  // says; a register-cached program of one warp broadcasts it from lane 0's cache instead. On a
  // cluster, the group's first element (its worker 0's first column; 0 where the group's slice
  // lies past the row): one of the elements its sums cover, as LayerNorm's test of the shifted
  // sums assumes, and in the group's own slice, not another group's.
  Slot head;
  const bool broadcast = head_in_cache(plan_);
  if (reads_row_head(prog_, reductions, plan_)) {
    head.col = plan_.ctas_per_program > 1
                   ? binary(BinOp::mul, cast(Type::i64, special(Special::cta_in_cluster)),
                            i64(int64_t(plan_.workers_per_program) * plan_.vector_elems))
                   : i64(0);
    head.scalar = peel_;  // column 0 of a peeled row is not aligned
    load_slot(out, head, inputs, /*cache=*/false);
  }
  // The elements the sums cover: the row's, or on a cluster the group's slice of it (stripe s of
  // group g holds columns [(s C + g) W V, (s C + g + 1) W V), and the stripes cover the row).
  ExprPtr covered = r(load_cols_);
  if (const int C = plan_.ctas_per_program; C > 1) {
    const int64_t slice = int64_t(plan_.workers_per_program) * plan_.vector_elems;
    ExprPtr full = binary(BinOp::div, r(load_cols_), i64(C * slice));
    ExprPtr rest = binary(BinOp::sub, binary(BinOp::sub, r(load_cols_), binary(BinOp::mul, full, i64(C * slice))),
                          binary(BinOp::mul, cast(Type::i64, special(Special::cta_in_cluster)), i64(slice)));
    covered = binary(BinOp::add, binary(BinOp::mul, full, i64(slice)),
                     binary(BinOp::min, binary(BinOp::max, rest, i64(0)), i64(slice)));
  }
  const int row_count = assign_new(out, "k", cast(real(), covered));
  for (size_t i = 0; i < reductions.size(); ++i) {
    const RowReduction& rr = prog_.reductions()[reductions[i]];
    const Monoid& m = rr.monoid;
    FastLeaves fl = fast_leaves(m);
    for (int id : fl.counts) leaves.push_back({i, id, LeafKind::uniform, row_count});
    for (int id : fl.firsts) {
      if (broadcast) {
        // Worker 0's first cached element is the row's column 0 (0 where the row is empty).
        ChunkEvaluator mine(em_, out, m, slot_groups(out, {&cached_.at(0)}, rr.inputs));
        const int src = em_.materialize(out, mine.first(m.nodes[id].a), "first");
        const int dst = em_.temp("first", real());
        out.push_back(shfl_idx(dst, src, 0, 32));
        leaves.push_back({i, id, LeafKind::uniform, dst});
        continue;
      }
      ChunkEvaluator at_head(em_, out, m, slot_groups(out, {&head}, rr.inputs));
      leaves.push_back({i, id, LeafKind::uniform, em_.materialize(out, at_head.first(m.nodes[id].a), "first")});
    }
    for (int id : fl.reductions)
      leaves.push_back({i, id, m.nodes[id].kind == MonoidNode::Kind::chunk_max ? LeafKind::max : LeafKind::sum, -1});
  }
  auto set_uniform = [&](ChunkEvaluator& ev, size_t i) {
    for (const Leaf& l : leaves)
      if (l.reduction == i && l.kind == LeafKind::uniform) ev.set(l.node, r(l.reg));
  };
  if (cached_slots()) {
    std::vector<Slot*> slots;
    for (Slot& s : cached_) slots.push_back(&s);
    for (size_t i = 0; i < reductions.size(); ++i) {
      const RowReduction& rr = prog_.reductions()[reductions[i]];
      ChunkEvaluator ev(em_, out, rr.monoid, slot_groups(out, slots, rr.inputs));
      set_uniform(ev, i);
      for (Leaf& l : leaves)
        if (l.reduction == i && l.kind != LeafKind::uniform) l.reg = em_.materialize(out, ev.value(l.node), "fs");
    }
  } else {
    for (Leaf& l : leaves)
      if (l.kind != LeafKind::uniform) l.reg = assign_new(out, "fs", fc(l.kind == LeafKind::sum ? 0.0 : kNegInf));
    for (Stmt& s : reread_loop(inputs, [&](std::vector<Stmt>& body, std::vector<Slot*>& slots) {
           for (size_t i = 0; i < reductions.size(); ++i) {
             const RowReduction& rr = prog_.reductions()[reductions[i]];
             ChunkEvaluator ev(em_, body, rr.monoid, slot_groups(body, slots, rr.inputs));
             set_uniform(ev, i);
             for (const Leaf& l : leaves)
               if (l.reduction == i && l.kind != LeafKind::uniform)
                 body.push_back(assign(l.reg, binary(l.kind == LeafKind::sum ? BinOp::add : BinOp::max, r(l.reg),
                                                     ev.value(l.node))));
           }
         }))
      out.push_back(std::move(s));
  }
  std::vector<std::pair<LeafKind, int>> partials;
  for (const Leaf& l : leaves) partials.push_back({l.kind, l.reg});
  // totals[q][leaf] of the programs read: all of the group's under a group barrier, else the
  // worker's own (then q = 0 is its program). A program of one warp reads its own from its
  // butterfly: its exact path holds no barrier (one warp merges by shuffles), so a condition
  // uniform across the warp suffices.
  const bool all_programs = merge_scope() == Scope::group && plan_.workers_per_program >= 64;
  std::vector<std::vector<ExprPtr>> totals = fold_leaves(out, partials, all_programs);
  const int P = all_programs ? plan_.programs_per_group : 1;
  // Every program's exactness test; the worker's own totals by a select chain over the
  // programs read, and its fast state from them (the state's exponents and scalings once, not
  // once a program).
  // The row count's reciprocal: 1 / max(cols, 1), or 1 where the program loads no row.
  ExprPtr inv_count;
  auto row_count_reciprocal = [&]() {
    if (!inv_count)
      inv_count = r(assign_new(out, "inv", plan_.ctas_per_program > 1
                                               ? binary(BinOp::div, fc(1.0), binary(BinOp::max, r(row_count), fc(1.0)))
                                               : select(binary(BinOp::eq, r(load_cols_), i64(0)), fc(1.0), inv_cols())));
    return inv_count;
  };
  auto evaluate = [&](const std::vector<ExprPtr>& sums, std::vector<std::vector<ExprPtr>>* state) {
    ExprPtr exact;
    for (size_t i = 0; i < reductions.size(); ++i) {
      const Monoid& m = prog_.reductions()[reductions[i]].monoid;
      ChunkEvaluator ev(em_, out, m, {});
      for (size_t l = 0; l < leaves.size(); ++l)
        if (leaves[l].reduction == i) {
          ev.set(leaves[l].node, sums[l]);
          if (m.nodes[leaves[l].node].kind == MonoidNode::Kind::count)
            ev.set_reciprocal(leaves[l].node, row_count_reciprocal);
        }
      if (state)
        for (int id : m.fast) (*state)[i].push_back(ev.value(id));
      ExprPtr e = ev.value(m.fast_exact);
      exact = exact ? em_.keep(out, binary(BinOp::and_, exact, e)) : e;
    }
    return exact;
  };
  FastSplit split;
  split.fast.resize(reductions.size());
  split.programs = P;
  if (P == 1) {  // the worker's own totals only: the test and the state share one evaluation
    split.own_exact = split.all_exact = evaluate(totals[0], &split.fast);
    return split;
  }
  std::vector<ExprPtr> own_sums = totals[0];
  ExprPtr own_exact, all_exact;
  for (int q = 0; q < P; ++q) {
    ExprPtr exact = evaluate(totals[q], nullptr);
    all_exact = all_exact ? em_.keep(out, binary(BinOp::and_, all_exact, exact)) : exact;
    if (q == 0) {
      own_exact = exact;
      continue;
    }
    ExprPtr mine = binary(BinOp::eq, special(Special::program_in_group), i32_const(q));
    for (size_t l = 0; l < leaves.size(); ++l) own_sums[l] = em_.keep(out, select(mine, totals[q][l], own_sums[l]));
    own_exact = em_.keep(out, select(mine, exact, own_exact));
  }
  evaluate(own_sums, &split.fast);
  split.own_exact = own_exact;
  split.all_exact = all_exact;
  return split;
}

// The program fast path of a level before the last, or of any level on a cluster: the fast
// states in registers, replaced by the exact path's where a program read failed its test. On a
// cluster each group folds its slice's sums and maxima (the count its own elements) and its
// test is the group's, so its exact path merges within the group only (its barriers may run
// under that test), and then the groups' states, fast or exact, merge through the exchange, one
// push a group and part: a few scalings a row where the chunk graphs cost several operations
// an element (RMSNorm's three sums of squares, LayerNorm's two maxima and sums).
std::vector<std::vector<int>> RowLowering::program_fast_states(std::vector<Stmt>& out, const std::vector<int>& reductions,
                                                               const std::set<int>& inputs) {
  const bool cluster = plan_.ctas_per_program > 1;
  FastSplit split = program_fast_split(out, reductions, inputs);
  land_all_staged(out);  // both paths below read staged slots
  std::vector<std::vector<int>> regs(reductions.size());
  for (size_t i = 0; i < reductions.size(); ++i)
    for (const ExprPtr& v : split.fast[i]) regs[i].push_back(assign_new(out, "acc", v));
  // What the exact path memoises (row values, the element values a staged merge shares with
  // the program) is computed only under its condition: later passes must not read it.
  std::vector<Stmt> slow{comment(cluster ? "the fast path is not exact enough here: the exact path, merged within the group"
                                         : "the fast path is not exact enough here: the exact path")};
  std::vector<std::vector<int>> exact;
  branch_local([&] {
    if (staged())
      for (Slot& slot : cached_) forget_staged(slot);
    group_merges_only_ = cluster;
    exact = exact_states(slow, reductions, inputs, false);
    group_merges_only_ = false;
  });
  for (size_t i = 0; i < reductions.size(); ++i)
    for (size_t k = 0; k < regs[i].size(); ++k)
      slow.push_back(assign(regs[i][k], split.programs == 1 ? r(exact[i][k])
                                                            : select(split.own_exact, r(regs[i][k]), r(exact[i][k]))));
  out.push_back(if_(unary(UnOp::not_, split.all_exact), std::move(slow)));
  if (!cluster) return regs;
  std::vector<const Monoid*> monoids;
  for (int red : reductions) monoids.push_back(&prog_.reductions()[red].monoid);
  return merge_through_exchange(out, monoids, std::move(regs), /*group_uniform=*/true);
}

// Merges the program fast path's partials (a sum or max per worker, or a value the same in
// every worker of a program) across the program: a butterfly over each warp, then lane 0 of
// every warp stores to its slot and, after one barrier, every worker folds the warps' partials
// in one fixed order read at uniform indices. Every worker of a program thus gets the same bits
// (which the verifier sees: a barrier may depend on them). With `all_programs` every worker
// folds every program of its group (totals[q] for program q; a group barrier orders them),
// else only its own (totals[0]).
std::vector<std::vector<ExprPtr>> RowLowering::fold_leaves(std::vector<Stmt>& out,
                                                           const std::vector<std::pair<LeafKind, int>>& partials,
                                                           bool all_programs) {
  const int warps = plan_.workers_per_program / 32, P = plan_.programs_per_group;
  std::vector<int> mine;
  for (auto [kind, reg] : partials) {
    for (int offset = 16; offset >= 1 && kind != LeafKind::uniform; offset /= 2) {
      int t = em_.temp("t", real());
      out.push_back(shfl_xor(t, reg, offset, 32));
      reg = assign_new(out, "m", binary(kind == LeafKind::sum ? BinOp::add : BinOp::max, r(reg), r(t)));
    }
    mine.push_back(reg);
  }
  // A program of one warp has its totals from the butterfly, the same bits in every lane.
  if (warps == 1 && !all_programs) {
    std::vector<ExprPtr> row;
    for (int reg : mine) row.push_back(r(reg));
    return {row};
  }
  std::vector<Stmt> stores;
  std::vector<int> regions;
  const ExprPtr slot = binary(BinOp::add, binary(BinOp::mul, special(Special::program_in_group), i32_const(warps)),
                              special(Special::warp_in_program));
  // A uniform value is the worker's own where only its own program is read.
  const bool share_uniform = all_programs && P > 1;
  for (size_t l = 0; l < mine.size(); ++l) {
    const int reg = mine[l];
    if (partials[l].first == LeafKind::uniform && !share_uniform) {
      regions.push_back(-1);
      continue;
    }
    regions.push_back(int(k_.shared.size()));
    k_.shared.push_back({"sums" + std::to_string(k_.shared.size()), next_shared_, P * warps * region_copies(), 0});
    next_shared_ += P * warps * region_copies();
    stores.push_back(shared_store(regions.back(), row_copy(slot, P * warps), r(reg)));
  }
  out.push_back(if_(binary(BinOp::eq, special(Special::lane), i32_const(0)), std::move(stores)));
  out.push_back(barrier(merge_scope()));
  std::vector<std::vector<ExprPtr>> totals;
  for (int q = 0; q < (all_programs ? P : 1); ++q) {
    ExprPtr base = all_programs ? i32_const(q * warps)
                                : binary(BinOp::mul, special(Special::program_in_group), i32_const(warps));
    std::vector<ExprPtr> row;
    for (size_t l = 0; l < partials.size(); ++l) {
      const LeafKind kind = partials[l].first;
      if (regions[l] < 0) {
        row.push_back(r(mine[l]));
        continue;
      }
      std::vector<ExprPtr> parts;
      for (int w = 0; w < (kind == LeafKind::uniform ? 1 : warps); ++w) {
        int v = em_.temp("part", real());
        out.push_back(shared_load(
            v, regions[l],
            row_copy(all_programs ? i32_const(q * warps + w) : binary(BinOp::add, base, i32_const(w)), P * warps)));
        parts.push_back(r(v));
      }
      row.push_back(em_.pairwise(out, parts, kind == LeafKind::max ? BinOp::max : BinOp::add));
    }
    totals.push_back(row);
  }
  return totals;
}

// A re-read worker's state from its fast path's accumulators (node -> register), or, where that
// is not exact enough, from a second loop over its elements with the chunk graph and combine.
std::vector<int> RowLowering::reread_fast_state(std::vector<Stmt>& out, int red, const std::map<int, int>& acc) {
  const RowReduction& rr = prog_.reductions()[red];
  const Monoid& m = rr.monoid;
  ChunkEvaluator fast(em_, out, m, {});
  for (auto& [id, reg] : acc) fast.set(id, r(reg));
  std::vector<int> regs;
  for (int id : m.fast) regs.push_back(assign_new(out, "acc", fast.value(id)));
  ExprPtr exact = fast.value(m.fast_exact);
  std::vector<Stmt> slow{comment("the fast path is not exact enough here: the elements again, with the chunk graph")};
  for (size_t q = 0; q < regs.size(); ++q) slow.push_back(assign(regs[q], fc(m.identity[q])));
  std::set<int> inputs;
  for (int in : rr.inputs) row_inputs_of(in, inputs);
  for (Stmt& s : reread_loop(inputs, [&](std::vector<Stmt>& body, std::vector<Slot*>& slots) {
         std::vector<ExprPtr> chunk = chunk_state(em_, body, m, slot_groups(body, slots, rr.inputs));
         std::vector<ExprPtr> mine;
         for (int reg_id : regs) mine.push_back(r(reg_id));
         em_.assign_all(body, regs, em_.combine(body, m, mine, chunk));
       }))
    slow.push_back(std::move(s));
  out.push_back(if_(unary(UnOp::not_, exact), std::move(slow)));
  return regs;
}

// The states of a level's reductions over a cached row, merged stage by stage: every chunk sum
// and max of the monoids' chunk graphs is folded over the worker's elements, then merged across
// the program as a plain sum or max; later stages use the merged values, and a chunk's count is
// the row's. The states come out program-wide with no combine merge.
std::vector<std::vector<int>> RowLowering::staged_states(std::vector<Stmt>& out, const std::vector<int>& reductions) {
  static const Monoid sum = monoid::sum(), max = monoid::max();
  std::vector<Slot*> slots;
  for (Slot& s : cached_) slots.push_back(&s);
  const ExprPtr row_count = em_.keep(out, cast(real(), r(load_cols_)), "k");
  std::vector<std::unique_ptr<ChunkEvaluator>> evals;
  std::vector<std::map<int, int>> stages;
  int last = -1;
  for (int red : reductions) {
    const RowReduction& rr = prog_.reductions()[red];
    evals.push_back(std::make_unique<ChunkEvaluator>(em_, out, rr.monoid, slot_groups(out, slots, rr.inputs)));
    for (size_t id = 0; id < rr.monoid.nodes.size(); ++id)
      if (rr.monoid.nodes[id].kind == MonoidNode::Kind::count) evals.back()->set(int(id), row_count);
    stages.push_back(chunk_stages(rr.monoid));
    for (auto& [id, st] : stages.back()) last = std::max(last, st);
  }
  for (int stage = 0; stage <= last; ++stage) {
    std::vector<const Monoid*> monoids;
    std::vector<std::vector<int>> partials;
    std::vector<std::pair<size_t, int>> where;
    for (size_t i = 0; i < evals.size(); ++i)
      for (auto& [id, st] : stages[i]) {
        if (st != stage) continue;
        const bool is_sum = prog_.reductions()[reductions[i]].monoid.nodes[id].kind == MonoidNode::Kind::chunk_sum;
        monoids.push_back(is_sum ? &sum : &max);
        partials.push_back({em_.materialize(out, evals[i]->value(id), "part")});
        where.push_back({i, id});
      }
    std::vector<std::vector<int>> merged = merge_across_workers(out, monoids, std::move(partials));
    for (size_t k = 0; k < where.size(); ++k) evals[where[k].first]->set(where[k].second, r(merged[k][0]));
  }
  std::vector<std::vector<int>> states;
  for (auto& e : evals) {
    std::vector<int> regs;
    for (const ExprPtr& v : e->state()) regs.push_back(em_.materialize(out, v, "acc"));
    states.push_back(regs);
  }
  // (A staged slot's output pass reads the row again: nothing to share.)
  if (!staged())
    for (size_t i = 0; i < reductions.size(); ++i) share_chunk_elements(reductions[i], *evals[i]);
  return states;
}

// Element values a staged chunk graph computed over the cached slots that one of the program's
// element expressions repeats — softmax's exp(x - max), with max the row's — go into each
// slot's memo, so later passes read them instead of computing them again (the same
// operations on the same registers: the same bits). A program node matches a monoid node of
// the same operation whose operands match, an element of the reduction's input, a constant
// of the same value, or, for a part of the chunk graph, the reduction's result for that part
// (the staged state is the chunk graph's value over the whole row).
void RowLowering::share_chunk_elements(int reduction, ChunkEvaluator& ev) {
  const RowReduction& rr = prog_.reductions()[reduction];
  const Monoid& m = rr.monoid;
  std::function<bool(int, int)> same = [&](int p, int id) -> bool {
    const RowNode& n = prog_.nodes()[p];
    const MonoidNode& mn = m.nodes[id];
    if (n.kind == RowNode::Kind::result && n.reduction == reduction) return m.chunk.at(size_t(n.part)) == id;
    switch (mn.kind) {
      case MonoidNode::Kind::element: return mn.index < int(rr.inputs.size()) && rr.inputs[mn.index] == p;
      case MonoidNode::Kind::constant:
        return n.kind == RowNode::Kind::constant && n.value_in(em_.f64()) == mn.value_in(em_.f64());
      case MonoidNode::Kind::unary: return n.kind == RowNode::Kind::unary && n.unary == mn.unary && same(n.a, mn.a);
      case MonoidNode::Kind::binary:
        return n.kind == RowNode::Kind::binary && n.binary == mn.binary && same(n.a, mn.a) && same(n.b, mn.b);
      case MonoidNode::Kind::select:
        return n.kind == RowNode::Kind::select && same(n.a, mn.a) && same(n.b, mn.b) && same(n.c, mn.c);
      default: return false;
    }
  };
  for (size_t p = 0; p < prog_.nodes().size(); ++p) {
    const RowNode& n = prog_.nodes()[p];
    if (!n.shape.cols || n.kind == RowNode::Kind::load) continue;
    for (size_t id = 0; id < m.nodes.size(); ++id) {
      if (!m.nodes[id].element || !same(int(p), int(id))) continue;
      for (size_t g = 0; g < cached_.size(); ++g)
        if (!cached_[g].memo.count(int(p))) cached_[g].memo[int(p)] = ev.values_at(int(id), int(g));
      break;
    }
  }
}

// Merges per-worker states up the scope stack and returns the registers holding the program's
// result: lanes of a warp by a shuffle butterfly, then (multi-warp programs) warps through one
// shared slot per warp and part, one barrier, and a butterfly that every warp runs over the
// warps' partials, so no broadcast barrier is needed. That butterfly spans the fewest lanes that
// hold every warp's slot (lane l reads slot l mod the warps' power of two; a lane past the last
// warp contributes the identity), so a program of 4 warps folds in 2 steps, not 5. Each part
// has its own region, so no later merge overwrites slots another warp may still read.
std::vector<std::vector<int>> RowLowering::merge_across_workers(std::vector<Stmt>& out,
                                                                const std::vector<const Monoid*>& monoids,
                                                                std::vector<std::vector<int>> states) {
  const int W = plan_.workers_per_program;
  butterfly(out, monoids, states, std::min(W, 32), "m");
  if (plan_.ctas_per_program > 1 && !group_merges_only_) return merge_through_exchange(out, monoids, std::move(states));
  if (W <= 32) return states;
  const int warps = W / 32;
  int span = 1;  // lanes of the second butterfly: the power of two at or above the warps
  while (span < warps) span *= 2;
  std::vector<Stmt> stores;
  std::vector<std::vector<int>> regions(states.size());
  for (size_t i = 0; i < states.size(); ++i)
    for (int reg_id : states[i]) {
      const int elems = warps * region_copies();
      SharedRegion region{"partials" + std::to_string(k_.shared.size()), next_shared_, elems, elems};
      next_shared_ += elems * plan_.programs_per_group;
      regions[i].push_back(int(k_.shared.size()));
      k_.shared.push_back(region);
      stores.push_back(shared_store(regions[i].back(), row_copy(special(Special::warp_in_program), warps), r(reg_id)));
    }
  out.push_back(if_(binary(BinOp::eq, special(Special::lane), i32_const(0)), std::move(stores)));
  out.push_back(barrier(merge_scope()));
  // lane mod span: the same in every lane of an xor-mask of span and above (the verifier sees it).
  ExprPtr lane_in_span = binary(BinOp::rem, special(Special::lane), i32_const(span));
  ExprPtr slot = span == warps ? lane_in_span : binary(BinOp::min, lane_in_span, i32_const(warps - 1));
  ExprPtr mine = span == warps ? nullptr : binary(BinOp::lt, lane_in_span, i32_const(warps));
  std::vector<std::vector<int>> totals(states.size());
  for (size_t i = 0; i < states.size(); ++i) {
    const Monoid& m = *monoids[i];
    for (size_t q = 0; q < states[i].size(); ++q) {
      int partial = em_.temp("partial", real());
      out.push_back(shared_load(partial, regions[i][q], row_copy(slot, warps)));
      totals[i].push_back(mine ? assign_new(out, "total", select(mine, r(partial), fc(m.identity[q]))) : partial);
    }
  }
  butterfly(out, monoids, totals, span, "m", 32);
  return totals;
}

// Folds each monoid's states across the lanes of segments of `width` (a power of two) by a
// shuffle butterfly; every lane of a segment ends with the same bits. The shuffles name
// `shuffle_width` (0: `width`), the same exchange for offsets below `width`.
void RowLowering::butterfly(std::vector<Stmt>& out, const std::vector<const Monoid*>& monoids,
                            std::vector<std::vector<int>>& states, int width, const std::string& name,
                            int shuffle_width) {
  for (int offset = width / 2; offset >= 1; offset /= 2)
    for (size_t i = 0; i < monoids.size(); ++i) {
      std::vector<ExprPtr> self, other;
      for (int reg_id : states[i]) {
        int t = em_.temp("t", real());
        out.push_back(shfl_xor(t, reg_id, offset, shuffle_width ? shuffle_width : width));
        self.push_back(r(reg_id));
        other.push_back(r(t));
      }
      std::vector<ExprPtr> merged = em_.combine(out, *monoids[i], self, other);
      states[i].clear();
      for (const ExprPtr& v : merged) states[i].push_back(em_.materialize(out, v, name));
    }
}

// The cluster rung, one-way: lanes 0 .. C-1 of every warp push the warp's states (after its
// butterfly) to the groups of ranks 0 .. C-1 (one exchange region a merge: part q of warp w of
// rank r at slot q x C x warps + r x warps + w), each group waits until its region holds all of
// them, and every warp folds the slots in one order: lane l takes slots l, l + 32, ... (the
// identity past the last) and a butterfly ends it. Every lane of every group folds the same
// values the same way, so the groups agree bitwise. No group barrier and no cluster barrier a
// merge: one cluster barrier before the first push shows the cluster resident (its exchange
// barriers armed), and no group exits before its own waits, which need every push into it.
std::vector<std::vector<int>> RowLowering::merge_through_exchange(std::vector<Stmt>& out,
                                                                  const std::vector<const Monoid*>& monoids,
                                                                  std::vector<std::vector<int>> states,
                                                                  bool group_uniform) {
  const int C = plan_.ctas_per_program, warps = group_uniform ? 1 : std::max(1, plan_.workers_per_program / 32);
  const int n = C * warps;  // partials of each part
  int parts = 0;
  for (const std::vector<int>& st : states) parts += int(st.size());
  const int region = int(k_.shared.size());
  k_.shared.push_back({"exchange" + std::to_string(region), next_shared_, n * parts, 0, n * parts});
  next_shared_ += n * parts;
  // A cluster looping over row blocks retires each exchange's phase with a split barrier: a
  // wait before its pushes, an arrive once its reads are consumed (below).
  const bool phases = plan_.grid_limit > 0;
  if (!cluster_resident_ || phases) {
    out.push_back(comment(phases
                              ? "every group has consumed the last exchange's reads (and the cluster is resident)"
                              : "the cluster is resident and its exchange barriers initialised before the first push"));
    out.push_back(cluster_wait());
    cluster_resident_ = true;
  }
  const ExprPtr source = group_uniform ? special(Special::cta_in_cluster)
                                       : binary(BinOp::add, binary(BinOp::mul, special(Special::cta_in_cluster), i32_const(warps)),
                                                special(Special::warp_in_program));
  std::vector<Stmt> pushes;  // lane r < C pushes to rank r (min: the verifier bounds the rank)
  int q = 0;
  for (const std::vector<int>& st : states)
    for (int reg_id : st)
      pushes.push_back(remote_shared_push(region, binary(BinOp::add, i32_const(q++ * n), source),
                                          binary(BinOp::min, special(Special::lane), i32_const(C - 1)), reg_id));
  ExprPtr pushing = binary(BinOp::lt, special(Special::lane), i32_const(C));
  if (group_uniform && plan_.workers_per_program > 32)
    pushing = binary(BinOp::and_, binary(BinOp::eq, special(Special::warp_in_program), i32_const(0)), pushing);
  out.push_back(if_(pushing, std::move(pushes)));
  out.push_back(exchange_wait(region));
  // Lane l folds slots l, l + 32, ... of each part (segments of B lanes where n < 32).
  int B = 1;
  while (B < std::min(n, 32)) B *= 2;
  const int reads = (n + 31) / 32;
  const ExprPtr position = B == 32 ? special(Special::lane) : binary(BinOp::rem, special(Special::lane), i32_const(B));
  std::vector<std::vector<int>> mine(states.size());
  q = 0;
  for (size_t i = 0; i < states.size(); ++i) {
    const Monoid& m = *monoids[i];
    for (int k = 0; k < reads; ++k) {
      const ExprPtr at = k ? binary(BinOp::add, position, i32_const(32 * k)) : position;
      std::vector<ExprPtr> value;
      for (size_t j = 0; j < states[i].size(); ++j) {
        int v = em_.temp("x", real());
        out.push_back(shared_load(v, region, binary(BinOp::add, i32_const((q + int(j)) * n),
                                                     binary(BinOp::min, at, i32_const(n - 1)))));
        value.push_back(n % 32 == 0 ? r(v) : select(binary(BinOp::lt, at, i32_const(n)), r(v), fc(m.identity[j])));
      }
      std::vector<ExprPtr> acc;
      for (int reg_id : mine[i]) acc.push_back(r(reg_id));
      const std::vector<ExprPtr> next = k == 0 ? value : em_.combine(out, m, acc, value);
      mine[i].clear();
      for (const ExprPtr& v : next) mine[i].push_back(em_.materialize(out, v, "x"));
    }
    q += int(states[i].size());
  }
  butterfly(out, monoids, mine, B, "c");
  // After the butterfly, whose shuffles consume every value read from the region: the arrive
  // (relaxed, so the row's stores do not have to drain first) cannot pass an unfinished read.
  if (phases) out.push_back(cluster_arrive());
  return mine;
}

std::vector<Stmt> RowLowering::reread_loop(const std::set<int>& inputs,
                                           const std::function<void(std::vector<Stmt>&, std::vector<Slot*>&)>& body) {
  // for it in 0..ceil(cols / (W*V*U)): U stripes per iteration, all loads issued first.
  const int U = plan_.stripe_unroll;
  const int64_t step = plan_.elems_per_stripe() * U;
  std::vector<Stmt> out;
  int it = em_.temp("it", Type::i64);
  ExprPtr count = binary(BinOp::div, binary(BinOp::add, param(p_cols_, Type::i64), i64(step - 1)), i64(step));
  std::vector<Stmt> loop;
  std::vector<Slot> slots(U);
  std::vector<Slot*> ptrs;
  // reread_ahead_: the first iteration's stripes load before the loop, and each iteration
  // takes its stripes from those registers, then loads the next iteration's into them (past
  // the row end, masked or clamped as any load) before its work: its loads stay in flight
  // through this iteration's arithmetic instead of starting after it. 16-bit input waits as
  // loaded, two elements a register (converted as the iteration takes it): at 1024 workers
  // and unroll 4, bf16 RMSNorm's f32 copies spilled 176 bytes a thread.
  std::vector<std::map<int, std::vector<int>>> ahead(reread_ahead_ ? U : 0);
  auto load_ahead = [&](std::vector<Stmt>& into, ExprPtr iteration) {
    for (int u = 0; u < U; ++u) {
      Slot next;
      next.col = stripe_col(binary(BinOp::add, binary(BinOp::mul, iteration, i64(U)), i64(u)));
      place_slot(into, next);
      for (int operand : inputs) {
        const DType dt = dtype(operand);
        const bool raw = dtype_size(dt) == 2 && plan_.vector_elems % 2 == 0;
        std::vector<int>& regs = ahead[u][operand];
        for (int j = int(regs.size()); j < plan_.vector_elems / (raw ? 2 : 1); ++j)
          regs.push_back(k_.add_reg(decl(operand).name + "_next" + std::to_string(k_.regs.size()),
                                    raw ? Type::i32 : value_type(dt, real())));
        ExprPtr index = binary(BinOp::add, r(load_off_[operand]), next.col);
        const bool clamp = plan_.tail == TailHandling::clamp;
        into.push_back(whole(raw ? load_raw(regs, buffer_of_.at(operand), index, slot_count(next, load_cols_),
                                            slot_aligned(next, operand), clamp)
                                 : load(regs, buffer_of_.at(operand), index, slot_count(next, load_cols_),
                                        slot_aligned(next, operand), clamp, 0.0f)));
      }
    }
  };
  if (reread_ahead_ && !inputs.empty()) load_ahead(out, i64(0));
  for (int u = 0; u < U; ++u) {
    slots[u].col = stripe_col(binary(BinOp::add, binary(BinOp::mul, r(it), i64(U)), i64(u)));
    load_slot(loop, slots[u], inputs, /*cache=*/false, ahead.empty() || inputs.empty() ? nullptr : &ahead[u]);
    ptrs.push_back(&slots[u]);
  }
  if (reread_ahead_ && !inputs.empty()) load_ahead(loop, binary(BinOp::add, r(it), i64(1)));
  loop_it_ = it;
  body(loop, ptrs);
  out.push_back(for_(it, i64(0), count, std::move(loop)));
  if (peel_) {
    // The peeled head after the loop, as an iteration other than the first: a worker fast
    // path's first element (its shift) came from the loop's first iteration.
    Slot head = head_slot();
    load_slot(out, head, inputs, /*cache=*/false);
    loop_it_ = assign_new(out, "it", i64(-1));
    std::vector<Slot*> heads{&head};
    body(out, heads);
  }
  return out;
}

void RowLowering::store_row_scalars(std::vector<Stmt>& out) {
  std::vector<Stmt> stores;
  for (int i : live_stores_) {
    const RowStore& s = prog_.stores()[i];
    if (decl(s.operand).role != Role::row_scalar_out) continue;
    int v = em_.materialize(out, row_value(out, s.value), "rs");
    ExprPtr index = binary(BinOp::mul, r(row_), param(stride_of_.at(s.operand), Type::i64));
    stores.push_back(store({v}, buffer_of_.at(s.operand), index, i64(1), b1_const(false)));
  }
  if (stores.empty()) return;
  out.push_back(comment("per-row outputs, by the program's first worker"));
  ExprPtr first = binary(BinOp::eq, special(Special::worker_in_program), i32_const(0));
  if (plan_.ctas_per_program > 1)
    first = binary(BinOp::and_, first, binary(BinOp::eq, special(Special::cta_in_cluster), i32_const(0)));
  out.push_back(if_(binary(BinOp::and_, r(row_valid_), first), std::move(stores)));
}

ExprPtr RowLowering::slot_base() const {
  // (group_index * P + program_in_group) * (col_parts * cols + fixed_parts); a cluster's groups
  // share its slot (one program each), each writing the columns of its slice.
  const Special owner = plan_.ctas_per_program > 1 ? Special::cluster_index : Special::group_index;
  ExprPtr slot = binary(BinOp::add, binary(BinOp::mul, special(owner), i64_const(plan_.programs_per_group)),
                        cast(Type::i64, special(Special::program_in_group)));
  ExprPtr stride = binary(BinOp::add, binary(BinOp::mul, i64_const(lowered_.col_parts), param(p_cols_, Type::i64)),
                          i64_const(lowered_.fixed_parts));
  return binary(BinOp::mul, slot, stride);
}

ExprPtr RowLowering::partial_index(int red, size_t q, ExprPtr col) const {
  return binary(BinOp::add,
                binary(BinOp::add, slot_base(),
                       binary(BinOp::mul, i64_const(ws_offset_.at(red) + int(q)), param(p_cols_, Type::i64))),
                std::move(col));
}

// Folds this row's contribution into the accumulators of reductions over the rows.
void RowLowering::accumulate_rows(std::vector<Stmt>& out, Slot& slot) {
  const int V = plan_.vector_elems;
  for (int red : rows_reductions_) {
    const RowReduction& rr = prog_.reductions()[red];
    const Monoid& m = rr.monoid;
    if (!prog_.nodes()[rr.inputs[0]].shape.cols) continue;  // row values: accumulated once per row
    std::vector<std::vector<ExprPtr>> inputs;
    for (int in : rr.inputs) inputs.push_back(element(out, slot, in));
    std::vector<std::vector<ExprPtr>> contributions;
    for (int j = 0; j < V; ++j) {
      // A chunk of one element: valid when the row is real and the element in it.
      ExprPtr valid = em_.keep(out, binary(BinOp::and_, r(row_valid_), in_row(slot, j)), "ok");
      ChunkGroup g;
      g.count = em_.keep(out, select(valid, fc(1.0), fc(0.0)), "k");
      ChunkElement e;
      for (auto& v : inputs) e.inputs.push_back(v[j]);
      e.valid = valid;
      g.elems.push_back(e);
      contributions.push_back(chunk_state(em_, out, m, {g}));
      if (plan_.caching != InputCaching::registers) continue;
      const size_t index = size_t(&slot - cached_.data()) * V + j;
      std::vector<int>& acc = elem_acc_[red][index];
      std::vector<ExprPtr> mine;
      for (int a : acc) mine.push_back(r(a));
      em_.assign_all(out, acc, em_.combine(out, m, mine, contributions.back()));
    }
    if (plan_.caching == InputCaching::registers) continue;
    // Re-read plans keep each slot's partial in the workspace: read (none on the slot's first
    // row), merge, write back, in vector accesses of up to 16 bytes: one scalar access an element
    // made the workspace's traffic the kernel's bottleneck. Only this program touches these elements.
    const int width = partial_width();
    for (int j0 = 0; j0 < V; j0 += width) {
      ExprPtr col = em_.keep(out, binary(BinOp::add, slot.col, i64(j0)), "col");
      ExprPtr left = em_.keep(out, binary(BinOp::sub, param(p_cols_, Type::i64), col), "left");
      std::vector<ExprPtr> index;
      std::vector<std::vector<int>> loaded;
      for (size_t q = 0; q < m.parts.size(); ++q) {
        index.push_back(em_.keep(out, partial_index(red, q, col), "wi"));
        std::vector<int> regs;
        for (int j = 0; j < width; ++j) regs.push_back(em_.temp("w", real()));
        out.push_back(load(regs, ws_buffer_, index[q], select(r(first_row_), i64(0), left), partial_aligned(index[q]),
                           false, float(m.identity[q])));
        loaded.push_back(std::move(regs));
      }
      std::vector<std::vector<int>> merged(m.parts.size());
      for (int j = 0; j < width; ++j) {
        std::vector<ExprPtr> mine;
        for (size_t q = 0; q < m.parts.size(); ++q) mine.push_back(r(loaded[q][size_t(j)]));
        std::vector<ExprPtr> sum = em_.combine(out, m, mine, contributions[size_t(j0 + j)]);
        for (size_t q = 0; q < m.parts.size(); ++q) merged[q].push_back(em_.materialize(out, sum[q], "w"));
      }
      for (size_t q = 0; q < m.parts.size(); ++q)
        out.push_back(store(merged[q], ws_buffer_, index[q], left, partial_aligned(index[q])));
    }
  }
}

// Register-cached partials of reductions over the rows go to the slot's workspace row.
void RowLowering::flush_rows(std::vector<Stmt>& out) {
  if (rows_reductions_.empty()) return;
  out.push_back(comment("partials of reductions over the rows, one workspace slot per program"));
  const int V = plan_.vector_elems;
  for (int red : rows_reductions_) {
    const RowReduction& rr = prog_.reductions()[red];
    const bool elem = prog_.nodes()[rr.inputs[0]].shape.cols;
    if (!elem) {
      std::vector<Stmt> stores;
      for (size_t q = 0; q < rr.monoid.parts.size(); ++q) {
        ExprPtr index = binary(BinOp::add, slot_base(),
                               binary(BinOp::add, binary(BinOp::mul, i64_const(lowered_.col_parts), param(p_cols_, Type::i64)),
                                      i64_const(ws_offset_[red] + int(q))));
        stores.push_back(store({row_acc_[red][q]}, ws_buffer_, index, i64(1), b1_const(false)));
      }
      // A row value is the same in every group of a cluster: rank 0's first worker writes it.
      ExprPtr first = binary(BinOp::eq, special(Special::worker_in_program), i32_const(0));
      if (plan_.ctas_per_program > 1)
        first = binary(BinOp::and_, first, binary(BinOp::eq, special(Special::cta_in_cluster), i32_const(0)));
      out.push_back(if_(first, std::move(stores)));
      continue;
    }
    if (plan_.caching != InputCaching::registers) continue;  // already in the workspace
    const int width = partial_width();
    for (int s = 0; s < plan_.stripes; ++s) {
      for (int j0 = 0; j0 < V; j0 += width) {
        ExprPtr col = em_.keep(out, binary(BinOp::add, stripe_col(i64(s)), i64(j0)), "col");
        for (size_t q = 0; q < rr.monoid.parts.size(); ++q) {
          std::vector<int> regs;
          for (int j = j0; j < j0 + width; ++j) regs.push_back(elem_acc_[red][size_t(s) * V + j][q]);
          ExprPtr index = partial_index(red, q, col);
          out.push_back(store(regs, ws_buffer_, index, binary(BinOp::sub, param(p_cols_, Type::i64), col),
                              partial_aligned(index)));
        }
      }
    }
  }
}

// A per-column input's values in a slot, loaded on first use.
std::vector<int> RowLowering::load_column(std::vector<Stmt>& out, int operand, ExprPtr col, ExprPtr valid, ExprPtr aligned,
                                          bool held) {
  std::vector<int> regs;
  for (int j = 0; j < plan_.vector_elems; ++j)
    regs.push_back(k_.add_reg(decl(operand).name + std::to_string(k_.regs.size()), value_type(dtype(operand), real()), held));
  out.push_back(whole(load(regs, buffer_of_.at(operand), std::move(col), std::move(valid), std::move(aligned),
                           plan_.tail == TailHandling::clamp, 0.0f)));
  return regs;
}

const std::vector<int>& RowLowering::column_values(std::vector<Stmt>& out, Slot& slot, int operand) {
  std::vector<int>& loaded = slot.column[operand];
  if (loaded.empty())
    loaded = load_column(out, operand, slot.col, slot_count(slot, load_cols_), slot_aligned(slot, operand), /*held=*/false);
  return loaded;
}

void RowLowering::output_pass(std::vector<Stmt>& out, Slot& slot) {
  for (int i : live_stores_) {
    const RowStore& s = prog_.stores()[i];
    if (decl(s.operand).role != Role::row_out) continue;
    const std::vector<ExprPtr>& values = element(out, slot, s.value);
    std::vector<int> regs;
    for (const ExprPtr& v : values) regs.push_back(em_.materialize(out, v, "y"));
    // A peeled head's limit is its load count: validation keeps tail "predicate", where
    // load_cols is store_cols.
    out.push_back(whole(store(regs, buffer_of_.at(s.operand), binary(BinOp::add, r(store_off_.at(s.operand)), slot.col),
                              slot_count(slot, store_cols_), slot_aligned(slot, s.operand))));
  }
  accumulate_rows(out, slot);
}

void RowLowering::prefetch_rows(std::vector<Stmt>& out, ExprPtr block) {
  const int V = plan_.vector_elems;
  const bool clamp = plan_.tail == TailHandling::clamp;
  if (prefetched_.empty()) {  // the registers, once: every block's loads land in them
    prefetched_.resize(size_t(plan_.stripes));
    for (int operand : cached_inputs_) {
      const DType dt = dtype(operand);
      const bool raw = dtype_size(dt) == 2 && V % 2 == 0;
      for (int s = 0; s < plan_.stripes; ++s)
        for (int j = 0; j < V; j += raw ? 2 : 1)
          prefetched_[size_t(s)][operand].push_back(k_.add_reg(
              decl(operand).name + "_next" + std::to_string(k_.regs.size()), raw ? Type::i32 : value_type(dt, real()),
              /*cached=*/true));
    }
    for (auto& [operand, buffer] : buffer_of_)
      if (decl(operand).role == Role::row_scalar_in)
        prefetched_scalars_[operand] = k_.add_reg(decl(operand).name + "_next", value_type(dtype(operand), real()));
  }
  out.push_back(comment("row_prefetch: the row block after this one, loaded while this one runs"));
  const ExprPtr rows = param(p_rows_, Type::i64);
  ExprPtr row = r(assign_new(out, "next_row",
                             binary(BinOp::add, binary(BinOp::mul, block, i64(plan_.programs_per_group)),
                                    cast(Type::i64, special(Special::program_in_group)))));
  ExprPtr valid_row = binary(BinOp::lt, row, rows);
  // As begin_row: guard programs load nothing, or (tail "clamp") the last row in full.
  ExprPtr load_row =
      clamp ? r(assign_new(out, "next_load_row", binary(BinOp::min, row, binary(BinOp::sub, rows, i64(1))))) : row;
  ExprPtr cols = param(p_cols_, Type::i64);
  ExprPtr load_cols = clamp ? cols : r(assign_new(out, "next_cols", select(valid_row, cols, i64(0))));
  for (int operand : cached_inputs_) {
    const int buffer = buffer_of_.at(operand);
    ExprPtr off = r(assign_new(out, decl(operand).name + "_next_off",
                               binary(BinOp::mul, load_row, param(stride_of_[operand], Type::i64))));
    ExprPtr aligned = em_.keep(out, vector_aligned(buffer, off), decl(operand).name + "_next_aligned");
    for (int s = 0; s < plan_.stripes; ++s) {
      ExprPtr col = r(assign_new(out, "col", stripe_col(i64(s))));
      const std::vector<int>& regs = prefetched_[size_t(s)].at(operand);
      ExprPtr index = binary(BinOp::add, off, col);
      ExprPtr valid = binary(BinOp::sub, load_cols, col);
      const bool raw = k_.regs[regs[0]].type == Type::i32;
      out.push_back(whole(raw ? load_raw(regs, buffer, index, valid, aligned, clamp)
                              : load(regs, buffer, index, valid, aligned, clamp, 0.0f)));
    }
  }
  for (auto& [operand, reg] : prefetched_scalars_) out.push_back(load_row_scalar(operand, reg, load_row, valid_row));
}

// column_loads "with_row": the output pass's per-column inputs of every cached slot, loaded
// right after the row (before the first merge).
void RowLowering::load_columns_with_row(std::vector<Stmt>& body) {
  body.push_back(comment("the output pass's per-column inputs, loaded with the row"));
  const std::set<int> columns = output_column_inputs();
  for (Slot& slot : cached_)
    for (int operand : columns) column_values(body, slot, operand);
}

std::vector<Stmt> RowLowering::row_body() {
  std::vector<Stmt> body;
  if (staged()) {
    body.push_back(comment("copy the row slices into shared memory once (no register holds them in flight)"));
    for (int s = 0; s < plan_.stripes; ++s) {
      Slot slot;
      slot.col = stripe_col(i64(s));
      stage_slot(body, slot, s);
      body.push_back(async_commit());  // one group a stripe
      cached_.push_back(std::move(slot));
    }
    if (plan_.column_loads == ColumnLoads::with_row) load_columns_with_row(body);
  } else if (plan_.caching == InputCaching::registers) {
    body.push_back(comment("load the row slices once into cached registers"));
    for (int s = 0; s < plan_.stripes; ++s) {
      Slot slot;
      slot.col = stripe_col(i64(s));
      load_slot(body, slot, cached_inputs_, /*cache=*/true, prefetch_ ? &prefetched_[size_t(s)] : nullptr);
      if (!held_columns_.empty()) slot.column = held_columns_[size_t(s)];
      cached_.push_back(std::move(slot));
    }
    // The next row block's loads go out before this one's merges, barriers and stores.
    if (prefetch_) prefetch_rows(body, next_block_);
    if (peel_) {  // last: every worker's first cached element stays its lowest column
      Slot head = head_slot();
      load_slot(body, head, cached_inputs_, /*cache=*/true);
      cached_.push_back(std::move(head));
    }
    if (plan_.column_loads == ColumnLoads::with_row) load_columns_with_row(body);
  }
  for (size_t l = 0; l < levels_.size(); ++l) {
    if (l + 1 == levels_.size() && program_fast(levels_[l]) && plan_.ctas_per_program == 1) {
      split_pass(body, levels_[l]);
      return body;
    }
    level_pass(body, levels_[l]);
  }
  rest_of_row(body);
  return body;
}

// After the reductions over the row: per-row outputs, row values reduced over the rows, and the
// output pass (row outputs and element contributions to reductions over the rows).
void RowLowering::rest_of_row(std::vector<Stmt>& body) {
  store_row_scalars(body);
  // Row values reduced over the rows: one contribution per real row.
  for (int red : rows_reductions_) {
    const RowReduction& rr = prog_.reductions()[red];
    if (prog_.nodes()[rr.inputs[0]].shape.cols) continue;
    ChunkGroup g;
    ChunkElement e;
    for (int in : rr.inputs) e.inputs.push_back(row_value(body, in));
    e.valid = r(row_valid_);
    g.count = em_.keep(body, select(r(row_valid_), fc(1.0), fc(0.0)), "k");
    g.elems.push_back(e);
    std::vector<ExprPtr> contribution = chunk_state(em_, body, rr.monoid, {g});
    std::vector<ExprPtr> mine;
    for (int a : row_acc_[red]) mine.push_back(r(a));
    em_.assign_all(body, row_acc_[red], em_.combine(body, rr.monoid, mine, contribution));
  }
  // The output pass: row outputs and element contributions to reductions over the rows.
  bool element_work = false;
  std::set<int> inputs;
  for (int i : live_stores_) {
    const RowStore& s = prog_.stores()[i];
    if (decl(s.operand).role != Role::row_out) continue;
    element_work = true;
    hoist_row_values(body, s.value);
    row_inputs_of(s.value, inputs);
  }
  for (int red : rows_reductions_)
    for (int in : prog_.reductions()[red].inputs)
      if (prog_.nodes()[in].shape.cols) {
        element_work = true;
        hoist_row_values(body, in);
        row_inputs_of(in, inputs);
      }
  if (!element_work) return;
  body.push_back(comment("output pass"));
  if (cached_slots()) {
    // Element values stay memoised across passes: the output reuses what a reduction pass
    // computed, and the inputs it no longer needs die. On a cluster (one or two groups an SM)
    // the per-column inputs (a norm's weight and bias, from L2) load about 16 scalars ahead
    // of the outputs that use them, so their latencies overlap instead of each store waiting
    // in turn. H200, f32 RMSNorm 256 x 262144 on clusters of 16 groups: 250 us loading each
    // slot's weight before its store.
    const std::set<int> columns = output_column_inputs();
    const size_t ahead = plan_.ctas_per_program > 1 && !columns.empty()
                             ? size_t(std::max<int64_t>(1, 16 / (int64_t(plan_.vector_elems) * int64_t(columns.size()))))
                             : 0;
    for (size_t s = 0; s < cached_.size(); ++s) {
      if (ahead && s % ahead == 0)
        for (size_t t = s; t < std::min(cached_.size(), s + ahead); ++t)
          for (int operand : columns) column_values(body, cached_[t], operand);
      if (staged()) forget_staged(cached_[s]);
      output_pass(body, cached_[s]);
    }
  } else {
    for (Stmt& s : reread_loop(inputs, [&](std::vector<Stmt>& out, std::vector<Slot*>& slots) {
           for (Slot* slot : slots) output_pass(out, *slot);
         }))
      body.push_back(std::move(s));
  }
}

// The second phase of reductions over the rows. A group takes 32 columns, one a lane, and its
// S warps split the slots: warp w folds slots w, w + S, ... in order; the warps' states meet
// in shared memory after one barrier and every warp folds them in warp order, so the result is
// the same on every run. Warp 0 then evaluates and stores each per-column output; group 0 does
// the scalar outputs, its every worker folding its own slots before a butterfly folds the lanes
// (a grid of one row block a group writes a slot a row: thousands). One worker a column
// folding every slot in turn left a chain of dependent loads a column and most SMs idle.
LoweredKernel RowLowering::lower_finish() {
  LoweredKernel fk;
  Kernel& k = fk.kernel;
  Emitter em(k);
  k.name = "tile_" + prog_.name() + "_finish";
  k.programs_per_group = 1;
  k.workers_per_program = plan_.finish_workers;
  k.private_budget = 1;
  k.real = k_.real;
  const int S = plan_.finish_workers / 32;  // warps splitting the slots
  std::map<int, int> buffers, scalars;
  k.buffers.push_back({"tile_workspace", workspace_dtype(k.real), false});
  fk.buffers.push_back(-1);
  for (size_t i = 0; i < prog_.operands().size(); ++i) {
    const Role role = decl(int(i)).role;
    if (!present(int(i)) || !(role == Role::col_out || role == Role::scalar_out || role == Role::col_in)) continue;
    buffers[int(i)] = int(k.buffers.size());
    k.buffers.push_back({decl(int(i)).name, dtype(int(i)), is_output(role)});
    fk.buffers.push_back(int(i));
  }
  k.params.push_back({"cols", Type::i64});
  fk.params.push_back({ParamSource::Kind::cols});
  k.params.push_back({"slots", Type::i64});
  fk.params.push_back({ParamSource::Kind::slots});
  for (size_t i = 0; i < prog_.operands().size(); ++i)
    if (decl(int(i)).role == Role::scalar_in) {
      scalars[int(i)] = int(k.params.size());
      k.params.push_back({decl(int(i)).name, ir_type(decl(int(i)).scalar_type, k.real)});
      fk.params.push_back({ParamSource::Kind::scalar, int(i)});
    }
  ExprPtr cols = param(0, Type::i64), slots = param(1, Type::i64);
  ExprPtr slot_stride = binary(BinOp::add, binary(BinOp::mul, i64_const(lowered_.col_parts), cols), i64_const(lowered_.fixed_parts));
  std::vector<Stmt>& body = k.body;
  const ExprPtr warp = special(Special::warp_in_program), lane = special(Special::lane);
  ExprPtr first_col = binary(BinOp::mul, special(Special::group_index), i64_const(kFinishColumns));
  int c = em.assign_new(body, "c", binary(BinOp::add, first_col, cast(Type::i64, lane)));
  // Elements a lane's loads keep: 1 for a column inside the row, else 0 (the fill).
  int live = em.assign_new(body, "live", select(binary(BinOp::lt, em.r(c), cols), i64_const(1), i64_const(0)));
  int next_shared = 0;

  // The monoid's fold over every slot of the workspace at `at(part)` in each slot, in a fixed
  // order: per column (a lane a column), warp w folds slots w, w + S, ... in turn; for the
  // scalar outputs (every lane on the same parts), worker t of the T = 32 S folds slots t,
  // t + T, ... and a shuffle butterfly folds each warp's lanes (a grid of one row block a group
  // leaves a slot a row). The warps' states then fold in warp order: the same bits every run.
  auto fold_slots = [&](std::vector<Stmt>& out, const Monoid& m, const std::function<ExprPtr(int)>& at, ExprPtr valid,
                        bool per_column) {
    std::vector<int> state;
    for (double idv : m.identity) state.push_back(em.assign_new(out, "st", em.fc(idv)));
    int it = em.temp("it", Type::i64);
    std::vector<Stmt> loop;
    const int64_t step = per_column ? S : int64_t(S) * 32;
    ExprPtr first = per_column ? cast(Type::i64, warp)
                               : binary(BinOp::add, binary(BinOp::mul, cast(Type::i64, warp), i64_const(32)),
                                        cast(Type::i64, lane));
    ExprPtr slot = em.keep(loop, binary(BinOp::add, first, binary(BinOp::mul, em.r(it), i64_const(step))), "slot");
    ExprPtr in_range = per_column ? ExprPtr() : em.keep(loop, binary(BinOp::lt, slot, slots), "in");
    std::vector<ExprPtr> other, mine;
    for (size_t q = 0; q < m.parts.size(); ++q) {
      int w = em.temp("w", k.real);
      loop.push_back(load({w}, 0, binary(BinOp::add, binary(BinOp::mul, slot, slot_stride), at(int(q))),
                          per_column ? valid : select(in_range, i64_const(1), i64_const(0)), b1_const(false), false,
                          0.0f));
      other.push_back(per_column ? em.r(w) : select(in_range, em.r(w), em.fc(m.identity[q])));
      mine.push_back(em.r(state[q]));
    }
    em.assign_all(loop, state, em.combine(loop, m, mine, other));
    // Per column: slots w, w + S, ... below `slots`, (slots - w + S - 1) / S of them (w < S,
    // slots >= 0). Scalars: (slots + T - 1) / T in every lane, those past the last identities.
    ExprPtr count =
        per_column ? binary(BinOp::div, binary(BinOp::add, binary(BinOp::sub, slots, cast(Type::i64, warp)), i64_const(S - 1)),
                            i64_const(S))
                   : binary(BinOp::div, binary(BinOp::add, slots, i64_const(step - 1)), i64_const(step));
    out.push_back(for_(it, i64_const(0), count, std::move(loop)));
    if (!per_column)
      for (int offset = 16; offset >= 1; offset /= 2) {
        std::vector<ExprPtr> self, theirs;
        for (int reg_id : state) {
          int t = em.temp("t", k.real);
          out.push_back(shfl_xor(t, reg_id, offset, 32));
          self.push_back(em.r(reg_id));
          theirs.push_back(em.r(t));
        }
        std::vector<ExprPtr> merged = em.combine(out, m, self, theirs);
        for (size_t q = 0; q < state.size(); ++q) state[q] = em.materialize(out, merged[q], "st");
      }
    std::vector<ExprPtr> total;
    for (int reg : state) total.push_back(em.r(reg));
    if (S == 1) return total;
    std::vector<int> regions;
    for (size_t q = 0; q < m.parts.size(); ++q) {
      regions.push_back(int(k.shared.size()));
      k.shared.push_back({"fold" + std::to_string(k.shared.size()), next_shared, S * 32, 0});
      next_shared += S * 32;
      out.push_back(shared_store(regions.back(), binary(BinOp::add, binary(BinOp::mul, warp, i32_const(32)), lane),
                                 em.r(state[q])));
    }
    out.push_back(barrier(Scope::group));
    for (int w = 0; w < S; ++w) {
      std::vector<ExprPtr> part;
      for (size_t q = 0; q < m.parts.size(); ++q) {
        int v = em.temp("f", k.real);
        out.push_back(shared_load(v, regions[q], binary(BinOp::add, i32_const(32 * w), lane)));
        part.push_back(em.r(v));
      }
      std::vector<ExprPtr> next = w == 0 ? part : em.combine(out, m, total, part);
      total.clear();
      for (const ExprPtr& v : next) total.push_back(em.r(em.materialize(out, v, "f")));
    }
    return total;
  };

  // Evaluates the stored values of the per-column outputs (for column c) or of the scalar
  // outputs, and stores them under `store_if`.
  auto emit_outputs = [&](std::vector<Stmt>& out, bool per_column, ExprPtr store_if) {
    std::map<int, ExprPtr> memo;
    const ExprPtr valid = per_column ? em.r(live) : i64_const(1);
    std::function<ExprPtr(int)> eval = [&](int id) -> ExprPtr {
      if (auto it = memo.find(id); it != memo.end()) return it->second;
      const RowNode& n = prog_.nodes()[id];
      ExprPtr v;
      switch (n.kind) {
        case RowNode::Kind::constant: v = em.constant(n); break;
        case RowNode::Kind::cols: v = cast(k.real, cols); break;
        case RowNode::Kind::col_index: v = em.r(c); break;
        case RowNode::Kind::load:
          if (decl(n.operand).role == Role::scalar_in) {
            v = param(scalars.at(n.operand), ir_type(n.type, k.real));
          } else if (!present(n.operand)) {
            v = em.constant(n);
          } else {
            int reg_id = em.temp(decl(n.operand).name, value_type(dtype(n.operand), k.real));
            out.push_back(load({reg_id}, buffers.at(n.operand), per_column ? em.r(c) : i64_const(0), valid,
                               b1_const(false), false, 0.0f));
            v = em.r(reg_id);
          }
          break;
        case RowNode::Kind::unary: v = em.keep(out, em.unary_fn(n.unary, eval(n.a))); break;
        case RowNode::Kind::binary: v = em.keep(out, em.binary_fn(n.binary, eval(n.a), eval(n.b))); break;
        case RowNode::Kind::select: v = em.keep(out, select(eval(n.a), eval(n.b), eval(n.c))); break;
        case RowNode::Kind::result: {
          // The reduction's own shape, not the output's: a row value reduced over the rows (one
          // value a call) may be stored to a per-column output, in every column.
          const RowReduction& rr = prog_.reductions()[n.reduction];
          const bool column_parts = prog_.nodes()[rr.inputs[0]].shape.cols;
          auto at = [&](int q) {
            return column_parts
                       ? binary(BinOp::add, binary(BinOp::mul, i64_const(ws_offset_[n.reduction] + q), cols), em.r(c))
                       : binary(BinOp::add, binary(BinOp::mul, i64_const(lowered_.col_parts), cols),
                                i64_const(ws_offset_[n.reduction] + q));
          };
          std::vector<ExprPtr> state = fold_slots(out, rr.monoid, at, valid, column_parts);
          for (size_t q = 0; q < rr.results.size(); ++q) memo[rr.results[q]] = state[q];
          return memo.at(id);
        }
      }
      return memo[id] = v;
    };
    std::vector<Stmt> stores;
    for (int i : live_stores_) {
      const RowStore& st = prog_.stores()[i];
      const Role role = decl(st.operand).role;
      if (role != (per_column ? Role::col_out : Role::scalar_out)) continue;
      int v = em.materialize(out, eval(st.value), "out");
      stores.push_back(
          store({v}, buffers.at(st.operand), per_column ? em.r(c) : i64_const(0), i64_const(1), b1_const(false)));
    }
    if (!stores.empty()) out.push_back(if_(store_if, std::move(stores)));
  };
  for (int i : live_stores_) fk.column_outputs |= decl(prog_.stores()[i].operand).role == Role::col_out;
  const ExprPtr warp0 = binary(BinOp::eq, warp, i32_const(0));
  emit_outputs(body, true, binary(BinOp::and_, warp0, binary(BinOp::lt, em.r(c), cols)));
  std::vector<Stmt> once;
  emit_outputs(once, false, binary(BinOp::and_, warp0, binary(BinOp::eq, lane, i32_const(0))));
  if (!once.empty())
    body.push_back(if_(binary(BinOp::eq, special(Special::group_index), i64_const(0)), std::move(once)));
  return fk;
}

}  // namespace

bool program_fast_path(const RowProgram& program, const std::vector<int>& level, const MappingPlan& plan) {
  const int W = plan.workers_per_program;
  if (W < 32 || W % 32 != 0) return false;
  for (int red : level)
    if (program.reductions()[red].monoid.fast.empty()) return false;
  return true;
}

bool head_in_cache(const MappingPlan& plan) {
  // A peeled row's column 0 is in worker 0's head slot, not first in its cache.
  return plan.caching != InputCaching::reread && plan.workers_per_program == 32 && plan.ctas_per_program == 1 &&
         plan.row_head == RowHead::as_is;
}

bool reads_row_head(const RowProgram& program, const std::vector<int>& level, const MappingPlan& plan) {
  if (!program_fast_path(program, level, plan) || head_in_cache(plan)) return false;
  for (int red : level)
    if (!fast_leaves(program.reductions()[red].monoid).firsts.empty()) return true;
  return false;
}

std::vector<std::vector<int>> reduction_levels(const RowProgram& program) {
  const auto& reds = program.reductions();
  std::vector<int> level(reds.size(), -1);
  std::function<int(int)> level_of = [&](int red) -> int {
    if (level[red] >= 0) return level[red];
    std::set<int> deps;
    for (int in : reds[red].inputs) reductions_used(program, in, deps);
    int l = 0;
    for (int d : deps) l = std::max(l, level_of(d) + 1);
    return level[red] = l;
  };
  std::vector<std::vector<int>> levels;
  for (size_t red = 0; red < reds.size(); ++red) {
    if (reds[red].axis != Axis::cols) continue;
    int l = level_of(int(red));
    if (int(levels.size()) <= l) levels.resize(l + 1);
    levels[l].push_back(int(red));
  }
  levels.erase(std::remove_if(levels.begin(), levels.end(), [](const std::vector<int>& l) { return l.empty(); }), levels.end());
  return levels;
}

LoweredProgram lower_row_program(const RowProgram& program, const KernelSignature& signature, const MappingPlan& plan) {
  program.validate();
  return RowLowering(program, signature, plan).run();
}

}  // namespace tile
