#include "cost/cost_model.hpp"

#include <algorithm>
#include <set>

#include "lower/lower_row_program.hpp"
#include "spec/graph.hpp"

namespace tile {

namespace {

// Operands of `role` an element expression reads; stops at reduction results (earlier passes).
void operands_read(const RowProgram& p, int node, Role role, std::set<int>& out) {
  visit_once(p.nodes(), node, [&](int id) {
    const RowNode& n = p.nodes()[size_t(id)];
    if (n.kind == RowNode::Kind::load && p.operands()[n.operand].role == role) out.insert(n.operand);
    return n.kind != RowNode::Kind::result;
  });
}

}  // namespace

CostEstimate estimate_cost(const RowProgram& program, const BoundCall& call, const MappingPlan& plan) {
  CostEstimate c;
  const auto& decls = program.operands();
  // A program's workers: its width in each of the ctas_per_program groups it spans.
  const int64_t P = plan.programs_per_group, W = plan.row_workers(), V = plan.vector_elems;
  const int64_t rows = call.rows, cols = call.cols;
  const int64_t groups = grid_groups(call, plan) / plan.ctas_per_program;  // row blocks in flight
  const bool loops = plan.grid_limit > 0;
  // Programs that run, guard programs included: every row block's, whichever group owns it.
  const int64_t programs = loops ? ((rows + P - 1) / P) * P : groups * P;
  const bool cached = plan.caching == InputCaching::registers;
  const int64_t step = W * V * plan.stripe_unroll;
  const int64_t stripes = cached ? plan.stripes : ((cols + step - 1) / step) * plan.stripe_unroll;
  auto present = [&](int o) { return call.operands[o].present; };
  auto es = [&](int o) { return int64_t(dtype_size(call.operands[o].dtype)); };
  auto pass_bytes = [&](int64_t e) {
    if (plan.tail == TailHandling::clamp) return programs * W * stripes * V * e;  // every lane, every program
    return rows * cols * e;  // only elements of real rows
  };

  // The element expressions of each pass: one pass per level, then the output pass.
  std::vector<std::vector<int>> passes;
  for (const std::vector<int>& level : reduction_levels(program)) {
    std::vector<int> exprs;
    for (int red : level)
      for (int in : program.reductions()[red].inputs) exprs.push_back(in);
    passes.push_back(exprs);
  }
  std::vector<int> output;
  for (const RowStore& s : program.stores())
    if (present(s.operand) && decls[s.operand].role == Role::row_out) output.push_back(s.value);
  for (const RowReduction& r : program.reductions())
    if (r.axis == Axis::rows)
      for (int in : r.inputs)
        if (program.nodes()[in].shape.cols) output.push_back(in);
  if (!output.empty()) passes.push_back(output);

  // A level on the program fast path whose fast graph reads the row's first element: every
  // worker of every program that loads loads the row inputs' head vector (min(V, N) elements).
  std::vector<int64_t> head_reads(decls.size(), 0);
  for (const std::vector<int>& level : reduction_levels(program)) {
    if (!reads_row_head(program, level, plan)) continue;
    std::set<int> ins;
    for (int red : level)
      for (int in : program.reductions()[red].inputs) operands_read(program, in, Role::row_in, ins);
    for (int o : ins) ++head_reads[o];
  }
  const int64_t head_programs = plan.tail == TailHandling::clamp ? programs : rows;
  for (size_t o = 0; o < decls.size(); ++o)
    if (present(int(o)) && head_reads[o] > 0)
      c.bytes_read += head_reads[o] * head_programs * W * std::min(V, cols) * es(int(o));

  std::vector<int> reads(decls.size(), 0);
  std::set<int> columns_any;
  for (const std::vector<int>& pass : passes) {
    std::set<int> row_ins, col_ins;
    for (int e : pass) {
      operands_read(program, e, Role::row_in, row_ins);
      operands_read(program, e, Role::col_in, col_ins);
    }
    for (int o : row_ins) ++reads[o];
    for (int o : col_ins)
      if (present(o)) {
        if (cached) columns_any.insert(o);
        else c.bytes_read += pass_bytes(es(o));
      }
  }
  for (int o : columns_any) c.bytes_read += pass_bytes(es(o));
  for (size_t o = 0; o < decls.size(); ++o) {
    const Role role = decls[o].role;
    if (!present(int(o))) continue;
    if (role == Role::row_in && reads[o] > 0) {
      const int n = cached ? 1 : reads[o];
      c.input_passes = std::max(c.input_passes, n);
      c.bytes_read += n * pass_bytes(es(int(o)));
    }
    if (role == Role::row_scalar_in) c.bytes_read += (plan.tail == TailHandling::clamp ? programs : rows) * W * es(int(o));
    if (role == Role::row_out) c.bytes_written += rows * cols * es(int(o));
    if (role == Role::row_scalar_out) c.bytes_written += rows * es(int(o));
    if (role == Role::row_in || role == Role::row_out) c.compulsory_bytes += rows * cols * es(int(o));
    if (role == Role::row_scalar_in || role == Role::row_scalar_out) c.compulsory_bytes += rows * es(int(o));
    if (role == Role::col_in || role == Role::col_out) c.compulsory_bytes += cols * es(int(o));
    if (role == Role::scalar_out) c.compulsory_bytes += es(int(o));
  }
  return c;
}

}  // namespace tile
