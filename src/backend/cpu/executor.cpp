#include "backend/cpu/executor.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <sstream>

#include "ir/visitor.hpp"

namespace tile::cpu {
namespace {

using ir::BinOp;
using ir::Expr;
using ir::Stmt;
using ir::Type;
using ir::UnOp;

// One register-file entry. Integers and b1 are kept sign-extended in `i` (i32 wraps to 32
// bits after every op), f32 in `f`, f64 in `f64`.
union Slot {
  int64_t i;
  float f;
  double f64;
};

// clang-format off
enum class Op : uint8_t {
  mov,
  fneg, fexp, fexp2, flog, frsqrt, fsqrt, fabs, ftanh, fexponent, fldexp, fadd, fsub, fmul, fdiv, frem, fmin, fmax, flt, fle, feq, fne,
  dneg, dexp, dexp2, dlog, drsqrt, dsqrt, dabs, dtanh, dexponent, dldexp, dadd, dsub, dmul, ddiv, drem, dmin, dmax, dlt, dle, deq, dne,
  neg32, add32, sub32, mul32, div32, rem32,
  neg64, add64, sub64, mul64, div64, rem64, iabs,
  imin, imax, ilt, ile, ieq, ine, band, bor, bnot,  // i32, i64 and b1 alike
  select,
  f_to_i32, f_to_i64, f_to_b1, i_to_f, i_to_i32, i_to_b1,
  d_to_i32, d_to_i64, d_to_b1, i_to_d, f_to_d, d_to_f,
  row_aligned,  // d = aligned(buffer b, offset a, bytes c)
  unpack16,     // d = f32 of the 16-bit DType(b) value in half c of word a
  jump,         // pc = a
  branch_false, // if (!a) pc = b
  inc32, inc64,
  load, store,  // a = MemOp index
  shared_load,  // d = shared[region b][a]
  shared_store, // shared[region b][a] = d
  remote_load,  // d = shared[region b][a] of the cluster's group of rank c
  push,         // shared[exchange region b][a] of the cluster's group of rank c = d
  exchange_wait,  // wait until exchange region b of this group has all its pushes; a = sync label
  async_copy,   // a = StagedOp index
  async_commit, // closes this worker's open group of async copies
  async_wait,   // closes the open group if it holds copies; every group but the a newest landed
  staged_load,  // a = StagedOp index
  shfl,         // d = src a of lane ^ (b & 255) (of lane b & 255 of the segment where b & 65536),
                // segment width (b >> 8) & 255, label c
  group_barrier, program_barrier, cluster_barrier,  // a = sync label
  cluster_arrive,  // this worker arrives at the cluster's split barrier
  cluster_wait,    // wait until every worker of the cluster has arrived as often; a = sync label
  halt,
};
// clang-format on

// Three-address instruction; operands are slots of the worker's register file.
struct Ins {
  Op op;
  int32_t d = 0, a = 0, b = 0, c = 0;
};

struct MemOp {
  int buffer;
  int width;
  bool clamp;
  bool raw;  // load bits into i32 registers, two elements a register
  bool whole;  // all or nothing: no scalar path (ir.hpp)
  bool f64;    // float registers are f64
  float fill;
  int32_t index, valid, aligned;  // slots
  int32_t regs;                   // offset in Code::lists of `width` f32 register slots
};

// An async copy (m: its global side, the buffer's elements) or a staged load (m: its width,
// valid, fill and registers; no buffer), into or from staged region `region` at slot `at`.
struct StagedOp {
  MemOp m;
  int region;
  int32_t at;
};

// Slot layout of a worker: [registers | specials | constants | parameters | temporaries].
struct Code {
  std::vector<Ins> ins;
  std::vector<MemOp> mem;
  std::vector<StagedOp> staged;
  std::vector<int32_t> lists;
  std::vector<std::string> labels;  // names of barrier and shuffle statements
  std::vector<std::pair<int32_t, Slot>> consts;
  int32_t special_base = 0, param_base = 0, num_slots = 0;
};

constexpr int kSpecials = 8;
constexpr int32_t kShflIdx = 1 << 16;  // Op::shfl's b: read one lane of the segment, not lane ^ offset

std::string ranges(const std::vector<int>& ids) {  // sorted ids -> "1-31, 33"
  std::ostringstream os;
  for (size_t k = 0; k < ids.size();) {
    size_t e = k;
    while (e + 1 < ids.size() && ids[e + 1] == ids[e] + 1) ++e;
    os << (k ? ", " : "") << ids[k];
    if (e > k) os << "-" << ids[e];
    k = e + 1;
  }
  return os.str();
}

// Constants get one slot each, numbered in the order a depth-first walk meets them.
class ConstantSlots : public ir::IRVisitor<ConstantSlots> {
 public:
  static std::pair<int, int64_t> key(const Expr& e) {
    if (e.type == Type::f64) {
      int64_t bits;
      std::memcpy(&bits, &e.f, 8);
      return {int(e.type), bits};
    }
    if (e.type != Type::f32) return {int(e.type), e.type == Type::i32 ? int64_t(int32_t(e.i)) : e.i};
    float f = float(e.f);
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    return {int(e.type), bits};
  }

  ConstantSlots(Code& code, int32_t first) : code_(code), next_(first) {}
  int32_t end() const { return next_; }
  const std::map<std::pair<int, int64_t>, int32_t>& slots() const { return slots_; }

  void visit_constant(const Expr& e) {
    if (slots_.count(key(e))) return;
    Slot v{};
    if (e.type == Type::f32)
      v.f = float(e.f);
    else if (e.type == Type::f64)
      v.f64 = e.f;
    else if (e.type == Type::i32)
      v.i = int32_t(e.i);
    else if (e.type == Type::b1)
      v.i = e.i != 0;
    else
      v.i = e.i;
    slots_[key(e)] = next_;
    code_.consts.push_back({next_++, v});
  }

 private:
  Code& code_;
  int32_t next_;
  std::map<std::pair<int, int64_t>, int32_t> slots_;
};

// Expression handlers evaluate into a destination slot `dst` (or, when dst < 0, a fresh
// temporary or a leaf's own slot) and return the slot; statement handlers append code.
class Compiler : public ir::IRVisitor<Compiler, int32_t> {
 public:
  explicit Compiler(const ir::Kernel& k) : k_(k) {}

  Code run() {
    code_.special_base = int32_t(k_.regs.size());
    ConstantSlots constants(code_, code_.special_base + kSpecials);
    for (const Stmt& s : k_.body) constants.visit(s);
    const_slots_ = constants.slots();
    code_.param_base = constants.end();
    temp_base_ = code_.param_base + int32_t(k_.params.size());
    for (const ir::SharedRegion& r : k_.shared)
      need(r.base >= 0 && r.elems >= 0 && r.program_stride >= 0, "shared region '", r.name,
           "' has a negative base, size or stride");
    for (const ir::StagedRegion& r : k_.staged)
      need(r.elems >= 0 && is_float(r.dtype), "staged region '", r.name, "' has a negative size or a non-float dtype");
    visit_block(k_.body);
    code_.ins.push_back({Op::halt});
    code_.num_slots = temp_base_ + max_temps_;
    return std::move(code_);
  }

 private:
  friend class ir::IRVisitor<Compiler, int32_t>;

  template <typename... Parts>  // builds the message only on failure
  void need(bool ok, const Parts&... what) const {
    if (!ok)
      throw ExecutionError("cpu executor: malformed IR in kernel '" + k_.name +
                           "': " + detail::concat(what...));
  }

  int32_t temp() {
    max_temps_ = std::max(max_temps_, ++temps_);
    return temp_base_ + temps_ - 1;
  }
  int32_t reg_slot(int id, Type t, const char* what) const {
    need(id >= 0 && id < int(k_.regs.size()), what, " names register ", id,
         " which does not exist");
    need(k_.regs[id].type == t, what, " uses register '", k_.regs[id].name, "' of type ",
         ir::type_name(k_.regs[id].type), " as ", ir::type_name(t));
    return id;
  }
  static bool is_int(Type t) { return t == Type::i32 || t == Type::i64; }

  Op binop_code(BinOp op, Type t) const {
    if (t == Type::f64) {
      switch (op) {
        case BinOp::add: return Op::dadd;
        case BinOp::sub: return Op::dsub;
        case BinOp::mul: return Op::dmul;
        case BinOp::div: return Op::ddiv;
        case BinOp::rem: return Op::drem;
        case BinOp::min: return Op::dmin;
        case BinOp::max: return Op::dmax;
        case BinOp::lt: return Op::dlt;
        case BinOp::le: return Op::dle;
        case BinOp::eq: return Op::deq;
        case BinOp::ne: return Op::dne;
        case BinOp::ldexp: return Op::dldexp;
        default: need(false, binop_name(op), " on f64"); return Op::mov;
      }
    }
    bool f = t == Type::f32, i32 = t == Type::i32, num = t != Type::b1;
    switch (op) {
      case BinOp::add: need(num, "add on b1"); return f ? Op::fadd : i32 ? Op::add32 : Op::add64;
      case BinOp::sub: need(num, "sub on b1"); return f ? Op::fsub : i32 ? Op::sub32 : Op::sub64;
      case BinOp::mul: need(num, "mul on b1"); return f ? Op::fmul : i32 ? Op::mul32 : Op::mul64;
      case BinOp::div: need(num, "div on b1"); return f ? Op::fdiv : i32 ? Op::div32 : Op::div64;
      case BinOp::rem: need(num, "rem on b1"); return f ? Op::frem : i32 ? Op::rem32 : Op::rem64;
      case BinOp::min: need(num, "min on b1"); return f ? Op::fmin : Op::imin;
      case BinOp::max: need(num, "max on b1"); return f ? Op::fmax : Op::imax;
      case BinOp::lt: return f ? Op::flt : Op::ilt;
      case BinOp::le: return f ? Op::fle : Op::ile;
      case BinOp::eq: return f ? Op::feq : Op::ieq;
      case BinOp::ne: return f ? Op::fne : Op::ine;
      case BinOp::and_: need(!f, "and on f32"); return Op::band;
      case BinOp::or_: need(!f, "or on f32"); return Op::bor;
      case BinOp::ldexp: need(f, "ldexp on a non-float value"); return Op::fldexp;
    }
    return Op::mov;
  }
  Op unop_code(UnOp op, Type t) const {
    if (op == UnOp::not_) return need(t == Type::b1, "not on a non-b1 value"), Op::bnot;
    if (t == Type::f64) {
      switch (op) {
        case UnOp::neg: return Op::dneg;
        case UnOp::abs: return Op::dabs;
        case UnOp::exp: return Op::dexp;
        case UnOp::exp2: return Op::dexp2;
        case UnOp::log: return Op::dlog;
        case UnOp::rsqrt: return Op::drsqrt;
        case UnOp::tanh: return Op::dtanh;
        case UnOp::exponent: return Op::dexponent;
        default: return Op::dsqrt;
      }
    }
    if (op == UnOp::neg) return t == Type::f32 ? Op::fneg : t == Type::i32 ? Op::neg32 : Op::neg64;
    if (op == UnOp::abs) return need(t != Type::b1, "abs of b1"), t == Type::f32 ? Op::fabs : Op::iabs;
    need(t == Type::f32, ir::unop_name(op), " on a non-float value");
    switch (op) {
      case UnOp::exp: return Op::fexp;
      case UnOp::exp2: return Op::fexp2;
      case UnOp::log: return Op::flog;
      case UnOp::rsqrt: return Op::frsqrt;
      case UnOp::tanh: return Op::ftanh;
      case UnOp::exponent: return Op::fexponent;
      default: return Op::fsqrt;
    }
  }
  static Op cast_code(Type from, Type to) {
    if (from == to) return Op::mov;
    if (from == Type::f64)
      return to == Type::f32 ? Op::d_to_f : to == Type::i32 ? Op::d_to_i32 : to == Type::i64 ? Op::d_to_i64 : Op::d_to_b1;
    if (to == Type::f64) return from == Type::f32 ? Op::f_to_d : Op::i_to_d;
    if (from == Type::f32)
      return to == Type::i32 ? Op::f_to_i32 : to == Type::i64 ? Op::f_to_i64 : Op::f_to_b1;
    if (to == Type::f32) return Op::i_to_f;
    if (to == Type::b1) return Op::i_to_b1;
    return to == Type::i32 && from == Type::i64 ? Op::i_to_i32 : Op::mov;
  }

  int32_t expr(const Expr* e, int32_t dst = -1) {
    need(e != nullptr, "missing expression");
    return visit(*e, dst);
  }

  // The executor defines what each node means: a kind without a handler here does not build.
  template <typename Node, typename... Ctx>
  int32_t visit_children(const Node&, Ctx&&...) {
    static_assert(sizeof(Node) == 0, "the CPU executor needs a handler for every node kind");
    return -1;
  }

  int32_t leaf(int32_t slot, int32_t dst) {
    if (dst >= 0 && dst != slot) code_.ins.push_back({Op::mov, dst, slot});
    return dst >= 0 ? dst : slot;
  }
  int32_t visit_constant(const Expr& e, int32_t dst) { return leaf(const_slots_.at(ConstantSlots::key(e)), dst); }
  int32_t visit_reg(const Expr& e, int32_t dst) { return leaf(reg_slot(e.id, e.type, "an expression"), dst); }
  int32_t visit_special(const Expr& e, int32_t dst) {
    need(e.id >= 0 && e.id < kSpecials, "unknown special value");
    return leaf(code_.special_base + e.id, dst);
  }
  int32_t visit_param(const Expr& e, int32_t dst) {
    need(e.id >= 0 && e.id < int(k_.params.size()) && k_.params[e.id].type == e.type, "parameter ", e.id,
         " does not exist or has another type");
    return leaf(code_.param_base + e.id, dst);
  }

  // The slots of the first `n` operands, evaluated in order; an instruction with them as a, b, c.
  Ins operands(const Expr& e, size_t n) {
    need(e.args.size() == n, "expression with the wrong number of operands");
    int32_t a[3] = {0, 0, 0};
    for (size_t j = 0; j < n; ++j) a[j] = expr(e.args[j].get());
    return {Op::mov, 0, a[0], a[1], a[2]};
  }
  int32_t emit(Ins in, int32_t dst) {
    in.d = dst >= 0 ? dst : temp();
    code_.ins.push_back(in);
    return in.d;
  }
  int32_t visit_unary(const Expr& e, int32_t dst) {
    Ins in = operands(e, 1);
    in.op = unop_code(e.unop, e.args[0]->type);
    return emit(in, dst);
  }
  int32_t visit_binary(const Expr& e, int32_t dst) {
    Ins in = operands(e, 2);
    const Type t0 = e.args[0]->type;
    need(e.args[1]->type == t0, ir::binop_name(e.binop), " of ", ir::type_name(t0), " and ",
         ir::type_name(e.args[1]->type));
    in.op = binop_code(e.binop, t0);
    return emit(in, dst);
  }
  int32_t visit_select(const Expr& e, int32_t dst) {
    Ins in = operands(e, 3);
    need(e.args[0]->type == Type::b1 && e.args[1]->type == e.args[2]->type, "ill-typed select");
    in.op = Op::select;
    return emit(in, dst);
  }
  int32_t visit_cast(const Expr& e, int32_t dst) {
    Ins in = operands(e, 1);
    in.op = cast_code(e.args[0]->type, e.type);
    if (in.op == Op::mov && dst < 0) return in.a;  // no conversion: the operand's own slot
    return emit(in, dst);
  }
  int32_t visit_row_aligned(const Expr& e, int32_t dst) {
    Ins in = operands(e, 1);
    need(e.id >= 0 && e.id < int(k_.buffers.size()) && e.i > 0 && is_int(e.args[0]->type),
         "row_aligned with a bad buffer, offset or byte count");
    return emit({Op::row_aligned, 0, in.a, e.id, int32_t(e.i)}, dst);
  }
  int32_t visit_unpack16(const Expr& e, int32_t dst) {
    Ins in = operands(e, 1);
    need(e.args[0]->type == Type::i32 && (e.id == int(DType::f16) || e.id == int(DType::bf16)) && (e.i == 0 || e.i == 1),
         "unpack16 needs an i32 word, a 16-bit dtype and half 0 or 1");
    return emit({Op::unpack16, 0, in.a, e.id, int32_t(e.i)}, dst);
  }

  int32_t here() const { return int32_t(code_.ins.size()); }
  int32_t label(std::string name) {
    code_.labels.push_back(std::move(name));
    return int32_t(code_.labels.size()) - 1;
  }

  void mem(const Stmt& s, bool is_load) {
    need(s.buffer >= 0 && s.buffer < int(k_.buffers.size()),
         "access to a buffer that does not exist");
    need(s.width >= 1 && int(s.dsts.size()) * (s.raw ? 2 : 1) == s.width,
         "access width does not match its registers");
    need(is_load || !s.clamp, "clamp on a store");
    need(!s.raw || (is_load && dtype_size(k_.buffers[s.buffer].dtype) == 2 && s.width <= 16),
         "raw access that is not a 16-bit load of at most 16 elements");
    MemOp m{s.buffer, s.width, s.clamp, s.raw, s.whole, k_.real == Type::f64, s.fill, 0, 0, 0, int32_t(code_.lists.size())};
    for (int r : s.dsts)
      code_.lists.push_back(reg_slot(r, s.raw ? Type::i32 : ir::value_type(k_.buffers[s.buffer].dtype, k_.real),
                                     is_load ? "a load" : "a store"));
    need(s.index && s.valid && s.aligned, "load/store without index, valid or aligned");
    need(is_int(s.index->type) && is_int(s.valid->type) && s.aligned->type == Type::b1,
         "load/store index and valid must be integers and aligned b1");
    m.index = expr(s.index.get());
    m.valid = expr(s.valid.get());
    m.aligned = expr(s.aligned.get());
    code_.ins.push_back({is_load ? Op::load : Op::store, 0, int32_t(code_.mem.size())});
    code_.mem.push_back(m);
  }

  void visit_block(const std::vector<Stmt>& body) {
    for (const Stmt& s : body) {
      temps_ = 0;  // temporaries live within one statement
      visit(s);
    }
  }

  void visit_assign(const Stmt& s) {
    need(s.value != nullptr, "assign without a value");
    need(s.dst >= 0 && s.dst < int(k_.regs.size()), "assign to a register that does not exist");
    need(s.value->type == k_.regs[s.dst].type, "assign of ", ir::type_name(s.value->type), " to register '",
         k_.regs[s.dst].name, "'");
    expr(s.value.get(), s.dst);
  }
  void visit_load(const Stmt& s) { mem(s, true); }
  void visit_store(const Stmt& s) { mem(s, false); }
  void visit_shfl_xor(const Stmt& s) { shuffle(s, false); }
  void visit_shfl_idx(const Stmt& s) { shuffle(s, true); }
  // shfl_xor (lane ^ offset) or shfl_idx (lane `offset` of the segment): one Op::shfl.
  void shuffle(const Stmt& s, bool idx) {
    const char* name = idx ? "shfl_idx" : "shfl_xor";
    need(s.src >= 0 && s.src < int(k_.regs.size()), name, " of a register that does not exist");
    Type t = k_.regs[s.src].type;
    int32_t d = reg_slot(s.dst, t, name);
    need(s.width >= 1 && s.width <= 32 && (s.width & (s.width - 1)) == 0, name, " width ", s.width,
         " is not a power of two <= 32");
    if (idx)
      need(s.offset >= 0 && s.offset < s.width, name, " lane ", s.offset, " is not in [0, ", s.width, ")");
    else
      need(s.offset >= 0 && s.offset < 32, name, " offset ", s.offset, " is not in [0, 32)");
    int32_t l = label(std::string(name) + " #" + std::to_string(shfls_++) + " of '" + k_.regs[s.src].name + "' (" +
                      (idx ? "lane " : "offset ") + std::to_string(s.offset) + ", width " + std::to_string(s.width) + ")");
    code_.ins.push_back({Op::shfl, d, s.src, s.offset | (s.width << 8) | (idx ? kShflIdx : 0), l});
  }
  void visit_shared_store(const Stmt& s) { shared(s, true); }
  void visit_shared_load(const Stmt& s) { shared(s, false); }
  void shared(const Stmt& s, bool st) {
    need(s.region >= 0 && s.region < int(k_.shared.size()), "shared region that does not exist");
    need(s.index && is_int(s.index->type), "shared index must be an integer");
    int32_t v = st ? (need(s.value && s.value->type == k_.real, "shared store of a value of another type than the kernel's float type"),
                      expr(s.value.get()))
                   : reg_slot(s.dst, k_.real, "shared_load");
    int32_t i = expr(s.index.get());
    code_.ins.push_back({st ? Op::shared_store : Op::shared_load, v, i, s.region});
  }
  void visit_remote_shared_load(const Stmt& s) {
    need(k_.ctas_per_cluster > 1, "remote shared load in a kernel without clusters");
    need(s.region >= 0 && s.region < int(k_.shared.size()), "shared region that does not exist");
    need(s.index && is_int(s.index->type) && s.cta && s.cta->type == Type::i32,
         "remote shared load needs an integer index and an i32 rank");
    int32_t d = reg_slot(s.dst, k_.real, "remote_shared_load");
    int32_t i = expr(s.index.get());
    int32_t c = expr(s.cta.get());
    code_.ins.push_back({Op::remote_load, d, i, s.region, c});
  }
  void visit_remote_shared_push(const Stmt& s) {
    need(k_.ctas_per_cluster > 1, "remote shared push in a kernel without clusters");
    need(s.region >= 0 && s.region < int(k_.shared.size()) && k_.shared[s.region].pushes > 0,
         "remote shared push into a region that is not an exchange region");
    need(s.index && is_int(s.index->type) && s.cta && s.cta->type == Type::i32,
         "remote shared push needs an integer index and an i32 rank");
    int32_t v = reg_slot(s.src, k_.real, "remote_shared_push");
    int32_t i = expr(s.index.get());
    int32_t c = expr(s.cta.get());
    code_.ins.push_back({Op::push, v, i, s.region, c});
  }
  void visit_exchange_wait(const Stmt& s) {
    need(s.region >= 0 && s.region < int(k_.shared.size()) && k_.shared[s.region].pushes > 0,
         "exchange wait on a region that is not an exchange region");
    int32_t l = label("exchange wait of '" + k_.shared[s.region].name + "'");
    code_.ins.push_back({Op::exchange_wait, 0, l, s.region});
  }
  void visit_async_copy(const Stmt& s) {
    need(s.region >= 0 && s.region < int(k_.staged.size()), "async copy into a staged region that does not exist");
    need(s.buffer >= 0 && s.buffer < int(k_.buffers.size()), "async copy from a buffer that does not exist");
    need(k_.buffers[s.buffer].dtype == k_.staged[s.region].dtype, "async copy from buffer '", k_.buffers[s.buffer].name,
         "' into staged region '", k_.staged[s.region].name, "' of another dtype");
    need(s.width >= 1, "async copy of width ", s.width);
    need(s.at && s.index && s.valid && s.aligned && s.at->type == Type::i64 && is_int(s.index->type) &&
             is_int(s.valid->type) && s.aligned->type == Type::b1,
         "async copy needs an i64 offset, integer index and valid, and a b1 alignment condition");
    StagedOp op{{s.buffer, s.width, false, false, s.whole, k_.real == Type::f64, 0.0f, 0, 0, 0, 0}, s.region, 0};
    op.at = expr(s.at.get());
    op.m.index = expr(s.index.get());
    op.m.valid = expr(s.valid.get());
    op.m.aligned = expr(s.aligned.get());
    code_.ins.push_back({Op::async_copy, 0, int32_t(code_.staged.size())});
    code_.staged.push_back(op);
  }
  void visit_async_commit(const Stmt&) { code_.ins.push_back({Op::async_commit}); }
  void visit_async_wait(const Stmt& s) {
    need(s.offset >= 0, "async wait leaving ", s.offset, " groups in flight");
    code_.ins.push_back({Op::async_wait, 0, s.offset});
  }
  void visit_staged_load(const Stmt& s) {
    need(s.region >= 0 && s.region < int(k_.staged.size()), "staged load from a staged region that does not exist");
    need(s.width >= 1 && int(s.dsts.size()) == s.width, "staged load width does not match its registers");
    need(s.at && s.valid && s.at->type == Type::i64 && is_int(s.valid->type),
         "staged load needs an i64 offset and an integer valid");
    StagedOp op{
        {-1, s.width, false, false, s.whole, k_.real == Type::f64, s.fill, 0, 0, 0, int32_t(code_.lists.size())},
        s.region,
        0};
    for (int r : s.dsts) code_.lists.push_back(reg_slot(r, k_.real, "a staged load"));
    op.at = expr(s.at.get());
    op.m.valid = expr(s.valid.get());
    code_.ins.push_back({Op::staged_load, 0, int32_t(code_.staged.size())});
    code_.staged.push_back(op);
  }
  void visit_barrier(const Stmt& s) {
    need(s.scope == Scope::group || s.scope == Scope::program || (s.scope == Scope::cluster && k_.ctas_per_cluster > 1),
         "barrier of scope ", scope_name(s.scope), ", which the executor does not run in a kernel of ",
         k_.ctas_per_cluster, " group(s) per cluster");
    if (s.scope == Scope::cluster && s.phase == ir::BarrierPhase::arrive) {
      code_.ins.push_back({Op::cluster_arrive});
      return;
    }
    const Op op = s.scope == Scope::group     ? Op::group_barrier
                  : s.scope == Scope::program ? Op::program_barrier
                  : s.phase == ir::BarrierPhase::wait ? Op::cluster_wait
                                                      : Op::cluster_barrier;
    int& n = s.scope == Scope::group ? group_barriers_ : s.scope == Scope::program ? program_barriers_ : cluster_barriers_;
    int32_t l = label(std::string(scope_name(s.scope)) + (op == Op::cluster_wait ? " wait #" : " barrier #") +
                      std::to_string(n++));
    code_.ins.push_back({op, 0, l});
  }
  void visit_if(const Stmt& s) {
    need(s.cond && s.cond->type == Type::b1, "if condition must be b1");
    int32_t c = expr(s.cond.get());
    int32_t br = here();
    code_.ins.push_back({Op::branch_false, 0, c});
    visit_block(s.body);
    if (!s.else_body.empty()) {
      int32_t j = here();
      code_.ins.push_back({Op::jump});
      code_.ins[br].b = here();
      visit_block(s.else_body);
      code_.ins[j].a = here();
    } else {
      code_.ins[br].b = here();
    }
  }
  void visit_for(const Stmt& s) {
    need(s.dst >= 0 && s.dst < int(k_.regs.size()) && is_int(k_.regs[s.dst].type),
         "for_ variable must be an integer register");
    Type t = k_.regs[s.dst].type;
    need(s.begin && s.end && s.begin->type == t && s.end->type == t, "for_ bounds must have the variable's type");
    expr(s.begin.get(), s.dst);
    int32_t top = here();
    temps_ = 0;
    int32_t e = expr(s.end.get());  // re-evaluated every iteration, as C does
    int32_t c = temp();
    code_.ins.push_back({Op::ilt, c, s.dst, e});
    int32_t br = here();
    code_.ins.push_back({Op::branch_false, 0, c});
    visit_block(s.body);
    code_.ins.push_back({t == Type::i32 ? Op::inc32 : Op::inc64, s.dst});
    code_.ins.push_back({Op::jump, 0, top});
    code_.ins[br].b = here();
  }
  void visit_comment(const Stmt&) {}

  const ir::Kernel& k_;
  Code code_;
  std::map<std::pair<int, int64_t>, int32_t> const_slots_;
  int32_t temp_base_ = 0, temps_ = 0, max_temps_ = 0;
  int shfls_ = 0, group_barriers_ = 0, program_barriers_ = 0, cluster_barriers_ = 0;
};

class Runner {
 public:
  Runner(const ir::Kernel& k, const Code& code, const LaunchArgs& args)
      : k_(k),
        code_(code),
        args_(args),
        W_(k.workers_per_program),
        T_(k.threads_per_group()),
        C_(k.ctas_per_cluster),
        N_(C_ * T_),
        S_(code.num_slots),
        E_(k.shared_elems()),
        slots_(size_t(N_) * S_),
        pc_(N_),
        state_(N_),
        shared_(size_t(C_) * E_),
        logs_(shared_.size()),
        ggen_(C_),
        pgen_(size_t(C_) * k.programs_per_group),
        remote_reader_(C_, -1),
        received_(size_t(C_) * k.shared.size()),
        opened_(size_t(C_) * k.shared.size()),
        pushed_(shared_.size()),
        read_gen_(shared_.size()),
        waits_(size_t(N_) * k.shared.size()),
        known_(N_),
        arrivals_(N_),
        staged_(size_t(C_) * size_t(k.staged_bytes())),
        open_(N_),
        landed_(N_),
        open_copies_(N_),
        reg_init_(k.regs.size()) {
    for (size_t g = 0; g < k.staged.size(); ++g) {
      staged_first_.push_back(SE_);
      SE_ += k.staged[g].elems;
    }
    elems_.resize(size_t(C_) * size_t(SE_));
    for (size_t j = 0; j < k.regs.size(); ++j) {
      if (k.regs[j].type == Type::f32) reg_init_[j].f = std::numeric_limits<float>::quiet_NaN();
      if (k.regs[j].type == Type::f64) reg_init_[j].f64 = std::numeric_limits<double>::quiet_NaN();
    }
    if (k.real == Type::f64) shared_init_.f64 = std::numeric_limits<double>::quiet_NaN();
    else shared_init_.f = std::numeric_limits<float>::quiet_NaN();
    for (int t = 0; t < N_; ++t) {
      Slot* r = &slots_[size_t(t) * S_];
      for (auto [slot, v] : code.consts) r[slot] = v;
      for (size_t p = 0; p < k.params.size(); ++p) {
        Slot& v = r[code.param_base + p];
        const ScalarArg& a = args.params[p];
        switch (k.params[p].type) {
          case Type::f32: v.f = float(a.f); break;
          case Type::f64: v.f64 = a.f; break;
          case Type::i32: v.i = int32_t(a.i); break;
          case Type::i64: v.i = a.i; break;
          case Type::b1: v.i = a.i != 0; break;
        }
      }
    }
  }

  // Clusters run one after another; the groups of one cluster run together, so a cluster
  // barrier is released once every worker of every group of the cluster waits at it.
  ExecStats run() {
    for (cluster_ = 0; cluster_ < args_.groups / C_; ++cluster_) {
      start_cluster();
      for (;;) {
        for (int t = 0; t < N_; ++t)
          if (state_[t] == kReady) run_worker(t);
        if (release()) continue;
        if (std::all_of(state_.begin(), state_.end(), [](uint8_t s) { return s == kDone; })) break;
        diagnose();
      }
      check_exchanges();
    }
    return stats_;
  }

 private:
  enum : uint8_t { kReady, kWaiting, kDone };
  struct Read {
    int32_t worker;
    uint32_t pgen;
  };
  // Accesses to one shared slot (of one group) that matter: since the group's last barrier for
  // its own workers, since the cluster's last barrier for the other groups' remote reads.
  struct SlotLog {
    int32_t writer = -1;
    uint32_t w_ggen = 0, w_pgen = 0, w_cgen = 0, r_ggen = 0;
    std::vector<Read> reads;  // reads in group generation r_ggen, one entry per run of a worker
    int32_t remote_reader = -1;  // a worker of another group that read the slot in cluster
    uint32_t rr_cgen = 0;        // generation rr_cgen
  };

  // One element of a staged region in one group: the worker whose async copy wrote it (-1:
  // none), its async waits passed when it copied (pending while equal), read by it since.
  struct StagedElem {
    int32_t owner = -1;
    uint32_t wait = 0;
    bool read = false;
  };

  int cta(int t) const { return t / T_; }
  int64_t group_of(int t) const { return cluster_ * C_ + cta(t); }

  void start_cluster() {
    ++cgen_;  // invalidates every SlotLog entry of the previous cluster
    for (uint32_t& g : ggen_) ++g;
    std::fill(remote_reader_.begin(), remote_reader_.end(), -1);
    std::fill(shared_.begin(), shared_.end(), shared_init_);
    std::fill(received_.begin(), received_.end(), 0);
    std::fill(opened_.begin(), opened_.end(), 0u);
    std::fill(pushed_.begin(), pushed_.end(), 0u);
    std::fill(waits_.begin(), waits_.end(), 0u);
    std::fill(read_gen_.begin(), read_gen_.end(), 0u);
    std::fill(known_.begin(), known_.end(), 0u);
    std::fill(arrivals_.begin(), arrivals_.end(), 0);
    std::fill(staged_.begin(), staged_.end(), uint8_t(0xff));  // NaN bits; never read uncopied
    std::fill(elems_.begin(), elems_.end(), StagedElem{});
    std::fill(open_.begin(), open_.end(), 0u);
    std::fill(landed_.begin(), landed_.end(), 0u);
    std::fill(open_copies_.begin(), open_copies_.end(), uint8_t(0));
    std::fill(pc_.begin(), pc_.end(), 0);
    std::fill(state_.begin(), state_.end(), kReady);
    for (int t = 0; t < N_; ++t) {
      Slot* r = &slots_[size_t(t) * S_];
      std::copy(reg_init_.begin(), reg_init_.end(), r);
      Slot* sp = r + code_.special_base;
      const int lt = t % T_;
      sp[int(ir::Special::group_index)].i = group_of(t);
      sp[int(ir::Special::program_in_group)].i = lt / W_;
      sp[int(ir::Special::worker_in_program)].i = lt % W_;
      sp[int(ir::Special::warp_in_program)].i = (lt % W_) / 32;
      sp[int(ir::Special::lane)].i = lt % 32;
      sp[int(ir::Special::group_count)].i = args_.groups;
      sp[int(ir::Special::cta_in_cluster)].i = cta(t);
      sp[int(ir::Special::cluster_index)].i = cluster_;
    }
  }

  [[noreturn]] void fail(int t, const std::string& what) const {
    const int lt = t % T_;
    throw ExecutionError(what + ", by worker " + std::to_string(lt) + " (program " +
                         std::to_string(lt / W_) + ", lane " + std::to_string(lt % 32) +
                         ") of group " + std::to_string(group_of(t)) + " in kernel '" + k_.name + "'");
  }

  // Runs worker t until it waits at a barrier or shfl_xor, or finishes.
  void run_worker(int t) {
    Slot* r = &slots_[size_t(t) * S_];
    const Ins* code = code_.ins.data();
    int32_t pc = pc_[t];
    for (;; ++pc) {
      const Ins& in = code[pc];
      Slot& d = r[in.d];
#define A r[in.a]  // read lazily: some ops keep a jump target or table index in a / b
#define B r[in.b]
      switch (in.op) {
        case Op::mov: d = A; break;
        case Op::fneg: d.f = -A.f; break;
        case Op::fexp: d.f = std::exp(A.f); break;
        case Op::fexp2: d.f = std::exp2(A.f); break;
        case Op::flog: d.f = std::log(A.f); break;
        case Op::frsqrt: d.f = 1.0f / std::sqrt(A.f); break;
        case Op::fsqrt: d.f = std::sqrt(A.f); break;
        case Op::fabs: d.f = std::fabs(A.f); break;
        case Op::ftanh: d.f = std::tanh(A.f); break;
        case Op::fexponent: d.f = A.f == 0 || !std::isfinite(A.f) ? 0.0f : float(std::ilogb(A.f)); break;
        case Op::fldexp:
          d.f = std::isnan(B.f) ? B.f : std::ldexp(A.f, int(std::fmin(std::fmax(B.f, -1000.0f), 1000.0f)));
          break;
        case Op::dneg: d.f64 = -A.f64; break;
        case Op::dexp: d.f64 = std::exp(A.f64); break;
        case Op::dexp2: d.f64 = std::exp2(A.f64); break;
        case Op::dlog: d.f64 = std::log(A.f64); break;
        case Op::drsqrt: d.f64 = 1.0 / std::sqrt(A.f64); break;
        case Op::dsqrt: d.f64 = std::sqrt(A.f64); break;
        case Op::dabs: d.f64 = std::fabs(A.f64); break;
        case Op::dtanh: d.f64 = std::tanh(A.f64); break;
        case Op::dexponent: d.f64 = A.f64 == 0 || !std::isfinite(A.f64) ? 0.0 : double(std::ilogb(A.f64)); break;
        case Op::dldexp:  // the clamp is wide enough that every finite f64 over- or underflows past it
          d.f64 = std::isnan(B.f64) ? B.f64 : std::ldexp(A.f64, int(std::fmin(std::fmax(B.f64, -3000.0), 3000.0)));
          break;
        case Op::dadd: d.f64 = A.f64 + B.f64; break;
        case Op::dsub: d.f64 = A.f64 - B.f64; break;
        case Op::dmul: d.f64 = A.f64 * B.f64; break;
        case Op::ddiv: d.f64 = A.f64 / B.f64; break;
        case Op::drem: d.f64 = std::fmod(A.f64, B.f64); break;
        case Op::dmin: d.f64 = std::isnan(A.f64) || std::isnan(B.f64) ? std::numeric_limits<double>::quiet_NaN() : std::fmin(A.f64, B.f64); break;
        case Op::dmax: d.f64 = std::isnan(A.f64) || std::isnan(B.f64) ? std::numeric_limits<double>::quiet_NaN() : std::fmax(A.f64, B.f64); break;
        case Op::dlt: d.i = A.f64 < B.f64; break;
        case Op::dle: d.i = A.f64 <= B.f64; break;
        case Op::deq: d.i = A.f64 == B.f64; break;
        case Op::dne: d.i = A.f64 != B.f64; break;
        case Op::d_to_i32: d.i = f_to_int<int32_t>(A.f64); break;
        case Op::d_to_i64: d.i = f_to_int<int64_t>(A.f64); break;
        case Op::d_to_b1: d.i = A.f64 != 0.0; break;
        case Op::i_to_d: d.f64 = double(A.i); break;
        case Op::f_to_d: d.f64 = double(A.f); break;
        case Op::d_to_f: d.f = float(A.f64); break;
        case Op::fadd: d.f = A.f + B.f; break;
        case Op::fsub: d.f = A.f - B.f; break;
        case Op::fmul: d.f = A.f * B.f; break;
        case Op::fdiv: d.f = A.f / B.f; break;
        case Op::frem: d.f = std::fmod(A.f, B.f); break;
        // NaN-propagating, as the IR defines f32 min and max (PTX min.NaN / max.NaN).
        case Op::fmin: d.f = std::isnan(A.f) || std::isnan(B.f) ? std::numeric_limits<float>::quiet_NaN() : std::fmin(A.f, B.f); break;
        case Op::fmax: d.f = std::isnan(A.f) || std::isnan(B.f) ? std::numeric_limits<float>::quiet_NaN() : std::fmax(A.f, B.f); break;
        case Op::flt: d.i = A.f < B.f; break;
        case Op::fle: d.i = A.f <= B.f; break;
        case Op::feq: d.i = A.f == B.f; break;
        case Op::fne: d.i = A.f != B.f; break;
        case Op::neg32: d.i = int32_t(0u - uint32_t(A.i)); break;
        case Op::add32: d.i = int32_t(uint32_t(A.i) + uint32_t(B.i)); break;
        case Op::sub32: d.i = int32_t(uint32_t(A.i) - uint32_t(B.i)); break;
        case Op::mul32: d.i = int32_t(uint32_t(A.i) * uint32_t(B.i)); break;
        case Op::div32:  // operands are 32-bit, so the 64-bit quotient cannot trap
          if (B.i == 0) fail(t, "integer division by zero (i32 div)");
          d.i = int32_t(A.i / B.i);
          break;
        case Op::rem32:
          if (B.i == 0) fail(t, "integer division by zero (i32 rem)");
          d.i = int32_t(A.i % B.i);
          break;
        case Op::neg64: d.i = int64_t(0ull - uint64_t(A.i)); break;
        case Op::add64: d.i = int64_t(uint64_t(A.i) + uint64_t(B.i)); break;
        case Op::sub64: d.i = int64_t(uint64_t(A.i) - uint64_t(B.i)); break;
        case Op::mul64: d.i = int64_t(uint64_t(A.i) * uint64_t(B.i)); break;
        case Op::div64:
          if (B.i == 0) fail(t, "integer division by zero (i64 div)");
          d.i = B.i == -1 ? int64_t(0ull - uint64_t(A.i)) : A.i / B.i;
          break;
        case Op::rem64:
          if (B.i == 0) fail(t, "integer division by zero (i64 rem)");
          d.i = B.i == -1 ? 0 : A.i % B.i;
          break;
        case Op::iabs: d.i = A.i < 0 ? int64_t(0ull - uint64_t(A.i)) : A.i; break;
        case Op::imin: d.i = std::min(A.i, B.i); break;
        case Op::imax: d.i = std::max(A.i, B.i); break;
        case Op::ilt: d.i = A.i < B.i; break;
        case Op::ile: d.i = A.i <= B.i; break;
        case Op::ieq: d.i = A.i == B.i; break;
        case Op::ine: d.i = A.i != B.i; break;
        case Op::band: d.i = A.i & B.i; break;
        case Op::bor: d.i = A.i | B.i; break;
        case Op::bnot: d.i = !A.i; break;
        case Op::select: d = A.i ? B : r[in.c]; break;
        case Op::f_to_i32: d.i = f_to_int<int32_t>(A.f); break;
        case Op::f_to_i64: d.i = f_to_int<int64_t>(A.f); break;
        case Op::f_to_b1: d.i = A.f != 0.0f; break;
        case Op::i_to_f: d.f = float(A.i); break;
        case Op::i_to_i32: d.i = int32_t(A.i); break;
        case Op::i_to_b1: d.i = A.i != 0; break;
        case Op::unpack16: {
          uint32_t half = (uint32_t(A.i) >> (16 * in.c)) & 0xffffu;
          d.f = DType(in.b) == DType::bf16 ? bf16_bits_to_float(uint16_t(half)) : f16_bits_to_float(uint16_t(half));
          break;
        }
        case Op::row_aligned: {
          const BufferArg& buf = args_.buffers[in.b];
          uint64_t addr = uint64_t(reinterpret_cast<uintptr_t>(buf.data)) +
                          uint64_t(A.i) * uint64_t(dtype_size(k_.buffers[in.b].dtype));
          d.i = addr % uint64_t(in.c) == 0;
          break;
        }
        case Op::jump: pc = in.a - 1; break;
        case Op::branch_false:
          if (!A.i) pc = in.b - 1;
          break;
        case Op::inc32: d.i = int32_t(uint32_t(d.i) + 1u); break;
        case Op::inc64: ++d.i; break;
        case Op::load: load(t, r, code_.mem[in.a]); break;
        case Op::store: store(t, r, code_.mem[in.a]); break;
        // Shared slots hold whole register entries: the kernel's float type, f32 or f64.
        case Op::shared_load: d = shared_[shared_slot(t, in, A.i, false)]; break;
        case Op::shared_store: shared_[shared_slot(t, in, A.i, true)] = d; break;
        case Op::remote_load: d = shared_[remote_slot(t, in, A.i, r[in.c].i)]; break;
        case Op::push: push(t, in, A.i, r[in.c].i, d); break;
        case Op::cluster_arrive: ++arrivals_[t]; break;
        case Op::async_copy:
          async_copy(t, r, code_.staged[in.a]);
          break;
        case Op::async_commit:
          ++open_[t], open_copies_[t] = 0;
          break;
        case Op::async_wait:
          if (open_copies_[t]) ++open_[t], open_copies_[t] = 0;
          landed_[t] = std::max(landed_[t], open_[t] - std::min<uint32_t>(open_[t], uint32_t(in.a)));
          break;
        case Op::staged_load:
          staged_load(t, r, code_.staged[in.a]);
          break;
        case Op::cluster_wait:
        case Op::exchange_wait:
        case Op::shfl:
        case Op::group_barrier:
        case Op::program_barrier:
        case Op::cluster_barrier:
          pc_[t] = pc;
          state_[t] = kWaiting;
          return;
        case Op::halt:
          pc_[t] = pc;
          state_[t] = kDone;
          exited(t);
          return;
      }
#undef A
#undef B
    }
  }

  // CUDA's cvt.rzi: truncate toward zero, saturate, NaN -> 0.
  template <typename I, typename F>
  static int64_t f_to_int(F x) {
    if (std::isnan(x)) return 0;
    if (x <= F(std::numeric_limits<I>::min())) return std::numeric_limits<I>::min();
    if (x >= F(std::numeric_limits<I>::max())) return std::numeric_limits<I>::max();
    return I(x);
  }

  void check_element(int t, const MemOp& m, int64_t e, const char* what) const {
    const BufferArg& b = args_.buffers[m.buffer];
    if (e < b.lo || e >= b.hi)
      fail(t, std::string("out-of-bounds ") + what + " of buffer '" + k_.buffers[m.buffer].name +
                  "' element " + std::to_string(e) + " (accessible [" + std::to_string(b.lo) +
                  ", " + std::to_string(b.hi) + "))");
  }

  // True for the vector path; checks the alignment and bounds of the whole vector.
  bool vector_path(int t, const Slot* r, const MemOp& m, const char* what) const {
    int64_t index = r[m.index].i;
    if (!(r[m.aligned].i && r[m.valid].i >= m.width)) return false;
    const BufferArg& b = args_.buffers[m.buffer];
    DType dt = k_.buffers[m.buffer].dtype;
    uint64_t bytes = uint64_t(m.width) * dtype_size(dt);
    uint64_t addr =
        uint64_t(reinterpret_cast<uintptr_t>(b.data)) + uint64_t(index) * dtype_size(dt);
    if (addr % bytes != 0) {
      std::ostringstream os;
      os << "misaligned vector access: " << what << " of " << m.width << " x " << dtype_name(dt)
         << " at buffer '" << k_.buffers[m.buffer].name << "' element " << index << " (address 0x"
         << std::hex << addr << std::dec << ") is not aligned to " << bytes << " bytes";
      fail(t, os.str());
    }
    if (index < b.lo || index > b.hi - m.width)
      for (int j = 0; j < m.width; ++j) check_element(t, m, index + j, what);
    return true;
  }

  // A whole access outside the vector path: only valid <= 0 is allowed; a clamped load then
  // reads the vector ending at index + valid, whose values are discarded.
  void whole_miss(int t, const Slot* r, const MemOp& m, const char* what) {
    const int64_t index = r[m.index].i, valid = r[m.valid].i;
    if (valid > 0)
      fail(t, std::string("partial whole-vector ") + what + ": " + std::to_string(valid) + " of " +
                  std::to_string(m.width) + " elements of buffer '" + k_.buffers[m.buffer].name + "' in the row");
    if (!m.clamp || std::string(what) != "load") return;
    const BufferArg& b = args_.buffers[m.buffer];
    const DType dt = k_.buffers[m.buffer].dtype;
    const int64_t first = index + valid - m.width;
    const uint64_t bytes = uint64_t(m.width) * dtype_size(dt);
    if ((uint64_t(reinterpret_cast<uintptr_t>(b.data)) + uint64_t(first) * dtype_size(dt)) % bytes != 0)
      fail(t, "misaligned clamped whole-vector load of buffer '" + k_.buffers[m.buffer].name + "'");
    for (int j = 0; j < m.width; ++j) check_element(t, m, first + j, "load");
    ++stats_.vector_accesses;
    stats_.bytes_loaded += int64_t(bytes);
  }

  void load(int t, Slot* r, const MemOp& m) {
    const void* data = args_.buffers[m.buffer].data;
    const DType dt = k_.buffers[m.buffer].dtype;
    const int32_t* dst = &code_.lists[m.regs];
    const int64_t index = r[m.index].i, valid = r[m.valid].i;
    if (m.whole && valid < m.width) {
      whole_miss(t, r, m, "load");
      for (int j = 0; j < (m.raw ? m.width / 2 : m.width); ++j) {
        if (m.raw) r[dst[j]].i = 0;
        else if (!is_float(dt)) r[dst[j]].i = int64_t(m.fill);
        else if (m.f64) r[dst[j]].f64 = m.fill;
        else r[dst[j]].f = m.fill;
      }
      return;
    }
    if (m.raw) return load_raw(t, r, m, static_cast<const uint16_t*>(data), dst, index, valid);
    const bool ints = !is_float(dt);
    if (vector_path(t, r, m, "load")) {
      for (int j = 0; j < m.width; ++j) {
        if (ints) r[dst[j]].i = load_as_int(data, index + j, dt);
        else if (m.f64) r[dst[j]].f64 = load_as_double(data, index + j, dt);
        else r[dst[j]].f = load_as_float(data, index + j, dt);
      }
      ++(m.width > 1 ? stats_.vector_accesses : stats_.scalar_accesses);
      stats_.bytes_loaded += int64_t(m.width) * dtype_size(dt);
      return;
    }
    for (int j = 0; j < m.width; ++j) {
      Slot v{};
      if (ints) v.i = int64_t(m.fill);
      else if (m.f64) v.f64 = m.fill;
      else v.f = m.fill;
      if (m.clamp || j < valid) {
        int64_t e = int64_t(uint64_t(index) + (j < valid ? uint64_t(j) : uint64_t(valid) - 1));
        check_element(t, m, e, "load");
        Slot x{};
        if (ints) x.i = load_as_int(data, e, dt);
        else if (m.f64) x.f64 = load_as_double(data, e, dt);
        else x.f = load_as_float(data, e, dt);
        if (j < valid) v = x;
        ++stats_.scalar_accesses;
        stats_.bytes_loaded += dtype_size(dt);
      }
      r[dst[j]] = v;
    }
  }

  // Raw 16-bit load: element j's bits go to half j % 2 of register j / 2; unkept elements are 0.
  void load_raw(int t, Slot* r, const MemOp& m, const uint16_t* data, const int32_t* dst, int64_t index,
                int64_t valid) {
    uint32_t words[8] = {};
    if (vector_path(t, r, m, "load")) {
      for (int j = 0; j < m.width; ++j) words[j / 2] |= uint32_t(data[index + j]) << (16 * (j % 2));
      ++stats_.vector_accesses;
      stats_.bytes_loaded += int64_t(m.width) * 2;
    } else {
      for (int j = 0; j < m.width; ++j) {
        if (!(m.clamp || j < valid)) continue;
        int64_t e = int64_t(uint64_t(index) + (j < valid ? uint64_t(j) : uint64_t(valid) - 1));
        check_element(t, m, e, "load");
        if (j < valid) words[j / 2] |= uint32_t(data[e]) << (16 * (j % 2));
        ++stats_.scalar_accesses;
        stats_.bytes_loaded += 2;
      }
    }
    for (int w = 0; w < m.width / 2; ++w) r[dst[w]].i = int32_t(words[w]);
  }

  void store(int t, Slot* r, const MemOp& m) {
    void* data = args_.buffers[m.buffer].data;
    const DType dt = k_.buffers[m.buffer].dtype;
    const int32_t* src = &code_.lists[m.regs];
    const int64_t index = r[m.index].i, valid = r[m.valid].i;
    if (m.whole && valid < m.width) return whole_miss(t, r, m, "store");
    const bool ints = !is_float(dt);
    if (vector_path(t, r, m, "store")) {
      for (int j = 0; j < m.width; ++j) {
        if (ints) store_from_int(data, index + j, dt, r[src[j]].i);
        else if (m.f64) store_from_double(data, index + j, dt, r[src[j]].f64);
        else store_from_float(data, index + j, dt, r[src[j]].f);
      }
      ++(m.width > 1 ? stats_.vector_accesses : stats_.scalar_accesses);
      stats_.bytes_stored += int64_t(m.width) * dtype_size(dt);
      return;
    }
    for (int j = 0; j < m.width && j < valid; ++j) {
      check_element(t, m, index + j, "store");
      if (ints) store_from_int(data, index + j, dt, r[src[j]].i);
      else if (m.f64) store_from_double(data, index + j, dt, r[src[j]].f64);
      else store_from_float(data, index + j, dt, r[src[j]].f);
      ++stats_.scalar_accesses;
      stats_.bytes_stored += dtype_size(dt);
    }
  }

  // Element e of staged region op.region in t's group: its state, after the bounds check.
  StagedElem& staged_elem(int t, const StagedOp& op, int64_t e, const char* what) {
    const ir::StagedRegion& reg = k_.staged[op.region];
    if (e < 0 || e >= reg.elems)
      fail(t, std::string("out-of-bounds ") + what + " staged region '" + reg.name + "' element " + std::to_string(e) +
                  " (size " + std::to_string(reg.elems) + ")");
    return elems_[size_t(cta(t)) * size_t(SE_) + size_t(staged_first_[op.region] + e)];
  }
  uint8_t* staged_data(int t, const StagedOp& op) {
    return &staged_[size_t(cta(t)) * size_t(k_.staged_bytes()) + size_t(k_.staged_offset(op.region))];
  }
  // A vector access to staged memory is words of at most 16 bytes, each aligned to its size.
  void staged_vector(int t, const StagedOp& op, int64_t at, const char* what) const {
    const ir::StagedRegion& reg = k_.staged[op.region];
    const int64_t bytes = std::min<int64_t>(16, int64_t(op.m.width) * dtype_size(reg.dtype));
    const int64_t byte = k_.staged_offset(op.region) + at * dtype_size(reg.dtype);
    if (byte % bytes != 0)
      fail(t, std::string("misaligned vector ") + what + " staged region '" + reg.name + "' element " +
                  std::to_string(at) + " (byte " + std::to_string(byte) + " of staged memory) is not aligned to " +
                  std::to_string(bytes) + " bytes");
  }

  // Writes the elements j < min(width, valid) at once, pending for t until its next async wait.
  void async_copy(int t, const Slot* r, const StagedOp& op) {
    const MemOp& m = op.m;
    const ir::StagedRegion& reg = k_.staged[op.region];
    const int es = dtype_size(reg.dtype);
    const int64_t at = r[op.at].i, index = r[m.index].i;
    const int64_t n = std::clamp<int64_t>(r[m.valid].i, 0, m.width);
    const bool vector = vector_path(t, r, m, "async copy");
    if (m.whole && !vector) return whole_miss(t, r, m, "async copy");
    if (vector) staged_vector(t, op, at, "async copy into");
    const uint8_t* src = static_cast<const uint8_t*>(args_.buffers[m.buffer].data);
    uint8_t* dst = staged_data(t, op);
    for (int64_t j = 0; j < n; ++j) {
      if (!vector) check_element(t, m, index + j, "async copy");
      StagedElem& el = staged_elem(t, op, at + j, "async copy into");
      // The element's name only for an error: the loop runs once a copied element.
      auto where = [&] { return "staged region '" + reg.name + "' element " + std::to_string(at + j); };
      if (el.owner >= 0 && el.owner != t)
        fail(t, "async copy into " + where() + ", which worker " + std::to_string(el.owner % T_) +
                    " copied (each staged element belongs to one worker)");
      if (el.owner == t && el.wait >= landed_[t])
        fail(t, "second async copy into " + where() +
                    " before the first landed (the two copies may land in either order)");
      if (el.owner == t && el.read)
        fail(t, "async copy into " + where() +
                    " after this worker read it (the asynchronous write would race with the read)");
      std::memcpy(dst + (at + j) * es, src + (index + j) * es, size_t(es));
      el = {t, open_[t], false};
      open_copies_[t] = 1;
    }
    if (vector)
      ++(m.width > 1 ? stats_.vector_accesses : stats_.scalar_accesses);
    else
      stats_.scalar_accesses += n;
    stats_.bytes_loaded += n * es;
  }

  // Reads the elements j < min(width, valid), which t must have copied and waited for.
  void staged_load(int t, Slot* r, const StagedOp& op) {
    const MemOp& m = op.m;
    const ir::StagedRegion& reg = k_.staged[op.region];
    const int32_t* dst = &code_.lists[m.regs];
    const int64_t at = r[op.at].i, valid = r[m.valid].i;
    if (m.whole && valid > 0 && valid < m.width)
      fail(t, "partial whole-vector staged load: " + std::to_string(valid) + " of " + std::to_string(m.width) +
                  " elements of staged region '" + reg.name + "' in the row");
    if (valid >= m.width) staged_vector(t, op, at, "staged load from");
    const uint8_t* data = staged_data(t, op);
    for (int j = 0; j < m.width; ++j) {
      Slot& v = r[dst[j]];
      if (j >= valid) {
        if (m.f64)
          v.f64 = m.fill;
        else
          v.f = m.fill;
        continue;
      }
      StagedElem& el = staged_elem(t, op, at + j, "staged load from");
      auto where = [&] { return "staged region '" + reg.name + "' element " + std::to_string(at + j); };
      if (el.owner < 0) fail(t, "staged load of " + where() + ", which no async copy wrote");
      if (el.owner != t || el.wait >= landed_[t])
        throw ExecutionError("data race on " + where() + ": worker " + std::to_string(t % T_) + " of group " +
                             std::to_string(group_of(t)) +
                             (el.owner != t ? " reads it, but worker " + std::to_string(el.owner % T_) +
                                                  " copied it (a worker reads only the elements it copied)"
                                            : " reads it before an async wait saw its copy land (it may not have)") +
                             ", in kernel '" + k_.name + "'");
      el.read = true;
      if (m.f64)
        v.f64 = load_as_double(data, at + j, reg.dtype);
      else
        v.f = load_as_float(data, at + j, reg.dtype);
    }
  }

  // An access by `a` (program generation a_pgen at the time) happens before the current one
  // by t of the same group iff a == t, or a barrier both passed lies between them.
  bool ordered(int32_t a, uint32_t a_ggen, uint32_t a_pgen, int t) const {
    return a == t || a_ggen != ggen_[cta(t)] || (a / W_ == t / W_ && a_pgen != pgen_[a / W_]);
  }

  [[noreturn]] void race(int t, const Ins& in, int64_t slot, int32_t a, bool a_wrote,
                         bool wrote) const {
    const ir::SharedRegion& reg = k_.shared[in.b];
    auto who = [&](int32_t w) {
      return "worker " + std::to_string(w % T_) + (C_ > 1 ? " of group " + std::to_string(group_of(w)) : std::string());
    };
    const bool remote = cta(a) != cta(t);
    throw ExecutionError("data race on shared region '" + reg.name + "' slot " +
                         std::to_string(slot % std::max(E_, 1)) + ": " + who(a) + (a_wrote ? " write" : remote ? " remote read" : " read") +
                         " and " + who(t) + (wrote ? " write" : " read") + " with no " +
                         (remote ? "cluster " : "") + "barrier between them, in " +
                         (C_ > 1 ? "cluster " + std::to_string(cluster_) : "group " + std::to_string(group_of(t))) +
                         " of kernel '" + k_.name + "'");
  }

  // Checks the index and the access against earlier ones, records it, returns the slot.
  size_t shared_slot(int t, const Ins& in, int64_t i, bool write, int owner = -1) {
    const ir::SharedRegion& reg = k_.shared[in.b];
    if (i < 0 || i >= reg.elems)
      fail(t, std::string("out-of-bounds shared ") + (write ? "store" : "load") + " of region '" +
                  reg.name + "' index " + std::to_string(i) + " (size " +
                  std::to_string(reg.elems) + ")");
    const int c = owner >= 0 ? owner : cta(t);
    const int p = (t % T_) / W_;
    const size_t slot = size_t(c) * E_ + size_t(reg.base) + size_t(p) * reg.program_stride + size_t(i);
    if (reg.pushes > 0) {  // an exchange region: written by pushes only, read after the wait
      if (write || c != cta(t)) fail(t, std::string(write ? "shared store into" : "remote load of") + " exchange region '" + reg.name + "'");
      // The worker reads the phase it last waited for: the slot must hold that phase's push.
      const uint32_t phase = waits_[size_t(t) * k_.shared.size() + size_t(in.b)];
      if (phase == 0)
        throw ExecutionError("data race on exchange region '" + reg.name + "' slot " + std::to_string(i) + ": worker " +
                             std::to_string(t % T_) + " of group " + std::to_string(group_of(t)) +
                             " reads it before its exchange wait, in cluster " + std::to_string(cluster_) +
                             " of kernel '" + k_.name + "'");
      if (pushed_[slot] != phase)
        throw ExecutionError("data race on exchange region '" + reg.name + "' slot " + std::to_string(i) + ": worker " +
                             std::to_string(t % T_) + " of group " + std::to_string(group_of(t)) + " reads phase " +
                             std::to_string(phase - 1) + " of it, which holds " +
                             (pushed_[slot] > phase
                                  ? "the push of phase " + std::to_string(pushed_[slot] - 1) +
                                        " (no cluster barrier between this phase's reads and the next one's pushes)"
                                  : std::string("no push of that phase")) +
                             ", in cluster " + std::to_string(cluster_) + " of kernel '" + k_.name + "'");
      read_gen_[slot] = std::max(read_gen_[slot], uint32_t(arrivals_[t] + 1));  // the arrive that orders this read
      return slot;
    }
    SlotLog& log = logs_[slot];
    if (c != cta(t)) {  // a remote read: ordered only by a cluster barrier
      if (log.writer >= 0 && log.w_cgen == cgen_) race(t, in, int64_t(slot), log.writer, true, false);
      log.remote_reader = t;
      log.rr_cgen = cgen_;
      remote_reader_[c] = t;
      return slot;
    }
    if (log.writer >= 0 && !ordered(log.writer, log.w_ggen, log.w_pgen, t))
      race(t, in, int64_t(slot), log.writer, true, write);
    if (log.r_ggen != ggen_[c]) {
      log.reads.clear();
      log.r_ggen = ggen_[c];
    }
    if (write) {
      if (log.remote_reader >= 0 && log.rr_cgen == cgen_) race(t, in, int64_t(slot), log.remote_reader, false, true);
      for (const Read& rd : log.reads)
        if (!ordered(rd.worker, ggen_[c], rd.pgen, t))
          race(t, in, int64_t(slot), rd.worker, false, true);
      log.reads.clear();
      log.writer = t;
      log.w_ggen = ggen_[c];
      log.w_pgen = pgen_[t / W_];
      log.w_cgen = cgen_;
    } else if (!log.reads.empty() && log.reads.back().worker == t) {
      log.reads.back().pgen = pgen_[t / W_];  // a later read by the same worker covers the earlier
    } else {
      log.reads.push_back({t, pgen_[t / W_]});
    }
    return slot;
  }

  // A read of this program's copy of a region in the cluster's group of rank `rank`; a read of
  // the worker's own group is an ordinary shared load.
  size_t remote_slot(int t, const Ins& in, int64_t i, int64_t rank) {
    if (rank < 0 || rank >= C_)
      fail(t, "remote shared load of region '" + k_.shared[in.b].name + "' from rank " + std::to_string(rank) +
                  ", outside the cluster of " + std::to_string(C_) + " groups");
    if (rank != cta(t) && cta_done(int(rank)))
      fail(t, "remote shared load of region '" + k_.shared[in.b].name + "' from group " +
                  std::to_string(cluster_ * C_ + rank) +
                  ", which has exited (a cluster barrier must follow the last remote read)");
    ++stats_.remote_loads;
    return shared_slot(t, in, i, false, int(rank));
  }

  // A push into the exchange region of the group of rank `rank`: every slot once, no more
  // pushes than the region awaits, none into a group that has exited.
  void push(int t, const Ins& in, int64_t i, int64_t rank, const Slot& v) {
    const ir::SharedRegion& reg = k_.shared[in.b];
    if (rank < 0 || rank >= C_)
      fail(t, "remote shared push into region '" + reg.name + "' of rank " + std::to_string(rank) +
                  ", outside the cluster of " + std::to_string(C_) + " groups");
    if (i < 0 || i >= reg.elems)
      fail(t, "out-of-bounds remote shared push into region '" + reg.name + "' index " + std::to_string(i) + " (size " +
                  std::to_string(reg.elems) + ")");
    if (cta_done(int(rank)))
      fail(t, "remote shared push into region '" + reg.name + "' of group " + std::to_string(cluster_ * C_ + rank) +
                  ", which has exited");
    const int p = (t % T_) / W_;
    const size_t slot = size_t(rank) * E_ + size_t(reg.base) + size_t(p) * reg.program_stride + size_t(i);
    // The pusher's phase: the waits of this region it passed. The receiver's open phase must be
    // that one (an earlier one still open would count this push early).
    const size_t at = size_t(rank) * k_.shared.size() + size_t(in.b);
    const uint32_t phase = waits_[size_t(t) * k_.shared.size() + size_t(in.b)];
    if (phase != opened_[at])
      fail(t, "remote shared push of phase " + std::to_string(phase) + " into exchange region '" + reg.name +
                  "' of group " + std::to_string(cluster_ * C_ + rank) + ", whose open phase is " +
                  std::to_string(opened_[at]) +
                  " (a cluster barrier must retire each phase before the next one's pushes)");
    if (pushed_[slot] == phase + 1)
      fail(t, "second remote shared push into slot " + std::to_string(i) + " of exchange region '" + reg.name +
                  "' of group " + std::to_string(cluster_ * C_ + rank) + " (each slot takes one push a phase)");
    // The slot's last reads must lie before a cluster arrive whose barrier this worker waited for.
    if (read_gen_[slot] > known_[t])
      throw ExecutionError("data race on exchange region '" + reg.name + "' slot " + std::to_string(i) + " of group " +
                           std::to_string(cluster_ * C_ + rank) + ": worker " + std::to_string(t % T_) + " of group " +
                           std::to_string(group_of(t)) + " pushes phase " + std::to_string(phase) +
                           " with no cluster barrier after that group's reads of phase " + std::to_string(phase - 1) +
                           ", in cluster " + std::to_string(cluster_) + " of kernel '" + k_.name + "'");
    int& n = received_[at];
    if (++n > reg.pushes)
      fail(t, "more remote shared pushes into exchange region '" + reg.name + "' of group " +
                  std::to_string(cluster_ * C_ + rank) + " than the " + std::to_string(reg.pushes) + " it awaits");
    pushed_[slot] = phase + 1;
    shared_[slot] = v;
    ++stats_.remote_pushes;
  }

  // Every exchange region of every group had each phase's pushes waited for by the cluster's
  // end (a group that skipped its wait would otherwise pass unnoticed).
  void check_exchanges() const {
    for (int c = 0; c < C_; ++c)
      for (size_t g = 0; g < k_.shared.size(); ++g) {
        const int want = k_.shared[g].pushes, got = received_[size_t(c) * k_.shared.size() + g];
        if (want > 0 && got != 0)
          throw ExecutionError("exchange region '" + k_.shared[g].name + "' of group " +
                               std::to_string(cluster_ * C_ + c) + " received " + std::to_string(got) + " of its " +
                               std::to_string(want) + " pushes of phase " +
                               std::to_string(opened_[size_t(c) * k_.shared.size() + g]) +
                               " without a wait for them by the end of kernel '" + k_.name + "'");
      }
  }

  bool cta_done(int c) const {
    for (int t = c * T_; t < (c + 1) * T_; ++t)
      if (state_[t] != kDone) return false;
    return true;
  }
  // Worker t finished: when its whole group has, no other group may still be reading its
  // shared memory, unless a cluster barrier lies between those reads and now.
  void exited(int t) {
    const int c = cta(t);
    if (C_ == 1 || remote_reader_[c] < 0 || !cta_done(c)) return;
    const int32_t r = remote_reader_[c];
    throw ExecutionError("group " + std::to_string(group_of(t)) + " exited while worker " + std::to_string(r % T_) +
                         " of group " + std::to_string(group_of(r)) +
                         " read its shared memory with no cluster barrier between them (the read may come after the "
                         "exit), in kernel '" + k_.name + "'");
  }

  bool all_waiting_at(int begin, int end, int32_t pc) const {
    for (int t = begin; t < end; ++t)
      if (state_[t] != kWaiting || pc_[t] != pc) return false;
    return true;
  }
  void resume(int begin, int end) {
    for (int t = begin; t < end; ++t) {
      ++pc_[t];
      state_[t] = kReady;
    }
  }

  // Releases every complete shuffle and barrier; false when none was.
  bool release() {
    bool any = false;
    const std::vector<Ins>& code = code_.ins;
    // A cluster wait releases each worker on its own once every worker of the cluster has
    // arrived as often. It orders no shared accesses here (the race checks stay conservative).
    for (int t = 0; t < N_; ++t) {
      if (state_[t] != kWaiting || code[pc_[t]].op != Op::cluster_wait) continue;
      bool all = true;
      for (int u = 0; u < N_ && all; ++u) all = arrivals_[u] >= arrivals_[t];
      if (!all) continue;
      known_[t] =
          uint32_t(arrivals_[t]);  // every worker's accesses before its arrival that many are ordered before t's
      resume(t, t + 1);
      any = true;
    }
    // An exchange wait releases each worker on its own, once its group has every push.
    for (int t = 0; t < N_; ++t) {
      if (state_[t] != kWaiting || code[pc_[t]].op != Op::exchange_wait) continue;
      // The worker's phase completes with its pushes (the first of its group's workers to pass
      // closes it); a later worker of the group passes a completed phase at once.
      const int region = code[pc_[t]].b;
      const size_t at = size_t(cta(t)) * k_.shared.size() + size_t(region);
      uint32_t& mine = waits_[size_t(t) * k_.shared.size() + size_t(region)];
      if (mine == opened_[at]) {
        if (received_[at] < k_.shared[region].pushes) continue;
        ++opened_[at], received_[at] = 0;
      }
      ++mine;
      resume(t, t + 1);
      any = true;
    }
    for (int c = 0; c < C_; ++c)
      for (int l0 = 0; l0 < T_; l0 += 32) {
        const int w0 = c * T_ + l0, n = std::min(32, T_ - l0);
        const int32_t pc = pc_[w0];
        if (state_[w0] != kWaiting || code[pc].op != Op::shfl || !all_waiting_at(w0, w0 + n, pc))
          continue;
        const Ins& in = code[pc];
        const int offset = in.b & 255, width = (in.b >> 8) & 255;
        const bool idx = (in.b & kShflIdx) != 0;
        Slot src[32];
        for (int l = 0; l < n; ++l) src[l] = slots_[size_t(w0 + l) * S_ + in.a];
        for (int l = 0; l < n; ++l) {
          int j = idx ? (l & ~(width - 1)) | offset : l ^ offset;
          if (!idx && j > (l | (width - 1))) j = l;  // a later segment: own value (PTX shfl.bfly)
          if (j >= n)
            fail(w0 + l, code_.labels[in.c] + " reads lane " + std::to_string(j) + " of a warp of " +
                             std::to_string(n) + " lanes");
          slots_[size_t(w0 + l) * S_ + in.d] = src[j];
        }
        resume(w0, w0 + n);
        ++stats_.shuffles;
        any = true;
      }
    for (size_t p = 0; p < pgen_.size(); ++p) {
      const int b = int(p) * W_;
      const int32_t pc = pc_[b];
      if (state_[b] != kWaiting || code[pc].op != Op::program_barrier ||
          !all_waiting_at(b, b + W_, pc))
        continue;
      ++pgen_[p];
      resume(b, b + W_);
      ++stats_.barriers;
      any = true;
    }
    for (int c = 0; c < C_; ++c) {
      const int b = c * T_;
      if (state_[b] == kWaiting && code[pc_[b]].op == Op::group_barrier && all_waiting_at(b, b + T_, pc_[b])) {
        ++ggen_[c];
        resume(b, b + T_);
        ++stats_.barriers;
        any = true;
      }
    }
    // A cluster barrier synchronises every worker of the cluster: it orders the groups' own
    // accesses as a group barrier does, and remote reads against their owners' writes.
    if (state_[0] == kWaiting && code[pc_[0]].op == Op::cluster_barrier && all_waiting_at(0, N_, pc_[0])) {
      ++cgen_;
      for (uint32_t& g : ggen_) ++g;
      for (uint32_t& g : pgen_) ++g;
      std::fill(remote_reader_.begin(), remote_reader_.end(), -1);
      for (int t = 0; t < N_; ++t) known_[t] = uint32_t(++arrivals_[t]);  // a whole barrier: an arrival and its wait
      resume(0, N_);
      ++stats_.barriers;
      any = true;
    }
    return any;
  }

  // No worker can proceed: names the first waiting worker's sync point and who did not come.
  [[noreturn]] void diagnose() const {
    int t0 = 0;
    while (state_[t0] != kWaiting) ++t0;
    const Ins& in = code_.ins[pc_[t0]];
    const int c0 = cta(t0);
    int begin = c0 * T_, end = begin + T_;
    if (in.op == Op::program_barrier) begin = t0 / W_ * W_, end = begin + W_;
    if (in.op == Op::shfl) begin = c0 * T_ + (t0 % T_) / 32 * 32, end = std::min(c0 * T_ + T_, begin + 32);
    if (in.op == Op::cluster_barrier || in.op == Op::cluster_wait) begin = 0, end = N_;
    // Workers are named by their index in their group (in their warp for a shuffle), per group.
    std::map<int64_t, std::vector<int>> finished;                     // group -> workers
    std::map<int32_t, std::map<int64_t, std::vector<int>>> elsewhere;  // label -> group -> workers
    for (int t = begin; t < end; ++t) {
      const int id = in.op == Op::shfl ? t - begin : t % T_;
      if (state_[t] == kDone)
        finished[group_of(t)].push_back(id);
      else if (pc_[t] != pc_[t0]) {
        const Ins& o = code_.ins[pc_[t]];
        elsewhere[o.op == Op::shfl ? o.c : o.a][group_of(t)].push_back(id);
      }
    }
    if (in.op == Op::exchange_wait) {
      const ir::SharedRegion& reg = k_.shared[in.b];
      throw ExecutionError(code_.labels[in.a] + " in group " + std::to_string(group_of(t0)) + " never completes: " +
                           std::to_string(received_[size_t(c0) * k_.shared.size() + size_t(in.b)]) + " of its " +
                           std::to_string(reg.pushes) + " pushes arrived (kernel '" + k_.name + "')");
    }
    const bool many = in.op == Op::cluster_barrier || in.op == Op::cluster_wait;
    auto list = [&](const std::map<int64_t, std::vector<int>>& ws) {
      std::string out;
      for (const auto& [g, ids] : ws)
        out += (out.empty() ? "" : ", ") + ranges(ids) + (many ? " of group " + std::to_string(g) : std::string());
      return out;
    };
    std::string who = in.op == Op::shfl ? "lane(s) " : "worker(s) ";
    std::ostringstream os;
    if (in.op == Op::shfl)
      os << code_.labels[in.c] << " not reached by lanes of warp " << (t0 % T_) / 32 << " of group "
         << group_of(t0) << ": ";
    else
      os << code_.labels[in.a]
         << (in.op == Op::program_barrier ? " of program " + std::to_string((t0 % T_) / W_) : std::string())
         << (many ? " in cluster " + std::to_string(cluster_) : " in group " + std::to_string(group_of(t0)))
         << " skipped: ";
    if (!finished.empty()) os << who << list(finished) << " finished the kernel";
    bool first = finished.empty();
    for (const auto& [l, ws] : elsewhere) {
      os << (first ? "" : "; ") << who << list(ws) << " are waiting at " << code_.labels[l];
      first = false;
    }
    os << " (kernel '" << k_.name << "')";
    throw ExecutionError(os.str());
  }

  const ir::Kernel& k_;
  const Code& code_;
  const LaunchArgs& args_;
  const int W_, T_, C_, N_, S_, E_;  // workers per program, per group, groups per cluster,
                                     // workers per cluster, slots per worker, slots per group
  std::vector<Slot> slots_;  // (N_, S_)
  std::vector<int32_t> pc_;
  std::vector<uint8_t> state_;
  std::vector<Slot> shared_;  // (C_, E_)
  Slot shared_init_{};         // NaN of the kernel's float type
  std::vector<SlotLog> logs_;
  uint32_t cgen_ = 0;
  std::vector<uint32_t> ggen_;        // per group of the cluster
  std::vector<uint32_t> pgen_;        // per program of the cluster
  std::vector<int32_t> remote_reader_;  // per group: a worker of another group that read its
                                        // shared memory since the last cluster barrier, or -1
  std::vector<int> received_;       // (C_, regions): pushes of the open phase each group's exchange regions received
  std::vector<uint32_t> opened_;    // (C_, regions): the open phase (phases completed before it)
  std::vector<uint32_t> pushed_;    // per shared slot of the cluster: 1 + the phase of its last push (0: none)
  std::vector<uint32_t> read_gen_;  // per shared slot of the cluster: the cluster arrival that orders its last read
  std::vector<uint32_t> waits_;     // (N_, regions): exchange waits of the region the worker passed
  std::vector<uint32_t> known_;     // per worker: cluster arrivals of every worker its completed waits saw
  std::vector<int> arrivals_;     // per worker: cluster arrives so far
  std::vector<uint8_t> staged_;   // (C_, staged bytes): staged regions as stored, at staged_offset
  // Per worker: the group its async copies go to now (groups are numbered from 0 as they
  // open), and the groups before `landed_` have landed.
  std::vector<uint32_t> open_, landed_;
  std::vector<uint8_t> open_copies_;   // per worker: its open group holds a copy
  std::vector<int64_t> staged_first_;  // per staged region: its first element in elems_ of a group
  int64_t SE_ = 0;                     // staged elements per group
  std::vector<StagedElem> elems_;      // (C_, SE_)
  std::vector<Slot> reg_init_;  // NaN for f32 registers, 0 for the others
  int64_t cluster_ = 0;
  ExecStats stats_;
};

}  // namespace

ExecStats execute(const ir::Kernel& kernel, const LaunchArgs& args) {
  auto bad = [&](const std::string& what) {
    throw ExecutionError("cpu executor: kernel '" + kernel.name + "': " + what);
  };
  if (kernel.programs_per_group < 1 || kernel.workers_per_program < 1)
    bad("programs_per_group and workers_per_program must be positive");
  if (args.groups < 0) bad("negative group count " + std::to_string(args.groups));
  if (kernel.ctas_per_cluster < 1 || kernel.ctas_per_cluster > 16)
    bad("ctas_per_cluster " + std::to_string(kernel.ctas_per_cluster) + " outside [1, 16]");
  if (args.groups % kernel.ctas_per_cluster != 0)
    bad(std::to_string(args.groups) + " groups are not whole clusters of " + std::to_string(kernel.ctas_per_cluster));
  if (args.buffers.size() != kernel.buffers.size())
    bad("expected " + std::to_string(kernel.buffers.size()) + " buffers, got " +
        std::to_string(args.buffers.size()));
  if (args.params.size() != kernel.params.size())
    bad("expected " + std::to_string(kernel.params.size()) + " scalar parameters, got " +
        std::to_string(args.params.size()));
  const Code code = Compiler(kernel).run();
  return Runner(kernel, code, args).run();
}

std::string describe(const ExecStats& s) {
  return "loaded " + std::to_string(s.bytes_loaded) + " B, stored " +
         std::to_string(s.bytes_stored) + " B, " + std::to_string(s.vector_accesses) +
         " vector + " + std::to_string(s.scalar_accesses) + " scalar accesses, " +
         std::to_string(s.barriers) + " barriers, " + std::to_string(s.shuffles) + " shuffles" +
         (s.remote_loads ? ", " + std::to_string(s.remote_loads) + " remote shared loads" : "") +
         (s.remote_pushes ? ", " + std::to_string(s.remote_pushes) + " remote shared pushes" : "");
}

}  // namespace tile::cpu
