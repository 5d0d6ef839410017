// RowProgram: operand declarations, typed and shaped expression nodes, reductions and stores.
// Every rule a program must follow is checked here, when the node is built, with an error
// naming the program; a program that builds is one the lowering can map.
#include "tile/spec.hpp"

#include <atomic>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "core/text.hpp"
#include "tile/error.hpp"

namespace tile {

std::string_view role_name(Role role) {
  switch (role) {
    case Role::row_in: return "row input";
    case Role::row_out: return "row output";
    case Role::row_scalar_in: return "per-row input";
    case Role::row_scalar_out: return "per-row output";
    case Role::col_in: return "per-column input";
    case Role::col_out: return "per-column output";
    case Role::scalar_in: return "scalar";
    case Role::scalar_out: return "scalar output";
  }
  return "?";
}

bool is_output(Role role) {
  return role == Role::row_out || role == Role::row_scalar_out || role == Role::col_out || role == Role::scalar_out;
}

std::string DTypeSet::to_string() const {
  std::vector<std::string> names;
  for (DType t : {DType::f32, DType::f64, DType::f16, DType::bf16, DType::i32, DType::i64})
    if (contains(t)) names.emplace_back(dtype_name(t));
  std::string out;
  for (size_t i = 0; i < names.size(); ++i)
    out += (i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") + names[i];
  return out.empty() ? "no dtype" : out;
}

std::string_view value_type_name(ValueType t) {
  switch (t) {
    case ValueType::f32: return "f32";
    case ValueType::i64: return "i64";
    case ValueType::b1: return "b1";
  }
  return "?";
}

std::string shape_name(Shape s) {
  if (s.rows && s.cols) return "element";
  if (s.rows) return "per-row";
  if (s.cols) return "per-column";
  return "uniform";
}

namespace {

bool is_identifier(const std::string& s) {
  if (s.empty() || !(std::isalpha(static_cast<unsigned char>(s[0])) || s[0] == '_')) return false;
  for (char c : s)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_')) return false;
  return true;
}

uint64_t next_serial() {
  static std::atomic<uint64_t> counter{0};
  return ++counter;
}


}  // namespace

RowProgram::RowProgram(std::string name) : name_(std::move(name)), serial_(next_serial()) {
  if (!is_identifier(name_))
    throw_argument_error("RowProgram", "name", "an identifier ([A-Za-z_][A-Za-z0-9_]*)", "'" + printable(name_) + "'");
}

RowProgram::RowProgram(RowProgram&& other)
    : name_(other.name_),
      operands_(std::move(other.operands_)),
      nodes_(std::move(other.nodes_)),
      reductions_(std::move(other.reductions_)),
      stores_(std::move(other.stores_)),
      serial_(other.serial_) {
  other.operands_.clear(), other.nodes_.clear(), other.reductions_.clear(), other.stores_.clear();
  other.serial_ = next_serial();
}

void RowProgram::fail(const std::string& what) const { throw Error("row program '" + name_ + "': " + what); }

Operand RowProgram::declare(OperandDecl decl) {
  if (!is_identifier(decl.name) || decl.name.rfind("tile_", 0) == 0 || decl.name == "rows" || decl.name == "cols")
    fail("operand name '" + printable(decl.name) + "': expected an identifier that is not rows, cols or tile_*");
  if (find_operand(decl.name) >= 0) fail("operand '" + decl.name + "' is declared twice");
  if (decl.role != Role::scalar_in) {
    const bool floats = !(decl.dtypes.contains(DType::i32) || decl.dtypes.contains(DType::i64));
    const bool ints = !(decl.dtypes.contains(DType::f32) || decl.dtypes.contains(DType::f16) ||
                        decl.dtypes.contains(DType::bf16) || decl.dtypes.contains(DType::f64));
    if (decl.dtypes.empty() || (!floats && !ints))
      fail("operand '" + decl.name + "': expected float dtypes or integer dtypes, got " + decl.dtypes.to_string());
  }
  operands_.push_back(std::move(decl));
  serial_ = next_serial();
  return Operand{int(operands_.size()) - 1};
}

namespace {
OperandDecl make_decl(std::string name, Role role, DTypeSet dtypes, bool optional, int alias, std::string doc) {
  OperandDecl d;
  d.name = std::move(name), d.role = role, d.dtypes = dtypes, d.optional = optional, d.may_alias = alias;
  d.doc = std::move(doc);
  return d;
}
}  // namespace

Operand RowProgram::row_in(std::string name, DTypeSet dtypes, std::string doc, bool optional) {
  return declare(make_decl(std::move(name), Role::row_in, dtypes, optional, -1, std::move(doc)));
}
Operand RowProgram::row_out(std::string name, DTypeSet dtypes, Operand may_alias, std::string doc, bool optional) {
  if (may_alias && (may_alias.id >= int(operands_.size()) || operands_[may_alias.id].role != Role::row_in))
    fail("row output '" + printable(name) + "' may alias only a row input" +
         (may_alias.id < int(operands_.size()) ? ", not '" + operands_[may_alias.id].name + "'" : ""));
  return declare(make_decl(std::move(name), Role::row_out, dtypes, optional, may_alias.id, std::move(doc)));
}
Operand RowProgram::row_scalar_in(std::string name, DTypeSet dtypes, std::string doc, bool optional) {
  return declare(make_decl(std::move(name), Role::row_scalar_in, dtypes, optional, -1, std::move(doc)));
}
Operand RowProgram::row_scalar_out(std::string name, DTypeSet dtypes, bool optional, std::string doc) {
  return declare(make_decl(std::move(name), Role::row_scalar_out, dtypes, optional, -1, std::move(doc)));
}
Operand RowProgram::col_in(std::string name, DTypeSet dtypes, bool optional, std::string doc) {
  return declare(make_decl(std::move(name), Role::col_in, dtypes, optional, -1, std::move(doc)));
}
Operand RowProgram::col_out(std::string name, DTypeSet dtypes, bool optional, std::string doc) {
  return declare(make_decl(std::move(name), Role::col_out, dtypes, optional, -1, std::move(doc)));
}
Operand RowProgram::scalar_in(std::string name, ValueType type, std::optional<double> default_value, std::string doc) {
  if (type == ValueType::b1) fail("scalar '" + printable(name) + "': expected type f32 or i64, got b1");
  DTypeSet dtypes = type == ValueType::f32 ? DTypeSet::statistics() : DTypeSet{DType::i64};
  OperandDecl d = make_decl(std::move(name), Role::scalar_in, dtypes, false, -1, std::move(doc));
  d.scalar_type = type;
  // A default is checked as a call's value would be, here, rather than in every call that
  // leaves the scalar out (whose error would name an argument the caller never gave).
  auto shown = [](double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.17g", v);
    return std::string(buf);
  };
  if (default_value && type == ValueType::i64 &&
      !exact_integer(*default_value))
    fail("scalar '" + printable(d.name) + "': default " + shown(*default_value) + ": expected an integer of magnitude at most 2^53");
  if (default_value && !std::isfinite(*default_value))
    fail("scalar '" + printable(d.name) + "': default " + shown(*default_value) + ": expected a finite value");
  d.default_value = default_value;
  return declare(std::move(d));
}
Operand RowProgram::scalar_out(std::string name, DTypeSet dtypes, bool optional, std::string doc) {
  return declare(make_decl(std::move(name), Role::scalar_out, dtypes, optional, -1, std::move(doc)));
}

void RowProgram::scalar_range(Operand scalar, double lo, double hi) {
  if (!scalar || scalar.id >= int(operands_.size()) || operands_[scalar.id].role != Role::scalar_in)
    fail("scalar_range of an operand that is not a scalar input");
  if (!(lo <= hi)) fail("scalar_range [" + std::to_string(lo) + ", " + std::to_string(hi) + "] is empty");
  operands_[scalar.id].min_value = lo;
  operands_[scalar.id].max_value = hi;
  serial_ = next_serial();
}

int RowProgram::find_operand(const std::string& name) const {
  for (size_t i = 0; i < operands_.size(); ++i)
    if (operands_[i].name == name) return int(i);
  return -1;
}

int RowProgram::add(RowNode node) {
  // The passes walk a program's graph recursively: a bound keeps them inside any thread's stack
  // (a chain of some 12,000 nodes overflowed it), far above what an operator takes.
  if (nodes_.size() >= size_t(kMaxNodes))
    fail("more than " + std::to_string(kMaxNodes) + " nodes (a row program holds at most that many)");
  // Whether it depends on a reduction over the rows, from its operands' (result nodes come set).
  for (int o : {node.a, node.b, node.c})
    if (o >= 0) node.after_rows |= nodes_[size_t(o)].after_rows;
  nodes_.push_back(node);
  serial_ = next_serial();
  return int(nodes_.size()) - 1;
}

const RowNode& RowProgram::node(RowExpr e) const {
  if (e.program != this) fail("an expression from another program (or a default-constructed one) is used");
  if (e.id < 0 || e.id >= int(nodes_.size()))
    fail("expression node " + std::to_string(e.id) + ": expected a node of this program, 0 to " +
         std::to_string(int(nodes_.size()) - 1));
  return nodes_[e.id];
}

namespace {
Shape shape_of(Role role) {
  switch (role) {
    case Role::row_in: return {true, true};
    case Role::row_scalar_in: return {true, false};
    case Role::col_in: return {false, true};
    default: return {false, false};
  }
}
}  // namespace

RowExpr RowProgram::load(Operand operand) {
  if (!operand || operand.id >= int(operands_.size())) fail("load of an operand that is not declared");
  const OperandDecl& d = operands_[operand.id];
  if (is_output(d.role)) fail("load of '" + d.name + "', which is an output");
  if (d.optional) fail("load of optional operand '" + d.name + "': use load_or(operand, value when absent)");
  RowNode n{RowNode::Kind::load};
  n.operand = operand.id;
  n.shape = shape_of(d.role);
  if (d.role == Role::scalar_in)
    n.type = d.scalar_type;
  else
    n.type = d.dtypes.contains(DType::i32) || d.dtypes.contains(DType::i64) ? ValueType::i64 : ValueType::f32;
  return {this, add(n)};
}

RowExpr RowProgram::load_or(Operand operand, double absent) {
  if (!operand || operand.id >= int(operands_.size())) fail("load_or of an operand that is not declared");
  OperandDecl& d = operands_[operand.id];
  const bool optional = d.optional;
  d.optional = false;  // load() refuses optional operands; the absent value makes this one safe
  RowExpr e;
  try {
    e = load(operand);
  } catch (...) {
    d.optional = optional;
    throw;
  }
  d.optional = optional;
  nodes_[e.id].value = absent;
  serial_ = next_serial();
  return e;
}

RowExpr RowProgram::constant(double value) {
  RowNode n{RowNode::Kind::constant};
  n.value = value;
  return {this, add(n)};
}

RowExpr RowProgram::constant(double f32, double f64) {
  RowNode n{RowNode::Kind::constant};
  n.value = f32, n.f64_value = f64;
  return {this, add(n)};
}

RowExpr RowProgram::integer(int64_t value) {
  RowNode n{RowNode::Kind::constant, ValueType::i64};
  n.value = double(value);
  if (value > kMaxExactInteger || value < -kMaxExactInteger)
    fail("integer constant " + std::to_string(value) + " is not exactly representable (|v| <= 2^53)");
  return {this, add(n)};
}

RowExpr RowProgram::cols() { return {this, add({RowNode::Kind::cols})}; }

RowExpr RowProgram::col_index() {
  RowNode n{RowNode::Kind::col_index, ValueType::i64};
  n.shape = {false, true};
  return {this, add(n)};
}

namespace {
Shape join(Shape a, Shape b) { return {a.rows || b.rows, a.cols || b.cols}; }
}  // namespace

RowExpr RowProgram::unary(UnaryFn fn, RowExpr a) {
  const RowNode& x = node(a);
  RowNode n{RowNode::Kind::unary};
  n.unary = fn, n.a = a.id, n.shape = x.shape;
  if (fn == UnaryFn::logical_not) {
    if (x.type != ValueType::b1) fail(std::string("not of a ") + std::string(value_type_name(x.type)) + " value");
    n.type = ValueType::b1;
  } else if (fn == UnaryFn::to_f32) {
    if (x.type == ValueType::b1) fail("to_f32 of a b1 value: use select(cond, 1, 0)");
    n.type = ValueType::f32;
  } else if (fn == UnaryFn::neg || fn == UnaryFn::abs) {
    if (x.type == ValueType::b1) fail(std::string(unary_fn_name(fn)) + " of a b1 value");
    n.type = x.type;
  } else {
    if (x.type != ValueType::f32)
      fail(std::string(unary_fn_name(fn)) + " of a " + std::string(value_type_name(x.type)) + " value: expected f32");
    n.type = ValueType::f32;
  }
  return {this, add(n)};
}

RowExpr RowProgram::binary(BinaryFn fn, RowExpr a, RowExpr b) {
  const RowNode &x = node(a), &y = node(b);
  const bool ax = x.after_rows, by = y.after_rows;
  if ((ax && y.shape.rows) || (by && x.shape.rows))
    fail("a reduction over the rows is combined with a value that varies along the rows");
  if (x.type != y.type)
    fail(std::string(binary_fn_name(fn)) + " of " + std::string(value_type_name(x.type)) + " and " +
         std::string(value_type_name(y.type)) + ": convert with to_f32 first");
  RowNode n{RowNode::Kind::binary};
  n.binary = fn, n.a = a.id, n.b = b.id, n.shape = join(x.shape, y.shape);
  if (is_logical(fn)) {
    if (x.type != ValueType::b1) fail(std::string(binary_fn_name(fn)) + " of non-b1 values");
    n.type = ValueType::b1;
  } else if (is_comparison(fn)) {
    if (x.type == ValueType::b1 && fn != BinaryFn::eq && fn != BinaryFn::ne) fail("ordering comparison of b1 values");
    n.type = ValueType::b1;
  } else {
    if (x.type == ValueType::b1) fail(std::string(binary_fn_name(fn)) + " of b1 values");
    // Integer division would truncate in a kernel (and trap or be undefined on a zero divisor)
    // where the float64 reference divides exactly: not defined, so refused.
    if (fn == BinaryFn::div && x.type == ValueType::i64)
      fail("div of i64 values: integer division is not defined in row programs; convert with to_f32 first");
    n.type = x.type;
  }
  return {this, add(n)};
}

RowExpr RowProgram::select(RowExpr cond, RowExpr a, RowExpr b) {
  const RowNode &c = node(cond), &x = node(a), &y = node(b);
  if (c.type != ValueType::b1) fail("select condition of type " + std::string(value_type_name(c.type)) + ": expected b1");
  if (x.type != y.type)
    fail("select of " + std::string(value_type_name(x.type)) + " and " + std::string(value_type_name(y.type)));
  bool after = false, rows = false;
  for (RowExpr e : {cond, a, b}) {
    after |= node(e).after_rows;
    rows |= node(e).shape.rows;
  }
  if (after && rows) fail("a reduction over the rows is combined with a value that varies along the rows");
  RowNode n{RowNode::Kind::select, x.type};
  n.a = cond.id, n.b = a.id, n.c = b.id, n.shape = join(c.shape, join(x.shape, y.shape));
  return {this, add(n)};
}

std::vector<RowExpr> RowProgram::reduce(Axis axis, const Monoid& monoid, std::vector<RowExpr> inputs) {
  monoid.check();
  if (int(inputs.size()) != monoid.inputs)
    fail("reduce with " + monoid.name + " takes " + std::to_string(monoid.inputs) + " input(s), got " +
         std::to_string(inputs.size()));
  RowReduction r{axis, monoid, {}, {}};
  for (RowExpr e : inputs) {
    const RowNode& x = node(e);
    if (x.type != ValueType::f32) fail("reduce of a " + std::string(value_type_name(x.type)) + " value: expected f32");
    if (node(e).after_rows) fail("reduce of a value that is itself reduced over the rows");
    if (axis == Axis::cols && !x.shape.cols)
      fail("reduce over the columns of a " + shape_name(x.shape) + " value (it does not vary along the columns)");
    if (axis == Axis::rows && !x.shape.rows)
      fail("reduce over the rows of a " + shape_name(x.shape) + " value (it does not vary along the rows)");
    r.inputs.push_back(e.id);
  }
  Shape in{};
  for (int id : r.inputs) in = join(in, nodes_[id].shape);
  const int index = int(reductions_.size());
  std::vector<RowExpr> out;
  for (size_t part = 0; part < monoid.parts.size(); ++part) {
    RowNode n{RowNode::Kind::result};
    n.reduction = index, n.part = int(part), n.after_rows = axis == Axis::rows;
    n.shape = axis == Axis::cols ? Shape{in.rows, false} : Shape{false, in.cols};
    int id = add(n);
    r.results.push_back(id);
    out.push_back({this, id});
  }
  reductions_.push_back(std::move(r));
  serial_ = next_serial();
  return out;
}

RowExpr RowProgram::reduce1(Axis axis, const Monoid& monoid, RowExpr input) {
  if (monoid.parts.size() != 1) fail("reduce1 with " + monoid.name + ", which has " + std::to_string(monoid.parts.size()) + " parts");
  return reduce(axis, monoid, {input})[0];
}

std::pair<RowExpr, RowExpr> RowProgram::reduce2(Axis axis, const Monoid& monoid, RowExpr input) {
  if (monoid.parts.size() != 2) fail("reduce2 with " + monoid.name + ", which has " + std::to_string(monoid.parts.size()) + " parts");
  std::vector<RowExpr> r = reduce(axis, monoid, {input});
  return {r[0], r[1]};
}

void RowProgram::store(Operand operand, RowExpr value) {
  if (!operand || operand.id >= int(operands_.size())) fail("store to an operand that is not declared");
  const OperandDecl& d = operands_[operand.id];
  const RowNode& v = node(value);
  if (!is_output(d.role)) fail("store to '" + d.name + "', which is an input");
  for (const RowStore& s : stores_)
    if (s.operand == operand.id) fail("'" + d.name + "' is stored twice");
  if (v.type == ValueType::b1) fail("store of a b1 value to '" + d.name + "': select a number first");
  const bool int_operand = d.dtypes.contains(DType::i32) || d.dtypes.contains(DType::i64);
  if ((v.type == ValueType::i64) != int_operand)
    fail("store of a " + std::string(value_type_name(v.type)) + " value to '" + d.name + "' of dtype " + d.dtypes.to_string());
  const bool after = v.after_rows;
  switch (d.role) {
    case Role::row_out:
      if (after) fail("store of a reduction over the rows to row output '" + d.name + "'");
      break;
    case Role::row_scalar_out:
      if (after || v.shape.cols) fail("store of a " + shape_name(v.shape) + " value to per-row output '" + d.name + "'");
      break;
    case Role::col_out:
      if (!after || v.shape.rows) fail("store to per-column output '" + d.name + "' of a value that is not reduced over the rows");
      break;
    case Role::scalar_out:
      if (!after || v.shape.rows || v.shape.cols)
        fail("store to scalar output '" + d.name + "' of a value that is not a reduction over the rows to one value");
      break;
    default: break;
  }
  stores_.push_back({operand.id, value.id});
  serial_ = next_serial();
}

void RowProgram::validate() const {
  for (size_t i = 0; i < operands_.size(); ++i) {
    if (!is_output(operands_[i].role)) continue;
    bool stored = false;
    for (const RowStore& s : stores_) stored |= s.operand == int(i);
    if (!stored) fail("output '" + operands_[i].name + "' is never stored");
  }
  if (stores_.empty()) fail("the program stores nothing");
  // Rows and columns come from a row operand every call gives.
  bool rows = false;
  for (const OperandDecl& d : operands_) rows |= (d.role == Role::row_in || d.role == Role::row_out) && !d.optional;
  if (!rows) fail("expected at least one row input or output operand that is not optional");
}

std::string RowProgram::to_string() const {
  std::ostringstream os;
  os << "row_program " << name_ << " {\n";
  for (const OperandDecl& d : operands_) {
    os << "  " << role_name(d.role) << " " << d.name << ": " << d.dtypes.to_string();
    if (d.optional) os << " (optional)";
    if (d.may_alias >= 0) os << " (may alias " << operands_[d.may_alias].name << ")";
    if (d.default_value) os << " = " << *d.default_value;
    os << "\n";
  }
  for (size_t i = 0; i < nodes_.size(); ++i) {
    const RowNode& n = nodes_[i];
    os << "  %" << i << " " << value_type_name(n.type) << " " << shape_name(n.shape) << " = ";
    switch (n.kind) {
      case RowNode::Kind::load:
        os << "load " << operands_[n.operand].name;
        if (operands_[n.operand].optional) os << " or " << n.value;
        break;
      case RowNode::Kind::constant:
        os << "const " << n.value;
        if (n.f64_value) os << " (f64: " << *n.f64_value << ")";
        break;
      case RowNode::Kind::cols: os << "cols"; break;
      case RowNode::Kind::col_index: os << "col_index"; break;
      case RowNode::Kind::unary: os << unary_fn_name(n.unary) << " %" << n.a; break;
      case RowNode::Kind::binary: os << binary_fn_name(n.binary) << " %" << n.a << ", %" << n.b; break;
      case RowNode::Kind::select: os << "select %" << n.a << ", %" << n.b << ", %" << n.c; break;
      case RowNode::Kind::result: {
        const RowReduction& r = reductions_[n.reduction];
        os << "reduce_" << (r.axis == Axis::cols ? "cols " : "rows ") << r.monoid.name << "(";
        for (size_t k = 0; k < r.inputs.size(); ++k) os << (k ? ", %" : "%") << r.inputs[k];
        os << ")." << r.monoid.parts[n.part];
        break;
      }
    }
    os << "\n";
  }
  for (const RowStore& s : stores_) os << "  store " << operands_[s.operand].name << " = %" << s.value << "\n";
  os << "}\n";
  return os.str();
}

namespace {
RowExpr bin(BinaryFn fn, RowExpr a, RowExpr b) { return a.program->binary(fn, a, b); }
RowExpr un(UnaryFn fn, RowExpr a) { return a.program->unary(fn, a); }
RowExpr lit(RowExpr like, double v) { return like.program->constant(v); }
}  // namespace

RowExpr operator+(RowExpr a, RowExpr b) { return bin(BinaryFn::add, a, b); }
RowExpr operator-(RowExpr a, RowExpr b) { return bin(BinaryFn::sub, a, b); }
RowExpr operator*(RowExpr a, RowExpr b) { return bin(BinaryFn::mul, a, b); }
RowExpr operator/(RowExpr a, RowExpr b) { return bin(BinaryFn::div, a, b); }
RowExpr operator-(RowExpr a) { return un(UnaryFn::neg, a); }
RowExpr operator+(RowExpr a, double b) { return a + lit(a, b); }
RowExpr operator+(double a, RowExpr b) { return lit(b, a) + b; }
RowExpr operator-(RowExpr a, double b) { return a - lit(a, b); }
RowExpr operator-(double a, RowExpr b) { return lit(b, a) - b; }
RowExpr operator*(RowExpr a, double b) { return a * lit(a, b); }
RowExpr operator*(double a, RowExpr b) { return lit(b, a) * b; }
RowExpr operator/(RowExpr a, double b) { return a / lit(a, b); }
RowExpr operator/(double a, RowExpr b) { return lit(b, a) / b; }
RowExpr exp(RowExpr a) { return un(UnaryFn::exp, a); }
RowExpr log(RowExpr a) { return un(UnaryFn::log, a); }
RowExpr sqrt(RowExpr a) { return un(UnaryFn::sqrt, a); }
RowExpr rsqrt(RowExpr a) { return un(UnaryFn::rsqrt, a); }
RowExpr abs(RowExpr a) { return un(UnaryFn::abs, a); }
RowExpr tanh(RowExpr a) { return un(UnaryFn::tanh, a); }
RowExpr max(RowExpr a, RowExpr b) { return bin(BinaryFn::max, a, b); }
RowExpr min(RowExpr a, RowExpr b) { return bin(BinaryFn::min, a, b); }
RowExpr to_f32(RowExpr a) { return un(UnaryFn::to_f32, a); }
RowExpr exponent(RowExpr a) { return un(UnaryFn::exponent, a); }
RowExpr ldexp(RowExpr a, RowExpr b) { return bin(BinaryFn::ldexp, a, b); }
RowExpr ldexp(RowExpr a, double b) { return ldexp(a, lit(a, b)); }
RowExpr eq(RowExpr a, RowExpr b) { return bin(BinaryFn::eq, a, b); }
RowExpr ne(RowExpr a, RowExpr b) { return bin(BinaryFn::ne, a, b); }
RowExpr lt(RowExpr a, RowExpr b) { return bin(BinaryFn::lt, a, b); }
RowExpr le(RowExpr a, RowExpr b) { return bin(BinaryFn::le, a, b); }
RowExpr logical_and(RowExpr a, RowExpr b) { return bin(BinaryFn::logical_and, a, b); }
RowExpr logical_or(RowExpr a, RowExpr b) { return bin(BinaryFn::logical_or, a, b); }
RowExpr logical_not(RowExpr a) { return un(UnaryFn::logical_not, a); }

}  // namespace tile
