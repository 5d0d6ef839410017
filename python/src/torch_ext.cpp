// tile._torch_C: the eager entry of Tile's operators for torch tensors, built against libtorch
// (optional: TILE_TORCH_EXTENSION, python/cmake/torch_extension.cmake).
//
// tile.softmax, log_softmax, rms_norm, layer_norm, fused_add_rms_norm and cross_entropy hand it their
// arguments as given. It takes a call whose tensors are plain torch.Tensor or nn.Parameter
// objects, strided, of float32, float64, float16 or bfloat16, on the CPU or a CUDA device, with
// no stream= and a plan given as None or JSON; for anything else it returns None and the
// package's Python paths take the call (python/tile/__init__.py). A call it takes is checked as those paths check it — the
// conversion of convert.hpp, in the same order and words — its outputs are allocated with
// at::empty, and it runs through libtile.so: on the CUDA backend on the tensors' device and
// current stream, replaying a call that repeats an earlier one but for its data pointers
// (tile::Replay, as launch_raw does), or on the CPU backend. Where an input requires grad with
// grad mode on, it records a C++ autograd node (TileSoftmaxBackward, ...) whose backward runs
// Tile's backward programs the same way, with the gradients the Python path computes.
// cross_entropy's node saves the count of rows not ignored with the lse, so its backward is one
// call; the backward operators called directly and row programs keep their Python paths.
// docs/source/python.md, "The torch extension"; tests: tests/python/test_torch_ext*.py.
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/zeros_like.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <nanobind/nanobind.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/python_cpp_function.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/autograd/saved_variable.h>

#include <atomic>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <typeinfo>
#include <unordered_map>
#include <vector>

// As in module.cpp: libtile.so's types keep default visibility so its exceptions are caught by type.
#pragma GCC visibility push(default)
#if TILE_WITH_CUDA
#include "backend/cuda/driver.hpp"  // ensure_context, current_device
#endif
#include "target/target.hpp"  // tile::Replay
#include "tile/tile.hpp"
#include "tile/training.hpp"
#pragma GCC visibility pop
#include "convert.hpp"

#ifndef TILE_TORCH_VERSION
#define TILE_TORCH_VERSION "unknown"
#endif

namespace nb = nanobind;
namespace ag = torch::autograd;

namespace {

using tile_py::ArrayInfo;
using tile_py::Slot;

PyObject* internal_error_type = nullptr;  // tile.InternalError, from tile._tile

// What the entries did, for tests and benchmarks: calls taken, CUDA launches replayed,
// autograd nodes recorded, backward passes run. Relaxed counters (backward runs on autograd's
// threads).
struct Counters {
  std::atomic<uint64_t> calls{0}, replays{0}, nodes{0}, backward{0};
};
Counters counters;

// ---- programs ----

constexpr size_t kMaxOperands = 16;

// A program the entries run and where its operands sit, looked up once by name.
struct ProgramInfo {
  const tile::RowProgram* program = nullptr;
  std::optional<tile::Op> builtin;  // a built-in operator: eps checked as the operators check it
  std::vector<std::string> names;   // the operands as errors name them (the built-ins' y is `out`)
  size_t first = 0;                 // the first row operand that is not optional: rows, columns, device
  bool may_need_workspace = false;  // per-column or scalar outputs: reductions over the rows

  ProgramInfo() = default;
  ProgramInfo(const tile::RowProgram& p, std::optional<tile::Op> op) : program(&p), builtin(op) {
    const auto& decls = p.operands();
    TILE_CHECK(decls.size() <= kMaxOperands, "program ", p.name(), " has more operands than the entries hold");
    for (const tile::OperandDecl& d : decls) {
      names.push_back(op && d.name == "y" ? "out" : d.name);
      may_need_workspace |= d.role == tile::Role::col_out || d.role == tile::Role::scalar_out;
    }
    while (first < decls.size() && !(tile_py::is_row(decls[first].role) && !decls[first].optional)) ++first;
    TILE_CHECK(first < decls.size(), "program ", p.name(), " has no row operand");
  }
  // The operand named so, or -1: resolved once, so that a call sets its operands by index.
  int slot(const char* name) const { return program->find_operand(name); }
};

// The operands the entries and nodes set, by name; -1 where a program has none of that name.
struct Slots {
  int x, y, weight, bias, eps, mean, rstd, dy, dx, dweight, dbias, residual, residual_out, dresidual_out, dresidual;
  int logits, target, ignore_index, label_smoothing, z_loss, softcap, loss, loss_sum, loss_mean, lse, count, dloss,
      dlogits;
  explicit Slots(const ProgramInfo& p)
      : x(p.slot("x")),
        y(p.slot("y")),
        weight(p.slot("weight")),
        bias(p.slot("bias")),
        eps(p.slot("eps")),
        mean(p.slot("mean")),
        rstd(p.slot("rstd")),
        dy(p.slot("dy")),
        dx(p.slot("dx")),
        dweight(p.slot("dweight")),
        dbias(p.slot("dbias")),
        residual(p.slot("residual")),
        residual_out(p.slot("residual_out")),
        dresidual_out(p.slot("dresidual_out")),
        dresidual(p.slot("dresidual")),
        logits(p.slot("logits")),
        target(p.slot("target")),
        ignore_index(p.slot("ignore_index")),
        label_smoothing(p.slot("label_smoothing")),
        z_loss(p.slot("z_loss")),
        softcap(p.slot("softcap")),
        loss(p.slot("loss")),
        loss_sum(p.slot("loss_sum")),
        loss_mean(p.slot("loss_mean")),
        lse(p.slot("lse")),
        count(p.slot("count")),
        dloss(p.slot("dloss")),
        dlogits(p.slot("dlogits")) {}
};

struct Program {
  ProgramInfo info;
  Slots slots;
  Program(const tile::RowProgram& p, std::optional<tile::Op> op) : info(p, op), slots(info) {}
};

// cross_entropy's programs: [pass][label smoothing][softcap] (tile::cross_entropy_program).
struct CrossEntropyPrograms {
  std::unique_ptr<Program> forward[2][2], backward[2][2];
  CrossEntropyPrograms() {
    for (int ls = 0; ls < 2; ++ls)
      for (int cap = 0; cap < 2; ++cap) {
        forward[ls][cap] = std::make_unique<Program>(
            tile::cross_entropy_program(tile::CrossEntropyPass::forward, ls, cap), std::nullopt);
        backward[ls][cap] = std::make_unique<Program>(
            tile::cross_entropy_program(tile::CrossEntropyPass::backward, ls, cap), std::nullopt);
      }
  }
};

struct Programs {
  Program softmax, log_softmax, rms_norm, layer_norm, fused_add_rms_norm;
  Program softmax_backward, log_softmax_backward, rms_norm_backward, layer_norm_backward, fused_add_rms_norm_backward;
  CrossEntropyPrograms cross_entropy;
};
const Programs* programs = nullptr;  // made at import

// One call: its operands by declaration index (null: absent) and its plan request.
struct Call {
  const ProgramInfo& info;
  const at::Tensor* tensors[kMaxOperands] = {};
  double scalars[kMaxOperands] = {};
  bool has_scalar[kMaxOperands] = {};
  const std::string* plan = nullptr;

  explicit Call(const Program& p) : info(p.info) {}
  // An absent operand (undefined, nullopt) is left unset, whether the program declares it or not.
  void set(int slot, const at::Tensor& t) {
    if (!t.defined()) return;
    TILE_CHECK(slot >= 0, "program ", info.program->name(), " has no such operand");
    tensors[slot] = &t;
  }
  void set(int slot, std::optional<double> v) {
    if (!v) return;
    TILE_CHECK(slot >= 0, "program ", info.program->name(), " has no such operand");
    scalars[slot] = *v;
    has_scalar[slot] = true;
  }
};

// ---- tensors ----

std::optional<tile::DType> tile_dtype(c10::ScalarType t) {
  switch (t) {
    case c10::ScalarType::Float:
      return tile::DType::f32;
    case c10::ScalarType::Double:
      return tile::DType::f64;
    case c10::ScalarType::Half:
      return tile::DType::f16;
    case c10::ScalarType::BFloat16:
      return tile::DType::bf16;
    default:
      return std::nullopt;
  }
}

// torch's names of the dtypes an entry takes, as the Python paths print a torch.dtype.
const char* torch_dtype_name(c10::ScalarType t) {
  switch (t) {
    case c10::ScalarType::Float:
      return "torch.float32";
    case c10::ScalarType::Double:
      return "torch.float64";
    case c10::ScalarType::Half:
      return "torch.float16";
    default:
      return "torch.bfloat16";
  }
}

// Dimension names (Tensor.names), in the torch versions that still have them (2.11 does, 2.15 not).
template <typename T>
bool has_names(const T& t) {
  if constexpr (requires { t.has_names(); })
    return t.has_names();
  else
    return false;
}

// A tensor whose memory the library reads as it is: strided, on the CPU or a CUDA device, of a
// float dtype Tile has, without a lazy negation (its data hold the values un-negated) and
// without dimension names (the Python paths' outputs may carry them).
bool readable(const at::Tensor& t) {
  const c10::DeviceType d = t.device().type();
  return t.layout() == c10::kStrided && (d == c10::DeviceType::CPU || d == c10::DeviceType::CUDA) &&
         tile_dtype(t.scalar_type()) && !t.is_neg() && !t.is_conj() && !has_names(t);
}

// The class indices of cross_entropy: int32 or int64.
std::optional<tile::DType> index_dtype(c10::ScalarType t) {
  if (t == c10::ScalarType::Int) return tile::DType::i32;
  if (t == c10::ScalarType::Long) return tile::DType::i64;
  return std::nullopt;
}

// The element type of a tensor an entry passes: a float dtype Tile has, or class indices.
tile::DType element_dtype(c10::ScalarType t) {
  if (const auto d = tile_dtype(t)) return *d;
  return index_dtype(t).value();
}

ArrayInfo array_info(const at::Tensor& t) {
  ArrayInfo a;
  a.data = t.data_ptr();
  a.dtype = tile_py::dlpack_dtype(element_dtype(t.scalar_type()));
  a.ndim = size_t(t.dim());
  a.shape = t.sizes().data();
  a.strides = t.strides().data();
  a.device = t.is_cuda() ? tile_py::Device{tile_py::kDLCUDA, int(t.get_device())} : tile_py::Device{tile_py::kDLCPU, 0};
  return a;
}

struct Bound {
  tile::Args args;
  tile::CallOptions options;
};

// launch_raw's conversion (module.cpp, convert) over tensors: the first row operand first, then
// the others in declaration order, each checked before the next; then bind's one-precision rule
// and the plan request. The same checks in the same order, so the same first error.
Bound bind_call(const Call& c) {
  const ProgramInfo& pi = c.info;
  const std::string& op = pi.program->name();
  const auto& decls = pi.program->operands();
  const Slot first_slot{op, pi.names[pi.first], decls[pi.first]};
  const ArrayInfo rows_like = array_info(*c.tensors[pi.first]);
  tile_py::check_device(first_slot, rows_like, std::nullopt, "");
  Bound b;
  const tile::TensorView first_view = tile_py::as_matrix(first_slot, rows_like);
  b.args.set(decls[pi.first].name, first_view);
  for (size_t i = 0; i < decls.size(); ++i) {
    if (i == pi.first) continue;
    const tile::OperandDecl& d = decls[i];
    const Slot s{op, pi.names[i], d};
    if (d.role == tile::Role::scalar_in) {
      if (!c.has_scalar[i]) continue;
      double v = c.scalars[i];
      if (pi.builtin && d.name == "eps" && !(rows_like.dtype == tile_py::dlpack_dtype(tile::DType::f64)))
        v = tile::checked_eps(*pi.builtin, v);
      b.args.set(d.name, v);
      continue;
    }
    if (!c.tensors[i]) continue;
    const ArrayInfo a = array_info(*c.tensors[i]);
    tile_py::check_device(s, a, rows_like.device, pi.names[pi.first]);
    if (tile_py::is_row(d.role)) {
      if (a.ndim != rows_like.ndim || !std::equal(a.shape, a.shape + a.ndim, rows_like.shape))
        tile::throw_argument_error(
            op, s.arg,
            "shape " + tile_py::tuple_string(rows_like.shape, rows_like.ndim) + " like " + pi.names[pi.first],
            "shape " + tile_py::tuple_string(a.shape, a.ndim));
      b.args.set(d.name, tile_py::as_matrix(s, a));
    } else if (tile_py::is_row_scalar(d.role)) {
      b.args.set(d.name, tile_py::as_row_values(s, a, rows_like, pi.names[pi.first]));
    } else if (tile_py::is_col(d.role)) {
      b.args.set(d.name, tile_py::as_columns(s, a, first_view.cols));
    } else {
      b.args.set(d.name, tile_py::as_one_value(s, a));
    }
  }
  tile_py::check_one_precision(op, decls, pi.names, b.args);
  if (c.plan) b.options.plan = tile_py::parse_plan(op, *c.plan);
  b.options.backend = rows_like.device.type == tile_py::kDLCUDA ? tile::Backend::cuda : tile::Backend::cpu;
  b.options.device = rows_like.device.id;
  return b;
}

// ---- launches ----

// Releases the GIL where this thread holds it: the forward entries hold it, autograd's
// threads running a backward do not.
class WithoutGil {
 public:
  WithoutGil() {
    if (PyGILState_Check()) state_ = PyEval_SaveThread();
  }
  ~WithoutGil() {
    if (state_) PyEval_RestoreThread(state_);
  }
  WithoutGil(const WithoutGil&) = delete;
  WithoutGil& operator=(const WithoutGil&) = delete;

 private:
  PyThreadState* state_ = nullptr;
};

// The library launches into the current context; it must be the tensors' device (module.cpp,
// check_context, says the same).
void check_context(const Bound& b, const std::string& op) {
#if TILE_WITH_CUDA
  if (b.options.backend == tile::Backend::cuda) {
    tile::cuda::ensure_context(b.options.device);
    const int current = tile::cuda::current_device();
    if (current != b.options.device)
      throw std::runtime_error(op + ": the arrays are on cuda:" + std::to_string(b.options.device) +
                               " but the current CUDA context is on cuda:" + std::to_string(current) +
                               " (make that device current first)");
  }
#else
  (void)b;
  (void)op;
#endif
}

// The replays of CUDA calls (tile::Replay, as launch_raw keeps them; those reducing over the
// rows too, with a workspace from torch's allocator each call), by a key of everything a
// call's resolution read but its data pointers. Guarded by a mutex: backward passes run on
// autograd's threads without the GIL.
constexpr size_t kMaxReplays = 4096;  // distinct calls kept; then the map starts afresh
struct Replays {
  std::mutex mutex;
  std::unordered_map<std::string, std::shared_ptr<const tile::Replay>> map;
};
Replays& replays() {
  static auto* r = new Replays();  // never destroyed: a launch may outlive static destruction
  return *r;
}

template <typename T>
void append_bytes(std::string& key, const T& v) {
  key.append(reinterpret_cast<const char*>(&v), sizeof v);
}

// The key of a call whose tensors are all on CUDA devices, and its operands' data pointers in
// declaration order; false where a tensor is on the CPU (no replay: the full path reads it).
bool replay_key(const Call& c, std::string& key, const void** data) {
  const size_t n = c.info.program->operands().size();
  key.clear();
  append_bytes(key, c.info.program);
  append_bytes(key, c.info.program->serial());
  append_bytes(key, c.plan ? c.plan->size() : size_t(-1));
  if (c.plan) key += *c.plan;
  for (size_t i = 0; i < n; ++i) {
    data[i] = nullptr;
    if (const at::Tensor* t = c.tensors[i]) {
      if (!t->is_cuda()) return false;
      void* ptr = t->data_ptr();
      key += 'a';
      append_bytes(key, int8_t(t->scalar_type()));
      append_bytes(key, int8_t(t->get_device()));
      // Pointer alignment decides the plan's vector accesses and bind's alignment checks.
      append_bytes(key, uint8_t(reinterpret_cast<uintptr_t>(ptr) % 16));
      append_bytes(key, int32_t(t->dim()));
      for (int64_t v : t->sizes()) append_bytes(key, v);
      for (int64_t v : t->strides()) append_bytes(key, v);
      data[i] = ptr;
    } else if (c.has_scalar[i]) {
      key += 's';
      append_bytes(key, c.scalars[i]);
    } else {
      key += '-';
    }
  }
  return true;
}

// Runs a call on its tensors' backend: CUDA on the first row operand's device (made current
// for the call where it is not) and that device's current stream, the CPU backend otherwise.
void run_call(const Call& c) {
  const at::Tensor& lead = *c.tensors[c.info.first];
  const std::string& op = c.info.program->name();
  void* stream = nullptr;
  std::optional<c10::DeviceGuard> guard;
  std::string key;
  if (lead.is_cuda()) {
    const c10::impl::DeviceGuardImplInterface* cuda = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA);
    const c10::Device device = lead.device();
    if (cuda->getDevice() != device) guard.emplace(device);
    stream = cuda->getStream(device).native_handle();
    thread_local std::string scratch;
    const void* data[kMaxOperands];
    if (replay_key(c, scratch, data)) {
      std::shared_ptr<const tile::Replay> replay;
      {
        Replays& r = replays();
        std::lock_guard<std::mutex> lock(r.mutex);
        auto it = r.map.find(scratch);
        if (it != r.map.end()) replay = it->second;
      }
      if (replay) {
        // A reduction over the rows takes its partials' workspace from torch's allocator, as
        // the full path below does; held until the launches are enqueued (stream-ordered).
        at::Tensor workspace;
        if (const int64_t bytes = replay->workspace_bytes(); bytes > 0)
          workspace = at::empty({bytes}, at::TensorOptions().dtype(at::kByte).device(lead.device()));
        bool launched = false;
        {
          WithoutGil release;
          launched = replay->launch(data, stream, workspace.defined() ? workspace.data_ptr() : nullptr);
        }
        if (launched) {
          counters.replays.fetch_add(1, std::memory_order_relaxed);
          return;
        }
      }
      key = scratch;  // the full path allocates, which may call back into Python
    }
  }
  Bound b = bind_call(c);
  b.options.stream = stream;
  at::Tensor workspace;  // held until the launch is enqueued; torch's allocator is stream-ordered
  if (b.options.backend == tile::Backend::cuda && c.info.may_need_workspace) {
    int64_t bytes = 0;
    {
      WithoutGil release;
      check_context(b, op);
      bytes = tile::workspace_bytes(*c.info.program, b.args, b.options);
    }
    if (bytes > 0) {
      workspace = at::empty({bytes}, at::TensorOptions().dtype(at::kByte).device(lead.device()));
      b.options.workspace = workspace.data_ptr();
      b.options.workspace_size = size_t(bytes);
    }
  }
  std::shared_ptr<const tile::Replay> replay;
  {
    WithoutGil release;
    check_context(b, op);
    if (key.empty())
      tile::run(*c.info.program, b.args, b.options);
    else
      tile::run(*c.info.program, b.args, b.options, replay);
  }
  if (replay) {
    Replays& r = replays();
    std::lock_guard<std::mutex> lock(r.mutex);
    if (r.map.size() >= kMaxReplays) r.map.clear();
    r.map[key] = std::move(replay);
  }
}

at::Tensor empty(at::IntArrayRef shape, c10::ScalarType dtype, const at::Tensor& like) {
  return at::empty(shape, at::TensorOptions().dtype(dtype).device(like.device()));
}

// The dtype of a call's statistics (rstd, mean): float64 in a float64 call, else float32.
c10::ScalarType stat_dtype(const at::Tensor& x) {
  return x.scalar_type() == c10::ScalarType::Double ? c10::ScalarType::Double : c10::ScalarType::Float;
}

// ---- autograd ----

// Nodes are held by std::shared_ptr in older torch versions (2.11) and by c10::intrusive_ptr in
// newer ones (2.15).
using NodeRef = decltype(ag::Edge::function);

template <typename T>
auto make_node() {
  if constexpr (std::is_same_v<NodeRef, std::shared_ptr<ag::Node>>) {
    return std::shared_ptr<T>(new T(), [](T* node) { deleteNode(node); });  // torch::autograd's, by ADL
  } else {
    return c10::make_intrusive<T>();
  }
}

// A backward that records a graph (create_graph=True) calls the backward custom op, which has
// no autograd formula of its own: a double backward then raises, as on the Python paths.
c10::OperatorHandle custom_op(const char* name) { return c10::Dispatcher::singleton().findSchemaOrThrow(name, ""); }

std::optional<at::Tensor> maybe(const at::Tensor& t) {
  return t.defined() ? std::optional<at::Tensor>(t) : std::nullopt;
}

// The gradient of the node's output `i`, as a Python Function receives it: zeros like that
// output where none flowed, contiguous.
at::Tensor incoming(const ag::Node& node, const at::Tensor& dy, uint32_t i = 0) {
  return dy.defined() ? dy.contiguous() : node.input_metadata(i).zeros_like();
}

// y = softmax(x) or log_softmax(x): dx = <backward program>(y, dy), in x's dtype.
template <bool Log>
struct SoftmaxBackward final : ag::Node {
  ag::SavedVariable y;
  c10::ScalarType x_dtype = c10::ScalarType::Float;

  std::string name() const override { return Log ? "TileLogSoftmaxBackward" : "TileSoftmaxBackward"; }
  void release_variables() override {
    std::lock_guard<std::mutex> lock(mutex_);
    y.reset_data();
  }
  ag::variable_list apply(ag::variable_list&& grads) override {
    std::lock_guard<std::mutex> lock(mutex_);
    counters.backward.fetch_add(1, std::memory_order_relaxed);
    const at::Tensor out = y.unpack(getptr());
    const at::Tensor dy = incoming(*this, grads[0]);
    if (at::GradMode::is_enabled())
      return {custom_op(Log ? "tile::log_softmax_backward" : "tile::softmax_backward")
                  .typed<at::Tensor(const at::Tensor&, const at::Tensor&, std::optional<c10::ScalarType>)>()
                  .call(out, dy, x_dtype)};
    at::Tensor dx = empty(out.sizes(), x_dtype, out);
    if (dx.numel()) {
      const Programs& p = *programs;
      const Program& program = Log ? p.log_softmax_backward : p.softmax_backward;
      const Slots& slots = program.slots;
      Call c(program);
      c.set(slots.y, out);
      c.set(slots.dy, dy);
      c.set(slots.dx, dx);
      run_call(c);
    }
    return {dx};
  }
};

// y = rms_norm(x) * weight: (dx, dweight) from rms_norm_backward, dx computed in dy's dtype
// and converted to x's, as the Python path does.
struct RmsNormBackward final : ag::Node {
  ag::SavedVariable x, weight, rstd;

  std::string name() const override { return "TileRmsNormBackward"; }
  void release_variables() override {
    std::lock_guard<std::mutex> lock(mutex_);
    x.reset_data();
    weight.reset_data();
    rstd.reset_data();
  }
  ag::variable_list apply(ag::variable_list&& grads) override {
    std::lock_guard<std::mutex> lock(mutex_);
    counters.backward.fetch_add(1, std::memory_order_relaxed);
    const at::Tensor xs = x.unpack(), w = weight.unpack(), r = rstd.unpack(getptr());
    const at::Tensor dy = incoming(*this, grads[0]);
    at::Tensor dx, dw;
    if (at::GradMode::is_enabled()) {
      std::tie(dx, dw) =
          custom_op("tile::rms_norm_backward")
              .typed<std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&,
                                                        const std::optional<at::Tensor>&, const at::Tensor&)>()
              .call(dy, xs, maybe(w), r);
    } else {
      dx = empty(dy.sizes(), dy.scalar_type(), dy);
      if (w.defined()) dw = at::empty_like(w);
      const Slots& slots = programs->rms_norm_backward.slots;
      Call c(programs->rms_norm_backward);
      c.set(slots.dy, dy);
      c.set(slots.x, xs);
      c.set(slots.weight, w);
      c.set(slots.rstd, r);
      c.set(slots.dx, dx);
      c.set(slots.dweight, dw);
      run_call(c);
      dx = dx.to(xs.scalar_type()).contiguous();
    }
    return {dx, w.defined() && should_compute_output(1) ? dw : at::Tensor()};
  }
};

// y = layer_norm(x) * weight + bias: (dx, dweight, dbias) from layer_norm_backward.
struct LayerNormBackward final : ag::Node {
  ag::SavedVariable x, weight, bias, mean, rstd;

  std::string name() const override { return "TileLayerNormBackward"; }
  void release_variables() override {
    std::lock_guard<std::mutex> lock(mutex_);
    for (ag::SavedVariable* v : {&x, &weight, &bias, &mean, &rstd}) v->reset_data();
  }
  ag::variable_list apply(ag::variable_list&& grads) override {
    std::lock_guard<std::mutex> lock(mutex_);
    counters.backward.fetch_add(1, std::memory_order_relaxed);
    const at::Tensor xs = x.unpack(), w = weight.unpack(), b = bias.unpack();
    const at::Tensor m = mean.unpack(getptr()), r = rstd.unpack(getptr());
    const at::Tensor dy = incoming(*this, grads[0]);
    at::Tensor dx, dw, db;
    if (at::GradMode::is_enabled()) {
      std::tie(dx, dw, db) = custom_op("tile::layer_norm_backward")
                                 .typed<std::tuple<at::Tensor, at::Tensor, at::Tensor>(
                                     const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
                                     const std::optional<at::Tensor>&, const at::Tensor&, const at::Tensor&)>()
                                 .call(dy, xs, maybe(w), maybe(b), m, r);
    } else {
      dx = empty(dy.sizes(), dy.scalar_type(), dy);
      if (w.defined()) dw = at::empty_like(w);
      if (b.defined()) db = at::empty_like(b);
      const Slots& slots = programs->layer_norm_backward.slots;
      Call c(programs->layer_norm_backward);
      c.set(slots.dy, dy);
      c.set(slots.x, xs);
      c.set(slots.weight, w);
      c.set(slots.mean, m);
      c.set(slots.rstd, r);
      c.set(slots.dx, dx);
      c.set(slots.dweight, dw);
      c.set(slots.dbias, db);
      run_call(c);
      dx = dx.to(xs.scalar_type()).contiguous();
    }
    return {dx, w.defined() && should_compute_output(1) ? dw : at::Tensor(),
            b.defined() && should_compute_output(2) ? db : at::Tensor()};
  }
};

// (y, residual_out) = fused_add_rms_norm(x, residual, weight): (dx, dresidual, dweight) from
// fused_add_rms_norm_backward with the gradients of both outputs; dx computed in dy's dtype and
// converted to x's, as the Python path does.
struct FusedAddRmsNormBackward final : ag::Node {
  ag::SavedVariable residual_out, weight, rstd;
  c10::ScalarType x_dtype = c10::ScalarType::Float;

  std::string name() const override { return "TileFusedAddRmsNormBackward"; }
  void release_variables() override {
    std::lock_guard<std::mutex> lock(mutex_);
    for (ag::SavedVariable* v : {&residual_out, &weight, &rstd}) v->reset_data();
  }
  ag::variable_list apply(ag::variable_list&& grads) override {
    std::lock_guard<std::mutex> lock(mutex_);
    counters.backward.fetch_add(1, std::memory_order_relaxed);
    const at::Tensor s = residual_out.unpack(getptr()), w = weight.unpack(), r = rstd.unpack(getptr());
    const at::Tensor dy = incoming(*this, grads[0], 0), dres_out = incoming(*this, grads[1], 1);
    at::Tensor dx, dres, dw;
    if (at::GradMode::is_enabled()) {
      std::tie(dx, dres, dw) = custom_op("tile::fused_add_rms_norm_backward")
                                   .typed<std::tuple<at::Tensor, at::Tensor, at::Tensor>(
                                       const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                       const std::optional<at::Tensor>&, const at::Tensor&, c10::ScalarType)>()
                                   .call(dy, dres_out, s, maybe(w), r, x_dtype);
    } else {
      dx = empty(dy.sizes(), dy.scalar_type(), dy);
      dres = empty(s.sizes(), s.scalar_type(), s);
      if (w.defined()) dw = at::empty_like(w);
      const Slots& slots = programs->fused_add_rms_norm_backward.slots;
      Call c(programs->fused_add_rms_norm_backward);
      c.set(slots.dy, dy);
      c.set(slots.dresidual_out, dres_out);
      c.set(slots.residual_out, s);
      c.set(slots.weight, w);
      c.set(slots.rstd, r);
      c.set(slots.dx, dx);
      c.set(slots.dresidual, dres);
      c.set(slots.dweight, dw);
      run_call(c);
      dx = dx.to(x_dtype).contiguous();
    }
    return {dx, dres, w.defined() && should_compute_output(2) ? dw : at::Tensor()};
  }
};

// cross_entropy's options as a call gives them: which program variant runs, and its scalars.
struct CrossEntropyOptions {
  int64_t ignore_index = -100;
  std::string reduction = "mean";
  double label_smoothing = 0, z_loss = 0;
  std::optional<double> softcap;

  const Program& program(bool backward) const {
    const CrossEntropyPrograms& p = programs->cross_entropy;
    return *(backward ? p.backward : p.forward)[label_smoothing != 0][softcap.has_value()];
  }
  // A program without label_smoothing computes as if it were 0: it is set only where nonzero.
  void set_scalars(Call& c, const Slots& slots) const {
    c.set(slots.ignore_index, double(ignore_index));
    c.set(slots.z_loss, z_loss);
    if (label_smoothing != 0) c.set(slots.label_smoothing, label_smoothing);
    c.set(slots.softcap, softcap);
  }
};

// loss = cross_entropy(logits, target): dlogits from cross_entropy_backward with the lse (and,
// for a mean, the count of rows not ignored) the forward call wrote, in logits' dtype.
struct CrossEntropyBackward final : ag::Node {
  ag::SavedVariable logits, target, lse, count;
  CrossEntropyOptions options;

  std::string name() const override { return "TileCrossEntropyBackward"; }
  void release_variables() override {
    std::lock_guard<std::mutex> lock(mutex_);
    for (ag::SavedVariable* v : {&logits, &target, &lse, &count}) v->reset_data();
  }
  ag::variable_list apply(ag::variable_list&& grads) override {
    std::lock_guard<std::mutex> lock(mutex_);
    counters.backward.fetch_add(1, std::memory_order_relaxed);
    const at::Tensor z = logits.unpack(), t = target.unpack(), l = lse.unpack(getptr()), n = count.unpack(getptr());
    const at::Tensor dloss = incoming(*this, grads[0]);
    if (at::GradMode::is_enabled())
      return {custom_op("tile::cross_entropy_backward")
                  .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, int64_t,
                                    c10::string_view, double, double, std::optional<double>)>()
                  .call(dloss, z, t, l, options.ignore_index, options.reduction, options.label_smoothing,
                        options.z_loss, options.softcap),
              at::Tensor()};
    at::Tensor dlogits = at::empty_like(z, at::MemoryFormat::Contiguous);
    const at::IntArrayRef rows = z.sizes().slice(0, z.dim() - 1);
    // One value for every row (a sum or a mean) as a stride-0 view: no copy, no synchronisation.
    const at::Tensor per_row = options.reduction == "none" ? dloss : dloss.reshape({}).expand(rows);
    const at::Tensor counted = n.defined() ? n.reshape({}).expand(rows) : at::Tensor();
    const Program& program = options.program(/*backward=*/true);
    const Slots& slots = program.slots;
    Call c(program);
    c.set(slots.logits, z);
    c.set(slots.target, t);
    c.set(slots.lse, l);
    c.set(slots.dloss, per_row);
    c.set(slots.count, counted);
    c.set(slots.dlogits, dlogits);
    options.set_scalars(c, slots);
    run_call(c);
    return {dlogits, at::Tensor()};
  }
};

// The Python types of the nodes' grad_fn objects (type(y.grad_fn).__name__).
PyTypeObject softmax_backward_type, log_softmax_backward_type, rms_norm_backward_type, layer_norm_backward_type,
    fused_add_rms_norm_backward_type, cross_entropy_backward_type;

template <typename T>
void register_node(nb::module_& m, PyTypeObject& type, const char* name) {
  ag::_initFunctionPyTypeObject(type, name, nullptr, nullptr);
  ag::registerCppFunction(typeid(T), &type);
  m.attr(name) = nb::handle(reinterpret_cast<PyObject*>(&type));
}

// ---- arguments ----

// The tensor an argument holds where an entry takes it: a torch.Tensor or nn.Parameter (not
// a subclass) the library reads as it is; null otherwise (the Python paths take the call).
const at::Tensor* tensor_arg(nb::handle h) {
  if (!THPVariable_CheckExact(h.ptr())) return nullptr;
  const at::Tensor& t = THPVariable_Unpack(h.ptr());
  return readable(t) ? &t : nullptr;
}

// An optional tensor argument: true with `t` null for None.
bool optional_tensor(nb::handle h, const at::Tensor*& t) {
  t = nullptr;
  return h.is_none() || (t = tensor_arg(h)) != nullptr;
}

// dtype=: None or a torch.dtype Tile has (other values: the Python paths convert or refuse).
bool dtype_arg(nb::handle h, std::optional<c10::ScalarType>& dtype) {
  if (h.is_none()) return true;
  if (!THPDtype_Check(h.ptr())) return false;
  dtype = reinterpret_cast<THPDtype*>(h.ptr())->scalar_type;
  return tile_dtype(*dtype).has_value();
}

// eps: None, a float or an int, read as the conversion reads a scalar (module.cpp, as_number).
bool number_arg(nb::handle h, std::optional<double>& v) {
  PyObject* o = h.ptr();
  if (o == Py_None) return true;
  if (PyFloat_Check(o)) {
    v = PyFloat_AS_DOUBLE(o);
    return true;
  }
  if (!PyLong_CheckExact(o)) return false;
  double d = PyLong_AsDouble(o);
  if (d == -1.0 && PyErr_Occurred()) {  // beyond double: out of any range, said as such by bind
    PyErr_Clear();
    d = _PyLong_Sign(o) > 0 ? HUGE_VAL : -HUGE_VAL;
  }
  v = d;
  return true;
}

// plan=: None or a JSON string (a dict goes the Python way, which writes it as JSON).
bool plan_arg(nb::handle h, std::optional<std::string>& plan) {
  if (h.is_none()) return true;
  if (!PyUnicode_Check(h.ptr())) return false;
  Py_ssize_t n = 0;
  const char* s = PyUnicode_AsUTF8AndSize(h.ptr(), &n);
  if (!s) {
    PyErr_Clear();
    return false;
  }
  plan.emplace(s, size_t(n));
  return true;
}

// torch.func transforms wrap tensors the library cannot read; their calls take the custom ops
// (torch._C._are_functorch_transforms_active reads the same keys).
bool functorch_active() {
  const c10::DispatchKeySet included = c10::impl::tls_local_dispatch_key_set().included_;
  return included.has(c10::DispatchKey::FuncTorchDynamicLayerFrontMode) ||
         included.has(c10::DispatchKey::FuncTorchDynamicLayerBackMode);
}

bool requires_grad(const at::Tensor* t) { return t && t->requires_grad(); }
bool forward_grad(const at::Tensor* t) { return t && ag::isFwGradDefined(*t); }

// The arguments every entry shares, read as the Python paths read them; `taken` false where
// the entry leaves the call to them.
struct Common {
  const at::Tensor* x = nullptr;
  const at::Tensor* out = nullptr;
  std::optional<c10::ScalarType> dtype;
  std::optional<std::string> plan;
  bool taken = false;

  Common(nb::handle hx, nb::handle hout, nb::handle hplan, nb::handle hstream, nb::handle hdtype) {
    // An empty x takes the Python paths, which answer it as torch does (python.md, "Empty inputs").
    x = tensor_arg(hx);
    taken = x && x->dim() > 0 && x->numel() > 0 && hstream.is_none() && optional_tensor(hout, out) &&
            dtype_arg(hdtype, dtype) && plan_arg(hplan, plan) && !functorch_active();
  }

  // The output's dtype against out's (python/tile/__init__.py, _check_out_dtype).
  void check_out_dtype(const std::string& op, nb::handle hdtype) const {
    if (dtype && out && out->scalar_type() != *dtype)
      throw nb::value_error((op + ": argument 'dtype': expected None or out's dtype " +
                             torch_dtype_name(out->scalar_type()) + ", got " + nb::str(hdtype).c_str())
                                .c_str());
  }

  at::Tensor output() const { return out ? *out : empty(x->sizes(), dtype.value_or(x->scalar_type()), *x); }
};

// out= cannot carry gradients (python/tile/_torch_ops.py, refuse_grad).
void refuse_out_grad(const std::string& op, std::initializer_list<std::pair<const char*, const at::Tensor*>> arrays) {
  for (const auto& [name, t] : arrays)
    if (requires_grad(t))
      throw std::runtime_error(op + ": argument '" + name + "': a call with out= is not differentiable, but " + name +
                               " requires grad; call it under torch.no_grad(), pass " + name +
                               ".detach(), or use the form without it");
}

nb::object wrap(at::Tensor t) { return nb::steal(THPVariable_Wrap(std::move(t))); }

nb::object result(nb::handle hout, at::Tensor y) { return hout.is_none() ? wrap(std::move(y)) : nb::borrow(hout); }

// ---- the entries ----

template <bool Log>
void record_softmax(const at::Tensor& x, const at::Tensor& y) {
  auto node = make_node<SoftmaxBackward<Log>>();
  node->set_next_edges(ag::collect_next_edges(x));
  node->x_dtype = x.scalar_type();
  ag::set_history(y, node);
  node->y = ag::SavedVariable(y, /*is_output=*/true);
  counters.nodes.fetch_add(1, std::memory_order_relaxed);
}

nb::object softmax(bool log, nb::handle hx, nb::handle hdim, nb::handle hout, nb::handle hplan, nb::handle hstream,
                   nb::handle hdtype) {
  const Common a(hx, hout, hplan, hstream, hdtype);
  if (!a.taken || !PyLong_CheckExact(hdim.ptr())) return nb::none();
  const Program& program = log ? programs->log_softmax : programs->softmax;
  const Slots& slots = program.slots;
  const std::string& op = program.info.program->name();
  const long long dim = PyLong_AsLongLong(hdim.ptr());
  if (dim == -1 && PyErr_Occurred()) {
    PyErr_Clear();
    return nb::none();
  }
  const int64_t last = a.x->dim() - 1;
  if (dim != -1 && dim != last)
    throw nb::value_error((op + ": argument 'dim': expected -1 or " + std::to_string(last) +
                           " (the last dimension; Tile reduces over rows), got " + std::to_string(dim))
                              .c_str());
  a.check_out_dtype(op, hdtype);
  const bool grad = at::GradMode::is_enabled() && requires_grad(a.x);
  if (grad && a.out) refuse_out_grad(op, {{"x", a.x}});
  if (grad && forward_grad(a.x)) return nb::none();  // no forward-mode formula: the Python path says so
  at::Tensor y = a.output();
  Call c(program);
  c.set(slots.x, *a.x);
  c.set(slots.y, y);
  if (a.plan) c.plan = &*a.plan;
  run_call(c);
  counters.calls.fetch_add(1, std::memory_order_relaxed);
  if (grad) log ? record_softmax<true>(*a.x, y) : record_softmax<false>(*a.x, y);
  return result(hout, std::move(y));
}

nb::object rms_norm(nb::handle hx, nb::handle hweight, nb::handle heps, nb::handle hout, nb::handle hplan,
                    nb::handle hstream, nb::handle hdtype, nb::handle hreturn_rstd) {
  const Common a(hx, hout, hplan, hstream, hdtype);
  const at::Tensor* w = nullptr;
  std::optional<double> eps;
  if (!a.taken || !optional_tensor(hweight, w) || !number_arg(heps, eps)) return nb::none();
  const int return_rstd = PyObject_IsTrue(hreturn_rstd.ptr());
  if (return_rstd < 0) nb::raise_python_error();
  const Program& program = programs->rms_norm;
  const Slots& slots = program.slots;
  const std::string& op = program.info.program->name();
  a.check_out_dtype(op, hdtype);
  const bool grad = at::GradMode::is_enabled() && (requires_grad(a.x) || requires_grad(w));
  if (grad && a.out) refuse_out_grad(op, {{"x", a.x}, {"weight", w}});
  if (grad && (forward_grad(a.x) || forward_grad(w))) return nb::none();
  at::Tensor y = a.output();
  // The backward needs rstd: a call that records a node computes it, as the Python path does.
  at::Tensor rstd;
  if (grad || return_rstd) rstd = empty(a.x->sizes().slice(0, a.x->dim() - 1), stat_dtype(*a.x), *a.x);
  const at::Tensor weight = w ? *w : at::Tensor();
  Call c(program);
  c.set(slots.x, *a.x);
  c.set(slots.y, y);
  c.set(slots.weight, weight);
  c.set(slots.eps, eps);
  c.set(slots.rstd, rstd);
  if (a.plan) c.plan = &*a.plan;
  run_call(c);
  counters.calls.fetch_add(1, std::memory_order_relaxed);
  if (grad) {
    auto node = make_node<RmsNormBackward>();
    node->set_next_edges(ag::collect_next_edges(*a.x, weight));
    ag::set_history(y, node);
    node->x = ag::SavedVariable(*a.x, false);
    node->weight = ag::SavedVariable(weight, false);
    node->rstd = ag::SavedVariable(rstd, /*is_output=*/true);
    counters.nodes.fetch_add(1, std::memory_order_relaxed);
  }
  if (!return_rstd) return result(hout, std::move(y));
  return nb::make_tuple(result(hout, std::move(y)), wrap(std::move(rstd)));
}

nb::object layer_norm(nb::handle hx, nb::handle hweight, nb::handle hbias, nb::handle heps, nb::handle hout,
                      nb::handle hplan, nb::handle hstream, nb::handle hdtype, nb::handle hreturn_stats) {
  const Common a(hx, hout, hplan, hstream, hdtype);
  const at::Tensor *w = nullptr, *bias_arg = nullptr;
  std::optional<double> eps;
  if (!a.taken || !optional_tensor(hweight, w) || !optional_tensor(hbias, bias_arg) || !number_arg(heps, eps))
    return nb::none();
  const int return_stats = PyObject_IsTrue(hreturn_stats.ptr());
  if (return_stats < 0) nb::raise_python_error();
  const Program& program = programs->layer_norm;
  const Slots& slots = program.slots;
  const std::string& op = program.info.program->name();
  a.check_out_dtype(op, hdtype);
  const bool grad = at::GradMode::is_enabled() && (requires_grad(a.x) || requires_grad(w) || requires_grad(bias_arg));
  if (grad && a.out) refuse_out_grad(op, {{"x", a.x}, {"weight", w}, {"bias", bias_arg}});
  if (grad && (forward_grad(a.x) || forward_grad(w) || forward_grad(bias_arg))) return nb::none();
  at::Tensor y = a.output();
  at::Tensor mean, rstd;
  if (grad || return_stats) {
    const at::IntArrayRef rows = a.x->sizes().slice(0, a.x->dim() - 1);
    mean = empty(rows, stat_dtype(*a.x), *a.x);
    rstd = empty(rows, stat_dtype(*a.x), *a.x);
  }
  const at::Tensor weight = w ? *w : at::Tensor(), bias = bias_arg ? *bias_arg : at::Tensor();
  Call c(program);
  c.set(slots.x, *a.x);
  c.set(slots.y, y);
  c.set(slots.weight, weight);
  c.set(slots.bias, bias);
  c.set(slots.eps, eps);
  c.set(slots.mean, mean);
  c.set(slots.rstd, rstd);
  if (a.plan) c.plan = &*a.plan;
  run_call(c);
  counters.calls.fetch_add(1, std::memory_order_relaxed);
  if (grad) {
    auto node = make_node<LayerNormBackward>();
    node->set_next_edges(ag::collect_next_edges(*a.x, weight, bias));
    ag::set_history(y, node);
    node->x = ag::SavedVariable(*a.x, false);
    node->weight = ag::SavedVariable(weight, false);
    node->bias = ag::SavedVariable(bias, false);
    node->mean = ag::SavedVariable(mean, /*is_output=*/true);
    node->rstd = ag::SavedVariable(rstd, /*is_output=*/true);
    counters.nodes.fetch_add(1, std::memory_order_relaxed);
  }
  if (!return_stats) return result(hout, std::move(y));
  return nb::make_tuple(result(hout, std::move(y)), wrap(std::move(mean)), wrap(std::move(rstd)));
}

// A call's arguments by the Python signature's names, positional ones first, into `out` (null:
// not given); false where the Python function itself would refuse them (too many, unknown or
// repeated names), which the Python path then reports.
bool bind_arguments(nb::handle args, nb::handle kwargs, const char* const* names, size_t n, PyObject** out) {
  if (!PyTuple_Check(args.ptr()) || !PyDict_Check(kwargs.ptr())) return false;
  const Py_ssize_t given = PyTuple_GET_SIZE(args.ptr());
  if (given > Py_ssize_t(n)) return false;
  for (size_t i = 0; i < n; ++i) out[i] = Py_ssize_t(i) < given ? PyTuple_GET_ITEM(args.ptr(), i) : nullptr;
  PyObject *key, *value;
  Py_ssize_t pos = 0;
  while (PyDict_Next(kwargs.ptr(), &pos, &key, &value)) {
    const char* name = PyUnicode_Check(key) ? PyUnicode_AsUTF8(key) : nullptr;
    if (!name) {
      PyErr_Clear();
      return false;
    }
    size_t i = 0;
    while (i < n && std::strcmp(names[i], name) != 0) ++i;
    if (i == n || out[i]) return false;
    out[i] = value;
  }
  return true;
}

// tile.fused_add_rms_norm(x, residual, weight=None, eps=1e-6, in_place=False, return_rstd=False,
// plan=None, stream=None), given as (args, kwargs). With gradients it takes what the custom-op
// path takes: (x, residual, weight, eps), and in_place only to refuse it.
nb::object fused_add_rms_norm(nb::handle args, nb::handle kwargs) {
  static const char* const names[] = {"x", "residual", "weight", "eps", "in_place", "return_rstd", "plan", "stream"};
  PyObject* a[8];
  if (!bind_arguments(args, kwargs, names, 8, a) || !a[0] || !a[1]) return nb::none();
  const auto given = [&](int i) { return a[i] != nullptr; };
  const auto none = [&](int i) { return !a[i] || a[i] == Py_None; };
  const at::Tensor* x = tensor_arg(a[0]);
  const at::Tensor* residual = tensor_arg(a[1]);
  const at::Tensor* w = nullptr;
  std::optional<double> eps = tile::kRmsNormEps;  // tile._training's default
  std::optional<std::string> plan;
  if (given(3)) {
    eps.reset();  // None goes the Python way (the custom op takes none)
    if (!number_arg(a[3], eps) || !eps) return nb::none();
  }
  if (!x || !residual || x->dim() == 0 || x->numel() == 0 || (!none(2) && !(w = tensor_arg(a[2]))) || !none(7) ||
      (given(6) && !plan_arg(a[6], plan)) || functorch_active())
    return nb::none();
  const int in_place = given(4) ? PyObject_IsTrue(a[4]) : 0;
  const int return_rstd = given(5) ? PyObject_IsTrue(a[5]) : 0;
  if (in_place < 0 || return_rstd < 0) nb::raise_python_error();
  const Program& program = programs->fused_add_rms_norm;
  const Slots& slots = program.slots;
  const std::string& op = program.info.program->name();
  const bool grad = at::GradMode::is_enabled() && (requires_grad(x) || requires_grad(residual) || requires_grad(w));
  if (grad) {
    // The custom-op path's signature has no return_rstd, plan or stream: it refuses them itself.
    if (given(5) || given(6) || given(7)) return nb::none();
    if (in_place)
      for (const auto& [name, t] : {std::pair{"x", x}, std::pair{"residual", residual}, std::pair{"weight", w}})
        if (requires_grad(t))
          throw std::runtime_error(
              op + ": argument '" + name + "': the in-place form (in_place=True) is not differentiable, but " + name +
              " requires grad; call it under torch.no_grad(), pass " + name + ".detach(), or use the form without it");
    if (forward_grad(x) || forward_grad(residual) || forward_grad(w)) return nb::none();
  }
  at::Tensor y = in_place ? *x : empty(x->sizes(), x->scalar_type(), *x);
  at::Tensor residual_out = in_place ? *residual : empty(x->sizes(), residual->scalar_type(), *x);
  at::Tensor rstd;
  if (grad || return_rstd) rstd = empty(x->sizes().slice(0, x->dim() - 1), stat_dtype(*x), *x);
  const at::Tensor weight = w ? *w : at::Tensor();
  Call c(program);
  c.set(slots.x, *x);
  c.set(slots.residual, *residual);
  c.set(slots.weight, weight);
  c.set(slots.eps, eps);
  c.set(slots.y, y);
  c.set(slots.residual_out, residual_out);
  c.set(slots.rstd, rstd);
  if (plan) c.plan = &*plan;
  run_call(c);
  counters.calls.fetch_add(1, std::memory_order_relaxed);
  if (grad) {
    auto node = make_node<FusedAddRmsNormBackward>();
    node->set_next_edges(ag::collect_next_edges(*x, *residual, weight));
    node->x_dtype = x->scalar_type();
    ag::set_history(y, node);
    ag::set_history(residual_out, node);
    node->residual_out = ag::SavedVariable(residual_out, /*is_output=*/true);
    node->weight = ag::SavedVariable(weight, false);
    node->rstd = ag::SavedVariable(rstd, /*is_output=*/true);
    counters.nodes.fetch_add(1, std::memory_order_relaxed);
  }
  nb::object y_out = in_place ? nb::borrow(a[0]) : wrap(std::move(y));
  nb::object residual_obj = in_place ? nb::borrow(a[1]) : wrap(std::move(residual_out));
  if (!return_rstd) return nb::make_tuple(y_out, residual_obj);
  return nb::make_tuple(y_out, residual_obj, wrap(std::move(rstd)));
}

// Whether every host target is a class index in [0, cols) or ignore_index.
bool targets_in_range(const at::Tensor& target, int64_t cols, int64_t ignore_index) {
  const at::Tensor t = target.to(c10::ScalarType::Long).contiguous();
  const int64_t* v = t.const_data_ptr<int64_t>();
  for (int64_t i = 0, n = t.numel(); i < n; ++i)
    if (v[i] != ignore_index && (v[i] < 0 || v[i] >= cols)) return false;
  return true;
}

// A number read as the Python path reads a scalar, finite (else: left to that path's checks).
bool finite_number(PyObject* h, double& v) {
  std::optional<double> n;
  if (!number_arg(h, n) || !n || !std::isfinite(*n)) return false;
  v = *n;
  return true;
}

// tile.cross_entropy(logits, target, ignore_index=-100, reduction="mean", label_smoothing=0.0,
// z_loss=0.0, softcap=None, return_lse=False, plan=None, stream=None), given as (args,
// kwargs). It takes calls with rows (logits of two or more dimensions, none empty), int32 or
// int64 targets shaped like the rows on the logits' device (host targets in range), and
// options inside their ranges; anything else, and a
// call with gradients that gives plan= or stream= (the custom-op path refuses them), goes to the
// Python paths, which check and report it. With gradients the forward also writes the count of
// rows not ignored (a mean's divisor), so the backward is one call.
nb::object cross_entropy(nb::handle args, nb::handle kwargs) {
  static const char* const names[] = {"logits",  "target",  "ignore_index", "reduction", "label_smoothing",
                                      "z_loss",  "softcap", "return_lse",   "plan",      "stream"};
  PyObject* a[10];
  if (!bind_arguments(args, kwargs, names, 10, a) || !a[0] || !a[1]) return nb::none();
  const auto given = [&](int i) { return a[i] != nullptr; };
  const at::Tensor* logits = tensor_arg(a[0]);
  if (!logits || logits->dim() < 2 || logits->numel() == 0 || logits->size(-1) > (int64_t(1) << 24)) return nb::none();
  if (!THPVariable_CheckExact(a[1])) return nb::none();
  const at::Tensor& target = THPVariable_Unpack(a[1]);
  if (target.layout() != c10::kStrided || target.device() != logits->device() || !index_dtype(target.scalar_type()) ||
      has_names(target) || target.sizes() != logits->sizes().slice(0, logits->dim() - 1))
    return nb::none();
  CrossEntropyOptions o;
  if (given(2)) {
    if (!PyLong_CheckExact(a[2])) return nb::none();
    int overflow = 0;
    const long long v = PyLong_AsLongLongAndOverflow(a[2], &overflow);
    if (overflow || (v == -1 && PyErr_Occurred())) {
      PyErr_Clear();
      return nb::none();
    }
    o.ignore_index = v;
  }
  if (given(3)) {
    if (!PyUnicode_CheckExact(a[3])) return nb::none();
    const char* r = PyUnicode_AsUTF8(a[3]);
    if (!r) {
      PyErr_Clear();
      return nb::none();
    }
    o.reduction = r;
    if (o.reduction != "mean" && o.reduction != "sum" && o.reduction != "none") return nb::none();
  }
  if (given(4) && (!finite_number(a[4], o.label_smoothing) || o.label_smoothing < 0 || o.label_smoothing > 1))
    return nb::none();
  if (given(5) && (!finite_number(a[5], o.z_loss) || o.z_loss < 0)) return nb::none();
  if (given(6) && a[6] != Py_None) {
    double cap = 0;
    if (!finite_number(a[6], cap) || !(cap >= double(FLT_MIN))) return nb::none();
    o.softcap = cap;
  }
  const int return_lse = given(7) ? PyObject_IsTrue(a[7]) : 0;
  if (return_lse < 0) nb::raise_python_error();
  std::optional<std::string> plan;
  if ((given(8) && !plan_arg(a[8], plan)) || (given(9) && a[9] != Py_None) || functorch_active()) return nb::none();
  const bool grad = at::GradMode::is_enabled() && logits->requires_grad();
  if (grad && (given(8) || given(9) || forward_grad(logits))) return nb::none();
  // Host targets out of [0, C) that are not ignored: the Python path names the first (on a GPU
  // such a row's loss is NaN instead: no synchronisation).
  if (!target.is_cuda() && !targets_in_range(target, logits->size(-1), o.ignore_index)) return nb::none();

  const Program& program = o.program(/*backward=*/false);
  const Slots& slots = program.slots;
  const at::IntArrayRef rows = logits->sizes().slice(0, logits->dim() - 1);
  const c10::ScalarType stat = stat_dtype(*logits);
  at::Tensor loss = o.reduction == "none" ? empty(rows, stat, *logits) : empty({}, stat, *logits);
  at::Tensor lse, count;
  if (grad || return_lse) lse = empty(rows, stat, *logits);
  if (grad && o.reduction == "mean") count = empty({}, stat, *logits);
  Call c(program);
  c.set(slots.logits, *logits);
  c.set(slots.target, target);
  c.set(o.reduction == "none" ? slots.loss : o.reduction == "sum" ? slots.loss_sum : slots.loss_mean, loss);
  c.set(slots.lse, lse);
  c.set(slots.count, count);
  o.set_scalars(c, slots);
  if (plan) c.plan = &*plan;
  run_call(c);
  counters.calls.fetch_add(1, std::memory_order_relaxed);
  if (grad) {
    auto node = make_node<CrossEntropyBackward>();
    node->set_next_edges(ag::collect_next_edges(*logits, target));
    ag::set_history(loss, node);
    node->logits = ag::SavedVariable(*logits, false);
    node->target = ag::SavedVariable(target, false);
    node->lse = ag::SavedVariable(lse, /*is_output=*/true);
    node->count = ag::SavedVariable(count, /*is_output=*/true);
    node->options = o;
    counters.nodes.fetch_add(1, std::memory_order_relaxed);
  }
  if (!return_lse) return wrap(std::move(loss));
  return nb::make_tuple(wrap(std::move(loss)), wrap(std::move(lse)));
}

// tile::Error and tile::InternalError as tile._tile raises them (convert.hpp), torch's own
// errors (at::empty, the dispatcher) as torch raises them.
void translate(const std::exception_ptr& p, void*) {
  try {
    std::rethrow_exception(p);
  } catch (const tile::Error&) {
    tile_py::translate_error(p, internal_error_type);
  } catch (const tile::InternalError&) {
    tile_py::translate_error(p, internal_error_type);
  } catch (const c10::Error&) {
    torch::translate_exception_to_python(p);
  } catch (const python_error&) {
    torch::translate_exception_to_python(p);
  }
}

}  // namespace

NB_MODULE(_torch_C, m) {
  if (!THPVariableClass)
    throw nb::import_error("tile._torch_C: torch is not initialised (import torch before tile._torch_C)");
  m.doc() = "Tile's operators for torch tensors in C++: the eager entry python/tile/__init__.py calls first.";
  nb::object internal_error = nb::module_::import_("tile._tile").attr("InternalError");
  internal_error_type = internal_error.release().ptr();
  nb::register_exception_translator(translate);
  programs = new Programs{Program(tile::builtin_program(tile::Op::softmax), tile::Op::softmax),
                          Program(tile::builtin_program(tile::Op::log_softmax), tile::Op::log_softmax),
                          Program(tile::builtin_program(tile::Op::rms_norm), tile::Op::rms_norm),
                          Program(tile::builtin_program(tile::Op::layer_norm), tile::Op::layer_norm),
                          Program(tile::training_program("fused_add_rms_norm"), std::nullopt),
                          Program(tile::training_program("softmax_backward"), std::nullopt),
                          Program(tile::training_program("log_softmax_backward"), std::nullopt),
                          Program(tile::training_program("rms_norm_backward"), std::nullopt),
                          Program(tile::training_program("layer_norm_backward"), std::nullopt),
                          Program(tile::training_program("fused_add_rms_norm_backward"), std::nullopt),
                          CrossEntropyPrograms()};
  register_node<SoftmaxBackward<false>>(m, softmax_backward_type, "TileSoftmaxBackward");
  register_node<SoftmaxBackward<true>>(m, log_softmax_backward_type, "TileLogSoftmaxBackward");
  register_node<RmsNormBackward>(m, rms_norm_backward_type, "TileRmsNormBackward");
  register_node<LayerNormBackward>(m, layer_norm_backward_type, "TileLayerNormBackward");
  register_node<FusedAddRmsNormBackward>(m, fused_add_rms_norm_backward_type, "TileFusedAddRmsNormBackward");
  register_node<CrossEntropyBackward>(m, cross_entropy_backward_type, "TileCrossEntropyBackward");
  m.attr("TORCH_VERSION") = TILE_TORCH_VERSION;

  // Each entry returns None where it leaves the call to the Python paths; its arguments are
  // the Python function's, in order.
  // None passes as a handle only where an argument says so: every one may be None.
  const auto args = [](auto... names) { return std::make_tuple(nb::arg(names).none()...); };
  std::apply(
      [&](auto... a) {
        m.def(
            "softmax",
            [](nb::handle x, nb::handle dim, nb::handle out, nb::handle plan, nb::handle stream, nb::handle dtype) {
              return softmax(false, x, dim, out, plan, stream, dtype);
            },
            a...);
        m.def(
            "log_softmax",
            [](nb::handle x, nb::handle dim, nb::handle out, nb::handle plan, nb::handle stream, nb::handle dtype) {
              return softmax(true, x, dim, out, plan, stream, dtype);
            },
            a...);
      },
      args("x", "dim", "out", "plan", "stream", "dtype"));
  std::apply([&](auto... a) { m.def("rms_norm", &rms_norm, a...); },
             args("x", "weight", "eps", "out", "plan", "stream", "dtype", "return_rstd"));
  std::apply([&](auto... a) { m.def("layer_norm", &layer_norm, a...); },
             args("x", "weight", "bias", "eps", "out", "plan", "stream", "dtype", "return_stats"));
  // The training operator takes its call as (args, kwargs): the Python wrapper passes them on
  // untouched, so that a call left to the Python path meets its own signature.
  m.def("fused_add_rms_norm", &fused_add_rms_norm, nb::arg("args"), nb::arg("kwargs"));
  m.def("cross_entropy", &cross_entropy, nb::arg("args"), nb::arg("kwargs"));
  m.def(
      "clear_replays",
      [] {
        Replays& r = replays();
        std::lock_guard<std::mutex> lock(r.mutex);
        r.map.clear();
      },
      "Forgets the replayed CUDA calls (tile.clear_kernel_caches calls it).");
  m.def(
      "counters",
      [] {
        nb::dict d;
        d["calls"] = counters.calls.load();
        d["replays"] = counters.replays.load();
        d["nodes"] = counters.nodes.load();
        d["backward"] = counters.backward.load();
        return d;
      },
      "Calls taken, CUDA launches replayed, autograd nodes recorded and backward passes run, since import.");
}
