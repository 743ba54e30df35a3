// indexer_scores_topk (TILERT_GPU_TOPK_FAST=2; kernels_few.go): the
// tensor-core indexer scores with their fused 12-bit histogram
// (indexer_mma.cu's idx_scores_body, unchanged: the same scores, bit for
// bit) and the top-k selection in one launch: every block, after its
// scores and its histogram adds, fences and takes a ticket of its row; the
// row's last block runs topk_fast's selection (tkf_body, 256 threads, KPT
// keys a thread: rows up to 256 * KPT keys) on the row's scores and
// histogram, read through L2, and resets the ticket. No second launch, no
// 512-thread block start: the selection starts as soon as the row's last
// scores are written. The same selection as topk_radix_one, element for
// element; the histogram and the tickets are left zeroed (graph replays).
// grid (nbx, nq), 256 threads; cnt: a ticket per row (zeroed).
template <bool ROWS, int KPT>
__device__ __forceinline__ void tkx_body(const u8* __restrict__ qh, const float* __restrict__ wq,
                                         const u8* __restrict__ cache, const int* __restrict__ block_table,
                                         const long long* __restrict__ row_base, const int* __restrict__ lens,
                                         float* out, int T, int ld_out, u32* hist, u32* cnt, int K, int* sel,
                                         int ld_sel) {
  __shared__ int last;
  idx_scores_body<true, ROWS>(qh, wq, cache, block_table, lens, out, T, ld_out, hist, row_base);
  __threadfence();  // this block's scores and histogram adds before its ticket
  __syncthreads();
  if (threadIdx.x == 0) {
    const u32 v = atomicAdd(&cnt[blockIdx.y], 1u);
    last = v == gridDim.x - 1;
    if (v == gridDim.x - 1) cnt[blockIdx.y] = 0u;  // every block of the row has taken its ticket
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  tkf_body<KPT, 256>(out, ld_out, lens, T, K, hist, sel, ld_sel, blockIdx.y);
}

#define TKX_KERNEL(KPT)                                                                                             \
  extern "C" __global__ void __launch_bounds__(256, 2) indexer_scores_topk##KPT(                                   \
      const u8* __restrict__ qh, const float* __restrict__ wq, const u8* __restrict__ cache,                       \
      const int* __restrict__ block_table, const int* __restrict__ lens, float* out, int T, int ld_out, u32* hist, \
      u32* cnt, int K, int* sel, int ld_sel) {                                                                     \
    PDL_WAIT();                                                                                                     \
    tkx_body<false, KPT>(qh, wq, cache, block_table, nullptr, lens, out, T, ld_out, hist, cnt, K, sel, ld_sel);    \
  }                                                                                                                 \
  extern "C" __global__ void __launch_bounds__(256, 2) indexer_scores_topk_rows##KPT(                              \
      const u8* __restrict__ qh, const float* __restrict__ wq, const u8* __restrict__ cache,                       \
      const long long* __restrict__ row_base, const int* __restrict__ lens, float* out, int T, int ld_out,         \
      u32* hist, u32* cnt, int K, int* sel, int ld_sel) {                                                          \
    PDL_WAIT();                                                                                                     \
    tkx_body<true, KPT>(qh, wq, cache, nullptr, row_base, lens, out, T, ld_out, hist, cnt, K, sel, ld_sel);        \
  }
TKX_KERNEL(32)
TKX_KERNEL(48)
TKX_KERNEL(64)
