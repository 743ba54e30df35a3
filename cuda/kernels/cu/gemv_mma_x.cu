// Tensor-core GEMV, second iteration (run on the H200 since session 18;
// the launchers' default where gemv_mma.go's mmaShape says): gemv_mma.cu's
// scheme with
// - the hi part's products and the mid + lo parts' in two accumulators
//   (two independent MMA chains; the tensor cores' truncating additions
//   onto the hi sum happen 4 times a chunk instead of 12: gemv_mma.cu
//   measured 9.75e-7 of max|ref| against ~2e-7 for the CUDA-core GEMVs),
// - _p: two register stages of U chunks, the next stage's weights in
//   flight while one is multiplied,
// - a grouped launch of up to 4 projections of one input (the attention
//   inputs q_a, kv_a, indexer wk, weights_proj; fp8 or bf16 each).
// The cp.async variants (_a: chunks in flight through shared memory), the
// other `_p` shapes and r2 u2 measured slower on the H200 and were removed
// in session 19; the code last lives in commit cb41896.
// The H200 run of gemv_mma.cu streamed fp8 weights at 55-65% of copy with
// the time flat in M: each warp issued its loads, waited, then multiplied,
// so the bytes in flight idled during the multiply; these variants keep
// loads in flight across it. Uses gemv_mma.cu's helpers (sorted before).

// MAP: input row m is x row xm[m] and its output y row ym[m] (the grouped
// experts of cu/moe_unique.cu); otherwise row m for both.
template <bool FP8, int RT, int U, int P = 0, bool MAP = false>
__device__ __forceinline__ void gemv_mmx_body(const void* __restrict__ W0, const float* __restrict__ S0,
                                              const void* __restrict__ W1, const float* __restrict__ S1,
                                              const float* __restrict__ x, int ldx, float* y, int ldy,
                                              const float* resid, int N, int K, int M, int bx,
                                              const int* xm = 0, const int* ym = 0) {
  constexpr int E = FP8 ? 16 : 8;  // values per 16-byte load
  constexpr int KS = E / 4;        // k-steps per chunk
  constexpr int ES = FP8 ? 1 : 2;  // bytes per weight
  __shared__ float red[GM_WARPS][RT][32][4];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const bool pair = W1 != 0;
  const int tout = pair ? RT / 2 : RT;  // output row tiles per block
  const int n0 = bx * tout * 16;
  const int KE = K / E;         // 16-byte pieces of a row
  const int C = (KE + 3) >> 2;  // chunks of 4 pieces (64 bytes of a row); the last may be short
  const int kb = (K + 127) >> 7;

  const char* wr[RT][2];
#pragma unroll
  for (int rt = 0; rt < RT; rt++) {
    const bool up = pair && rt >= tout;
    const int nb = n0 + (up ? rt - tout : rt) * 16;
    const char* base = (const char*)(up ? W1 : W0);
#pragma unroll
    for (int h = 0; h < 2; h++) {
      const int n = min(nb + g + 8 * h, N - 1);  // rows past N repeat the last one; not written
      wr[rt][h] = base + ((size_t)n * K + (size_t)t * E) * ES;
    }
  }
  // All rows of a block lie in one 128-row scale block (16*RT <= 128 and n0
  // is a multiple of 16*tout); gate and up rows have their own scales.
  const int nsc = min(n0, N - 1) >> 7;
  const float* sg = FP8 ? S0 + (size_t)nsc * kb : (const float*)0;
  const float* su = FP8 && pair ? S1 + (size_t)nsc * kb : (const float*)0;
  const float* xr = g < M ? x + (size_t)(MAP ? xm[g] : g) * ldx + t * E : (const float*)0;

  float acc[RT][4];
#pragma unroll
  for (int rt = 0; rt < RT; rt++)
#pragma unroll
    for (int i = 0; i < 4; i++) acc[rt][i] = 0.0f;

  // This thread's x values of chunk c (row g; zeros past M or K).
  auto ldx_chunk = [&](int c, float* xv) {
    if (xr && c < C && c * 4 + t < KE) {
      const float* p = xr + (size_t)c * 4 * E;
#pragma unroll
      for (int q = 0; q < E / 4; q++) {
        const float4 v = __ldg((const float4*)(p + 4 * q));
        xv[4 * q] = v.x;
        xv[4 * q + 1] = v.y;
        xv[4 * q + 2] = v.z;
        xv[4 * q + 3] = v.w;
      }
    } else {
#pragma unroll
      for (int q = 0; q < E; q++) xv[q] = 0.0f;
    }
  };

  // Chunk c's products for every row tile, promoted with the block scales.
  // The hi part's products and the mid and lo parts' accumulate apart: two
  // independent MMA chains, and the tensor cores' truncating additions
  // onto the hi sum happen 4 times a chunk, not 12.
  auto mul = [&](int c, const uint4 (*wv)[2], const float* xv, float scg, float scu) {
    float part[RT][4], pl[RT][4];
#pragma unroll
    for (int rt = 0; rt < RT; rt++)
#pragma unroll
      for (int i = 0; i < 4; i++) part[rt][i] = pl[rt][i] = 0.0f;
#pragma unroll
    for (int j = 0; j < KS; j++) {
      u32 b[3][2];  // k-step j of x split into parts, shared by the row tiles
      gm_split4(xv + 4 * j, b);
#pragma unroll
      for (int rt = 0; rt < RT; rt++) {
        u32 a0, a1, a2, a3;  // (row g, k lo), (g+8, lo), (g, hi), (g+8, hi)
        if (FP8) {
          gm_fp8x4_bf16(gm_word(wv[rt][0], j), a0, a2);
          gm_fp8x4_bf16(gm_word(wv[rt][1], j), a1, a3);
        } else {
          a0 = gm_word(wv[rt][0], 2 * j);
          a2 = gm_word(wv[rt][0], 2 * j + 1);
          a1 = gm_word(wv[rt][1], 2 * j);
          a3 = gm_word(wv[rt][1], 2 * j + 1);
        }
        gm_mma(pl[rt], a0, a1, a2, a3, b[2][0], b[2][1]);
        gm_mma(part[rt], a0, a1, a2, a3, b[0][0], b[0][1]);
        gm_mma(pl[rt], a0, a1, a2, a3, b[1][0], b[1][1]);
      }
    }
#pragma unroll
    for (int rt = 0; rt < RT; rt++) {
      const float sc = (pair && rt >= tout) ? scu : scg;
#pragma unroll
      for (int i = 0; i < 4; i++) acc[rt][i] = fmaf(part[rt][i] + pl[rt][i], sc, acc[rt][i]);
    }
  };
  // Weights of chunk c (zeros past K) and its block scales.
  auto ldw = [&](int c, uint4 (*wv)[2], float& scg, float& scu) {
#pragma unroll
    for (int rt = 0; rt < RT; rt++)
#pragma unroll
      for (int h = 0; h < 2; h++)
        wv[rt][h] = c * 4 + t < KE ? gm_ld16(wr[rt][h] + (size_t)c * 64) : make_uint4(0u, 0u, 0u, 0u);
    const int kc = (min(c, C - 1) * 4 * E) >> 7;
    scg = FP8 ? __ldg(sg + kc) : 1.0f;
    scu = FP8 && pair ? __ldg(su + kc) : 1.0f;
  };
  constexpr int STEP = GM_WARPS * U;

  // x of stage c0's chunks (first now, each next while one is
  // multiplied), then the chunks' products.
  auto run = [&](int c0, const uint4 (*const*wv)[2], const float* scg, const float* scu) {
    float xv[2][E];
    ldx_chunk(c0, xv[0]);
#pragma unroll
    for (int u = 0; u < U; u++) {
      const int c = c0 + u * GM_WARPS;
      if (c >= C) break;
      if (u + 1 < U) ldx_chunk(c + GM_WARPS, xv[(u + 1) & 1]);
      mul(c, wv[u], xv[u & 1], scg[u], scu[u]);
    }
  };
  if (P == 1) {
    // Two stages of U chunks' weights: the next stage's are in flight while
    // this one is multiplied.
    uint4 wv[2][U][RT][2];
    float scg[2][U], scu[2][U];
    auto ld = [&](int st, int c0) {
#pragma unroll
      for (int u = 0; u < U; u++) ldw(c0 + u * GM_WARPS, wv[st][u], scg[st][u], scu[st][u]);
    };
    const uint4 (*w0p[U])[2];
    const uint4 (*w1p[U])[2];
#pragma unroll
    for (int u = 0; u < U; u++) {
      w0p[u] = wv[0][u];
      w1p[u] = wv[1][u];
    }
    ld(0, warp);
    for (int c0 = warp; c0 < C; c0 += 2 * STEP) {
      ld(1, c0 + STEP);
      run(c0, w0p, scg[0], scu[0]);
      if (c0 + STEP >= C) break;
      ld(0, c0 + 2 * STEP);
      run(c0 + STEP, w1p, scg[1], scu[1]);
    }
  } else {
    for (int c0 = warp; c0 < C; c0 += STEP) {
      uint4 wv[U][RT][2];
      float scg[U], scu[U];
#pragma unroll
      for (int u = 0; u < U; u++) ldw(c0 + u * GM_WARPS, wv[u], scg[u], scu[u]);
      const uint4 (*wp[U])[2];
#pragma unroll
      for (int u = 0; u < U; u++) wp[u] = wv[u];
      run(c0, wp, scg, scu);
    }
  }

  // C fragment: acc[rt][0..1] rows g, columns (input rows) 2t, 2t+1;
  // acc[rt][2..3] rows g+8.
#pragma unroll
  for (int rt = 0; rt < RT; rt++)
#pragma unroll
    for (int i = 0; i < 4; i++) red[warp][rt][lane][i] = acc[rt][i];
  __syncthreads();
  for (int o = threadIdx.x; o < tout * 16 * M; o += GM_THREADS) {
    const int m = o % M, rr = o / M;  // rr: output row in the block
    const int rt = rr >> 4, r = rr & 15;
    const int ln = (r & 7) * 4 + (m >> 1), i = (r >> 3) * 2 + (m & 1);
    float v = 0.0f;
#pragma unroll
    for (int w = 0; w < GM_WARPS; w++) v += red[w][rt][ln][i];
    if (pair) {
      float uu = 0.0f;
#pragma unroll
      for (int w = 0; w < GM_WARPS; w++) uu += red[w][rt + tout][ln][i];
      v = v / (1.0f + expf(-v)) * uu;  // silu(gate) * up, as silu_mul
    }
    const int n = n0 + rr;
    if (n < N) {
      const size_t oi = (size_t)(MAP ? ym[m] : m) * ldy + n;
      y[oi] = v + (resid ? resid[oi] : 0.0f);
    }
  }
}

// grid ceil(N / (16*RT)) (paired: ceil(N / (8*RT))), 256 threads. The _p
// variant pipelines two stages of U chunks. fp8 only: kernels.mmaShape
// takes it for fp8 and the paired gate/up, never for bf16 (its bf16 twin
// was removed in session 54).
#define GEMV_MMX_FP8(RT, U, P, SUF)                                                                          \
  extern "C" __global__ void __launch_bounds__(GM_THREADS, 2) gemv_mmx_fp8_r##RT##_u##U##SUF(                \
      const u8* __restrict__ W0, const float* __restrict__ S0, const u8* __restrict__ W1,                    \
      const float* __restrict__ S1, const float* __restrict__ x, int ldx, float* y, int ldy,                 \
      const float* resid, int N, int K, int M) {                                                             \
    PDL_WAIT();                                                                                              \
    gemv_mmx_body<true, RT, U, P>(W0, S0, W1, S1, x, ldx, y, ldy, resid, N, K, M, blockIdx.x);               \
  }

GEMV_MMX_FP8(2, 1, 1, _p)

// Grouped: up to 4 projections of the same input rows (the attention
// inputs q_a, kv_a and the indexer's wk, weights_proj), fp8 or bf16 each,
// in one launch; blocks take 16 rows of one segment in segment order.
// Segment i: weights W, scales S (fp8), output Y (row stride ldy), N rows,
// bf16 flag.
#define GX_SEG(i) const void *W##i, const float *S##i, float *Y##i, int N##i, int ldy##i, int bf##i
#define GX_SEG_RUN(i)                                                                                     \
  if (b < (N##i + 15) / 16) {                                                                             \
    if (bf##i)                                                                                            \
      gemv_mmx_body<false, 1, U, P>(W##i, (const float*)0, (const void*)0, (const float*)0, x, ldx, Y##i, \
                                    ldy##i, (const float*)0, N##i, K, M, b);                              \
    else                                                                                                  \
      gemv_mmx_body<true, 1, U, P>(W##i, S##i, (const void*)0, (const float*)0, x, ldx, Y##i, ldy##i,    \
                                   (const float*)0, N##i, K, M, b);                                       \
    return;                                                                                               \
  }                                                                                                       \
  b -= (N##i + 15) / 16;

template <int U, int P = 0>
__device__ __forceinline__ void gemv_mmx_group_body(const float* __restrict__ x, int ldx, int K, int M, GX_SEG(0),
                                                    GX_SEG(1), GX_SEG(2), GX_SEG(3)) {
  int b = blockIdx.x;
  GX_SEG_RUN(0)
  GX_SEG_RUN(1)
  GX_SEG_RUN(2)
  GX_SEG_RUN(3)
}

// The group's variants (U chunks a stage from registers): u4 is the
// default (session 19: the fastest at every row count), u2 session 18's
// (TILERT_GPU_GEMV_MMA=u2). The `_a`, `_p` and p2 variants measured slower
// and were removed in session 19 (last in commit cb41896).
#define GEMV_MMX_GROUP(U, P, SUF)                                                                                  \
  extern "C" __global__ void __launch_bounds__(GM_THREADS, 2) gemv_mmx_group_##SUF(                                 \
      const float* __restrict__ x, int ldx, int K, int M, GX_SEG(0), GX_SEG(1), GX_SEG(2), GX_SEG(3)) {             \
    PDL_WAIT();                                                                                                    \
    gemv_mmx_group_body<U, P>(x, ldx, K, M, W0, S0, Y0, N0, ldy0, bf0, W1, S1, Y1, N1, ldy1, bf1, W2, S2, Y2, N2, \
                              ldy2, bf2, W3, S3, Y3, N3, ldy3, bf3);                                               \
  }

GEMV_MMX_GROUP(2, 0, u2)
GEMV_MMX_GROUP(4, 0, u4)
