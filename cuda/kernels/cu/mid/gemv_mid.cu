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
// kernels are gemv_group_body (gemv_tile_group.cu) for one input row, built
// from the same pieces (gemv_tile.cuh: group_load, TILE_CHUNK_M1,
// group_sumsq_fast, GROUP_SEGMENT), with LD loads a round (R rows x LD/R
// chunks):
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

// The loads, weight formats, a chunk's sums, the norm's sum of squares
// and the segment map are gemv_tile.cuh's (this module's source puts it
// after common.cuh: kernels_mid.go), the same text the default grouped
// kernels run. The block size is theirs (group_blocks, GROUP_SEGMENT).
#define MID_THREADS TILE_THREADS

// rmsnorm's r = rsqrt(ss/K + eps) of the row x[0..K), its sum of squares
// in rmsnorm's order (gemv_tile_group.cu's fastnorm prologue,
// group_sumsq_fast, then the virtual warps added in order). Every thread
// gets r.
__device__ __forceinline__ float mid_norm_scale(const float* __restrict__ x, int K, int nthr, float eps,
                                                float* nsh, float* rs) {
  const int nvw = nthr >> 5;
  group_sumsq_fast(x, K, nvw, nthr, threadIdx.x >> 5, threadIdx.x & 31, nsh);
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
  GROUP_ROWS(T, R)
  float acc[R];
#pragma unroll
  for (int r = 0; r < R; r++) acc[r] = 0.0f;
  uint4 wv[NI][R];
  float sc[NI];
  // The first round's weights (the whole share at the decode shapes) go out
  // before the norm: they do not depend on x, so their round trip overlaps
  // the prologue's (gemv_group's prologue runs first and only asks the L2).
  if (NORM) group_load<T, R, NI>(wr, sr, tg, G, C, wv, sc);
  // With a norm weight nw: x is the raw row; each value is used as rmsnorm
  // writes it, nw[k]*(x[k]*r), as gemv_group's prologue does.
  const float r0 = nw ? mid_norm_scale(x, K, nthr, eps, nsh, rs) : 1.0f;
  for (int c0 = tg; c0 < C; c0 += G * NI) {
    if (!NORM || c0 != tg) group_load<T, R, NI>(wr, sr, c0, G, C, wv, sc);
#pragma unroll
    for (int i = 0; i < NI; i++) {
      const int c = c0 + i * G;
      if (c < C) {
        const float* xc = x + (size_t)c * T::E;
        const float* wc = nw ? nw + (size_t)c * T::E : (const float*)0;
        float p[R];
        TILE_CHUNK_M1(T, R, xc, wc, r0, wv[i], p)
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

// The blocks spread over the segments' rows, segment 0's first (as
// gemv_group_run; no output strides: one row).
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
  const int ldy0 = 0, ldy1 = 0, ldy2 = 0, ldy3 = 0;  // one row: GROUP_SEGMENT's strides go unused
  GROUP_SEGMENT(R)
  const int G = cfg & 1023, nthr = nf & 0xffff;
  if ((cfg >> 14) & 1) {
    gemv_mid_body<TBF16, R, LD, NORM>(W, S, y, N, G, blk, x, K, nw, eps, nthr, part, nsh, rs);
  } else {
    gemv_mid_body<TFP8, R, LD, NORM>(W, S, y, N, G, blk, x, K, nw, eps, nthr, part, nsh, rs);
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
