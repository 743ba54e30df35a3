// topk_fast (TILERT_GPU_TOPK_FAST=1; kernels_few.go): topk_radix_one_w's
// selection (the K largest of row[0..n), ascending indices, ties at the
// threshold to the lower indices; n <= K: 0..n-1 then -1; the 12-bit
// histogram read from the scratch and left zeroed) with a shorter chain:
// - 512 threads instead of 1024 (KPT = 16 / 32 / 64 keys a thread in
//   registers for rows up to 8192 / 16384 / 32768 keys): half the warps at
//   each of the ~14 block barriers;
// - every block scan is a warp scan, one barrier, warp 0 scanning the warp
//   totals by shuffles and one barrier (block_excl_scan has each thread
//   loop over all 32 warp totals: ~100 instructions a thread a scan);
// - each scan has its own shared words (no barrier needed between one
//   scan's reads and the next one's writes).
// The digits are topk_radix_one_w's (12-bit bin from the histogram, then 10 +
// 10 bits over the bin's keys), so the threshold, the count of equal keys
// taken and the ordered emit are the same: the same output, element for
// element. tkf_body is generic in the block size NT (256 was the fused tail
// of indexer_scores_topk, removed in session 12: slower).

// The row length, key loads, digit counts and ordered emit are
// topk_radix.cuh's text (which this module's source puts after common.cuh:
// kernels_few.go), shared with topk_radix_one_w.

// Exclusive block scan of v over the NT threads; *tot the block total.
// sh: NT/32 + 1 ints used by this scan alone.
template <int NT>
__device__ __forceinline__ int tkf_scan(int v, int* sh, int* tot) {
  constexpr int NW = NT / 32;
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  int x = v;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int y = __shfl_up_sync(0xffffffffu, x, o);
    if (lane >= o) x += y;
  }
  if (lane == 31) sh[w] = x;
  __syncthreads();
  if (w == 0) {
    const int t = lane < NW ? sh[lane] : 0;
    int y = t;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int u = __shfl_up_sync(0xffffffffu, y, o);
      if (lane >= o) y += u;
    }
    if (lane < NW) sh[lane] = y - t;  // warps before lane's
    if (lane == 31) sh[NW] = y;       // all
  }
  __syncthreads();
  *tot = sh[NW];
  return sh[w] + x - v;
}

// Digit pick over the 1024 digits of h (thread t owns the DPT = 1024/NT
// digits 1023 - DPT t .. from the top): the digit holding the rem-th largest
// key and how many of its keys are still to take, into sres.
template <int NT>
__device__ __forceinline__ void tkf_pick(const u32* h, int rem, int* sh, int* sres) {
  constexpr int DPT = 1024 / NT;
  const int tid = threadIdx.x;
  const int hi = 1023 - DPT * tid;
  int c[DPT];
  int sum = 0;
#pragma unroll
  for (int j = 0; j < DPT; j++) {
    c[j] = (int)h[hi - j];
    sum += c[j];
  }
  int tot;
  const int cum = tkf_scan<NT>(sum, sh, &tot);
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

// The row's scores and histogram are read through L2 (__ldcg): the fused
// tail reads what other blocks of its grid wrote. (The unnamed last
// parameter, always 0, was DIAG, the timing diagnostics removed in session
// 54: kept so the shared arrays' names, and with them the kernels' PTX,
// stay as they were.)
template <int KPT, int NT, int = 0>
__device__ __forceinline__ void tkf_body(const float* __restrict__ scores, int ld, const int* __restrict__ lens, int T,
                                         int K, u32* hist, int* out, int ld_out, int row) {
  constexpr int BPT = TKR_BINS / NT;  // histogram bins a thread (8 or 16)
  __shared__ u32 h[1024];
  __shared__ int shs[4][NT / 32 + 1];
  __shared__ int sres[6];
  const int tid = threadIdx.x;
  const int n = tkr_n(lens, row, T);
  u32* gh = hist + (size_t)row * TKR_BINS;
  int* o = out + (size_t)row * ld_out;
  if (n <= K) {
    for (int j = tid; j < K; j += NT) o[j] = j < n ? j : -1;
    for (int i = tid; i < TKR_BINS; i += NT) gh[i] = 0;
    return;
  }
  const int i0 = tid * KPT;
  const int nv = max(0, min(KPT, n - i0));
  u32 k[KPT];
  tk_load_keys<KPT>(scores + (size_t)row * ld + i0, nv, k);
  // The 12-bit bin: thread t owns bins 4095 - BPT t .. (from the top).
  const int hi = TKR_BINS - 1 - BPT * tid;
  int c[BPT];
#pragma unroll
  for (int q = 0; q < BPT / 4; q++) {
    const uint4 v = __ldcg((const uint4*)(gh + hi - 4 * q - 3));  // bins hi-4q-3 .. hi-4q
    c[4 * q] = (int)v.w;
    c[4 * q + 1] = (int)v.z;
    c[4 * q + 2] = (int)v.y;
    c[4 * q + 3] = (int)v.x;
  }
  int sum = 0;
#pragma unroll
  for (int j = 0; j < BPT; j++) sum += c[j];
  if (tid == 0) sres[0] = 0, sres[1] = 0;  // a histogram of fewer than K keys: bin 0 (no write past K below)
  int tot;
  const int cum = tkf_scan<NT>(sum, shs[0], &tot);  // also orders sres's init before the writes below
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
  for (int i = 0; i < 1024 / NT; i++) h[tid + i * NT] = 0;
  __syncthreads();
  const u32 ub = (u32)sres[0];
  int rem = K - sres[1];
  for (int i = tid; i < TKR_BINS; i += NT) gh[i] = 0;  // every thread read its bins before the scan's barriers
  // Second digit (key bits 19..10) over the bin's keys.
  tk_digit_count<KPT>(k, nv, ub, 10, h);
  __syncthreads();
  tkf_pick<NT>(h, rem, shs[1], sres + 2);  // reads h before its scan's barriers
  __syncthreads();
  const u32 p22 = (ub << 10) | (u32)sres[2];
  rem = sres[3];
#pragma unroll
  for (int i = 0; i < 1024 / NT; i++) h[tid + i * NT] = 0;
  __syncthreads();
  tk_digit_count<KPT>(k, nv, p22, 0, h);
  __syncthreads();
  tkf_pick<NT>(h, rem, shs[2], sres + 4);
  __syncthreads();
  const u32 thr = (p22 << 10) | (u32)sres[4];  // the K-th largest key
  rem = sres[5];                               // how many keys equal to it to take
  const int before = tkf_scan<NT>(tk_counts<KPT>(k, nv, thr), shs[3], &tot);
  tk_emit<KPT>(k, nv, thr, before, rem, K, o, i0);
}

#define TKF_KERNEL(KPT)                                                                                          \
  extern "C" __global__ void __launch_bounds__(512) topk_fast##KPT(                                              \
      const float* __restrict__ scores, int ld, const int* __restrict__ lens, int T, int K, u32* hist, int* out, \
      int ld_out) {                                                                                              \
    PDL_WAIT();                                                                                                  \
    tkf_body<KPT, 512>(scores, ld, lens, T, K, hist, out, ld_out, blockIdx.x);                                   \
  }
TKF_KERNEL(16)
TKF_KERNEL(32)
TKF_KERNEL(64)
