// The tile GEMV's pieces shared by the default module's gemv_tile.cu and
// gemv_tile_group.cu and by the mid module's grouped GEMVs (cu/mid/; each
// module's source puts this right after common.cuh: kernels.go,
// kernels_mid.go). One text for the loads, the weight formats, a chunk's
// FMA order and the grouped launch's segment map, so the mid kernels' sums
// stay the default grouped kernels' bit for bit without a transcription to
// keep in step.

#define TILE_THREADS 256

// Elements of a row each virtual thread of the grouped GEMV's norm prologue
// loads at once (fastnorm; the mid kernels' prologue).
#define GROUP_NORM_REGS 4

// A weight load past L1 at the L2's normal priority (the form before
// session 47's evict-first loads).
__device__ __forceinline__ uint4 tile_ld16_normal(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

__device__ __forceinline__ uint4 tile_ld16(const void* p) {
#ifdef TILERT_L2_EVICT_FIRST
  return ldw16_first(p);
#else
  return tile_ld16_normal(p);
#endif
}

// The grouped GEMVs' weight loads: tile_ld16's, or with TILERT_L2_GROUP_NORMAL
// (kernels.GroupNormal, the default since session 48; TILERT_GPU_L2_EVICT=keys
// clears it) its load before evict-first: faster at normal priority, -11..-33
// us a step on an H100.
__device__ __forceinline__ uint4 group_ld16(const void* p) {
#if defined(TILERT_L2_EVICT_FIRST) && !defined(TILERT_L2_GROUP_NORMAL)
  return ldw16_first(p);
#else
  return tile_ld16_normal(p);
#endif
}

__device__ __forceinline__ u32 tile_word(uint4 v, int q) {
  return q == 0 ? v.x : q == 1 ? v.y : q == 2 ? v.z : v.w;
}

// Weight formats: EW weights per 32-bit word, E per 16-byte chunk.
struct TFP8 {
  enum { E = 16, EW = 4, BYTES = 1 };
  static __device__ __forceinline__ void word(u32 w, float* o) { fp8x4_to_f32(w, o); }
};

struct TBF16 {
  enum { E = 8, EW = 2, BYTES = 2 };
  static __device__ __forceinline__ void word(u32 w, float* o) {
    o[0] = __uint_as_float(w << 16);
    o[1] = __uint_as_float(w & 0xffff0000u);
  }
};

template <int EW>
__device__ __forceinline__ void tile_ldx(const float* p, float* o) {
  if (EW == 4) {
    const float4 v = __ldg((const float4*)p);
    o[0] = v.x;
    o[1] = v.y;
    o[2] = v.z;
    o[3] = v.w;
  } else {
    const float2 v = __ldg((const float2*)p);
    o[0] = v.x;
    o[1] = v.y;
  }
}

// One input row's sums over one 16-byte chunk of R weight rows (wv[r]):
// p[r] = sum over the chunk's E elements of w*x in element order, where x
// is the chunk xc of the row, or with a norm weight (wc != 0) the value
// rmsnorm writes, wc[k]*(xc[k]*rn); the caller scales p by the chunk's
// block scale. A statement macro, not a function: inlined as a function it
// renumbers the PTX registers of some kernels that run it (kernel_ptx_diff:
// the mid module's r4_m1_d16 variant), and their PTX is to stay as it was.
#define TILE_CHUNK_M1(T, R, xc, wc, rn, wv, p)                                              \
  {                                                                                         \
    _Pragma("unroll") for (int r = 0; r < R; r++) p[r] = 0.0f;                              \
    _Pragma("unroll") for (int q = 0; q < 4; q++) {                                         \
      float xv[T::EW];                                                                      \
      tile_ldx<T::EW>(xc + q * T::EW, xv);                                                  \
      if (wc) {                                                                             \
        float nv[T::EW];                                                                    \
        tile_ldx<T::EW>(wc + q * T::EW, nv);                                                \
        _Pragma("unroll") for (int e = 0; e < T::EW; e++) xv[e] = nv[e] * (xv[e] * rn);     \
      }                                                                                     \
      _Pragma("unroll") for (int r = 0; r < R; r++) {                                       \
        float wf[T::EW];                                                                    \
        T::word(tile_word(wv[r], q), wf);                                                   \
        _Pragma("unroll") for (int e = 0; e < T::EW; e++) p[r] = fmaf(wf[e], xv[e], p[r]);  \
      }                                                                                     \
    }                                                                                       \
  }

// A grouped-GEMV block's rows (W [N][K] of format T, scales S, G threads a
// group, R rows a group, blk the block's index within its segment; the
// names in scope): declares the thread's group grp and place tg in it, the
// group's first row n0, its rows' pointers wr[R] (rows past N repeat row
// N-1, not written), its scale row sr (the group's rows lie in one 128-row
// scale block: R divides 128, n0 is a multiple of R; clamped rows repeat
// row N-1 >= n0: one scale per chunk) and its chunks C (0 for idle groups
// past N: they load nothing). A statement macro, as GROUP_SEGMENT is.
#define GROUP_ROWS(T, R)                                                          \
  const int grp = threadIdx.x / G, tg = threadIdx.x - grp * G;                    \
  const int n0 = (blk * (TILE_THREADS / G) + grp) * R;                            \
  const int kb = (K + 127) >> 7;                                                  \
  const char* wr[R];                                                              \
  _Pragma("unroll") for (int r = 0; r < R; r++) {                                 \
    const int n = min(n0 + r, N - 1);                                             \
    wr[r] = (const char*)W + (size_t)n * K * T::BYTES;                            \
  }                                                                               \
  const float* sr = S ? S + (size_t)(min(n0, N - 1) >> 7) * kb : (const float*)0; \
  const int C = n0 < N ? K / T::E : 0;

// A grouped-GEMV thread's round of NI chunks (c0 + i*G, i < NI) of its R
// rows (wr[r]) and each chunk's block scale (sr: the group's scale row, 0:
// 1.0); chunks at or past C load zeros and scale 0.
template <class T, int R, int NI>
__device__ __forceinline__ void group_load(const char* const* wr, const float* sr, int c0, int G, int C,
                                           uint4 (*wv)[R], float* sc) {
#pragma unroll
  for (int i = 0; i < NI; i++) {
    const int c = c0 + i * G;
#pragma unroll
    for (int r = 0; r < R; r++) wv[i][r] = c < C ? group_ld16(wr[r] + (size_t)c * 16) : make_uint4(0u, 0u, 0u, 0u);
    sc[i] = c < C ? (sr ? __ldg(sr + ((c * T::E) >> 7)) : 1.0f) : 0.0f;
  }
}

// rmsnorm's sum of squares of the row xr[0..K) in its own order (virtual
// thread v of nthr sums x[v], x[v+nthr], ...; warp butterflies), a virtual
// warp's sum into nshm[vw]; the loads of a virtual thread's elements issued
// GROUP_NORM_REGS at a time (a plain loop waits one L2 round trip per
// element, times the virtual warps a warp plays: 28 in a row at K = 7168;
// here 8, and 2 at K = 1536). Few at a time keeps the registers of the GEMV
// around it (all 32 of a warp's elements at once: 52-76 -> 120-127).
__device__ __forceinline__ void group_sumsq_fast(const float* xr, int K, int nvw, int nthr, int warp, int lane,
                                                 float* nshm) {
#pragma unroll 1
  for (int vw = warp; vw < nvw; vw += TILE_THREADS / 32) {
    float ss = 0.0f;
#pragma unroll 1
    for (int i0 = vw * 32 + lane; i0 < K; i0 += GROUP_NORM_REGS * nthr) {
      float v[GROUP_NORM_REGS];
#pragma unroll
      for (int j = 0; j < GROUP_NORM_REGS; j++) {
        const int i = i0 + j * nthr;
        v[j] = i < K ? xr[i] : 0.0f;
      }
#pragma unroll
      for (int j = 0; j < GROUP_NORM_REGS; j++)
        if (i0 + j * nthr < K) ss += v[j] * v[j];
    }
    ss = warp_sum(ss);
    if (lane == 0) nshm[vw] = ss;
  }
}

// Blocks of a segment of N rows: R rows per group, TILE_THREADS/G groups.
template <int R>
__device__ __forceinline__ int group_blocks(int N, int cfg) {
  const int G = cfg & 1023;
  return N > 0 ? ((N + R - 1) / R + TILE_THREADS / G - 1) / (TILE_THREADS / G) : 0;
}

// A grouped launch's segment for this block (segment 0's blocks first,
// group_blocks<R> each): declares blk (the block's index within the
// segment), W, S, y, N, ldy and cfg (G | bf16 << 14) from the segment
// arguments w0, s0, y0, n0, ldy0, cfg0, ... w3, ..., cfg3 in scope. A
// statement macro, not a function: inlined as a function (struct or
// reference results) it renumbers the PTX registers of the grouped
// kernels (kernel_ptx_diff), whose PTX is to stay as it was.
#define GROUP_SEGMENT(R)                                         \
  int blk = blockIdx.x;                                          \
  const void* W = w0;                                            \
  const float* S = s0;                                           \
  float* y = y0;                                                 \
  int N = n0, ldy = ldy0, cfg = cfg0;                            \
  int nb = group_blocks<R>(n0, cfg0);                            \
  if (blk >= nb) {                                               \
    blk -= nb;                                                   \
    W = w1, S = s1, y = y1, N = n1, ldy = ldy1, cfg = cfg1;      \
    nb = group_blocks<R>(n1, cfg1);                              \
    if (blk >= nb) {                                             \
      blk -= nb;                                                 \
      W = w2, S = s2, y = y2, N = n2, ldy = ldy2, cfg = cfg2;    \
      nb = group_blocks<R>(n2, cfg2);                            \
      if (blk >= nb) {                                           \
        blk -= nb;                                               \
        W = w3, S = s3, y = y3, N = n3, ldy = ldy3, cfg = cfg3;  \
      }                                                          \
    }                                                            \
  }
