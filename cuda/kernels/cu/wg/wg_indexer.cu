// indexer_scores_wg: the serving indexer's scores (indexer_scores_mma_pf's
// inputs, outputs and fused histogram) on Hopper's fp8 warpgroup MMA,
// wgmma.mma_async m64n64k32 e4m3 x e4m3 -> f32 (sm_90a; this module).
// Hopper has no e4m3 mma.sync in hardware (ptxas lowers it to f16
// conversions and HMMA: cuda/kernels/NOTES.md), so wgmma is its only fp8
// tensor-core path; its accumulation is the one DeepSeek-V3 reports as
// keeping ~14 bits, which wgi_probe measures on the device.
//
// A block is one warpgroup (128 threads) and takes whole 64-key pages of a
// row (page blockIdx.x, += gridDim.x). The query (64 heads x 128 fp8 codes,
// from idx_q_prep's fragment order) and each page's 64 keys sit in shared
// memory in wgmma's no-swizzle K-major layout, the byte layout of
// mla_prefill_wg's fp16 operands (8-bit types have 8 x 16-byte core
// matrices): byte (r, k) of a 64-row matrix at ((k/16) x 8 + r/8) x 128 +
// (r%8) x 16 + k%16, descriptors LBO 1024 (K), SBO 128 (M/N), each k32 step
// 2048 bytes further. A page is 4 wgmma (k = 0..127) into 32 accumulators a
// thread: warp w's lane (g, c) holds heads 16w+g (+8) of keys 8j+2c (+1),
// j = 0..7 (mma.sync's C fragment per warp). Then ReLU, head weights, the
// sum over g by a shuffle reduce-scatter, over the 4 warps in shared
// memory, the key scale, the histogram. Pages come in by cp.async, the next one in flight while
// this one's products and sums run (two stages).
// NOT yet run on a GPU when written (helper idxf8, session 15).

#define WGI_D 128
#define WGI_PAGE 64
#define WGI_PAGE_BYTES (WGI_PAGE * WGI_D + WGI_PAGE * 4)
#define WGI_QROW 8192
#define WGI_HEADS 64
#define WGI_BINS 4096
// Byte (r, k) of a 64-row K-major fp8 matrix in the no-swizzle layout.
#define WGI_OFF(r, k) (((((k) >> 4) * 8 + ((r) >> 3)) << 7) + (((r) & 7) << 4) + ((k) & 15))

#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ == 900) && defined(__CUDA_ARCH_FEAT_SM90_ALL)

__device__ __forceinline__ void wgi_m64n64k32(float* d, u64 da, u64 db) {
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
      "%32, %33, 1, 1, 1;"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(da), "l"(db)
      : "memory");
}

__device__ __forceinline__ void wgi_m64n8k32(float* d, u64 da, u64 db) {
  asm volatile("wgmma.mma_async.sync.aligned.m64n8k32.f32.e4m3.e4m3 {%0, %1, %2, %3}, %4, %5, 1, 1, 1;"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "l"(da), "l"(db)
               : "memory");
}

// Issue the cp.async copies of one page's keys (into the no-swizzle layout)
// and scales; one commit group per call (empty when page < 0).
__device__ __forceinline__ void wgi_issue(u8* ks, float* sc, const u8* __restrict__ pg) {
  if (pg) {
    const u32 kb = mwg_smem_addr(ks), sb = mwg_smem_addr(sc);
    for (int i = threadIdx.x; i < WGI_PAGE * (WGI_D / 16); i += 128) {
      const int r = i >> 3, ch = i & 7;  // token, 16-byte chunk
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(kb + (u32)WGI_OFF(r, ch * 16)),
                   "l"(pg + r * WGI_D + ch * 16)
                   : "memory");
    }
    if (threadIdx.x < 16)
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(sb + 16u * threadIdx.x),
                   "l"(pg + WGI_PAGE * WGI_D + 16 * threadIdx.x)
                   : "memory");
  }
  asm volatile("cp.async.commit_group;" ::: "memory");
}

// grid (nbx, nq), 128 threads; indexer_scores_mma_pf's arguments. ROWS
// (indexer_scores_wg_rows): row r's pages start at row_base[r] + cache.
template <bool ROWS>
__device__ __forceinline__ void wgi_body(const u8* __restrict__ qh, const float* __restrict__ wq,
                                         const u8* __restrict__ cache, const int* __restrict__ block_table,
                                         const int* __restrict__ lens, float* out, int T, int ld_out, u32* hist,
                                         const long long* __restrict__ row_base) {
  __shared__ __align__(128) u8 qs[WGI_HEADS * WGI_D];     // the query, 8 KB
  __shared__ __align__(128) u8 ks[2][WGI_PAGE * WGI_D];  // two pages' keys, 16 KB
  __shared__ __align__(16) float sc[2][WGI_PAGE];         // their scales
  __shared__ __align__(16) float part[4][WGI_PAGE];       // per-warp head sums
  __shared__ u32 hs[WGI_BINS];                            // histogram (hist != null), 16 KB
  const int row = blockIdx.y, tid = threadIdx.x, lane = tid & 31, w = tid >> 5, g = lane >> 2, c = lane & 3;
  const int n = min(lens[row], T);
  if (ROWS) cache += row_base[row];
  float* orow = out + (size_t)row * ld_out;
  for (int t = max(n, 0) + blockIdx.x * 128 + tid; t < T; t += gridDim.x * 128) orow[t] = NEG_INF;
  const int npages = (n + WGI_PAGE - 1) / WGI_PAGE;
  if ((int)blockIdx.x >= npages) return;  // block-uniform
  auto page = [&](int p) -> const u8* {
    if (p >= npages) return nullptr;
    return cache + (size_t)(block_table ? block_table[p] : p) * WGI_PAGE_BYTES;
  };
  int p = blockIdx.x;
  wgi_issue(ks[0], sc[0], page(p));
  // The query: (h, d..d+3) are two 2-byte pairs of idx_q_prep's entry
  // (h, d) (indexer_mma.cu: bytes 2hi, 2hi+1 and 4+2hi, 4+2hi+1).
  const u8* qr = qh + (size_t)row * WGI_QROW;
  for (int i = tid; i < WGI_HEADS * (WGI_D / 4); i += 128) {
    const int h = i >> 5, d = (i & 31) * 4;
    const int mt = h >> 4, rr = h & 15, hg = rr & 7, hi = rr >> 3, dd = d & 63;
    const int kst = ((d >> 6) << 2) + ((dd & 15) >> 2), cg = dd >> 4;
    const u8* e = qr + ((size_t)((mt * 8 + kst) * 32 + hg * 4 + cg)) * 8;
    *(u32*)(qs + WGI_OFF(h, d)) = (u32)((const u16*)e)[hi] | ((u32)((const u16*)e)[2 + hi] << 16);
  }
  if (hist)
    for (int i = tid; i < WGI_BINS; i += 128) hs[i] = 0;
  const float wlo = wq[(size_t)row * WGI_HEADS + 16 * w + g], whi = wq[(size_t)row * WGI_HEADS + 16 * w + 8 + g];
  const u32 qa = mwg_smem_addr(qs);
  for (int it = 0; p < npages; it++, p += gridDim.x) {
    const int st = it & 1;
    asm volatile("cp.async.wait_group 0;" ::: "memory");
    mwg_fence_async();  // this thread's copies (and the query) visible to wgmma
    __syncthreads();    // everyone's; and every thread is past the last page's reads of the other stage
    wgi_issue(ks[st ^ 1], sc[st ^ 1], page(p + gridDim.x));
    float acc[32];
#pragma unroll
    for (int i = 0; i < 32; i++) acc[i] = 0.0f;
    mwg_pin<32>(acc);
    mwg_wg_fence();
    const u32 kb = mwg_smem_addr(ks[st]);
#pragma unroll
    for (int kk = 0; kk < 4; kk++) wgi_m64n64k32(acc, mwg_desc(qa + 2048u * kk, 1024u, 128u), mwg_desc(kb + 2048u * kk, 1024u, 128u));
    mwg_wg_commit();
    mwg_wg_wait0();
    mwg_pin<32>(acc);
    // v[2j+e]: this lane's two heads of key 8j+2c+e. The sum over g as a
    // reduce-scatter (each step sends the half the partner keeps: 8 + 4 + 2
    // shuffles, not 16 x 3), leaving lane (g, c) keys 8jj+2c (+1) with jj
    // g's bits reversed.
    float v[16];
#pragma unroll
    for (int j = 0; j < 8; j++)
#pragma unroll
      for (int e = 0; e < 2; e++) v[2 * j + e] = wlo * fmaxf(acc[4 * j + e], 0.0f) + whi * fmaxf(acc[4 * j + 2 + e], 0.0f);
    const bool b0 = g & 1, b1 = g & 2, b2 = g & 4;
    float u[8], x4[4], x2[2];
#pragma unroll
    for (int i = 0; i < 8; i++) u[i] = (b0 ? v[8 + i] : v[i]) + __shfl_xor_sync(0xffffffffu, b0 ? v[i] : v[8 + i], 4);
#pragma unroll
    for (int i = 0; i < 4; i++) x4[i] = (b1 ? u[4 + i] : u[i]) + __shfl_xor_sync(0xffffffffu, b1 ? u[i] : u[4 + i], 8);
#pragma unroll
    for (int i = 0; i < 2; i++) x2[i] = (b2 ? x4[2 + i] : x4[i]) + __shfl_xor_sync(0xffffffffu, b2 ? x4[i] : x4[2 + i], 16);
    const int jj = 4 * (g & 1) + (g & 2) + ((g >> 2) & 1);
    *(float2*)&part[w][8 * jj + 2 * c] = make_float2(x2[0], x2[1]);
    __syncthreads();
    if (tid < WGI_PAGE) {
      const int t = p * WGI_PAGE + tid;
      if (t < n) {
        const float v = (((part[0][tid] + part[1][tid]) + part[2][tid]) + part[3][tid]) * sc[st][tid];
        orow[t] = v;
        if (hist) atomicAdd(&hs[float_key(v) >> 20], 1u);
      }
    }
  }
  if (hist) {
    __syncthreads();
    u32* gh = hist + (size_t)row * WGI_BINS;
    for (int i = tid; i < WGI_BINS; i += 128)
      if (hs[i]) atomicAdd(&gh[i], hs[i]);
  }
}

extern "C" __global__ void __launch_bounds__(128) indexer_scores_wg(const u8* __restrict__ qh,
                                                                    const float* __restrict__ wq,
                                                                    const u8* __restrict__ cache,
                                                                    const int* __restrict__ block_table,
                                                                    const int* __restrict__ lens, float* out, int T,
                                                                    int ld_out, u32* hist) {
  PDL_WAIT();
  wgi_body<false>(qh, wq, cache, block_table, lens, out, T, ld_out, hist, nullptr);
}

extern "C" __global__ void __launch_bounds__(128) indexer_scores_wg_rows(const u8* __restrict__ qh,
                                                                         const float* __restrict__ wq,
                                                                         const u8* __restrict__ cache,
                                                                         const long long* __restrict__ row_base,
                                                                         const int* __restrict__ lens, float* out,
                                                                         int T, int ld_out, u32* hist) {
  PDL_WAIT();
  wgi_body<true>(qh, wq, cache, nullptr, lens, out, T, ld_out, hist, row_base);
}

// One wgmma m64n8k32 e4m3 of a warpgroup per iteration (check only): a
// [64][32] and b [8][32] (row n: column n's k values) e4m3 bytes, c and d
// [64][8] f32 row-major; d = a.b^T + c in the instruction's arithmetic, to
// measure its accumulation (the f8_mma_probe cases). 128 threads.
extern "C" __global__ void __launch_bounds__(128) wgi_probe(const u8* __restrict__ a, const u8* __restrict__ b,
                                                            const float* __restrict__ c, float* d, int count) {
  __shared__ __align__(128) u8 as[64 * 32];
  __shared__ __align__(128) u8 bs[8 * 32];
  const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5, g = lane >> 2, q = lane & 3;
  for (int it = blockIdx.x; it < count; it += gridDim.x) {
    __syncthreads();  // the previous iteration's wgmma is done with as / bs
    for (int i = tid; i < 64 * 32; i += 128) as[WGI_OFF(i >> 5, i & 31)] = a[(size_t)it * 64 * 32 + i];
    // 8 rows: one core-matrix row group, so (n, k) at (k/16) x 128 + n x 16 + k%16.
    for (int i = tid; i < 8 * 32; i += 128) bs[((i & 31) >> 4) * 128 + (i >> 5) * 16 + (i & 15)] = b[(size_t)it * 8 * 32 + i];
    mwg_fence_async();
    __syncthreads();
    const float* C = c + (size_t)it * 64 * 8;
    const int r0 = 16 * w + g;
    float acc[4] = {C[r0 * 8 + 2 * q], C[r0 * 8 + 2 * q + 1], C[(r0 + 8) * 8 + 2 * q], C[(r0 + 8) * 8 + 2 * q + 1]};
    mwg_pin<4>(acc);
    mwg_wg_fence();
    wgi_m64n8k32(acc, mwg_desc(mwg_smem_addr(as), 1024u, 128u), mwg_desc(mwg_smem_addr(bs), 128u, 128u));
    mwg_wg_commit();
    mwg_wg_wait0();
    mwg_pin<4>(acc);
    float* D = d + (size_t)it * 64 * 8;
    D[r0 * 8 + 2 * q] = acc[0];
    D[r0 * 8 + 2 * q + 1] = acc[1];
    D[(r0 + 8) * 8 + 2 * q] = acc[2];
    D[(r0 + 8) * 8 + 2 * q + 1] = acc[3];
  }
}
#else
// Without sm_90a's wgmma (the module is only built for sm_90a; this keeps
// a host or other-arch parse of the file valid).
extern "C" __global__ void __launch_bounds__(128) indexer_scores_wg(const u8* qh, const float* wq, const u8* cache,
                                                                    const int* block_table, const int* lens, float* out,
                                                                    int T, int ld_out, u32* hist) {
  __trap();
}
extern "C" __global__ void __launch_bounds__(128) indexer_scores_wg_rows(const u8* qh, const float* wq, const u8* cache,
                                                                         const long long* row_base, const int* lens,
                                                                         float* out, int T, int ld_out, u32* hist) {
  __trap();
}
extern "C" __global__ void __launch_bounds__(128) wgi_probe(const u8* a, const u8* b, const float* c, float* d, int count) {
  __trap();
}
#endif
