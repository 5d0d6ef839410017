// IRPrinter: the raw IR as readable per-worker pseudo code.
//
// The CUDA emitter (src/backend/cuda/emit_cuda.cpp) derives from this class and overrides
// only the nodes whose CUDA spelling differs, so a dump and the generated .cu read alike.
// Tested by tests/ir/printer_test.cpp.
#pragma once

#include <ostream>
#include <string>

#include "ir/ir.hpp"

namespace tile::ir {

class IRPrinter {
 public:
  IRPrinter(std::ostream& os, const Kernel& kernel) : os_(os), k_(kernel) {}
  virtual ~IRPrinter() = default;
  virtual void print_kernel();

 protected:
  void print_block(const std::vector<Stmt>& body);
  void print_stmt(const Stmt& s);
  std::string expr(const Expr& e);
  void line(const std::string& text) { os_ << std::string(2 * indent_, ' ') << text << "\n"; }

  virtual std::string reg_name(int id) const;
  virtual std::string statement_end() const { return ""; }
  virtual std::string type_spelling(Type t) const { return type_name(t); }
  virtual std::string constant(const Expr& e);
  virtual std::string special_value(Special s) { return special_name(s); }
  virtual std::string param_name(int id) const { return k_.params[id].name; }
  virtual std::string unary_expr(UnOp op, const std::string& a, Type t);
  virtual std::string binary_expr(BinOp op, const std::string& a, const std::string& b, Type t);
  virtual std::string cast_expr(Type to, const std::string& a);
  virtual std::string row_aligned_expr(int buffer, const std::string& offset, int bytes);
  virtual std::string unpack16_expr(DType dtype, const std::string& word, int half);

  virtual void print_load(const Stmt& s);
  virtual void print_store(const Stmt& s);
  virtual void print_shfl(const Stmt& s);
  virtual void print_shared_store(const Stmt& s);
  virtual void print_shared_load(const Stmt& s);
  virtual void print_barrier(const Stmt& s);

  std::ostream& os_;
  const Kernel& k_;
  int indent_ = 0;
};

std::string to_string(const Kernel& kernel);

}  // namespace tile::ir
