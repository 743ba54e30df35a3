// Grouped GEMV, split plan (kernels.GemvGroupSplit; one input row, no
// norm): the layer input's q_a, kv_a, indexer wk and weights_proj in one
// launch with gemv_group_r*_m1's sums bit for bit, every byte of a block's
// weights in flight at once.
//
// Why: gemv_group_r8_m1 loads one 16-byte chunk of each of its 8 rows per
// round, so a thread of the 2304 x 7168 group waits two DRAM round trips in
// a row (weights_proj's bf16 rows four), each behind the whole launch's
// queue; holding every chunk in registers instead (the mid kernels' d16
// variants) cost registers, so the grid no longer fit one wave (11.2 against
// 9.7 us, session 9). Here each thread cp.asyncs all its chunks of its
// group's R rows into shared memory (no registers held while they fly),
// waits once, then sums them exactly as the tile GEMV does.
//
// Bits: a segment keeps its group size G (the thread's chunks c = tg, tg+G,
// ..., in that order, each chunk's sums as TILE_CHUNK_M1's, scaled by fmaf
// into the thread's accumulator; warp butterflies; the group's warps summed
// in order from 0.0f), so every output equals gemv_group's and the tile
// GEMV's whatever R is. R (rows a group) is the segment's own (cfg >> 16),
// sized by the launcher to the shared memory given.
//
// Shared memory (dynamic): the block's groups' rows, row-major, C chunks of
// 16 bytes a row (a thread reads back only the chunks it copied: no barrier
// for them), then each group's scale row (fp8; kb floats, read by every
// thread of the group: one barrier).

__device__ __forceinline__ void split_cp16(void* dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"((u32)__cvta_generic_to_shared(dst)), "l"(src)
               : "memory");
}

__device__ __forceinline__ void split_cp4(void* dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"((u32)__cvta_generic_to_shared(dst)), "l"(src)
               : "memory");
}

// Blocks of a segment of N rows: R = cfg >> 16 rows a group, TILE_THREADS/G
// groups a block.
__device__ __forceinline__ int split_blocks(int N, int cfg) {
  const int G = cfg & 1023, R = cfg >> 16;
  return N > 0 ? ((N + R - 1) / R + TILE_THREADS / G - 1) / (TILE_THREADS / G) : 0;
}

template <class T, int R>
__device__ __forceinline__ void gemv_split_body(const void* W, const float* S, float* y, int N, int G, int blk,
                                                const float* __restrict__ x, int K, uint4* wsm, float (*part)[32]) {
  GROUP_ROWS(T, R)
  const int CK = K / T::E;
  uint4* gw = wsm + (size_t)grp * R * CK;
  // The scale rows after every group's weights.
  float* gsc = (float*)(wsm + (size_t)(TILE_THREADS / G) * R * CK) + grp * kb;
  // Two cp.async groups: the scale row and the thread's first chunk of each
  // row, then the rest, so the first chunks' sums run while the rest fly.
  if (sr && C > 0)
    for (int i = tg; i < kb; i += G) split_cp4(gsc + i, sr + i);
  for (int c = tg; c < C; c += G) {
#pragma unroll
    for (int r = 0; r < R; r++) {
      // The row pointer here, not GROUP_ROWS' wr[R] (kept live, it spilled).
      const char* wrow = (const char*)W + (size_t)min(n0 + r, N - 1) * K * T::BYTES;
      split_cp16(gw + (size_t)r * CK + c, wrow + (size_t)c * 16);
    }
    if (c == tg) asm volatile("cp.async.commit_group;" ::: "memory");
  }
  asm volatile("cp.async.commit_group;" ::: "memory");
  // A chunk's x is loaded before waiting for its weights (an L2 round trip
  // not added after them).
  float xv[4][T::EW];
  if (tg < C) {
#pragma unroll
    for (int q = 0; q < 4; q++) tile_ldx<T::EW>(x + (size_t)tg * T::E + q * T::EW, xv[q]);
  }
  asm volatile("cp.async.wait_group 1;" ::: "memory");
  // Every thread's scale copies landed (they were in its first group).
  __syncthreads();
  float acc[R];
#pragma unroll
  for (int r = 0; r < R; r++) acc[r] = 0.0f;
  for (int c = tg; c < C; c += G) {
    if (c != tg) {
#pragma unroll
      for (int q = 0; q < 4; q++) tile_ldx<T::EW>(x + (size_t)c * T::E + q * T::EW, xv[q]);
      if (c == tg + G) asm volatile("cp.async.wait_group 0;" ::: "memory");
    }
    const float sc = sr ? gsc[(c * T::E) >> 7] : 1.0f;
    // TILE_CHUNK_M1's sums a row at a time: each row's p is the same fmaf
    // chain (q, then e, in order; the rows never mix), with one row's
    // chunk live instead of R (at R = 4 under the 40-register bound
    // TILE_CHUNK_M1 spilled).
#pragma unroll
    for (int r = 0; r < R; r++) {
      const uint4 wv = gw[(size_t)r * CK + c];
      float p = 0.0f;
#pragma unroll
      for (int q = 0; q < 4; q++) {
        float wf[T::EW];
        T::word(tile_word(wv, q), wf);
#pragma unroll
        for (int e = 0; e < T::EW; e++) p = fmaf(wf[e], xv[q][e], p);
      }
      acc[r] = fmaf(p, sc, acc[r]);
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

// A segment's body by its format and rows a group (at most RM: the larger
// bodies' registers stay out of launches that do not take them).
template <class T, int RM>
__device__ __forceinline__ void gemv_split_seg(const void* W, const float* S, float* y, int N, int G, int R, int blk,
                                               const float* __restrict__ x, int K, uint4* wsm, float (*part)[32]) {
  if constexpr (RM >= 8) {
    if (R == 8) return gemv_split_body<T, 8>(W, S, y, N, G, blk, x, K, wsm, part);
  }
  if constexpr (RM >= 4) {
    if (R == 4) return gemv_split_body<T, 4>(W, S, y, N, G, blk, x, K, wsm, part);
  }
  if constexpr (RM >= 2) {
    if (R == 2) return gemv_split_body<T, 2>(W, S, y, N, G, blk, x, K, wsm, part);
  }
  gemv_split_body<T, 1>(W, S, y, N, G, blk, x, K, wsm, part);
}

// cfg_s = G | bf16 << 14 | R << 16; segment 0's blocks first.
template <int RM>
__device__ __forceinline__ void gemv_split_run(const float* __restrict__ x, int K, const void* w0, const float* s0,
                                               float* y0, int n0, int cfg0, const void* w1, const float* s1,
                                               float* y1, int n1, int cfg1, const void* w2, const float* s2,
                                               float* y2, int n2, int cfg2, const void* w3, const float* s3,
                                               float* y3, int n3, int cfg3) {
  extern __shared__ uint4 split_sm[];
  __shared__ float part[TILE_THREADS / 32][32];
  int blk = blockIdx.x;
  const void* W = w0;
  const float* S = s0;
  float* y = y0;
  int N = n0, cfg = cfg0;
  int nb = split_blocks(n0, cfg0);
  if (blk >= nb) {
    blk -= nb;
    W = w1, S = s1, y = y1, N = n1, cfg = cfg1;
    nb = split_blocks(n1, cfg1);
    if (blk >= nb) {
      blk -= nb;
      W = w2, S = s2, y = y2, N = n2, cfg = cfg2;
      nb = split_blocks(n2, cfg2);
      if (blk >= nb) {
        blk -= nb;
        W = w3, S = s3, y = y3, N = n3, cfg = cfg3;
      }
    }
  }
  const int G = cfg & 1023, R = cfg >> 16;
  if ((cfg >> 14) & 1) {
    gemv_split_seg<TBF16, RM>(W, S, y, N, G, R, blk, x, K, split_sm, part);
  } else {
    gemv_split_seg<TFP8, RM>(W, S, y, N, G, R, blk, x, K, split_sm, part);
  }
}

#define GEMV_SPLIT_KERNEL(RM, MINB)                                                                               \
  extern "C" __global__ void __launch_bounds__(TILE_THREADS, MINB) gemv_group_split_r##RM(                        \
      const float* __restrict__ x, int K, const void* w0, const float* s0, float* y0, int n0, int cfg0,           \
      const void* w1, const float* s1, float* y1, int n1, int cfg1, const void* w2, const float* s2, float* y2,   \
      int n2, int cfg2, const void* w3, const float* s3, float* y3, int n3, int cfg3) {                           \
    PDL_WAIT();                                                                                                   \
    gemv_split_run<RM>(x, K, w0, s0, y0, n0, cfg0, w1, s1, y1, n1, cfg1, w2, s2, y2, n2, cfg2, w3, s3, y3, n3,    \
                       cfg3);                                                                                     \
  }

// Blocks an SM holds at least (the register bound): six of 40 registers
// take the layer inputs' 592 (DeepSeek-V3.2) and 720 (GLM-5) blocks of 4
// rows in one wave on 132 SMs (at 52 registers, unbounded, four: two waves);
// at 8 rows a block of 57 KiB shared memory bounds it to three.
GEMV_SPLIT_KERNEL(1, 6)
GEMV_SPLIT_KERNEL(2, 6)
GEMV_SPLIT_KERNEL(4, 6)
GEMV_SPLIT_KERNEL(8, 3)
