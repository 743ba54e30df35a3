// TILERT_GPU_NORM_FUSE (issue 10): kernels that take a layer's RMSNorm off
// its own launch.
//
// gemv_group_sn_r{R}_m{MM}: gemv_group_r{R}_m{MM} (gemv_tile_group.cu) whose
// norm prologue stages each input row in shared memory with one round of
// cp.async (gg_staged_sumsq) instead of walking it with a few loads at a
// time (8 L2 round trips a warp at K = 7168): the same sums in the same
// order, the same normalised x (w*(x*r), formed in the main loop as there),
// so every output is bit for bit gemv_group_r{R}_m{MM}'s with the norm, and
// so rmsnorm's then the tile GEMV's. The engine runs the layer input's
// grouped launch (q_a, kv_a, indexer wk, weights_proj) on the raw residual
// with the layer's input norm here, so the closing add_rmsnorm of the layer
// before is gone (its residual add rides in moe_combine_slots_res).
//
// moe_combine_slots_res: moe_combine_slots (gemv_tile.cu) whose sum is added
// into the residual stream in place: x[m][n] += (resid ? resid[m][n] : 0) +
// sum_j w[m][j] * y[m*k+j][n]. The combined value is moe_combine_slots' (same
// expressions, same order) and x + it is add_rmsnorm's x += b: x is bit for
// bit what moe_combine_slots then add_rmsnorm leave there. Each element is
// read and written by one thread.

template <int R, int MM>
__device__ __forceinline__ void gemv_group_run_sn(const float* __restrict__ x, int ldx, int K, int M,
                                                  const float* __restrict__ nw, float eps, int nf, const void* w0,
                                                  const float* s0, float* y0, int n0, int ldy0, int cfg0,
                                                  const void* w1, const float* s1, float* y1, int n1, int ldy1,
                                                  int cfg1, const void* w2, const float* s2, float* y2, int n2,
                                                  int ldy2, int cfg2, const void* w3, const float* s3, float* y3,
                                                  int n3, int ldy3, int cfg3) {
  __shared__ float part[TILE_THREADS / 32][32];
  __shared__ float nsh[MM][32];
  __shared__ float rs[MM];
  __shared__ __align__(16) float xs[GROUP_SN_MAXK];
  // This block's segment (segment 0's blocks first), as gemv_group_run.
  GROUP_SEGMENT(R)
  const int G = cfg & 1023, fold = (nf >> 16) & 1, fastnorm = (nf >> 17) & 1, nthr = nf & 0xffff;
  if ((cfg >> 14) & 1) {
    gemv_group_body<TBF16, R, MM, true>(W, S, y, ldy, N, G, blk, x, ldx, K, M, nw, eps, nthr, fold, fastnorm, part,
                                        nsh, rs, xs);
  } else {
    gemv_group_body<TFP8, R, MM, true>(W, S, y, ldy, N, G, blk, x, ldx, K, M, nw, eps, nthr, fold, fastnorm, part,
                                       nsh, rs, xs);
  }
}

extern "C" __global__ void __launch_bounds__(TILE_THREADS)
    gemv_group_sn_r2_m1(const float* __restrict__ x, int ldx, int K, int M, const float* __restrict__ nw, float eps,
                        int nf, const void* w0, const float* s0, float* y0, int n0, int ldy0, int cfg0, const void* w1,
                        const float* s1, float* y1, int n1, int ldy1, int cfg1, const void* w2, const float* s2,
                        float* y2, int n2, int ldy2, int cfg2, const void* w3, const float* s3, float* y3, int n3,
                        int ldy3, int cfg3) {
  PDL_WAIT();
  gemv_group_run_sn<2, 1>(x, ldx, K, M, nw, eps, nf, w0, s0, y0, n0, ldy0, cfg0, w1, s1, y1, n1, ldy1, cfg1, w2, s2,
                          y2, n2, ldy2, cfg2, w3, s3, y3, n3, ldy3, cfg3);
}

extern "C" __global__ void __launch_bounds__(TILE_THREADS)
    gemv_group_sn_r2_m2(const float* __restrict__ x, int ldx, int K, int M, const float* __restrict__ nw, float eps,
                        int nf, const void* w0, const float* s0, float* y0, int n0, int ldy0, int cfg0, const void* w1,
                        const float* s1, float* y1, int n1, int ldy1, int cfg1, const void* w2, const float* s2,
                        float* y2, int n2, int ldy2, int cfg2, const void* w3, const float* s3, float* y3, int n3,
                        int ldy3, int cfg3) {
  PDL_WAIT();
  gemv_group_run_sn<2, 2>(x, ldx, K, M, nw, eps, nf, w0, s0, y0, n0, ldy0, cfg0, w1, s1, y1, n1, ldy1, cfg1, w2, s2,
                          y2, n2, ldy2, cfg2, w3, s3, y3, n3, ldy3, cfg3);
}

extern "C" __global__ void __launch_bounds__(TILE_THREADS)
    gemv_group_sn_r2_m4(const float* __restrict__ x, int ldx, int K, int M, const float* __restrict__ nw, float eps,
                        int nf, const void* w0, const float* s0, float* y0, int n0, int ldy0, int cfg0, const void* w1,
                        const float* s1, float* y1, int n1, int ldy1, int cfg1, const void* w2, const float* s2,
                        float* y2, int n2, int ldy2, int cfg2, const void* w3, const float* s3, float* y3, int n3,
                        int ldy3, int cfg3) {
  PDL_WAIT();
  gemv_group_run_sn<2, 4>(x, ldx, K, M, nw, eps, nf, w0, s0, y0, n0, ldy0, cfg0, w1, s1, y1, n1, ldy1, cfg1, w2, s2,
                          y2, n2, ldy2, cfg2, w3, s3, y3, n3, ldy3, cfg3);
}

extern "C" __global__ void __launch_bounds__(TILE_THREADS)
    gemv_group_sn_r4_m1(const float* __restrict__ x, int ldx, int K, int M, const float* __restrict__ nw, float eps,
                        int nf, const void* w0, const float* s0, float* y0, int n0, int ldy0, int cfg0, const void* w1,
                        const float* s1, float* y1, int n1, int ldy1, int cfg1, const void* w2, const float* s2,
                        float* y2, int n2, int ldy2, int cfg2, const void* w3, const float* s3, float* y3, int n3,
                        int ldy3, int cfg3) {
  PDL_WAIT();
  gemv_group_run_sn<4, 1>(x, ldx, K, M, nw, eps, nf, w0, s0, y0, n0, ldy0, cfg0, w1, s1, y1, n1, ldy1, cfg1, w2, s2,
                          y2, n2, ldy2, cfg2, w3, s3, y3, n3, ldy3, cfg3);
}

extern "C" __global__ void __launch_bounds__(TILE_THREADS)
    gemv_group_sn_r4_m2(const float* __restrict__ x, int ldx, int K, int M, const float* __restrict__ nw, float eps,
                        int nf, const void* w0, const float* s0, float* y0, int n0, int ldy0, int cfg0, const void* w1,
                        const float* s1, float* y1, int n1, int ldy1, int cfg1, const void* w2, const float* s2,
                        float* y2, int n2, int ldy2, int cfg2, const void* w3, const float* s3, float* y3, int n3,
                        int ldy3, int cfg3) {
  PDL_WAIT();
  gemv_group_run_sn<4, 2>(x, ldx, K, M, nw, eps, nf, w0, s0, y0, n0, ldy0, cfg0, w1, s1, y1, n1, ldy1, cfg1, w2, s2,
                          y2, n2, ldy2, cfg2, w3, s3, y3, n3, ldy3, cfg3);
}

extern "C" __global__ void __launch_bounds__(TILE_THREADS)
    gemv_group_sn_r4_m4(const float* __restrict__ x, int ldx, int K, int M, const float* __restrict__ nw, float eps,
                        int nf, const void* w0, const float* s0, float* y0, int n0, int ldy0, int cfg0, const void* w1,
                        const float* s1, float* y1, int n1, int ldy1, int cfg1, const void* w2, const float* s2,
                        float* y2, int n2, int ldy2, int cfg2, const void* w3, const float* s3, float* y3, int n3,
                        int ldy3, int cfg3) {
  PDL_WAIT();
  gemv_group_run_sn<4, 4>(x, ldx, K, M, nw, eps, nf, w0, s0, y0, n0, ldy0, cfg0, w1, s1, y1, n1, ldy1, cfg1, w2, s2,
                          y2, n2, ldy2, cfg2, w3, s3, y3, n3, ldy3, cfg3);
}

extern "C" __global__ void __launch_bounds__(TILE_THREADS)
    gemv_group_sn_r8_m1(const float* __restrict__ x, int ldx, int K, int M, const float* __restrict__ nw, float eps,
                        int nf, const void* w0, const float* s0, float* y0, int n0, int ldy0, int cfg0, const void* w1,
                        const float* s1, float* y1, int n1, int ldy1, int cfg1, const void* w2, const float* s2,
                        float* y2, int n2, int ldy2, int cfg2, const void* w3, const float* s3, float* y3, int n3,
                        int ldy3, int cfg3) {
  PDL_WAIT();
  gemv_group_run_sn<8, 1>(x, ldx, K, M, nw, eps, nf, w0, s0, y0, n0, ldy0, cfg0, w1, s1, y1, n1, ldy1, cfg1, w2, s2,
                          y2, n2, ldy2, cfg2, w3, s3, y3, n3, ldy3, cfg3);
}

extern "C" __global__ void __launch_bounds__(TILE_THREADS)
    gemv_group_sn_r8_m2(const float* __restrict__ x, int ldx, int K, int M, const float* __restrict__ nw, float eps,
                        int nf, const void* w0, const float* s0, float* y0, int n0, int ldy0, int cfg0, const void* w1,
                        const float* s1, float* y1, int n1, int ldy1, int cfg1, const void* w2, const float* s2,
                        float* y2, int n2, int ldy2, int cfg2, const void* w3, const float* s3, float* y3, int n3,
                        int ldy3, int cfg3) {
  PDL_WAIT();
  gemv_group_run_sn<8, 2>(x, ldx, K, M, nw, eps, nf, w0, s0, y0, n0, ldy0, cfg0, w1, s1, y1, n1, ldy1, cfg1, w2, s2,
                          y2, n2, ldy2, cfg2, w3, s3, y3, n3, ldy3, cfg3);
}

extern "C" __global__ void __launch_bounds__(TILE_THREADS)
    gemv_group_sn_r8_m4(const float* __restrict__ x, int ldx, int K, int M, const float* __restrict__ nw, float eps,
                        int nf, const void* w0, const float* s0, float* y0, int n0, int ldy0, int cfg0, const void* w1,
                        const float* s1, float* y1, int n1, int ldy1, int cfg1, const void* w2, const float* s2,
                        float* y2, int n2, int ldy2, int cfg2, const void* w3, const float* s3, float* y3, int n3,
                        int ldy3, int cfg3) {
  PDL_WAIT();
  gemv_group_run_sn<8, 4>(x, ldx, K, M, nw, eps, nf, w0, s0, y0, n0, ldy0, cfg0, w1, s1, y1, n1, ldy1, cfg1, w2, s2,
                          y2, n2, ldy2, cfg2, w3, s3, y3, n3, ldy3, cfg3);
}

extern "C" __global__ void moe_combine_slots_res(const float* __restrict__ y, const float* __restrict__ w,
                                                const float* resid, float* x, int k, int N) {
  PDL_WAIT();
  const int n = blockIdx.x * blockDim.x + threadIdx.x;
  const int m = blockIdx.y;
  if (n >= N) return;
  const float* ym = y + (size_t)m * k * N;
  const float* wm = w + (size_t)m * k;
  float s = 0.0f;
  for (int jj = 0; jj < k; jj++) s += wm[jj] * ym[(size_t)jj * N + n];
  const size_t o = (size_t)m * N + n;
  const float b = (resid ? resid[o] : 0.0f) + s;
  x[o] = x[o] + b;
}

// gemv_bf16_wide_norm_r{R}: rmsnorm of x (M <= GEMV_MAXM rows of K, weight
// nw) and the bf16 GEMV of the normed rows (the MoE router) in one launch,
// the normed rows also written to h for the launches after it (the
// experts). Every block stages each row in shared memory and takes
// rmsnorm's sums there (gg_staged_sumsq), so r_m is rmsnorm's; block b
// writes its share of h (nw[k]*(x[m][k]*r_m), rmsnorm's expression); the
// GEMV is gemv_bf16_wide_r{R}'s body (gemv_wide_rows<WBF16, R>, copied
// below) with each x value replaced by that same product: y is bit for bit
// rmsnorm then gemv_bf16_wide_r{R}.
template <int R>
__device__ __forceinline__ void wide_norm_rows(const void* __restrict__ W, const float* __restrict__ x,
                                               const float* __restrict__ nw, const float* rs, float* y, int N, int K,
                                               int M, int ldx, int ldy, int n0) {
  typedef WBF16 T;
  constexpr int TPR = 256 / R;
  constexpr int WPR = TPR / 32;
  __shared__ float part[8][GEMV_MAXM];
  const int t = threadIdx.x;
  const int r = t / TPR, tr = t % TPR;
  const int n = min(n0 + r, N - 1);  // rows past N repeat the last one; not written
  const char* wr = (const char*)W + (size_t)n * K * T::BYTES;
  const int C = K / T::E;
  float rr[GEMV_MAXM];
#pragma unroll
  for (int m = 0; m < GEMV_MAXM; m++) rr[m] = m < M ? rs[m] : 0.0f;
  float acc[GEMV_MAXM];
#pragma unroll
  for (int m = 0; m < GEMV_MAXM; m++) acc[m] = 0.0f;
  for (int c0 = tr; c0 < C; c0 += TPR * GEMV_WIDE_U) {
    uint4 wv[GEMV_WIDE_U];
    float sc[GEMV_WIDE_U];
#pragma unroll
    for (int u = 0; u < GEMV_WIDE_U; u++) {
      const int c = c0 + u * TPR;
      if (c < C) {
        wv[u] = ldg_stream16(wr + (size_t)c * 16);
        sc[u] = 1.0f;
      } else {
        wv[u] = make_uint4(0u, 0u, 0u, 0u);
        sc[u] = 0.0f;
      }
    }
#pragma unroll
    for (int u = 0; u < GEMV_WIDE_U; u++) {
      const int c = c0 + u * TPR;
      if (c < C) {
        float wf[T::E];
        T::dec(wv[u], wf);
        const float4* gp = (const float4*)(nw + (size_t)c * T::E);
#pragma unroll
        for (int m = 0; m < GEMV_MAXM; m++) {
          if (m < M) {
            const float4* xp = (const float4*)(x + (size_t)m * ldx + (size_t)c * T::E);
            float p = 0.0f;
#pragma unroll
            for (int q = 0; q < T::E / 4; q++) {
              const float4 v = __ldg(xp + q);
              const float4 g = __ldg(gp + q);
              const float h0 = g.x * (v.x * rr[m]), h1 = g.y * (v.y * rr[m]);
              const float h2 = g.z * (v.z * rr[m]), h3 = g.w * (v.w * rr[m]);
              p += wf[4 * q] * h0;
              p += wf[4 * q + 1] * h1;
              p += wf[4 * q + 2] * h2;
              p += wf[4 * q + 3] * h3;
            }
            acc[m] += p * sc[u];
          }
        }
      }
    }
  }
#pragma unroll
  for (int m = 0; m < GEMV_MAXM; m++) acc[m] = warp_sum(acc[m]);
  const int w = t >> 5;
  if ((t & 31) == 0) {
#pragma unroll
    for (int m = 0; m < GEMV_MAXM; m++) part[w][m] = acc[m];
  }
  __syncthreads();
  if (t < R * M) {
    const int r2 = t / M, m = t - r2 * M;
    float v = 0.0f;
#pragma unroll
    for (int i = 0; i < WPR; i++) v += part[r2 * WPR + i][m];
    if (n0 + r2 < N) {
      const size_t o = (size_t)m * ldy + n0 + r2;
      y[o] = v + 0.0f;
    }
  }
}

template <int R>
__device__ __forceinline__ void gemv_bf16_wide_norm_run(const void* __restrict__ W, const float* __restrict__ x,
                                                        const float* __restrict__ nw, float eps, float* y, float* h,
                                                        int N, int K, int M, int ldx, int ldy, int ldh, int nthr) {
  __shared__ float nsh[GEMV_MAXM][32];
  __shared__ float rs[GEMV_MAXM];
  __shared__ __align__(16) float xs[GROUP_SN_MAXK];
  const int nvw = nthr >> 5, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  gg_staged_sumsq(x, ldx, K, M, nvw, nthr, warp, lane, nsh, xs);
  if (threadIdx.x < M) {
    float ss = 0.0f;
    for (int i = 0; i < nvw; i++) ss += nsh[threadIdx.x][i];
    rs[threadIdx.x] = rsqrtf(ss / (float)K + eps);
  }
  __syncthreads();
  // This block's share of the normed rows.
  const int per = (K + gridDim.x - 1) / gridDim.x;
  const int k0 = blockIdx.x * per, k1 = min(K, k0 + per);
  for (int m = 0; m < M; m++) {
    const float r = rs[m];
    for (int k = k0 + threadIdx.x; k < k1; k += blockDim.x) h[(size_t)m * ldh + k] = nw[k] * (x[(size_t)m * ldx + k] * r);
  }
  wide_norm_rows<R>(W, x, nw, rs, y, N, K, M, ldx, ldy, blockIdx.x * R);
}

extern "C" __global__ void __launch_bounds__(256)
    gemv_bf16_wide_norm_r1(const void* __restrict__ W, const float* __restrict__ x, const float* __restrict__ nw,
                           float eps, float* y, float* h, int N, int K, int M, int ldx, int ldy, int ldh, int nthr) {
  PDL_WAIT();
  gemv_bf16_wide_norm_run<1>(W, x, nw, eps, y, h, N, K, M, ldx, ldy, ldh, nthr);
}

extern "C" __global__ void __launch_bounds__(256)
    gemv_bf16_wide_norm_r2(const void* __restrict__ W, const float* __restrict__ x, const float* __restrict__ nw,
                           float eps, float* y, float* h, int N, int K, int M, int ldx, int ldy, int ldh, int nthr) {
  PDL_WAIT();
  gemv_bf16_wide_norm_run<2>(W, x, nw, eps, y, h, N, K, M, ldx, ldy, ldh, nthr);
}

extern "C" __global__ void __launch_bounds__(256)
    gemv_bf16_wide_norm_r4(const void* __restrict__ W, const float* __restrict__ x, const float* __restrict__ nw,
                           float eps, float* y, float* h, int N, int K, int M, int ldx, int ldy, int ldh, int nthr) {
  PDL_WAIT();
  gemv_bf16_wide_norm_run<4>(W, x, nw, eps, y, h, N, K, M, ldx, ldy, ldh, nthr);
}

extern "C" __global__ void __launch_bounds__(256)
    gemv_bf16_wide_norm_r8(const void* __restrict__ W, const float* __restrict__ x, const float* __restrict__ nw,
                           float eps, float* y, float* h, int N, int K, int M, int ldx, int ldy, int ldh, int nthr) {
  PDL_WAIT();
  gemv_bf16_wide_norm_run<8>(W, x, nw, eps, y, h, N, K, M, ldx, ldy, ldh, nthr);
}
