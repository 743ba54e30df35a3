// indexer_scores_wgh (+ _rows): the lightning indexer's serving scores
// (indexer_scores_mma_pf's inputs, output, -inf tail and histogram; float32
// sums in another order) on wgmma with the KEYS as M and the heads as N.
//
// Why (cuda/kernels NOTES "indexer_scores_wgh"): _pf runs mma.sync with the
// 64 heads as M, so every warp reads the whole f16 query (16 KB of A
// fragments) from shared memory for each 16 keys, and its HMMA chains and
// those reads, not the 17.3 MB of keys, bound it at 131072 keys (~13 us,
// a third of the copy rate). Session 15's fp8 wgmma took the heads as M
// too, so the head sum crossed warps through shared memory, and its e4m3
// products accumulate with ~13 bits. Here a warpgroup takes one 64-key page
// a round: A = the page's keys, e4m3 -> f16 in registers (the mma.sync A
// fragment layout, one warp's 16 keys), B = the query (64 heads x 128,
// f16, exact for e4m3) once per block in shared memory, read by the tensor
// core (8 x m64n64k16, float32 accumulation). The accumulator row of a key
// holds all 64 heads across one lane quad, so ReLU, head weights and the
// head sum are in registers plus two shuffles.
//
// The k dimension is idx_q_prep's permutation (indexer_mma.cu): in k-step
// ks lane c's logical k 2c+o and 2c+8+o (o = 0, 1) are the physical
// dimensions P(ks, c)+o and P(ks, c)+2+o, P(ks, c) = 16c + 4ks (ks < 4) or
// 64 + 16c + 4(ks - 4); applied to the keys and the query alike, so the dot
// products are the plain ones, and a lane's key bytes of all eight k-steps
// are its two 16-byte loads per key row. B is stored in wgmma's no-swizzle
// K-major layout (mla_prefill_wg.cu's MWG_OFF: core matrices of 8 heads x
// 8 k, LBO 1024 along k, SBO 128 along heads). indexer_wgh_pure_test.go
// transcribes both mappings.
//
// grid (nbx, nq), 128 threads (one warpgroup), logical page p = blockIdx.x
// + i * nbx; the next page's keys and scales are loaded before this page's
// products. hist != null: the row's 4096-bin histogram of the top 12 bits
// of float_key(score), as _pf (TopKRadixAfterHist's contract).

#define WGH_D 128
#define WGH_PAGE 64
#define WGH_PAGE_BYTES (WGH_PAGE * WGH_D + WGH_PAGE * 4)
#define WGH_QROW 8192  // IDXQ_ROW_BYTES
#define WGH_HEADS 64   // IDXQ_HEADS
#define WGH_BINS 4096  // TKR_BINS
// Byte of (head r, logical k c) in the 64-row no-swizzle K-major layout.
#define WGH_OFF(r, c) (((((c) >> 3) * 8 + ((r) >> 3)) << 7) + (((r) & 7) << 4) + (((c) & 7) << 1))

#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ == 900) && defined(__CUDA_ARCH_FEAT_SM90_ALL)

__device__ __forceinline__ u32 wgh_cvt(u32 v) {
  u32 r;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(r) : "h"((u16)(v & 0xffffu)));
  return r;
}

__device__ __forceinline__ u32 wgh_word(const uint4& v, int i) { return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w; }

// D (64 keys x 64 heads, float32) += A (registers: this warp's 16 keys x 16
// k) * B (shared memory, K-major).
__device__ __forceinline__ void wgh_m64n64(float* d, u32 a0, u32 a1, u32 a2, u32 a3, u64 db) {
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
      "{%32, %33, %34, %35}, %36, 1, 1, 1, 0;"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(db)
      : "memory");
}

// WGS warpgroups a block (128 x WGS threads) share the query's staging and
// the histogram; warpgroup wg takes logical pages blockIdx.x x WGS + wg +
// i x gridDim.x x WGS. A key's arithmetic does not depend on WGS.
template <bool ROWS, int WGS>
__device__ __forceinline__ void wgh_body(const u8* __restrict__ qh, const float* __restrict__ wq,
                                         const u8* __restrict__ cache, const int* __restrict__ block_table,
                                         const int* __restrict__ lens, float* out, int T, int ld_out, u32* hist,
                                         const long long* __restrict__ row_base) {
  __shared__ __align__(128) u8 qb[WGH_HEADS * WGH_D * 2];  // B: the query, f16, 16 KB
  __shared__ u32 hs[WGH_BINS];                             // score histogram (hist != null), 16 KB
  __shared__ __align__(8) float ws[WGH_HEADS];             // head weights (wq)
  constexpr int NT = 128 * WGS;
  const int row = blockIdx.y, tid = threadIdx.x, lane = tid & 31, w = (tid >> 5) & 3;
  const int g = lane >> 2, c = lane & 3;
  // The query's codes and head weights first: the epilogue just wrote them
  // (L2), and the lens -> page -> keys chain below is two round trips more
  // that their round trip now runs under (session 62: the staging mark sat
  // 2.1-2.7 us after release).
  constexpr int QL = WGH_QROW / 8 / NT;
  const uint2* src = (const uint2*)(qh + (size_t)row * WGH_QROW);
  uint2 qv[QL];
#pragma unroll
  for (int j = 0; j < QL; j++) qv[j] = src[tid + j * NT];
  const float wv0 = tid < WGH_HEADS ? wq[(size_t)row * WGH_HEADS + tid] : 0.0f;
  const int n = min(lens[row], T);
  if (ROWS) cache += row_base[row];
  float* orow = out + (size_t)row * ld_out;
  for (int t = max(n, 0) + blockIdx.x * NT + tid; t < T; t += gridDim.x * NT) orow[t] = NEG_INF;
  const int npg = (n + WGH_PAGE - 1) / WGH_PAGE;
  if ((int)blockIdx.x * WGS >= npg) return;  // block-uniform
  // Lane (w, g, c) loads key rows 16w + g and 16w + g + 8 of a page: bytes
  // [16c, 16c + 16) and [64 + 16c, 64 + 16c + 16) of each, and their scales.
  uint4 x0, x1, y0, y1;
  float s0, s1;
  auto load = [&](int p) {
    const int page = block_table ? block_table[p] : p;
    const u8* pg = cache + (size_t)page * WGH_PAGE_BYTES;
    const u8* ka = pg + (16 * w + g) * WGH_D + 16 * c;
    // Every key is read once a step: as the weights, evict-first (common.cuh).
    x0 = LD16_ONCE(ka);
    x1 = LD16_ONCE(ka + 64);
    y0 = LD16_ONCE(ka + 8 * WGH_D);
    y1 = LD16_ONCE(ka + 8 * WGH_D + 64);
    const float* scl = (const float*)(pg + WGH_PAGE * WGH_D);
    s0 = scl[16 * w + g];
    s1 = scl[16 * w + g + 8];
  };
  int p = blockIdx.x * WGS + (WGS == 1 ? 0 : tid >> 7);
  const int stride = gridDim.x * WGS;
  if (WGS == 1 || p < npg) load(p);  // in flight during the query's staging
  // B from idx_q_prep's fragment-ordered codes: uint2 i = (mt*8 + ks)*32 +
  // 4*gg + cc holds heads 16mt + gg + 8hi, bytes 2hi + o (dimension P + o,
  // logical k 16ks + 2cc + o) and 4 + 2hi + o (P + 2 + o, logical + 8).
#pragma unroll
  for (int j = 0; j < QL; j++) {
    const int i = tid + j * NT;
    const uint2 v = qv[j];
    const int cc = i & 3, gg = (i >> 2) & 7, ks = (i >> 5) & 7, mt = i >> 8;
    const int k0 = 16 * ks + 2 * cc;
#pragma unroll
    for (int hi = 0; hi < 2; hi++) {
      const int h = 16 * mt + gg + 8 * hi;
      *(u32*)(qb + WGH_OFF(h, k0)) = wgh_cvt(v.x >> (16 * hi));
      *(u32*)(qb + WGH_OFF(h, k0 + 8)) = wgh_cvt(v.y >> (16 * hi));
    }
  }
  if (tid < WGH_HEADS) ws[tid] = wv0;
  if (hist)
    for (int i = tid; i < WGH_BINS; i += NT) hs[i] = 0;
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // B visible to wgmma
  __syncthreads();
  BLOCK_MARK(0);
  u32 qbase;
  asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(qbase) : "l"((const void*)qb));
  for (; p < npg; p += stride) {  // warpgroup-uniform
    const uint4 a0 = x0, a1 = x1, b0 = y0, b1 = y1;
    const float sc0 = s0, sc1 = s1;
    if (p + stride < npg) load(p + stride);
    u32 af[32];
#pragma unroll
    for (int ks = 0; ks < 8; ks++) {
      const u32 wa = wgh_word(ks < 4 ? a0 : a1, ks & 3), wb = wgh_word(ks < 4 ? b0 : b1, ks & 3);
      af[4 * ks + 0] = wgh_cvt(wa);        // key g, logical k 2c, 2c + 1
      af[4 * ks + 1] = wgh_cvt(wb);        // key g + 8
      af[4 * ks + 2] = wgh_cvt(wa >> 16);  // key g, logical k 2c + 8, 2c + 9
      af[4 * ks + 3] = wgh_cvt(wb >> 16);  // key g + 8
    }
    float acc[32];
#pragma unroll
    for (int i = 0; i < 32; i++) acc[i] = 0.0f;
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
    for (int ks = 0; ks < 8; ks++) {
      const u32 addr = qbase + 2048u * ks;
      const u64 db = (u64)((addr & 0x3ffffu) >> 4) | ((u64)(1024u >> 4) << 16) | ((u64)(128u >> 4) << 32);
      wgh_m64n64(acc, af[4 * ks], af[4 * ks + 1], af[4 * ks + 2], af[4 * ks + 3], db);
    }
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
#pragma unroll
    for (int i = 0; i < 32; i++) asm volatile("" : "+f"(acc[i])::"memory");
    // acc[4j + e]: key 16w + g (e = 0, 1) or + 8 (e = 2, 3), head 8j + 2c + (e & 1).
    float t0 = 0.0f, t1 = 0.0f;
#pragma unroll
    for (int j = 0; j < 8; j++) {
      const float2 wv = *(const float2*)&ws[8 * j + 2 * c];
      t0 += wv.x * fmaxf(acc[4 * j], 0.0f) + wv.y * fmaxf(acc[4 * j + 1], 0.0f);
      t1 += wv.x * fmaxf(acc[4 * j + 2], 0.0f) + wv.y * fmaxf(acc[4 * j + 3], 0.0f);
    }
    t0 += __shfl_xor_sync(0xffffffffu, t0, 1);
    t0 += __shfl_xor_sync(0xffffffffu, t0, 2);
    t1 += __shfl_xor_sync(0xffffffffu, t1, 1);
    t1 += __shfl_xor_sync(0xffffffffu, t1, 2);
    const int tk = p * WGH_PAGE + 16 * w + g + (c == 1 ? 8 : 0);
    if (c < 2 && tk < n) {
      const float v = (c == 0 ? t0 : t1) * (c == 0 ? sc0 : sc1);
      orow[tk] = v;
      if (hist) atomicAdd(&hs[float_key(v) >> 20], 1u);
    }
  }
  BLOCK_MARK(1);
  if (hist) {
    __syncthreads();
    u32* gh = hist + (size_t)row * WGH_BINS;
    for (int i = tid; i < WGH_BINS; i += NT)
      if (hs[i]) atomicAdd(&gh[i], hs[i]);
    BLOCK_MARK(2);
  }
}

#endif  // sm_90a: wgh_body

// The kernels' arguments: IndexerScoresMMA's (block_table) or its rows
// form's (row_base). Without sm_90a's wgmma (the module is only built for
// sm_90a) the names stay defined for other targets' compile checks.
#define WGH_ARGS                                                                                                  \
  const u8 *__restrict__ qh, const float *__restrict__ wq, const u8 *__restrict__ cache,                         \
      const int *__restrict__ block_table, const int *__restrict__ lens, float *out, int T, int ld_out, u32 *hist
#define WGH_ROWS_ARGS                                                                                             \
  const u8 *__restrict__ qh, const float *__restrict__ wq, const u8 *__restrict__ cache,                         \
      const long long *__restrict__ row_base, const int *__restrict__ lens, float *out, int T, int ld_out, u32 *hist
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ == 900) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define WGH_RUN(ROWS, WGS, BT, RB) wgh_body<ROWS, WGS>(qh, wq, cache, BT, lens, out, T, ld_out, hist, RB)
#else
#define WGH_RUN(ROWS, WGS, BT, RB) __trap()
#endif

extern "C" __global__ void __launch_bounds__(128, 4) indexer_scores_wgh(WGH_ARGS) {
  PDL_WAIT_MARKED();
  WGH_RUN(false, 1, block_table, nullptr);
}

// indexer_scores_wgh with two warpgroups a block (short rows: a block's
// prologue shared by two pages; kernels.IndexerScoresWGH2).
extern "C" __global__ void __launch_bounds__(256, 2) indexer_scores_wgh2(WGH_ARGS) {
  PDL_WAIT_MARKED();
  WGH_RUN(false, 2, block_table, nullptr);
}

// indexer_scores_wgh over rows of several slots' caches (row r's pages at
// row_base[r] + cache, as indexer_scores_mma_rows).
extern "C" __global__ void __launch_bounds__(128, 4) indexer_scores_wgh_rows(WGH_ROWS_ARGS) {
  PDL_WAIT_MARKED();
  WGH_RUN(true, 1, nullptr, row_base);
}

extern "C" __global__ void __launch_bounds__(256, 2) indexer_scores_wgh2_rows(WGH_ROWS_ARGS) {
  PDL_WAIT_MARKED();
  WGH_RUN(true, 2, nullptr, row_base);
}
