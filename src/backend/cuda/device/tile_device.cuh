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

// floor(log2 |a|) for finite nonzero a (exact, subnormals included), else 0, read from the bits:
// a subnormal's from its leading mantissa bit (no library call, whose slow path costs a kernel
// registers at 64 a thread even where it never runs).
TILE_DEVICE float tile_exponent(float a) {
  const int bits = __float_as_int(a) & 0x7fffffff, biased = bits >> 23;
  if (bits == 0 || biased == 0xff) return 0.0f;
  return (float)(biased != 0 ? biased - 127 : (31 - __clz(bits)) - 149);
}
// a * 2^b for an integer-valued b, exact; b clamped to [-1000, 1000], NaN if b is NaN. Where
// 2^b is a normal float, one multiplication by it rounds exactly as ldexpf does (the only
// rounding is of a subnormal result, once, to nearest even). Elsewhere up to two steps of 2^127
// up, or of 2^-102 down (24 bits above the subnormals, so a step rounds only where the result
// rounds to 0 anyway), before that last multiplication: no library call, whose slow path costs
// a kernel registers even where it never runs.
TILE_DEVICE float tile_ldexp(float a, float b) {
  if (b != b) return b;
  int e = (int)fminf(fmaxf(b, -1000.0f), 1000.0f);
  if (e > 127) {
    a *= 0x1p127f, e -= 127;
    if (e > 127) a *= 0x1p127f, e = e - 127 > 127 ? 127 : e - 127;
  } else if (e < -126) {
    a *= 0x1p-102f, e += 102;
    if (e < -126) a *= 0x1p-102f, e = e + 102 < -126 ? -126 : e + 102;
  }
  return a * __int_as_float((e + 127) << 23);
}

// The f64 counterparts, for kernels whose float type is f64 (float64 calls): the same
// semantics at double precision. PTX has no min.NaN.f64, so NaN is tested explicitly.
TILE_DEVICE double tile_max(double a, double b) {
  return (a != a || b != b) ? __longlong_as_double(0x7fffffffffffffffLL) : fmax(a, b);
}
TILE_DEVICE double tile_min(double a, double b) {
  return (a != a || b != b) ? __longlong_as_double(0x7fffffffffffffffLL) : fmin(a, b);
}
TILE_DEVICE double tile_exponent(double a) {
  const long long bits = __double_as_longlong(a) & 0x7fffffffffffffffLL;
  const int biased = (int)(bits >> 52);
  if (bits == 0 || biased == 0x7ff) return 0.0;
  return biased != 0 ? (double)(biased - 1023) : (double)ilogb(a);
}
// b clamped to [-3000, 3000]: past it every finite double over- or underflows anyway.
TILE_DEVICE double tile_ldexp(double a, double b) {
  if (b != b) return b;
  const int e = (int)fmin(fmax(b, -3000.0), 3000.0);
  return (e >= -1022 && e <= 1023) ? a * __longlong_as_double((long long)(e + 1023) << 52) : ldexp(a, e);
}

TILE_DEVICE bool tile_aligned(const void* p, unsigned long long bytes) {
  return (reinterpret_cast<unsigned long long>(p) & (bytes - 1)) == 0;
}

TILE_DEVICE void tile_named_barrier(int id, int threads) {
  asm volatile("bar.sync %0, %1;" : : "r"(id), "r"(threads) : "memory");
}

// The cluster rung (sm_90 and later; a cluster plan is refused where the device has no
// clusters). Rank of this group in its cluster.
TILE_DEVICE int tile_cluster_ctarank() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  unsigned r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return (int)r;
#else
  __trap();
  return 0;
#endif
}

// Every thread of every group of the cluster: the arrive releases this thread's shared memory
// writes to the cluster, the wait acquires the others'. Reached by whole warps (.aligned).
TILE_DEVICE void tile_cluster_barrier() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" : : : "memory");
#else
  __trap();
#endif
}

// Exchange regions (sm_90): a transaction barrier per region (one arrival: thread 0's, which
// expects the bytes of the region's pushes at the wait), initialised by thread 0 at kernel
// start; the fence makes that visible to the cluster's pushes, which the IR orders after a
// cluster barrier.
TILE_DEVICE void tile_exchange_init(unsigned long long* bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" : : "r"((unsigned)__cvta_generic_to_shared(bar)) : "memory");
  asm volatile("fence.mbarrier_init.release.cluster;" : : : "memory");
#else
  __trap();
#endif
}

// Stores `v` at `p` (this group's copy of an exchange region) in the group of rank `rank`,
// completing that many bytes of the transaction barrier `bar` there: one-way, no barrier with
// the owner.
TILE_DEVICE void tile_remote_shared_push(float* p, unsigned long long* bar, int rank, float v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  unsigned slot, remote_bar;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(slot) : "r"((unsigned)__cvta_generic_to_shared(p)), "r"(rank));
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote_bar) : "r"((unsigned)__cvta_generic_to_shared(bar)), "r"(rank));
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];"
               : : "r"(slot), "r"(__float_as_uint(v)), "r"(remote_bar) : "memory");
#else
  __trap();
#endif
}
TILE_DEVICE void tile_remote_shared_push(double* p, unsigned long long* bar, int rank, double v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  unsigned slot, remote_bar;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(slot) : "r"((unsigned)__cvta_generic_to_shared(p)), "r"(rank));
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote_bar) : "r"((unsigned)__cvta_generic_to_shared(bar)), "r"(rank));
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b64 [%0], %1, [%2];"
               : : "r"(slot), "l"(__double_as_longlong(v)), "r"(remote_bar) : "memory");
#else
  __trap();
#endif
}

// Waits for the phase of parity `phase` of an exchange region's transaction barrier: thread 0
// arrives expecting the region's bytes (pushes landed before count against them), then every
// push of the phase has landed. The caller flips its phase after each wait; pushes of the next
// phase land only after the cluster barrier that retires this one, so none counts early.
TILE_DEVICE void tile_exchange_wait(unsigned long long* bar, unsigned bytes, unsigned phase) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (threadIdx.x == 0)
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;"
                 : : "r"((unsigned)__cvta_generic_to_shared(bar)), "r"(bytes) : "memory");
  asm volatile(
      "{\n\t.reg .pred done;\n\tTILE_WAIT_%=:\n\t"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n\t@!done bra TILE_WAIT_%=;\n\t}"
      : : "r"((unsigned)__cvta_generic_to_shared(bar)), "r"(phase) : "memory");
#else
  __trap();
#endif
}

// The halves of a split cluster barrier, for work between them: the arrive is relaxed (it
// publishes no earlier memory accesses, and waits for none: a cluster looping over row blocks
// arrives after instructions that consume its reads of an exchange region, so they are done;
// exchange barriers' initialisation has its own fence), the wait acquires.
TILE_DEVICE void tile_cluster_arrive() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.relaxed.aligned;" : : : "memory");
#else
  __trap();
#endif
}
TILE_DEVICE void tile_cluster_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.wait.acquire.aligned;" : : : "memory");
#else
  __trap();
#endif
}

// The float at `p` (this group's shared memory) in the shared memory of the cluster's group of
// rank `rank`: the address mapped into that group's window (mapa), then a cluster-scope load.
TILE_DEVICE float tile_remote_shared_load(const float* p, int rank) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const unsigned local = (unsigned)__cvta_generic_to_shared(p);
  unsigned remote;
  float v;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(local), "r"(rank));
  asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(remote) : "memory");
  return v;
#else
  __trap();
  return 0.0f;
#endif
}
TILE_DEVICE double tile_remote_shared_load(const double* p, int rank) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const unsigned local = (unsigned)__cvta_generic_to_shared(p);
  unsigned remote;
  double v;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(local), "r"(rank));
  asm volatile("ld.shared::cluster.f64 %0, [%1];" : "=d"(v) : "r"(remote) : "memory");
  return v;
#else
  __trap();
  return 0.0;
#endif
}

// Staged regions (caching "shared"): one worker's copy of `Bytes` (4, 8 or 16) from global to
// shared memory, in flight without holding registers until the worker's tile_async_wait; a
// plain copy before sm_80.
template <int Bytes>
TILE_DEVICE void tile_async_copy(void* shared, const void* global) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned s = (unsigned)__cvta_generic_to_shared(shared);
  if constexpr (Bytes == 16)
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" : : "r"(s), "l"(global) : "memory");
  else
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2;" : : "r"(s), "l"(global), "n"(Bytes) : "memory");
#else
  if constexpr (Bytes == 16)
    *reinterpret_cast<uint4*>(shared) = *reinterpret_cast<const uint4*>(global);
  else if constexpr (Bytes == 8)
    *reinterpret_cast<uint2*>(shared) = *reinterpret_cast<const uint2*>(global);
  else
    *reinterpret_cast<unsigned*>(shared) = *reinterpret_cast<const unsigned*>(global);
#endif
}
TILE_DEVICE void tile_async_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;" : : : "memory");
#endif
}
// Waits until at most InFlight of this thread's committed groups are pending.
template <int InFlight>
TILE_DEVICE void tile_async_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;" : : "n"(InFlight) : "memory");
#endif
}
