// The scope stack: how the workers that cooperate on a kernel are nested, innermost first.
//
// lane < warp < program < group < cluster < grid. A worker (lane) runs alone; a warp is 32
// lanes executing together; a program is the workers that cooperate on one row; a group (thread
// block) packs programs; a cluster is groups that can read each other's shared memory; the grid
// is every group of a launch. A reduction merges its parts up through exactly the scopes it
// spans, a barrier synchronises every worker of one scope, and the verifier proves each
// synchronisation sits on control flow uniform across its scope (docs: internals/row_programs).
#pragma once

#include <cstdint>

namespace tile {

enum class Scope : uint8_t { lane, warp, program, group, cluster, grid };

inline const char* scope_name(Scope s) {
  switch (s) {
    case Scope::lane: return "lane";
    case Scope::warp: return "warp";
    case Scope::program: return "program";
    case Scope::group: return "group";
    case Scope::cluster: return "cluster";
    case Scope::grid: return "grid";
  }
  return "?";
}

}  // namespace tile
