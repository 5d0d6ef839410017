// The built-in operators' Call as operands of their row programs.
#include "tile/tile.hpp"

namespace tile {

Args to_args(const Call& call) {
  Args a;
  a.set("x", call.x).set("y", call.y);
  // Only the operands the operator declares: a weight given to softmax is an unknown operand.
  if (call.weight.data) a.set("weight", call.weight);
  if (call.bias.data) a.set("bias", call.bias);
  if (call.eps) a.set("eps", double(*call.eps));
  return a;
}

}  // namespace tile
