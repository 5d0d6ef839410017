#include "ir/verifier.hpp"

#include <algorithm>
#include <limits>
#include <optional>
#include <set>

#include "ir/printer.hpp"
#include "ir/visitor.hpp"
#include "tile/error.hpp"

namespace tile::ir {

namespace {

// Uniformity as the set of scopes (of the scope stack, tile/scope.hpp) across which a value is
// the same for every worker: bit `1 << Scope`.
constexpr unsigned uniform_across(Scope s) { return 1u << unsigned(s); }
constexpr unsigned kWarp = uniform_across(Scope::warp), kProgram = uniform_across(Scope::program),
                   kGroup = uniform_across(Scope::group), kCluster = uniform_across(Scope::cluster);
constexpr unsigned kUniform = kCluster | kGroup | kProgram | kWarp;

struct Interval {
  int64_t lo, hi;  // inclusive
};
constexpr int64_t kInf = std::numeric_limits<int64_t>::max() / 4;

// The values an i32/i64 index expression can take, where simple interval arithmetic proves a
// bound; nullopt otherwise.
class RangeOf : public IRVisitor<RangeOf, std::optional<Interval>> {
 public:
  explicit RangeOf(const Kernel& k) : k_(k) {}

 private:
  friend class IRVisitor<RangeOf, std::optional<Interval>>;
  using Range = std::optional<Interval>;

  // Kinds without a rule: unknown.
  template <typename Node>
  Range visit_children(const Node&) {
    return std::nullopt;
  }

  Range visit_constant(const Expr& e) { return Interval{e.i, e.i}; }
  Range visit_special(const Expr& e) {
    switch (Special(e.id)) {
      case Special::lane: return Interval{0, 31};
      case Special::worker_in_program: return Interval{0, k_.workers_per_program - 1};
      case Special::warp_in_program: return Interval{0, std::max(0, k_.workers_per_program / 32 - 1)};
      case Special::program_in_group: return Interval{0, k_.programs_per_group - 1};
      case Special::group_index: return Interval{0, kInf};
      case Special::group_count: return Interval{1, kInf};
      case Special::cta_in_cluster: return Interval{0, std::max(0, k_.ctas_per_cluster - 1)};
      case Special::cluster_index: return Interval{0, kInf};
    }
    return std::nullopt;
  }
  Range visit_binary(const Expr& e) {
    auto a = visit(*e.args[0]), b = visit(*e.args[1]);
    if (!a || !b) return std::nullopt;
    switch (e.binop) {
      case BinOp::add: return Interval{a->lo + b->lo, a->hi + b->hi};
      case BinOp::sub: return Interval{a->lo - b->hi, a->hi - b->lo};
      case BinOp::min: return Interval{std::min(a->lo, b->lo), std::min(a->hi, b->hi)};
      case BinOp::max: return Interval{std::max(a->lo, b->lo), std::max(a->hi, b->hi)};
      case BinOp::mul:
        if (a->lo >= 0 && b->lo >= 0) return Interval{a->lo * b->lo, a->hi * b->hi};
        return std::nullopt;
      case BinOp::rem:  // C++ remainder: a non-negative value modulo a positive one
        if (a->lo >= 0 && b->lo > 0) return Interval{0, std::min(a->hi, b->hi - 1)};
        return std::nullopt;
      default: return std::nullopt;
    }
  }
  Range visit_cast(const Expr& e) { return visit(*e.args[0]); }
  Range visit_select(const Expr& e) {
    auto a = visit(*e.args[1]), b = visit(*e.args[2]);
    if (!a || !b) return std::nullopt;
    return Interval{std::min(a->lo, b->lo), std::max(a->hi, b->hi)};
  }

  const Kernel& k_;
};

class Verifier : public IRVisitor<Verifier, unsigned> {
 public:
  explicit Verifier(const Kernel& k) : k_(k), uni_(k.regs.size(), kUniform), lanes_(k.regs.size(), 31u) {
    const int W = k.workers_per_program;
    // A group-uniform value is cluster-uniform when a cluster is one group; a program-uniform
    // value is warp-uniform when programs span whole warps and group-uniform when a group is
    // one program; a warp-uniform value is program-uniform when a program lies in one warp.
    group_ = kGroup | kProgram | kWarp | (k.ctas_per_cluster == 1 ? kCluster : 0u);
    program_ = kProgram | (W >= 32 ? kWarp : 0u) | (k.programs_per_group == 1 ? group_ : 0u);
    warp_ = kWarp | (W <= 32 ? kProgram : 0u);
  }

  std::vector<std::string> run() {
    check_decls();
    // Uniformity of registers: iterate assignments to a fixed point (loops feed back).
    for (int round = 0; round < 64; ++round) {
      changed_ = false;
      visit_block(k_.body, kUniform);
      if (!changed_) break;
    }
    check_ = true;
    visit_block(k_.body, kUniform);
    check_cluster_order();
    check_staged_order();
    check_definite_assignment();
    return errors_;
  }

 private:
  friend class IRVisitor<Verifier, unsigned>;

  void error(const std::string& msg) { errors_.push_back(msg); }

  void check_decls() {
    // The budget counts 32-bit scalars: an f64 register takes two, as does an i32 register of
    // two raw 16-bit elements.
    int cached = 0;
    for (const Register& r : k_.regs) cached += r.cached ? (r.type == Type::i32 || r.type == Type::f64 ? 2 : 1) : 0;
    if (!is_real(k_.real)) error(std::string("kernel float type ") + type_name(k_.real) + " is not f32 or f64");
    for (const Register& r : k_.regs)
      if (is_real(r.type) && r.type != k_.real)
        error("register " + r.name + " is " + type_name(r.type) + " in a kernel whose float type is " + type_name(k_.real));
    // f64 buffers exactly in f64 kernels: a call has one float precision (bind.cpp).
    for (const Buffer& b : k_.buffers)
      if (is_float(b.dtype) && (b.dtype == DType::f64) != (k_.real == Type::f64))
        error("buffer " + b.name + " is " + std::string(dtype_name(b.dtype)) + " in a kernel whose float type is " +
              type_name(k_.real));
    for (const ScalarParam& p : k_.params)
      if (is_real(p.type) && p.type != k_.real)
        error("parameter " + p.name + " is " + type_name(p.type) + " in a kernel whose float type is " + type_name(k_.real));
    for (const StagedRegion& r : k_.staged) {
      if (!is_float(r.dtype))
        error("staged region '" + r.name + "' holds " + std::string(dtype_name(r.dtype)) + ", not a float dtype");
      if (r.elems < 1) error("staged region '" + r.name + "' has no elements");
    }
    if (cached > k_.private_budget)
      error("cached input registers (" + std::to_string(cached) + ") exceed the private budget of " +
            std::to_string(k_.private_budget) + " scalars");
    const int P = k_.programs_per_group;
    for (size_t a = 0; a < k_.shared.size(); ++a) {
      const SharedRegion& ra = k_.shared[a];
      if (ra.elems < 1 || ra.base < 0) error("shared region '" + ra.name + "' has no slots");
      if (ra.pushes < 0 || (ra.pushes > 0 && (k_.ctas_per_cluster < 2 || P != 1 || ra.pushes > ra.elems)))
        error("exchange region '" + ra.name + "' awaits " + std::to_string(ra.pushes) + " pushes into " +
              std::to_string(ra.elems) + " slots in a kernel of " + std::to_string(P) + " program(s) a group and " +
              std::to_string(k_.ctas_per_cluster) + " group(s) a cluster (exchanges need clusters, one program a group, "
              "and a slot a push)");
      for (size_t b = a; b < k_.shared.size(); ++b) {
        const SharedRegion& rb = k_.shared[b];
        // A region with program stride 0 is one slice for the whole group: program 0's.
        for (int p = 0; p < (ra.program_stride ? P : 1); ++p)
          for (int q = 0; q < (rb.program_stride ? P : 1); ++q) {
            if (a == b && p >= q) continue;
            int64_t a0 = ra.base + int64_t(p) * ra.program_stride, b0 = rb.base + int64_t(q) * rb.program_stride;
            if (a0 < b0 + rb.elems && b0 < a0 + ra.elems) {
              error("shared region '" + ra.name + "' of program " + std::to_string(p) + " [" +
                    std::to_string(a0) + ", " + std::to_string(a0 + ra.elems) + ") overlaps '" + rb.name +
                    "' of program " + std::to_string(q) + " [" + std::to_string(b0) + ", " +
                    std::to_string(b0 + rb.elems) + ")");
              return;
            }
          }
      }
    }
  }

  unsigned special_uniformity(Special s) const {
    switch (s) {
      case Special::group_count:
      case Special::cluster_index: return kUniform;
      case Special::group_index:
      case Special::cta_in_cluster: return group_;
      case Special::program_in_group: return program_;
      case Special::warp_in_program: return warp_;
      case Special::worker_in_program:
      case Special::lane: return 0;
    }
    return 0;
  }

  // Expressions: type-checks `e` (when checking) and returns its uniformity, the scopes
  // across which its value is the same.
  void type_error(const Expr& e, const std::string& what) {
    if (check_) error("type error in '" + print(e) + "': " + what);
  }
  unsigned args_uniformity(const Expr& e) {
    unsigned u = kUniform;
    for (const ExprPtr& a : e.args) u &= visit(*a);
    return u;
  }

  // Every float value has the kernel's one float type.
  void expect_real(const Expr& e) {
    if (is_real(e.type) && e.type != k_.real)
      type_error(e, std::string(type_name(e.type)) + " value in a kernel whose float type is " + type_name(k_.real));
  }
  unsigned visit_constant(const Expr& e) {
    args_uniformity(e);
    expect_real(e);
    return kUniform;
  }
  unsigned visit_reg(const Expr& e) {
    args_uniformity(e);
    if (e.id < 0 || e.id >= int(k_.regs.size())) {
      type_error(e, "no register " + std::to_string(e.id));
      return 0;
    }
    if (k_.regs[e.id].type != e.type)
      type_error(e, "register " + k_.regs[e.id].name + " is " + type_name(k_.regs[e.id].type) + ", used as " + type_name(e.type));
    return uni_[e.id];
  }
  unsigned visit_special(const Expr& e) {
    args_uniformity(e);
    return special_uniformity(Special(e.id));
  }
  unsigned visit_param(const Expr& e) {
    args_uniformity(e);
    if (e.id < 0 || e.id >= int(k_.params.size()))
      type_error(e, "no parameter " + std::to_string(e.id));
    else if (k_.params[e.id].type != e.type)
      type_error(e, "parameter " + k_.params[e.id].name + " is " + type_name(k_.params[e.id].type));
    return kUniform;
  }
  unsigned visit_unary(const Expr& e) {
    unsigned u = args_uniformity(e);
    if (e.unop == UnOp::not_ ? e.args[0]->type != Type::b1
                             : e.args[0]->type != k_.real && !((e.unop == UnOp::neg || e.unop == UnOp::abs) &&
                                                                 e.args[0]->type != Type::b1))
      type_error(e, std::string(unop_name(e.unop)) + " of " + type_name(e.args[0]->type));
    if (e.type != e.args[0]->type) type_error(e, "unary result type differs from its operand");
    return u;
  }
  unsigned visit_binary(const Expr& e) {
    unsigned u = args_uniformity(e);
    Type a = e.args[0]->type, b = e.args[1]->type;
    if (a != b) type_error(e, std::string(binop_name(e.binop)) + " of " + type_name(a) + " and " + type_name(b));
    bool logical = e.binop == BinOp::and_ || e.binop == BinOp::or_;
    bool compare = e.binop == BinOp::lt || e.binop == BinOp::le || e.binop == BinOp::eq || e.binop == BinOp::ne;
    if (logical != (a == Type::b1) && !(compare && a == Type::b1 && (e.binop == BinOp::eq || e.binop == BinOp::ne)))
      type_error(e, std::string(binop_name(e.binop)) + " of " + type_name(a));
    if (e.binop == BinOp::rem && is_real(a)) type_error(e, std::string("rem of ") + type_name(a));
    if (e.binop == BinOp::ldexp && a != k_.real) type_error(e, std::string("ldexp of ") + type_name(a));
    if (e.type != (compare ? Type::b1 : a)) type_error(e, "result type " + std::string(type_name(e.type)));
    return u;
  }
  unsigned visit_select(const Expr& e) {
    unsigned u = args_uniformity(e);
    if (e.args[0]->type != Type::b1) type_error(e, "select condition is " + std::string(type_name(e.args[0]->type)));
    if (e.args[1]->type != e.args[2]->type || e.type != e.args[1]->type) type_error(e, "select arms differ in type");
    return u;
  }
  unsigned visit_cast(const Expr& e) {
    unsigned u = args_uniformity(e);
    if (e.type == Type::b1 || e.args[0]->type == Type::b1) type_error(e, "cast to or from b1");
    expect_real(e);
    expect_real(*e.args[0]);
    return u;
  }
  unsigned visit_unpack16(const Expr& e) {
    unsigned u = args_uniformity(e);
    if (e.args[0]->type != Type::i32) type_error(e, "unpack16 of " + std::string(type_name(e.args[0]->type)));
    if ((DType(e.id) != DType::f16 && DType(e.id) != DType::bf16) || e.i < 0 || e.i > 1)
      type_error(e, "unpack16 needs a 16-bit dtype and half 0 or 1");
    expect_real(e);
    return u;
  }
  unsigned visit_row_aligned(const Expr& e) {
    unsigned u = args_uniformity(e);
    if (e.args[0]->type != Type::i64) type_error(e, "row_aligned offset is " + std::string(type_name(e.args[0]->type)));
    if (e.id < 0 || e.id >= int(k_.buffers.size())) type_error(e, "no buffer " + std::to_string(e.id));
    return u;
  }

  void shared_index(const Stmt& s) {
    if (!check_) return;
    if (s.region < 0 || s.region >= int(k_.shared.size())) {
      error("shared access to region " + std::to_string(s.region) + ", which does not exist");
      return;
    }
    if (s.index->type != Type::i32) error("shared index '" + print(*s.index) + "' is not i32");
    const SharedRegion& r = k_.shared[s.region];
    auto iv = RangeOf(k_).visit(*s.index);
    if (!iv || iv->lo < 0 || iv->hi >= r.elems)
      error("shared index '" + print(*s.index) + "' of region '" + r.name + "' is not provably in [0, " +
            std::to_string(r.elems) + ")");
  }

  // A definition of `reg` with uniformity u; `lanes` as butterfly_lanes (a warp-uniform value
  // agrees across every lane).
  void define(int reg, unsigned u, unsigned lanes = 0) {
    if (reg < 0 || reg >= int(uni_.size())) return;
    unsigned next = uni_[reg] & u;
    unsigned next_lanes = lanes_[reg] & ((u & kWarp) ? 31u : lanes);
    if (next != uni_[reg] || next_lanes != lanes_[reg]) {
      uni_[reg] = next;
      lanes_[reg] = next_lanes;
      changed_ = true;
    }
  }

  void expect_type(const Expr& e, Type t, const std::string& what) {
    if (check_ && e.type != t)
      error(what + " '" + print(e) + "' is " + type_name(e.type) + ", expected " + type_name(t));
  }

  void expect_reg(int reg, Type t, const std::string& what) {
    if (!check_) return;
    if (reg < 0 || reg >= int(k_.regs.size()))
      error(what + ": no register " + std::to_string(reg));
    else if (k_.regs[reg].type != t)
      error(what + ": register " + k_.regs[reg].name + " is " + type_name(k_.regs[reg].type) + ", expected " + type_name(t));
  }

  // Statements, under control flow whose uniformity is `control`. Each statement's predecessor
  // in its block is known while it is checked (a butterfly step spans two statements).
  void visit_block(const std::vector<Stmt>& body, unsigned control) {
    for (size_t i = 0; i < body.size(); ++i) {
      prev_ = i ? &body[i - 1] : nullptr;
      visit(body[i], control);
    }
    prev_ = nullptr;
  }
  void visit_assign(const Stmt& s, unsigned control) {
    const Stmt* prev = prev_;
    unsigned u = visit(*s.value);
    expect_reg(s.dst, s.value->type, "assignment of '" + print(*s.value) + "'");
    // Lanes agree only where every lane of the warp takes the assignment.
    const unsigned lanes = (control & kWarp) ? butterfly_lanes(s, prev) | lanes_of(*s.value) : 0u;
    // A value the same in every lane of the warp (a complete butterfly) is warp-uniform.
    define(s.dst, (lanes == 31u ? u | warp_ : u) & control, lanes);
  }
  // The xor-masks of lanes (bits, as butterfly_lanes) across which an expression's value agrees:
  // every one where it is warp-uniform, none for the lane; lane mod 2^k agrees across the bits
  // from k up, and an operation agrees wherever all of its operands do.
  unsigned lanes_of(const Expr& e) const {
    switch (e.kind) {
      case Expr::Kind::constant:
      case Expr::Kind::param: return 31u;
      case Expr::Kind::reg:
        if (e.id < 0 || e.id >= int(lanes_.size())) return 0u;
        return (uni_[e.id] & kWarp) ? 31u : lanes_[e.id];
      case Expr::Kind::special: return (special_uniformity(Special(e.id)) & kWarp) ? 31u : 0u;
      case Expr::Kind::binary: {
        const Expr &a = *e.args[0], &b = *e.args[1];
        if (e.binop == BinOp::rem && a.kind == Expr::Kind::special && Special(a.id) == Special::lane &&
            b.kind == Expr::Kind::constant && b.i > 0 && b.i <= 32 && (b.i & (b.i - 1)) == 0)
          return 31u & ~unsigned(b.i - 1);
        return lanes_of(a) & lanes_of(b);
      }
      case Expr::Kind::unary:
      case Expr::Kind::select:
      case Expr::Kind::cast: {
        unsigned lanes = 31u;
        for (const ExprPtr& a : e.args) lanes &= lanes_of(*a);
        return lanes;
      }
      default: return 0u;
    }
  }
  // A butterfly step: `t = shfl_xor(v, o)` (width 32) and right after it `m = v op t` with op
  // commutative (add, mul, max, min) give lanes i and i ^ o the same bits of m, and every pair
  // of lanes v already agreed on: m agrees across the xor-masks of v's and o. The lanes a
  // register agrees across (a bit set per xor-mask bit) are the meet over its definitions.
  unsigned butterfly_lanes(const Stmt& s, const Stmt* prev) const {
    if (!prev || prev->kind != Stmt::Kind::shfl_xor || prev->width != 32) return 0;
    const Expr& e = *s.value;
    if (e.kind != Expr::Kind::binary || e.args.size() != 2 ||
        (e.binop != BinOp::add && e.binop != BinOp::mul && e.binop != BinOp::max && e.binop != BinOp::min))
      return 0;
    const Expr &a = *e.args[0], &b = *e.args[1];
    if (a.kind != Expr::Kind::reg || b.kind != Expr::Kind::reg) return 0;
    const int v = prev->src, t = prev->dst;
    if (!((a.id == v && b.id == t) || (a.id == t && b.id == v)) || s.dst == v || s.dst == t || v == t) return 0;
    if (v < 0 || v >= int(lanes_.size())) return 0;
    return (lanes_[v] | unsigned(prev->offset)) & 31u;
  }

  void visit_load(const Stmt& s, unsigned control) { access(s, control, /*is_load=*/true); }
  void visit_store(const Stmt& s, unsigned control) { access(s, control, /*is_load=*/false); }
  void access(const Stmt& s, unsigned control, bool is_load) {
    unsigned u = visit(*s.index) & visit(*s.valid) & visit(*s.aligned) & control;
    expect_type(*s.index, Type::i64, "index");
    expect_type(*s.valid, Type::i64, "valid count");
    expect_type(*s.aligned, Type::b1, "alignment condition");
    if (check_ && (s.buffer < 0 || s.buffer >= int(k_.buffers.size())))
      error("access to buffer " + std::to_string(s.buffer) + ", which does not exist");
    else if (check_ && !is_load && !k_.buffers[s.buffer].output)
      error("store to input buffer '" + k_.buffers[s.buffer].name + "'");
    const int per_reg = s.raw ? 2 : 1;
    if (check_ && int(s.dsts.size()) * per_reg != s.width) error("vector access of width " + std::to_string(s.width) + " with " + std::to_string(s.dsts.size()) + " registers");
    if (check_ && s.raw && (!is_load || s.buffer < 0 || s.buffer >= int(k_.buffers.size()) ||
                            dtype_size(k_.buffers[s.buffer].dtype) != 2))
      error("raw access that is not a load of a 16-bit buffer");
    // A whole access has no scalar path, so it must be known aligned when generated.
    if (check_ && s.whole && !(s.aligned->kind == Expr::Kind::constant && s.aligned->i))
      error("whole-vector access whose alignment condition is not the constant true");
    const Type reg_type = s.raw ? Type::i32
                          : s.buffer >= 0 && s.buffer < int(k_.buffers.size()) ? value_type(k_.buffers[s.buffer].dtype, k_.real)
                                                                               : k_.real;
    for (int r : s.dsts) {
      expect_reg(r, reg_type, is_load ? "load destination" : "store source");
      if (is_load) define(r, u);
    }
  }
  void visit_shfl_xor(const Stmt& s, unsigned control) {
    shuffle(s, control, "shfl_xor", "offset", 1);
    define(s.dst, 0);
  }
  // Every lane of a segment reads one lane's value: across a whole warp the result is
  // warp-uniform, and uniform wherever the source already was.
  void visit_shfl_idx(const Stmt& s, unsigned control) {
    shuffle(s, control, "shfl_idx", "lane", 0);
    const unsigned src = s.src >= 0 && s.src < int(uni_.size()) ? uni_[s.src] : 0u;
    if (s.width == 32)
      define(s.dst, (src | warp_) & control, 31u);
    else
      define(s.dst, src & control);
  }
  // A shuffle's rules: control flow uniform across the warp, `offset` in [lowest, width), a
  // width that is a power of two up to 32, float source and destination.
  void shuffle(const Stmt& s, unsigned control, const std::string& name, const std::string& what, int lowest) {
    if (check_ && (control & kWarp) == 0)
      error(name + " of " + reg_name(s.src) + " under control flow that is not uniform across the warp");
    if (check_ && (s.offset < lowest || s.offset >= s.width || s.width > 32 || (s.width & (s.width - 1))))
      error(name + " " + what + " " + std::to_string(s.offset) + " outside its width " + std::to_string(s.width));
    expect_reg(s.src, k_.real, name + " source");
    expect_reg(s.dst, k_.real, name + " destination");
  }
  void visit_shared_store(const Stmt& s, unsigned) {
    visit(*s.index);
    visit(*s.value);
    expect_type(*s.value, k_.real, "shared value");
    shared_index(s);
    if (check_ && exchange(s)) error("shared store into exchange region '" + k_.shared[s.region].name + "' (pushes fill it)");
  }
  void visit_shared_load(const Stmt& s, unsigned control) {
    // A group's shared memory: a value read at a uniform index is the same across the group,
    // or across the program where each program has its own slice.
    unsigned u = visit(*s.index) & control;
    // Lanes reading one slot read one value; a program's own slice is one slot only within the
    // program (sub-warp programs share a warp).
    unsigned lanes = (control & kWarp) ? lanes_of(*s.index) : 0u;
    if (s.region >= 0 && s.region < int(k_.shared.size())) {
      u &= k_.shared[s.region].program_stride ? program_ : group_;
      const int W = k_.workers_per_program;
      if (k_.shared[s.region].program_stride && W < 32) lanes &= (W & (W - 1)) == 0 ? unsigned(W - 1) : 0u;
    }
    expect_reg(s.dst, k_.real, "shared load destination");
    shared_index(s);
    define(s.dst, u, lanes);
  }
  void visit_remote_shared_load(const Stmt& s, unsigned control) {
    unsigned u = visit(*s.index) & visit(*s.cta) & control;
    expect_reg(s.dst, k_.real, "remote shared load destination");
    shared_index(s);
    if (check_ && exchange(s)) error("remote shared load of exchange region '" + k_.shared[s.region].name + "'");
    if (check_) {
      if (k_.ctas_per_cluster < 2)
        error("remote shared load in a kernel without clusters (ctas_per_cluster " + std::to_string(k_.ctas_per_cluster) + ")");
      expect_type(*s.cta, Type::i32, "remote rank");
      auto iv = RangeOf(k_).visit(*s.cta);
      if (!iv || iv->lo < 0 || iv->hi >= k_.ctas_per_cluster)
        error("remote rank '" + print(*s.cta) + "' is not provably in [0, " + std::to_string(k_.ctas_per_cluster) + ")");
    }
    define(s.dst, u);
  }
  // A push: a float register into an exchange region of a group of the cluster, at a rank and
  // index proven in range (ClusterOrder proves its phase retired before it).
  void visit_remote_shared_push(const Stmt& s, unsigned) {
    visit(*s.index);
    visit(*s.cta);
    expect_reg(s.src, k_.real, "remote shared push source");
    shared_index(s);
    if (!check_) return;
    if (k_.ctas_per_cluster < 2)
      error("remote shared push in a kernel without clusters (ctas_per_cluster " + std::to_string(k_.ctas_per_cluster) + ")");
    if (s.region >= 0 && s.region < int(k_.shared.size()) && !exchange(s))
      error("remote shared push into region '" + k_.shared[s.region].name + "', which is not an exchange region");
    expect_type(*s.cta, Type::i32, "push rank");
    auto iv = RangeOf(k_).visit(*s.cta);
    if (!iv || iv->lo < 0 || iv->hi >= k_.ctas_per_cluster)
      error("push rank '" + print(*s.cta) + "' is not provably in [0, " + std::to_string(k_.ctas_per_cluster) + ")");
  }
  // The wait of an exchange region: every group reaches it (its pushes must land before it
  // exits).
  void visit_exchange_wait(const Stmt& s, unsigned control) {
    if (!check_) return;
    if (s.region < 0 || s.region >= int(k_.shared.size()) || !exchange(s)) {
      error("exchange wait on region " + std::to_string(s.region) + ", which is not an exchange region");
      return;
    }
    if ((control & kCluster) == 0)
      error("exchange wait of '" + k_.shared[s.region].name +
            "' under control flow that is not uniform across the cluster (a group skipping it could exit before its "
            "pushes land)");
  }
  // Staged regions: an async copy of an input buffer of the region's dtype, the worker's wait,
  // and loads of its elements into float registers, all outside loops (single-phase).
  void visit_async_copy(const Stmt& s, unsigned) {
    visit(*s.at);
    visit(*s.index);
    visit(*s.valid);
    visit(*s.aligned);
    expect_type(*s.at, Type::i64, "staged offset");
    expect_type(*s.index, Type::i64, "index");
    expect_type(*s.valid, Type::i64, "valid count");
    expect_type(*s.aligned, Type::b1, "alignment condition");
    if (!check_) return;
    const StagedRegion* r = staged_region(s, "async copy into");
    if (s.width < 1) error("async copy of width " + std::to_string(s.width));
    if (s.buffer < 0 || s.buffer >= int(k_.buffers.size())) {
      error("async copy from buffer " + std::to_string(s.buffer) + ", which does not exist");
    } else {
      const Buffer& b = k_.buffers[s.buffer];
      if (b.output) error("async copy from output buffer '" + b.name + "' (staged regions cache inputs)");
      if (r && b.dtype != r->dtype)
        error("async copy from buffer '" + b.name + "' of " + std::string(dtype_name(b.dtype)) +
              " into staged region '" + r->name + "' of " + std::string(dtype_name(r->dtype)));
    }
    if (r && loops_ > 0)
      error("async copy into staged region '" + r->name + "' inside a loop (staged regions are single-phase)");
  }
  void visit_async_commit(const Stmt&, unsigned) {
    if (check_ && loops_ > 0) error("async commit inside a loop (staged regions are single-phase)");
  }
  void visit_async_wait(const Stmt& s, unsigned) {
    if (check_ && loops_ > 0) error("async wait inside a loop (staged regions are single-phase)");
    if (check_ && s.offset < 0) error("async wait leaving " + std::to_string(s.offset) + " groups in flight");
  }
  void visit_staged_load(const Stmt& s, unsigned) {
    visit(*s.at);
    visit(*s.valid);
    expect_type(*s.at, Type::i64, "staged offset");
    expect_type(*s.valid, Type::i64, "valid count");
    // Each worker reads elements only it copied: the values vary from worker to worker.
    for (int r : s.dsts) {
      expect_reg(r, k_.real, "staged load destination");
      define(r, 0);
    }
    if (!check_) return;
    const StagedRegion* r = staged_region(s, "staged load from");
    if (s.width < 1 || int(s.dsts.size()) != s.width)
      error("staged load of width " + std::to_string(s.width) + " with " + std::to_string(s.dsts.size()) +
            " registers");
    if (r && loops_ > 0)
      error("staged load from staged region '" + r->name + "' inside a loop (staged regions are single-phase)");
  }
  const StagedRegion* staged_region(const Stmt& s, const std::string& what) {
    if (s.region >= 0 && s.region < int(k_.staged.size())) return &k_.staged[size_t(s.region)];
    error(what + " staged region " + std::to_string(s.region) + ", which does not exist");
    return nullptr;
  }

  bool exchange(const Stmt& s) const {
    return s.region >= 0 && s.region < int(k_.shared.size()) && k_.shared[s.region].pushes > 0;
  }
  void visit_barrier(const Stmt& s, unsigned control) {
    if (!check_) return;
    if (s.scope != Scope::group && s.scope != Scope::program && s.scope != Scope::cluster) {
      error(std::string("barrier of scope ") + scope_name(s.scope) + " (kernels synchronise programs, groups and clusters)");
      return;
    }
    if (s.scope == Scope::cluster && k_.ctas_per_cluster < 2) {
      error("barrier of scope cluster in a kernel without clusters (ctas_per_cluster " + std::to_string(k_.ctas_per_cluster) + ")");
      return;
    }
    if ((control & uniform_across(s.scope)) == 0)
      error(std::string(scope_name(s.scope)) + " barrier under control flow that is not uniform across the " +
            scope_name(s.scope) +
            (s.scope == Scope::group     ? " (some workers, e.g. a guard program's, would skip it)"
             : s.scope == Scope::cluster ? " (some groups, e.g. one past the last row, would skip it)"
                                         : ""));
    if (s.scope == Scope::program && k_.workers_per_program % 32 != 0)
      error("program barrier in a program of " + std::to_string(k_.workers_per_program) +
            " workers (a named barrier counts whole warps)");
  }
  void visit_if(const Stmt& s, unsigned control) {
    unsigned u = visit(*s.cond) & control;
    expect_type(*s.cond, Type::b1, "if condition");
    visit_block(s.body, u);
    visit_block(s.else_body, u);
  }
  void visit_for(const Stmt& s, unsigned control) {
    unsigned u = visit(*s.begin) & visit(*s.end) & control;
    expect_type(*s.end, s.begin->type, "loop bound");
    expect_reg(s.dst, s.begin->type, "loop variable");
    define(s.dst, u);
    ++loops_;
    visit_block(s.body, u);
    --loops_;
  }
  void visit_comment(const Stmt&, unsigned) {}

  void check_cluster_order();
  void check_staged_order();
  void check_definite_assignment();

  std::string print(const Expr& e) const { return to_string(k_, e); }
  std::string reg_name(int r) const { return r >= 0 && r < int(k_.regs.size()) ? k_.regs[r].name : "?"; }

  const Kernel& k_;
  std::vector<unsigned> uni_;
  std::vector<unsigned> lanes_;  // xor-masks of lanes a register agrees across (butterfly_lanes)
  const Stmt* prev_ = nullptr;
  unsigned group_ = 0, program_ = 0, warp_ = 0;
  int loops_ = 0;  // loops around the statement visited
  bool changed_ = false;
  bool check_ = false;  // report errors (the last walk, once uniformity is a fixed point)
  std::vector<std::string> errors_;
};

// A walk of every path through a kernel, for order rules: an if joins its arms' states
// (Self::join), a loop iterates its head's state to a fixed point (the body runs zero or more
// times), and statements other than those Self handles change nothing.
template <typename Self>
class PathOrder : public IRVisitor<Self> {
 public:
  template <typename State>
  void visit_if(const Stmt& s, State& st) {
    State a = st, b = st;
    this->visit_block(s.body, a);
    this->visit_block(s.else_body, b);
    st = Self::join(a, b);
  }
  template <typename State>
  void visit_for(const Stmt& s, State& st) {
    State head = st;
    for (;;) {
      State out = head;
      this->visit_block(s.body, out);
      State next = Self::join(head, out);
      if (next == head) break;
      head = next;
    }
    st = head;
  }
  template <typename... Ctx>
  void visit_children(const Stmt&, Ctx&&...) {}
};

// The order of cluster barriers, remote accesses and exchange waits along every path: a remote
// read or push needs a cluster barrier passed on every path before it (the other groups of the
// cluster are then known to have started, their shared memory written before it visible and
// their exchange barriers armed); the kernel must not end while a remote read may lack a later
// cluster barrier (the group read could have exited). An exchange region runs in phases: a
// phase's pushes, its wait, its reads (only after the wait on every path), then a cluster arrive
// and a cluster wait retire it (a whole barrier does both); a push or wait before the previous
// phase is retired on every path is refused (a push could overwrite a slot another group has yet
// to read, a wait would count the next phase's pushes), as is a read after the arrive, and a
// push not followed by its wait on every path before the end (the group could exit before the
// pushes into it land). The groups of a cluster run the same code under cluster-uniform
// control, so this group's order stands for each of theirs.
class ClusterOrder : public PathOrder<ClusterOrder> {
 public:
  struct State {
    bool synced = false;   // a cluster barrier (whole or split) was passed on every path
    bool published = false;  // a whole cluster barrier was passed on every path
    bool pending = false;  // on some path a remote read has no cluster barrier after it
    std::set<int> open_all, open_any;  // exchange regions waited and readable: on every path, on some
    std::set<int> retiring_any;        // regions whose phase an arrive closed, awaiting the wait, on some path
    std::set<int> unwaited_any;        // regions pushed into and not yet waited, on some path
    bool arrived_all = false, arrived_any = false;  // a cluster arrive awaits its wait: on every path, on some
    bool operator==(const State&) const = default;
  };
  explicit ClusterOrder(const Kernel& k) : k_(k) {}

  std::vector<std::string> run() {
    State s;
    visit_block(k_.body, s);
    if (s.pending)
      errors_.push_back("a remote shared load is not followed by a cluster barrier before the kernel ends (the group it "
                        "reads may have exited)");
    if (s.arrived_any) errors_.push_back("a cluster arrive has no cluster wait after it before the kernel ends");
    for (int r : s.unwaited_any)
      errors_.push_back(
          "exchange region '" + k_.shared[r].name +
          "' is not waited on every path after its pushes (its group could exit before the pushes into it "
          "land)");
    return errors_;
  }

 private:
  friend class IRVisitor<ClusterOrder>;
  friend class PathOrder<ClusterOrder>;
  static State join(State a, State b) {
    State j{a.synced && b.synced,
            a.published && b.published,
            a.pending || b.pending,
            {},
            a.open_any,
            a.retiring_any,
            a.unwaited_any,
            a.arrived_all && b.arrived_all,
            a.arrived_any || b.arrived_any};
    for (int r : a.open_all)
      if (b.open_all.count(r)) j.open_all.insert(r);
    j.open_any.insert(b.open_any.begin(), b.open_any.end());
    j.retiring_any.insert(b.retiring_any.begin(), b.retiring_any.end());
    j.unwaited_any.insert(b.unwaited_any.begin(), b.unwaited_any.end());
    return j;
  }

  // A split cluster barrier: a wait needs an arrive before it on every path, an arrive (or a
  // whole barrier) none pending; the wait completes the barrier. An arrive closes the open
  // exchange phases, the wait (or a whole barrier) retires them.
  void visit_barrier(const Stmt& s, State& st) {
    if (s.scope != Scope::cluster) return;
    if (s.phase == BarrierPhase::wait && !st.arrived_all && reported_.insert(&s).second)
      errors_.push_back("cluster wait without a cluster arrive before it on some path");
    if (s.phase != BarrierPhase::wait && st.arrived_any && reported_.insert(&s).second)
      errors_.push_back(std::string(s.phase == BarrierPhase::arrive ? "cluster arrive" : "cluster barrier") +
                        " while an earlier cluster arrive awaits its wait on some path");
    if (s.phase == BarrierPhase::arrive) {
      st.arrived_all = st.arrived_any = true;
      st.retiring_any.insert(st.open_any.begin(), st.open_any.end());
      st.open_all.clear(), st.open_any.clear();
      return;
    }
    st.arrived_all = st.arrived_any = false;
    st.retiring_any.clear();
    st.synced = true;
    if (s.phase == BarrierPhase::both) {
      st.published = true, st.pending = false;
      st.open_all.clear(), st.open_any.clear();
    }
  }
  void visit_remote_shared_push(const Stmt& s, State& st) {
    if (!st.synced && reported_.insert(&s).second)
      errors_.push_back("remote shared push into region '" + region_name(s) +
                        "' before a cluster barrier on some path (the cluster is not known to be resident)");
    if (retained(s.region, st) && reported_.insert(&s).second)
      errors_.push_back("remote shared push into exchange region '" + region_name(s) +
                        "' before its previous phase is retired on some path (a cluster arrive after the phase's reads "
                        "and a cluster wait before the push): it could overwrite a slot another group has yet to read");
    st.unwaited_any.insert(s.region);
  }
  void visit_exchange_wait(const Stmt& s, State& st) {
    if (retained(s.region, st) && reported_.insert(&s).second)
      errors_.push_back("exchange region '" + region_name(s) +
                        "' waited again before its previous phase is retired on some path (a cluster arrive after the "
                        "phase's reads and a cluster wait before the next pushes)");
    st.open_all.insert(s.region);
    st.open_any.insert(s.region);
    st.unwaited_any.erase(s.region);
  }
  void visit_shared_load(const Stmt& s, State& st) {
    if (s.region < 0 || s.region >= int(k_.shared.size()) || k_.shared[s.region].pushes == 0) return;
    if (st.open_all.count(s.region) || !reported_.insert(&s).second) return;
    if (st.retiring_any.count(s.region))
      errors_.push_back("shared load of exchange region '" + region_name(s) +
                        "' after the cluster arrive that retires its phase on some path (the next pushes may "
                        "overwrite it)");
    else
      errors_.push_back("shared load of exchange region '" + region_name(s) +
                        "' before its exchange wait on some path (the pushes may not have landed)");
  }
  // A phase of the region is waited or closing, not retired, on some path.
  static bool retained(int region, const State& st) {
    return st.open_any.count(region) || st.retiring_any.count(region);
  }
  void visit_remote_shared_load(const Stmt& s, State& st) {
    if (!st.published && reported_.insert(&s).second)
      errors_.push_back("remote shared load of region '" + region_name(s) +
                        "' before a cluster barrier on some path (the cluster is not known to be resident, its "
                        "writes not published; a split barrier publishes none)");
    st.pending = true;
  }

  std::string region_name(const Stmt& s) const {
    return s.region >= 0 && s.region < int(k_.shared.size()) ? k_.shared[s.region].name : "?";
  }

  const Kernel& k_;
  std::vector<std::string> errors_;
  std::set<const Stmt*> reported_;
};

void Verifier::check_cluster_order() {
  for (std::string& e : ClusterOrder(k_).run()) error(e);
}

// The order of async copies, commits, waits and staged loads along every path: a staged load
// needs the group of each copy into its region at its offset landed (an async wait leaving
// fewer groups in flight), and no copy into a region may follow a staged load of it (the
// asynchronous write would race with the read).
class StagedOrder : public PathOrder<StagedOrder> {
 public:
  // A copy by its region and offset expression. Groups of copies in flight on some path,
  // oldest first, and the open group; regions staged-loaded on some path.
  using Copy = std::pair<int, const Expr*>;
  struct State {
    std::vector<std::vector<Copy>> groups;
    std::vector<Copy> open;
    std::set<int> read;
    bool operator==(const State& o) const {
      return read == o.read && same(open, o.open) && groups.size() == o.groups.size() &&
             std::equal(groups.begin(), groups.end(), o.groups.begin(), same);
    }
  };
  static bool same_expr(const Expr* a, const Expr* b) {
    if (a == b) return true;
    if (a->kind != b->kind || a->type != b->type || a->id != b->id || a->f != b->f || a->i != b->i ||
        a->unop != b->unop || a->binop != b->binop || a->args.size() != b->args.size())
      return false;
    for (size_t k = 0; k < a->args.size(); ++k)
      if (!same_expr(a->args[k].get(), b->args[k].get())) return false;
    return true;
  }
  static bool contains(const std::vector<Copy>& copies, const Copy& c) {
    for (const Copy& d : copies)
      if (d.first == c.first && same_expr(d.second, c.second)) return true;
    return false;
  }
  static bool same(const std::vector<Copy>& a, const std::vector<Copy>& b) {
    if (a.size() != b.size()) return false;
    for (const Copy& c : a)
      if (!contains(b, c)) return false;
    return true;
  }
  static void add(std::vector<Copy>& copies, const Copy& c) {
    if (!contains(copies, c)) copies.push_back(c);
  }
  explicit StagedOrder(const Kernel& k) : k_(k) {}

  std::vector<std::string> run() {
    State s;
    visit_block(k_.body, s);
    return errors_;
  }

 private:
  friend class IRVisitor<StagedOrder>;
  friend class PathOrder<StagedOrder>;
  // Groups aligned from the newest: a copy in flight on either path stays in flight.
  static State join(State a, const State& b) {
    if (a.groups.size() < b.groups.size()) a.groups.insert(a.groups.begin(), b.groups.size() - a.groups.size(), {});
    const size_t skip = a.groups.size() - b.groups.size();
    for (size_t k = 0; k < b.groups.size(); ++k)
      for (const Copy& c : b.groups[k]) add(a.groups[skip + k], c);
    for (const Copy& c : b.open) add(a.open, c);
    a.read.insert(b.read.begin(), b.read.end());
    return a;
  }

  void visit_async_copy(const Stmt& s, State& st) {
    if (st.read.count(s.region) && reported_.insert(&s).second)
      errors_.push_back("async copy into staged region '" + region_name(s) +
                        "' after a staged load of it on some path (the asynchronous write would race with the read)");
    add(st.open, {s.region, s.at.get()});
  }
  void visit_async_commit(const Stmt&, State& st) {
    st.groups.push_back(std::move(st.open));
    st.open.clear();
  }
  void visit_async_wait(const Stmt& s, State& st) {
    if (!st.open.empty()) visit_async_commit(s, st);
    while (st.groups.size() > size_t(std::max(0, s.offset))) st.groups.erase(st.groups.begin());
  }
  // A load at the offset of a copy still in flight (by the same expression) reads what may not
  // have landed. Loads at other offsets are the executor's to check, element by element.
  bool in_flight(const State& st, const Copy& c) const {
    if (contains(st.open, c)) return true;
    for (const std::vector<Copy>& g : st.groups)
      if (contains(g, c)) return true;
    return false;
  }
  void visit_staged_load(const Stmt& s, State& st) {
    if (in_flight(st, {s.region, s.at.get()}) && reported_.insert(&s).second)
      errors_.push_back("staged load of region '" + region_name(s) +
                        "' before an async wait saw its async copy land on some path (the copy may not have landed)");
    st.read.insert(s.region);
  }

  std::string region_name(const Stmt& s) const {
    return s.region >= 0 && s.region < int(k_.staged.size()) ? k_.staged[size_t(s.region)].name : "?";
  }

  const Kernel& k_;
  std::vector<std::string> errors_;
  std::set<const Stmt*> reported_;
};

void Verifier::check_staged_order() {
  for (std::string& e : StagedOrder(k_).run()) error(e);
}

// Every register read is assigned on every path before it: an if keeps what both arms assign,
// a loop what its head does (the body may run zero times, and its first iteration sees only
// what came before the loop). A register read before that holds whatever the hardware left in
// it, a value no test of the kernel's results need ever see (a lowering that memoises a value
// computed under a condition and reads it after the branch, where the condition was false).
class DefiniteAssignment : public PathOrder<DefiniteAssignment> {
 public:
  using State = std::vector<bool>;
  explicit DefiniteAssignment(const Kernel& k) : k_(k) {}

  std::vector<std::string> run() {
    State s(k_.regs.size(), false);
    visit_block(k_.body, s);
    return errors_;
  }

 private:
  friend class IRVisitor<DefiniteAssignment>;
  friend class PathOrder<DefiniteAssignment>;
  static State join(State a, const State& b) {
    for (size_t i = 0; i < a.size(); ++i) a[i] = a[i] && b[i];
    return a;
  }
  void read(const ExprPtr& e, const State& st, const Stmt& s) {
    if (!e) return;
    if (e->kind == Expr::Kind::reg) read_reg(e->id, st, s);
    for (const ExprPtr& a : e->args) read(a, st, s);
  }
  void read_reg(int r, const State& st, const Stmt& s) {
    if (r < 0 || r >= int(st.size()) || st[size_t(r)] || !reported_.insert(r).second) return;
    std::string where = s.dst >= 0 && s.dst < int(k_.regs.size()) ? " (by the statement that writes '" +
                                                                        k_.regs[size_t(s.dst)].name + "')"
                                                                  : std::string();
    errors_.push_back("register '" + k_.regs[size_t(r)].name + "' is read before it is assigned on some path" + where);
  }
  static void def(int r, State& st) {
    if (r >= 0 && r < int(st.size())) st[size_t(r)] = true;
  }
  void reads(const Stmt& s, const State& st) {
    for (const ExprPtr* e : {&s.value, &s.index, &s.valid, &s.aligned, &s.cta, &s.at}) read(*e, st, s);
  }
  void visit_assign(const Stmt& s, State& st) { reads(s, st), def(s.dst, st); }
  void visit_load(const Stmt& s, State& st) {
    reads(s, st);
    for (int r : s.dsts) def(r, st);
  }
  void visit_store(const Stmt& s, State& st) {
    reads(s, st);
    for (int r : s.dsts) read_reg(r, st, s);
  }
  void visit_shfl_xor(const Stmt& s, State& st) { read_reg(s.src, st, s), def(s.dst, st); }
  void visit_shfl_idx(const Stmt& s, State& st) { read_reg(s.src, st, s), def(s.dst, st); }
  void visit_shared_store(const Stmt& s, State& st) { reads(s, st); }
  void visit_shared_load(const Stmt& s, State& st) { reads(s, st), def(s.dst, st); }
  void visit_remote_shared_load(const Stmt& s, State& st) { reads(s, st), def(s.dst, st); }
  void visit_remote_shared_push(const Stmt& s, State& st) { reads(s, st), read_reg(s.src, st, s); }
  void visit_async_copy(const Stmt& s, State& st) { reads(s, st); }
  void visit_staged_load(const Stmt& s, State& st) {
    reads(s, st);
    for (int r : s.dsts) def(r, st);
  }
  void visit_if(const Stmt& s, State& st) {
    read(s.cond, st, s);
    PathOrder<DefiniteAssignment>::visit_if(s, st);
  }
  void visit_for(const Stmt& s, State& st) {
    read(s.begin, st, s);
    read(s.end, st, s);
    def(s.dst, st);
    PathOrder<DefiniteAssignment>::visit_for(s, st);
  }

  const Kernel& k_;
  std::vector<std::string> errors_;
  std::set<int> reported_;
};

void Verifier::check_definite_assignment() {
  for (std::string& e : DefiniteAssignment(k_).run()) error(e);
}

}  // namespace

std::vector<std::string> verify(const Kernel& kernel) { return Verifier(kernel).run(); }

void verify_or_throw(const Kernel& kernel) {
  std::vector<std::string> errors = verify(kernel);
  if (errors.empty()) return;
  std::string msg = "kernel " + kernel.name + " failed verification:";
  for (const std::string& e : errors) msg += "\n  " + e;
  throw InternalError(msg);
}

}  // namespace tile::ir
