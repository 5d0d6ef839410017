#include "ir/printer.hpp"

#include <cmath>
#include <sstream>

namespace tile::ir {

std::string IRPrinter::reg_name(int id) const { return "%" + k_.regs[id].name; }

std::string IRPrinter::visit_constant(const Expr& e) {
  std::ostringstream os;
  if (e.type == Type::f32 || e.type == Type::f64) {
    if (std::isinf(e.f)) return e.f > 0 ? "inf" : "-inf";
    if (e.type == Type::f64) os.precision(17);  // every f64 constant prints as itself
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

std::string IRPrinter::reg_list(const std::vector<int>& regs) const {
  std::string out;
  for (size_t i = 0; i < regs.size(); ++i) out += (i ? ", " : "") + reg_name(regs[i]);
  return out;
}

void IRPrinter::visit_load(const Stmt& s) {
  line("{" + reg_list(s.dsts) + "} = load" +
       (s.raw ? ".raw" : "") + (s.clamp ? ".clamp" : "") + (s.whole ? ".whole" : "") + " " + k_.buffers[s.buffer].name + "[" + visit(*s.index) +
       " +: " + std::to_string(s.width) + "] valid " + visit(*s.valid) + " vector_if " +
       visit(*s.aligned) + " fill " + std::to_string(s.fill));
}

void IRPrinter::visit_store(const Stmt& s) {
  line("store " + k_.buffers[s.buffer].name + "[" + visit(*s.index) + " +: " +
       std::to_string(s.width) + "] = {" + reg_list(s.dsts) +
       "} valid " + visit(*s.valid) + " vector_if " + visit(*s.aligned));
}

void IRPrinter::visit_shfl_xor(const Stmt& s) {
  line(reg_name(s.dst) + " = shfl_xor(" + reg_name(s.src) + ", " + std::to_string(s.offset) +
       ", width " + std::to_string(s.width) + ")");
}

void IRPrinter::visit_shfl_idx(const Stmt& s) {
  line(reg_name(s.dst) + " = shfl_idx(" + reg_name(s.src) + ", lane " + std::to_string(s.offset) +
       ", width " + std::to_string(s.width) + ")");
}

void IRPrinter::visit_shared_store(const Stmt& s) {
  line("shared " + k_.shared[s.region].name + "[" + visit(*s.index) + "] = " + visit(*s.value));
}

void IRPrinter::visit_shared_load(const Stmt& s) {
  line(reg_name(s.dst) + " = shared " + k_.shared[s.region].name + "[" + visit(*s.index) + "]");
}

void IRPrinter::visit_remote_shared_load(const Stmt& s) {
  line(reg_name(s.dst) + " = shared " + k_.shared[s.region].name + "[" + visit(*s.index) + "] of cta " + visit(*s.cta));
}

void IRPrinter::visit_remote_shared_push(const Stmt& s) {
  line("push " + reg_name(s.src) + " to shared " + k_.shared[s.region].name + "[" + visit(*s.index) + "] at cta " +
       visit(*s.cta));
}

void IRPrinter::visit_exchange_wait(const Stmt& s) {
  line("exchange_wait " + k_.shared[s.region].name + " (" + std::to_string(k_.shared[s.region].pushes) + " pushes)");
}

void IRPrinter::visit_async_copy(const Stmt& s) {
  line(std::string(s.whole ? "async_copy.whole" : "async_copy") + " staged " + k_.staged[size_t(s.region)].name + "[" +
       visit(*s.at) + " +: " + std::to_string(s.width) + "] = " + k_.buffers[s.buffer].name + "[" + visit(*s.index) +
       " +: " + std::to_string(s.width) + "] valid " + visit(*s.valid) + " vector_if " + visit(*s.aligned));
}

void IRPrinter::visit_async_commit(const Stmt&) { line("async_commit"); }
void IRPrinter::visit_async_wait(const Stmt& s) {
  line(s.offset > 0 ? "async_wait (" + std::to_string(s.offset) + " groups left in flight)" : "async_wait");
}

void IRPrinter::visit_staged_load(const Stmt& s) {
  line("{" + reg_list(s.dsts) + "} = " + (s.whole ? "staged_load.whole " : "staged_load ") +
       k_.staged[size_t(s.region)].name + "[" + visit(*s.at) + " +: " + std::to_string(s.width) + "] valid " +
       visit(*s.valid) + " fill " + std::to_string(s.fill));
}

void IRPrinter::visit_barrier(const Stmt& s) {
  line(std::string("barrier.") + scope_name(s.scope) +
       (s.phase == BarrierPhase::arrive ? ".arrive" : s.phase == BarrierPhase::wait ? ".wait" : ""));
}

void IRPrinter::visit_assign(const Stmt& s) { line(reg_name(s.dst) + " = " + visit(*s.value) + statement_end()); }

void IRPrinter::visit_comment(const Stmt& s) { line("// " + s.text); }

void IRPrinter::visit_if(const Stmt& s) {
  line("if (" + visit(*s.cond) + ") {");
  visit_block(s.body);
  if (!s.else_body.empty()) {
    line("} else {");
    visit_block(s.else_body);
  }
  line("}");
}

void IRPrinter::visit_for(const Stmt& s) {
  line("for (" + reg_name(s.dst) + " = " + visit(*s.begin) + "; " + reg_name(s.dst) + " < " + visit(*s.end) + "; ++" +
       reg_name(s.dst) + ") {");
  visit_block(s.body);
  line("}");
}

void IRPrinter::visit_block(const std::vector<Stmt>& body) {
  ++indent_;
  for (const Stmt& s : body) visit(s);
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
       std::to_string(k_.private_budget) +
       (k_.ctas_per_cluster > 1 ? "; cluster of " + std::to_string(k_.ctas_per_cluster) + " groups" : ""));
  for (const SharedRegion& r : k_.shared)
    line("  shared " + std::string(type_name(k_.real)) + " " + r.name + "[" + std::to_string(r.elems) +
         (r.program_stride ? "] per program at " + std::to_string(r.base) + " + program * " + std::to_string(r.program_stride)
                           : "] per group at " + std::to_string(r.base)));
  for (size_t r = 0; r < k_.staged.size(); ++r)
    line("  staged " + std::string(dtype_name(k_.staged[r].dtype)) + " " + k_.staged[r].name + "[" +
         std::to_string(k_.staged[r].elems) + "] per group at byte " + std::to_string(k_.staged_offset(int(r))));
  line("{");
  visit_block(k_.body);
  line("}");
}

std::string to_string(const Kernel& kernel) {
  std::ostringstream os;
  IRPrinter(os, kernel).print_kernel();
  return os.str();
}

std::string to_string(const Kernel& kernel, const Expr& e) {
  std::ostringstream unused;
  return IRPrinter(unused, kernel).visit(e);
}

}  // namespace tile::ir
