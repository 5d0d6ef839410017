// The built-in operators' Call as operands of their row programs.
#include <cmath>
#include <cstdio>

#include "bind/bind.hpp"
#include "tile/tile.hpp"

namespace tile {

Args to_args(const Call& call) {
  Args a;
  a.set("x", call.x).set("y", call.y);
  // Only the operands the operator declares: a weight given to softmax is an unknown operand.
  if (call.weight.data) a.set("weight", call.weight);
  if (call.bias.data) a.set("bias", call.bias);
  if (call.eps) a.set("eps", *call.eps);
  return a;
}

float checked_eps(Op op, double eps) {
  const RowProgram& p = builtin_program(op);
  const int i = p.find_operand("eps");
  if (i < 0) {
    char given[32];
    std::snprintf(given, sizeof given, "%.9g", double(float(eps)));
    throw_argument_error(op_name(op), "eps", "no eps (the operator takes none)", given);
  }
  // The same checks a call's binding makes: the declared range, then fp32's.
  // fp32 rounding to nearest errs by at most 2^-24 relative in the normal range; a value that
  // rounds to 0 or inf, or loses more as a subnormal, is not the eps the caller asked for.
  const float f = float(eps);
  const bool held = eps == 0 || (std::isfinite(f) && f > 0 && std::abs(double(f) - eps) <= 0x1p-24 * eps);
  if (!held || eps < p.operands()[i].min_value) {
    char given[32];
    std::snprintf(given, sizeof given, "%.9g", eps);
    throw_argument_error(op_name(op), "eps",
                         "0 or a finite positive value that float32 holds within rounding (relative error at most "
                         "2^-24: [1.17549435e-38, 3.40282347e+38] and the subnormals float32 holds exactly)",
                         given);
  }
  return f;
}

}  // namespace tile
