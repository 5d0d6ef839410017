#include "lower/lower_row_program.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <functional>
#include <map>
#include <optional>

#include "tile/error.hpp"

namespace tile {

namespace {

using namespace ir;

// Scales are clamped to [2^-103, 2^125] (scale_of); kScaleLo is also an empty part's scale.
constexpr double kScaleLo = 0x1p-103, kScaleHi = 0x1p125;

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

  // One vector access's values of an element expression, and which of them lie in the row.
  struct Vec {
    std::vector<ExprPtr> x;
    ExprPtr live;   // whole-vector plans: the vector lies in the row
    ExprPtr count;  // otherwise: i32, how many of its elements do
  };
  // Count, scale, mean and m2 of a part (see stats_part); -1 where absent.
  struct Stats {
    bool centred = false, scaled = false;
    int n = -1, p = -1, mean = -1, m2 = -1;
    std::vector<int> regs() const;
    Stats with(std::vector<int> regs) const;  // the same layout in other registers
    std::vector<double> identities() const;
  };
  // The statistics of a whole row (row_stats).
  struct RowStats {
    Stats st;
    int P = -1;            // the scale of st; -1 when unscaled
    bool uniform = false;  // P came from the row's largest |x| before the parts were formed
  };
  Vec vec_of(std::vector<Stmt>& out, Slot& slot, int node);
  // op over term(x) of the in-row elements (identity for the others): a pairwise tree per
  // vector, chained across vectors.
  ExprPtr masked_reduce(std::vector<Stmt>& out, const std::vector<Vec>& vecs, BinOp op, double identity,
                        const std::function<ExprPtr(std::vector<Stmt>&, const ExprPtr&)>& term);
  ExprPtr count_of(std::vector<Stmt>& out, const std::vector<Vec>& vecs);
  ExprPtr scale_of(std::vector<Stmt>& out, ExprPtr amax);
  ExprPtr amax_of(std::vector<Stmt>& out, const std::vector<Vec>& vecs);
  Stats part_stats(std::vector<Stmt>& out, const std::vector<Vec>& vecs, bool centred, ExprPtr pinv);
  Stats scaled_part(std::vector<Stmt>& out, const std::vector<Vec>& vecs, bool centred);
  void stats_merge(std::vector<Stmt>& out, const Stats& mine, const std::vector<ExprPtr>& other);
  Stats merge_stats(std::vector<Stmt>& out, const Stats& st);
  RowStats row_stats(std::vector<Stmt>& out, int e, bool centred, bool scaled_stats);
  void norm_statistics(std::vector<Stmt>& out);
  const std::vector<int>& norm_product(std::vector<Stmt>& out, Slot& slot);
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
  // RMSNorm's / LayerNorm's normalisation (norm_idiom) and its output-pass row scalars.
  std::optional<NormIdiom> norm_;
  bool norm_scaled_ = false;
  int norm_pinv_ = -1, norm_mean_ = -1, norm_k_ = -1;
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

  norm_ = norm_idiom(prog_);
  // fp16 input needs no scaling: its squares and sums stay far inside fp32's range.
  norm_scaled_ = norm_ && !(prog_.nodes()[norm_->element].kind == RowNode::Kind::input && sig_.x == DType::f16);

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
  for (int node : reductions) {
    if (norm_ && (node == norm_->mean_sum || node == norm_->square_sum))
      norm_statistics(body);
    else
      row_scalar(body, node);
  }
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
  if (norm_ && node == norm_->inv) {
    norm_statistics(out);
    return r(norm_k_);
  }
  TILE_CHECK(!norm_ || (node != norm_->mean_sum && node != norm_->square_sum),
             "reduction %", node, " of the normalisation idiom used outside it");
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
  if (norm_ && node == norm_->product) {
    norm_statistics(out);
    hoist_row_scalars(out, norm_->element);
    return;
  }
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
  if (norm_ && node == norm_->product) return norm_product(out, slot);
  TILE_CHECK(!norm_ || !norm_->centred() || node != norm_->centered,
             "centred node %", node, " of the normalisation idiom used outside it");
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

// ---- Scaled statistics (RMSNorm, LayerNorm) ----
//
// A part is the elements one worker covers (register caching) or one loop iteration covers
// (re-read). A scaled part carries an exact power of two p near its largest |x| and statistics
// of x / p, which lies in [-8, 8]: no square or sum overflows or underflows whatever the
// magnitude of x. Merging two scaled parts rescales the one with the smaller p by p_lo / p_hi,
// also an exact power of two. docs/source/numerics.md gives the bounds.

RowLowering::Vec RowLowering::vec_of(std::vector<Stmt>& out, Slot& slot, int node) {
  Vec v;
  for (int id : element(out, slot, node)) v.x.push_back(r(id));
  if (whole_) v.live = slot.live;
  else v.count = slot.in_row_count;
  return v;
}

ExprPtr RowLowering::masked_reduce(std::vector<Stmt>& out, const std::vector<Vec>& vecs, BinOp op, double identity,
                                   const std::function<ExprPtr(std::vector<Stmt>&, const ExprPtr&)>& term) {
  ExprPtr acc;
  for (const Vec& v : vecs) {
    std::vector<ExprPtr> level;
    for (size_t j = 0; j < v.x.size(); ++j) {
      ExprPtr t = term(out, v.x[j]);
      if (!whole_) t = select(binary(BinOp::lt, i32_const(int64_t(j)), v.count), t, f32_const(identity));
      level.push_back(r(assign_new(out, "t", t)));
    }
    ExprPtr combined = pairwise(out, std::move(level), op);
    if (whole_) combined = select(v.live, combined, f32_const(identity));
    acc = r(assign_new(out, "a", acc ? binary(op, acc, combined) : combined));
  }
  return acc;
}

ExprPtr RowLowering::count_of(std::vector<Stmt>& out, const std::vector<Vec>& vecs) {
  ExprPtr acc;
  for (const Vec& v : vecs) {
    ExprPtr c = whole_ ? select(v.live, f32_const(plan_.vector_elems), f32_const(0.0)) : cast(Type::f32, v.count);
    acc = acc ? binary(BinOp::add, acc, c) : c;
  }
  return r(assign_new(out, "k", acc));
}

ExprPtr RowLowering::amax_of(std::vector<Stmt>& out, const std::vector<Vec>& vecs) {
  return masked_reduce(out, vecs, BinOp::max, 0.0,
                       [&](std::vector<Stmt>&, const ExprPtr& x) { return binary(BinOp::max, x, unary(UnOp::neg, x)); });
}

// p = 2^floor(log2 c) or twice that, for c = amax clamped to [2^-103, 2^125]: c + c * 2^-23
// rounds to c plus one or two units in the last place of c, so the difference is a power of
// two; c >= 2^-103 keeps c * 2^-23 normal, c <= 2^125 keeps p and 1 / p normal.
ExprPtr RowLowering::scale_of(std::vector<Stmt>& out, ExprPtr amax) {
  ExprPtr c = r(assign_new(out, "c", binary(BinOp::min, binary(BinOp::max, amax, f32_const(kScaleLo)), f32_const(kScaleHi))));
  ExprPtr up = r(assign_new(out, "u", binary(BinOp::add, c, binary(BinOp::mul, c, f32_const(0x1p-23)))));
  return r(assign_new(out, "p", binary(BinOp::mul, binary(BinOp::sub, up, c), f32_const(0x1p23))));
}

// A part's count, mean and squared deviations (centred), or its sum of squares, of x * pinv
// (x itself when pinv is null). The mean is shifted by the part's first element (in the row
// whenever any is): a constant part has the exact mean and m2 = 0, so a constant row
// normalises to exactly 0. Each pass multiplies x by its own factor (pinv, then pinv / 2 with
// m2 = 4 * the squares: the same values), so the compiler finds no product x * pinv to keep
// live beside the cached row; x itself is what stays live.
RowLowering::Stats RowLowering::part_stats(std::vector<Stmt>& out, const std::vector<Vec>& vecs, bool centred, ExprPtr pinv) {
  Stats st;
  st.centred = centred;
  auto times = [](const ExprPtr& x, const ExprPtr& f) { return f ? binary(BinOp::mul, x, f) : x; };
  if (!centred) {
    st.m2 = masked_reduce(out, vecs, BinOp::add, 0.0, [&](std::vector<Stmt>& body, const ExprPtr& x) {
      ExprPtr t = pinv ? r(assign_new(body, "t", times(x, pinv))) : x;
      return binary(BinOp::mul, t, t);
    })->id;
    return st;
  }
  st.n = count_of(out, vecs)->id;
  ExprPtr shift = r(assign_new(out, "K", times(vecs[0].x[0], pinv)));
  ExprPtr sum = masked_reduce(out, vecs, BinOp::add, 0.0,
                              [&](std::vector<Stmt>&, const ExprPtr& x) { return binary(BinOp::sub, times(x, pinv), shift); });
  st.mean = assign_new(out, "lm", binary(BinOp::add, shift, binary(BinOp::div, sum, binary(BinOp::max, r(st.n), f32_const(1.0)))));
  ExprPtr half_pinv = pinv ? r(assign_new(out, "hpinv", binary(BinOp::mul, pinv, f32_const(0.5)))) : nullptr;
  ExprPtr mean = pinv ? r(assign_new(out, "hlm", binary(BinOp::mul, r(st.mean), f32_const(0.5)))) : r(st.mean);
  ExprPtr squares = masked_reduce(out, vecs, BinOp::add, 0.0, [&](std::vector<Stmt>& body, const ExprPtr& x) {
    ExprPtr d = r(assign_new(body, "d", binary(BinOp::sub, times(x, half_pinv), mean)));
    return binary(BinOp::mul, d, d);
  });
  st.m2 = pinv ? assign_new(out, "lq", binary(BinOp::mul, squares, f32_const(4.0))) : squares->id;
  return st;
}

// The same statistics of x / p, with p from the part's own largest |x|.
RowLowering::Stats RowLowering::scaled_part(std::vector<Stmt>& out, const std::vector<Vec>& vecs, bool centred) {
  const int p = scale_of(out, amax_of(out, vecs))->id;
  Stats st = part_stats(out, vecs, centred, r(assign_new(out, "pinv", binary(BinOp::div, f32_const(1.0), r(p)))));
  st.scaled = true;
  st.p = p;
  return st;
}

std::vector<int> RowLowering::Stats::regs() const {
  std::vector<int> v;
  for (int id : {n, p, mean, m2})
    if (id >= 0) v.push_back(id);
  return v;
}

RowLowering::Stats RowLowering::Stats::with(std::vector<int> v) const {
  Stats st = *this;
  size_t i = 0;
  for (int* id : {&st.n, &st.p, &st.mean, &st.m2})
    if (*id >= 0) *id = v[i++];
  return st;
}

std::vector<double> RowLowering::Stats::identities() const {
  std::vector<double> v;  // an empty part: count 0, the smallest scale, zero statistics
  if (n >= 0) v.push_back(0.0);
  if (p >= 0) v.push_back(kScaleLo);
  if (mean >= 0) v.push_back(0.0);
  v.push_back(0.0);
  return v;
}

// mine <- the union of the parts `mine` and `other` (values in Stats::regs() order). Scaled:
// both are brought to the larger scale P, the smaller by p_lo / P. LayerNorm merges by Chan et
// al.'s formulas; an empty side is selected away, never used in arithmetic.
void RowLowering::stats_merge(std::vector<Stmt>& out, const Stats& mine, const std::vector<ExprPtr>& other) {
  size_t i = 0;
  ExprPtr on = mine.n >= 0 ? other[i++] : nullptr, op = mine.p >= 0 ? other[i++] : nullptr;
  ExprPtr omean = mine.mean >= 0 ? other[i++] : nullptr, om2 = other[i++];
  // ra = p / P and rb = p_other / P: one of them 1, the other an exact power of two <= 1.
  ExprPtr ra, rb;
  if (mine.scaled) {
    int hi = assign_new(out, "P", binary(BinOp::max, r(mine.p), op));
    ra = r(assign_new(out, "ra", binary(BinOp::div, r(mine.p), r(hi))));
    rb = r(assign_new(out, "rb", binary(BinOp::div, op, r(hi))));
    out.push_back(assign(mine.p, r(hi)));
  }
  if (!mine.centred) {
    if (!mine.scaled) {
      out.push_back(assign(mine.m2, binary(BinOp::add, r(mine.m2), om2)));
      return;
    }
    out.push_back(assign(mine.m2, binary(BinOp::add, binary(BinOp::mul, r(mine.m2), binary(BinOp::mul, ra, ra)),
                                         binary(BinOp::mul, om2, binary(BinOp::mul, rb, rb)))));
    return;
  }
  ExprPtr ma = r(mine.mean), mb = omean, qa = r(mine.m2), qb = om2;
  if (mine.scaled) {
    ma = r(assign_new(out, "ma", binary(BinOp::mul, ma, ra)));
    mb = r(assign_new(out, "mb", binary(BinOp::mul, mb, rb)));
    qa = binary(BinOp::mul, qa, binary(BinOp::mul, ra, ra));
    qb = binary(BinOp::mul, qb, binary(BinOp::mul, rb, rb));
  }
  int total = assign_new(out, "n", binary(BinOp::add, r(mine.n), on));
  int delta = assign_new(out, "d", binary(BinOp::sub, mb, ma));
  int share = assign_new(out, "sh", binary(BinOp::div, on, binary(BinOp::max, r(total), f32_const(1.0))));
  ExprPtr mean = binary(BinOp::add, ma, binary(BinOp::mul, r(delta), r(share)));
  ExprPtr m2 = binary(BinOp::add, binary(BinOp::add, qa, qb),
                      binary(BinOp::mul, binary(BinOp::mul, r(delta), r(delta)), binary(BinOp::mul, r(mine.n), r(share))));
  ExprPtr other_empty = r(assign_new(out, "oe", binary(BinOp::eq, on, f32_const(0.0))));
  ExprPtr mine_empty = r(assign_new(out, "me", binary(BinOp::eq, r(mine.n), f32_const(0.0))));
  out.push_back(assign(mine.m2, select(other_empty, r(mine.m2), select(mine_empty, om2, m2))));
  out.push_back(assign(mine.mean, select(other_empty, r(mine.mean), select(mine_empty, omean, mean))));
  out.push_back(assign(mine.n, r(total)));
}

RowLowering::Stats RowLowering::merge_stats(std::vector<Stmt>& out, const Stats& st) {
  return st.with(merge_across_workers(out, st.regs(), st.identities(),
                                      [&](std::vector<Stmt>& body, const std::vector<int>& mine, const std::vector<ExprPtr>& other) {
                                        stats_merge(body, st.with(mine), other);
                                      }));
}

// The statistics of element expression `e` over the whole row, in every worker of the program,
// and their scale P (-1 when unscaled).
//  - Re-read: running statistics at the largest scale seen so far, one part per loop iteration
//    merged in, then scaled merges across workers.
//  - Registers, RMSNorm: a scaled part per worker, merged across workers.
//  - Registers, LayerNorm: one max reduction gives the row's largest |x| and so P in every
//    worker; Chan's merge of parts of x / P then carries three values instead of four. The row
//    pays the two barriers its two reductions always had.
RowLowering::RowStats RowLowering::row_stats(std::vector<Stmt>& out, int e, bool centred, bool scaled_stats) {
  hoist_row_scalars(out, e);
  RowStats rs;
  if (plan_.caching == InputCaching::registers) {
    std::vector<Vec> vecs;
    for (Slot& slot : cached_) vecs.push_back(vec_of(out, slot, e));
    if (!scaled_stats) {
      rs.st = merge_stats(out, part_stats(out, vecs, centred, nullptr));
    } else if (!centred) {
      rs.st = merge_stats(out, scaled_part(out, vecs, false));
      rs.P = rs.st.p;
    } else {
      const int amax = amax_of(out, vecs)->id;
      const int row_amax = merge_across_workers(out, {amax}, {0.0}, [&](std::vector<Stmt>& body, const std::vector<int>& mine,
                                                                        const std::vector<ExprPtr>& other) {
        body.push_back(assign(mine[0], binary(BinOp::max, r(mine[0]), other[0])));
      })[0];
      rs.P = scale_of(out, r(row_amax))->id;
      rs.st = merge_stats(out, part_stats(out, vecs, true, r(assign_new(out, "Pinv", binary(BinOp::div, f32_const(1.0), r(rs.P))))));
      rs.uniform = true;
    }
    return rs;
  }
  Stats& st = rs.st;
  st.centred = centred, st.scaled = scaled_stats;
  if (centred) st.n = assign_new(out, "acc_n", f32_const(0.0));
  if (scaled_stats) st.p = assign_new(out, "acc_p", f32_const(kScaleLo));
  if (centred) st.mean = assign_new(out, "acc_mean", f32_const(0.0));
  st.m2 = assign_new(out, "acc_m2", f32_const(0.0));
  std::vector<Vec> vecs;
  for (Stmt& s : reread_loop([&](std::vector<Stmt>& body, Slot& slot) {
         vecs.push_back(vec_of(body, slot, e));
         if (int(vecs.size()) < plan_.stripe_unroll) return;
         // The iteration's part at the running scale, raised to its own largest |x| if that is
         // larger: one division for 1 / P and the running statistics times P_old / P (exact).
         ExprPtr pinv;
         if (scaled_stats) {
           int scale = assign_new(body, "P", binary(BinOp::max, r(st.p), scale_of(body, amax_of(body, vecs))));
           pinv = r(assign_new(body, "pinv", binary(BinOp::div, f32_const(1.0), r(scale))));
           ExprPtr ratio = r(assign_new(body, "ra", binary(BinOp::mul, r(st.p), pinv)));
           if (centred) body.push_back(assign(st.mean, binary(BinOp::mul, r(st.mean), ratio)));
           body.push_back(assign(st.m2, binary(BinOp::mul, r(st.m2), binary(BinOp::mul, ratio, ratio))));
           body.push_back(assign(st.p, r(scale)));
         }
         std::vector<ExprPtr> part;
         for (int id : part_stats(body, vecs, centred, pinv).regs()) part.push_back(r(id));
         Stats unscaled = st;
         unscaled.scaled = false, unscaled.p = -1;
         stats_merge(body, unscaled, part);
         vecs.clear();
       }))
    out.push_back(std::move(s));
  st = merge_stats(out, st);
  rs.P = st.p;
  return rs;
}

// RMSNorm's and LayerNorm's statistics and the row scalars of the output pass: 1 / P and, for
// LayerNorm, the mean of x / P; `inv` becomes k = P * inv = rsqrt(m2 / cols + s / P^2), so
// the product C * inv is (x / P - mean) * k. Where s / P^2 overflows, s dwarfs the statistics
// and k is P * rsqrt(s + ms P^2). Where it underflows, a floor of 2^-126 for s > 0 (below the
// statistics of any row that is not constant) keeps a constant row's 0 * k at 0, not 0 * inf.
void RowLowering::norm_statistics(std::vector<Stmt>& out) {
  if (norm_k_ >= 0) return;
  const NormIdiom& n = *norm_;
  out.push_back(comment(std::string(n.centred() ? "count, mean and squared deviations" : "sum of squares") +
                        (norm_scaled_ ? " scaled by a power of two" : "") + " for %" + std::to_string(n.inv)));
  RowStats rs = row_stats(out, n.element, n.centred(), norm_scaled_);
  const Stats& st = rs.st;
  ExprPtr s = row_scalar(out, n.eps);
  ExprPtr cols = cast(Type::f32, param(p_cols_, Type::i64));
  ExprPtr ms = binary(BinOp::div, r(st.m2), cols);
  if (n.centred()) norm_mean_ = st.mean;
  if (!norm_scaled_) {
    norm_k_ = assign_new(out, "k", unary(UnOp::rsqrt, binary(BinOp::add, ms, s)));
    return;
  }
  norm_pinv_ = assign_new(out, "pinv", binary(BinOp::div, f32_const(1.0), r(rs.P)));
  ExprPtr s_scaled = binary(BinOp::mul, binary(BinOp::mul, s, r(norm_pinv_)), r(norm_pinv_));
  int e2 = assign_new(out, "e2", binary(BinOp::max, s_scaled, binary(BinOp::min, s, f32_const(0x1p-126))));
  ExprPtr overflow = binary(BinOp::eq, r(e2), f32_const(std::numeric_limits<double>::infinity()));
  // Unscaled in that case: ms * P^2 is negligible beside s, but carries a NaN.
  ExprPtr unscaled = binary(BinOp::add, s, binary(BinOp::mul, binary(BinOp::mul, ms, r(rs.P)), r(rs.P)));
  norm_k_ = assign_new(out, "k", select(overflow, binary(BinOp::mul, r(rs.P), unary(UnOp::rsqrt, unscaled)),
                                        unary(UnOp::rsqrt, binary(BinOp::add, ms, r(e2)))));
  // Register-cached LayerNorm: the output pass multiplies x by 2 / P, no product the statistics
  // computed (x / P), so none stays live: (x * 2/P - 2 mean) * k/2.
  if (rs.uniform) {
    norm_pinv_ = assign_new(out, "pinv2", binary(BinOp::mul, r(norm_pinv_), f32_const(2.0)));
    norm_mean_ = assign_new(out, "mean2", binary(BinOp::mul, r(norm_mean_), f32_const(2.0)));
    norm_k_ = assign_new(out, "khalf", binary(BinOp::mul, r(norm_k_), f32_const(0.5)));
  }
}

// The product C * inv of the idiom, element by element: (x / P - mean) * k, or (x / P) * k for
// RMSNorm (1 / P times k could overflow for tiny rows when s is 0).
const std::vector<int>& RowLowering::norm_product(std::vector<Stmt>& out, Slot& slot) {
  norm_statistics(out);
  std::vector<int> regs;
  for (int id : element(out, slot, norm_->element)) {
    ExprPtr v = norm_pinv_ >= 0 ? binary(BinOp::mul, r(id), r(norm_pinv_)) : r(id);
    if (norm_mean_ >= 0) v = binary(BinOp::sub, v, r(norm_mean_));
    regs.push_back(assign_new(out, "e", binary(BinOp::mul, v, r(norm_k_))));
  }
  return slot.memo[norm_->product] = regs;
}

// Re-read plans compute a sum and the sum of squared deviations from its mean in one pass
// (online_variance_partner) where no normalisation idiom takes them: Chan's merge, unscaled.
void RowLowering::online_mean_m2(std::vector<Stmt>& out, int sum_node, int m2_node) {
  out.push_back(comment("reductions %" + std::to_string(sum_node) + " (sum) and %" + std::to_string(m2_node) +
                        " (sum of squared deviations from the mean) in one pass"));
  Stats st = row_stats(out, prog_.nodes()[sum_node].a, true, false).st;
  // The row sum is count x mean; the program's mean divides it by cols again.
  scalars_[sum_node] = assign_new(out, "s", binary(BinOp::mul, r(st.n), r(st.mean)));
  scalars_[m2_node] = st.m2;
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

std::optional<NormIdiom> norm_idiom(const RowProgram& program) {
  const auto& nodes = program.nodes();
  const int count = int(nodes.size());
  std::vector<std::vector<int>> users(static_cast<size_t>(count));
  for (int i = 0; i < count; ++i) {
    if (nodes[i].a >= 0) users[size_t(nodes[i].a)].push_back(i);
    if (nodes[i].b >= 0 && nodes[i].b != nodes[i].a) users[size_t(nodes[i].b)].push_back(i);
  }
  auto used_only_by = [&](int node, std::initializer_list<int> allowed) {
    if (node == program.output_node() || users[size_t(node)].empty()) return false;
    for (int u : users[size_t(node)])
      if (std::find(allowed.begin(), allowed.end(), u) == allowed.end()) return false;
    return true;
  };
  auto is = [&](int id, RowNode::Kind kind) { return id >= 0 && nodes[id].kind == kind; };
  auto is_binary = [&](int id, BinaryFn fn) { return is(id, RowNode::Kind::binary) && nodes[id].binary == fn; };
  auto is_sum = [&](int id) { return is(id, RowNode::Kind::reduce) && nodes[id].reduction == Reduction::sum; };
  // s / cols, with s a sum reduction: the sum, or -1.
  auto sum_over_cols = [&](int id) { return is_binary(id, BinaryFn::div) && is_sum(nodes[id].a) && is(nodes[id].b, RowNode::Kind::cols) ? nodes[id].a : -1; };
  std::function<bool(int)> reads_reduction = [&](int id) {
    if (id < 0) return false;
    return is(id, RowNode::Kind::reduce) || reads_reduction(nodes[id].a) || reads_reduction(nodes[id].b);
  };
  for (int inv = 0; inv < count; ++inv) {
    if (!is(inv, RowNode::Kind::unary) || nodes[inv].unary != UnaryFn::rsqrt) continue;
    const int t = nodes[inv].a;
    if (!is_binary(t, BinaryFn::add)) continue;
    for (auto [ms, eps] : {std::pair{nodes[t].a, nodes[t].b}, std::pair{nodes[t].b, nodes[t].a}}) {
      const int square_sum = sum_over_cols(ms);
      if (square_sum < 0 || program.is_element(eps) || reads_reduction(eps)) continue;
      const int square = nodes[square_sum].a;
      if (!is_binary(square, BinaryFn::mul) || nodes[square].a != nodes[square].b) continue;
      const int c = nodes[square].a;
      if (users[size_t(inv)].size() != 1) continue;
      const int product = users[size_t(inv)][0];
      if (!is_binary(product, BinaryFn::mul) ||
          !((nodes[product].a == c && nodes[product].b == inv) || (nodes[product].a == inv && nodes[product].b == c)))
        continue;
      if (!used_only_by(square, {square_sum}) || !used_only_by(square_sum, {ms}) || !used_only_by(ms, {t}) ||
          !used_only_by(t, {inv}) || !used_only_by(inv, {product}))
        continue;
      NormIdiom idiom{c, c, -1, square_sum, inv, eps, product};
      // LayerNorm: C = E - sum(E) / cols, used only by C * C and C * inv.
      if (is_binary(c, BinaryFn::sub)) {
        const int e = nodes[c].a, mean = nodes[c].b, mean_sum = sum_over_cols(mean);
        if (mean_sum >= 0 && nodes[mean_sum].a == e && used_only_by(mean_sum, {mean}) && used_only_by(mean, {c}) &&
            used_only_by(c, {square, product}))
          idiom.element = e, idiom.mean_sum = mean_sum;
      }
      return idiom;
    }
  }
  return std::nullopt;
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
