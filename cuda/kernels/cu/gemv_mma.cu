// Tensor-core GEMV for a few input rows (M = 1..8: 4 decode slots, an MTP
// verify step): y[m][n] = sum_k W[n][k]*S[n/128][k/128]*x[m][k] (+ resid),
// W fp8 e4m3 with 128x128 block scales or bf16 (no scales), x float32.
//
// The CUDA-core tile GEMV (gemv_tile.cu) spends M FMAs per weight, so past
// two rows it is issue-bound, not memory-bound. Here each weight is
// converted once to bf16 (exact for e4m3 and bf16) and the M rows ride in
// the N dimension of mma.sync m16n8k16: y^T = W x^T with 16 weight rows as
// the MMA's M. x is split into three bf16 parts (hi, mid truncated, lo
// rounded: all 24 bits of a float32), one n-tile per part with the input
// rows as its 8 columns, all three accumulated into one MMA accumulator,
// so every product is float32's (as cu/gemm_tc.cu does for prefill). The
// partial of each 64-wide (fp8) or 32-wide (bf16) K chunk is promoted into
// a float32 total with the block scale (the tensor cores' accumulation
// truncates over long K).
//
// The K order is permuted (W and x alike): thread (g = lane/4, t = lane%4)
// streams 16 bytes of weight rows g and g+8 at byte 16t of the quad's
// 64-byte chunk and the matching 16 (fp8) or 8 (bf16) values of x row g,
// so every operand is a plain 16-byte load; a k-step takes 4 consecutive
// values per thread.
//
// Block: 8 warps split K chunks round-robin over 16*RT weight rows (RT row
// tiles share each chunk's x fragments); U chunks of loads in flight per
// warp; partial sums meet in shared memory in a fixed warp order, so
// results are bit-for-bit reproducible. Paired (W1 != 0): tiles 0..RT/2-1
// are gate rows of W0, the rest the same rows of W1; the output is
// silu(gate)*up.
//
// Needs K % E == 0 (E values per 16 bytes: 16 for fp8, 8 for bf16; a short
// last chunk loads zeros), 16-byte aligned W rows and x rows (ldx % 4 ==
// 0); the launcher checks.

#define GM_THREADS 256
#define GM_WARPS 8

__device__ __forceinline__ uint4 gm_ld16(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

__device__ __forceinline__ void gm_mma(float* c, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ u32 gm_word(uint4 v, int q) {
  return q == 0 ? v.x : q == 1 ? v.y : q == 2 ? v.z : v.w;
}

// Two floats' high halves as a bf16 pair (lo in the low half): truncation,
// exact for values that are bf16 already (e4m3 widened, truncated parts).
__device__ __forceinline__ u32 gm_pack_hi(float lo, float hi) {
  return __byte_perm(__float_as_uint(lo), __float_as_uint(hi), 0x7632);
}

__device__ __forceinline__ float gm_trunc(float v) { return __uint_as_float(__float_as_uint(v) & 0xffff0000u); }

// Two floats rounded to nearest even as a bf16 pair (lo in the low half).
__device__ __forceinline__ u32 gm_pack_rn(float lo, float hi) {
  u32 d;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
  return d;
}

// Four e4m3 bytes as two bf16 pairs: (w0, w1) and (w2, w3).
__device__ __forceinline__ void gm_fp8x4_bf16(u32 w, u32& p01, u32& p23) {
  float f[4];
  fp8x4_to_f32(w, f);
  p01 = gm_pack_hi(f[0], f[1]);
  p23 = gm_pack_hi(f[2], f[3]);
}

// x values v[0..3] of one k-step as the three parts' B fragments: b[s][0]
// holds values 0, 1 and b[s][1] values 2, 3 of part s.
__device__ __forceinline__ void gm_split4(const float* v, u32 (*b)[2]) {
  float h[4], m[4], l[4];
#pragma unroll
  for (int i = 0; i < 4; i++) {
    h[i] = gm_trunc(v[i]);
    const float r = v[i] - h[i];
    m[i] = gm_trunc(r);
    l[i] = r - m[i];
  }
  b[0][0] = gm_pack_hi(h[0], h[1]);
  b[0][1] = gm_pack_hi(h[2], h[3]);
  b[1][0] = gm_pack_hi(m[0], m[1]);
  b[1][1] = gm_pack_hi(m[2], m[3]);
  b[2][0] = gm_pack_rn(l[0], l[1]);
  b[2][1] = gm_pack_rn(l[2], l[3]);
}

template <bool FP8, int RT, int U>
__device__ __forceinline__ void gemv_mma_body(const void* __restrict__ W0, const float* __restrict__ S0,
                                              const void* __restrict__ W1, const float* __restrict__ S1,
                                              const float* __restrict__ x, int ldx, float* y, int ldy,
                                              const float* resid, int N, int K, int M) {
  constexpr int E = FP8 ? 16 : 8;  // values per 16-byte load
  constexpr int KS = E / 4;        // k-steps per chunk
  constexpr int ES = FP8 ? 1 : 2;  // bytes per weight
  __shared__ float red[GM_WARPS][RT][32][4];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const bool pair = W1 != 0;
  const int tout = pair ? RT / 2 : RT;  // output row tiles per block
  const int n0 = blockIdx.x * tout * 16;
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
  const float* xr = g < M ? x + (size_t)g * ldx + t * E : (const float*)0;

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

  for (int c0 = warp; c0 < C; c0 += GM_WARPS * U) {
    uint4 wv[U][RT][2];
#pragma unroll
    for (int u = 0; u < U; u++) {
      const int c = c0 + u * GM_WARPS;
#pragma unroll
      for (int rt = 0; rt < RT; rt++)
#pragma unroll
        for (int h = 0; h < 2; h++)
          wv[u][rt][h] = c * 4 + t < KE ? gm_ld16(wr[rt][h] + (size_t)c * 64) : make_uint4(0u, 0u, 0u, 0u);
    }
    float scg[U], scu[U];  // the chunks' block scales (gate or plain rows, up rows)
#pragma unroll
    for (int u = 0; u < U; u++) {
      const int c = min(c0 + u * GM_WARPS, C - 1);
      const int kc = (c * 4 * E) >> 7;
      scg[u] = FP8 ? __ldg(sg + kc) : 1.0f;
      scu[u] = FP8 && pair ? __ldg(su + kc) : 1.0f;
    }
    // x of the first chunk now (its L2 round trip overlaps the weights'),
    // of each next chunk while this one is multiplied.
    float xv[2][E];
    ldx_chunk(c0, xv[0]);
#pragma unroll
    for (int u = 0; u < U; u++) {
      const int c = c0 + u * GM_WARPS;
      if (c >= C) break;
      if (u + 1 < U) ldx_chunk(c + GM_WARPS, xv[(u + 1) & 1]);
      float part[RT][4];
#pragma unroll
      for (int rt = 0; rt < RT; rt++)
#pragma unroll
        for (int i = 0; i < 4; i++) part[rt][i] = 0.0f;
#pragma unroll
      for (int j = 0; j < KS; j++) {
        u32 b[3][2];  // k-step j of x split into parts, shared by the row tiles
        gm_split4(xv[u & 1] + 4 * j, b);
#pragma unroll
        for (int rt = 0; rt < RT; rt++) {
          u32 a0, a1, a2, a3;  // (row g, k lo), (g+8, lo), (g, hi), (g+8, hi)
          if (FP8) {
            gm_fp8x4_bf16(gm_word(wv[u][rt][0], j), a0, a2);
            gm_fp8x4_bf16(gm_word(wv[u][rt][1], j), a1, a3);
          } else {
            a0 = gm_word(wv[u][rt][0], 2 * j);
            a2 = gm_word(wv[u][rt][0], 2 * j + 1);
            a1 = gm_word(wv[u][rt][1], 2 * j);
            a3 = gm_word(wv[u][rt][1], 2 * j + 1);
          }
#pragma unroll
          for (int s = 0; s < 3; s++) gm_mma(part[rt], a0, a1, a2, a3, b[s][0], b[s][1]);
        }
      }
#pragma unroll
      for (int rt = 0; rt < RT; rt++) {
        const float sc = (pair && rt >= tout) ? scu[u] : scg[u];
#pragma unroll
        for (int i = 0; i < 4; i++) acc[rt][i] = fmaf(part[rt][i], sc, acc[rt][i]);
      }
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
      const size_t oi = (size_t)m * ldy + n;
      y[oi] = v + (resid ? resid[oi] : 0.0f);
    }
  }
}

// grid ceil(N / (16*RT)) (paired: ceil(N / (8*RT))), 256 threads.
#define GEMV_MMA_FP8(RT, U)                                                                                  \
  extern "C" __global__ void __launch_bounds__(GM_THREADS, 2) gemv_mma_fp8_r##RT##_u##U(                    \
      const u8* __restrict__ W0, const float* __restrict__ S0, const u8* __restrict__ W1,                    \
      const float* __restrict__ S1, const float* __restrict__ x, int ldx, float* y, int ldy,                 \
      const float* resid, int N, int K, int M) {                                                             \
    PDL_WAIT();                                                                                              \
    gemv_mma_body<true, RT, U>(W0, S0, W1, S1, x, ldx, y, ldy, resid, N, K, M);                              \
  }
#define GEMV_MMA_BF16(RT, U)                                                                                 \
  extern "C" __global__ void __launch_bounds__(GM_THREADS, 2) gemv_mma_bf16_r##RT##_u##U(                   \
      const u16* __restrict__ W0, const u16* __restrict__ W1, const float* __restrict__ x, int ldx, float* y, \
      int ldy, const float* resid, int N, int K, int M) {                                                    \
    PDL_WAIT();                                                                                              \
    gemv_mma_body<false, RT, U>(W0, (const float*)0, W1, (const float*)0, x, ldx, y, ldy, resid, N, K, M);   \
  }

// The shapes kernels.mmaShape picks (r2 u2 only for fp8: TILERT_GPU_GEMV_MMA=1's
// long rows). r1 u2 and r2 u4 (fp8 and bf16) and bf16 r2 u2, which no
// launcher picked, were removed in session 54. (One macro level: the PDL
// test expands kernel-defining macros once.)
GEMV_MMA_FP8(1, 4)
GEMV_MMA_BF16(1, 4)
GEMV_MMA_FP8(2, 1)
GEMV_MMA_BF16(2, 1)
GEMV_MMA_FP8(2, 2)
GEMV_MMA_FP8(4, 1)
GEMV_MMA_BF16(4, 1)

