// Top-k of long rows (topk_rows' semantics: the K largest of row[0..n),
// n = min(lens[row], T), ascending indices, ties at the threshold to the
// lower indices; n <= K: 0..n-1 then -1) spread over many blocks per row:
// topk_rows runs one block per row, which at 128K scores is ~340 us.
//
// Four radix passes of 8 bits (shift 24, 16, 8, 0), each a histogram over
// the row by gridDim.x blocks (topk_wide_hist) and a one-block digit pick
// (topk_wide_pick) that updates the row's state and zeroes the histogram
// again; then topk_wide_count (each block counts its chunk's keys above and
// equal to the threshold) and topk_wide_emit (each block adds up the counts
// of the blocks before it and writes its chunk's picks in index order).
// Scratch per row: state (prefix, mask, remaining, done: 4 u32), hist (256),
// counts (2 per block); hist starts zeroed and is left zeroed.

#define TKW_STATE 4
#define TKW_HIST 256

__device__ __forceinline__ int tkw_n(const int* lens, int row, int T) {
  int n = T;
  if (lens && lens[row] < n) n = lens[row];
  return n;
}

extern "C" __global__ void __launch_bounds__(256) topk_wide_hist(const float* __restrict__ scores, int ld,
                                                                 const int* __restrict__ lens, int T, int chunk,
                                                                 int shift, u32* state, u32* hist) {
  PDL_WAIT();
  __shared__ u32 sh[TKW_HIST];
  const int row = blockIdx.y, tid = threadIdx.x;
  u32* st = state + (size_t)row * TKW_STATE;
  if (shift < 24 && st[3]) return;  // done (n <= K)
  const u32 prefix = shift < 24 ? st[0] : 0u, mask = shift < 24 ? st[1] : 0u;
  sh[tid] = 0;
  __syncthreads();
  const int n = tkw_n(lens, row, T);
  const float* x = scores + (size_t)row * ld;
  const int end = min(n, (blockIdx.x + 1) * chunk);
  for (int i = blockIdx.x * chunk + tid; i < end; i += 256) {
    const u32 k = float_key(x[i]);
    if ((k & mask) == prefix) atomicAdd(&sh[(k >> shift) & 255u], 1u);
  }
  __syncthreads();
  if (sh[tid]) atomicAdd(&hist[(size_t)row * TKW_HIST + tid], sh[tid]);
}

// One block of 256 threads per row.
extern "C" __global__ void __launch_bounds__(256) topk_wide_pick(const int* __restrict__ lens, int T, int K,
                                                                 int shift, u32* state, u32* hist, int* out,
                                                                 int ld_out) {
  PDL_WAIT();
  __shared__ u32 h[TKW_HIST];
  const int row = blockIdx.x, tid = threadIdx.x;
  u32* st = state + (size_t)row * TKW_STATE;
  u32* gh = hist + (size_t)row * TKW_HIST;
  h[tid] = gh[tid];
  gh[tid] = 0;  // zeroed for the next pass / call
  if (shift == 24) {
    const int n = tkw_n(lens, row, T);
    if (n <= K) {
      int* o = out + (size_t)row * ld_out;
      for (int j = tid; j < K; j += 256) o[j] = j < n ? j : -1;
      if (tid == 0) st[3] = 1u;
      return;
    }
  } else if (st[3]) {
    return;
  }
  __syncthreads();
  if (tid == 0) {
    u32 prefix = 0, mask = 0;
    int remaining = K;
    if (shift < 24) {
      prefix = st[0];
      mask = st[1];
      remaining = (int)st[2];
    }
    u32 cum = 0;
    int d = 255;
    for (; d > 0; d--) {
      if (cum + h[d] >= (u32)remaining) break;
      cum += h[d];
    }
    st[0] = prefix | ((u32)d << shift);
    st[1] = mask | (255u << shift);
    st[2] = (u32)remaining - cum;
    st[3] = 0u;
  }
}

// Per block: keys above the threshold and keys equal to it in its chunk.
extern "C" __global__ void __launch_bounds__(256) topk_wide_count(const float* __restrict__ scores, int ld,
                                                                  const int* __restrict__ lens, int T, int chunk,
                                                                  const u32* __restrict__ state, int* counts) {
  PDL_WAIT();
  __shared__ int shs[32];
  const int row = blockIdx.y, tid = threadIdx.x;
  const u32* st = state + (size_t)row * TKW_STATE;
  if (st[3]) return;
  const u32 thr = st[0];
  const int n = tkw_n(lens, row, T);
  const float* x = scores + (size_t)row * ld;
  const int end = min(n, (blockIdx.x + 1) * chunk);
  int gt = 0, eq = 0;
  for (int i = blockIdx.x * chunk + tid; i < end; i += 256) {
    const u32 k = float_key(x[i]);
    gt += k > thr;
    eq += k == thr;
  }
  int tot;
  block_excl_scan(gt, shs, &tot);
  const int tgt = tot;
  block_excl_scan(eq, shs, &tot);
  if (tid == 0) {
    counts[((size_t)row * gridDim.x + blockIdx.x) * 2] = tgt;
    counts[((size_t)row * gridDim.x + blockIdx.x) * 2 + 1] = tot;
  }
}

extern "C" __global__ void __launch_bounds__(256) topk_wide_emit(const float* __restrict__ scores, int ld,
                                                                 const int* __restrict__ lens, int T, int chunk,
                                                                 const u32* __restrict__ state,
                                                                 const int* __restrict__ counts, int* out,
                                                                 int ld_out) {
  PDL_WAIT();
  __shared__ int shs[32];
  const int row = blockIdx.y, tid = threadIdx.x;
  const u32* st = state + (size_t)row * TKW_STATE;
  if (st[3]) return;
  const u32 thr = st[0];
  const int remaining = (int)st[2];
  const int n = tkw_n(lens, row, T);
  const float* x = scores + (size_t)row * ld;
  int* o = out + (size_t)row * ld_out;
  // Keys above / equal to the threshold in the blocks before this one.
  int gt_before = 0, eq_before = 0;
  for (int b = tid; b < (int)blockIdx.x; b += 256) {
    gt_before += counts[((size_t)row * gridDim.x + b) * 2];
    eq_before += counts[((size_t)row * gridDim.x + b) * 2 + 1];
  }
  int tot;
  block_excl_scan(gt_before, shs, &tot);
  gt_before = tot;
  block_excl_scan(eq_before, shs, &tot);
  eq_before = tot;
  int eq_taken = min(eq_before, remaining);
  int base = gt_before + eq_taken;
  const int start0 = blockIdx.x * chunk, end = min(n, start0 + chunk);
  for (int start = start0; start < end; start += 256) {
    const int i = start + tid;
    const u32 k = i < end ? float_key(x[i]) : 0u;
    const int gt = (i < end && k > thr) ? 1 : 0;
    const int eq = (i < end && k == thr) ? 1 : 0;
    const int pre = block_excl_scan(gt | (eq << 16), shs, &tot);
    const int pre_gt = pre & 0xffff, pre_eq = pre >> 16;
    const int tot_gt = tot & 0xffff, tot_eq = tot >> 16;
    const int quota = remaining - eq_taken;
    const int eq_b = min(pre_eq, quota);
    if (gt || (eq && pre_eq < quota)) o[base + pre_gt + eq_b] = i;
    const int eq_tile = min(tot_eq, quota);
    base += tot_gt + eq_tile;
    eq_taken += eq_tile;
  }
}
