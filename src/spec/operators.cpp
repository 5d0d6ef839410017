// The four forward operators as row programs.
#include "tile/error.hpp"
#include "tile/spec.hpp"

namespace tile {

std::string op_name(Op op) {
  switch (op) {
    case Op::softmax: return "softmax";
    case Op::log_softmax: return "log_softmax";
    case Op::rms_norm: return "rms_norm";
    case Op::layer_norm: return "layer_norm";
  }
  return "?";
}

Op parse_op(const std::string& name) {
  for (Op op : {Op::softmax, Op::log_softmax, Op::rms_norm, Op::layer_norm})
    if (op_name(op) == name) return op;
  throw Error("operator: expected one of softmax, log_softmax, rms_norm, layer_norm, got '" +
              name + "'");
}

RowProgram make_program(Op op, bool has_weight, bool has_bias) {
  RowProgram p(op_name(op));
  RowExpr x = p.input();
  switch (op) {
    case Op::softmax: {
      // Subtracting the row max keeps exp finite; an all -inf row gives NaN as in PyTorch.
      RowExpr e = exp(x - p.reduce(Reduction::max, x));
      p.output(e * (p.constant(1.0) / p.reduce(Reduction::sum, e)));
      break;
    }
    case Op::log_softmax: {
      RowExpr shifted = x - p.reduce(Reduction::max, x);
      p.output(shifted - log(p.reduce(Reduction::sum, exp(shifted))));
      break;
    }
    case Op::rms_norm: {
      RowExpr mean_square = p.reduce(Reduction::sum, x * x) / p.cols();
      RowExpr y = x * rsqrt(mean_square + p.scalar("eps"));
      p.output(has_weight ? y * p.column("weight") : y);
      break;
    }
    case Op::layer_norm: {
      // Two passes over the cached row: the variance never comes from E[x^2] - E[x]^2.
      RowExpr mean = p.reduce(Reduction::sum, x) / p.cols();
      RowExpr centered = x - mean;
      RowExpr variance = p.reduce(Reduction::sum, centered * centered) / p.cols();
      RowExpr y = centered * rsqrt(variance + p.scalar("eps"));
      if (has_weight) y = y * p.column("weight");
      if (has_bias) y = y + p.column("bias");
      p.output(y);
      break;
    }
  }
  return p;
}

}  // namespace tile
