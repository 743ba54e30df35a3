// Tensor-core FP8 GEMM for many rows with x in two fp16 parts (local
// prefill; gemm_tc.cu's three-bf16-part kernels stay for bf16 weights and
// as TILERT_GPU_GEMM_H2=0's path).
//
// gemm_split_h2 scales each x row by a power of two 2^s (its largest |x| to
// [2^14, 2^15)) and splits it into hi = fp16(x 2^s) and lo = fp16(x 2^s -
// hi): 22 bits of mantissa relative to each value (fp16 keeps 11; bf16 8),
// exact scaling, so two tensor products carry what three bf16 parts carry
// to within ~2^-22 per product (float32's own summation order moves a K =
// 7168 dot product by more). Every e4m3 weight is exactly an fp16.
//
// gemm_fp8_h2_b{64,128}: y[m][n] = 2^-s[m] * sum over 32-wide K tiles of
// S[n/128][k/128] * (the tile's tensor-core partial), promoted into a
// float32 total per tile (DeepSeek's FP8 GEMM promotes per 128). Block tile BM x 128 x 32,
// 8 warps as 2 x 4 (each BM/2 x 32); x parts and raw fp8 weights stream
// through a 3-stage cp.async pipeline; the B fragments convert e4m3 pairs
// to fp16 pairs (cvt.rn.f16x2.e4m3x2) straight from the raw tile. x parts
// are [2][rows][Kp] (Kp a multiple of 32, zero past K), so A loads never
// need a K tail; W rows need K % 16 == 0 and 16-byte alignment (the
// launcher checks). Rows past the tile's count are zero-filled and not
// written; columns past N likewise.
//
// The experts variant takes tile t = (expert, first pair, pairs) and reads
// x part row xrows[first + i] (the pair's token), as gemm_fp8_experts_tc.

#define GH_BN 128
#define GH_BK 32
#define GH_ALD 40  // A row stride in halves (80 bytes: ldmatrix rows on distinct banks)
#define GH_BLD 48  // B row stride in bytes (48: the fragment loads of 8 rows hit distinct banks)
#define GH_ST 3    // pipeline stages
#define GH_SMEM(BM, NP) (GH_ST * ((NP) * (BM) * GH_ALD * 2 + GH_BN * GH_BLD))

__device__ __forceinline__ u16 gh_f16(float f) {
  u16 h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return h;
}
__device__ __forceinline__ float gh_f32(u16 h) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
}

// row_exp2 (256 threads, all calling): the e with |x| max of the K values
// of xr = f 2^e, f in [0.5, 1), clamped to [-100, 100]; 15 (scale 1) for a
// zero, inf or NaN row, so NaN and inf carry through. red: 8 floats of
// shared memory. The fp16 splits (gemm_split_h2, gemm_split_p1) scale the
// row by 2^(15-e), bringing its largest |x| into [2^14, 2^15).
__device__ __forceinline__ int row_exp2(const float* __restrict__ xr, int K, float* red) {
  const int tid = threadIdx.x;
  float mx = 0.0f;
  for (int k = tid; k < K; k += 256) mx = fmaxf(mx, fabsf(xr[k]));
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  if ((tid & 31) == 0) red[tid >> 5] = mx;
  __syncthreads();
  mx = red[0];
#pragma unroll
  for (int i = 1; i < 8; i++) mx = fmaxf(mx, red[i]);
  int e = 0;
  if (mx > 0.0f && mx <= 3.4e38f) {
    frexpf(mx, &e);  // mx = f 2^e, f in [0.5, 1)
    e = max(-100, min(100, e));
  } else {
    e = 15;
  }
  return e;
}

// grid (rows), 256 threads: xs[p][m][0..Kp) (p = 0 hi, then the parts of
// what is left; pstride halves apart), rs[m] = 2^-s. np: 2 or 3 parts
// (three carry 33 bits: float32-exact products, like gemm_tc's three bf16).
extern "C" __global__ void __launch_bounds__(256) gemm_split_h2(const float* __restrict__ x, int ldx, int K, int Kp,
                                                                u16* xs, size_t pstride, float* rs, int np) {
  PDL_WAIT();
  __shared__ float red[8];
  const int m = blockIdx.x, tid = threadIdx.x;
  const float* xr = x + (size_t)m * ldx;
  const int e = row_exp2(xr, K, red);
  const float sc = ldexpf(1.0f, 15 - e);
  if (tid == 0) rs[m] = ldexpf(1.0f, e - 15);
  u16* dst = xs + (size_t)m * Kp;
  for (int k = tid; k < Kp; k += 256) {
    float v = k < K ? xr[k] * sc : 0.0f;
    for (int p = 0; p < np; p++) {
      const u16 h = gh_f16(v);
      dst[p * pstride + k] = h;
      v -= gh_f32(h);  // exact: h is v rounded to 11 bits
    }
  }
}

#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 890
__device__ __forceinline__ u32 gh_smem_addr(const void* p) { return (u32)__cvta_generic_to_shared(p); }

// 16-byte async copy; src_bytes 0 zero-fills the destination.
__device__ __forceinline__ void gh_cp16(u32 dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}

__device__ __forceinline__ u32 gh_e4m3x2(u16 v) {
  u32 r;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(r) : "h"(v));
  return r;
}

__device__ __forceinline__ void gh_mma(float* c, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void gh_ldmatrix_x4(u32 addr, u32& r0, u32& r1, u32& r2, u32& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
}

// One BM x 128 tile of y. MT: 16-row mma tiles per warp (BM = 32 MT); NP:
// fp16 parts of x.
template <int MT, int NP>
__device__ __forceinline__ void gemm_h2_tile(const u8* __restrict__ W, const float* __restrict__ S,
                                             const u16* __restrict__ xs, size_t pstride, int Kp,
                                             const float* __restrict__ rs, const int* __restrict__ xrows, int start,
                                             int rows, float* __restrict__ y, int ldy, int n0, int N, int K) {
  constexpr int BM = 32 * MT;
  extern __shared__ __align__(16) u8 gh_smem[];
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int wm = warp >> 2, wn = warp & 3, g = lane >> 2, t4 = lane & 3;
  const int KB = (K + 127) >> 7;
  const float* srow = S + (size_t)(n0 >> 7) * KB;

  // Loader roles. A: NP*BM rows (part, row) x 4 chunks of 16 bytes; B: 128
  // rows x 2 chunks (thread tid: row tid/2, chunk tid%2).
  constexpr int ACH = NP * BM * 4;  // A chunks per stage
  const u8* bsrc = 0;
  {
    const int n = n0 + (tid >> 1);
    if (n < N) bsrc = W + (size_t)n * K + (tid & 1) * 16;
  }
  constexpr int SB = NP * BM * GH_ALD * 2 + GH_BN * GH_BLD;  // stage bytes
  auto stageA = [&](int s) { return (u16*)(gh_smem + s * SB); };
  auto stageB = [&](int s) { return gh_smem + s * SB + NP * BM * GH_ALD * 2; };
  auto issue = [&](int s, int k0) {
    u16* A = stageA(s);
#pragma unroll
    for (int i = 0; i < ACH / 256; i++) {
      const int c = tid + i * 256;
      const int pr = c >> 2, kc = (c & 3) * 8;  // pr = part*BM + row
      const int p = pr / BM, r = pr - p * BM;
      const u16* src = xs;
      int bytes = 0;
      if (r < rows) {
        const int xr = xrows ? xrows[start + r] : start + r;
        src = xs + p * pstride + (size_t)xr * Kp + k0 + kc;
        bytes = 16;
      }
      gh_cp16(gh_smem_addr(A + pr * GH_ALD + kc), src, bytes);
    }
    u8* B = stageB(s);
    const int kb = k0 + (tid & 1) * 16;
    gh_cp16(gh_smem_addr(B + (tid >> 1) * GH_BLD + (tid & 1) * 16), bsrc && kb < K ? bsrc + k0 : W, bsrc && kb < K ? 16 : 0);
    asm volatile("cp.async.commit_group;" ::: "memory");
  };

  float acc[MT][4][4], part[MT][4][4];
#pragma unroll
  for (int i = 0; i < MT; i++)
#pragma unroll
    for (int j = 0; j < 4; j++)
#pragma unroll
      for (int c = 0; c < 4; c++) acc[i][j][c] = part[i][j][c] = 0.0f;

  const int a_row = lane & 15, a_col = (lane >> 4) * 8;
  const int nk = (K + GH_BK - 1) / GH_BK;
#pragma unroll
  for (int s = 0; s < GH_ST - 1; s++) {
    if (s < nk) {
      issue(s, s * GH_BK);
    } else {
      asm volatile("cp.async.commit_group;" ::: "memory");
    }
  }
  for (int t = 0; t < nk; t++) {
    asm volatile("cp.async.wait_group %0;" ::"n"(GH_ST - 2) : "memory");
    __syncthreads();  // tile t landed for every thread; tile t-1's stage is free
    if (t + GH_ST - 1 < nk) {
      issue((t + GH_ST - 1) % GH_ST, (t + GH_ST - 1) * GH_BK);
    } else {
      asm volatile("cp.async.commit_group;" ::: "memory");
    }
    const u16* A = stageA(t % GH_ST);
    const u8* B = stageB(t % GH_ST);
#pragma unroll
    for (int kk = 0; kk < GH_BK; kk += 16) {
      u32 b[4][2];
#pragma unroll
      for (int j = 0; j < 4; j++) {
        const u8* br = B + (wn * 32 + j * 8 + g) * GH_BLD + kk + 2 * t4;
        b[j][0] = gh_e4m3x2(*(const u16*)br);
        b[j][1] = gh_e4m3x2(*(const u16*)(br + 8));
      }
#pragma unroll
      for (int p = 0; p < NP; p++) {
#pragma unroll
        for (int i = 0; i < MT; i++) {
          u32 a0, a1, a2, a3;
          gh_ldmatrix_x4(gh_smem_addr(A + (p * BM + wm * (BM / 2) + i * 16 + a_row) * GH_ALD + kk + a_col), a0, a1, a2, a3);
#pragma unroll
          for (int j = 0; j < 4; j++) gh_mma(part[i][j], a0, a1, a2, a3, b[j][0], b[j][1]);
        }
      }
    }
    // Promote every 32-wide K tile (gemm_tc.cu's cadence): the partial
    // times its block's scale into the float32 total. The tensor cores'
    // float32 accumulation truncates; promoting once per 128-wide block (24
    // mma of 3 parts into one accumulator) moved the tiny models' prefill
    // caches past their bound on the H200 (session 4, NOTES.md), with 2
    // parts as with 3. Changed after that run: NOT yet run on a GPU.
    {
      const float sc = __ldg(srow + (t >> 2));
#pragma unroll
      for (int i = 0; i < MT; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
          for (int c = 0; c < 4; c++) {
            acc[i][j][c] = fmaf(part[i][j][c], sc, acc[i][j][c]);
            part[i][j][c] = 0.0f;
          }
    }
  }
  asm volatile("cp.async.wait_all;" ::: "memory");

  // Accumulator c[0..1]: row g, cols 2*t4+{0,1}; c[2..3]: row g+8.
#pragma unroll
  for (int i = 0; i < MT; i++) {
#pragma unroll
    for (int h = 0; h < 2; h++) {
      const int r = wm * (BM / 2) + i * 16 + g + h * 8;
      if (r >= rows) continue;
      const float inv = rs[xrows ? xrows[start + r] : start + r];
      float* yr = y + (size_t)(start + r) * ldy;
#pragma unroll
      for (int j = 0; j < 4; j++) {
        const int n = n0 + wn * 32 + j * 8 + 2 * t4;
        if (n < N) yr[n] = acc[i][j][2 * h] * inv;
        if (n + 1 < N) yr[n + 1] = acc[i][j][2 * h + 1] * inv;
      }
    }
  }
}

// grid (ceil(N/128), ceil(M/BM)), 256 threads, GH_SMEM(BM, NP) bytes.
// Names: _b<MT>_p<NP> (BM = 32 MT).
#define GEMM_H2_KERNEL(MT, NP)                                                                                      \
  extern "C" __global__ void __launch_bounds__(256) gemm_fp8_h2_b##MT##_p##NP(                                     \
      const u8* __restrict__ W, const float* __restrict__ S, const u16* __restrict__ xs, size_t pstride, int Kp,   \
      const float* __restrict__ rs, float* y, int N, int K, int M, int ldy) {                                      \
    PDL_WAIT();                                                                                                    \
    const int m0 = blockIdx.y * 32 * MT;                                                                           \
    gemm_h2_tile<MT, NP>(W, S, xs, pstride, Kp, rs, (const int*)0, m0, min(32 * MT, M - m0), y, ldy,               \
                         blockIdx.x * GH_BN, N, K);                                                                \
  }                                                                                                                \
  extern "C" __global__ void __launch_bounds__(256) gemm_fp8_experts_h2_b##MT##_p##NP(                             \
      const u8* const* __restrict__ Wt, const float* const* __restrict__ St, const int* __restrict__ tiles,         \
      const int* __restrict__ xrows, const u16* __restrict__ xs, size_t pstride, int Kp,                           \
      const float* __restrict__ rs, float* y, int N, int K) {                                                      \
    PDL_WAIT();                                                                                                    \
    const int t = blockIdx.y;                                                                                      \
    const int e = tiles[3 * t], start = tiles[3 * t + 1], count = tiles[3 * t + 2];                                \
    if (count <= 0) return;                                                                                        \
    gemm_h2_tile<MT, NP>(Wt[e], St[e], xs, pstride, Kp, rs, xrows, start, min(count, 32 * MT), y, N,               \
                         blockIdx.x * GH_BN, N, K);                                                                \
  }
#else
#define GEMM_H2_KERNEL(MT, NP)                                                                                      \
  extern "C" __global__ void __launch_bounds__(256) gemm_fp8_h2_b##MT##_p##NP(                                     \
      const u8* __restrict__ W, const float* __restrict__ S, const u16* __restrict__ xs, size_t pstride, int Kp,   \
      const float* __restrict__ rs, float* y, int N, int K, int M, int ldy) {                                      \
    PDL_WAIT();                                                                                                    \
    __trap();                                                                                                      \
  }                                                                                                                \
  extern "C" __global__ void __launch_bounds__(256) gemm_fp8_experts_h2_b##MT##_p##NP(                             \
      const u8* const* __restrict__ Wt, const float* const* __restrict__ St, const int* __restrict__ tiles,         \
      const int* __restrict__ xrows, const u16* __restrict__ xs, size_t pstride, int Kp,                           \
      const float* __restrict__ rs, float* y, int N, int K) {                                                      \
    PDL_WAIT();                                                                                                    \
    __trap();                                                                                                      \
  }
#endif

GEMM_H2_KERNEL(2, 2)
GEMM_H2_KERNEL(4, 2)
GEMM_H2_KERNEL(2, 3)
GEMM_H2_KERNEL(4, 3)
