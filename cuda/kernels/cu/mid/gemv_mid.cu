// Mid-size grouped GEMVs of one input row (TILERT_GPU_GEMV_MID=1|2; helper
// gmid, issue 10), a module of their own (cu/mid/, after common.cuh; loaded
// on first use, so the default module and its kernel cache entry stay as
// they are): the attention inputs of a decode step (q_a, kv_a, indexer wk
// and weights_proj: 2304 x 7168; q_b and indexer wq_b: 32768 x 1536) as
// gemv_tile_group.cu's launch with more weight loads in flight per thread
// or fewer rows per block, so a thread streams its whole share in one round.
//
// The default grouped kernels issue 8 loads a round (R rows x 8/R chunks):
// with the layer input's G = 256 and R = 8 a thread streams its two chunks
// of each row in two round trips one after the other (288 blocks of 57 KB);
// with q_b's G = 64 likewise (the tile GEMV's _d16 runs q_b in one). These
// kernels are gemv_group_body (gemv_tile_group.cu) for one input row,
// transcribed, with LD loads a round (R rows x LD/R chunks):
// a thread's chunks (c = tg + i*G), their order, the FMA order within a
// chunk, the per-chunk scale and the fixed-order combine depend on G alone,
// so every output is bit for bit the default grouped launch's
// (TestKernelGemvGroupMid checks it on the device).
//
//   gemv_mid_group_r8_m1_d16: R = 8, 16 loads, <= 128 registers (2 blocks an SM)
//   gemv_mid_group_r4_m1_d16: R = 4, 16 loads, <= 128 registers
//   gemv_mid_group_r4_m1_o4:  R = 4, 8 loads, <= 64 registers (4 blocks an SM)
//   gemv_mid_group_r2_m1_o4:  R = 2, 8 loads, <= 64 registers
//
// Each has a twin named with a trailing n (gemv_mid_group_r8_m1_d16n, ...)
// that takes a norm weight: x is then the raw row, normalised as rmsnorm
// writes it (the sums in rmsnorm's order, each value nw[k]*(x[k]*r)), as
// gemv_group's prologue does, with the weights' first round (the whole
// share of a thread at the decode shapes) issued BEFORE the prologue, so
// its round trip overlaps the prologue's (gemv_group's prologue runs first
// and only asks the L2 for that round).
//
// Arguments: gemv_group_*'s (x, ldx, K, M = 1, nw (the _n twins only),
// eps, nf, then four segments of w, s, y, n, ldy, cfg = G | bf16 << 14);
// the launcher is GemvGroupMid (ops_group.go). Needs K % 16 == 0 (fp8) / % 8 (bf16), 16-byte
// aligned W rows and x.

#define MID_THREADS 256

__device__ __forceinline__ uint4 mid_ld16(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

__device__ __forceinline__ u32 mid_word(uint4 v, int q) {
  return q == 0 ? v.x : q == 1 ? v.y : q == 2 ? v.z : v.w;
}

// Weight formats (gemv_tile.cu's TFP8 / TBF16): EW weights per 32-bit
// word, E per 16-byte chunk.
struct MFP8 {
  enum { E = 16, EW = 4, BYTES = 1 };
  static __device__ __forceinline__ void word(u32 w, float* o) { fp8x4_to_f32(w, o); }
};

struct MBF16 {
  enum { E = 8, EW = 2, BYTES = 2 };
  static __device__ __forceinline__ void word(u32 w, float* o) {
    o[0] = __uint_as_float(w << 16);
    o[1] = __uint_as_float(w & 0xffff0000u);
  }
};

template <int EW>
__device__ __forceinline__ void mid_ldx(const float* p, float* o) {
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

// rmsnorm's sum of squares of the row x[0..K) in its own order (nthr
// virtual threads: v sums x[v], x[v+nthr], ...; warp butterflies; the
// virtual warps added in order; gemv_tile_group.cu's prologue, its
// GROUP_NORM_REGS = 4 loads at a time), then r = rsqrt(ss/K + eps) as
// rmsnorm takes it. Every thread gets r.
__device__ __forceinline__ float mid_norm_scale(const float* __restrict__ x, int K, int nthr, float eps,
                                                float* nsh, float* rs) {
  const int nvw = nthr >> 5;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
#pragma unroll 1
  for (int vw = warp; vw < nvw; vw += MID_THREADS / 32) {
    float ss = 0.0f;
#pragma unroll 1
    for (int i0 = vw * 32 + lane; i0 < K; i0 += 4 * nthr) {
      float v[4];
#pragma unroll
      for (int j = 0; j < 4; j++) {
        const int i = i0 + j * nthr;
        v[j] = i < K ? x[i] : 0.0f;
      }
#pragma unroll
      for (int j = 0; j < 4; j++)
        if (i0 + j * nthr < K) ss += v[j] * v[j];
    }
    ss = warp_sum(ss);
    if (lane == 0) nsh[vw] = ss;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    float ss = 0.0f;
    for (int i = 0; i < nvw; i++) ss += nsh[i];
    rs[0] = rsqrtf(ss / (float)K + eps);
  }
  __syncthreads();
  return rs[0];
}

// One segment's block: rows [n0, ...) of W, G threads per group, R rows
// per group, one input row x.
// NORM: the kernel's _n twin, which takes a norm weight nw (without, nw is
// ignored and no prologue is compiled in: the loads held across it would
// cost the 64-register variants spills).
template <class T, int R, int LD, bool NORM>
__device__ __forceinline__ void gemv_mid_body(const void* W, const float* S, float* y, int N, int G, int blk,
                                              const float* __restrict__ x, int K, const float* __restrict__ nw_,
                                              float eps, int nthr, float (*part)[32], float* nsh, float* rs) {
  constexpr int NI = LD / R;
  const float* __restrict__ nw = NORM ? nw_ : (const float*)0;
  const int grp = threadIdx.x / G, tg = threadIdx.x - grp * G;
  const int n0 = (blk * (MID_THREADS / G) + grp) * R;
  const int kb = (K + 127) >> 7;
  const char* wr[R];
#pragma unroll
  for (int r = 0; r < R; r++) {
    const int n = min(n0 + r, N - 1);  // rows past N repeat the last one; not written
    wr[r] = (const char*)W + (size_t)n * K * T::BYTES;
  }
  // A group's rows lie in one 128-row scale block (R divides 128, n0 is a
  // multiple of R; clamped rows repeat row N-1 >= n0): one scale per chunk.
  const float* sr = S ? S + (size_t)(min(n0, N - 1) >> 7) * kb : (const float*)0;
  const int C = n0 < N ? K / T::E : 0;  // idle groups past N load nothing
  float acc[R];
#pragma unroll
  for (int r = 0; r < R; r++) acc[r] = 0.0f;
  uint4 wv[NI][R];
  float sc[NI];
  auto load = [&](int c0) {
#pragma unroll
    for (int i = 0; i < NI; i++) {
      const int c = c0 + i * G;
#pragma unroll
      for (int r = 0; r < R; r++) wv[i][r] = c < C ? mid_ld16(wr[r] + (size_t)c * 16) : make_uint4(0u, 0u, 0u, 0u);
      sc[i] = c < C ? (sr ? __ldg(sr + ((c * T::E) >> 7)) : 1.0f) : 0.0f;
    }
  };
  // The first round's weights (the whole share at the decode shapes) go out
  // before the norm: they do not depend on x, so their round trip overlaps
  // the prologue's (gemv_group's prologue runs first and only asks the L2).
  if (NORM) load(tg);
  // With a norm weight nw: x is the raw row; each value is used as rmsnorm
  // writes it, nw[k]*(x[k]*r), as gemv_group's prologue does.
  const float r0 = nw ? mid_norm_scale(x, K, nthr, eps, nsh, rs) : 1.0f;
  for (int c0 = tg; c0 < C; c0 += G * NI) {
    if (!NORM || c0 != tg) load(c0);
#pragma unroll
    for (int i = 0; i < NI; i++) {
      const int c = c0 + i * G;
      if (c < C) {
        const float* xc = x + (size_t)c * T::E;
        const float* wc = nw ? nw + (size_t)c * T::E : (const float*)0;
        float p[R];
#pragma unroll
        for (int r = 0; r < R; r++) p[r] = 0.0f;
#pragma unroll
        for (int q = 0; q < 4; q++) {
          float xv[T::EW];
          mid_ldx<T::EW>(xc + q * T::EW, xv);
          if (wc) {
            float nv[T::EW];
            mid_ldx<T::EW>(wc + q * T::EW, nv);
#pragma unroll
            for (int e = 0; e < T::EW; e++) xv[e] = nv[e] * (xv[e] * r0);
          }
#pragma unroll
          for (int r = 0; r < R; r++) {
            float wf[T::EW];
            T::word(mid_word(wv[i][r], q), wf);
#pragma unroll
            for (int e = 0; e < T::EW; e++) p[r] = fmaf(wf[e], xv[e], p[r]);
          }
        }
#pragma unroll
        for (int r = 0; r < R; r++) acc[r] = fmaf(p[r], sc[i], acc[r]);
      }
    }
  }
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
#pragma unroll
  for (int r = 0; r < R; r++) acc[r] = warp_sum(acc[r]);
  if (lane == 0) {
#pragma unroll
    for (int r = 0; r < R; r++) part[warp][r] = acc[r];
  }
  __syncthreads();
  for (int t = tg; t < R; t += G) {
    const int wpg = G >> 5, w0i = grp * wpg;
    float v = 0.0f;
    for (int i = 0; i < wpg; i++) v += part[w0i + i][t];
    if (n0 + t < N) y[n0 + t] = v;
  }
}

template <int R>
__device__ __forceinline__ int mid_blocks(int N, int cfg) {
  const int G = cfg & 1023;
  return N > 0 ? ((N + R - 1) / R + MID_THREADS / G - 1) / (MID_THREADS / G) : 0;
}

// The blocks spread over the segments' rows, segment 0's first (as
// gemv_group_run).
template <int R, int LD, bool NORM>
__device__ __forceinline__ void gemv_mid_run(const float* __restrict__ x, int K, const float* __restrict__ nw,
                                             float eps, int nf, const void* w0, const float* s0,
                                             float* y0, int n0, int cfg0, const void* w1, const float* s1, float* y1,
                                             int n1, int cfg1, const void* w2, const float* s2, float* y2, int n2,
                                             int cfg2, const void* w3, const float* s3, float* y3, int n3,
                                             int cfg3) {
  __shared__ float part[MID_THREADS / 32][32];
  __shared__ float nsh[32];
  __shared__ float rs[1];
  int blk = blockIdx.x;
  const void* W = w0;
  const float* S = s0;
  float* y = y0;
  int N = n0, cfg = cfg0;
  int nb = mid_blocks<R>(n0, cfg0);
  if (blk >= nb) {
    blk -= nb;
    W = w1, S = s1, y = y1, N = n1, cfg = cfg1;
    nb = mid_blocks<R>(n1, cfg1);
    if (blk >= nb) {
      blk -= nb;
      W = w2, S = s2, y = y2, N = n2, cfg = cfg2;
      nb = mid_blocks<R>(n2, cfg2);
      if (blk >= nb) {
        blk -= nb;
        W = w3, S = s3, y = y3, N = n3, cfg = cfg3;
      }
    }
  }
  const int G = cfg & 1023, nthr = nf & 0xffff;
  if ((cfg >> 14) & 1) {
    gemv_mid_body<MBF16, R, LD, NORM>(W, S, y, N, G, blk, x, K, nw, eps, nthr, part, nsh, rs);
  } else {
    gemv_mid_body<MFP8, R, LD, NORM>(W, S, y, N, G, blk, x, K, nw, eps, nthr, part, nsh, rs);
  }
}

// The launchable variants, written out (NVRTC 11.8 crashes on
// macro-generated kernel definitions). ldx, M and the segments' ldy are
// gemv_group_*'s arguments, unused here (one row); nf's low 16 bits are the
// norm's virtual threads (normThreads(K)).
extern "C" __global__ void __launch_bounds__(MID_THREADS, 2)
    gemv_mid_group_r8_m1_d16(const float* __restrict__ x, int ldx, int K, int M, const float* __restrict__ nw,
                             float eps, int nf, const void* w0, const float* s0, float* y0, int n0, int ldy0,
                             int cfg0, const void* w1, const float* s1, float* y1, int n1, int ldy1, int cfg1,
                             const void* w2, const float* s2, float* y2, int n2, int ldy2, int cfg2, const void* w3,
                             const float* s3, float* y3, int n3, int ldy3, int cfg3) {
  PDL_WAIT();
  gemv_mid_run<8, 16, false>(x, K, nw, eps, nf, w0, s0, y0, n0, cfg0, w1, s1, y1, n1, cfg1, w2, s2, y2, n2, cfg2,
                            w3, s3, y3, n3, cfg3);
}

extern "C" __global__ void __launch_bounds__(MID_THREADS, 2)
    gemv_mid_group_r8_m1_d16n(const float* __restrict__ x, int ldx, int K, int M, const float* __restrict__ nw,
                             float eps, int nf, const void* w0, const float* s0, float* y0, int n0, int ldy0,
                             int cfg0, const void* w1, const float* s1, float* y1, int n1, int ldy1, int cfg1,
                             const void* w2, const float* s2, float* y2, int n2, int ldy2, int cfg2, const void* w3,
                             const float* s3, float* y3, int n3, int ldy3, int cfg3) {
  PDL_WAIT();
  gemv_mid_run<8, 16, true>(x, K, nw, eps, nf, w0, s0, y0, n0, cfg0, w1, s1, y1, n1, cfg1, w2, s2, y2, n2, cfg2,
                            w3, s3, y3, n3, cfg3);
}

extern "C" __global__ void __launch_bounds__(MID_THREADS, 2)
    gemv_mid_group_r4_m1_d16(const float* __restrict__ x, int ldx, int K, int M, const float* __restrict__ nw,
                             float eps, int nf, const void* w0, const float* s0, float* y0, int n0, int ldy0,
                             int cfg0, const void* w1, const float* s1, float* y1, int n1, int ldy1, int cfg1,
                             const void* w2, const float* s2, float* y2, int n2, int ldy2, int cfg2, const void* w3,
                             const float* s3, float* y3, int n3, int ldy3, int cfg3) {
  PDL_WAIT();
  gemv_mid_run<4, 16, false>(x, K, nw, eps, nf, w0, s0, y0, n0, cfg0, w1, s1, y1, n1, cfg1, w2, s2, y2, n2, cfg2,
                            w3, s3, y3, n3, cfg3);
}

extern "C" __global__ void __launch_bounds__(MID_THREADS, 2)
    gemv_mid_group_r4_m1_d16n(const float* __restrict__ x, int ldx, int K, int M, const float* __restrict__ nw,
                             float eps, int nf, const void* w0, const float* s0, float* y0, int n0, int ldy0,
                             int cfg0, const void* w1, const float* s1, float* y1, int n1, int ldy1, int cfg1,
                             const void* w2, const float* s2, float* y2, int n2, int ldy2, int cfg2, const void* w3,
                             const float* s3, float* y3, int n3, int ldy3, int cfg3) {
  PDL_WAIT();
  gemv_mid_run<4, 16, true>(x, K, nw, eps, nf, w0, s0, y0, n0, cfg0, w1, s1, y1, n1, cfg1, w2, s2, y2, n2, cfg2,
                            w3, s3, y3, n3, cfg3);
}

extern "C" __global__ void __launch_bounds__(MID_THREADS, 4)
    gemv_mid_group_r4_m1_o4(const float* __restrict__ x, int ldx, int K, int M, const float* __restrict__ nw,
                            float eps, int nf, const void* w0, const float* s0, float* y0, int n0, int ldy0,
                            int cfg0, const void* w1, const float* s1, float* y1, int n1, int ldy1, int cfg1,
                            const void* w2, const float* s2, float* y2, int n2, int ldy2, int cfg2, const void* w3,
                            const float* s3, float* y3, int n3, int ldy3, int cfg3) {
  PDL_WAIT();
  gemv_mid_run<4, 8, false>(x, K, nw, eps, nf, w0, s0, y0, n0, cfg0, w1, s1, y1, n1, cfg1, w2, s2, y2, n2, cfg2,
                            w3, s3, y3, n3, cfg3);
}

extern "C" __global__ void __launch_bounds__(MID_THREADS, 4)
    gemv_mid_group_r4_m1_o4n(const float* __restrict__ x, int ldx, int K, int M, const float* __restrict__ nw,
                            float eps, int nf, const void* w0, const float* s0, float* y0, int n0, int ldy0,
                            int cfg0, const void* w1, const float* s1, float* y1, int n1, int ldy1, int cfg1,
                            const void* w2, const float* s2, float* y2, int n2, int ldy2, int cfg2, const void* w3,
                            const float* s3, float* y3, int n3, int ldy3, int cfg3) {
  PDL_WAIT();
  gemv_mid_run<4, 8, true>(x, K, nw, eps, nf, w0, s0, y0, n0, cfg0, w1, s1, y1, n1, cfg1, w2, s2, y2, n2, cfg2,
                            w3, s3, y3, n3, cfg3);
}

extern "C" __global__ void __launch_bounds__(MID_THREADS, 4)
    gemv_mid_group_r2_m1_o4(const float* __restrict__ x, int ldx, int K, int M, const float* __restrict__ nw,
                            float eps, int nf, const void* w0, const float* s0, float* y0, int n0, int ldy0,
                            int cfg0, const void* w1, const float* s1, float* y1, int n1, int ldy1, int cfg1,
                            const void* w2, const float* s2, float* y2, int n2, int ldy2, int cfg2, const void* w3,
                            const float* s3, float* y3, int n3, int ldy3, int cfg3) {
  PDL_WAIT();
  gemv_mid_run<2, 8, false>(x, K, nw, eps, nf, w0, s0, y0, n0, cfg0, w1, s1, y1, n1, cfg1, w2, s2, y2, n2, cfg2,
                            w3, s3, y3, n3, cfg3);
}

extern "C" __global__ void __launch_bounds__(MID_THREADS, 4)
    gemv_mid_group_r2_m1_o4n(const float* __restrict__ x, int ldx, int K, int M, const float* __restrict__ nw,
                            float eps, int nf, const void* w0, const float* s0, float* y0, int n0, int ldy0,
                            int cfg0, const void* w1, const float* s1, float* y1, int n1, int ldy1, int cfg1,
                            const void* w2, const float* s2, float* y2, int n2, int ldy2, int cfg2, const void* w3,
                            const float* s3, float* y3, int n3, int ldy3, int cfg3) {
  PDL_WAIT();
  gemv_mid_run<2, 8, true>(x, K, nw, eps, nf, w0, s0, y0, n0, cfg0, w1, s1, y1, n1, cfg1, w2, s2, y2, n2, cfg2,
                            w3, s3, y3, n3, cfg3);
}
