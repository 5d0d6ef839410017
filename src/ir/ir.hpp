// The raw IR: typed per-worker (SPMD) code for one kernel.
//
// Every worker (thread) of a group runs `Kernel::body`. Registers are mutable typed slots
// private to a worker. Memory is global buffers (kernel arguments, addressed in elements) and
// per-program shared-memory regions, one copy per group; a kernel whose groups form clusters
// (`ctas_per_cluster` > 1) may read another group's copy of its cluster (`remote_shared_load`).
// Synchronisation is explicit: `barrier` statements (cluster scope = every worker of every group
// of the cluster; group scope = every worker of the group; program scope = every worker of one
// packed program), `shfl_xor` (all 32 lanes of a warp exchange a register) and `shfl_idx` (every
// lane reads one lane's register). Control flow is structured
// (`if_`, `for_`). The CPU backend (src/backend/cpu/executor.cpp) defines what each node
// means; the CUDA emitter prints the same nodes as CUDA C++; the verifier proves the rules
// listed in src/ir/verifier.hpp.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tile/dtype.hpp"
#include "tile/plan.hpp"
#include "tile/scope.hpp"

namespace tile::ir {

// Register types. Memory dtypes (f16/bf16) appear only on buffers; loads of float buffers
// convert to the kernel's float type (`Kernel::real`, f32 or f64), the only float register
// type of the kernel. f64 comes last so the earlier values keep their numbers.
enum class Type : uint8_t { f32, i32, i64, b1, f64 };
const char* type_name(Type t);
constexpr bool is_real(Type t) { return t == Type::f32 || t == Type::f64; }

// Per-worker built-in values; their uniformity is fixed (see verifier.hpp).
enum class Special : uint8_t {
  group_index,        // i64: index of this group in the grid               (group-uniform)
  program_in_group,   // i32: which packed program this worker belongs to   (program-uniform)
  worker_in_program,  // i32: 0 .. workers_per_program-1                     (varying)
  warp_in_program,    // i32: worker_in_program / 32                         (warp-uniform)
  lane,               // i32: threadIdx.x % 32                               (varying)
  group_count,        // i64: groups in the grid                              (uniform)
  cta_in_cluster,     // i32: rank of this group in its cluster, 0 .. ctas_per_cluster-1 (group-uniform)
  cluster_index,      // i64: group_index / ctas_per_cluster                 (cluster-uniform)
};
const char* special_name(Special s);

// exponent: floor(log2 |a|) for finite nonzero a, else 0 (f32 or f64). ldexp: a * 2^b for an
// integer-valued b of a's type, exact, b clamped to [-1000, 1000] (f32) or [-3000, 3000]
// (f64); NaN if b is NaN.
enum class UnOp : uint8_t { neg, exp, log, rsqrt, sqrt, not_, exp2, abs, tanh, exponent };
enum class BinOp : uint8_t { add, sub, mul, div, rem, min, max, lt, le, eq, ne, and_, or_, ldexp };
const char* unop_name(UnOp op);
const char* binop_name(BinOp op);

struct Expr;
using ExprPtr = std::shared_ptr<const Expr>;

struct Expr {
  enum class Kind : uint8_t {
    constant,     // f32/f64/i32/i64/b1 literal: `f` for f32 and f64, `i` for the others
    reg,          // register `id`
    special,      // Special(`id`)
    param,        // scalar kernel parameter `id`
    unary,        // op(args[0]); not_ is b1 -> b1, neg and abs keep the type, the rest are
                  // float -> the same float type
    binary,       // args[0] op args[1]; both operands of `type` except comparisons (-> b1);
                  // float min and max are NaN if either operand is NaN
    select,       // args[0] (b1) ? args[1] : args[2]
    cast,         // convert args[0] to `type` (float <-> i32/i64, i32 <-> i64, f32 <-> f64)
    row_aligned,  // b1: buffer `id` + element offset args[0] (i64) is aligned to `i` bytes
    unpack16,     // f32: the 16-bit value of DType(`id`) in half `i` (0 low, 1 high) of i32 args[0]
  };
  Kind kind;
  Type type;
  int id = -1;
  double f = 0.0;
  int64_t i = 0;
  UnOp unop = UnOp::neg;
  BinOp binop = BinOp::add;
  std::vector<ExprPtr> args;
};

// Expression builders. They do not type-check; the verifier does.
ExprPtr f32_const(double v);
ExprPtr f64_const(double v);
ExprPtr float_const(Type t, double v);  // f32_const or f64_const
ExprPtr i32_const(int64_t v);
ExprPtr i64_const(int64_t v);
ExprPtr b1_const(bool v);
ExprPtr reg(int id, Type t);
ExprPtr special(Special s);
ExprPtr param(int id, Type t);
ExprPtr unary(UnOp op, ExprPtr a);
ExprPtr binary(BinOp op, ExprPtr a, ExprPtr b);  // result type: b1 for comparisons, else a's
ExprPtr select(ExprPtr c, ExprPtr a, ExprPtr b);
ExprPtr cast(Type t, ExprPtr a);
ExprPtr row_aligned(int buffer, ExprPtr offset, int bytes);
ExprPtr unpack16(DType dtype, ExprPtr word, int half);

// A cluster barrier whole, or its two halves: work between a group's arrive and its wait
// overlaps the other groups' arrival (the lowering arrives at kernel start and waits before the
// first push; a cluster looping over row blocks arrives again once it has consumed an
// exchange's reads, and waits before the next exchange's pushes). A split barrier proves the
// cluster resident (and its exchange barriers, which have their own fence, initialised); its
// arrive is relaxed: it publishes no shared writes to remote loads (those need a whole barrier)
// and orders only reads whose values instructions before it consumed.
enum class BarrierPhase : uint8_t { both, arrive, wait };

struct Stmt {
  enum class Kind : uint8_t {
    assign,              // regs[dst] = value
    load,                // regs[dsts[j]] = buffer[index + j] for j < width (see below)
    store,               // buffer[index + j] = regs[srcs[j]] for j < min(width, valid)
                         // (registers are the kernel's float type for float buffers, i64 for
                         // integer buffers)
    shfl_xor,            // regs[dst] = regs[src] of lane (lane ^ offset) within segments of `width`
    shfl_idx,            // regs[dst] = regs[src] of lane `offset` of the lane's segment of `width`
    shared_store,        // shared[region][index] = value
    shared_load,         // regs[dst] = shared[region][index]
    remote_shared_load,  // regs[dst] = shared[region][index] of the group of rank `cta` (i32)
                         // in this cluster (this program's copy of the region there)
    remote_shared_push,  // shared[region][index] of the group of rank `cta` (i32) in this
                         // cluster = regs[src]: one of the pushes that region's exchange awaits
                         // there (CUDA: st.async completing the owner's transaction mbarrier)
    exchange_wait,       // wait until every push of the region's next phase has landed in this
                         // group's exchange region `region` (acquire): its slots may be read until
                         // a cluster arrive retires the phase
    async_copy,          // staged[region][at + j] = buffer[index + j] for j < min(width, valid), as
                         // stored (no conversion), asynchronously, in this worker's open group of
                         // copies: the worker may read the elements once an async_wait has seen
                         // that group land, and no other worker may read them
    async_commit,        // closes the worker's open group of copies (later copies open another)
    async_wait,          // closes the open group if it holds copies, then waits until at most
                         // `offset` of the worker's groups are in flight: the older ones landed
    staged_load,         // regs[dsts[j]] = staged[region][at + j] converted to the kernel's float type
                         // for j < min(width, valid), `fill` for the others; only elements this
                         // worker copied, after they landed
    barrier,             // wait for every worker of `scope` (program, group or cluster); a cluster
                         // barrier also orders shared memory accesses across the cluster (release /
                         // acquire), so remote reads after it see what the owner wrote before it. A
                         // cluster barrier may be split (`phase`): an arrive, then later a wait that
                         // returns once every worker of the cluster has arrived
    if_,                 // if (cond) body else else_body
    for_,                // for (regs[dst] = begin; regs[dst] < end; ++regs[dst]) body
    comment,             // text, printed only
  };
  Kind kind;
  int dst = -1;
  int src = -1;
  std::vector<int> dsts;  // load destinations / store sources (float registers), one per lane
  ExprPtr value, index, valid, aligned, cond, begin, end;
  ExprPtr cta;     // remote_shared_load, remote_shared_push: rank of the group read or written
  ExprPtr at;      // async_copy, staged_load: i64 element offset in the staged region
  int buffer = -1;
  int width = 1;   // vector width (load/store) or segment width (shfl_xor, shfl_idx)
  int offset = 0;  // shfl_xor lane offset, shfl_idx source lane
  int region = -1;  // shared region (staged region for async_copy and staged_load)
  bool clamp = false;
  bool raw = false;  // load: dsts are i32 registers holding the bits of element pairs
  bool whole = false;  // load/store/async_copy/staged_load: `valid` is <= 0 or >= width, and
                       // `aligned` holds (see below)
  float fill = 0.0f;
  Scope scope = Scope::group;  // barrier
  BarrierPhase phase = BarrierPhase::both;  // barrier (cluster scope): arrive and wait, or one
  std::vector<Stmt> body, else_body;
  std::string text;
};
// Load/store semantics. `index` (i64) is the element offset of element 0 in the buffer,
// `valid` (i64) how many of the `width` elements lie inside the row, `aligned` (b1) whether
// the access may be one vector instruction. When aligned && valid >= width the access is one
// vector access of width elements; it is an error if the address is then not aligned to
// width * dtype bytes. Otherwise it is `width` scalar accesses: element j is accessed when
// j < valid. A load with `clamp` instead reads element min(j, valid - 1) for every j (so every
// lane issues the same loads) and keeps the value only for j < valid. Elements not kept are
// set to `fill`. A `raw` load (16-bit buffers, even width) keeps the bits instead of
// converting: i32 register w holds element 2w in its low and 2w+1 in its high half, and
// elements not kept are 0 bits; `unpack16` converts one half to f32 where it is used.
// A `whole` access is all or nothing: with valid >= width it is the vector access; with
// valid <= 0 a load keeps only `fill` (a clamped one still reads the vector ending at
// index + valid, so every lane issues the same load) and a store writes nothing; anything
// else is an error. It carries no scalar path.

struct Buffer {
  std::string name;
  DType dtype;
  bool output;
  bool noalias = true;  // no other buffer of the launch can alias it (C++ __restrict__)
};
// The register type a load of `dtype` fills and a store of it reads, in a kernel whose float
// type is `real`.
inline Type value_type(DType dtype, Type real = Type::f32) { return is_float(dtype) ? real : Type::i64; }

struct ScalarParam {
  std::string name;
  Type type;
};

struct Register {
  std::string name;
  Type type;
  bool cached = false;  // holds cached input; counted against the private budget (an i32
                        // register of raw 16-bit pairs counts as two scalars)
};

// A shared-memory region of slots of the kernel's float type, one copy per packed program:
// program p's copy occupies [base + p * program_stride, base + p * program_stride + elems).
// With program_stride 0 it is one copy for the whole group, which every program indexes.
//
// An exchange region (pushes > 0) is filled only by remote pushes from the groups of the
// cluster, in phases: each phase, each group awaits exactly `pushes` of them, one per slot, and
// reads them only after its `exchange_wait` for that phase (the CUDA backend waits on the
// transaction barrier's parity, flipped each wait). A cluster looping over row blocks takes one
// phase a row: a cluster arrive after the phase's reads and a cluster wait before the next
// phase's pushes retire it, so no push overwrites a slot some group has yet to read. Its pushes
// are one-way, so no group needs a barrier with another within a phase: the owner cannot exit
// before its own wait, which needs them all.
struct SharedRegion {
  std::string name;
  int base = 0;
  int elems = 0;
  int program_stride = 0;
  int pushes = 0;  // > 0: an exchange region awaiting this many pushes
};

// A staged region: elements of one row input's dtype, as stored in memory, in dynamic shared
// memory (one copy per group; the lowering gives each worker its own elements). It is the
// cache of caching "shared": async copies fill it without holding registers, and each pass
// reads the worker's elements back. Single-phase: its copies and loads run outside loops.
struct StagedRegion {
  std::string name;
  DType dtype = DType::f32;
  int64_t elems = 0;
};

struct Kernel {
  std::string name;
  int programs_per_group = 1;
  int workers_per_program = 32;
  int private_budget = 64;
  int resident_groups = 1;  // groups per SM the kernel is compiled to fit (launch bounds)
  int ctas_per_cluster = 1;  // groups launched together as one cluster (1: no clusters)
  // The one float type of the kernel: every float register, parameter, shared slot and
  // loaded or stored float value has it (f32, or f64 in a float64 call).
  Type real = Type::f32;
  std::vector<Buffer> buffers;
  std::vector<ScalarParam> params;
  std::vector<Register> regs;
  std::vector<SharedRegion> shared;
  std::vector<StagedRegion> staged;
  std::vector<Stmt> body;

  int threads_per_group() const { return programs_per_group * workers_per_program; }
  int shared_elems() const;  // slots (of `real`) the group needs
  int exchange_count() const;  // exchange regions (each with its transaction barrier)
  int shared_bytes() const { return shared_elems() * (real == Type::f64 ? 8 : 4); }
  // Byte offset of staged region `region` in the group's dynamic shared memory (16-byte
  // aligned), and the bytes every staged region takes together.
  int64_t staged_offset(int region) const;
  int64_t staged_bytes() const { return staged_offset(int(staged.size())); }
  // All the shared memory a group takes: its static slots and its staged regions.
  int64_t group_shared_bytes() const { return shared_bytes() + staged_bytes(); }
  int add_reg(std::string name, Type type, bool cached = false);
  int param_index(const std::string& name) const;  // -1 when absent
};

// Statement builders.
Stmt assign(int dst, ExprPtr value);
Stmt load(std::vector<int> dsts, int buffer, ExprPtr index, ExprPtr valid, ExprPtr aligned,
          bool clamp, float fill);
Stmt load_raw(std::vector<int> words, int buffer, ExprPtr index, ExprPtr valid, ExprPtr aligned, bool clamp);
Stmt store(std::vector<int> srcs, int buffer, ExprPtr index, ExprPtr valid, ExprPtr aligned);
Stmt shfl_xor(int dst, int src, int offset, int width);
Stmt shfl_idx(int dst, int src, int lane, int width);
Stmt shared_store(int region, ExprPtr index, ExprPtr value);
Stmt shared_load(int dst, int region, ExprPtr index);
Stmt remote_shared_load(int dst, int region, ExprPtr index, ExprPtr cta);
Stmt remote_shared_push(int region, ExprPtr index, ExprPtr cta, int src);
Stmt exchange_wait(int region);
Stmt async_copy(int region, ExprPtr at, int buffer, ExprPtr index, int width, ExprPtr valid, ExprPtr aligned);
Stmt async_commit();
Stmt async_wait(int in_flight = 0);
Stmt staged_load(std::vector<int> dsts, int region, ExprPtr at, ExprPtr valid, float fill);
Stmt barrier(Scope scope);
Stmt cluster_arrive();
Stmt cluster_wait();
Stmt if_(ExprPtr cond, std::vector<Stmt> body, std::vector<Stmt> else_body = {});
Stmt for_(int var, ExprPtr begin, ExprPtr end, std::vector<Stmt> body);
Stmt comment(std::string text);

}  // namespace tile::ir
