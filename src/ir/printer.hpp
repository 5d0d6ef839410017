// IRPrinter: the raw IR as readable per-worker pseudo code.
//
// An IRVisitor (src/ir/visitor.hpp) whose statement handlers print lines and whose expression
// handlers return their text. The CUDA emitter (src/backend/cuda/emit_cuda.cpp) derives from
// this class and overrides only the handlers and spellings that differ in CUDA, so a dump and
// the generated .cu read alike. Tested by tests/ir/printer_test.cpp.
#pragma once

#include <ostream>
#include <string>
#include <vector>

#include "ir/ir.hpp"
#include "ir/visitor.hpp"

namespace tile::ir {

class IRPrinter : public IRVisitor<IRPrinter, std::string> {
 public:
  IRPrinter(std::ostream& os, const Kernel& kernel) : os_(os), k_(kernel) {}
  virtual ~IRPrinter() = default;
  virtual void print_kernel();

 protected:
  friend class IRVisitor<IRPrinter, std::string>;

  void line(const std::string& text) { os_ << std::string(2 * indent_, ' ') << text << "\n"; }
  std::string reg_list(const std::vector<int>& regs) const;

  // The block one level deeper.
  void visit_block(const std::vector<Stmt>& body);
  // Every node is printed: a kind without a handler here does not build.
  template <typename Node>
  std::string visit_children(const Node&) {
    static_assert(sizeof(Node) == 0, "the IR printer needs a handler for every node kind");
    return "";
  }

  virtual void visit_assign(const Stmt& s);
  virtual void visit_load(const Stmt& s);
  virtual void visit_store(const Stmt& s);
  virtual void visit_shfl_xor(const Stmt& s);
  virtual void visit_shfl_idx(const Stmt& s);
  virtual void visit_shared_store(const Stmt& s);
  virtual void visit_shared_load(const Stmt& s);
  virtual void visit_remote_shared_load(const Stmt& s);
  virtual void visit_remote_shared_push(const Stmt& s);
  virtual void visit_exchange_wait(const Stmt& s);
  virtual void visit_async_copy(const Stmt& s);
  virtual void visit_async_commit(const Stmt& s);
  virtual void visit_async_wait(const Stmt& s);
  virtual void visit_staged_load(const Stmt& s);
  virtual void visit_barrier(const Stmt& s);
  virtual void visit_if(const Stmt& s);
  virtual void visit_for(const Stmt& s);
  virtual void visit_comment(const Stmt& s);

  virtual std::string visit_constant(const Expr& e);
  std::string visit_reg(const Expr& e) { return reg_name(e.id); }
  std::string visit_special(const Expr& e) { return special_value(Special(e.id)); }
  std::string visit_param(const Expr& e) { return param_name(e.id); }
  std::string visit_unary(const Expr& e) { return unary_expr(e.unop, visit(*e.args[0]), e.type); }
  std::string visit_binary(const Expr& e) {
    return binary_expr(e.binop, visit(*e.args[0]), visit(*e.args[1]), e.args[0]->type);
  }
  std::string visit_select(const Expr& e) {
    return "(" + visit(*e.args[0]) + " ? " + visit(*e.args[1]) + " : " + visit(*e.args[2]) + ")";
  }
  std::string visit_cast(const Expr& e) { return cast_expr(e.type, visit(*e.args[0])); }
  std::string visit_row_aligned(const Expr& e) { return row_aligned_expr(e.id, visit(*e.args[0]), int(e.i)); }
  std::string visit_unpack16(const Expr& e) { return unpack16_expr(DType(e.id), visit(*e.args[0]), int(e.i)); }

  // Spellings the CUDA emitter changes.
  virtual std::string reg_name(int id) const;
  virtual std::string statement_end() const { return ""; }
  virtual std::string type_spelling(Type t) const { return type_name(t); }
  virtual std::string special_value(Special s) { return special_name(s); }
  virtual std::string param_name(int id) const { return k_.params[id].name; }
  virtual std::string unary_expr(UnOp op, const std::string& a, Type t);
  virtual std::string binary_expr(BinOp op, const std::string& a, const std::string& b, Type t);
  virtual std::string cast_expr(Type to, const std::string& a);
  virtual std::string row_aligned_expr(int buffer, const std::string& offset, int bytes);
  virtual std::string unpack16_expr(DType dtype, const std::string& word, int half);

  std::ostream& os_;
  const Kernel& k_;
  int indent_ = 0;
};

std::string to_string(const Kernel& kernel);
// One expression of `kernel`, as the dump spells it (for messages about it).
std::string to_string(const Kernel& kernel, const Expr& e);

}  // namespace tile::ir
