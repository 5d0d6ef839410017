// IRVisitor: the one traversal of the raw IR (src/ir/ir.hpp).
//
// A consumer derives from IRVisitor<Self, ExprResult> (CRTP) and defines a handler for each
// node kind it treats: visit_assign, visit_load, visit_store, visit_shfl_xor, visit_shfl_idx,
// visit_shared_store, visit_shared_load, visit_remote_shared_load, visit_remote_shared_push,
// visit_exchange_wait, visit_async_copy, visit_async_commit, visit_async_wait, visit_staged_load,
// visit_barrier, visit_if, visit_for, visit_comment for statements (returning void); visit_constant,
// visit_reg, visit_special, visit_param, visit_unary, visit_binary, visit_select, visit_cast, visit_row_aligned,
// visit_unpack16 for expressions (returning ExprResult). visit(node) is the only dispatch on Stmt::Kind and Expr::Kind
// in the library. A handler left out calls visit_children: a statement's expressions (value, index, valid, aligned,
// cond, begin, end, cta, at, those present), then visit_block(body) and visit_block(else_body); an expression's args in
// order, returning a value-initialised ExprResult. visit_block visits each statement in turn; a consumer may replace it
// (the printer indents there).
//
// Arguments given to visit() after the node are passed to the handler: a statement's to its
// blocks' statements, an expression's to its args; visit_children gives a statement's
// expressions none. The verifier passes a statement's control-flow uniformity this way, the
// CPU executor an expression's destination slot. Handlers may be private with the base a
// friend, and virtual (the CUDA emitter overrides the printer's). The printer, the CUDA
// emitter, the verifier and the CPU executor's compiler are IRVisitors. Tested by
// tests/ir/visitor_test.cpp.
#pragma once

#include <type_traits>
#include <vector>

#include "ir/ir.hpp"
#include "tile/error.hpp"

namespace tile::ir {

template <typename Self, typename ExprResult = void>
class IRVisitor {
 public:
  template <typename... Ctx>
  void visit(const Stmt& s, Ctx&&... ctx) {
    Self& self = static_cast<Self&>(*this);
    switch (s.kind) {
      case Stmt::Kind::assign: return self.visit_assign(s, ctx...);
      case Stmt::Kind::load: return self.visit_load(s, ctx...);
      case Stmt::Kind::store: return self.visit_store(s, ctx...);
      case Stmt::Kind::shfl_xor: return self.visit_shfl_xor(s, ctx...);
      case Stmt::Kind::shfl_idx: return self.visit_shfl_idx(s, ctx...);
      case Stmt::Kind::shared_store: return self.visit_shared_store(s, ctx...);
      case Stmt::Kind::shared_load: return self.visit_shared_load(s, ctx...);
      case Stmt::Kind::remote_shared_load: return self.visit_remote_shared_load(s, ctx...);
      case Stmt::Kind::remote_shared_push: return self.visit_remote_shared_push(s, ctx...);
      case Stmt::Kind::exchange_wait: return self.visit_exchange_wait(s, ctx...);
      case Stmt::Kind::async_copy: return self.visit_async_copy(s, ctx...);
      case Stmt::Kind::async_commit: return self.visit_async_commit(s, ctx...);
      case Stmt::Kind::async_wait: return self.visit_async_wait(s, ctx...);
      case Stmt::Kind::staged_load: return self.visit_staged_load(s, ctx...);
      case Stmt::Kind::barrier: return self.visit_barrier(s, ctx...);
      case Stmt::Kind::if_: return self.visit_if(s, ctx...);
      case Stmt::Kind::for_: return self.visit_for(s, ctx...);
      case Stmt::Kind::comment: return self.visit_comment(s, ctx...);
    }
    ::tile::detail::internal_check_failed("a known statement kind", __FILE__, __LINE__,
                                          ::tile::detail::concat("statement kind ", int(s.kind)));
  }

  template <typename... Ctx>
  ExprResult visit(const Expr& e, Ctx&&... ctx) {
    Self& self = static_cast<Self&>(*this);
    switch (e.kind) {
      case Expr::Kind::constant: return self.visit_constant(e, ctx...);
      case Expr::Kind::reg: return self.visit_reg(e, ctx...);
      case Expr::Kind::special: return self.visit_special(e, ctx...);
      case Expr::Kind::param: return self.visit_param(e, ctx...);
      case Expr::Kind::unary: return self.visit_unary(e, ctx...);
      case Expr::Kind::binary: return self.visit_binary(e, ctx...);
      case Expr::Kind::select: return self.visit_select(e, ctx...);
      case Expr::Kind::cast: return self.visit_cast(e, ctx...);
      case Expr::Kind::row_aligned: return self.visit_row_aligned(e, ctx...);
      case Expr::Kind::unpack16: return self.visit_unpack16(e, ctx...);
    }
    ::tile::detail::internal_check_failed("a known expression kind", __FILE__, __LINE__,
                                          ::tile::detail::concat("expression kind ", int(e.kind)));
  }

 protected:
  IRVisitor() = default;
  ~IRVisitor() = default;

  template <typename... Ctx>
  void visit_block(const std::vector<Stmt>& body, Ctx&&... ctx) {
    for (const Stmt& s : body) visit(s, ctx...);
  }

  template <typename... Ctx>
  void visit_children(const Stmt& s, Ctx&&... ctx) {
    for (const ExprPtr* e : {&s.value, &s.index, &s.valid, &s.aligned, &s.cond, &s.begin, &s.end, &s.cta, &s.at})
      if (*e) visit(**e);
    self().visit_block(s.body, ctx...);
    self().visit_block(s.else_body, ctx...);
  }

  template <typename... Ctx>
  ExprResult visit_children(const Expr& e, Ctx&&... ctx) {
    for (const ExprPtr& a : e.args) visit(*a, ctx...);
    if constexpr (!std::is_void_v<ExprResult>) return ExprResult{};
  }

  // Statement handlers.
  template <typename... Ctx> void visit_assign(const Stmt& s, Ctx&&... c) { self().visit_children(s, c...); }
  template <typename... Ctx> void visit_load(const Stmt& s, Ctx&&... c) { self().visit_children(s, c...); }
  template <typename... Ctx> void visit_store(const Stmt& s, Ctx&&... c) { self().visit_children(s, c...); }
  template <typename... Ctx> void visit_shfl_xor(const Stmt& s, Ctx&&... c) { self().visit_children(s, c...); }
  template <typename... Ctx> void visit_shfl_idx(const Stmt& s, Ctx&&... c) { self().visit_children(s, c...); }
  template <typename... Ctx> void visit_shared_store(const Stmt& s, Ctx&&... c) { self().visit_children(s, c...); }
  template <typename... Ctx> void visit_shared_load(const Stmt& s, Ctx&&... c) { self().visit_children(s, c...); }
  template <typename... Ctx> void visit_remote_shared_load(const Stmt& s, Ctx&&... c) { self().visit_children(s, c...); }
  template <typename... Ctx> void visit_remote_shared_push(const Stmt& s, Ctx&&... c) { self().visit_children(s, c...); }
  template <typename... Ctx> void visit_exchange_wait(const Stmt& s, Ctx&&... c) { self().visit_children(s, c...); }
  template <typename... Ctx> void visit_async_copy(const Stmt& s, Ctx&&... c) { self().visit_children(s, c...); }
  template <typename... Ctx> void visit_async_commit(const Stmt& s, Ctx&&... c) { self().visit_children(s, c...); }
  template <typename... Ctx> void visit_async_wait(const Stmt& s, Ctx&&... c) { self().visit_children(s, c...); }
  template <typename... Ctx> void visit_staged_load(const Stmt& s, Ctx&&... c) { self().visit_children(s, c...); }
  template <typename... Ctx> void visit_barrier(const Stmt& s, Ctx&&... c) { self().visit_children(s, c...); }
  template <typename... Ctx> void visit_if(const Stmt& s, Ctx&&... c) { self().visit_children(s, c...); }
  template <typename... Ctx> void visit_for(const Stmt& s, Ctx&&... c) { self().visit_children(s, c...); }
  template <typename... Ctx> void visit_comment(const Stmt& s, Ctx&&... c) { self().visit_children(s, c...); }

  // Expression handlers.
  template <typename... Ctx> ExprResult visit_constant(const Expr& e, Ctx&&... c) { return self().visit_children(e, c...); }
  template <typename... Ctx> ExprResult visit_reg(const Expr& e, Ctx&&... c) { return self().visit_children(e, c...); }
  template <typename... Ctx> ExprResult visit_special(const Expr& e, Ctx&&... c) { return self().visit_children(e, c...); }
  template <typename... Ctx> ExprResult visit_param(const Expr& e, Ctx&&... c) { return self().visit_children(e, c...); }
  template <typename... Ctx> ExprResult visit_unary(const Expr& e, Ctx&&... c) { return self().visit_children(e, c...); }
  template <typename... Ctx> ExprResult visit_binary(const Expr& e, Ctx&&... c) { return self().visit_children(e, c...); }
  template <typename... Ctx> ExprResult visit_select(const Expr& e, Ctx&&... c) { return self().visit_children(e, c...); }
  template <typename... Ctx> ExprResult visit_cast(const Expr& e, Ctx&&... c) { return self().visit_children(e, c...); }
  template <typename... Ctx> ExprResult visit_row_aligned(const Expr& e, Ctx&&... c) { return self().visit_children(e, c...); }
  template <typename... Ctx> ExprResult visit_unpack16(const Expr& e, Ctx&&... c) { return self().visit_children(e, c...); }

 private:
  Self& self() { return static_cast<Self&>(*this); }
};

}  // namespace tile::ir
