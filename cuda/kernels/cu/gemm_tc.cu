// Tensor-core GEMM for many rows (local prefill): y[m][n] = sum_k W[n][k] *
// S[n/128][k/128] * x[m][k], W fp8 e4m3 with DeepSeek's 128x128 block scales
// or bf16 (S absent), x and y float32 row-major.
//
// mma.sync m16n8k16 bf16 -> f32. Every e4m3 (and bf16) weight is exactly a
// bf16, so the weights lose nothing; x is split into GT_SPLIT bf16 parts
// (hi + mid + lo holds all 24 bits of a float32) and each part is multiplied
// against the same weight fragment, so the product is the float32 GEMV's up
// to summation order, not a bf16 GEMM's. SPLIT 1 (serving-mode prefill
// only, TILERT_GPU_GEMM_SPLITS=1) rounds x to bf16 once, as a bf16 GEMM; the
// fp8 GEMMs then normally take gemm_p1.cu instead (these _s1 kernels stay
// for bf16 weights and K % 16 != 0). Partial sums over each 32-wide K
// tile are scaled into a float32 total (the block scale never touches a
// bf16), as DeepSeek's FP8 GEMM promotes its partials.
//
// Block tile 64 rows x 128 outputs (one scale row when N is 128-aligned)
// x 32 K, 8 warps as 2 x 4, each warp 32 x 32 (2 x 4 mma tiles). The next
// K tile is loaded into registers while the current one is multiplied.
// Tails in M, N and K are zero-filled; nothing past M or N is written.
//
// The experts variant runs one launch over every routed expert of a MoE
// layer: tile t covers rows [start, start+count) of the (expert-sorted)
// pairs, all of expert e; input row i is x[xrows[start+i]] (the token the
// pair came from), output row y[start+i].

#define GT_BM 64
#define GT_BN 128
#define GT_BK 32
#define GT_LD 40  // shared row stride in bf16 (80 bytes: ldmatrix rows hit distinct banks)

__device__ __forceinline__ u32 gt_smem_addr(const void* p) {
  return (u32)__cvta_generic_to_shared(p);
}

__device__ __forceinline__ void gt_ldmatrix_x4(u32 addr, u32& r0, u32& r1, u32& r2, u32& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
}

__device__ __forceinline__ void gt_mma(float* c, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Truncation is exact here: each part is the float minus the parts before it,
// so the residual carries what truncation dropped.
__device__ __forceinline__ u16 gt_bf16_trunc(float f) { return (u16)(__float_as_uint(f) >> 16); }

template <bool FP8, int SPLIT>
__device__ __forceinline__ void gemm_tc_tile(const void* __restrict__ W, const float* __restrict__ S,
                                             const float* __restrict__ x, int ldx, const int* __restrict__ xrows,
                                             int start, int rows, float* __restrict__ y, int ldy, int n0, int N,
                                             int K, bool vec) {
  __shared__ __align__(16) u16 As[SPLIT][GT_BM * GT_LD];
  __shared__ __align__(16) u16 Bs[GT_BN * GT_LD];
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int wm = warp >> 2, wn = warp & 3;

  // Loader roles: x row tid/4, 8 floats at (tid%4)*8; W row tid/2, 16 weights at (tid%2)*16.
  const int xr = tid >> 2, xk = (tid & 3) * 8;
  const int wr = tid >> 1, wk = (tid & 1) * 16;
  const float* xp = 0;
  if (xr < rows) xp = x + (size_t)(xrows ? xrows[start + xr] : start + xr) * ldx;
  const int wn_row = n0 + wr;
  const int ES = FP8 ? 1 : 2;  // bytes per weight
  const u8* wp = wn_row < N ? (const u8*)W + (size_t)wn_row * K * ES : (const u8*)0;
  const int KB = (K + 127) >> 7;
  const float* srow = FP8 ? S + (size_t)(n0 >> 7) * KB : (const float*)0;

  float xv[8];
  u32 wv[8];  // 16 weights: fp8 in wv[0..3], bf16 in wv[0..7]

  auto load = [&](int k0) {
    const int kx = k0 + xk;
    if (xp && vec && kx + 8 <= K) {
      float4 a = *(const float4*)(xp + kx);
      float4 b = *(const float4*)(xp + kx + 4);
      xv[0] = a.x; xv[1] = a.y; xv[2] = a.z; xv[3] = a.w;
      xv[4] = b.x; xv[5] = b.y; xv[6] = b.z; xv[7] = b.w;
    } else {
#pragma unroll
      for (int i = 0; i < 8; i++) xv[i] = (xp && kx + i < K) ? xp[kx + i] : 0.0f;
    }
    const int kw = k0 + wk;
    if (wp && vec && kw + 16 <= K) {
      const uint4* q = (const uint4*)(wp + (size_t)kw * ES);
      uint4 a = __ldg(q);
      wv[0] = a.x; wv[1] = a.y; wv[2] = a.z; wv[3] = a.w;
      if (!FP8) {
        uint4 b = __ldg(q + 1);
        wv[4] = b.x; wv[5] = b.y; wv[6] = b.z; wv[7] = b.w;
      }
    } else {
#pragma unroll
      for (int i = 0; i < 8; i++) wv[i] = 0u;
      if (wp) {
        for (int i = 0; i < 16; i++) {
          if (kw + i < K) {
            u32 v = FP8 ? (u32)wp[kw + i] : (u32)((const u16*)wp)[kw + i];
            const int sh = FP8 ? 8 * (i & 3) : 16 * (i & 1);
            wv[FP8 ? (i >> 2) : (i >> 1)] |= v << sh;
          }
        }
      }
    }
  };

  auto store = [&]() {
    u16 p[SPLIT][8];
#pragma unroll
    for (int i = 0; i < 8; i++) {
      float r = xv[i];
#pragma unroll
      for (int s = 0; s < SPLIT; s++) {
        // The last part rounds; the ones before truncate (exact remainders).
        const u16 h = (s + 1 < SPLIT) ? gt_bf16_trunc(r) : f32_to_bf16(r);
        p[s][i] = h;
        r -= bf16_to_f32(h);
      }
    }
#pragma unroll
    for (int s = 0; s < SPLIT; s++) {
      uint4 v;
      v.x = (u32)p[s][0] | ((u32)p[s][1] << 16);
      v.y = (u32)p[s][2] | ((u32)p[s][3] << 16);
      v.z = (u32)p[s][4] | ((u32)p[s][5] << 16);
      v.w = (u32)p[s][6] | ((u32)p[s][7] << 16);
      *(uint4*)&As[s][xr * GT_LD + xk] = v;
    }
    uint4 b0, b1;
    if (FP8) {
      u32 o[8];
#pragma unroll
      for (int q = 0; q < 4; q++) {
        float f[4];
        fp8x4_to_f32(wv[q], f);
        // e4m3 values are exact in bf16: truncation loses nothing.
        o[2 * q] = (u32)gt_bf16_trunc(f[0]) | ((u32)gt_bf16_trunc(f[1]) << 16);
        o[2 * q + 1] = (u32)gt_bf16_trunc(f[2]) | ((u32)gt_bf16_trunc(f[3]) << 16);
      }
      b0 = make_uint4(o[0], o[1], o[2], o[3]);
      b1 = make_uint4(o[4], o[5], o[6], o[7]);
    } else {
      b0 = make_uint4(wv[0], wv[1], wv[2], wv[3]);
      b1 = make_uint4(wv[4], wv[5], wv[6], wv[7]);
    }
    *(uint4*)&Bs[wr * GT_LD + wk] = b0;
    *(uint4*)&Bs[wr * GT_LD + wk + 8] = b1;
  };

  float acc[2][4][4], part[2][4][4];
#pragma unroll
  for (int i = 0; i < 2; i++)
#pragma unroll
    for (int j = 0; j < 4; j++)
#pragma unroll
      for (int c = 0; c < 4; c++) acc[i][j][c] = part[i][j][c] = 0.0f;

  // ldmatrix source rows: A lanes 0-15 rows 0-15 at k 0, lanes 16-31 at k 8;
  // B (W as [n][k]) matrices n0-7/k0, n0-7/k8, n8-15/k0, n8-15/k8.
  const int a_row = lane & 15, a_col = (lane >> 4) * 8;
  const int b_row = (lane & 7) + ((lane >> 4) << 3), b_col = ((lane >> 3) & 1) * 8;

  const int nk = (K + GT_BK - 1) / GT_BK;
  load(0);
  for (int t = 0; t < nk; t++) {
    __syncthreads();  // the previous tile's fragments are read
    store();
    __syncthreads();
    if (t + 1 < nk) load((t + 1) * GT_BK);
#pragma unroll
    for (int kk = 0; kk < GT_BK; kk += 16) {
      u32 b[4][2];
#pragma unroll
      for (int jp = 0; jp < 2; jp++) {
        u32 r0, r1, r2, r3;
        gt_ldmatrix_x4(gt_smem_addr(&Bs[(wn * 32 + jp * 16 + b_row) * GT_LD + kk + b_col]), r0, r1, r2, r3);
        b[2 * jp][0] = r0;
        b[2 * jp][1] = r1;
        b[2 * jp + 1][0] = r2;
        b[2 * jp + 1][1] = r3;
      }
#pragma unroll
      for (int s = 0; s < SPLIT; s++) {
#pragma unroll
        for (int i = 0; i < 2; i++) {
          u32 a0, a1, a2, a3;
          gt_ldmatrix_x4(gt_smem_addr(&As[s][(wm * 32 + i * 16 + a_row) * GT_LD + kk + a_col]), a0, a1, a2, a3);
#pragma unroll
          for (int j = 0; j < 4; j++) gt_mma(part[i][j], a0, a1, a2, a3, b[j][0], b[j][1]);
        }
      }
    }
    // Promote every tile: the tensor cores' float32 accumulation truncates
    // (the H200 run measured ~3e-5 relative error over K = 7168 when a bf16
    // GEMM accumulated all of K in the MMA), so each 32-wide partial goes
    // into the float32 total with an FMA (times the FP8 block scale, constant
    // inside a 128-wide K block).
    {
      const float sc = FP8 ? __ldg(srow + ((t * GT_BK) >> 7)) : 1.0f;
#pragma unroll
      for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
          for (int c = 0; c < 4; c++) {
            acc[i][j][c] = fmaf(part[i][j][c], sc, acc[i][j][c]);
            part[i][j][c] = 0.0f;
          }
    }
  }

  // Accumulator c[0..1]: row lane/4, cols 2*(lane%4)+{0,1}; c[2..3]: row +8.
#pragma unroll
  for (int i = 0; i < 2; i++) {
#pragma unroll
    for (int h = 0; h < 2; h++) {
      const int r = wm * 32 + i * 16 + (lane >> 2) + h * 8;
      if (r >= rows) continue;
      float* yr = y + (size_t)(start + r) * ldy;
#pragma unroll
      for (int j = 0; j < 4; j++) {
        const int n = n0 + wn * 32 + j * 8 + 2 * (lane & 3);
        if (n < N) yr[n] = acc[i][j][2 * h];
        if (n + 1 < N) yr[n + 1] = acc[i][j][2 * h + 1];
      }
    }
  }
}

// grid (ceil(N/128), ceil(M/64)), 256 threads. vec: W rows and x rows are
// 16-byte aligned (K*bytes % 16 == 0, ldx % 4 == 0, aligned bases).
#define GEMM_TC_KERNELS(SPLIT)                                                                                  \
  extern "C" __global__ void __launch_bounds__(256)                                                            \
      gemm_fp8_tc_s##SPLIT(const u8* __restrict__ W, const float* __restrict__ S, const float* __restrict__ x, \
                           float* y, int N, int K, int M, int ldx, int ldy, int vec) {                         \
    PDL_WAIT();                                                                                                \
    const int m0 = blockIdx.y * GT_BM;                                                                         \
    gemm_tc_tile<true, SPLIT>(W, S, x, ldx, (const int*)0, m0, min(GT_BM, M - m0), y, ldy, blockIdx.x * GT_BN, \
                              N, K, vec != 0);                                                                 \
  }                                                                                                            \
  extern "C" __global__ void __launch_bounds__(256)                                                            \
      gemm_bf16_tc_s##SPLIT(const u16* __restrict__ W, const float* __restrict__ x, float* y, int N, int K,    \
                            int M, int ldx, int ldy, int vec) {                                                \
    PDL_WAIT();                                                                                                \
    const int m0 = blockIdx.y * GT_BM;                                                                         \
    gemm_tc_tile<false, SPLIT>(W, (const float*)0, x, ldx, (const int*)0, m0, min(GT_BM, M - m0), y, ldy,      \
                               blockIdx.x * GT_BN, N, K, vec != 0);                                            \
  }                                                                                                            \
  extern "C" __global__ void __launch_bounds__(256) gemm_fp8_experts_tc_s##SPLIT(                              \
      const u8* const* __restrict__ Wt, const float* const* __restrict__ St, const int* __restrict__ tiles,     \
      const int* __restrict__ xrows, const float* __restrict__ x, int ldx, float* y, int N, int K, int vec) {  \
    PDL_WAIT();                                                                                                \
    const int t = blockIdx.y;                                                                                  \
    const int e = tiles[3 * t], start = tiles[3 * t + 1], count = tiles[3 * t + 2];                            \
    if (count <= 0) return;                                                                                    \
    gemm_tc_tile<true, SPLIT>(Wt[e], St[e], x, ldx, xrows, start, count, y, N, blockIdx.x * GT_BN, N, K,        \
                              vec != 0);                                                                       \
  }

GEMM_TC_KERNELS(1)
GEMM_TC_KERNELS(2)
GEMM_TC_KERNELS(3)

// out[m][n] = sum_j wts[m*k+j] * ey[pos[m*k+j]][n] for j = 0..k-1 in order
// (moe_combine's order): the routed experts' weighted sum of each row after
// the grouped expert GEMM. grid (ceil(N/256), rows).
extern "C" __global__ void __launch_bounds__(256) moe_combine_rows(float* out, const float* __restrict__ ey,
                                                                    const float* __restrict__ wts,
                                                                    const int* __restrict__ pos, int k, int N) {
  PDL_WAIT();
  const int m = blockIdx.y;
  const int n = blockIdx.x * 256 + threadIdx.x;
  if (n >= N) return;
  float s = 0.0f;
  for (int j = 0; j < k; j++) s += wts[m * k + j] * ey[(size_t)pos[m * k + j] * N + n];
  out[(size_t)m * N + n] = s;
}
