// One-part FP8 GEMM for serving-mode prefill (TILERT_GPU_GEMM_SPLITS=1):
// y[m][n] = sum_k W[n][k] * S[n/128][k/128] * x[m][k] with x rounded ONCE
// to a 16-bit float, as HF / vLLM run prefill in bf16. Exact mode never
// takes it (engine/gpu gemmParts): its three bf16 parts stay float32-exact.
//
// x: gemm_split_p1 scales each row by a power of two 2^s (its largest |x|
// into [2^14, 2^15), exact) and rounds it to fp16: 11 significant bits, so
// each x value is off by at most 2^-11 of itself (bf16 would be 2^-8; the
// scaling keeps every value of the row far above fp16's subnormals: a value
// 2^-28 of the row's largest is still a normal fp16). Every e4m3 weight is
// exactly an fp16, so the weights lose nothing and the products are exact
// in the tensor cores' float32 accumulation.
//
// The split also permutes K inside every 64-wide tile so that one 16-byte
// shared load gives a thread the e4m3 bytes of its B fragments for all four
// k16 steps of the tile: for mma m16n8k16 a thread (t4 = lane % 4) holds
// logical k {2t4, 2t4+1} (b0) and {2t4+8, 2t4+9} (b1) of each k16 step s;
// logical column c = 16 s + L of the tile holds physical column
//   phys(c) = 16 ((L & 7) >> 1) + 4 s + 2 (L >> 3) + (L & 1)
// (a bijection of 0..63), so thread t4's bytes 16 t4 .. 16 t4 + 15 of a
// weight row are, word s, exactly (b0 low, b1 high) of step s. x columns are
// written in logical order, the weights stay as stored; a dot product does
// not care about the order of its k.
//
// gemm_fp8_p1_b<MT>: block tile BM = 32 MT rows x 128 outputs x 64 K, 8
// warps as 2 x 4 (each BM/2 x 32), a 4-stage cp.async ring (x fp16 rows and
// raw fp8 weight rows), B fragments converted with cvt.rn.f16x2.e4m3x2 in
// the fragment loads; the partial over each 128-wide K block (one scale) is
// promoted into a float32 total with the block scale, as DeepSeek's FP8
// GEMM promotes (the first mma of a block starts from zero, no clearing).
// The dense kernel walks its blocks in groups of 8 row blocks (each wave of
// blocks shares a few x row blocks and weight column blocks in the L2).
// The experts variant takes tile t = (expert, first pair, pairs) like
// gemm_fp8_experts_tc and reads x row xrows[first + i].
//
// Needs sm_89+ (the e4m3 conversion), K % 16 == 0 and 16-byte aligned
// weight rows (the launcher checks); K tails are zero-filled (x columns
// past K are zero in the split, weight chunks past K zero-filled), rows past
// the tile's count are zero-filled and not written, nor columns past N.

#define GP_BN 128
#define GP_BK 64
#define GP_ALD 72  // A row stride in halves (144 bytes: the 8 rows of an ldmatrix hit distinct 16-byte bank groups)
#define GP_BLD 64  // B row stride in bytes (a quarter warp's 16-byte loads cover two whole rows: 32 banks)
#define GP_ST 4    // pipeline stages
#define GP_SMEM(BM) (GP_ST * ((BM) * GP_ALD * 2 + GP_BN * GP_BLD))

// grid (rows), 256 threads: xs[m][0..Kp) fp16 (Kp a multiple of 64, zero
// past K, columns permuted inside each 64-tile as above), rs[m] = 2^-s.
extern "C" __global__ void __launch_bounds__(256) gemm_split_p1(const float* __restrict__ x, int ldx, int K, int Kp,
                                                                u16* xs, float* rs) {
  PDL_WAIT();
  __shared__ float red[8];
  const int m = blockIdx.x, tid = threadIdx.x;
  const float* xr = x + (size_t)m * ldx;
  const int e = row_exp2(xr, K, red);
  const float sc = ldexpf(1.0f, 15 - e);
  if (tid == 0) rs[m] = ldexpf(1.0f, e - 15);
  u16* dst = xs + (size_t)m * Kp;
  for (int c = tid; c < Kp; c += 256) {
    const int cc = c & 63, s = cc >> 4, L = cc & 15;
    const int k = (c & ~63) + 16 * ((L & 7) >> 1) + 4 * s + 2 * (L >> 3) + (L & 1);
    const float v = k < K ? xr[k] * sc : 0.0f;
    u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(v));
    dst[c] = h;
  }
}

#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 890
__device__ __forceinline__ u32 gp_smem_addr(const void* p) { return (u32)__cvta_generic_to_shared(p); }

// 16-byte async copy; src_bytes 0 zero-fills the destination.
__device__ __forceinline__ void gp_cp16(u32 dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}

__device__ __forceinline__ u32 gp_e4m3x2(u32 v) {
  u32 r;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(r) : "h"((u16)v));
  return r;
}

__device__ __forceinline__ void gp_mma(float* c, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// c = a b (the accumulator input is zero).
__device__ __forceinline__ void gp_mma0(float* c, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%10, %10, %10, %10};"
      : "=f"(c[0]), "=f"(c[1]), "=f"(c[2]), "=f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "f"(0.0f));
}

__device__ __forceinline__ void gp_ldmatrix_x4(u32 addr, u32& r0, u32& r1, u32& r2, u32& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
}

// One BM x 128 tile of y (BM = 32 MT).
template <int MT>
__device__ __forceinline__ void gemm_p1_tile(const u8* __restrict__ W, const float* __restrict__ S,
                                             const u16* __restrict__ xs, int Kp, const float* __restrict__ rs,
                                             const int* __restrict__ xrows, int start, int rows, float* __restrict__ y,
                                             int ldy, int n0, int N, int K) {
  constexpr int BM = 32 * MT;
  constexpr int SA = BM * GP_ALD * 2;       // A bytes per stage
  constexpr int SB = SA + GP_BN * GP_BLD;   // stage bytes
  extern __shared__ __align__(16) u8 gp_smem[];
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int wm = warp >> 2, wn = warp & 3, g = lane >> 2, t4 = lane & 3;
  const int KB = (K + 127) >> 7;
  const float* srow = S + (size_t)(n0 >> 7) * KB;

  // Loader roles. A: BM rows x 8 chunks of 16 bytes, MT a thread: chunk
  // tid + 256 i is row tid / 8 + 32 i, halves (tid % 8) * 8. B: 128 rows x
  // 4 chunks, 2 a thread: row tid / 4 + 64 i, bytes (tid % 4) * 16. Every
  // source pointer stays valid (rows past the tile read row 0 with 0 bytes:
  // cp.async zero-fills), so the issue is address arithmetic only.
  const u16* asrc[MT];
  int abytes[MT];
#pragma unroll
  for (int i = 0; i < MT; i++) {
    const int r = (tid >> 3) + 32 * i;
    const bool ok = r < rows;
    asrc[i] = xs + (size_t)(ok ? (xrows ? xrows[start + r] : start + r) : 0) * Kp + (tid & 7) * 8;
    abytes[i] = ok ? 16 : 0;
  }
  const u8* bsrc[2];
  bool bok[2];
#pragma unroll
  for (int i = 0; i < 2; i++) {
    const int n = n0 + (tid >> 2) + 64 * i;
    bok[i] = n < N;
    bsrc[i] = W + (size_t)(bok[i] ? n : 0) * K + (tid & 3) * 16;
  }
  const int bkc0 = (tid & 3) * 16;
  const u32 sbase = gp_smem_addr(gp_smem);
  const u32 a_dst = ((tid >> 3) * GP_ALD + (tid & 7) * 8) * 2;
  const u32 b_dst = SA + (tid >> 2) * GP_BLD + (tid & 3) * 16;

  auto issue = [&](int st, int k0) {
    const u32 S0 = sbase + st * SB;
#pragma unroll
    for (int i = 0; i < MT; i++) gp_cp16(S0 + a_dst + i * (32 * GP_ALD * 2), asrc[i] + k0, abytes[i]);
    const bool kin = k0 + bkc0 < K;
#pragma unroll
    for (int i = 0; i < 2; i++) gp_cp16(S0 + b_dst + i * (64 * GP_BLD), bsrc[i] + k0, bok[i] && kin ? 16 : 0);
    asm volatile("cp.async.commit_group;" ::: "memory");
  };

  float acc[MT][4][4], part[MT][4][4];
#pragma unroll
  for (int i = 0; i < MT; i++)
#pragma unroll
    for (int j = 0; j < 4; j++)
#pragma unroll
      for (int c = 0; c < 4; c++) acc[i][j][c] = part[i][j][c] = 0.0f;

  // ldmatrix rows: lanes 0-15 rows 0-15 at k 0, lanes 16-31 at k 8.
  const int a_row = lane & 15, a_col = (lane >> 4) * 8;
  const u32 a_off = ((wm * (BM / 2) + a_row) * GP_ALD + a_col) * 2;
  const u32 b_off = SA + (wn * 32 + g) * GP_BLD + 16 * t4;
  const int nk = Kp / GP_BK;  // 64-wide tiles (Kp: K rounded up to 64)
#pragma unroll
  for (int s = 0; s < GP_ST - 1; s++) {
    if (s < nk) {
      issue(s, s * GP_BK);
    } else {
      asm volatile("cp.async.commit_group;" ::: "memory");
    }
  }

  // One 64-wide tile: wait for it, refill the stage freed by the last one,
  // 4 k16 steps of MT x 4 mma. FIRST: the tile opens a 128-wide K block.
  auto tile = [&](int t, bool first) {
    asm volatile("cp.async.wait_group %0;" ::"n"(GP_ST - 2) : "memory");
    __syncthreads();  // tile t landed for every thread; tile t-1's stage is free
    if (t + GP_ST - 1 < nk) {
      issue((t + GP_ST - 1) % GP_ST, (t + GP_ST - 1) * GP_BK);
    } else {
      asm volatile("cp.async.commit_group;" ::: "memory");
    }
    const u32 st = sbase + (t % GP_ST) * SB;
    uint4 braw[4];
#pragma unroll
    for (int j = 0; j < 4; j++) braw[j] = *(const uint4*)(gp_smem + (t % GP_ST) * SB + b_off + j * 8 * GP_BLD);
#pragma unroll
    for (int s = 0; s < 4; s++) {
      u32 b[4][2];
#pragma unroll
      for (int j = 0; j < 4; j++) {
        const u32 w = s == 0 ? braw[j].x : s == 1 ? braw[j].y : s == 2 ? braw[j].z : braw[j].w;
        b[j][0] = gp_e4m3x2(w & 0xffffu);
        b[j][1] = gp_e4m3x2(w >> 16);
      }
#pragma unroll
      for (int i = 0; i < MT; i++) {
        u32 a0, a1, a2, a3;
        gp_ldmatrix_x4(st + a_off + (i * 16 * GP_ALD + s * 16) * 2, a0, a1, a2, a3);
#pragma unroll
        for (int j = 0; j < 4; j++) {
          if (first && s == 0) {
            gp_mma0(part[i][j], a0, a1, a2, a3, b[j][0], b[j][1]);
          } else {
            gp_mma(part[i][j], a0, a1, a2, a3, b[j][0], b[j][1]);
          }
        }
      }
    }
  };

  for (int t = 0; t < nk; t += 2) {
    const float sc = __ldg(srow + (t >> 1));
    tile(t, true);
    if (t + 1 < nk) tile(t + 1, false);
    // Promote the 128-wide block's partial with its scale.
#pragma unroll
    for (int i = 0; i < MT; i++)
#pragma unroll
      for (int j = 0; j < 4; j++)
#pragma unroll
        for (int c = 0; c < 4; c++) acc[i][j][c] = fmaf(part[i][j][c], sc, acc[i][j][c]);
  }
  asm volatile("cp.async.wait_all;" ::: "memory");

  // Accumulator c[0..1]: row g, cols 2*t4+{0,1}; c[2..3]: row g+8.
  const bool v2 = (ldy & 1) == 0 && ((size_t)y & 7) == 0;
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
        const float o0 = acc[i][j][2 * h] * inv, o1 = acc[i][j][2 * h + 1] * inv;
        if (v2 && n + 1 < N) {
          *(float2*)(yr + n) = make_float2(o0, o1);
        } else {
          if (n < N) yr[n] = o0;
          if (n + 1 < N) yr[n + 1] = o1;
        }
      }
    }
  }
}

// Dense: 1-D grid of ceil(N/128) * ceil(M/BM) blocks, 256 threads,
// GP_SMEM(BM) bytes; block b walks groups of 8 row blocks, inside a group
// row block fastest (Triton's grouped order). Experts: grid (ceil(N/128),
// tiles). Names: _b<MT> (BM = 32 MT).
#define GEMM_P1_KERNEL(MT)                                                                                         \
  extern "C" __global__ void __launch_bounds__(256) gemm_fp8_p1_b##MT(                                            \
      const u8* __restrict__ W, const float* __restrict__ S, const u16* __restrict__ xs, int Kp,                  \
      const float* __restrict__ rs, float* y, int N, int K, int M, int ldy) {                                     \
    PDL_WAIT();                                                                                                   \
    const int nbn = (N + GP_BN - 1) / GP_BN, nbm = (M + 32 * MT - 1) / (32 * MT);                                 \
    const int per = 8 * nbn, grp = blockIdx.x / per, in = blockIdx.x - grp * per;                                 \
    const int first = grp * 8, gsz = min(nbm - first, 8);                                                         \
    const int bm = first + in % gsz, bn = in / gsz;                                                               \
    const int m0 = bm * 32 * MT;                                                                                  \
    gemm_p1_tile<MT>(W, S, xs, Kp, rs, (const int*)0, m0, min(32 * MT, M - m0), y, ldy, bn * GP_BN, N, K);        \
  }                                                                                                               \
  extern "C" __global__ void __launch_bounds__(256) gemm_fp8_experts_p1_b##MT(                                    \
      const u8* const* __restrict__ Wt, const float* const* __restrict__ St, const int* __restrict__ tiles,        \
      const int* __restrict__ xrows, const u16* __restrict__ xs, int Kp, const float* __restrict__ rs, float* y,  \
      int N, int K) {                                                                                             \
    PDL_WAIT();                                                                                                   \
    const int t = blockIdx.y;                                                                                     \
    const int e = tiles[3 * t], start = tiles[3 * t + 1], count = tiles[3 * t + 2];                               \
    if (count <= 0) return;                                                                                       \
    gemm_p1_tile<MT>(Wt[e], St[e], xs, Kp, rs, xrows, start, min(count, 32 * MT), y, N, blockIdx.x * GP_BN, N, K); \
  }
#else
#define GEMM_P1_KERNEL(MT)                                                                                         \
  extern "C" __global__ void __launch_bounds__(256) gemm_fp8_p1_b##MT(                                            \
      const u8* __restrict__ W, const float* __restrict__ S, const u16* __restrict__ xs, int Kp,                  \
      const float* __restrict__ rs, float* y, int N, int K, int M, int ldy) {                                     \
    PDL_WAIT();                                                                                                   \
    __trap();                                                                                                     \
  }                                                                                                               \
  extern "C" __global__ void __launch_bounds__(256) gemm_fp8_experts_p1_b##MT(                                    \
      const u8* const* __restrict__ Wt, const float* const* __restrict__ St, const int* __restrict__ tiles,        \
      const int* __restrict__ xrows, const u16* __restrict__ xs, int Kp, const float* __restrict__ rs, float* y,  \
      int N, int K) {                                                                                             \
    PDL_WAIT();                                                                                                   \
    __trap();                                                                                                     \
  }
#endif

GEMM_P1_KERNEL(2)
GEMM_P1_KERNEL(4)
