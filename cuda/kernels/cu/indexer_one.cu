// Scores and top-k of long rows in one launch (TILERT_GPU_IDX_ONE=1):
// indexer_topk_one is indexer_scores_mma_pf (idx_scores_body<true>, called
// unchanged: the same scores and histogram, bit for bit) followed, in the
// same grid, by topk_radix_mark_l's selection, element for element.
//
// The grid is one wave (the launcher sizes it from the occupancy query), so
// every block of a row is resident and the row's blocks can meet at grid
// barriers (a ticket counter and a spin; no cooperative launch): a block
// that spins only waits for blocks that are already running. Nothing else
// holds an SM while waiting on this kernel: it is launched plainly and
// triggers its programmatic dependents only after the last barrier.
//
// Block b of a row's nb blocks scores the 128-key segments s = b + k*nb
// (idx_scores_body's warps take groups b*8 + w + k*8*nb), so the row's
// index order is the segment order. Per row:
//   1. scores + the 4096-bin histogram (the body), barrier 1;
//   2. every block finds the threshold bin Tb from the finished histogram,
//      publishes each of its segments' count of keys above Tb and appends
//      its keys in Tb (index, key) to the row's list, barrier 2;
//   3. every block reads the whole list (hist[Tb] entries; in registers up
//      to IDX1_CAP, else three passes over it in L2) and refines the exact
//      K-th largest key thr and how many keys equal to it to take (rem), the
//      same two 10-bit digits as mark_l; then its segments' output offsets:
//      keys > thr before the segment (the published counts plus the list's)
//      + min(keys == thr before it, rem), and it writes its selected indices
//      in index order.
// Scratch (a TopKRadix scratch; left zeroed): hist [rows][4096] (cleared by
// the blocks after barrier 2), segment counts in the "sure" bitmap rows
// [rows][ldw], four counters a row in the l2 rows [rows][1024] (barriers,
// exit ticket, list allocator), the list in the list rows [rows][ldl]; the
// last block of a row to finish clears the counters, counts and list.

#define IDX1_KMAX 2048  // keys a block holds (16 segments of 128)
#define IDX1_CAP 4096   // list entries held in registers (16 a thread)

__device__ __forceinline__ u32 idx1_ld_acquire(const u32* p) {
  u32 v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// Grid barrier of the nb blocks sharing ctr (cooperative groups' pattern:
// the block's writes are ordered by bar.sync, published by thread 0's
// fence and ticket). ctr is cleared by the row's last block at exit.
__device__ __forceinline__ void idx1_bar(u32* ctr, u32 nb) {
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    atomicAdd(ctr, 1u);
    while (idx1_ld_acquire(ctr) < nb) {
    }
    __threadfence();
  }
  __syncthreads();
}

// Radix pick over the block (256 threads): thread t holds the counts c[i]
// of digits top - NP + 1 + i, threads in descending digit order. The
// thread whose digit holds the rem-th largest key writes sres[0] = digit,
// sres[1] = rem - (keys in the digits above it), sres[2] = its count. The
// caller syncs before reading (block_excl_scan syncs before the writes).
template <int NP>
__device__ __forceinline__ void idx1_pick(const u32* c, int top, int rem, int* shs, int* sres) {
  int sum = 0;
#pragma unroll
  for (int i = 0; i < NP; i++) sum += (int)c[i];
  if (threadIdx.x == 0) sres[0] = 0, sres[1] = 0, sres[2] = 0;
  int tot;
  int cum = block_excl_scan(sum, shs, &tot);
  if (cum < rem && cum + sum >= rem) {
#pragma unroll
    for (int i = NP - 1; i >= 0; i--) {
      const int ci = (int)c[i];
      if (cum < rem && cum + ci >= rem) {
        sres[0] = top - (NP - 1) + i;
        sres[1] = rem - cum;
        sres[2] = ci;
      }
      cum += ci;
    }
  }
}

// grid (nb, nq), 256 threads; nb * nq blocks co-resident, at most
// IDX1_KMAX keys a block (the launcher's plan). scores: [nq][ld], as
// indexer_scores_mma_pf writes them; out: [nq][ld_out] selections.
extern "C" __global__ void __launch_bounds__(256, 2) indexer_topk_one(
    const u8* __restrict__ qh, const float* __restrict__ wq, const u8* __restrict__ cache,
    const int* __restrict__ block_table, const int* __restrict__ lens, float* scores, int T, int ld, int K, u32* hist,
    u32* segc, int ldw, u32* ctl, uint2* list, int ldl, int* out, int ld_out) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");  // a no-op in a plain launch
#endif
  __shared__ u32 keys[IDX1_KMAX];
  __shared__ u32 h[1024];
  __shared__ int shs[32];
  __shared__ int sres[3];
  __shared__ int sbase;
  __shared__ u32 sAbove[16], sPre[16], dG[17], dE[17];
  __shared__ int wc[2][8][2];
  const int row = blockIdx.y, tid = threadIdx.x, lane = tid & 31, wid = tid >> 5;
  const int b = blockIdx.x, nb = gridDim.x;
  const int n = min(lens[row], T);
  const bool sel_row = n > K;  // row-uniform
  idx_scores_body<true>(qh, wq, cache, block_table, lens, scores, T, ld, sel_row ? hist : nullptr);
  int* o = out + (size_t)row * ld_out;
  if (!sel_row) {
    // Dense: 0..n-1 then -1 (no histogram was built for this row).
    if (b == 0)
      for (int j = tid; j < K; j += 256) o[j] = j < n ? j : -1;
    return;
  }
  u32* gh = hist + (size_t)row * IDXM_BINS;
  u32* c = ctl + (size_t)row * 1024;  // [0] barrier 1, [1] barrier 2, [2] exit ticket, [3] list allocator
  u32* sc = segc + (size_t)row * ldw;
  uint2* lst = list + (size_t)row * ldl;
  const float* x = scores + (size_t)row * ld;
  idx1_bar(c + 0, (u32)nb);  // also makes this block's score writes visible to its threads

  // Threshold bin from the finished histogram (thread t: bins 4080 - 16t ..
  // 4095 - 16t), its loads issued before the block's keys are staged
  // (segments s = b + kk*nb < nseg, from the block's own score writes).
  const int nseg = (n + 127) >> 7;
  const int myseg = b < nseg ? (nseg - 1 - b) / nb + 1 : 0;
  const int nk = myseg * 128;
  {
    u32 hc[16];
    const uint4* hp = (const uint4*)(gh + IDXM_BINS - 16 * (tid + 1));
#pragma unroll
    for (int q = 0; q < 4; q++) {
      const uint4 v = __ldcg(hp + q);
      hc[4 * q] = v.x;
      hc[4 * q + 1] = v.y;
      hc[4 * q + 2] = v.z;
      hc[4 * q + 3] = v.w;
    }
    float kv[IDX1_KMAX / 256];  // all of a thread's loads in flight at once
#pragma unroll
    for (int i = 0; i < IDX1_KMAX / 256; i++) {
      const int j = tid + 256 * i, t = (b + (j >> 7) * nb) * 128 + (j & 127);
      kv[i] = j < nk && t < n ? x[t] : 0.0f;
    }
#pragma unroll
    for (int i = 0; i < IDX1_KMAX / 256; i++)
      if (tid + 256 * i < nk) keys[tid + 256 * i] = float_key(kv[i]);
    if (tid < 16) sAbove[tid] = 0;
    idx1_pick<16>(hc, IDXM_BINS - 1 - 16 * tid, K, shs, sres);
  }
  __syncthreads();
  const u32 tb = (u32)sres[0];
  int rem = sres[1];      // keys still to take from bin tb
  const int C = sres[2];  // keys in bin tb: the list's length
  // Keys above tb per segment (a warp's 32 keys lie in one segment) and the
  // bin's keys for the list.
  int ncand = 0;
  for (int j = tid; j < nk; j += 256) {
    const int t = (b + (j >> 7) * nb) * 128 + (j & 127);
    const u32 bin = keys[j] >> TKR_SHIFT;
    const u32 m = __ballot_sync(0xffffffffu, t < n && bin > tb);
    if (lane == 0 && m) atomicAdd(&sAbove[j >> 7], (u32)__popc(m));
    ncand += t < n && bin == tb;
  }
  int tot;
  int at = block_excl_scan(ncand, shs, &tot);
  if (tid == 0) sbase = tot ? (int)atomicAdd(c + 3, (u32)tot) : 0;
  __syncthreads();
  at += sbase;
  if (ncand)
    for (int j = tid; j < nk; j += 256) {
      const int t = (b + (j >> 7) * nb) * 128 + (j & 127);
      const u32 k = keys[j];
      if (t < n && (k >> TKR_SHIFT) == tb) lst[at++] = make_uint2((u32)t, k);
    }
  if (tid < myseg) sc[b + tid * nb] = sAbove[tid];
  idx1_bar(c + 1, (u32)nb);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  // Every block of the grid is past its last wait: a dependent launched now
  // cannot hold an SM that one of them needs.
  asm volatile("griddepcontrol.launch_dependents;");
#endif
  // Every block has read the histogram: clear a slice of it.
  for (int i = b * IDXM_BINS / nb + tid; i < (b + 1) * IDXM_BINS / nb; i += 256) gh[i] = 0;

  // The list, in registers when short.
  const bool fast = C <= IDX1_CAP;  // row-uniform
  uint2 e[16];
  if (fast) {
#pragma unroll
    for (int m = 0; m < 16; m++) {
      const int i = tid + 256 * m;
      e[m] = i < C ? __ldcg(lst + i) : make_uint2(0u, 0u);
    }
  }
  auto each = [&](auto&& f) {
    if (fast) {
#pragma unroll
      for (int m = 0; m < 16; m++)
        if (tid + 256 * m < C) f(e[m]);
    } else {
      for (int i = tid; i < C; i += 256) f(__ldcg(lst + i));
    }
  };
  // Second digit (key bits 19..10), then the third over the keys with the
  // 22-bit prefix (thread t: digits 1020 - 4t .. 1023 - 4t).
  for (int i = tid; i < 1024; i += 256) h[i] = 0;
  __syncthreads();
  each([&](uint2 v) { atomicAdd(&h[(v.y >> 10) & 1023u], 1u); });
  __syncthreads();
  {
    u32 hc[4];
#pragma unroll
    for (int i = 0; i < 4; i++) hc[i] = h[1020 - 4 * tid + i];
    idx1_pick<4>(hc, 1023 - 4 * tid, rem, shs, sres);
  }
  __syncthreads();
  const u32 p22 = (tb << 10) | (u32)sres[0];
  rem = sres[1];
  for (int i = tid; i < 1024; i += 256) h[i] = 0;
  if (tid < 17) dG[tid] = 0, dE[tid] = 0;
  __syncthreads();
  each([&](uint2 v) {
    if ((v.y >> 10) == p22) atomicAdd(&h[v.y & 1023u], 1u);
  });
  __syncthreads();
  {
    u32 hc[4];
#pragma unroll
    for (int i = 0; i < 4; i++) hc[i] = h[1020 - 4 * tid + i];
    idx1_pick<4>(hc, 1023 - 4 * tid, rem, shs, sres);
  }
  __syncthreads();
  const u32 thr = (p22 << 10) | (u32)sres[0];  // the K-th largest key
  rem = sres[1];                                // how many keys equal to it to take
  // The list's keys above / equal to thr before each of this block's
  // segments: an entry in segment s counts for the segments kk with
  // b + kk*nb > s (a difference array over kk).
  each([&](uint2 v) {
    const bool gt = v.y > thr, eq = v.y == thr;
    if (gt || eq) {
      const int s = (int)(v.x >> 7);
      const int kmin = s >= b ? (s - b) / nb + 1 : 0;
      if (kmin < myseg) atomicAdd(gt ? &dG[kmin] : &dE[kmin], 1u);
    }
  });
  // Keys above tb in the segments before each of this block's: a scan of
  // the published counts (thread t: a run of per segments).
  {
    const int per = (nseg + 255) >> 8, s0 = min(nseg, tid * per), s1 = min(nseg, s0 + per);
    int sum = 0;
    for (int s = s0; s < s1; s++) sum += (int)__ldcg(sc + s);
    int run = block_excl_scan(sum, shs, &tot);
    for (int s = s0; s < s1; s++) {
      if (s >= b && (s - b) % nb == 0) sPre[(s - b) / nb] = (u32)run;
      run += (int)__ldcg(sc + s);
    }
  }
  __syncthreads();
  if (tid == 0) {
    u32 g = 0, q = 0;
    for (int kk = 0; kk < myseg; kk++) {
      g += dG[kk];
      q += dE[kk];
      dG[kk] = g;  // inclusive over kk: the entries before segment kk
      dE[kk] = q;
    }
  }
  __syncthreads();
  // Ordered emit, two segments a pass (threads 0-127, 128-255).
  for (int j0 = 0; j0 < nk; j0 += 256) {
    const int j = j0 + tid, kk = j >> 7, half = tid >> 7, par = (j0 >> 8) & 1;
    const int t = (b + kk * nb) * 128 + (j & 127);
    const u32 k = j < nk ? keys[j] : 0u;
    const bool ok = j < nk && t < n;
    const bool gt = ok && k > thr, eq = ok && k == thr;
    const u32 gm = __ballot_sync(0xffffffffu, gt), em = __ballot_sync(0xffffffffu, eq);
    if (lane == 0) wc[par][wid][0] = __popc(gm), wc[par][wid][1] = __popc(em);
    __syncthreads();
    if (gt || eq) {
      const u32 lt = (1u << lane) - 1u;
      int gb = __popc(gm & lt), eb = __popc(em & lt);
      for (int w = half * 4; w < wid; w++) gb += wc[par][w][0], eb += wc[par][w][1];
      gb += (int)(sPre[kk] + dG[kk]);
      eb += (int)dE[kk];
      const int pos = gb + min(eb, rem);
      if ((gt || eb < rem) && pos < K) o[pos] = t;
    }
  }
  // The row's last block clears the list, the counts and the counters.
  __syncthreads();
  if (tid == 0) {
    __threadfence();
    sbase = atomicAdd(c + 2, 1u) == (u32)(nb - 1);
  }
  __syncthreads();
  if (!sbase) return;
  __threadfence();
  for (int i = tid; i < C; i += 256) lst[i] = make_uint2(0u, 0u);
  for (int s = tid; s < nseg; s += 256) sc[s] = 0;
  if (tid < 4) c[tid] = 0;
}
