// topk_cl (TILERT_GPU_IDX_LONG; kernels_few.go TopKClusterAfterHist):
// topk_fast's selection (topk_radix_one's: the K largest of row[0..n),
// ascending indices, ties at the threshold to the lower indices; n <= K:
// 0..n-1 then -1; the 12-bit histogram read from the scratch and left
// zeroed) for rows too long for one block: a cluster of TKC_CL blocks a
// row, block r holding keys [r * 512 KPT, (r + 1) * 512 KPT) in registers
// (KPT a multiple of 4 from 8 to 64: the engine's rows are 256-key length
// buckets, 131328 at 131072 tokens and more, so 40 rather than 64).
// Each digit's counts are summed over the cluster's shared memory
// (distributed shared memory, barrier.cluster), so every block picks the
// same digits as one block holding the whole row would; the ordered emit
// offsets block r by the keys the blocks before it take. The chain is
// topk_fast's plus four cluster barriers, where topk_radix_mark_l (the
// long rows' path before) runs a grid-wide counter, global lists and a
// one-block final stage. This file follows topk_fast.cu in the module
// (name order): tkf_scan and tkf_pick's digit order are its.

#define TKC_CL 8
#define TKC_NT 512

// barrier.cluster's default semantics are arrive = release, wait = acquire
// (PTX 7.8, NVRTC 11.8, takes no explicit .release / .acquire).
__device__ __forceinline__ void tkc_arrive() { asm volatile("barrier.cluster.arrive.aligned;" ::: "memory"); }
__device__ __forceinline__ void tkc_wait() { asm volatile("barrier.cluster.wait.aligned;" ::: "memory"); }
__device__ __forceinline__ void tkc_sync() {
  tkc_arrive();
  tkc_wait();
}

// The u32 at p (this block's shared memory) in block rank's copy.
__device__ __forceinline__ u32 tkc_ld(const void* p, u32 rank) {
  const u32 a = (u32)__cvta_generic_to_shared(p);
  u32 r, v;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(rank));
  asm volatile("ld.shared::cluster.u32 %0, [%1];" : "=r"(v) : "r"(r) : "memory");
  return v;
}

// tkf_pick over the cluster's summed counts of the 1024 digits in h.
__device__ __forceinline__ void tkc_pick(const u32* h, int rem, int* sh, int* sres) {
  constexpr int DPT = 1024 / TKC_NT;
  const int hi = 1023 - DPT * (int)threadIdx.x;
  int c[DPT];
  int sum = 0;
#pragma unroll
  for (int j = 0; j < DPT; j++) {
    u32 s = 0;
#pragma unroll
    for (int r = 0; r < TKC_CL; r++) s += tkc_ld(h + hi - j, (u32)r);
    c[j] = (int)s;
    sum += c[j];
  }
  int tot;
  const int cum = tkf_scan<TKC_NT>(sum, sh, &tot);
  if (cum < rem && cum + sum >= rem) {
    int a = cum, d = hi;
#pragma unroll
    for (int j = 0; j < DPT; j++) {
      if (a + c[j] >= rem) break;
      a += c[j];
      d--;
    }
    sres[0] = d;
    sres[1] = rem - a;
  }
}

template <int KPT>
__device__ __forceinline__ void tkc_body(const float* __restrict__ scores, int ld, const int* __restrict__ lens, int T,
                                         int K, u32* hist, int* out, int ld_out) {
  constexpr int NT = TKC_NT, BPT = TKR_BINS / NT;
  __shared__ u32 h2[1024], h3[1024];  // this block's digit counts (read by the cluster)
  __shared__ int shs[4][NT / 32 + 1];
  __shared__ int sres[6];
  __shared__ int tots[2];  // this block's keys above / equal to the threshold (read by the cluster)
  const int tid = threadIdx.x, rank = blockIdx.x, row = blockIdx.y;
  const int n = tkr_n(lens, row, T);
  u32* gh = hist + (size_t)row * TKR_BINS;
  int* o = out + (size_t)row * ld_out;
  if (n <= K) {  // cluster-uniform: no block touches another's memory
    if (rank == 0) {
      for (int j = tid; j < K; j += NT) o[j] = j < n ? j : -1;
      for (int i = tid; i < TKR_BINS; i += NT) gh[i] = 0;
    }
    return;
  }
  const int i0 = (rank * NT + tid) * KPT;
  const int nv = max(0, min(KPT, n - i0));
  u32 k[KPT];
  tk_load_keys<KPT>(scores + (size_t)row * ld + i0, nv, k);
  // The 12-bit bin (tkf_body's), in every block from the same histogram.
  const int hi = TKR_BINS - 1 - BPT * tid;
  int c[BPT];
#pragma unroll
  for (int q = 0; q < BPT / 4; q++) {
    const uint4 v = __ldcg((const uint4*)(gh + hi - 4 * q - 3));
    c[4 * q] = (int)v.w;
    c[4 * q + 1] = (int)v.z;
    c[4 * q + 2] = (int)v.y;
    c[4 * q + 3] = (int)v.x;
  }
  int sum = 0;
#pragma unroll
  for (int j = 0; j < BPT; j++) sum += c[j];
  if (tid == 0) sres[0] = 0, sres[1] = 0;
  int tot;
  const int cum = tkf_scan<NT>(sum, shs[0], &tot);
  if (cum < K && cum + sum >= K) {
    int a = cum, bb = hi;
#pragma unroll
    for (int j = 0; j < BPT; j++) {
      if (a + c[j] >= K) break;
      a += c[j];
      bb--;
    }
    sres[0] = bb;
    sres[1] = a;
  }
#pragma unroll
  for (int i = 0; i < 1024 / NT; i++) h2[tid + i * NT] = h3[tid + i * NT] = 0;
  __syncthreads();
  const u32 ub = (u32)sres[0];
  int rem = K - sres[1];
  // Second digit (key bits 19..10) over the bin's keys, summed over the
  // cluster. After this barrier every block has read the histogram: rank 0
  // clears it.
  tk_digit_count<KPT>(k, nv, ub, 10, h2);
  tkc_sync();
  if (rank == 0)
    for (int i = tid; i < TKR_BINS; i += NT) gh[i] = 0;
  tkc_pick(h2, rem, shs[1], sres + 2);
  __syncthreads();
  const u32 p22 = (ub << 10) | (u32)sres[2];
  rem = sres[3];
  tk_digit_count<KPT>(k, nv, p22, 0, h3);
  tkc_sync();
  tkc_pick(h3, rem, shs[2], sres + 4);
  __syncthreads();
  const u32 thr = (p22 << 10) | (u32)sres[4];  // the K-th largest key
  rem = sres[5];                               // how many keys equal to it to take
  // Ordered emit: the block's scan (above thr in the high half, equal in the
  // low half: at most 512 KPT <= 32768 keys a block), then the blocks
  // before this one's totals.
  int btot;
  const int before = tkf_scan<NT>(tk_counts<KPT>(k, nv, thr), shs[3], &btot);
  if (tid == 0) tots[0] = btot >> 16, tots[1] = btot & 0xffff;
  tkc_sync();
  int sel_off = 0, eq_off = 0;
  for (int r = 0; r < rank; r++) {
    sel_off += (int)tkc_ld(&tots[0], (u32)r);
    eq_off += (int)tkc_ld(&tots[1], (u32)r);
  }
  tkc_arrive();  // done reading the cluster's shared memory; wait before exit
  int eq_before = (before & 0xffff) + eq_off;
  int pos = (before >> 16) + sel_off + min(eq_before, rem);
#pragma unroll
  for (int j = 0; j < KPT; j++) {
    if (j < nv) {
      bool take = k[j] > thr;
      if (k[j] == thr) {
        take = eq_before < rem;
        eq_before++;
      }
      if (take) {
        if (pos < K) o[pos] = i0 + j;
        pos++;
      }
    }
  }
  tkc_wait();
}

#define TKC_KERNEL(KPT)                                                                                          \
  extern "C" __cluster_dims__(TKC_CL, 1, 1) __global__ void __launch_bounds__(TKC_NT) topk_cl##KPT(              \
      const float* __restrict__ scores, int ld, const int* __restrict__ lens, int T, int K, u32* hist, int* out, \
      int ld_out) {                                                                                              \
    PDL_WAIT();                                                                                                  \
    tkc_body<KPT>(scores, ld, lens, T, K, hist, out, ld_out);                                                    \
  }
TKC_KERNEL(8)
TKC_KERNEL(12)
TKC_KERNEL(16)
TKC_KERNEL(24)
TKC_KERNEL(32)
TKC_KERNEL(40)
TKC_KERNEL(48)
TKC_KERNEL(64)
