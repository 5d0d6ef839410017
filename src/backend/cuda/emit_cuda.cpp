#include "backend/cuda/emit_cuda.hpp"

#include <cmath>
#include <cstdio>
#include <set>
#include <sstream>

#include "ir/printer.hpp"
#include "tile/error.hpp"

namespace tile::cuda {

namespace {

using namespace ir;

const char* word_type(int bytes) {
  switch (bytes) {
    case 2: return "unsigned short";
    case 4: return "unsigned int";
    case 8: return "uint2";
    case 16: return "uint4";
  }
  TILE_CHECK(false, "no word type of ", bytes, " bytes");
  return "";
}

const char* element_type(DType t) {
  switch (t) {
    case DType::f32: return "float";
    case DType::f16:
    case DType::bf16: return "unsigned short";
    case DType::i32: return "int";
    case DType::i64: return "long long";
    case DType::f64: return "double";
  }
  return "?";
}

// Component c (32-bit) of a loaded word of `bytes` bytes.
std::string component(const std::string& w, int bytes, int c) {
  if (bytes <= 4) return w;
  static const char* xyzw[] = {".x", ".y", ".z", ".w"};
  return w + xyzw[c];
}

class CudaEmitter : public IRPrinter {
 public:
  CudaEmitter(std::ostream& os, const Kernel& k) : IRPrinter(os, k) {
    std::set<std::string> seen;
    for (size_t i = 0; i < k.regs.size(); ++i) {
      std::string n = k.regs[i].name;
      if (!seen.insert(n).second) n += "_" + std::to_string(i);
      names_.push_back(n);
    }
  }

  void print_kernel() override {
    os_ << device_source() << "\n";
    std::string sig;
    for (const Buffer& b : k_.buffers) {
      // __restrict__ only where no other buffer of the launch may alias this one (an in-place
      // call passes the same pointer as input and output).
      sig += std::string(sig.empty() ? "" : ", ") + (b.output ? "" : "const ") + element_type(b.dtype) +
             (b.noalias ? "* __restrict__ " : "* ") + b.name + "  /* " + std::string(dtype_name(b.dtype)) + " */";
    }
    for (const ScalarParam& p : k_.params) sig += ", " + type_spelling(p.type) + " " + p.name;
    // The plan's resident groups per SM bound the registers ptxas may use (launch bounds).
    const int threads = k_.threads_per_group();
    const std::string min_groups = k_.resident_groups > 1 ? ", " + std::to_string(k_.resident_groups) : "";
    os_ << "extern \"C\" __global__ void __launch_bounds__(" << threads << min_groups << ")\n"
        << k_.name << "(" << sig << ") {\n";
    indent_ = 1;
    int shared = k_.shared_elems();
    if (shared > 0) line("__shared__ " + type_spelling(k_.real) + " tile_shared[" + std::to_string(shared) + "];");
    if (!k_.staged.empty())
      line("extern __shared__ __align__(16) unsigned char tile_staged[];  // " + std::to_string(k_.staged_bytes()) +
           " bytes: the staged row slices");
    const int exchanges = k_.exchange_count();
    if (exchanges > 0)
      line("__shared__ __align__(8) unsigned long long tile_exchange[" + std::to_string(exchanges) +
           "];  // one transaction barrier an exchange region");
    const int W = k_.workers_per_program;
    line("const int tile_tid = threadIdx.x;");
    line("const long long group_index = blockIdx.x;");
    line("const long long group_count = gridDim.x;");
    line("const int program_in_group = tile_tid / " + std::to_string(W) + ";");
    line("const int worker_in_program = tile_tid % " + std::to_string(W) + ";");
    line("const int warp_in_program = worker_in_program >> 5;");
    line("const int lane = tile_tid & 31;");
    // Groups of a cluster share rows: row blocks are indexed by cluster (the launch puts
    // ctas_per_cluster consecutive groups in one cluster).
    const int C = k_.ctas_per_cluster;
    if (C > 1) {
      line("const int cta_in_cluster = tile_cluster_ctarank();  // 0.." + std::to_string(C - 1));
      line("const long long cluster_index = group_index / " + std::to_string(C) + ";");
    } else {
      line("const int cta_in_cluster = 0;");
      line("const long long cluster_index = group_index;");
    }
    line("(void)program_in_group; (void)warp_in_program; (void)lane; (void)group_count; (void)cta_in_cluster; "
         "(void)cluster_index;");
    // Exchange regions: thread 0 initialises each region's transaction barrier; the IR's
    // cluster barrier before the first push makes that visible to the cluster.
    if (exchanges > 0) {
      line("if (tile_tid == 0) {");
      for (int e = 0; e < exchanges; ++e) line("  tile_exchange_init(&tile_exchange[" + std::to_string(e) + "]);");
      line("}");
      // Each thread counts its waits of a region (uniform across the cluster): the parity of
      // the phase its next wait is for.
      for (int e = 0; e < exchanges; ++e) line("unsigned tile_exchange_phase" + std::to_string(e) + " = 0u;");
    }
    for (size_t i = 0; i < k_.regs.size(); ++i)
      line(type_spelling(k_.regs[i].type) + " " + names_[i] + ";" +
           (k_.regs[i].cached ? "  // cached input" : ""));
    indent_ = 0;
    visit_block(k_.body);
    os_ << "}\n";
  }

 protected:
  std::string reg_name(int id) const override { return names_[id]; }
  std::string statement_end() const override { return ";"; }

  std::string type_spelling(Type t) const override {
    switch (t) {
      case Type::f32: return "float";
      case Type::i32: return "int";
      case Type::i64: return "long long";
      case Type::b1: return "bool";
      case Type::f64: return "double";
    }
    return "?";
  }

  std::string visit_constant(const Expr& e) override {
    if (e.type == Type::f32) {
      float f = float(e.f);
      if (std::isinf(f)) return f > 0 ? "__int_as_float(0x7f800000)" : "__int_as_float(0xff800000)";
      if (std::isnan(f)) return "__int_as_float(0x7fffffff)";
      char buf[64];
      std::snprintf(buf, sizeof buf, "%af", double(f));
      return buf;
    }
    if (e.type == Type::f64) {
      if (std::isinf(e.f)) return e.f > 0 ? "__longlong_as_double(0x7ff0000000000000LL)" : "__longlong_as_double(0xfff0000000000000ULL)";
      if (std::isnan(e.f)) return "__longlong_as_double(0x7fffffffffffffffLL)";
      char buf[64];
      std::snprintf(buf, sizeof buf, "%a", e.f);  // hexadecimal: the exact double
      return buf;
    }
    if (e.type == Type::b1) return e.i ? "true" : "false";
    if (e.type == Type::i64) return std::to_string(e.i) + "LL";
    return std::to_string(e.i);
  }

  std::string unary_expr(UnOp op, const std::string& a, Type t) override {
    if (t == Type::f64) {  // the double-precision library functions (correctly rounded or 1-2 ulp)
      switch (op) {
        case UnOp::exp: return "exp(" + a + ")";
        case UnOp::exp2: return "exp2(" + a + ")";
        case UnOp::log: return "log(" + a + ")";
        case UnOp::rsqrt: return "rsqrt(" + a + ")";
        case UnOp::sqrt: return "sqrt(" + a + ")";
        case UnOp::tanh: return "tanh(" + a + ")";
        case UnOp::abs: return "fabs(" + a + ")";
        default: break;  // neg; exponent is overloaded for double
      }
    }
    switch (op) {
      case UnOp::neg: return "(-" + a + ")";
      case UnOp::exp: return "expf(" + a + ")";
      case UnOp::exp2: return "tile_exp2(" + a + ")";
      case UnOp::log: return "logf(" + a + ")";
      case UnOp::rsqrt: return "rsqrtf(" + a + ")";
      case UnOp::sqrt: return "sqrtf(" + a + ")";
      case UnOp::not_: return "(!" + a + ")";
      case UnOp::tanh: return "tanhf(" + a + ")";
      case UnOp::exponent: return "tile_exponent(" + a + ")";
      case UnOp::abs: return t == Type::f32 ? "fabsf(" + a + ")" : "(" + a + " < 0 ? -" + a + " : " + a + ")";
    }
    return "?";
  }

  std::string binary_expr(BinOp op, const std::string& a, const std::string& b, Type t) override {
    if (op == BinOp::min || op == BinOp::max) {
      if (is_real(t)) return std::string(op == BinOp::min ? "tile_min(" : "tile_max(") + a + ", " + b + ")";
    }
    if (op == BinOp::ldexp) return "tile_ldexp(" + a + ", " + b + ")";
    return IRPrinter::binary_expr(op, a, b, t);
  }

  std::string cast_expr(Type to, const std::string& a) override { return "((" + type_spelling(to) + ")" + a + ")"; }

  std::string row_aligned_expr(int buffer, const std::string& offset, int bytes) override {
    return "tile_aligned(" + k_.buffers[buffer].name + " + " + offset + ", " + std::to_string(bytes) + ")";
  }

  std::string unpack16_expr(DType dtype, const std::string& word, int half) override {
    return "tile_" + std::string(dtype_name(dtype)) + "_to_f32(" + (half ? "((unsigned)" + word + " >> 16)" : "(unsigned)" + word) + ")";
  }

  // Every access is one block: its index and valid count, then the vector path when the row is
  // aligned and the access lies in the row, else the scalar path.
  void open_access(const Stmt& s) {
    ++indent_;
    line("const long long tile_i = " + visit(*s.index) + ";");
    line("const long long tile_n = " + visit(*s.valid) + ";");
    if (s.whole)
      line("if (tile_n >= " + std::to_string(s.width) + ") {");
    else
      line("if (" + visit(*s.aligned) + " && tile_n >= " + std::to_string(s.width) + ") {");
    ++indent_;
  }
  void else_access() {
    --indent_;
    line("} else {");
    ++indent_;
  }
  // A clamped whole load: lanes past the row end read the row's last vector and keep `fill`,
  // so every lane issues the same vector load.
  template <typename Convert>
  void print_clamped_whole_load(const Stmt& s, Convert convert, const std::string& fill) {
    const Buffer& b = k_.buffers[s.buffer];
    const int bytes = s.raw ? s.width * 2 : s.width * dtype_size(b.dtype);
    const std::string W = std::to_string(s.width);
    ++indent_;  // inside the block the caller opened
    line("const long long tile_i = " + visit(*s.index) + ";");
    line("const long long tile_n = " + visit(*s.valid) + ";");
    line("const " + std::string(word_type(bytes)) + " tile_w = *reinterpret_cast<const " + word_type(bytes) + "*>(" +
         b.name + " + (tile_n >= " + W + " ? tile_i : tile_i + tile_n - " + W + "));");
    for (size_t j = 0; j < s.dsts.size(); ++j)
      line(reg_name(s.dsts[j]) + " = tile_n >= " + W + " ? " + convert(int(j), "tile_w") + " : " + fill + ";");
    --indent_;
    line("}");
  }
  void close_access() {
    --indent_;
    line("}");
    --indent_;
    line("}");
  }

  // Raw 16-bit load: words straight from the vector access, or assembled from scalar loads.
  void print_raw_load(const Stmt& s) {
    const Buffer& b = k_.buffers[s.buffer];
    const int bytes = s.width * 2;
    line("{  // raw " + std::string(s.clamp ? "clamped " : "") + "load " + b.name + ", " + std::to_string(s.width) + " elements");
    if (s.whole && s.clamp) return print_clamped_whole_load(s, [&](int w, const std::string& word) {
      return "(int)" + component(word, bytes, w); }, "0");
    open_access(s);
    line("const " + std::string(word_type(bytes)) + " tile_w = *reinterpret_cast<const " + word_type(bytes) + "*>(" + b.name + " + tile_i);");
    for (size_t w = 0; w < s.dsts.size(); ++w) line(reg_name(s.dsts[w]) + " = (int)" + component("tile_w", bytes, int(w)) + ";");
    else_access();
    if (s.whole) {
      for (size_t w = 0; w < s.dsts.size(); ++w) line(reg_name(s.dsts[w]) + " = 0;");
      return close_access();
    }
    auto element = [&](int j) {
      std::string jj = std::to_string(j);
      std::string at = s.clamp ? b.name + "[tile_i + (" + jj + " < tile_n - 1 ? " + jj + " : tile_n - 1)]" : b.name + "[tile_i + " + jj + "]";
      return "(" + jj + " < tile_n ? (unsigned)" + at + " : 0u)";
    };
    for (size_t w = 0; w < s.dsts.size(); ++w)
      line(reg_name(s.dsts[w]) + " = (int)(" + element(int(2 * w)) + " | (" + element(int(2 * w + 1)) + " << 16));");
    close_access();
  }

  // Integer buffers: element by element (their operands are per-row scalars or short rows).
  void print_int_load(const Stmt& s) {
    const Buffer& b = k_.buffers[s.buffer];
    const std::string fill = std::to_string(int64_t(s.fill)) + "LL";
    line("{  // " + std::string(s.clamp ? "clamped " : "") + "load " + b.name + ", " + std::to_string(s.width) + " elements");
    ++indent_;
    line("const long long tile_i = " + visit(*s.index) + ";");
    line("const long long tile_n = " + visit(*s.valid) + ";");
    for (int j = 0; j < s.width; ++j) {
      std::string jj = std::to_string(j);
      std::string at = s.clamp ? b.name + "[tile_i + (" + jj + " < tile_n - 1 ? " + jj + " : tile_n - 1)]" : b.name + "[tile_i + " + jj + "]";
      if (s.clamp) line("if (tile_n > 0) " + reg_name(s.dsts[j]) + " = (long long)" + at + ";");
      line(reg_name(s.dsts[j]) + " = " + jj + " < tile_n ? " + (s.clamp ? reg_name(s.dsts[j]) : "(long long)" + at) + " : " + fill + ";");
    }
    --indent_;
    line("}");
  }
  void print_int_store(const Stmt& s) {
    const Buffer& b = k_.buffers[s.buffer];
    line("{  // store " + b.name + ", " + std::to_string(s.width) + " elements");
    ++indent_;
    line("const long long tile_i = " + visit(*s.index) + ";");
    line("const long long tile_n = " + visit(*s.valid) + ";");
    for (int j = 0; j < s.width; ++j)
      line("if (" + std::to_string(j) + " < tile_n) " + b.name + "[tile_i + " + std::to_string(j) + "] = (" +
           element_type(b.dtype) + ")" + reg_name(s.dsts[j]) + ";");
    --indent_;
    line("}");
  }

  // f64 buffers (an f64 kernel's, whose registers are double): double or double2 accesses.
  void print_f64_load(const Stmt& s) {
    const Buffer& b = k_.buffers[s.buffer];
    const std::string word = s.width == 1 ? "double" : "double2";
    const std::string fill = visit(*f64_const(s.fill));
    line("{  // " + std::string(s.clamp ? "clamped " : "") + "load " + b.name + ", " + std::to_string(s.width) + " elements");
    auto convert = [&](int j, const std::string& w) { return s.width == 1 ? w : w + (j ? ".y" : ".x"); };
    if (s.whole && s.clamp) {
      const std::string W = std::to_string(s.width);
      ++indent_;
      line("const long long tile_i = " + visit(*s.index) + ";");
      line("const long long tile_n = " + visit(*s.valid) + ";");
      line("const " + word + " tile_w = *reinterpret_cast<const " + word + "*>(" + b.name + " + (tile_n >= " + W +
           " ? tile_i : tile_i + tile_n - " + W + "));");
      for (int j = 0; j < s.width; ++j)
        line(reg_name(s.dsts[j]) + " = tile_n >= " + W + " ? " + convert(j, "tile_w") + " : " + fill + ";");
      --indent_;
      line("}");
      return;
    }
    open_access(s);
    line("const " + word + " tile_w = *reinterpret_cast<const " + word + "*>(" + b.name + " + tile_i);");
    for (int j = 0; j < s.width; ++j) line(reg_name(s.dsts[j]) + " = " + convert(j, "tile_w") + ";");
    else_access();
    if (s.whole) {
      for (int j = 0; j < s.width; ++j) line(reg_name(s.dsts[j]) + " = " + fill + ";");
      return close_access();
    }
    for (int j = 0; j < s.width; ++j) {
      std::string jj = std::to_string(j);
      if (s.clamp) {
        line(reg_name(s.dsts[j]) + " = " + b.name + "[tile_i + (" + jj + " < tile_n - 1 ? " + jj + " : tile_n - 1)];");
        line(reg_name(s.dsts[j]) + " = " + jj + " < tile_n ? " + reg_name(s.dsts[j]) + " : " + fill + ";");
      } else {
        line(reg_name(s.dsts[j]) + " = " + jj + " < tile_n ? " + b.name + "[tile_i + " + jj + "] : " + fill + ";");
      }
    }
    close_access();
  }
  void print_f64_store(const Stmt& s) {
    const Buffer& b = k_.buffers[s.buffer];
    line("{  // store " + b.name + ", " + std::to_string(s.width) + " elements");
    open_access(s);
    if (s.width == 1)
      line("*reinterpret_cast<double*>(" + b.name + " + tile_i) = " + reg_name(s.dsts[0]) + ";");
    else
      line("*reinterpret_cast<double2*>(" + b.name + " + tile_i) = make_double2(" + reg_name(s.dsts[0]) + ", " +
           reg_name(s.dsts[1]) + ");");
    if (s.whole) return close_access();
    else_access();
    for (int j = 0; j < s.width; ++j)
      line("if (" + std::to_string(j) + " < tile_n) " + b.name + "[tile_i + " + std::to_string(j) + "] = " +
           reg_name(s.dsts[j]) + ";");
    close_access();
  }

  void visit_load(const Stmt& s) override {
    if (s.raw) return print_raw_load(s);
    if (!is_float(k_.buffers[s.buffer].dtype)) return print_int_load(s);
    if (k_.buffers[s.buffer].dtype == DType::f64) return print_f64_load(s);
    const Buffer& b = k_.buffers[s.buffer];
    const std::string dt(dtype_name(b.dtype));
    const int es = dtype_size(b.dtype), bytes = s.width * es;
    line("{  // " + std::string(s.clamp ? "clamped " : "") + "load " + b.name + ", " + std::to_string(s.width) + " elements");
    auto convert = [&](int j, const std::string& w) {
      std::string word = es == 4 ? component(w, bytes, j) : component(w, bytes, j / 2);
      if (es == 2 && bytes > 2) word = j % 2 ? "(" + word + " >> 16)" : word;
      return "tile_" + dt + "_to_f32(" + word + ")";
    };
    std::string fill = visit(*f32_const(s.fill));  // an f32 kernel's: f64 buffers take print_f64_load
    if (s.whole && s.clamp) return print_clamped_whole_load(s, convert, fill);
    open_access(s);
    line("const " + std::string(word_type(bytes)) + " tile_w = *reinterpret_cast<const " + word_type(bytes) +
         "*>(" + b.name + " + tile_i);");
    for (int j = 0; j < s.width; ++j) line(reg_name(s.dsts[j]) + " = " + convert(j, "tile_w") + ";");
    else_access();
    if (s.whole) {
      for (int j = 0; j < s.width; ++j) line(reg_name(s.dsts[j]) + " = " + fill + ";");
      return close_access();
    }
    // A scalar f32 element is already a float; 16-bit elements are converted from their bits.
    auto scalar = [&](const std::string& element) { return es == 4 ? element : "tile_" + dt + "_to_f32(" + element + ")"; };
    for (int j = 0; j < s.width; ++j) {
      std::string jj = std::to_string(j);
      if (s.clamp) {
        line(reg_name(s.dsts[j]) + " = " + scalar(b.name + "[tile_i + (" + jj + " < tile_n - 1 ? " + jj + " : tile_n - 1)]") + ";");
        line(reg_name(s.dsts[j]) + " = " + jj + " < tile_n ? " + reg_name(s.dsts[j]) + " : " + fill + ";");
      } else {
        line(reg_name(s.dsts[j]) + " = " + jj + " < tile_n ? " + scalar(b.name + "[tile_i + " + jj + "]") + " : " + fill + ";");
      }
    }
    close_access();
  }

  void visit_store(const Stmt& s) override {
    if (!is_float(k_.buffers[s.buffer].dtype)) return print_int_store(s);
    if (k_.buffers[s.buffer].dtype == DType::f64) return print_f64_store(s);
    const Buffer& b = k_.buffers[s.buffer];
    const std::string dt(dtype_name(b.dtype));
    const int es = dtype_size(b.dtype), bytes = s.width * es;
    auto bits = [&](int j) { return "tile_f32_bits_" + dt + "(" + reg_name(s.dsts[j]) + ")"; };
    line("{  // store " + b.name + ", " + std::to_string(s.width) + " elements");
    open_access(s);
    std::vector<std::string> words;
    if (es == 4) {
      for (int j = 0; j < s.width; ++j) words.push_back(bits(j));
    } else if (bytes == 2) {
      words.push_back("(unsigned short)" + bits(0));
    } else {
      for (int j = 0; j < s.width; j += 2) words.push_back("tile_pack2(" + bits(j) + ", " + bits(j + 1) + ")");
    }
    std::string value;
    if (words.size() == 1) {
      value = words[0];
    } else {
      value = std::string(words.size() == 2 ? "make_uint2(" : "make_uint4(");
      for (size_t w = 0; w < words.size(); ++w) value += (w ? ", " : "") + words[w];
      value += ")";
    }
    line("*reinterpret_cast<" + std::string(word_type(bytes)) + "*>(" + b.name + " + tile_i) = " + value + ";");
    if (s.whole) return close_access();
    else_access();
    for (int j = 0; j < s.width; ++j) {
      std::string v = es == 4 ? reg_name(s.dsts[j]) : "(unsigned short)" + bits(j);
      line("if (" + std::to_string(j) + " < tile_n) " + b.name + "[tile_i + " + std::to_string(j) + "] = " + v + ";");
    }
    close_access();
  }

  void visit_shfl_xor(const Stmt& s) override {
    line(reg_name(s.dst) + " = __shfl_xor_sync(0xffffffffu, " + reg_name(s.src) + ", " + std::to_string(s.offset) +
         ", " + std::to_string(s.width) + ");");
  }

  void visit_shfl_idx(const Stmt& s) override {
    line(reg_name(s.dst) + " = __shfl_sync(0xffffffffu, " + reg_name(s.src) + ", " + std::to_string(s.offset) + ", " +
         std::to_string(s.width) + ");");
  }

  std::string shared_slot(const Stmt& s) {
    const SharedRegion& r = k_.shared[s.region];
    return "tile_shared[" + std::to_string(r.base) + " + program_in_group * " + std::to_string(r.program_stride) +
           " + " + visit(*s.index) + "]";
  }
  void visit_shared_store(const Stmt& s) override { line(shared_slot(s) + " = " + visit(*s.value) + ";"); }
  void visit_shared_load(const Stmt& s) override { line(reg_name(s.dst) + " = " + shared_slot(s) + ";"); }
  void visit_remote_shared_load(const Stmt& s) override {
    line(reg_name(s.dst) + " = tile_remote_shared_load(&" + shared_slot(s) + ", " + visit(*s.cta) + ");");
  }
  void visit_remote_shared_push(const Stmt& s) override {
    line("tile_remote_shared_push(&" + shared_slot(s) + ", &tile_exchange[" + std::to_string(exchange_of(s.region)) +
         "], " + visit(*s.cta) + ", " + reg_name(s.src) + ");");
  }
  void visit_exchange_wait(const Stmt& s) override {
    const SharedRegion& r = k_.shared[s.region];
    const std::string e = std::to_string(exchange_of(s.region));
    line("tile_exchange_wait(&tile_exchange[" + e + "], " + std::to_string(r.pushes * (k_.real == Type::f64 ? 8 : 4)) +
         ", tile_exchange_phase" + e + ");  // " + r.name + ", " + std::to_string(r.pushes) + " pushes");
    line("tile_exchange_phase" + e + " ^= 1u;");
  }
  int exchange_of(int region) const {
    int e = 0;
    for (int r = 0; r < region; ++r) e += k_.shared[r].pushes > 0;
    return e;
  }

  // A staged region's elements, as stored: float, double, or the bits of 16-bit elements.
  std::string staged_pointer(const Stmt& s, bool constant) {
    const StagedRegion& r = k_.staged[size_t(s.region)];
    const std::string t = std::string(constant ? "const " : "") + element_type(r.dtype);
    return "reinterpret_cast<" + t + "*>(tile_staged + " + std::to_string(k_.staged_offset(s.region)) + ") + (" +
           visit(*s.at) + ")";
  }
  // Whole vectors go as asynchronous copies of at most 16 bytes each; a vector partly in the
  // row, an unaligned one or one of 2-byte elements is copied element by element, which the
  // worker's own later reads see in program order.
  void visit_async_copy(const Stmt& s) override {
    const Buffer& b = k_.buffers[s.buffer];
    const StagedRegion& r = k_.staged[size_t(s.region)];
    const int es = dtype_size(r.dtype), bytes = s.width * es;
    open_copies_ = true;
    line("{  // async copy " + b.name + " -> " + r.name + ", " + std::to_string(s.width) + " elements");
    ++indent_;
    line(std::string(element_type(r.dtype)) + "* tile_s = " + staged_pointer(s, false) + ";");
    line("const long long tile_i = " + visit(*s.index) + ";");
    line("const long long tile_n = " + visit(*s.valid) + ";");
    if (bytes >= 4) {
      const int chunk = std::min(16, bytes);
      line(s.whole ? "if (tile_n >= " + std::to_string(s.width) + ") {"
                   : "if (" + visit(*s.aligned) + " && tile_n >= " + std::to_string(s.width) + ") {");
      for (int c = 0; c < bytes / chunk; ++c) {
        const std::string at = std::to_string(c * chunk / es);
        line("  tile_async_copy<" + std::to_string(chunk) + ">(tile_s + " + at + ", " + b.name + " + tile_i + " + at +
             ");");
      }
      if (s.whole) {  // all or nothing: no element path
        line("}");
        --indent_;
        line("}");
        return;
      }
      line("} else {");
    } else {
      line("{");
    }
    for (int j = 0; j < s.width; ++j)
      line("  if (" + std::to_string(j) + " < tile_n) tile_s[" + std::to_string(j) + "] = " + b.name + "[tile_i + " +
           std::to_string(j) + "];");
    line("}");
    --indent_;
    line("}");
  }
  void visit_async_commit(const Stmt&) override {
    line("tile_async_commit();");
    open_copies_ = false;
  }
  // A wait commits the open group where a copy may be in it (on some path since the last
  // commit); an empty group would count as in flight and make later waits land more.
  void visit_async_wait(const Stmt& s) override {
    if (open_copies_) line("tile_async_commit();");
    open_copies_ = false;
    line("tile_async_wait<" + std::to_string(std::min(s.offset, 63)) +
         ">();  // older copies of this worker have landed");
  }
  void visit_staged_load(const Stmt& s) override {
    const StagedRegion& r = k_.staged[size_t(s.region)];
    const int es = dtype_size(r.dtype), bytes = s.width * es;
    const std::string dt(dtype_name(r.dtype));
    auto value = [&](const std::string& bits) {
      return es == 2 ? "tile_" + dt + "_to_f32(" + bits + ")" : bits;  // f32 and f64 are stored as values
    };
    const std::string fill = visit(*float_const(k_.real, s.fill));
    line("{  // staged load " + r.name + ", " + std::to_string(s.width) + " elements");
    ++indent_;
    line("const " + std::string(element_type(r.dtype)) + "* tile_s = " + staged_pointer(s, true) + ";");
    line("const long long tile_n = " + visit(*s.valid) + ";");
    line("if (tile_n >= " + std::to_string(s.width) + ") {");
    // Words of at most 16 bytes; element j is in word j * es / 16.
    const int chunk = std::min(16, bytes);
    const int per_word = chunk / es;
    for (int w = 0; w < bytes / chunk; ++w) {
      const std::string word = "tile_w" + std::to_string(w);
      if (es == 8)
        line("  const " + std::string(chunk == 16 ? "double2" : "double") + " " + word + " = *reinterpret_cast<const " +
             (chunk == 16 ? "double2" : "double") + "*>(tile_s + " + std::to_string(w * per_word) + ");");
      else if (es == 4)
        line("  const " +
             std::string(chunk == 16  ? "float4"
                         : chunk == 8 ? "float2"
                                      : "float") +
             " " + word + " = *reinterpret_cast<const " +
             (chunk == 16  ? "float4"
              : chunk == 8 ? "float2"
                           : "float") +
             "*>(tile_s + " + std::to_string(w * per_word) + ");");
      else
        line("  const " + std::string(word_type(chunk)) + " " + word + " = *reinterpret_cast<const " +
             word_type(chunk) + "*>(tile_s + " + std::to_string(w * per_word) + ");");
      for (int e = 0; e < per_word; ++e) {
        const int j = w * per_word + e;
        std::string bits;
        if (es == 2)
          bits = chunk == 2 ? word : "(" + component(word, chunk, e / 2) + (e % 2 ? " >> 16)" : ")");
        else
          bits = per_word == 1 ? word : word + std::string(".") + "xyzw"[e];
        line("  " + reg_name(s.dsts[size_t(j)]) + " = " + value(bits) + ";");
      }
    }
    line("} else {");
    for (int j = 0; j < s.width; ++j)
      line("  " + reg_name(s.dsts[size_t(j)]) + " = " +
           (s.whole ? fill
                    : std::to_string(j) + " < tile_n ? " + value("tile_s[" + std::to_string(j) + "]") + " : " + fill) +
           ";");
    line("}");
    --indent_;
    line("}");
  }

  void visit_barrier(const Stmt& s) override {
    if (s.scope == Scope::group)
      line("__syncthreads();  // group barrier");
    else if (s.scope == Scope::cluster && s.phase == BarrierPhase::arrive)
      line("tile_cluster_arrive();  // cluster barrier, arrive");
    else if (s.scope == Scope::cluster && s.phase == BarrierPhase::wait)
      line("tile_cluster_wait();  // cluster barrier, wait");
    else if (s.scope == Scope::cluster)
      line("tile_cluster_barrier();  // cluster barrier");
    else
      line("tile_named_barrier(1 + program_in_group, " + std::to_string(k_.workers_per_program) +
           ");  // program barrier");
  }

 private:
  std::vector<std::string> names_;
  bool open_copies_ = false;  // an async copy may be in the open group (program order)
};

}  // namespace

std::string emit_cuda(const Kernel& kernel, const std::string& header_comment) {
  std::ostringstream os;
  if (!header_comment.empty()) os << header_comment << "\n";
  CudaEmitter(os, kernel).print_kernel();
  return os.str();
}

}  // namespace tile::cuda
