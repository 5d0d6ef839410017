#include "cost/cost_model.hpp"

#include <set>

#include "lower/lower_row_program.hpp"

namespace tile {

namespace {
// Columns an element expression reads.
void columns_used(const RowProgram& p, int node, std::set<std::string>& out) {
  const RowNode& n = p.nodes()[node];
  if (n.kind == RowNode::Kind::column) out.insert(n.name);
  if (n.kind == RowNode::Kind::reduce) return;  // a row scalar: computed in an earlier pass
  if (n.a >= 0) columns_used(p, n.a, out);
  if (n.b >= 0) columns_used(p, n.b, out);
}
}  // namespace

CostEstimate estimate_cost(const RowProgram& program, const PlanInputs& in, const MappingPlan& plan) {
  CostEstimate c;
  const int64_t P = plan.programs_per_group, W = plan.workers_per_program, V = plan.vector_elems;
  const int64_t xes = dtype_size(in.x_dtype), yes = dtype_size(in.y_dtype), wes = dtype_size(in.column_dtype);
  const int64_t groups = (in.rows + P - 1) / P;
  const int64_t programs = groups * P;  // including guard programs

  // The element expression of every pass: one per reduction, then the output.
  // Re-read plans compute softmax's max and sum, and LayerNorm's sum and squared deviations,
  // in one pass each.
  const bool cached = plan.caching == InputCaching::registers;
  std::vector<int> passes;
  std::set<int> merged;
  for (size_t n = 0; n < program.nodes().size(); ++n) {
    if (program.nodes()[n].kind != RowNode::Kind::reduce || merged.count(int(n))) continue;
    passes.push_back(program.nodes()[n].a);
    for (int partner : {online_max_partner(program, int(n)), online_variance_partner(program, int(n))})
      if (!cached && partner >= 0) merged.insert(partner);
  }
  passes.push_back(program.output_node());

  c.input_passes = cached ? 1 : int(passes.size());
  // Stripes each worker walks per pass (re-read loops round up to whole unrolled iterations).
  const int64_t step = W * V * plan.stripe_unroll;
  const int64_t stripes = cached ? plan.stripes : ((in.cols + step - 1) / step) * plan.stripe_unroll;

  auto pass_bytes = [&](int64_t es) {
    if (plan.tail == TailHandling::clamp) return programs * W * stripes * V * es;  // every lane, every program
    return in.rows * in.cols * es;  // only elements of real rows
  };
  c.bytes_read = c.input_passes * pass_bytes(xes);
  for (int element : passes) {
    std::set<std::string> cols;
    columns_used(program, element, cols);
    c.bytes_read += int64_t(cols.size()) * pass_bytes(wes);
  }
  c.bytes_written = in.rows * in.cols * yes;
  c.compulsory_bytes = in.rows * in.cols * (xes + yes) + int64_t(program.columns().size()) * in.cols * wes;
  return c;
}

}  // namespace tile
