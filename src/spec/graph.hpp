// Walks over a row program's graph that reach each node once: a walk of every path takes time
// exponential in the depth of programs that reuse values (Newton's iteration reads v three
// times a step).
#pragma once

#include <functional>
#include <vector>

#include "tile/spec.hpp"

namespace tile {

// Calls visit(id) for `root` and, depth first in operand order (a, b, c), for every node it
// depends on, each once; visit returns whether to go on into that node's operands. Recursion
// depth is bounded by RowProgram::kMaxNodes.
inline void visit_once(const std::vector<RowNode>& nodes, int root, const std::function<bool(int)>& visit) {
  std::vector<char> seen(nodes.size(), 0);
  std::function<void(int)> walk = [&](int id) {
    if (seen[size_t(id)]) return;
    seen[size_t(id)] = 1;
    if (!visit(id)) return;
    const RowNode& n = nodes[size_t(id)];
    for (int o : {n.a, n.b, n.c})
      if (o >= 0) walk(o);
  };
  walk(root);
}

}  // namespace tile
