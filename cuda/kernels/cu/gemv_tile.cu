// Tile GEMV: the decode GEMVs at the memory rate for 1..8 input rows, and the
// MoE projections for all routed slots (plus the shared expert) in one launch.
//
// y[m][n] = sum_k W[n][k]*S[n/128][k/128]*x[m][k] (+ resid[m][n]), m < M <= MM.
//
// A block of 256 threads holds 256/G groups of G threads (G = 32, 64, 128 or
// 256, chosen by K so every thread has whole 16-byte chunks to stream). A
// group owns R weight rows and its threads split K; each thread multiplies
// its chunk of all R rows with the same x chunk, held in registers, so x is
// read once per R rows (the wide kernel re-read x per row), and issues
// 8 streaming 16-byte loads (R rows x 8/R chunks) before it uses any. The
// group's partial sums meet through shared memory in a fixed warp order:
// results are bit-for-bit reproducible.
//
// Paired mode (W1 != 0, R >= 2): the group's first R/2 rows are gate rows of
// W0, the other R/2 the same rows of W1 (up), and the group writes
// silu(gate)*up, so gate, up and SwiGLU are one launch.
//
// Slots (blockIdx.y = j): j < slots is a routed expert slot, e = ids[j], W0 =
// T0[e] (W1 = T1[e] when paired), one input row x + (j/xdiv)*ldx; j >= slots
// is a dense matrix W0/W1 (the shared expert, or a plain GEMV with
// slots = 0) over M input rows starting at row xsh + (j-slots) (M must be
// 1 when there are routed slots). Output slot j starts at y + j*ldy*M.
//
// Needs K % T::E == 0, 16-byte aligned W rows, x and ldx % 4 == 0 (the
// launchers check and fall back).
//
// Split-K (SK, dense slots only): K is the rows' length and dense slot j
// takes its columns [j*KS, (j+1)*KS), KS = K / gridDim.y (x row j then
// holds those inputs, ldx = KS), so the slots' outputs are partial sums of
// one long-row GEMV (o_proj's one row on the routed down's short-row shape;
// kernels.GemvFP8SplitK). The row pointers and scale rows are the plain
// ones, so no register more is live in the loop.

// TILE_THREADS, the loads, the weight formats (TFP8, TBF16) and a chunk's
// one-row sums (TILE_CHUNK_M1): gemv_tile.cuh, shared with the mid module.

template <class T, int R, int MM, int LD = 8, bool SK = false>
__device__ __forceinline__ void gemv_tile_body(const void* const* __restrict__ T0, const float* const* __restrict__ TS0,
                                               const void* const* __restrict__ T1, const float* const* __restrict__ TS1,
                                               const int* __restrict__ ids, int slots, const void* W0,
                                               const float* S0, const void* W1, const float* S1,
                                               const float* __restrict__ x, int ldx, int xdiv, int xsh, float* y,
                                               int ldy, const float* resid, int N, int K, int M, int G,
                                               int fold) {
  constexpr int NI = LD / R;  // chunks per row per round: R*NI = LD loads in flight
  __shared__ float part[TILE_THREADS / 32][R * MM];
  const int j = blockIdx.y;
  const void* w0;
  const void* w1;
  const float* s0;
  const float* s1;
  int xr;
  if (j < slots) {
    const int e = ids[j];
    w0 = T0[e];
    s0 = TS0 ? TS0[e] : (const float*)0;
    w1 = T1 ? T1[e] : (const void*)0;
    s1 = TS1 ? TS1[e] : (const float*)0;
    xr = j / xdiv;
  } else {
    w0 = W0;
    s0 = S0;
    w1 = W1;
    s1 = S1;
    xr = xsh + (j - slots);
    if (SK) {
      const int ks = K / (int)gridDim.y;
      w0 = (const char*)W0 + (size_t)(j - slots) * ks * T::BYTES;
      s0 = S0 ? S0 + (size_t)(j - slots) * (ks >> 7) : (const float*)0;
    }
  }
  const bool pair = w1 != 0;
  const int rout = pair ? R / 2 : R;  // output rows per group
  const int grp = threadIdx.x / G, tg = threadIdx.x - grp * G;
  const int kb = (K + 127) >> 7;
  const float* xb = x + (size_t)xr * ldx;
  // Row tiles of this slot: one per block, or several in turn when the
  // launcher caps the grid (the slot's pointers then load once per block);
  // a row's arithmetic is the same either way.
  const int tiles = (((N + rout - 1) / rout) + TILE_THREADS / G - 1) / (TILE_THREADS / G);
  for (int bx = blockIdx.x; bx < tiles; bx += gridDim.x) {
  const int n0 = (bx * (TILE_THREADS / G) + grp) * rout;
  const char* wr[R];
#pragma unroll
  for (int r = 0; r < R; r++) {
    const bool second = pair && r >= rout;
    const int n = min(n0 + (second ? r - rout : r), N - 1);  // rows past N repeat the last one; not written
    const char* base = (const char*)(second ? w1 : w0);
    wr[r] = base + (size_t)n * K * T::BYTES;
  }
  // A group's rows n0..n0+rout-1 lie in one 128-row scale block (rout divides
  // 128 and n0 is a multiple of rout; clamped rows repeat row N-1 >= n0), so
  // one scale per chunk serves every gate (or plain) row, one every up row.
  const int nsc = min(n0, N - 1) >> 7;
  const float* sg = s0 ? s0 + (size_t)nsc * kb : (const float*)0;
  const float* su = pair && s1 ? s1 + (size_t)nsc * kb : (const float*)0;
  float acc[R][MM];
#pragma unroll
  for (int r = 0; r < R; r++)
#pragma unroll
    for (int m = 0; m < MM; m++) acc[r][m] = 0.0f;
  const int C = n0 < N ? (SK ? K / (int)gridDim.y : K) / T::E : 0;  // idle groups past N load nothing
  for (int c0 = tg; c0 < C; c0 += G * NI) {
    uint4 wv[NI][R];
    float scg[NI], scu[NI];
#pragma unroll
    for (int i = 0; i < NI; i++) {
      const int c = c0 + i * G;
#pragma unroll
      for (int r = 0; r < R; r++) wv[i][r] = c < C ? tile_ld16(wr[r] + (size_t)c * 16) : make_uint4(0u, 0u, 0u, 0u);
      scg[i] = c < C ? (sg ? __ldg(sg + ((c * T::E) >> 7)) : 1.0f) : 0.0f;
      scu[i] = c < C ? (su ? __ldg(su + ((c * T::E) >> 7)) : 1.0f) : 0.0f;
    }
#pragma unroll
    for (int i = 0; i < NI; i++) {
      const int c = c0 + i * G;
      if (c < C) {
        const float* xc = xb + (size_t)c * T::E;
        if (MM == 1) {
          // One row: sum the chunk, then scale it (one multiply per chunk).
          float p[R];
          TILE_CHUNK_M1(T, R, xc, (const float*)0, 1.0f, wv[i], p)
#pragma unroll
          for (int r = 0; r < R; r++) acc[r][0] = fmaf(p[r], (pair && r >= rout ? scu[i] : scg[i]), acc[r][0]);
        } else if (fold) {
          // Several rows: scale each weight once and feed it to every row,
          // so no per-chunk partials hold registers.
#pragma unroll
          for (int q = 0; q < 4; q++) {
            float xv[MM][T::EW];
#pragma unroll
            for (int m = 0; m < MM; m++) {
              if (m < M) {
                tile_ldx<T::EW>(xc + (size_t)m * ldx + q * T::EW, xv[m]);
              } else {
#pragma unroll
                for (int e = 0; e < T::EW; e++) xv[m][e] = 0.0f;
              }
            }
#pragma unroll
            for (int r = 0; r < R; r++) {
              float wf[T::EW];
              T::word(tile_word(wv[i][r], q), wf);
#pragma unroll
              for (int e = 0; e < T::EW; e++) wf[e] *= (pair && r >= rout ? scu[i] : scg[i]);
#pragma unroll
              for (int m = 0; m < MM; m++) {
                if (m < M) {
#pragma unroll
                  for (int e = 0; e < T::EW; e++) acc[r][m] = fmaf(wf[e], xv[m][e], acc[r][m]);
                }
              }
            }
          }
        } else {
          // Several rows, per-chunk partials scaled once per chunk (rule 1).
          float p[R][MM];
#pragma unroll
          for (int r = 0; r < R; r++)
#pragma unroll
            for (int m = 0; m < MM; m++) p[r][m] = 0.0f;
#pragma unroll
          for (int q = 0; q < 4; q++) {
            float xv[MM][T::EW];
#pragma unroll
            for (int m = 0; m < MM; m++) {
              if (m < M) {
                tile_ldx<T::EW>(xc + (size_t)m * ldx + q * T::EW, xv[m]);
              } else {
#pragma unroll
                for (int e = 0; e < T::EW; e++) xv[m][e] = 0.0f;
              }
            }
#pragma unroll
            for (int r = 0; r < R; r++) {
              float wf[T::EW];
              T::word(tile_word(wv[i][r], q), wf);
#pragma unroll
              for (int m = 0; m < MM; m++) {
                if (m < M) {
#pragma unroll
                  for (int e = 0; e < T::EW; e++) p[r][m] = fmaf(wf[e], xv[m][e], p[r][m]);
                }
              }
            }
          }
#pragma unroll
          for (int r = 0; r < R; r++)
#pragma unroll
            for (int m = 0; m < MM; m++) acc[r][m] = fmaf(p[r][m], (pair && r >= rout ? scu[i] : scg[i]), acc[r][m]);
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
  for (int t = tg; t < rout * M; t += G) {
    const int rr = t / M, m = t - rr * M;
    const int wpg = G >> 5, w0i = grp * wpg;
    float v = 0.0f;
    for (int i = 0; i < wpg; i++) v += part[w0i + i][rr * MM + m];
    if (pair) {
      float u = 0.0f;
      for (int i = 0; i < wpg; i++) u += part[w0i + i][(rr + rout) * MM + m];
      v = v / (1.0f + expf(-v)) * u;  // silu(gate) * up, as silu_mul
    }
    if (n0 + rr < N) {
      const size_t o = (size_t)j * ldy * M + (size_t)m * ldy + n0 + rr;
      y[o] = v + (resid ? resid[o] : 0.0f);
    }
  }
  if (bx + gridDim.x < tiles) __syncthreads();  // part is reused by the next tile
  }
}

// gemv_tile_body for one dense input row (MM 1, not paired, no routed slots)
// with group-strided row tiles: the tiles dealt out are the groups' (R
// rows), a block's groups gridDim.x tiles apart, every block the same trips
// (groups past N idle, so its barrier stays uniform); a grid of 2 blocks an
// SM then leaves each SM within one group tile of the mean where the
// blocks' 32-row tiles leave some SMs twice the rows of others (o_proj:
// cuda/kernels/NOTES.md "o_proj's tail"). A thread's chunks, their sums
// (TILE_CHUNK_M1, then the scale) and the group's reduction are
// gemv_tile_body's MM 1 path statement for statement, so the same floats
// bit for bit (TestKernelTilePlanBitwise); a body of its own keeps every
// other tile kernel's PTX as it was.
template <class T, int R, int LD>
__device__ __forceinline__ void gemv_tile_gs_body(const void* W0, const float* S0, const float* __restrict__ x, int ldx,
                                                  int xsh, float* y, const float* resid, int N, int K, int G) {
  constexpr int NI = LD / R;
  __shared__ float part[TILE_THREADS / 32][R];
  const int grp = threadIdx.x / G, tg = threadIdx.x - grp * G;
  const int ng = TILE_THREADS / G;
  const int kb = (K + 127) >> 7;
  const float* xb = x + (size_t)xsh * ldx;
  const int gtiles = (N + R - 1) / R;
  const int grid = (int)gridDim.x, b = (int)blockIdx.x;
  const int iters = (gtiles + grid * ng - 1) / (grid * ng);
  for (int it = 0; it < iters; it++) {
    const int n0 = ((it * ng + grp) * grid + b) * R;
    const char* wr[R];
#pragma unroll
    for (int r = 0; r < R; r++) wr[r] = (const char*)W0 + (size_t)min(n0 + r, N - 1) * K * T::BYTES;
    const float* sg = S0 ? S0 + (size_t)(min(n0, N - 1) >> 7) * kb : (const float*)0;
    float acc[R];
#pragma unroll
    for (int r = 0; r < R; r++) acc[r] = 0.0f;
    const int C = n0 < N ? K / T::E : 0;
    for (int c0 = tg; c0 < C; c0 += G * NI) {
      uint4 wv[NI][R];
      float scg[NI];
#pragma unroll
      for (int i = 0; i < NI; i++) {
        const int c = c0 + i * G;
#pragma unroll
        for (int r = 0; r < R; r++) wv[i][r] = c < C ? tile_ld16(wr[r] + (size_t)c * 16) : make_uint4(0u, 0u, 0u, 0u);
        scg[i] = c < C ? (sg ? __ldg(sg + ((c * T::E) >> 7)) : 1.0f) : 0.0f;
      }
#pragma unroll
      for (int i = 0; i < NI; i++) {
        const int c = c0 + i * G;
        if (c < C) {
          const float* xc = xb + (size_t)c * T::E;
          float p[R];
          TILE_CHUNK_M1(T, R, xc, (const float*)0, 1.0f, wv[i], p)
#pragma unroll
          for (int r = 0; r < R; r++) acc[r] = fmaf(p[r], scg[i], acc[r]);
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
      if (n0 + t < N) y[n0 + t] = v + (resid ? resid[n0 + t] : 0.0f);
    }
    if (it + 1 < iters) __syncthreads();  // part is reused by the next tile
  }
}

// The launchable variants, written out (NVRTC 11.8 crashes on macro-generated
// kernel definitions): fp8 for the shapes the rules pick (R*MM <= 32), bf16
// for 5..8 rows only (the engine runs bf16 GEMVs of up to 4 rows on the wide
// kernels or the tensor cores; the bf16 variants for 1, 2 and 4 rows and
// r8_m8 of both types, never launched, were removed in session 54).
extern "C" __global__ void __launch_bounds__(TILE_THREADS)
    gemv_tile_fp8_r1_m1(const void* const* __restrict__ T0, const float* const* __restrict__ TS0,
                            const void* const* __restrict__ T1, const float* const* __restrict__ TS1,
                            const int* __restrict__ ids, int slots, const void* W0, const float* S0, const void* W1,
                            const float* S1, const float* __restrict__ x, int ldx, int xdiv, int xsh, float* y,
                            int ldy, const float* resid, int N, int K, int M, int G, int fold) {
  PDL_WAIT();
  gemv_tile_body<TFP8, 1, 1>(T0, TS0, T1, TS1, ids, slots, W0, S0, W1, S1, x, ldx, xdiv, xsh, y, ldy, resid, N,
                                 K, M, G, fold);
}

extern "C" __global__ void __launch_bounds__(TILE_THREADS)
    gemv_tile_fp8_r2_m1(const void* const* __restrict__ T0, const float* const* __restrict__ TS0,
                            const void* const* __restrict__ T1, const float* const* __restrict__ TS1,
                            const int* __restrict__ ids, int slots, const void* W0, const float* S0, const void* W1,
                            const float* S1, const float* __restrict__ x, int ldx, int xdiv, int xsh, float* y,
                            int ldy, const float* resid, int N, int K, int M, int G, int fold) {
  PDL_WAIT();
  gemv_tile_body<TFP8, 2, 1>(T0, TS0, T1, TS1, ids, slots, W0, S0, W1, S1, x, ldx, xdiv, xsh, y, ldy, resid, N,
                                 K, M, G, fold);
}

extern "C" __global__ void __launch_bounds__(TILE_THREADS)
    gemv_tile_fp8_r4_m1(const void* const* __restrict__ T0, const float* const* __restrict__ TS0,
                            const void* const* __restrict__ T1, const float* const* __restrict__ TS1,
                            const int* __restrict__ ids, int slots, const void* W0, const float* S0, const void* W1,
                            const float* S1, const float* __restrict__ x, int ldx, int xdiv, int xsh, float* y,
                            int ldy, const float* resid, int N, int K, int M, int G, int fold) {
  PDL_WAIT();
  gemv_tile_body<TFP8, 4, 1>(T0, TS0, T1, TS1, ids, slots, W0, S0, W1, S1, x, ldx, xdiv, xsh, y, ldy, resid, N,
                                 K, M, G, fold);
}

extern "C" __global__ void __launch_bounds__(TILE_THREADS)
    gemv_tile_fp8_r8_m1(const void* const* __restrict__ T0, const float* const* __restrict__ TS0,
                            const void* const* __restrict__ T1, const float* const* __restrict__ TS1,
                            const int* __restrict__ ids, int slots, const void* W0, const float* S0, const void* W1,
                            const float* S1, const float* __restrict__ x, int ldx, int xdiv, int xsh, float* y,
                            int ldy, const float* resid, int N, int K, int M, int G, int fold) {
  PDL_WAIT();
  gemv_tile_body<TFP8, 8, 1>(T0, TS0, T1, TS1, ids, slots, W0, S0, W1, S1, x, ldx, xdiv, xsh, y, ldy, resid, N,
                                 K, M, G, fold);
}

extern "C" __global__ void __launch_bounds__(TILE_THREADS)
    gemv_tile_fp8_r1_m2(const void* const* __restrict__ T0, const float* const* __restrict__ TS0,
                            const void* const* __restrict__ T1, const float* const* __restrict__ TS1,
                            const int* __restrict__ ids, int slots, const void* W0, const float* S0, const void* W1,
                            const float* S1, const float* __restrict__ x, int ldx, int xdiv, int xsh, float* y,
                            int ldy, const float* resid, int N, int K, int M, int G, int fold) {
  PDL_WAIT();
  gemv_tile_body<TFP8, 1, 2>(T0, TS0, T1, TS1, ids, slots, W0, S0, W1, S1, x, ldx, xdiv, xsh, y, ldy, resid, N,
                                 K, M, G, fold);
}

extern "C" __global__ void __launch_bounds__(TILE_THREADS)
    gemv_tile_fp8_r2_m2(const void* const* __restrict__ T0, const float* const* __restrict__ TS0,
                            const void* const* __restrict__ T1, const float* const* __restrict__ TS1,
                            const int* __restrict__ ids, int slots, const void* W0, const float* S0, const void* W1,
                            const float* S1, const float* __restrict__ x, int ldx, int xdiv, int xsh, float* y,
                            int ldy, const float* resid, int N, int K, int M, int G, int fold) {
  PDL_WAIT();
  gemv_tile_body<TFP8, 2, 2>(T0, TS0, T1, TS1, ids, slots, W0, S0, W1, S1, x, ldx, xdiv, xsh, y, ldy, resid, N,
                                 K, M, G, fold);
}

extern "C" __global__ void __launch_bounds__(TILE_THREADS)
    gemv_tile_fp8_r4_m2(const void* const* __restrict__ T0, const float* const* __restrict__ TS0,
                            const void* const* __restrict__ T1, const float* const* __restrict__ TS1,
                            const int* __restrict__ ids, int slots, const void* W0, const float* S0, const void* W1,
                            const float* S1, const float* __restrict__ x, int ldx, int xdiv, int xsh, float* y,
                            int ldy, const float* resid, int N, int K, int M, int G, int fold) {
  PDL_WAIT();
  gemv_tile_body<TFP8, 4, 2>(T0, TS0, T1, TS1, ids, slots, W0, S0, W1, S1, x, ldx, xdiv, xsh, y, ldy, resid, N,
                                 K, M, G, fold);
}

extern "C" __global__ void __launch_bounds__(TILE_THREADS)
    gemv_tile_fp8_r8_m2(const void* const* __restrict__ T0, const float* const* __restrict__ TS0,
                            const void* const* __restrict__ T1, const float* const* __restrict__ TS1,
                            const int* __restrict__ ids, int slots, const void* W0, const float* S0, const void* W1,
                            const float* S1, const float* __restrict__ x, int ldx, int xdiv, int xsh, float* y,
                            int ldy, const float* resid, int N, int K, int M, int G, int fold) {
  PDL_WAIT();
  gemv_tile_body<TFP8, 8, 2>(T0, TS0, T1, TS1, ids, slots, W0, S0, W1, S1, x, ldx, xdiv, xsh, y, ldy, resid, N,
                                 K, M, G, fold);
}

extern "C" __global__ void __launch_bounds__(TILE_THREADS)
    gemv_tile_fp8_r1_m4(const void* const* __restrict__ T0, const float* const* __restrict__ TS0,
                            const void* const* __restrict__ T1, const float* const* __restrict__ TS1,
                            const int* __restrict__ ids, int slots, const void* W0, const float* S0, const void* W1,
                            const float* S1, const float* __restrict__ x, int ldx, int xdiv, int xsh, float* y,
                            int ldy, const float* resid, int N, int K, int M, int G, int fold) {
  PDL_WAIT();
  gemv_tile_body<TFP8, 1, 4>(T0, TS0, T1, TS1, ids, slots, W0, S0, W1, S1, x, ldx, xdiv, xsh, y, ldy, resid, N,
                                 K, M, G, fold);
}

extern "C" __global__ void __launch_bounds__(TILE_THREADS)
    gemv_tile_fp8_r2_m4(const void* const* __restrict__ T0, const float* const* __restrict__ TS0,
                            const void* const* __restrict__ T1, const float* const* __restrict__ TS1,
                            const int* __restrict__ ids, int slots, const void* W0, const float* S0, const void* W1,
                            const float* S1, const float* __restrict__ x, int ldx, int xdiv, int xsh, float* y,
                            int ldy, const float* resid, int N, int K, int M, int G, int fold) {
  PDL_WAIT();
  gemv_tile_body<TFP8, 2, 4>(T0, TS0, T1, TS1, ids, slots, W0, S0, W1, S1, x, ldx, xdiv, xsh, y, ldy, resid, N,
                                 K, M, G, fold);
}

extern "C" __global__ void __launch_bounds__(TILE_THREADS)
    gemv_tile_fp8_r4_m4(const void* const* __restrict__ T0, const float* const* __restrict__ TS0,
                            const void* const* __restrict__ T1, const float* const* __restrict__ TS1,
                            const int* __restrict__ ids, int slots, const void* W0, const float* S0, const void* W1,
                            const float* S1, const float* __restrict__ x, int ldx, int xdiv, int xsh, float* y,
                            int ldy, const float* resid, int N, int K, int M, int G, int fold) {
  PDL_WAIT();
  gemv_tile_body<TFP8, 4, 4>(T0, TS0, T1, TS1, ids, slots, W0, S0, W1, S1, x, ldx, xdiv, xsh, y, ldy, resid, N,
                                 K, M, G, fold);
}

extern "C" __global__ void __launch_bounds__(TILE_THREADS)
    gemv_tile_fp8_r8_m4(const void* const* __restrict__ T0, const float* const* __restrict__ TS0,
                            const void* const* __restrict__ T1, const float* const* __restrict__ TS1,
                            const int* __restrict__ ids, int slots, const void* W0, const float* S0, const void* W1,
                            const float* S1, const float* __restrict__ x, int ldx, int xdiv, int xsh, float* y,
                            int ldy, const float* resid, int N, int K, int M, int G, int fold) {
  PDL_WAIT();
  gemv_tile_body<TFP8, 8, 4>(T0, TS0, T1, TS1, ids, slots, W0, S0, W1, S1, x, ldx, xdiv, xsh, y, ldy, resid, N,
                                 K, M, G, fold);
}

extern "C" __global__ void __launch_bounds__(TILE_THREADS)
    gemv_tile_fp8_r1_m8(const void* const* __restrict__ T0, const float* const* __restrict__ TS0,
                            const void* const* __restrict__ T1, const float* const* __restrict__ TS1,
                            const int* __restrict__ ids, int slots, const void* W0, const float* S0, const void* W1,
                            const float* S1, const float* __restrict__ x, int ldx, int xdiv, int xsh, float* y,
                            int ldy, const float* resid, int N, int K, int M, int G, int fold) {
  PDL_WAIT();
  gemv_tile_body<TFP8, 1, 8>(T0, TS0, T1, TS1, ids, slots, W0, S0, W1, S1, x, ldx, xdiv, xsh, y, ldy, resid, N,
                                 K, M, G, fold);
}

extern "C" __global__ void __launch_bounds__(TILE_THREADS)
    gemv_tile_fp8_r2_m8(const void* const* __restrict__ T0, const float* const* __restrict__ TS0,
                            const void* const* __restrict__ T1, const float* const* __restrict__ TS1,
                            const int* __restrict__ ids, int slots, const void* W0, const float* S0, const void* W1,
                            const float* S1, const float* __restrict__ x, int ldx, int xdiv, int xsh, float* y,
                            int ldy, const float* resid, int N, int K, int M, int G, int fold) {
  PDL_WAIT();
  gemv_tile_body<TFP8, 2, 8>(T0, TS0, T1, TS1, ids, slots, W0, S0, W1, S1, x, ldx, xdiv, xsh, y, ldy, resid, N,
                                 K, M, G, fold);
}

extern "C" __global__ void __launch_bounds__(TILE_THREADS)
    gemv_tile_fp8_r4_m8(const void* const* __restrict__ T0, const float* const* __restrict__ TS0,
                            const void* const* __restrict__ T1, const float* const* __restrict__ TS1,
                            const int* __restrict__ ids, int slots, const void* W0, const float* S0, const void* W1,
                            const float* S1, const float* __restrict__ x, int ldx, int xdiv, int xsh, float* y,
                            int ldy, const float* resid, int N, int K, int M, int G, int fold) {
  PDL_WAIT();
  gemv_tile_body<TFP8, 4, 8>(T0, TS0, T1, TS1, ids, slots, W0, S0, W1, S1, x, ldx, xdiv, xsh, y, ldy, resid, N,
                                 K, M, G, fold);
}

extern "C" __global__ void __launch_bounds__(TILE_THREADS)
    gemv_tile_bf16_r1_m8(const void* const* __restrict__ T0, const float* const* __restrict__ TS0,
                            const void* const* __restrict__ T1, const float* const* __restrict__ TS1,
                            const int* __restrict__ ids, int slots, const void* W0, const float* S0, const void* W1,
                            const float* S1, const float* __restrict__ x, int ldx, int xdiv, int xsh, float* y,
                            int ldy, const float* resid, int N, int K, int M, int G, int fold) {
  PDL_WAIT();
  gemv_tile_body<TBF16, 1, 8>(T0, TS0, T1, TS1, ids, slots, W0, S0, W1, S1, x, ldx, xdiv, xsh, y, ldy, resid, N,
                                 K, M, G, fold);
}

extern "C" __global__ void __launch_bounds__(TILE_THREADS)
    gemv_tile_bf16_r2_m8(const void* const* __restrict__ T0, const float* const* __restrict__ TS0,
                            const void* const* __restrict__ T1, const float* const* __restrict__ TS1,
                            const int* __restrict__ ids, int slots, const void* W0, const float* S0, const void* W1,
                            const float* S1, const float* __restrict__ x, int ldx, int xdiv, int xsh, float* y,
                            int ldy, const float* resid, int N, int K, int M, int G, int fold) {
  PDL_WAIT();
  gemv_tile_body<TBF16, 2, 8>(T0, TS0, T1, TS1, ids, slots, W0, S0, W1, S1, x, ldx, xdiv, xsh, y, ldy, resid, N,
                                 K, M, G, fold);
}

extern "C" __global__ void __launch_bounds__(TILE_THREADS)
    gemv_tile_bf16_r4_m8(const void* const* __restrict__ T0, const float* const* __restrict__ TS0,
                            const void* const* __restrict__ T1, const float* const* __restrict__ TS1,
                            const int* __restrict__ ids, int slots, const void* W0, const float* S0, const void* W1,
                            const float* S1, const float* __restrict__ x, int ldx, int xdiv, int xsh, float* y,
                            int ldy, const float* resid, int N, int K, int M, int G, int fold) {
  PDL_WAIT();
  gemv_tile_body<TBF16, 4, 8>(T0, TS0, T1, TS1, ids, slots, W0, S0, W1, S1, x, ldx, xdiv, xsh, y, ldy, resid, N,
                                 K, M, G, fold);
}

// One input row, 16 loads in flight per thread (two rounds' worth of the
// variants above: the same per-thread chunk order, so the same sums bit for
// bit), at most 128 registers so two blocks share an SM.
extern "C" __global__ void __launch_bounds__(TILE_THREADS, 2)
    gemv_tile_fp8_r2_m1_d16(const void* const* __restrict__ T0, const float* const* __restrict__ TS0,
                            const void* const* __restrict__ T1, const float* const* __restrict__ TS1,
                            const int* __restrict__ ids, int slots, const void* W0, const float* S0, const void* W1,
                            const float* S1, const float* __restrict__ x, int ldx, int xdiv, int xsh, float* y,
                            int ldy, const float* resid, int N, int K, int M, int G, int fold) {
  PDL_WAIT();
  gemv_tile_body<TFP8, 2, 1, 16>(T0, TS0, T1, TS1, ids, slots, W0, S0, W1, S1, x, ldx, xdiv, xsh, y, ldy, resid, N,
                                 K, M, G, fold);
}

extern "C" __global__ void __launch_bounds__(TILE_THREADS, 2)
    gemv_tile_fp8_r4_m1_d16(const void* const* __restrict__ T0, const float* const* __restrict__ TS0,
                            const void* const* __restrict__ T1, const float* const* __restrict__ TS1,
                            const int* __restrict__ ids, int slots, const void* W0, const float* S0, const void* W1,
                            const float* S1, const float* __restrict__ x, int ldx, int xdiv, int xsh, float* y,
                            int ldy, const float* resid, int N, int K, int M, int G, int fold) {
  PDL_WAIT();
  gemv_tile_body<TFP8, 4, 1, 16>(T0, TS0, T1, TS1, ids, slots, W0, S0, W1, S1, x, ldx, xdiv, xsh, y, ldy, resid, N,
                                 K, M, G, fold);
}

extern "C" __global__ void __launch_bounds__(TILE_THREADS, 2)
    gemv_tile_fp8_r8_m1_d16(const void* const* __restrict__ T0, const float* const* __restrict__ TS0,
                            const void* const* __restrict__ T1, const float* const* __restrict__ TS1,
                            const int* __restrict__ ids, int slots, const void* W0, const float* S0, const void* W1,
                            const float* S1, const float* __restrict__ x, int ldx, int xdiv, int xsh, float* y,
                            int ldy, const float* resid, int N, int K, int M, int G, int fold) {
  PDL_WAIT();
  gemv_tile_body<TFP8, 8, 1, 16>(T0, TS0, T1, TS1, ids, slots, W0, S0, W1, S1, x, ldx, xdiv, xsh, y, ldy, resid, N,
                                 K, M, G, fold);
}

// gemv_tile_fp8_r*_m1_d16 with group-strided row tiles (gemv_tile_gs_body):
// one dense input row (the launcher passes slots 0, dense 1, M 1).
extern "C" __global__ void __launch_bounds__(TILE_THREADS, 2)
    gemv_tile_fp8_r4_m1_d16s(const void* const* __restrict__ T0, const float* const* __restrict__ TS0,
                            const void* const* __restrict__ T1, const float* const* __restrict__ TS1,
                            const int* __restrict__ ids, int slots, const void* W0, const float* S0, const void* W1,
                            const float* S1, const float* __restrict__ x, int ldx, int xdiv, int xsh, float* y,
                            int ldy, const float* resid, int N, int K, int M, int G, int fold) {
  PDL_WAIT();
  gemv_tile_gs_body<TFP8, 4, 16>(W0, S0, x, ldx, xsh, y, resid, N, K, G);
}

extern "C" __global__ void __launch_bounds__(TILE_THREADS, 2)
    gemv_tile_fp8_r8_m1_d16s(const void* const* __restrict__ T0, const float* const* __restrict__ TS0,
                            const void* const* __restrict__ T1, const float* const* __restrict__ TS1,
                            const int* __restrict__ ids, int slots, const void* W0, const float* S0, const void* W1,
                            const float* S1, const float* __restrict__ x, int ldx, int xdiv, int xsh, float* y,
                            int ldy, const float* resid, int N, int K, int M, int G, int fold) {
  PDL_WAIT();
  gemv_tile_gs_body<TFP8, 8, 16>(W0, S0, x, ldx, xsh, y, resid, N, K, G);
}

// One input row, 8 loads in flight, at most 64 registers so four blocks
// share an SM (same sums as the plain variants).
extern "C" __global__ void __launch_bounds__(TILE_THREADS, 4)
    gemv_tile_fp8_r4_m1_o4(const void* const* __restrict__ T0, const float* const* __restrict__ TS0,
                            const void* const* __restrict__ T1, const float* const* __restrict__ TS1,
                            const int* __restrict__ ids, int slots, const void* W0, const float* S0, const void* W1,
                            const float* S1, const float* __restrict__ x, int ldx, int xdiv, int xsh, float* y,
                            int ldy, const float* resid, int N, int K, int M, int G, int fold) {
  PDL_WAIT();
  gemv_tile_body<TFP8, 4, 1, 8>(T0, TS0, T1, TS1, ids, slots, W0, S0, W1, S1, x, ldx, xdiv, xsh, y, ldy, resid, N,
                                 K, M, G, fold);
}

extern "C" __global__ void __launch_bounds__(TILE_THREADS, 4)
    gemv_tile_fp8_r8_m1_o4(const void* const* __restrict__ T0, const float* const* __restrict__ TS0,
                            const void* const* __restrict__ T1, const float* const* __restrict__ TS1,
                            const int* __restrict__ ids, int slots, const void* W0, const float* S0, const void* W1,
                            const float* S1, const float* __restrict__ x, int ldx, int xdiv, int xsh, float* y,
                            int ldy, const float* resid, int N, int K, int M, int G, int fold) {
  PDL_WAIT();
  gemv_tile_body<TFP8, 8, 1, 8>(T0, TS0, T1, TS1, ids, slots, W0, S0, W1, S1, x, ldx, xdiv, xsh, y, ldy, resid, N,
                                 K, M, G, fold);
}

// One input row of fp8 rows K long as gridDim.y split-K slots of K /
// gridDim.y columns (SK above), on _o4's shape: slot j's partial sum into
// y + j*ldy.
extern "C" __global__ void __launch_bounds__(TILE_THREADS, 4)
    gemv_tile_fp8_r8_m1_o4k(const void* const* __restrict__ T0, const float* const* __restrict__ TS0,
                            const void* const* __restrict__ T1, const float* const* __restrict__ TS1,
                            const int* __restrict__ ids, int slots, const void* W0, const float* S0, const void* W1,
                            const float* S1, const float* __restrict__ x, int ldx, int xdiv, int xsh, float* y,
                            int ldy, const float* resid, int N, int K, int M, int G, int fold) {
  PDL_WAIT();
  gemv_tile_body<TFP8, 8, 1, 8, true>(T0, TS0, T1, TS1, ids, slots, W0, S0, W1, S1, x, ldx, xdiv, xsh, y, ldy, resid,
                                       N, K, M, G, fold);
}

// out[m][n] = (resid ? resid[m][n] : 0) + sum_j w[m][j] * y[m*k + j][n]: the
// weighted sum of each row's k routed slots, plus (resid) the shared expert's
// output or the residual stream; rows in blockIdx.y. Row m's arithmetic is
// moe_combine's.
extern "C" __global__ void moe_combine_slots(const float* __restrict__ y, const float* __restrict__ w, const float* resid,
                                            float* out, int k, int N) {
  PDL_WAIT();
  const int n = blockIdx.x * blockDim.x + threadIdx.x;
  const int m = blockIdx.y;
  if (n >= N) return;
  const float* ym = y + (size_t)m * k * N;
  const float* wm = w + (size_t)m * k;
  float s = 0.0f;
  for (int jj = 0; jj < k; jj++) s += wm[jj] * ym[(size_t)jj * N + n];
  const size_t o = (size_t)m * N + n;
  out[o] = (resid ? resid[o] : 0.0f) + s;
}
