// Device helpers included at the top of every generated kernel. Self-contained: NVRTC
// compiles it without any CUDA header. Conversions round to nearest even.
#define TILE_DEVICE inline __device__ __attribute__((always_inline))

TILE_DEVICE float tile_bf16_to_f32(unsigned int h) { return __uint_as_float((h & 0xffffu) << 16); }
TILE_DEVICE float tile_f16_to_f32(unsigned int h) {
  float f;
  unsigned short s = (unsigned short)h;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(s));
  return f;
}
TILE_DEVICE float tile_f32_to_f32(unsigned int w) { return __uint_as_float(w); }

TILE_DEVICE unsigned int tile_f32_bits_bf16(float f) {
  unsigned short r;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(f));
  return r;
}
TILE_DEVICE unsigned int tile_f32_bits_f16(float f) {
  unsigned short r;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(r) : "f"(f));
  return r;
}
TILE_DEVICE unsigned int tile_f32_bits_f32(float f) { return __float_as_uint(f); }

// Two 16-bit values packed low-first into one 32-bit word.
TILE_DEVICE unsigned int tile_pack2(unsigned int lo, unsigned int hi) { return (lo & 0xffffu) | (hi << 16); }

// The hardware's base-2 exponential (MUFU.EX2); results below 2^-126 flush to zero, far
// under any tolerance a reduction output is held to.
TILE_DEVICE float tile_exp2(float a) {
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(a));
  return r;
}

// f32 min and max that are NaN when either operand is (the IR's semantics, torch.maximum's).
TILE_DEVICE float tile_max(float a, float b) {
#if __CUDA_ARCH__ >= 800
  float r;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
#else
  return (a != a || b != b) ? __int_as_float(0x7fffffff) : fmaxf(a, b);
#endif
}
TILE_DEVICE float tile_min(float a, float b) {
#if __CUDA_ARCH__ >= 800
  float r;
  asm("min.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
#else
  return (a != a || b != b) ? __int_as_float(0x7fffffff) : fminf(a, b);
#endif
}

// floor(log2 |a|) for finite nonzero a (exact, subnormals included), else 0.
TILE_DEVICE float tile_exponent(float a) {
  return (a == 0.0f || !(fabsf(a) <= 3.40282347e38f)) ? 0.0f : (float)ilogbf(a);
}
// a * 2^b for an integer-valued b, exact; b clamped to [-1000, 1000], NaN if b is NaN.
TILE_DEVICE float tile_ldexp(float a, float b) {
  return b != b ? b : ldexpf(a, (int)fminf(fmaxf(b, -1000.0f), 1000.0f));
}

TILE_DEVICE bool tile_aligned(const void* p, unsigned long long bytes) {
  return (reinterpret_cast<unsigned long long>(p) & (bytes - 1)) == 0;
}

TILE_DEVICE void tile_named_barrier(int id, int threads) {
  asm volatile("bar.sync %0, %1;" : : "r"(id), "r"(threads) : "memory");
}
