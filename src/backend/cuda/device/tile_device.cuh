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

TILE_DEVICE bool tile_aligned(const void* p, unsigned long long bytes) {
  return (reinterpret_cast<unsigned long long>(p) & (bytes - 1)) == 0;
}

TILE_DEVICE void tile_named_barrier(int id, int threads) {
  asm volatile("bar.sync %0, %1;" : : "r"(id), "r"(threads) : "memory");
}
