#include "lower/lower_row_program.hpp"

#include <cmath>
#include <limits>
#include <functional>
#include <map>

#include "tile/error.hpp"

namespace tile {

namespace {

using namespace ir;

class RowLowering {
 public:
  RowLowering(const RowProgram& program, const KernelSignature& sig, const MappingPlan& plan)
      : prog_(program), sig_(sig), plan_(plan) {}

  Kernel run();

 private:
  // Values of one element position (stripe slot) during one pass.
  struct Slot {
    std::vector<int> x;                     // registers holding the input elements
    std::vector<int> words;                 // or raw 16-bit pairs (register-cached 16-bit input)
    ExprPtr col;                            // i64 column of element 0
    ExprPtr in_row_count;                   // i32: how many of the V elements lie in the row
    ExprPtr live;                           // b1, whole-vector plans: the vector lies in the row
    std::map<int, std::vector<int>> column; // loaded column operands by buffer
    std::map<int, std::vector<int>> memo;   // element node -> registers
  };

  ExprPtr i64(int64_t v) { return i64_const(v); }
  ExprPtr r(int id) { return reg(id, k_.regs[id].type); }
  int temp(const std::string& name, Type t) { return k_.add_reg(name + std::to_string(k_.regs.size()), t); }
  int assign_new(std::vector<Stmt>& out, const std::string& name, ExprPtr value) {
    int id = temp(name, value->type);
    out.push_back(assign(id, std::move(value)));
    return id;
  }

  void prologue();
  ExprPtr stripe_col(ExprPtr stripe);
  void load_slot(std::vector<Stmt>& out, Slot& slot, std::vector<int> x_regs, bool raw = false);
  ExprPtr row_scalar(std::vector<Stmt>& out, int node);
  void hoist_row_scalars(std::vector<Stmt>& out, int element_node);
  const std::vector<int>& element(std::vector<Stmt>& out, Slot& slot, int node);
  ExprPtr in_row(const Slot& slot, int j);
  Stmt whole(Stmt access) const {
    if (whole_) access.whole = true, access.aligned = b1_const(true);
    return access;
  }
  void accumulate(std::vector<Stmt>& out, Slot& slot, int node, int acc);
  int reduce_across_workers(std::vector<Stmt>& out, int acc, Reduction kind);
  // merge(out, mine, other) folds the other side's values into the registers `mine`.
  using Merge = std::function<void(std::vector<Stmt>&, const std::vector<int>&, const std::vector<ExprPtr>&)>;
  std::vector<int> merge_across_workers(std::vector<Stmt>& out, const std::vector<int>& regs,
                                        const std::vector<double>& identities, const Merge& merge);
  ExprPtr pairwise(std::vector<Stmt>& out, std::vector<ExprPtr> level, BinOp op);
  void online_mean_m2(std::vector<Stmt>& out, int sum_node, int m2_node);
  void chan_merge(std::vector<Stmt>& out, int n, int mean, int m2, ExprPtr other_n, ExprPtr other_mean, ExprPtr other_m2);
  void online_max_sum(std::vector<Stmt>& out, int max_node, int sum_node);
  void online_combine(std::vector<Stmt>& out, int m, int s, ExprPtr other_m, ExprPtr other_s);
  // The base the online sum is kept relative to: the max, or 0 while the max is -inf.
  ExprPtr online_base(ExprPtr max) {
    ExprPtr seen = binary(BinOp::lt, f32_const(-std::numeric_limits<double>::infinity()), max);
    return select(seen, max, f32_const(0.0));
  }
  ExprPtr exp2_of_difference(ExprPtr a, ExprPtr b) {
    return unary(UnOp::exp2, binary(BinOp::mul, binary(BinOp::sub, std::move(a), std::move(b)), f32_const(1.4426950408889634)));
  }
  void store_output(std::vector<Stmt>& out, Slot& slot);
  std::vector<Stmt> reread_loop(const std::function<void(std::vector<Stmt>&, Slot&)>& body);

  // exp(a) is computed as exp2(a * log2(e)): one multiply and the hardware's base-2 exponential.
  ExprPtr unary_node(UnaryFn fn, ExprPtr a) {
    static const UnOp ops[] = {UnOp::neg, UnOp::exp, UnOp::log, UnOp::rsqrt, UnOp::sqrt};
    if (fn == UnaryFn::exp) return unary(UnOp::exp2, binary(BinOp::mul, std::move(a), f32_const(1.4426950408889634)));
    return unary(ops[int(fn)], std::move(a));
  }

  ExprPtr binary_node(BinaryFn fn, ExprPtr a, ExprPtr b) {
    static const BinOp ops[] = {BinOp::add, BinOp::sub, BinOp::mul, BinOp::div, BinOp::max, BinOp::min};
    return binary(ops[int(fn)], std::move(a), std::move(b));
  }

  ExprPtr identity(Reduction kind) {
    return f32_const(kind == Reduction::sum ? 0.0 : -std::numeric_limits<double>::infinity());
  }
  BinOp combine(Reduction kind) { return kind == Reduction::sum ? BinOp::add : BinOp::max; }

  const RowProgram& prog_;
  const KernelSignature& sig_;
  const MappingPlan& plan_;
  Kernel k_;
  int p_rows_ = 0, p_cols_ = 0, p_xs_ = 0, p_ys_ = 0;
  int row_ = -1, row_valid_ = -1, load_cols_ = -1, store_cols_ = -1;
  int x_off_ = -1, y_off_ = -1, x_aligned_ = -1, y_aligned_ = -1;
  std::map<int, int> column_buffer_;   // column name index -> buffer
  std::map<int, int> column_aligned_;  // buffer -> b1 register
  std::map<int, int> scalars_;         // row-scalar node -> register
  std::vector<Slot> cached_;           // register caching: one slot per stripe
  int next_shared_ = 0;
  // alignment "require": rows aligned and cols a multiple of V, so every access is a whole
  // vector inside or outside the row; no scalar path and one row test per vector.
  bool whole_ = false;
};

Kernel RowLowering::run() {
  const int W = plan_.workers_per_program;
  k_.name = "tile_" + prog_.name() + "_" + std::string(dtype_name(sig_.x)) + "_" +
            std::string(dtype_name(sig_.y)) + "_p" + std::to_string(plan_.programs_per_group) + "w" +
            std::to_string(W) + "v" + std::to_string(plan_.vector_elems) + "s" +
            std::to_string(plan_.stripes) + (plan_.caching == InputCaching::registers ? "c" : "r");
  whole_ = plan_.alignment == Alignment::require;
  k_.programs_per_group = plan_.programs_per_group;
  k_.workers_per_program = W;
  k_.private_budget = plan_.private_budget;
  k_.buffers.push_back({"x", sig_.x, false});
  k_.buffers.push_back({"y", sig_.y, true});
  TILE_CHECK(sig_.columns.size() == prog_.columns().size(), "signature has ", sig_.columns.size(),
             " column dtypes for ", prog_.columns().size(), " columns");
  for (size_t c = 0; c < prog_.columns().size(); ++c) {
    column_buffer_[int(c)] = int(k_.buffers.size());
    k_.buffers.push_back({prog_.columns()[c], sig_.columns[c], false});
  }
  k_.params = {{"rows", Type::i64}, {"cols", Type::i64}, {"x_stride", Type::i64}, {"y_stride", Type::i64}};
  for (const std::string& s : prog_.scalars()) k_.params.push_back({s, Type::f32});
  p_rows_ = 0, p_cols_ = 1, p_xs_ = 2, p_ys_ = 3;

  prologue();
  std::vector<Stmt>& body = k_.body;

  // Reductions in creation order; each is one pass over the row.
  std::vector<int> reductions;
  for (size_t n = 0; n < prog_.nodes().size(); ++n)
    if (prog_.nodes()[n].kind == RowNode::Kind::reduce) reductions.push_back(int(n));

  if (plan_.caching == InputCaching::registers) {
    body.push_back(comment("load the row slice once into cached registers"));
    for (int s = 0; s < plan_.stripes; ++s) {
      Slot slot;
      slot.col = stripe_col(i64(s));
      // cache_format packed: 16-bit input stays as loaded, two elements a register, and is
      // converted where each pass uses it.
      const bool raw = plan_.cache_format == CacheFormat::packed;
      std::vector<int> x_regs;
      for (int j = 0; j < plan_.vector_elems; j += raw ? 2 : 1)
        x_regs.push_back(k_.add_reg("x" + std::to_string(s) + "_" + std::to_string(raw ? j / 2 : j), raw ? Type::i32 : Type::f32, true));
      load_slot(body, slot, x_regs, raw);
      cached_.push_back(std::move(slot));
    }
  }
  for (int node : reductions) row_scalar(body, node);
  body.push_back(comment("output pass"));
  hoist_row_scalars(body, prog_.output_node());
  if (plan_.caching == InputCaching::registers) {
    // Element values stay memoised across passes: the output reuses what a reduction pass
    // computed (softmax's exp), and the inputs it no longer needs die.
    for (Slot& slot : cached_) store_output(body, slot);
  } else {
    for (Stmt& s : reread_loop([&](std::vector<Stmt>& out, Slot& slot) { store_output(out, slot); }))
      body.push_back(std::move(s));
  }
  return std::move(k_);
}

void RowLowering::prologue() {
  std::vector<Stmt>& b = k_.body;
  const int P = plan_.programs_per_group, V = plan_.vector_elems;
  b.push_back(comment("row owned by this program; guard programs past the last row run masked"));
  row_ = assign_new(b, "row", binary(BinOp::add, binary(BinOp::mul, special(Special::group_index), i64(P)),
                                     cast(Type::i64, special(Special::program_in_group))));
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
  x_off_ = assign_new(b, "x_off", binary(BinOp::mul, load_row, param(p_xs_, Type::i64)));
  y_off_ = assign_new(b, "y_off", binary(BinOp::mul, r(row_), param(p_ys_, Type::i64)));
  auto aligned = [&](int buffer, ExprPtr offset) -> ExprPtr {
    if (plan_.alignment == Alignment::require) return b1_const(true);
    return row_aligned(buffer, std::move(offset), V * dtype_size(k_.buffers[buffer].dtype));
  };
  x_aligned_ = assign_new(b, "x_aligned", aligned(0, r(x_off_)));
  y_aligned_ = assign_new(b, "y_aligned", aligned(1, r(y_off_)));
  for (auto& [c, buffer] : column_buffer_) column_aligned_[buffer] = assign_new(b, "w_aligned", aligned(buffer, i64(0)));
}

ExprPtr RowLowering::stripe_col(ExprPtr stripe) {
  // (stripe * W + worker) * V: worker w owns vector_elems consecutive elements per stripe.
  ExprPtr w = cast(Type::i64, special(Special::worker_in_program));
  return binary(BinOp::mul,
                binary(BinOp::add, binary(BinOp::mul, stripe, i64(plan_.workers_per_program)), w),
                i64(plan_.vector_elems));
}

void RowLowering::load_slot(std::vector<Stmt>& out, Slot& slot, std::vector<int> x_regs, bool raw) {
  int col = assign_new(out, "col", slot.col);
  slot.col = r(col);
  // min(max(load_cols - col, 0), V) as i32: one compare per element instead of i64 math.
  if (whole_) {
    slot.live = r(assign_new(out, "live", binary(BinOp::lt, slot.col, r(load_cols_))));
  } else {
    ExprPtr left = binary(BinOp::sub, r(load_cols_), slot.col);
    ExprPtr count = binary(BinOp::min, binary(BinOp::max, left, i64(0)), i64(plan_.vector_elems));
    slot.in_row_count = r(assign_new(out, "n", cast(Type::i32, count)));
  }
  ExprPtr index = binary(BinOp::add, r(x_off_), slot.col), valid = binary(BinOp::sub, r(load_cols_), slot.col);
  if (raw) {
    out.push_back(whole(load_raw(x_regs, 0, index, valid, r(x_aligned_), plan_.tail == TailHandling::clamp)));
    slot.words = std::move(x_regs);
  } else {
    out.push_back(whole(load(x_regs, 0, index, valid, r(x_aligned_), plan_.tail == TailHandling::clamp, 0.0f)));
    slot.x = std::move(x_regs);
  }
}

ExprPtr RowLowering::in_row(const Slot& slot, int j) {
  if (whole_) return slot.live;
  return binary(BinOp::lt, i32_const(j), slot.in_row_count);
}

ExprPtr RowLowering::row_scalar(std::vector<Stmt>& out, int node) {
  if (auto it = scalars_.find(node); it != scalars_.end()) return r(it->second);
  const RowNode& n = prog_.nodes()[node];
  TILE_CHECK(!prog_.is_element(node), "row_scalar of an element node");
  ExprPtr value;
  switch (n.kind) {
    case RowNode::Kind::constant: return f32_const(n.value);
    case RowNode::Kind::cols: value = cast(Type::f32, param(p_cols_, Type::i64)); break;
    case RowNode::Kind::scalar: return param(k_.param_index(n.name), Type::f32);
    case RowNode::Kind::unary: {
      ExprPtr a = row_scalar(out, n.a);
      value = unary_node(n.unary, a);
      break;
    }
    case RowNode::Kind::binary: {
      ExprPtr a = row_scalar(out, n.a), b = row_scalar(out, n.b);
      value = binary_node(n.binary, a, b);
      break;
    }
    case RowNode::Kind::reduce: {
      if (plan_.caching == InputCaching::reread && n.reduction == Reduction::max) {
        if (int partner = online_max_partner(prog_, node); partner >= 0) {
          online_max_sum(out, node, partner);
          return r(scalars_[node]);
        }
      }
      if (plan_.caching == InputCaching::reread && n.reduction == Reduction::sum) {
        if (int partner = online_variance_partner(prog_, node); partner >= 0) {
          online_mean_m2(out, node, partner);
          return r(scalars_[node]);
        }
      }
      out.push_back(comment("reduction %" + std::to_string(node) + " (" +
                            (n.reduction == Reduction::sum ? "sum" : "max") + ")"));
      hoist_row_scalars(out, n.a);
      int acc = assign_new(out, "acc", identity(n.reduction));
      if (plan_.caching == InputCaching::registers) {
        for (Slot& slot : cached_) accumulate(out, slot, node, acc);
      } else {
        for (Stmt& s : reread_loop([&](std::vector<Stmt>& body, Slot& slot) { accumulate(body, slot, node, acc); }))
          out.push_back(std::move(s));
      }
      scalars_[node] = reduce_across_workers(out, acc, n.reduction);
      return r(scalars_[node]);
    }
    default: TILE_CHECK(false, "unexpected row node kind");
  }
  scalars_[node] = assign_new(out, "s", value);
  return r(scalars_[node]);
}

// Computes every row scalar an element expression uses before the pass that needs it, so
// none is first defined inside a stripe loop.
void RowLowering::hoist_row_scalars(std::vector<Stmt>& out, int node) {
  const RowNode& n = prog_.nodes()[node];
  for (int operand : {n.a, n.b}) {
    if (operand < 0 || n.kind == RowNode::Kind::reduce) continue;
    if (prog_.is_element(operand))
      hoist_row_scalars(out, operand);
    else
      row_scalar(out, operand);
  }
}

const std::vector<int>& RowLowering::element(std::vector<Stmt>& out, Slot& slot, int node) {
  if (auto it = slot.memo.find(node); it != slot.memo.end()) return it->second;
  const RowNode& n = prog_.nodes()[node];
  const int V = plan_.vector_elems;
  std::vector<int> regs;
  switch (n.kind) {
    case RowNode::Kind::input:
      if (slot.words.empty()) {
        regs = slot.x;
      } else {
        for (int j = 0; j < V; ++j)
          regs.push_back(assign_new(out, "x", unpack16(sig_.x, r(slot.words[j / 2]), j % 2)));
      }
      break;
    case RowNode::Kind::column: {
      int c = 0;
      while (prog_.columns()[c] != n.name) ++c;
      int buffer = column_buffer_[c];
      auto& loaded = slot.column[buffer];
      if (loaded.empty()) {
        for (int j = 0; j < V; ++j) loaded.push_back(temp(n.name, Type::f32));
        out.push_back(whole(load(loaded, buffer, slot.col, binary(BinOp::sub, r(load_cols_), slot.col),
                                 r(column_aligned_[buffer]), plan_.tail == TailHandling::clamp, 0.0f)));
      }
      regs = loaded;
      break;
    }
    case RowNode::Kind::unary: {
      std::vector<int> a = element(out, slot, n.a);
      for (int j = 0; j < V; ++j) regs.push_back(assign_new(out, "e", unary_node(n.unary, r(a[j]))));
      break;
    }
    case RowNode::Kind::binary: {
      auto operand = [&](int id, int j) -> ExprPtr {
        if (prog_.is_element(id)) return r(element(out, slot, id)[j]);
        return row_scalar(out, id);
      };
      for (int j = 0; j < V; ++j) {
        ExprPtr a = operand(n.a, j), b = operand(n.b, j);
        regs.push_back(assign_new(out, "e", binary_node(n.binary, a, b)));
      }
      break;
    }
    default: TILE_CHECK(false, "node %", node, " is not an element node");
  }
  return slot.memo[node] = regs;
}

void RowLowering::accumulate(std::vector<Stmt>& out, Slot& slot, int node, int acc) {
  const RowNode& n = prog_.nodes()[node];
  const std::vector<int> values = element(out, slot, n.a);
  if (whole_) {
    // The vector is in the row or not as a whole: combine its elements pairwise, then test once.
    std::vector<ExprPtr> level;
    for (int v : values) level.push_back(r(v));
    ExprPtr combined = pairwise(out, std::move(level), combine(n.reduction));
    out.push_back(assign(acc, select(slot.live, binary(combine(n.reduction), r(acc), combined), r(acc))));
    return;
  }
  for (int j = 0; j < plan_.vector_elems; ++j) {
    // Elements past the row end (and of guard programs) leave the accumulator unchanged.
    out.push_back(assign(acc, select(in_row(slot, j), binary(combine(n.reduction), r(acc), r(values[j])), r(acc))));
  }
}

// values[0] op values[1] ..., as a balanced tree of registers.
ExprPtr RowLowering::pairwise(std::vector<Stmt>& out, std::vector<ExprPtr> level, BinOp op) {
  while (level.size() > 1) {
    std::vector<ExprPtr> next;
    for (size_t i = 0; i + 1 < level.size(); i += 2) next.push_back(r(assign_new(out, "p", binary(op, level[i], level[i + 1]))));
    if (level.size() % 2) next.push_back(level.back());
    level = std::move(next);
  }
  return level[0];
}

int RowLowering::reduce_across_workers(std::vector<Stmt>& out, int acc, Reduction kind) {
  const double identity = kind == Reduction::sum ? 0.0 : -std::numeric_limits<double>::infinity();
  return merge_across_workers(out, {acc}, {identity},
                              [&](std::vector<Stmt>& body, const std::vector<int>& mine, const std::vector<ExprPtr>& other) {
                                body.push_back(assign(mine[0], binary(combine(kind), r(mine[0]), other[0])));
                              })[0];
}

// m, s <- the running max and rescaled sum of exp(x - m) after merging (other_m, other_s).
// The sums are rescaled to a base that is the merged max, or 0 while that is -inf (nothing
// but -inf seen): exp(-inf - 0) is 0, and no guard skips the update, so a NaN that fmax
// ignored still reaches the sum through exp(NaN), as does a +inf (inf - inf), as in PyTorch.
void RowLowering::online_combine(std::vector<Stmt>& out, int m, int s, ExprPtr other_m, ExprPtr other_s) {
  int merged = assign_new(out, "m", binary(BinOp::max, r(m), other_m));
  int base = assign_new(out, "b", online_base(r(merged)));
  out.push_back(assign(s, binary(BinOp::add, binary(BinOp::mul, r(s), exp2_of_difference(r(m), r(base))),
                                 binary(BinOp::mul, other_s, exp2_of_difference(other_m, r(base))))));
  out.push_back(assign(m, r(merged)));
}

// Merges per-worker partial statistics `regs` across the program and returns the registers
// holding the program's result: a warp butterfly, then (multi-warp programs) one shared slot per
// warp and statistic, one barrier, and a butterfly that every warp runs over the warps'
// partials, so no broadcast barrier is needed. A lane past the last warp contributes
// `identities`. Each statistic has its own region, so no pass overwrites slots another warp
// may still read.
std::vector<int> RowLowering::merge_across_workers(std::vector<Stmt>& out, const std::vector<int>& regs,
                                                   const std::vector<double>& identities, const Merge& merge) {
  const int W = plan_.workers_per_program;
  auto butterfly = [&](const std::vector<int>& mine, int width) {
    for (int offset = width / 2; offset >= 1; offset /= 2) {
      std::vector<ExprPtr> other;
      for (size_t i = 0; i < mine.size(); ++i) other.push_back(r(temp("t", Type::f32)));
      for (size_t i = 0; i < mine.size(); ++i) out.push_back(shfl_xor(other[i]->id, mine[i], offset, width));
      merge(out, mine, other);
    }
  };
  butterfly(regs, std::min(W, 32));
  if (W <= 32) return regs;
  const int warps = W / 32;
  std::vector<int> ids;
  std::vector<Stmt> stores;
  for (int reg_id : regs) {
    SharedRegion region{"partials" + std::to_string(k_.shared.size()), next_shared_, warps, warps};
    next_shared_ += warps * plan_.programs_per_group;
    ids.push_back(int(k_.shared.size()));
    k_.shared.push_back(region);
    stores.push_back(shared_store(ids.back(), special(Special::warp_in_program), r(reg_id)));
  }
  out.push_back(if_(binary(BinOp::eq, special(Special::lane), i32_const(0)), std::move(stores)));
  out.push_back(barrier(plan_.barrier_scope == BarrierScope::group ? BarrierKind::group : BarrierKind::program));
  ExprPtr slot = binary(BinOp::min, special(Special::lane), i32_const(warps - 1));
  ExprPtr mine = binary(BinOp::lt, special(Special::lane), i32_const(warps));
  std::vector<int> totals;
  for (size_t i = 0; i < regs.size(); ++i) {
    int partial = temp("partial", Type::f32);
    out.push_back(shared_load(partial, ids[i], slot));
    totals.push_back(assign_new(out, "total", select(mine, r(partial), f32_const(identities[i]))));
  }
  butterfly(totals, 32);
  return totals;
}

// Re-read plans compute softmax's max M and sum of exp(E - M) in one pass (the running sum is
// rescaled whenever the running max grows), so the row is read twice instead of three times.
void RowLowering::online_max_sum(std::vector<Stmt>& out, int max_node, int sum_node) {
  out.push_back(comment("reductions %" + std::to_string(max_node) + " (max) and %" + std::to_string(sum_node) +
                        " (sum of exp(x - max)) in one pass"));
  const int e = prog_.nodes()[max_node].a;
  hoist_row_scalars(out, e);
  const double neg_inf = -std::numeric_limits<double>::infinity();
  int m = assign_new(out, "acc_max", f32_const(neg_inf));
  int s = assign_new(out, "acc_sum", f32_const(0.0));
  // Per loop iteration: the max of its U vectors, then one rescale of the running sum.
  struct Vec {
    std::vector<ExprPtr> x;
    ExprPtr live;  // whole-vector plans: the vector lies in the row
  };
  std::vector<Vec> vecs;
  for (Stmt& st : reread_loop([&](std::vector<Stmt>& body, Slot& slot) {
         const std::vector<int> values = element(body, slot, e);
         Vec v;
         for (int j = 0; j < plan_.vector_elems; ++j) {
           // Elements outside the row count as -inf: they move neither the max nor the sum.
           if (whole_) v.x.push_back(r(values[j]));
           else v.x.push_back(r(assign_new(body, "v", select(in_row(slot, j), r(values[j]), f32_const(neg_inf)))));
         }
         if (whole_) v.live = slot.live;
         vecs.push_back(std::move(v));
         if (int(vecs.size()) < plan_.stripe_unroll) return;
         std::vector<ExprPtr> maxima;
         for (const Vec& u : vecs) {
           ExprPtr mx = pairwise(body, u.x, BinOp::max);
           maxima.push_back(u.live ? select(u.live, mx, f32_const(neg_inf)) : mx);
         }
         int merged = assign_new(body, "m", binary(BinOp::max, r(m), pairwise(body, maxima, BinOp::max)));
         int base = assign_new(body, "b", online_base(r(merged)));
         ExprPtr sum;
         for (const Vec& u : vecs) {
           ExprPtr part;
           for (const ExprPtr& x : u.x) {
             ExprPtr term = exp2_of_difference(x, r(base));
             part = part ? binary(BinOp::add, part, term) : term;
           }
           if (u.live) part = select(u.live, part, f32_const(0.0));
           part = r(assign_new(body, "vs", part));
           sum = sum ? binary(BinOp::add, sum, part) : part;
         }
         body.push_back(assign(s, binary(BinOp::add, binary(BinOp::mul, r(s), exp2_of_difference(r(m), r(base))), sum)));
         body.push_back(assign(m, r(merged)));
         vecs.clear();
       }))
    out.push_back(std::move(st));

  // Across workers: the same merge, by warp butterfly, then through shared memory.
  const std::vector<int> total = merge_across_workers(
      out, {m, s}, {neg_inf, 0.0}, [&](std::vector<Stmt>& body, const std::vector<int>& mine, const std::vector<ExprPtr>& other) {
        online_combine(body, mine[0], mine[1], other[0], other[1]);
      });
  scalars_[max_node] = total[0];
  scalars_[sum_node] = total[1];
}

// (n, mean, m2) <- the count, mean and sum of squared deviations of the union of two parts
// (Chan et al.); an empty union stays as it is instead of dividing by zero.
void RowLowering::chan_merge(std::vector<Stmt>& out, int n, int mean, int m2, ExprPtr other_n, ExprPtr other_mean,
                             ExprPtr other_m2) {
  int total = assign_new(out, "n", binary(BinOp::add, r(n), other_n));
  int delta = assign_new(out, "d", binary(BinOp::sub, other_mean, r(mean)));
  ExprPtr any = binary(BinOp::lt, f32_const(0.0), r(total));
  ExprPtr share = binary(BinOp::div, other_n, r(total));
  out.push_back(assign(m2, select(any, binary(BinOp::add, binary(BinOp::add, r(m2), other_m2),
                                                   binary(BinOp::mul, binary(BinOp::mul, r(delta), r(delta)),
                                                          binary(BinOp::mul, r(n), share))),
                                  r(m2))));
  out.push_back(assign(mean, select(any, binary(BinOp::add, r(mean), binary(BinOp::mul, r(delta), share)), r(mean))));
  out.push_back(assign(n, r(total)));
}

// Re-read plans compute LayerNorm's sum and its sum of squared deviations from the mean in one
// pass, merging per-iteration (count, mean, m2) partials; the row is read twice, not three times.
void RowLowering::online_mean_m2(std::vector<Stmt>& out, int sum_node, int m2_node) {
  out.push_back(comment("reductions %" + std::to_string(sum_node) + " (sum) and %" + std::to_string(m2_node) +
                        " (sum of squared deviations from the mean) in one pass"));
  const int e = prog_.nodes()[sum_node].a;
  hoist_row_scalars(out, e);
  int n = assign_new(out, "acc_n", f32_const(0.0));
  int mean = assign_new(out, "acc_mean", f32_const(0.0));
  int m2 = assign_new(out, "acc_m2", f32_const(0.0));
  std::vector<std::pair<std::vector<ExprPtr>, ExprPtr>> vecs;  // kept values, count kept
  for (Stmt& st : reread_loop([&](std::vector<Stmt>& body, Slot& slot) {
         const std::vector<int> values = element(body, slot, e);
         std::vector<ExprPtr> kept;
         ExprPtr count;
         for (int j = 0; j < plan_.vector_elems; ++j)
           kept.push_back(r(assign_new(body, "v", select(in_row(slot, j), r(values[j]), f32_const(0.0)))));
         if (whole_) {
           count = select(slot.live, f32_const(plan_.vector_elems), f32_const(0.0));
         } else {
           count = cast(Type::f32, slot.in_row_count);
         }
         vecs.push_back({kept, r(assign_new(body, "k", count))});
         if (int(vecs.size()) < plan_.stripe_unroll) return;
         // The iteration's partial: count, mean, then squared deviations of the kept elements.
         ExprPtr k, sum;
         for (auto& [xs, c] : vecs) {
           k = k ? binary(BinOp::add, k, c) : c;
           for (const ExprPtr& x : xs) sum = sum ? binary(BinOp::add, sum, x) : x;
         }
         int kk = assign_new(body, "k", k);
         int local_mean = assign_new(body, "lm", select(binary(BinOp::lt, f32_const(0.0), r(kk)),
                                                         binary(BinOp::div, sum, r(kk)), f32_const(0.0)));
         ExprPtr dev;
         for (size_t i = 0; i < vecs.size(); ++i) {
           auto& [xs, c] = vecs[i];
           for (size_t j = 0; j < xs.size(); ++j) {
             ExprPtr d = binary(BinOp::sub, xs[j], r(local_mean));
             // Only kept elements deviate: element j of a vector is kept when j < its count.
             ExprPtr sq = select(binary(BinOp::lt, f32_const(double(j)), c), binary(BinOp::mul, d, d), f32_const(0.0));
             dev = dev ? binary(BinOp::add, dev, sq) : sq;
           }
         }
         int local_m2 = assign_new(body, "lq", dev);
         chan_merge(body, n, mean, m2, r(kk), r(local_mean), r(local_m2));
         vecs.clear();
       }))
    out.push_back(std::move(st));

  const std::vector<int> total = merge_across_workers(
      out, {n, mean, m2}, {0.0, 0.0, 0.0},
      [&](std::vector<Stmt>& body, const std::vector<int>& mine, const std::vector<ExprPtr>& other) {
        chan_merge(body, mine[0], mine[1], mine[2], other[0], other[1], other[2]);
      });
  // The row sum is count x mean; the program's mean divides it by cols again.
  scalars_[sum_node] = assign_new(out, "s", binary(BinOp::mul, r(total[0]), r(total[1])));
  scalars_[m2_node] = total[2];
}

void RowLowering::store_output(std::vector<Stmt>& out, Slot& slot) {
  const std::vector<int> values = element(out, slot, prog_.output_node());
  out.push_back(whole(store(values, 1, binary(BinOp::add, r(y_off_), slot.col),
                            binary(BinOp::sub, r(store_cols_), slot.col), r(y_aligned_))));
}

std::vector<Stmt> RowLowering::reread_loop(const std::function<void(std::vector<Stmt>&, Slot&)>& body) {
  // for it in 0..ceil(cols / (W*V*U)): U stripes per iteration, all loads issued first.
  const int U = plan_.stripe_unroll;
  const int64_t step = plan_.elems_per_stripe() * U;
  std::vector<Stmt> out;
  int it = temp("it", Type::i64);
  ExprPtr count = binary(BinOp::div, binary(BinOp::add, param(p_cols_, Type::i64), i64(step - 1)), i64(step));
  std::vector<Stmt> loop;
  std::vector<Slot> slots(U);
  for (int u = 0; u < U; ++u) {
    slots[u].col = stripe_col(binary(BinOp::add, binary(BinOp::mul, r(it), i64(U)), i64(u)));
    std::vector<int> x_regs;
    for (int j = 0; j < plan_.vector_elems; ++j) x_regs.push_back(temp("x", Type::f32));
    load_slot(loop, slots[u], x_regs);
  }
  for (int u = 0; u < U; ++u) body(loop, slots[u]);
  out.push_back(for_(it, i64(0), count, std::move(loop)));
  return out;
}

}  // namespace

int online_variance_partner(const RowProgram& program, int sum_node) {
  const auto& nodes = program.nodes();
  auto is = [&](int id, RowNode::Kind kind) { return id >= 0 && nodes[id].kind == kind; };
  if (!is(sum_node, RowNode::Kind::reduce) || nodes[sum_node].reduction != Reduction::sum) return -1;
  const int e = nodes[sum_node].a;
  for (size_t s = 0; s < nodes.size(); ++s) {
    const RowNode& n = nodes[s];
    if (n.kind != RowNode::Kind::reduce || n.reduction != Reduction::sum) continue;
    const RowNode& sq = nodes[n.a];  // c * c
    if (sq.kind != RowNode::Kind::binary || sq.binary != BinaryFn::mul || sq.a != sq.b) continue;
    const RowNode& c = nodes[sq.a];  // E - sum / cols
    if (c.kind != RowNode::Kind::binary || c.binary != BinaryFn::sub || c.a != e || !is(c.b, RowNode::Kind::binary)) continue;
    const RowNode& mean = nodes[c.b];
    if (mean.binary == BinaryFn::div && mean.a == sum_node && is(mean.b, RowNode::Kind::cols)) return int(s);
  }
  return -1;
}

int online_max_partner(const RowProgram& program, int max_node) {
  const auto& nodes = program.nodes();
  if (nodes[max_node].kind != RowNode::Kind::reduce || nodes[max_node].reduction != Reduction::max) return -1;
  const int e = nodes[max_node].a;
  for (size_t s = 0; s < nodes.size(); ++s) {
    const RowNode& n = nodes[s];
    if (n.kind != RowNode::Kind::reduce || n.reduction != Reduction::sum) continue;
    const RowNode& ex = nodes[n.a];
    if (ex.kind != RowNode::Kind::unary || ex.unary != UnaryFn::exp) continue;
    const RowNode& diff = nodes[ex.a];
    if (diff.kind == RowNode::Kind::binary && diff.binary == BinaryFn::sub && diff.a == e && diff.b == max_node)
      return int(s);
  }
  return -1;
}

ir::Kernel lower_row_program(const RowProgram& program, const KernelSignature& signature,
                             const MappingPlan& plan) {
  return RowLowering(program, signature, plan).run();
}

}  // namespace tile
