// verify: the rules every kernel must satisfy before a backend runs it.
//
// - types: operands, registers, parameters, indices and conditions have the types ir.hpp gives;
//   every float value, register, parameter and shared slot has the kernel's float type (`real`);
// - a group barrier sits on control flow uniform across the whole group, so guard programs
//   (rows past the last) still arrive; a program barrier on control flow uniform across its
//   program; a shfl_xor or shfl_idx on control flow uniform across its warp;
// - a cluster barrier sits on control flow uniform across the cluster (every group of it, those
//   past the last row too), and appears only in kernels whose groups form clusters;
// - shared regions of packed programs do not overlap and every shared index provably lies
//   inside its region; a remote read's rank provably lies in [0, ctas_per_cluster);
// - a remote read follows a cluster barrier on every path, and a cluster barrier follows the
//   last remote read on every path before the kernel ends;
// - registers holding cached input fit the private budget (32-bit scalars: an f64 counts two);
// - staged regions hold a float dtype; an async copy reads an input buffer of its region's
//   dtype, a staged load fills one register of the kernel's float type per element, and both
//   name an existing staged region at an i64 offset; copies, commits, async waits and staged
//   loads sit outside loops (staged regions are single-phase);
// - a staged load follows, on every path, an async wait that saw land the group of every copy
//   into its region at the same offset (expressions compared structurally; other offsets are
//   the CPU executor's to check, element by element), and no copy into a region follows a
//   staged load of it on any path.
// Uniformity is a fixed point over register assignments, found by walking the kernel with an
// IRVisitor (src/ir/visitor.hpp) until no register changes. Tested by tests/ir/verifier_test.cpp.
#pragma once

#include <string>
#include <vector>

#include "ir/ir.hpp"

namespace tile::ir {

// Every rule violation found, one message each; empty when the kernel is valid.
std::vector<std::string> verify(const Kernel& kernel);
// Throws tile::InternalError listing the violations: a lowered kernel that fails is a bug.
void verify_or_throw(const Kernel& kernel);

}  // namespace tile::ir
