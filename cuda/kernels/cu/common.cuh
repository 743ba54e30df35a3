// Shared helpers for the TileRT kernels. No system headers: NVRTC compiles
// this without a CUDA toolkit include path, so bf16/fp8 conversions are
// written out with bit operations.
typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;

// Programmatic dependent launch (sm_90+; pdl.go). A kernel named in pdl.go's
// pdlKernels is launched so that it may start while the previous kernel on
// its stream is still running; PDL_WAIT() must then be its first statement:
// griddepcontrol.wait returns once every kernel it depends on has completed
// and its writes are visible (so nothing before it may read what the step
// writes, or write anything), and launch_dependents then lets the next kernel
// launch, so its blocks are scheduled while this one runs and sit in their
// own PDL_WAIT. Launched plainly, both instructions do nothing.
//
// TILERT_BLOCK_CLOCKS (kernels.BlockClocks, a diagnostic build: bench decode
// --block-clocks): PDL_WAIT() then also declares an object whose thread 0
// takes a record (clocks.go's layout) and stores %globaltimer at the block's
// entry, after the wait, and, from the destructor, at its exit, so every
// kernel that starts with it says when its blocks became resident, were
// released and left. One atomic a block; nothing is read before the wait
// that the step writes. A kernel opened by PDL_WAIT_MARKED() may also take
// up to eight marks, BLOCK_MARK(i) (nothing without the define): when thread
// 0 passed each phase, which clocks.go's MarkLabels names per kernel.
#if defined(TILERT_BLOCK_CLOCKS) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
__device__ u64* tilert_clocks;     // records of 5 u64; null: off (Set.ArmBlockClocks)
__device__ u32 tilert_clocks_cap;  // records it holds
__device__ u32 tilert_clocks_n;    // records taken (may pass cap: those are lost)
__device__ __forceinline__ u64 tilert_globaltimer() {
  u64 t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
// A record's first two words: the name word h and the grid's size, the
// block's linear index and its SM.
__device__ __forceinline__ void tilert_clock_head(u64* r, u32 h) {
  u32 smid;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
  r[0] = (u64)h | ((u64)(gridDim.x * gridDim.y * gridDim.z) << 32);
  r[1] = (u64)(blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z)) | ((u64)smid << 32);
}
struct TilertBlockClock {
  u32 slot;  // thread 0's record, ~0u for every other thread or none
  __device__ __forceinline__ explicit TilertBlockClock(const char* fn) : slot(~0u) {
    if (threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0 && tilert_clocks != nullptr) {
      u64 t = tilert_globaltimer();
      u32 s = atomicAdd(&tilert_clocks_n, 1u);
      if (s < tilert_clocks_cap) {
        slot = s;
        u32 h = 2166136261u;  // FNV-1a of the kernel's name (clocks.go's nameHash)
        for (const char* p = fn; *p; ++p) h = (h ^ (u32)(u8)*p) * 16777619u;
        u64* r = tilert_clocks + 5ull * s;
        tilert_clock_head(r, h);
        r[2] = t;
      }
    }
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;");
    if (slot != ~0u) tilert_clocks[5ull * slot + 3] = tilert_globaltimer();
  }
  __device__ __forceinline__ ~TilertBlockClock() {
    if (slot != ~0u) tilert_clocks[5ull * slot + 4] = tilert_globaltimer();
  }
};
#define PDL_WAIT() TilertBlockClock tilert_block_clock_(__func__)
// PDL_WAIT_MARKED(): PDL_WAIT() in a kernel that takes marks. Before the
// wait thread 0 reserves two more records (the marks' header and eight
// times; one atomic while the block waits anyway) and keeps their slot in
// tilert_mark_slot, which only such kernels reference: a static shared word
// in every kernel would take 16 bytes from those sized to the opt-in limit.
// 16 bytes, 16-aligned: wherever it lands, the kernel's other shared arrays
// keep their 16-byte alignment (session 61: as one word it moved
// attn_epilogue's kv off its float4 grid in the first clocks build).
__shared__ __align__(16) u32 tilert_mark_slot_[4];
#define tilert_mark_slot tilert_mark_slot_[0]
struct TilertMarks {
  __device__ __forceinline__ TilertMarks() {
    if (threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0) {
      u32 s = ~0u;
      if (tilert_clocks != nullptr) {
        s = atomicAdd(&tilert_clocks_n, 2u);
        if (s + 2u <= tilert_clocks_cap) {
          tilert_clock_head(tilert_clocks + 5ull * s, 0x6d61726bu);  // "mark" (clocks.go MarksTag)
        } else {
          s = ~0u;
        }
      }
      tilert_mark_slot = s;
    }
  }
};
#define PDL_WAIT_MARKED()         \
  TilertMarks tilert_marks_;      \
  PDL_WAIT()
// BLOCK_MARK(i), i in 0..7, only in a kernel opened by PDL_WAIT_MARKED():
// thread 0 stores %globaltimer as mark i (in a loop, its last pass).
#define BLOCK_MARK(i)                                                                    \
  do {                                                                                   \
    if (threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0 && tilert_mark_slot != ~0u) \
      tilert_clocks[5ull * tilert_mark_slot + 2 + (i)] = tilert_globaltimer();           \
  } while (0)
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define PDL_WAIT()                                          \
  do {                                                      \
    asm volatile("griddepcontrol.wait;" ::: "memory");      \
    asm volatile("griddepcontrol.launch_dependents;");      \
  } while (0)
#else
#define PDL_WAIT() \
  do {             \
  } while (0)
#endif
#ifndef BLOCK_MARK
#define PDL_WAIT_MARKED() PDL_WAIT()
#define BLOCK_MARK(i) \
  do {                \
  } while (0)
#endif

// TILERT_L2_EVICT_FIRST (kernels.EvictFirst, the default since session 47;
// the engine's TILERT_GPU_L2_EVICT=normal clears it): what a step reads
// once, the weight streams' 16-byte loads (tile, wide and row GEMVs, the
// absorbed MLA products) and the indexer scores' key loads, bypass L1 and
// are marked evict-first in the L2, so that what is read again (the
// workspace a layer writes and the next reads, norms, scales) stays there
// through the ~8 GB a step streams. Without it each load keeps its own form
// (the PTX before session 47).
// W_LD16: a row GEMV's weight load (__ldg without the define); LD16_ONCE: a
// plain load without it (the absorb products' weights, the indexer keys).
#ifdef TILERT_L2_EVICT_FIRST
#define W_LD16(p) ldw16_first(p)
#define LD16_ONCE(p) ldw16_first(p)
__device__ __forceinline__ uint4 ldw16_first(const void* p) {
  u64 pol;
  asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p), "l"(pol));
  return v;
}
#else
#define W_LD16(p) __ldg((const uint4*)(p))
#define LD16_ONCE(p) (*(const uint4*)(p))
#endif

#define NEG_INF __int_as_float(0xff800000)
#define POS_INF __int_as_float(0x7f800000)
#define FP8_MAX 448.0f

__device__ __forceinline__ float bf16_to_f32(u32 v) { return __uint_as_float((v & 0xffffu) << 16); }

// Round to nearest even; NaN stays a quiet NaN.
__device__ __forceinline__ u16 f32_to_bf16(float f) {
  u32 u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (u16)((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (u16)(u >> 16);
}

// e4m3fn: bias 7, no infinities, 0x7f/0xff are NaN, max 448.
__device__ __forceinline__ float fp8_to_f32(u32 b) {
  u32 s = (b & 0x80u) << 24;
  u32 a = b & 0x7fu;
  float r;
  if (a >= 8u) {
    if (a == 0x7fu) return __uint_as_float(0x7fc00000u | s);
    r = __uint_as_float((a << 20) + (120u << 23));
  } else {
    r = (float)a * 0.001953125f;  // subnormal: m * 2^-9
  }
  return __uint_as_float(__float_as_uint(r) | s);
}

// Four packed e4m3 bytes (little-endian) to floats. Ada/Hopper convert two
// at a time in hardware (e4m3 -> f16 is exact); older GPUs use the bit rule.
__device__ __forceinline__ void fp8x4_to_f32(u32 w, float* o) {
#if __CUDA_ARCH__ >= 890
  u32 lo, hi;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(lo) : "h"((u16)(w & 0xffffu)));
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(hi) : "h"((u16)(w >> 16)));
  asm("cvt.f32.f16 %0, %1;" : "=f"(o[0]) : "h"((u16)(lo & 0xffffu)));
  asm("cvt.f32.f16 %0, %1;" : "=f"(o[1]) : "h"((u16)(lo >> 16)));
  asm("cvt.f32.f16 %0, %1;" : "=f"(o[2]) : "h"((u16)(hi & 0xffffu)));
  asm("cvt.f32.f16 %0, %1;" : "=f"(o[3]) : "h"((u16)(hi >> 16)));
#else
#pragma unroll
  for (int b = 0; b < 4; b++) o[b] = fp8_to_f32((w >> (8 * b)) & 0xffu);
#endif
}

// Round to nearest even, saturating to +-448; NaN -> 0x7f.
__device__ __forceinline__ u8 f32_to_fp8(float f) {
  u32 u = __float_as_uint(f);
  u32 s = (u >> 24) & 0x80u;
  if (f != f) return (u8)0x7f;
  float a = fabsf(f);
  if (a >= FP8_MAX) return (u8)(s | 0x7eu);
  if (a < 0.015625f) {  // below the smallest normal 2^-6: steps of 2^-9
    return (u8)(s | (u32)rintf(a * 512.0f));
  }
  u32 au = __float_as_uint(a);
  au += 0x7ffffu + ((au >> 20) & 1u);
  u32 r = (((au >> 23) - 120u) << 3) | ((au >> 20) & 7u);
  if (r > 0x7eu) r = 0x7eu;
  return (u8)(s | r);
}

// Smallest power of two >= amax/448 (1 for amax <= 0), as vLLM's indexer
// cache and DeepGEMM use. Double precision so the quotient's rounding cannot
// cross a power of two.
__device__ __forceinline__ float ue8m0_scale(float amax) {
  if (!(amax > 0.0f)) return 1.0f;
  double r = (double)amax / 448.0;
  int e;
  double fr = frexp(r, &e);
  if (fr == 0.5) e--;
  if (e > 127) e = 127;
  if (e < -126) e = -126;
  return ldexpf(1.0f, e);
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// A lane's share of the late q_a norm's sum of squares (TILERT_GPU_QA_NORM=
// late) from the grouped GEMV's nss block partials: ss[lane], ss[lane + 32],
// .. added in that order from 0 (warp_sum then takes the lanes), as the loop
// `for (i = lane; i < nss; i += 32) a += ss[i]` did, with the first
// SS_LANE_LOADS loads out together: one L2 round trip where the loop took one
// a partial (session 61's block marks: 2-3 us of the epilogue's query blocks
// on DeepSeek-V3.2 dims' 288 partials). Partials past that keep the loop.
// The epilogue's query blocks and qb_absorb take it (its g32 r4 n kernel
// then spills 0 bytes where it spilled 4); the absorb module's other _n
// kernels keep the loop (12 more registers cost its g8 r8 n a block an SM).
#define SS_LANE_LOADS 12
__device__ __forceinline__ float ss_lane_sum(const float* __restrict__ ss, int nss, int lane) {
  float v[SS_LANE_LOADS];
#pragma unroll
  for (int j = 0; j < SS_LANE_LOADS; j++) v[j] = lane + 32 * j < nss ? ss[lane + 32 * j] : 0.0f;
  float a = 0.0f;
#pragma unroll
  for (int j = 0; j < SS_LANE_LOADS; j++)
    if (lane + 32 * j < nss) a += v[j];
  for (int i = lane + 32 * SS_LANE_LOADS; i < nss; i += 32) a += ss[i];
  return a;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum over the block, same value in every thread; summation order is fixed
// so results are reproducible. sh: 32 floats of shared memory.
__device__ __forceinline__ float block_sum(float v, float* sh) {
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) sh[w] = v;
  __syncthreads();
  float r = 0.0f;
  for (int i = 0; i < nw; i++) r += sh[i];
  return r;
}

__device__ __forceinline__ float block_max(float v, float* sh) {
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) sh[w] = v;
  __syncthreads();
  float r = NEG_INF;
  for (int i = 0; i < nw; i++) r = fmaxf(r, sh[i]);
  return r;
}

// (value, index) arg-max: larger value wins, ties go to the lower index.
__device__ __forceinline__ void argmax_merge(float& v, int& i, float ov, int oi) {
  if (ov > v || (ov == v && oi < i)) {
    v = ov;
    i = oi;
  }
}

__device__ __forceinline__ void warp_argmax(float& v, int& i) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    float ov = __shfl_xor_sync(0xffffffffu, v, o);
    int oi = __shfl_xor_sync(0xffffffffu, i, o);
    argmax_merge(v, i, ov, oi);
  }
}

// Block arg-max; every thread gets the result. shv/shi: 32 entries each.
__device__ __forceinline__ void block_argmax(float& v, int& i, float* shv, int* shi) {
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
  warp_argmax(v, i);
  __syncthreads();
  if (lane == 0) {
    shv[w] = v;
    shi[w] = i;
  }
  __syncthreads();
  v = shv[0];
  i = shi[0];
  for (int k = 1; k < nw; k++) argmax_merge(v, i, shv[k], shi[k]);
}

// Exclusive prefix sum over the block of an int (or a u64: sample_wide's
// masses); total returned through tot. sh: 32 of T.
template <typename T>
__device__ __forceinline__ T block_excl_scan(T v, T* sh, T* tot) {
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
  T x = v;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    T y = __shfl_up_sync(0xffffffffu, x, o);
    if (lane >= o) x += y;
  }
  __syncthreads();
  if (lane == 31) sh[w] = x;
  __syncthreads();
  T before = 0, all = 0;
  for (int k = 0; k < nw; k++) {
    if (k < w) before += sh[k];
    all += sh[k];
  }
  *tot = all;
  return before + x - v;
}

// Order-preserving map of a float to an unsigned key (NaN sorts lowest).
__device__ __forceinline__ u32 float_key(float f) {
  if (f != f) return 0u;
  u32 b = __float_as_uint(f);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// Counter-based RNG: uniform in (0,1) from (seed, step, i). The Go tests
// compute the same function.
__device__ __forceinline__ u64 mix64(u64 z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

__device__ __forceinline__ float rng_uniform(u64 seed, u64 step, u64 i) {
  u64 h = mix64(seed ^ mix64(step ^ mix64(i)));
  return ((float)(h >> 41) + 0.5f) * (1.0f / 8388608.0f);  // exact in float32
}
