// Grouped GEMV: several projections of one input x in one launch (the
// attention inputs of a layer: q_a, kv_a, indexer wk and weights_proj of the
// layer input; q_b and indexer wq_b of the normed q_a).
//
// y_s[m][n] = sum_k W_s[n][k]*S_s[n/128][k/128]*xn[m][k] for each segment s
// (up to 4: weights fp8 with 128x128 block scales or bf16, N_s rows, its own
// output and row stride), m < M <= MM, where xn = x, or with a norm weight
// nw, xn[m][k] = nw[k]*(x[m][k]*r_m) with r_m = rsqrt(mean(x[m]^2)+eps): the
// rmsnorm kernel's arithmetic, its sum of squares taken in its own order
// (nthr threads striding the row, warp butterflies, warps summed in order),
// so xn is bit-identical to rmsnorm's output and every block computes it
// itself (no launch, no grid-wide dependency).
//
// The blocks of the launch are spread over the segments' rows (segment 0's
// blocks first). A block runs one segment with that segment's group size G
// and rows per group R as gemv_tile_body does for a dense slot (same loads,
// same FMA order, same fixed-order combine). A thread's chunks and their
// order depend on G alone, so a segment's output is bit-for-bit what the
// tile GEMV with the same G writes, whatever R each of them takes. Its
// helpers (loads, formats, a chunk's sums, the segment map) are
// gemv_tile.cuh's, shared with the mid module.
//
// Needs K % 16 == 0 (fp8) / % 8 (bf16), 16-byte aligned W rows, x and
// ldx % 4 == 0 (the launcher checks).

#define GROUP_SEGS 4

// One segment's block: rows [n0, ...) of W, G threads per group, R rows per
// group, rr[m] the row scales of the norm (nw != 0). QW (one input row,
// the _qw kernel's q_a segment, ow set): each output row's square goes to
// qsq[grp * R + row] (0 past N) and the row is written times ow[n].
template <class T, int R, int MM, bool QW = false>
__device__ __forceinline__ void gemv_group_body(const void* W, const float* S, float* y, int ldy, int N, int G,
                                                int blk, const float* __restrict__ x, int ldx, int K, int M,
                                                const float* __restrict__ nw, float eps, int nthr, int fold,
                                                int fastnorm, float (*part)[32], float (*nsh)[32], float* rs,
                                                const float* __restrict__ ow = nullptr, float* qsq = nullptr) {
  constexpr int NI = 8 / R;
  GROUP_ROWS(T, R)
  uint4 wv[NI][R];
  float sc[NI];
  if (nw) {
    // The first round's weights stream into L2 while the prologue runs
    // (a prefetch holds no registers; a load would keep them live).
#pragma unroll
    for (int i = 0; i < NI; i++) {
      const int c = tg + i * G;
#pragma unroll
      for (int r = 0; r < R; r++)
        if (c < C) asm volatile("prefetch.global.L2 [%0];" ::"l"(wr[r] + (size_t)c * 16));
    }
    // rmsnorm's sum of squares for each input row, in its order: virtual
    // thread v of nthr sums x[v], x[v+nthr], ...; warps butterfly-sum; the
    // warp sums add up in warp order.
    const int nvw = nthr >> 5;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (fastnorm) {
      // The same sums, GROUP_NORM_REGS loads at a time (gemv_tile.cuh).
      for (int m = 0; m < M; m++) group_sumsq_fast(x + (size_t)m * ldx, K, nvw, nthr, warp, lane, nsh[m]);
    } else {
      for (int m = 0; m < M; m++) {
        const float* xr = x + (size_t)m * ldx;
        for (int vw = warp; vw < nvw; vw += TILE_THREADS / 32) {
          float ss = 0.0f;
          for (int i = vw * 32 + lane; i < K; i += nthr) {
            float v = xr[i];
            ss += v * v;
          }
          ss = warp_sum(ss);
          if (lane == 0) nsh[m][vw] = ss;
        }
      }
    }
    __syncthreads();
    if (threadIdx.x < M) {
      float ss = 0.0f;
      for (int i = 0; i < nvw; i++) ss += nsh[threadIdx.x][i];
      rs[threadIdx.x] = rsqrtf(ss / (float)K + eps);
    }
    __syncthreads();
  }
  float rr[MM];
#pragma unroll
  for (int m = 0; m < MM; m++) rr[m] = nw ? rs[m] : 1.0f;
  float acc[R][MM];
#pragma unroll
  for (int r = 0; r < R; r++)
#pragma unroll
    for (int m = 0; m < MM; m++) acc[r][m] = 0.0f;
  for (int c0 = tg; c0 < C; c0 += G * NI) {
    group_load<T, R, NI>(wr, sr, c0, G, C, wv, sc);
#pragma unroll
    for (int i = 0; i < NI; i++) {
      const int c = c0 + i * G;
      if (c < C) {
        const float* xc = x + (size_t)c * T::E;
        const float* wc = nw ? nw + (size_t)c * T::E : (const float*)0;
        if (MM == 1) {
          float p[R];
          TILE_CHUNK_M1(T, R, xc, wc, rr[0], wv[i], p)
#pragma unroll
          for (int r = 0; r < R; r++) acc[r][0] = fmaf(p[r], sc[i], acc[r][0]);
        } else {
          float p[R][MM];
#pragma unroll
          for (int r = 0; r < R; r++)
#pragma unroll
            for (int m = 0; m < MM; m++) p[r][m] = 0.0f;
#pragma unroll
          for (int q = 0; q < 4; q++) {
            float xv[MM][T::EW];
            float nv[T::EW];
            if (wc) tile_ldx<T::EW>(wc + q * T::EW, nv);
#pragma unroll
            for (int m = 0; m < MM; m++) {
              if (m < M) {
                tile_ldx<T::EW>(xc + (size_t)m * ldx + q * T::EW, xv[m]);
                if (wc) {
#pragma unroll
                  for (int e = 0; e < T::EW; e++) xv[m][e] = nv[e] * (xv[m][e] * rr[m]);
                }
              } else {
#pragma unroll
                for (int e = 0; e < T::EW; e++) xv[m][e] = 0.0f;
              }
            }
#pragma unroll
            for (int r = 0; r < R; r++) {
              float wf[T::EW];
              T::word(tile_word(wv[i][r], q), wf);
              if (fold) {
                // TileRule 2: scale each weight once, feed every row.
#pragma unroll
                for (int e = 0; e < T::EW; e++) wf[e] *= sc[i];
#pragma unroll
                for (int m = 0; m < MM; m++) {
                  if (m < M) {
#pragma unroll
                    for (int e = 0; e < T::EW; e++) acc[r][m] = fmaf(wf[e], xv[m][e], acc[r][m]);
                  }
                }
              } else {
#pragma unroll
                for (int m = 0; m < MM; m++) {
                  if (m < M) {
#pragma unroll
                    for (int e = 0; e < T::EW; e++) p[r][m] = fmaf(wf[e], xv[m][e], p[r][m]);
                  }
                }
              }
            }
          }
          if (!fold) {
#pragma unroll
            for (int r = 0; r < R; r++)
#pragma unroll
              for (int m = 0; m < MM; m++) acc[r][m] = fmaf(p[r][m], sc[i], acc[r][m]);
          }
        }
      }
    }
  }
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
#pragma unroll
  for (int r = 0; r < R; r++)
#pragma unroll
    for (int m = 0; m < MM; m++)
      if (m < M) acc[r][m] = warp_sum(acc[r][m]);
  if (lane == 0) {
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
      for (int m = 0; m < MM; m++) part[warp][r * MM + m] = acc[r][m];
  }
  __syncthreads();
  for (int t = tg; t < R * M; t += G) {
    const int rr2 = t / M, m = t - rr2 * M;
    const int wpg = G >> 5, w0i = grp * wpg;
    float v = 0.0f;
    for (int i = 0; i < wpg; i++) v += part[w0i + i][rr2 * MM + m];
    if constexpr (QW) {
      if (ow) {
        const bool in = n0 + rr2 < N;
        qsq[grp * R + rr2] = in ? v * v : 0.0f;
        if (in) v = v * ow[n0 + rr2];
      }
    }
    if (n0 + rr2 < N) y[(size_t)m * ldy + n0 + rr2] = v;
  }
}

// cfg_s = G | bf16 << 14; nf = nthr | fold << 16 (nthr: the rmsnorm launch's
// block size for K, a multiple of 32 up to 1024). Every segment of a launch
// takes R rows per group (its G is its own).
template <int R, int MM>
__device__ __forceinline__ void gemv_group_run(const float* __restrict__ x, int ldx, int K, int M,
                                               const float* __restrict__ nw, float eps, int nf, const void* w0,
                                               const float* s0, float* y0, int n0, int ldy0, int cfg0,
                                               const void* w1, const float* s1, float* y1, int n1, int ldy1,
                                               int cfg1, const void* w2, const float* s2, float* y2, int n2,
                                               int ldy2, int cfg2, const void* w3, const float* s3, float* y3,
                                               int n3, int ldy3, int cfg3) {
  __shared__ float part[TILE_THREADS / 32][32];
  __shared__ float nsh[MM][32];
  __shared__ float rs[MM];
  // This block's segment (segment 0's blocks first).
  GROUP_SEGMENT(R)
  const int G = cfg & 1023, fold = (nf >> 16) & 1, fastnorm = (nf >> 17) & 1, nthr = nf & 0xffff;
  if ((cfg >> 14) & 1) {
    gemv_group_body<TBF16, R, MM>(W, S, y, ldy, N, G, blk, x, ldx, K, M, nw, eps, nthr, fold, fastnorm, part, nsh, rs);
  } else {
    gemv_group_body<TFP8, R, MM>(W, S, y, ldy, N, G, blk, x, ldx, K, M, nw, eps, nthr, fold, fastnorm, part, nsh, rs);
  }
}

// The launchable variants (R rows per group, MM input rows at most: R is
// 8, 4 at 8 rows, as kernels.groupShape picks; R 2 and 4 at fewer rows,
// reached only by a test knob, were removed in session 54), written out as
// gemv_tile.cu's are.
extern "C" __global__ void __launch_bounds__(TILE_THREADS)
    gemv_group_r4_m8(const float* __restrict__ x, int ldx, int K, int M, const float* __restrict__ nw, float eps,
                      int nf, const void* w0, const float* s0, float* y0, int n0, int ldy0, int cfg0, const void* w1,
                      const float* s1, float* y1, int n1, int ldy1, int cfg1, const void* w2, const float* s2,
                      float* y2, int n2, int ldy2, int cfg2, const void* w3, const float* s3, float* y3, int n3,
                      int ldy3, int cfg3) {
  PDL_WAIT();
  gemv_group_run<4, 8>(x, ldx, K, M, nw, eps, nf, w0, s0, y0, n0, ldy0, cfg0, w1, s1, y1, n1, ldy1, cfg1, w2, s2,
                        y2, n2, ldy2, cfg2, w3, s3, y3, n3, ldy3, cfg3);
}

extern "C" __global__ void __launch_bounds__(TILE_THREADS)
    gemv_group_r8_m1(const float* __restrict__ x, int ldx, int K, int M, const float* __restrict__ nw, float eps,
                      int nf, const void* w0, const float* s0, float* y0, int n0, int ldy0, int cfg0, const void* w1,
                      const float* s1, float* y1, int n1, int ldy1, int cfg1, const void* w2, const float* s2,
                      float* y2, int n2, int ldy2, int cfg2, const void* w3, const float* s3, float* y3, int n3,
                      int ldy3, int cfg3) {
  PDL_WAIT();
  gemv_group_run<8, 1>(x, ldx, K, M, nw, eps, nf, w0, s0, y0, n0, ldy0, cfg0, w1, s1, y1, n1, ldy1, cfg1, w2, s2,
                        y2, n2, ldy2, cfg2, w3, s3, y3, n3, ldy3, cfg3);
}

// gemv_group_run (one input row) for gemv_group_r8_m1_qw: segment 0's rows
// are written times ow[n], and its block b stores the sum of its rows'
// squares (before ow, rows in order from 0.0f) at ss[b]: RMSNorm's weight
// and its sum of squares without the norm's launch; the consumers apply
// rsqrt(sum(ss) / N + eps) themselves. The other segments are
// gemv_group_run's. (A function of its own: a template flag on
// gemv_group_run renames its shared arrays in every grouped kernel's PTX.)
template <int R>
__device__ __forceinline__ void gemv_group_run_qw(const float* __restrict__ x, int ldx, int K, int M,
                                                  const float* __restrict__ nw, float eps, int nf, const void* w0,
                                                  const float* s0, float* y0, int n0, int ldy0, int cfg0,
                                                  const void* w1, const float* s1, float* y1, int n1, int ldy1,
                                                  int cfg1, const void* w2, const float* s2, float* y2, int n2,
                                                  int ldy2, int cfg2, const void* w3, const float* s3, float* y3,
                                                  int n3, int ldy3, int cfg3, const float* __restrict__ ow,
                                                  float* ss) {
  __shared__ float part[TILE_THREADS / 32][32];
  __shared__ float nsh[1][32];
  __shared__ float rs[1];
  __shared__ float qsq[(TILE_THREADS / 32) * R];
  const bool seg0 = (int)blockIdx.x < group_blocks<R>(n0, cfg0);
  // This block's segment (segment 0's blocks first).
  GROUP_SEGMENT(R)
  const int G = cfg & 1023, fold = (nf >> 16) & 1, fastnorm = (nf >> 17) & 1, nthr = nf & 0xffff;
  const float* o = seg0 ? ow : nullptr;
  if ((cfg >> 14) & 1) {
    gemv_group_body<TBF16, R, 1, true>(W, S, y, ldy, N, G, blk, x, ldx, K, M, nw, eps, nthr, fold, fastnorm, part, nsh,
                                       rs, o, qsq);
  } else {
    gemv_group_body<TFP8, R, 1, true>(W, S, y, ldy, N, G, blk, x, ldx, K, M, nw, eps, nthr, fold, fastnorm, part, nsh,
                                      rs, o, qsq);
  }
  if (o) {  // block-uniform
    __syncthreads();
    if (threadIdx.x == 0) {
      float s = 0.0f;
      for (int i = 0; i < (TILE_THREADS / G) * R; i++) s += qsq[i];
      ss[blk] = s;
    }
  }
}

// gemv_group_r8_m1 with segment 0 (q_a) written times ow (q_a_layernorm's
// weight) and its blocks' sums of squares at ss (GroupSeg.OutW / SumSq):
// the layer-input group of TILERT_GPU_QA_NORM=late, one input row.
extern "C" __global__ void __launch_bounds__(TILE_THREADS)
    gemv_group_r8_m1_qw(const float* __restrict__ x, int ldx, int K, int M, const float* __restrict__ nw, float eps,
                        int nf, const void* w0, const float* s0, float* y0, int n0, int ldy0, int cfg0, const void* w1,
                        const float* s1, float* y1, int n1, int ldy1, int cfg1, const void* w2, const float* s2,
                        float* y2, int n2, int ldy2, int cfg2, const void* w3, const float* s3, float* y3, int n3,
                        int ldy3, int cfg3, const float* __restrict__ ow, float* ss) {
  PDL_WAIT();
  gemv_group_run_qw<8>(x, ldx, K, M, nw, eps, nf, w0, s0, y0, n0, ldy0, cfg0, w1, s1, y1, n1, ldy1, cfg1, w2, s2, y2,
                       n2, ldy2, cfg2, w3, s3, y3, n3, ldy3, cfg3, ow, ss);
}

extern "C" __global__ void __launch_bounds__(TILE_THREADS)
    gemv_group_r8_m2(const float* __restrict__ x, int ldx, int K, int M, const float* __restrict__ nw, float eps,
                      int nf, const void* w0, const float* s0, float* y0, int n0, int ldy0, int cfg0, const void* w1,
                      const float* s1, float* y1, int n1, int ldy1, int cfg1, const void* w2, const float* s2,
                      float* y2, int n2, int ldy2, int cfg2, const void* w3, const float* s3, float* y3, int n3,
                      int ldy3, int cfg3) {
  PDL_WAIT();
  gemv_group_run<8, 2>(x, ldx, K, M, nw, eps, nf, w0, s0, y0, n0, ldy0, cfg0, w1, s1, y1, n1, ldy1, cfg1, w2, s2,
                        y2, n2, ldy2, cfg2, w3, s3, y3, n3, ldy3, cfg3);
}

extern "C" __global__ void __launch_bounds__(TILE_THREADS)
    gemv_group_r8_m4(const float* __restrict__ x, int ldx, int K, int M, const float* __restrict__ nw, float eps,
                      int nf, const void* w0, const float* s0, float* y0, int n0, int ldy0, int cfg0, const void* w1,
                      const float* s1, float* y1, int n1, int ldy1, int cfg1, const void* w2, const float* s2,
                      float* y2, int n2, int ldy2, int cfg2, const void* w3, const float* s3, float* y3, int n3,
                      int ldy3, int cfg3) {
  PDL_WAIT();
  gemv_group_run<8, 4>(x, ldx, K, M, nw, eps, nf, w0, s0, y0, n0, ldy0, cfg0, w1, s1, y1, n1, ldy1, cfg1, w2, s2,
                        y2, n2, ldy2, cfg2, w3, s3, y3, n3, ldy3, cfg3);
}

