#include "ir/ir.hpp"

#include <algorithm>

namespace tile::ir {

const char* type_name(Type t) {
  switch (t) {
    case Type::f32: return "f32";
    case Type::i32: return "i32";
    case Type::i64: return "i64";
    case Type::b1: return "b1";
    case Type::f64: return "f64";
  }
  return "?";
}

const char* special_name(Special s) {
  switch (s) {
    case Special::group_index: return "group_index";
    case Special::program_in_group: return "program_in_group";
    case Special::worker_in_program: return "worker_in_program";
    case Special::warp_in_program: return "warp_in_program";
    case Special::lane: return "lane";
    case Special::group_count: return "group_count";
    case Special::cta_in_cluster: return "cta_in_cluster";
    case Special::cluster_index: return "cluster_index";
  }
  return "?";
}

const char* unop_name(UnOp op) {
  static const char* names[] = {"neg", "exp", "log", "rsqrt", "sqrt", "not", "exp2", "abs", "tanh", "exponent"};
  return names[int(op)];
}

const char* binop_name(BinOp op) {
  static const char* names[] = {"add", "sub", "mul", "div", "rem", "min", "max",
                                "lt",  "le",  "eq",  "ne",  "and", "or", "ldexp"};
  return names[int(op)];
}

namespace {
ExprPtr make(Expr e) { return std::make_shared<const Expr>(std::move(e)); }
bool is_comparison(BinOp op) {
  return op == BinOp::lt || op == BinOp::le || op == BinOp::eq || op == BinOp::ne;
}
}  // namespace

ExprPtr f32_const(double v) {
  Expr e{Expr::Kind::constant, Type::f32};
  e.f = v;
  return make(e);
}
ExprPtr f64_const(double v) {
  Expr e{Expr::Kind::constant, Type::f64};
  e.f = v;
  return make(e);
}
ExprPtr float_const(Type t, double v) { return t == Type::f64 ? f64_const(v) : f32_const(v); }
ExprPtr i32_const(int64_t v) {
  Expr e{Expr::Kind::constant, Type::i32};
  e.i = v;
  return make(e);
}
ExprPtr i64_const(int64_t v) {
  Expr e{Expr::Kind::constant, Type::i64};
  e.i = v;
  return make(e);
}
ExprPtr b1_const(bool v) {
  Expr e{Expr::Kind::constant, Type::b1};
  e.i = v;
  return make(e);
}
ExprPtr reg(int id, Type t) {
  Expr e{Expr::Kind::reg, t};
  e.id = id;
  return make(e);
}
ExprPtr special(Special s) {
  Expr e{Expr::Kind::special, s == Special::group_index || s == Special::group_count || s == Special::cluster_index ? Type::i64 : Type::i32};
  e.id = int(s);
  return make(e);
}
ExprPtr param(int id, Type t) {
  Expr e{Expr::Kind::param, t};
  e.id = id;
  return make(e);
}
ExprPtr unary(UnOp op, ExprPtr a) {
  Expr e{Expr::Kind::unary, a->type};
  e.unop = op;
  e.args = {std::move(a)};
  return make(e);
}
ExprPtr binary(BinOp op, ExprPtr a, ExprPtr b) {
  Expr e{Expr::Kind::binary, is_comparison(op) ? Type::b1 : a->type};
  e.binop = op;
  e.args = {std::move(a), std::move(b)};
  return make(e);
}
ExprPtr select(ExprPtr c, ExprPtr a, ExprPtr b) {
  Expr e{Expr::Kind::select, a->type};
  e.args = {std::move(c), std::move(a), std::move(b)};
  return make(e);
}
ExprPtr cast(Type t, ExprPtr a) {
  Expr e{Expr::Kind::cast, t};
  e.args = {std::move(a)};
  return make(e);
}
ExprPtr row_aligned(int buffer, ExprPtr offset, int bytes) {
  Expr e{Expr::Kind::row_aligned, Type::b1};
  e.id = buffer;
  e.i = bytes;
  e.args = {std::move(offset)};
  return make(e);
}

ExprPtr unpack16(DType dtype, ExprPtr word, int half) {
  Expr e{Expr::Kind::unpack16, Type::f32};
  e.id = int(dtype);
  e.i = half;
  e.args = {std::move(word)};
  return make(e);
}

int Kernel::shared_elems() const {
  int end = 0;
  for (const SharedRegion& r : shared)
    end = std::max(end, r.base + (programs_per_group - 1) * r.program_stride + r.elems);
  return end;
}

int Kernel::exchange_count() const {
  int n = 0;
  for (const SharedRegion& r : shared) n += r.pushes > 0;
  return n;
}

int64_t Kernel::staged_offset(int region) const {
  int64_t offset = 0;
  for (int r = 0; r < region; ++r)
    offset += (staged[size_t(r)].elems * dtype_size(staged[size_t(r)].dtype) + 15) / 16 * 16;
  return offset;
}

int Kernel::add_reg(std::string name, Type type, bool cached) {
  regs.push_back({std::move(name), type, cached});
  return int(regs.size()) - 1;
}

int Kernel::param_index(const std::string& name) const {
  for (size_t i = 0; i < params.size(); ++i)
    if (params[i].name == name) return int(i);
  return -1;
}

Stmt assign(int dst, ExprPtr value) {
  Stmt s{Stmt::Kind::assign};
  s.dst = dst;
  s.value = std::move(value);
  return s;
}
Stmt load(std::vector<int> dsts, int buffer, ExprPtr index, ExprPtr valid, ExprPtr aligned,
          bool clamp, float fill) {
  Stmt s{Stmt::Kind::load};
  s.width = int(dsts.size());
  s.dsts = std::move(dsts);
  s.buffer = buffer;
  s.index = std::move(index);
  s.valid = std::move(valid);
  s.aligned = std::move(aligned);
  s.clamp = clamp;
  s.fill = fill;
  return s;
}
Stmt load_raw(std::vector<int> words, int buffer, ExprPtr index, ExprPtr valid, ExprPtr aligned, bool clamp) {
  Stmt s = load(std::move(words), buffer, std::move(index), std::move(valid), std::move(aligned), clamp, 0.0f);
  s.raw = true;
  s.width = int(s.dsts.size()) * 2;
  return s;
}
Stmt store(std::vector<int> srcs, int buffer, ExprPtr index, ExprPtr valid, ExprPtr aligned) {
  Stmt s{Stmt::Kind::store};
  s.width = int(srcs.size());
  s.dsts = std::move(srcs);
  s.buffer = buffer;
  s.index = std::move(index);
  s.valid = std::move(valid);
  s.aligned = std::move(aligned);
  return s;
}
Stmt shfl_xor(int dst, int src, int offset, int width) {
  Stmt s{Stmt::Kind::shfl_xor};
  s.dst = dst;
  s.src = src;
  s.offset = offset;
  s.width = width;
  return s;
}
Stmt shfl_idx(int dst, int src, int lane, int width) {
  Stmt s = shfl_xor(dst, src, lane, width);
  s.kind = Stmt::Kind::shfl_idx;
  return s;
}
Stmt shared_store(int region, ExprPtr index, ExprPtr value) {
  Stmt s{Stmt::Kind::shared_store};
  s.region = region;
  s.index = std::move(index);
  s.value = std::move(value);
  return s;
}
Stmt shared_load(int dst, int region, ExprPtr index) {
  Stmt s{Stmt::Kind::shared_load};
  s.dst = dst;
  s.region = region;
  s.index = std::move(index);
  return s;
}
Stmt remote_shared_load(int dst, int region, ExprPtr index, ExprPtr cta) {
  Stmt s = shared_load(dst, region, std::move(index));
  s.kind = Stmt::Kind::remote_shared_load;
  s.cta = std::move(cta);
  return s;
}
Stmt remote_shared_push(int region, ExprPtr index, ExprPtr cta, int src) {
  Stmt s{Stmt::Kind::remote_shared_push};
  s.region = region;
  s.index = std::move(index);
  s.cta = std::move(cta);
  s.src = src;
  return s;
}
Stmt exchange_wait(int region) {
  Stmt s{Stmt::Kind::exchange_wait};
  s.region = region;
  return s;
}
Stmt async_copy(int region, ExprPtr at, int buffer, ExprPtr index, int width, ExprPtr valid, ExprPtr aligned) {
  Stmt s{Stmt::Kind::async_copy};
  s.region = region;
  s.at = std::move(at);
  s.buffer = buffer;
  s.index = std::move(index);
  s.width = width;
  s.valid = std::move(valid);
  s.aligned = std::move(aligned);
  return s;
}
Stmt async_commit() { return Stmt{Stmt::Kind::async_commit}; }
Stmt async_wait(int in_flight) {
  Stmt s{Stmt::Kind::async_wait};
  s.offset = in_flight;
  return s;
}
Stmt staged_load(std::vector<int> dsts, int region, ExprPtr at, ExprPtr valid, float fill) {
  Stmt s{Stmt::Kind::staged_load};
  s.width = int(dsts.size());
  s.dsts = std::move(dsts);
  s.region = region;
  s.at = std::move(at);
  s.valid = std::move(valid);
  s.fill = fill;
  return s;
}
Stmt barrier(Scope scope) {
  Stmt s{Stmt::Kind::barrier};
  s.scope = scope;
  return s;
}
Stmt cluster_arrive() {
  Stmt s = barrier(Scope::cluster);
  s.phase = BarrierPhase::arrive;
  return s;
}
Stmt cluster_wait() {
  Stmt s = barrier(Scope::cluster);
  s.phase = BarrierPhase::wait;
  return s;
}
Stmt if_(ExprPtr cond, std::vector<Stmt> body, std::vector<Stmt> else_body) {
  Stmt s{Stmt::Kind::if_};
  s.cond = std::move(cond);
  s.body = std::move(body);
  s.else_body = std::move(else_body);
  return s;
}
Stmt for_(int var, ExprPtr begin, ExprPtr end, std::vector<Stmt> body) {
  Stmt s{Stmt::Kind::for_};
  s.dst = var;
  s.begin = std::move(begin);
  s.end = std::move(end);
  s.body = std::move(body);
  return s;
}
Stmt comment(std::string text) {
  Stmt s{Stmt::Kind::comment};
  s.text = std::move(text);
  return s;
}

}  // namespace tile::ir
