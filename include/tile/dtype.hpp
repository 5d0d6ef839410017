// Element types of tensors in memory and their conversions to and from the register types.
//
// A kernel's float registers have one precision, chosen by the call's float operands: f64
// when they are f64 (float64 calls exist for gradient checks against finite differences),
// else f32, with fp16 and bf16 existing only in memory. A call does not mix f64 with other
// float dtypes (bind rejects it). The integer dtypes (i32, i64) are for integer operands such
// as a per-row target class; loads widen them to i64. Float conversions round to nearest even,
// as the GPU's cvt.rn instructions do, so the CPU backend stores the same bits the CUDA
// backend stores.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace tile {

// f64 comes last so the earlier values (which name dtypes in cache keys) keep their numbers.
enum class DType : uint8_t { f32, f16, bf16, i32, i64, f64 };

constexpr int dtype_size(DType t) {
  return t == DType::i64 || t == DType::f64 ? 8 : (t == DType::f32 || t == DType::i32) ? 4 : 2;
}
constexpr bool is_float(DType t) {
  return t == DType::f32 || t == DType::f16 || t == DType::bf16 || t == DType::f64;
}
std::string_view dtype_name(DType t);
// The magnitude from which a value rounds to infinity in a float dtype t (half a unit above its
// largest finite value); infinity for f64 and the integers. The oracle checks compare results
// after clamping both sides to it.
constexpr double overflow_threshold(DType t) {
  return t == DType::f32    ? 0x1p128 * (1 - 0x1p-25)
         : t == DType::f16  ? 65520.0
         : t == DType::bf16 ? 0x1p128 * (1 - 0x1p-9)
                            : __builtin_huge_val();
}
// Parses "f32"/"float32", "f64"/"float64", "f16"/"float16", "bf16"/"bfloat16", "i32"/"int32",
// "i64"/"int64";
// throws tile::Error otherwise.
DType parse_dtype(std::string_view name);

inline float bf16_bits_to_float(uint16_t bits) {
  uint32_t u = uint32_t(bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint16_t float_to_bf16_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu) != 0)
    return uint16_t((u >> 16) | 0x0040u);  // quiet NaN, sign kept
  uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
  return uint16_t((u + rounding) >> 16);
}

float f16_bits_to_float(uint16_t bits);
uint16_t float_to_f16_bits(float f);

// Reads element i of a buffer of type t as fp32.
inline float load_as_float(const void* base, int64_t i, DType t) {
  switch (t) {
    case DType::f32: return static_cast<const float*>(base)[i];
    case DType::bf16: return bf16_bits_to_float(static_cast<const uint16_t*>(base)[i]);
    case DType::f16: return f16_bits_to_float(static_cast<const uint16_t*>(base)[i]);
    case DType::i32: return float(static_cast<const int32_t*>(base)[i]);
    case DType::i64: return float(static_cast<const int64_t*>(base)[i]);
    case DType::f64: return float(static_cast<const double*>(base)[i]);
  }
  return 0.0f;
}

// Reads element i of a buffer of type t as fp64 (exact for every float dtype).
inline double load_as_double(const void* base, int64_t i, DType t) {
  switch (t) {
    case DType::f64: return static_cast<const double*>(base)[i];
    case DType::i32: return double(static_cast<const int32_t*>(base)[i]);
    case DType::i64: return double(static_cast<const int64_t*>(base)[i]);
    default: return double(load_as_float(base, i, t));
  }
}

// Reads element i of an integer buffer as i64 (floats are truncated toward zero).
inline int64_t load_as_int(const void* base, int64_t i, DType t) {
  switch (t) {
    case DType::i32: return static_cast<const int32_t*>(base)[i];
    case DType::i64: return static_cast<const int64_t*>(base)[i];
    case DType::f64: return int64_t(static_cast<const double*>(base)[i]);
    default: return int64_t(load_as_float(base, i, t));
  }
}

inline void store_from_float(void* base, int64_t i, DType t, float v) {
  switch (t) {
    case DType::f32: static_cast<float*>(base)[i] = v; break;
    case DType::bf16: static_cast<uint16_t*>(base)[i] = float_to_bf16_bits(v); break;
    case DType::f16: static_cast<uint16_t*>(base)[i] = float_to_f16_bits(v); break;
    case DType::i32: static_cast<int32_t*>(base)[i] = int32_t(v); break;
    case DType::i64: static_cast<int64_t*>(base)[i] = int64_t(v); break;
    case DType::f64: static_cast<double*>(base)[i] = double(v); break;
  }
}

// Stores an fp64 value; narrower floats round once, to nearest even, from the double.
inline void store_from_double(void* base, int64_t i, DType t, double v) {
  switch (t) {
    case DType::f64: static_cast<double*>(base)[i] = v; break;
    case DType::i32: static_cast<int32_t*>(base)[i] = int32_t(v); break;
    case DType::i64: static_cast<int64_t*>(base)[i] = int64_t(v); break;
    default: store_from_float(base, i, t, float(v)); break;
  }
}

inline void store_from_int(void* base, int64_t i, DType t, int64_t v) {
  switch (t) {
    case DType::i32: static_cast<int32_t*>(base)[i] = int32_t(v); break;
    case DType::i64: static_cast<int64_t*>(base)[i] = v; break;
    default: store_from_float(base, i, t, float(v)); break;
  }
}

}  // namespace tile
