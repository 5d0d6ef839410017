#include "ir/printer.hpp"

#include <cmath>
#include <functional>
#include <sstream>

namespace tile::ir {

std::string IRPrinter::reg_name(int id) const { return "%" + k_.regs[id].name; }

std::string IRPrinter::constant(const Expr& e) {
  std::ostringstream os;
  if (e.type == Type::f32) {
    if (std::isinf(e.f)) return e.f > 0 ? "inf" : "-inf";
    os << e.f;
  } else if (e.type == Type::b1) {
    os << (e.i ? "true" : "false");
  } else {
    os << e.i;
  }
  return os.str();
}

std::string IRPrinter::unary_expr(UnOp op, const std::string& a, Type) {
  return std::string(unop_name(op)) + "(" + a + ")";
}

std::string IRPrinter::binary_expr(BinOp op, const std::string& a, const std::string& b, Type) {
  switch (op) {
    case BinOp::add: return "(" + a + " + " + b + ")";
    case BinOp::sub: return "(" + a + " - " + b + ")";
    case BinOp::mul: return "(" + a + " * " + b + ")";
    case BinOp::div: return "(" + a + " / " + b + ")";
    case BinOp::rem: return "(" + a + " % " + b + ")";
    case BinOp::lt: return "(" + a + " < " + b + ")";
    case BinOp::le: return "(" + a + " <= " + b + ")";
    case BinOp::eq: return "(" + a + " == " + b + ")";
    case BinOp::ne: return "(" + a + " != " + b + ")";
    case BinOp::and_: return "(" + a + " && " + b + ")";
    case BinOp::or_: return "(" + a + " || " + b + ")";
    default: return std::string(binop_name(op)) + "(" + a + ", " + b + ")";
  }
}

std::string IRPrinter::cast_expr(Type to, const std::string& a) {
  return std::string(type_name(to)) + "(" + a + ")";
}

std::string IRPrinter::row_aligned_expr(int buffer, const std::string& offset, int bytes) {
  return "aligned(&" + k_.buffers[buffer].name + "[" + offset + "], " + std::to_string(bytes) + ")";
}

std::string IRPrinter::unpack16_expr(DType dtype, const std::string& word, int half) {
  return "unpack_" + std::string(dtype_name(dtype)) + (half ? "_hi(" : "_lo(") + word + ")";
}

std::string IRPrinter::expr(const Expr& e) {
  switch (e.kind) {
    case Expr::Kind::constant: return constant(e);
    case Expr::Kind::reg: return reg_name(e.id);
    case Expr::Kind::special: return special_value(Special(e.id));
    case Expr::Kind::param: return param_name(e.id);
    case Expr::Kind::unary: return unary_expr(e.unop, expr(*e.args[0]), e.type);
    case Expr::Kind::binary:
      return binary_expr(e.binop, expr(*e.args[0]), expr(*e.args[1]), e.args[0]->type);
    case Expr::Kind::select:
      return "(" + expr(*e.args[0]) + " ? " + expr(*e.args[1]) + " : " + expr(*e.args[2]) + ")";
    case Expr::Kind::cast: return cast_expr(e.type, expr(*e.args[0]));
    case Expr::Kind::row_aligned: return row_aligned_expr(e.id, expr(*e.args[0]), int(e.i));
    case Expr::Kind::unpack16: return unpack16_expr(DType(e.id), expr(*e.args[0]), int(e.i));
  }
  return "?";
}

namespace {
std::string reg_list(const IRPrinter*, const std::vector<int>& regs,
                     const std::function<std::string(int)>& name) {
  std::string out;
  for (size_t i = 0; i < regs.size(); ++i) out += (i ? ", " : "") + name(regs[i]);
  return out;
}
}  // namespace

void IRPrinter::print_load(const Stmt& s) {
  line("{" + reg_list(this, s.dsts, [&](int r) { return reg_name(r); }) + "} = load" +
       (s.raw ? ".raw" : "") + (s.clamp ? ".clamp" : "") + (s.whole ? ".whole" : "") + " " + k_.buffers[s.buffer].name + "[" + expr(*s.index) +
       " +: " + std::to_string(s.width) + "] valid " + expr(*s.valid) + " vector_if " +
       expr(*s.aligned) + " fill " + std::to_string(s.fill));
}

void IRPrinter::print_store(const Stmt& s) {
  line("store " + k_.buffers[s.buffer].name + "[" + expr(*s.index) + " +: " +
       std::to_string(s.width) + "] = {" + reg_list(this, s.dsts, [&](int r) { return reg_name(r); }) +
       "} valid " + expr(*s.valid) + " vector_if " + expr(*s.aligned));
}

void IRPrinter::print_shfl(const Stmt& s) {
  line(reg_name(s.dst) + " = shfl_xor(" + reg_name(s.src) + ", " + std::to_string(s.offset) +
       ", width " + std::to_string(s.width) + ")");
}

void IRPrinter::print_shared_store(const Stmt& s) {
  line("shared " + k_.shared[s.region].name + "[" + expr(*s.index) + "] = " + expr(*s.value));
}

void IRPrinter::print_shared_load(const Stmt& s) {
  line(reg_name(s.dst) + " = shared " + k_.shared[s.region].name + "[" + expr(*s.index) + "]");
}

void IRPrinter::print_barrier(const Stmt& s) {
  line(s.barrier == BarrierKind::group ? "barrier.group" : "barrier.program");
}

void IRPrinter::print_stmt(const Stmt& s) {
  switch (s.kind) {
    case Stmt::Kind::assign: line(reg_name(s.dst) + " = " + expr(*s.value) + statement_end()); break;
    case Stmt::Kind::load: print_load(s); break;
    case Stmt::Kind::store: print_store(s); break;
    case Stmt::Kind::shfl_xor: print_shfl(s); break;
    case Stmt::Kind::shared_store: print_shared_store(s); break;
    case Stmt::Kind::shared_load: print_shared_load(s); break;
    case Stmt::Kind::barrier: print_barrier(s); break;
    case Stmt::Kind::comment: line("// " + s.text); break;
    case Stmt::Kind::if_:
      line("if (" + expr(*s.cond) + ") {");
      print_block(s.body);
      if (!s.else_body.empty()) {
        line("} else {");
        print_block(s.else_body);
      }
      line("}");
      break;
    case Stmt::Kind::for_:
      line("for (" + reg_name(s.dst) + " = " + expr(*s.begin) + "; " + reg_name(s.dst) + " < " +
           expr(*s.end) + "; ++" + reg_name(s.dst) + ") {");
      print_block(s.body);
      line("}");
      break;
  }
}

void IRPrinter::print_block(const std::vector<Stmt>& body) {
  ++indent_;
  for (const Stmt& s : body) print_stmt(s);
  --indent_;
}

void IRPrinter::print_kernel() {
  std::string sig;
  for (const Buffer& b : k_.buffers)
    sig += std::string(sig.empty() ? "" : ", ") + (b.output ? "out " : "in ") +
           std::string(dtype_name(b.dtype)) + "* " + b.name;
  for (const ScalarParam& p : k_.params) sig += std::string(", ") + type_name(p.type) + " " + p.name;
  line("kernel " + k_.name + "(" + sig + ")");
  line("  // group: " + std::to_string(k_.programs_per_group) + " program(s) x " +
       std::to_string(k_.workers_per_program) + " worker(s); private budget " +
       std::to_string(k_.private_budget));
  for (const SharedRegion& r : k_.shared)
    line("  shared f32 " + r.name + "[" + std::to_string(r.elems) + "] per program at " +
         std::to_string(r.base) + " + program * " + std::to_string(r.program_stride));
  line("{");
  print_block(k_.body);
  line("}");
}

std::string to_string(const Kernel& kernel) {
  std::ostringstream os;
  IRPrinter(os, kernel).print_kernel();
  return os.str();
}

}  // namespace tile::ir
