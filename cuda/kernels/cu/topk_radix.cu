// Top-k of long rows in two launches (topk_rows' semantics: the K largest
// of row[0..n), n = min(lens[row], T), ascending indices, ties at the
// threshold to the lower indices; n <= K: 0..n-1 then -1):
//   topk_radix_hist  many blocks per row: histogram of the top 12 bits of the
//                    order-preserving key (4096 bins) into the row's scratch
//                    (indexer_scores_mma can build it instead, fused);
//   topk_radix_mark  many blocks per row: find the bin b holding the K-th
//                    largest key, write two bitmaps over the row: "sure"
//                    (bin > b, all selected) and "candidate" (bin == b).
//                    The last block of the row to finish (a counter) then
//                    runs the final stage: two 10-bit radix passes over the
//                    candidates alone give the exact threshold key and how
//                    many keys equal to it to take, and one ordered sweep
//                    over the bitmaps writes the selection.
// Scratch: hist [rows][4096], counters [rows], then the bitmaps
// [rows][cdiv(T, 32)] twice. Zeroed before the first use; every call leaves
// all of it zeroed again (the final stage clears the histogram and the
// bitmap words it read, the last block its counter), so calls with other
// row counts or lengths, and graph replays, find it clean.

// TKR_BINS, TKR_SHIFT, tkr_n and the one-block top-k's key loads, digit
// counts and ordered emit: topk_radix.cuh, shared with the few module's
// topk_fast.

// radix_pick: each of the block's 1024 threads owns one 10-bit digit dg,
// counted cntd times among the keys still in play, digits taken from the
// top; the thread whose digit holds the rem-th largest key writes that
// digit and how many of its keys are still to take to sres (the caller
// syncs before reading them).
__device__ __forceinline__ void radix_pick(int dg, int cntd, int rem, int* shs, int* sres) {
  int tot;
  const int cum = block_excl_scan(cntd, shs, &tot);
  if (cum < rem && cum + cntd >= rem) {
    sres[0] = dg;
    sres[1] = rem - cum;
  }
}

// The bin b (of h, TKR_BINS counts in global memory) holding the K-th
// largest key, and the count of keys in bins above it. Every thread of the
// block (1024 threads) gets the result.
__device__ __forceinline__ void tkr_find_bin(const u32* h, int K, int* shs, int* sres, int* bin, int* above) {
  const int tid = threadIdx.x;
  // Thread tid owns the 4 bins of rank tid from the top.
  const int hi = TKR_BINS - 1 - tid * 4;
  const uint4 v = *(const uint4*)(h + hi - 3);  // bins hi-3 .. hi
  const int c0 = (int)v.w, c1 = (int)v.z, c2 = (int)v.y, c3 = (int)v.x;
  const int sum = c0 + c1 + c2 + c3;
  // A histogram of fewer than K keys (not its row's: a caller broke the
  // contract) leaves bin 0; the emit below never writes past K.
  if (tid == 0) sres[0] = 0, sres[1] = 0;
  int tot;
  const int cum = block_excl_scan(sum, shs, &tot);  // keys in the bins above mine
  if (cum < K && cum + sum >= K) {
    int bb, ab;
    if (cum + c0 >= K) {
      bb = hi, ab = cum;
    } else if (cum + c0 + c1 >= K) {
      bb = hi - 1, ab = cum + c0;
    } else if (cum + c0 + c1 + c2 >= K) {
      bb = hi - 2, ab = cum + c0 + c1;
    } else {
      bb = hi - 3, ab = cum + c0 + c1 + c2;
    }
    sres[0] = bb;
    sres[1] = ab;
  }
  __syncthreads();
  *bin = sres[0];
  *above = sres[1];
  __syncthreads();
}

// grid (nb, rows), 256 threads; chunk a multiple of 256.
extern "C" __global__ void __launch_bounds__(256) topk_radix_hist(const float* __restrict__ scores, int ld,
                                                                  const int* __restrict__ lens, int T, int K,
                                                                  int chunk, u32* hist) {
  PDL_WAIT();
  __shared__ u32 sh[TKR_BINS];
  const int row = blockIdx.y, tid = threadIdx.x;
  const int n = tkr_n(lens, row, T);
  if (n <= K) return;
  const int start = blockIdx.x * chunk, end = min(n, start + chunk);
  if (start >= end) return;
  for (int i = tid; i < TKR_BINS; i += 256) sh[i] = 0;
  __syncthreads();
  const float* x = scores + (size_t)row * ld;
  for (int i = start + tid; i < end; i += 256) atomicAdd(&sh[float_key(x[i]) >> TKR_SHIFT], 1u);
  __syncthreads();
  u32* gh = hist + (size_t)row * TKR_BINS;
  for (int i = tid; i < TKR_BINS; i += 256)
    if (sh[i]) atomicAdd(&gh[i], sh[i]);
}

// The final stage of a row (one block of 1024 threads, after every mark
// block of the row): b, above from the histogram; h: 1024 u32 of shared
// memory.
__device__ __forceinline__ void tkr_final(const float* __restrict__ x, int n, int K, int b, int above, u32* gh, u32* sw, u32* cw,
                          int* o, u32* h, int* shs, int* sres) {
  const int tid = threadIdx.x;
  __syncthreads();
  for (int i = tid; i < TKR_BINS; i += blockDim.x) gh[i] = 0;
  const int nw = (n + 31) >> 5;
  u32 prefix = (u32)b << TKR_SHIFT, mask = 0xfffu << TKR_SHIFT;
  int rem = K - above;  // keys still to take from the candidates
  for (int shift = 10; shift >= 0; shift -= 10) {
    h[tid] = 0;
    __syncthreads();
    for (int w = tid; w < nw; w += 1024) {
      u32 m = __ldcg(cw + w);
      while (m) {
        const int bit = __ffs(m) - 1;
        m &= m - 1;
        const u32 k = float_key(x[(w << 5) + bit]);
        if ((k & mask) == prefix) atomicAdd(&h[(k >> shift) & 1023u], 1u);
      }
    }
    __syncthreads();
    // Digit from the top: thread tid owns digit 1023 - tid.
    radix_pick(1023 - tid, (int)h[1023 - tid], rem, shs, sres);
    __syncthreads();
    prefix |= (u32)sres[0] << shift;
    mask |= 1023u << shift;
    rem = sres[1];
    __syncthreads();
  }
  // prefix is the K-th largest key; take every key above it and the first
  // rem equal ones. Each thread owns a run of whole words, in order.
  const int per = (nw + 1023) >> 10, w0 = min(nw, tid * per), w1 = min(nw, w0 + per);
  const u32 thr = prefix;
  int nsel = 0, neq = 0;
  for (int w = w0; w < w1; w++) {
    u32 s = __ldcg(sw + w), e = 0, m = __ldcg(cw + w);
    while (m) {
      const int bit = __ffs(m) - 1;
      m &= m - 1;
      const u32 k = float_key(x[(w << 5) + bit]);
      if (k > thr) s |= 1u << bit;
      if (k == thr) e |= 1u << bit;
    }
    nsel += __popc(s);
    neq += __popc(e);
  }
  int tot;
  const int sel_before = block_excl_scan(nsel, shs, &tot);
  int eq_before = block_excl_scan(neq, shs, &tot);
  int pos = sel_before + min(eq_before, rem);
  for (int w = w0; w < w1; w++) {
    u32 s = __ldcg(sw + w), e = 0, m = __ldcg(cw + w);
    sw[w] = 0;  // left zeroed for the next call
    cw[w] = 0;
    while (m) {
      const int bit = __ffs(m) - 1;
      m &= m - 1;
      const u32 k = float_key(x[(w << 5) + bit]);
      if (k > thr) s |= 1u << bit;
      if (k == thr) e |= 1u << bit;
    }
    u32 all = s | e;
    while (all) {
      const int bit = __ffs(all) - 1;
      const u32 bm = 1u << bit;
      all &= all - 1;
      if (s & bm) {
        if (pos < K) o[pos] = (w << 5) + bit;
        pos++;
      } else {
        if (eq_before < rem) {
          if (pos < K) o[pos] = (w << 5) + bit;
          pos++;
        }
        eq_before++;
      }
    }
  }
}

// grid (nb, rows), 1024 threads; chunk a multiple of 1024 (whole bitmap
// words), nb * chunk >= T. cnt: a counter per row.
extern "C" __global__ void __launch_bounds__(1024) topk_radix_mark(const float* __restrict__ scores, int ld,
                                                                   const int* __restrict__ lens, int T, int K,
                                                                   int chunk, u32* hist, u32* cnt, u32* sure,
                                                                   u32* cand, int ldw, int* out, int ld_out) {
  PDL_WAIT();
  __shared__ u32 h[1024];
  __shared__ int shs[32];
  __shared__ int sres[2];
  __shared__ int last;
  const int row = blockIdx.y, tid = threadIdx.x, lane = tid & 31;
  const int n = tkr_n(lens, row, T);
  u32* gh = hist + (size_t)row * TKR_BINS;
  int* o = out + (size_t)row * ld_out;
  if (n <= K) {
    if (blockIdx.x == 0) {
      for (int j = tid; j < K; j += blockDim.x) o[j] = j < n ? j : -1;
      // A longer row of the same launch may share the scores kernel's
      // histogram: clear this row's.
      for (int i = tid; i < TKR_BINS; i += blockDim.x) gh[i] = 0;
    }
    return;
  }
  const int start = blockIdx.x * chunk, end = min(n, start + chunk);
  if (start >= end) return;
  int b, above;
  tkr_find_bin(gh, K, shs, sres, &b, &above);
  const float* x = scores + (size_t)row * ld;
  u32* sw = sure + (size_t)row * ldw;
  u32* cw = cand + (size_t)row * ldw;
  for (int base = start; base < end; base += 1024) {
    const int i = base + tid;
    const int kb = i < end ? (int)(float_key(x[i]) >> TKR_SHIFT) : -1;
    const u32 s = __ballot_sync(0xffffffffu, kb > b);
    const u32 cm = __ballot_sync(0xffffffffu, kb == b);
    if (lane == 0 && i < end) {
      sw[i >> 5] = s;
      cw[i >> 5] = cm;
    }
  }
  // The last block of the row to get here runs the final stage.
  __threadfence();
  __syncthreads();
  if (tid == 0) last = atomicAdd(&cnt[row], 1u) == (u32)((n + chunk - 1) / chunk - 1);
  __syncthreads();
  if (!last) return;
  __threadfence();
  if (tid == 0) cnt[row] = 0;
  tkr_final(x, n, K, b, above, gh, sw, cw, o, h, shs, sres);
}


// tkr_final with the row's bitmaps staged in shared memory (sws, cws: nw
// words each) and, when the threshold bin holds at most cap keys, those
// keys gathered once into a list (ci, ck): the radix passes and the
// marking then touch global memory only for that one gather.
__device__ __forceinline__ void tkr_final_s(const float* __restrict__ x, int n, int K, int b, int above, u32* gh,
                                            u32* sw, u32* cw, int* o, u32* h, int* shs, int* sres, u32* sws,
                                            u32* cws, int* ci, u32* ck, int cap) {
  const int tid = threadIdx.x;
  __syncthreads();
  for (int i = tid; i < TKR_BINS; i += blockDim.x) gh[i] = 0;
  const int nw = (n + 31) >> 5;
  for (int w = tid; w < nw; w += 1024) {
    sws[w] = __ldcg(sw + w);
    cws[w] = __ldcg(cw + w);
  }
  for (int w = tid; w < nw; w += 1024) {
    sw[w] = 0;  // left zeroed for the next call
    cw[w] = 0;
  }
  __syncthreads();
  const int per = (nw + 1023) >> 10, w0 = min(nw, tid * per), w1 = min(nw, w0 + per);
  int c = 0;
  for (int w = w0; w < w1; w++) c += __popc(cws[w]);
  int C;
  int j = block_excl_scan(c, shs, &C);
  const bool list = C <= cap;  // block-uniform
  if (list) {
    for (int w = w0; w < w1; w++) {
      u32 m = cws[w];
      while (m) {
        const int bit = __ffs(m) - 1;
        m &= m - 1;
        ci[j++] = (w << 5) + bit;
      }
    }
    __syncthreads();
    for (int i = tid; i < C; i += 1024) ck[i] = float_key(x[ci[i]]);
    __syncthreads();
  }
  u32 prefix = (u32)b << TKR_SHIFT, mask = 0xfffu << TKR_SHIFT;
  int rem = K - above;  // keys still to take from the candidates
  for (int shift = 10; shift >= 0; shift -= 10) {
    h[tid] = 0;
    __syncthreads();
    if (list) {
      for (int i = tid; i < C; i += 1024) {
        const u32 k = ck[i];
        if ((k & mask) == prefix) atomicAdd(&h[(k >> shift) & 1023u], 1u);
      }
    } else {
      for (int w = tid; w < nw; w += 1024) {
        u32 m = cws[w];
        while (m) {
          const int bit = __ffs(m) - 1;
          m &= m - 1;
          const u32 k = float_key(x[(w << 5) + bit]);
          if ((k & mask) == prefix) atomicAdd(&h[(k >> shift) & 1023u], 1u);
        }
      }
    }
    __syncthreads();
    radix_pick(1023 - tid, (int)h[1023 - tid], rem, shs, sres);
    __syncthreads();
    prefix |= (u32)sres[0] << shift;
    mask |= 1023u << shift;
    rem = sres[1];
    __syncthreads();
  }
  const u32 thr = prefix;
  // sws: every selected key (sure, or above thr); cws: the keys equal to thr.
  if (list) {
    for (int w = w0; w < w1; w++) cws[w] = 0;
    __syncthreads();
    for (int i = tid; i < C; i += 1024) {
      const u32 k = ck[i];
      const int idx = ci[i];
      if (k > thr) atomicOr(&sws[idx >> 5], 1u << (idx & 31));
      if (k == thr) atomicOr(&cws[idx >> 5], 1u << (idx & 31));
    }
  } else {
    for (int w = w0; w < w1; w++) {
      u32 s = sws[w], e = 0, m = cws[w];
      while (m) {
        const int bit = __ffs(m) - 1;
        m &= m - 1;
        const u32 k = float_key(x[(w << 5) + bit]);
        if (k > thr) s |= 1u << bit;
        if (k == thr) e |= 1u << bit;
      }
      sws[w] = s;
      cws[w] = e;
    }
  }
  __syncthreads();
  int nsel = 0, neq = 0;
  for (int w = w0; w < w1; w++) {
    nsel += __popc(sws[w]);
    neq += __popc(cws[w]);
  }
  int tot;
  const int sel_before = block_excl_scan(nsel, shs, &tot);
  int eq_before = block_excl_scan(neq, shs, &tot);
  int pos = sel_before + min(eq_before, rem);
  for (int w = w0; w < w1; w++) {
    const u32 s = sws[w], e = cws[w];
    u32 all = s | e;
    while (all) {
      const int bit = __ffs(all) - 1;
      const u32 bm = 1u << bit;
      all &= all - 1;
      if (s & bm) {
        if (pos < K) o[pos] = (w << 5) + bit;
        pos++;
      } else {
        if (eq_before < rem) {
          if (pos < K) o[pos] = (w << 5) + bit;
          pos++;
        }
        eq_before++;
      }
    }
  }
}

// topk_radix_mark with the final stage in shared memory: dynamic shared
// memory of (2 * ldw + 2 * cap) u32 (bitmaps, then the candidate list).
extern "C" __global__ void __launch_bounds__(1024) topk_radix_mark_s(const float* __restrict__ scores, int ld,
                                                                     const int* __restrict__ lens, int T, int K,
                                                                     int chunk, u32* hist, u32* cnt, u32* sure,
                                                                     u32* cand, int ldw, int* out, int ld_out,
                                                                     int cap) {
  PDL_WAIT();
  extern __shared__ u32 tkr_dyn[];
  __shared__ u32 h[1024];
  __shared__ int shs[32];
  __shared__ int sres[2];
  __shared__ int last;
  const int row = blockIdx.y, tid = threadIdx.x, lane = tid & 31;
  const int n = tkr_n(lens, row, T);
  u32* gh = hist + (size_t)row * TKR_BINS;
  int* o = out + (size_t)row * ld_out;
  if (n <= K) {
    if (blockIdx.x == 0) {
      for (int j = tid; j < K; j += blockDim.x) o[j] = j < n ? j : -1;
      for (int i = tid; i < TKR_BINS; i += blockDim.x) gh[i] = 0;
    }
    return;
  }
  const int start = blockIdx.x * chunk, end = min(n, start + chunk);
  if (start >= end) return;
  int b, above;
  tkr_find_bin(gh, K, shs, sres, &b, &above);
  const float* x = scores + (size_t)row * ld;
  u32* sw = sure + (size_t)row * ldw;
  u32* cw = cand + (size_t)row * ldw;
  for (int base = start; base < end; base += 1024) {
    const int i = base + tid;
    const int kb = i < end ? (int)(float_key(x[i]) >> TKR_SHIFT) : -1;
    const u32 s = __ballot_sync(0xffffffffu, kb > b);
    const u32 cm = __ballot_sync(0xffffffffu, kb == b);
    if (lane == 0 && i < end) {
      sw[i >> 5] = s;
      cw[i >> 5] = cm;
    }
  }
  __threadfence();
  __syncthreads();
  if (tid == 0) last = atomicAdd(&cnt[row], 1u) == (u32)((n + chunk - 1) / chunk - 1);
  __syncthreads();
  if (!last) return;
  __threadfence();
  if (tid == 0) cnt[row] = 0;
  u32* sws = tkr_dyn;
  u32* cws = sws + ldw;
  int* ci = (int*)(cws + ldw);
  u32* ck = (u32*)(ci + cap);
  tkr_final_s(x, n, K, b, above, gh, sw, cw, o, h, shs, sres, sws, cws, ci, ck, cap);
}

// The list top-k's mark blocks after the bin b is known (topk_radix_mark_l
// and _lw; the names in scope): each 1024-key tile's "sure" bits, the
// threshold bin's keys appended to the row's list with their second digits
// counted in h, the counts added to g2, then the ticket; only the row's
// last block goes on, its counter reset. A statement macro, not a
// function, so that mark_l's code stays what the H200 ran.
#define TKR_MARK_LIST()                                                                 \
  for (int base = start; base < end; base += 1024) {                                    \
    const int i = base + tid;                                                           \
    u32 k = 0;                                                                          \
    int kb = -1;                                                                        \
    if (i < end) {                                                                      \
      k = float_key(x[i]);                                                              \
      kb = (int)(k >> TKR_SHIFT);                                                       \
    }                                                                                   \
    const u32 s = __ballot_sync(0xffffffffu, kb > b);                                   \
    const bool c = kb == b;                                                             \
    const u32 cm = __ballot_sync(0xffffffffu, c);                                       \
    if (lane == 0 && i < end) sw[i >> 5] = s; /* lane 0: the warp's lowest index */    \
    if (c) atomicAdd(&h[(k >> 10) & 1023u], 1u);                                        \
    if (lane == 0) woff[wid] = __popc(cm);                                              \
    __syncthreads();                                                                    \
    if (wid == 0) {                                                                     \
      const int v = woff[lane];                                                         \
      int incl = v;                                                                     \
_Pragma("unroll")                                                                       \
      for (int d = 1; d < 32; d <<= 1) {                                                \
        const int y = __shfl_up_sync(0xffffffffu, incl, d);                             \
        if (lane >= d) incl += y;                                                       \
      }                                                                                 \
      const int tot = __shfl_sync(0xffffffffu, incl, 31);                               \
      int at = 0;                                                                       \
      if (lane == 0 && tot > 0) at = (int)atomicAdd(ccnt + row, (u32)tot);              \
      at = __shfl_sync(0xffffffffu, at, 0);                                             \
      woff[lane] = at + incl - v;                                                       \
    }                                                                                   \
    __syncthreads();                                                                    \
    if (c) lst[woff[wid] + __popc(cm & ((1u << lane) - 1u))] = make_uint2((u32)i, k);   \
  }                                                                                     \
  __syncthreads();                                                                      \
  if (h[tid]) atomicAdd(&g2[tid], h[tid]);                                              \
  __threadfence();                                                                      \
  __syncthreads();                                                                      \
  if (tid == 0) last = atomicAdd(&cnt[row], 1u) == (u32)((n + chunk - 1) / chunk - 1);  \
  __syncthreads();                                                                      \
  if (!last) return;                                                                    \
  __threadfence();                                                                      \
  if (tid == 0) cnt[row] = 0;

// The ordered emit with keys equal to the threshold to split (mark_l and
// _lw; the names in scope): thread words [w0, w1), sure bits from sws, equal
// keys from cws, the first rem of those by index taken; pos and eq_before
// the thread's scans. A statement macro, as TKR_MARK_LIST.
#define TKR_EMIT_EQ()                                       \
  for (int w = w0; w < w1; w++) {                           \
    const u32 s = sws[w], e = cws[w];                       \
    u32 all = s | e;                                        \
    while (all) {                                           \
      const int bit = __ffs(all) - 1;                       \
      const u32 bm = 1u << bit;                             \
      all &= all - 1;                                       \
      if (s & bm) {                                         \
        if (pos < K) o[pos] = (w << 5) + bit;               \
        pos++;                                              \
      } else {                                              \
        if (eq_before < rem) {                              \
          if (pos < K) o[pos] = (w << 5) + bit;             \
          pos++;                                            \
        }                                                   \
        eq_before++;                                        \
      }                                                     \
    }                                                       \
  }

// topk_radix_mark with a candidate list instead of the candidate bitmap:
// each mark block appends the keys of the threshold bin to the row's list
// (index, key; one atomic per 1024-key tile) and adds their next 10 key
// bits to the row's second-level histogram. The last block then reads the
// second digit from that histogram, refines the third over the list
// (coalesced; no bitmap walk, no gather of scores) and sweeps the list once
// more to mark the selected candidates in its shared-memory copy of the
// "sure" bitmap before the ordered emit. Narrow score distributions (a bin
// holding many keys) cost two list passes instead of serial walks.
// Scratch beyond topk_radix_mark's: l2 [rows][1024], ccnt [rows], list
// [rows][ldl] (ldl >= T), all left zeroed (the list's used entries too).
// Dynamic shared memory: 2 * ldw u32.
extern "C" __global__ void __launch_bounds__(1024) topk_radix_mark_l(const float* __restrict__ scores, int ld,
                                                                     const int* __restrict__ lens, int T, int K,
                                                                     int chunk, u32* hist, u32* cnt, u32* sure,
                                                                     int ldw, u32* l2, u32* ccnt, uint2* list, int ldl,
                                                                     int* out, int ld_out) {
  PDL_WAIT();
  extern __shared__ u32 tkr_dyn[];
  __shared__ u32 h[1024];
  __shared__ int shs[32];
  __shared__ int sres[2];
  __shared__ int woff[32];
  __shared__ int last;
  const int row = blockIdx.y, tid = threadIdx.x, lane = tid & 31, wid = tid >> 5;
  const int n = tkr_n(lens, row, T);
  u32* gh = hist + (size_t)row * TKR_BINS;
  int* o = out + (size_t)row * ld_out;
  if (n <= K) {
    if (blockIdx.x == 0) {
      for (int j = tid; j < K; j += blockDim.x) o[j] = j < n ? j : -1;
      for (int i = tid; i < TKR_BINS; i += blockDim.x) gh[i] = 0;
    }
    return;
  }
  const int start = blockIdx.x * chunk, end = min(n, start + chunk);
  if (start >= end) return;
  int b, above;
  tkr_find_bin(gh, K, shs, sres, &b, &above);
  h[tid] = 0;
  __syncthreads();
  const float* x = scores + (size_t)row * ld;
  u32* sw = sure + (size_t)row * ldw;
  u32* g2 = l2 + (size_t)row * 1024;
  uint2* lst = list + (size_t)row * ldl;
  TKR_MARK_LIST()
  // Final stage.
  u32* sws = tkr_dyn;
  u32* cws = sws + ldw;
  for (int i = tid; i < TKR_BINS; i += 1024) gh[i] = 0;
  const int nw = (n + 31) >> 5;
  for (int w = tid; w < nw; w += 1024) {
    sws[w] = __ldcg(sw + w);
    cws[w] = 0;
    sw[w] = 0;  // left zeroed for the next call
  }
  // Second digit (key bits 19..10) from the mark blocks' histogram.
  int rem = K - above;  // keys still to take from the threshold bin
  {
    const int dg = 1023 - tid;
    const int cntd = (int)__ldcg(g2 + dg);
    g2[dg] = 0;
    radix_pick(dg, cntd, rem, shs, sres);
  }
  const int C = (int)__ldcg(ccnt + row);
  h[tid] = 0;
  __syncthreads();
  if (tid == 0) ccnt[row] = 0;
  const u32 p22 = ((u32)b << 10) | (u32)sres[0];  // key >> 10 of the threshold
  rem = sres[1];
  // Third digit over the list; candidates above the 22-bit prefix are in.
  for (int i = tid; i < C; i += 1024) {
    const uint2 e = __ldcg(lst + i);
    const u32 hi = e.y >> 10;
    if (hi == p22) {
      atomicAdd(&h[e.y & 1023u], 1u);
    } else if (hi > p22) {
      atomicOr(&sws[e.x >> 5], 1u << (e.x & 31));
    }
  }
  __syncthreads();
  radix_pick(1023 - tid, (int)h[1023 - tid], rem, shs, sres);
  __syncthreads();
  const u32 thr = (p22 << 10) | (u32)sres[0];  // the K-th largest key
  rem = sres[1];                                // how many keys equal to it to take
  for (int i = tid; i < C; i += 1024) {
    const uint2 e = __ldcg(lst + i);
    // Left zeroed, as the rest of the scratch: the layout moves with the
    // row count and length, so another call's histograms may lie here.
    lst[i] = make_uint2(0u, 0u);
    if ((e.y >> 10) == p22) {
      if (e.y > thr) atomicOr(&sws[e.x >> 5], 1u << (e.x & 31));
      if (e.y == thr) atomicOr(&cws[e.x >> 5], 1u << (e.x & 31));
    }
  }
  __syncthreads();
  // Ordered emit (tkr_final_s's).
  const int per = (nw + 1023) >> 10, w0 = min(nw, tid * per), w1 = min(nw, w0 + per);
  int nsel = 0, neq = 0;
  for (int w = w0; w < w1; w++) {
    nsel += __popc(sws[w]);
    neq += __popc(cws[w]);
  }
  int tot;
  const int sel_before = block_excl_scan(nsel, shs, &tot);
  int eq_before = block_excl_scan(neq, shs, &tot);
  int pos = sel_before + min(eq_before, rem);
  TKR_EMIT_EQ()
}

// topk_radix_one_w8/16/32: the whole selection of a row of n <= 1024 * KPT
// keys in one block (grid: rows; 1024 threads), after its 12-bit histogram
// (the scores kernel's, fused, or topk_radix_hist's), for the decode step's
// critical path. Thread t holds keys [t*KPT, (t+1)*KPT) in registers, so
// the chain is one round trip, up to three radix digits (bin from the
// histogram, then 10 + 10 bits over the bin's keys) and the ordered emit
// (topk_radix.cuh's): no mark blocks, global atomics, ticket or second
// launch. The histogram is left zeroed. Its first version (topk_radix_one,
// block_excl_scan's scans, both 10-bit passes always: ~30% of its
// instructions in the scans' second level, half its warps without keys on
// rows of half its capacity) was removed in session 22 (13.40 -> 6.19 us
// after the histogram at 8192 keys; NOTES.md "topk_radix_one_w").
// Here:
// - rows of n <= 512 * KPT keys take the KPT / 2 body (every warp holds
//   keys; the engine's 8192-key rows in an 8448-key bucket: 8 a thread);
// - the bin: warp totals by redux, one barrier, each warp's prefix from one
//   shared load and one redux, a lane scan in the one warp holding the K-th
//   key, one barrier; each thread zeroes the 4 histogram bins it read;
// - a digit pick is one warp's: the 32 group sums of 32 digits, a shuffle
//   scan, then the crossing group's 32 digits and a second shuffle scan;
//   both digit histograms are zeroed before the first barrier;
// - a pass is skipped when the bin (or digit) before it is taken whole:
//   the selection is then every key >= that prefix, exactly K keys, the
//   same set with no ties to split (random rows: the second 10-bit pass
//   almost never runs);
// - the emit: a lane scan of the per-thread counts, warp totals by redux,
//   one barrier, each warp's prefix by redux; without ties to split, each
//   thread stores its keys >= the prefix in order with no per-key bound
//   check when its warp's run ends by K (always, for a histogram that
//   keeps the contract).

// Sum over the full warp (redux.sync on sm_80+).
__device__ __forceinline__ int tkw_warp_sum(int v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  int r;
  asm volatile("redux.sync.add.s32 %0, %1, 0xffffffff;" : "=r"(r) : "r"(v));
  return r;
#else
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
#endif
}

// Inclusive scan over the full warp, lane order.
__device__ __forceinline__ int tkw_warp_incl(int x, int lane) {
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int y = __shfl_up_sync(0xffffffffu, x, o);
    if (lane >= o) x += y;
  }
  return x;
}

// One warp, all lanes: the digit of h (1024 counts, digit 1023 the top)
// holding the rem-th largest counted key. res[0] = the digit, res[1] = how
// many of its keys are still to take, res[2] = its count. Fewer than rem
// keys counted (only a histogram that broke the contract) leaves res as it
// was.
__device__ __forceinline__ void tkw_pick(const u32* h, int rem, int* res) {
  const int lane = threadIdx.x & 31;
  // Lane l sums group l from the top (digits 1023 - 32 l down to 992 - 32 l)
  // as 8 uint4 in a lane-rotated order: 4 lanes a bank quad, the 4
  // wavefronts a warp's 512 bytes take anyway.
  const uint4* g = (const uint4*)(h + 992 - 32 * lane);
  int s = 0;
#pragma unroll
  for (int q = 0; q < 8; q++) {
    const uint4 v = g[(q + lane) & 7];
    s += (int)(v.x + v.y + v.z + v.w);
  }
  const int incl = tkw_warp_incl(s, lane);
  const u32 m = __ballot_sync(0xffffffffu, incl >= rem);
  if (m == 0) return;
  const int L = __ffs(m) - 1;                                 // the group holding it
  const int r = rem - __shfl_sync(0xffffffffu, incl - s, L);  // 1 .. its sum
  const int d = 1023 - 32 * L - lane;                         // lane j: its j-th digit from the top
  const int c = (int)h[d];
  const int incl2 = tkw_warp_incl(c, lane);
  const u32 m2 = __ballot_sync(0xffffffffu, incl2 >= r);  // lane 31's incl2 is the group's sum >= r
  if (lane == __ffs(m2) - 1) {
    res[0] = d;
    res[1] = r - (incl2 - c);
    res[2] = c;
  }
}

struct TkwShared {
  u32 a[1024];  // the second digit's counts (key bits 19..10)
  u32 b[1024];  // the third digit's (bits 9..0); a and b: the emit's 2048-index stage after
  int wt[32];   // warp totals: the bin search
  int we[32];   // warp totals: the emit
  int res[9];   // bin, keys above it, its count; then digit, still to take, its count, twice
};

// Exclusive scan of v over the block (v >= 0, the sum < 2^31; 1 barrier):
// the lane scan, warp totals by redux into we, each warp's prefix by redux.
// *wend: the sum up to the end of this thread's warp.
__device__ __forceinline__ int tkw_scan(int v, int* we, int* wend) {
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  const int incl = tkw_warp_incl(v, lane);
  const int wt = tkw_warp_sum(v);
  if (lane == 0) we[w] = wt;
  __syncthreads();
  const int pre = tkw_warp_sum(lane < w ? we[lane] : 0);
  *wend = pre + wt;
  return pre + incl - v;
}

// Warp-uniform: some lane of this thread's warp holds keys of a row of n
// (read from threadIdx each time: the 32-key body has no register to keep
// it in).
template <int KPT>
__device__ __forceinline__ bool tkw_act(int n) {
  return (int)(threadIdx.x & ~31u) * KPT < n;
}

// tk_load_keys without the key map: the scores' bits (j < nv; 0 past nv),
// so that nothing waits on them before their first use.
template <int KPT>
__device__ __forceinline__ void tkw_load_raw(const float* x, int nv, u32* k) {
  if (nv == KPT && ((size_t)x & 15) == 0) {
#pragma unroll
    for (int j = 0; j < KPT; j += 4) {
      const float4 v = __ldcg((const float4*)(x + j));
      k[j] = __float_as_uint(v.x);
      k[j + 1] = __float_as_uint(v.y);
      k[j + 2] = __float_as_uint(v.z);
      k[j + 3] = __float_as_uint(v.w);
    }
  } else {
#pragma unroll
    for (int j = 0; j < KPT; j++) k[j] = j < nv ? __float_as_uint(__ldcg(x + j)) : 0u;
  }
}

// hv: this thread's 4 histogram bins from the top, hi .. hi - 3 (loaded
// by tkw_body before the row length). PRE: kp holds the thread's keys
// already (tkw_body loaded them with the histogram, up to T: a key past n
// is garbage here and 0 once mapped below, as the load would have left it).
template <int KPT, bool PRE = false, bool ST = true>
__device__ __forceinline__ void tkw_core(const float* __restrict__ x, int n, int K, u32* gh, const uint4 hv, int* o,
                                         TkwShared& sh, const u32* kp = nullptr) {
  const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
  const int i0 = tid * KPT;
  const int nv = max(0, min(KPT, n - i0));  // this thread's valid keys
  const int hi = TKR_BINS - 1 - 4 * tid;
  // The keys arrive while the bin is found (it needs the histogram alone);
  // they are mapped after it.
  u32 k[KPT];
  if constexpr (PRE) {
#pragma unroll
    for (int j = 0; j < KPT; j++) k[j] = kp[j];
  } else {
    tkw_load_raw<KPT>(x + i0, nv, k);
  }
  // Bin counts are <= n <= 32768: two a register across the barrier (the
  // 32-key body has no registers to spare).
  const u32 c01 = hv.w | (hv.z << 16), c23 = hv.y | (hv.x << 16);
  const int sum = (int)(hv.x + hv.y + hv.z + hv.w);
  const int wsum = tkw_warp_sum(sum);
  sh.a[tid] = 0;
  sh.b[tid] = 0;
  if (lane == 0) sh.wt[w] = wsum;
  // A histogram of fewer than K keys (a caller broke the contract) finds
  // no bin: bin 0, then every valid key taken (never a write past K).
  if (tid < 9) sh.res[tid] = 0;
  __syncthreads();
  BLOCK_MARK(0);
  *(uint4*)(gh + hi - 3) = make_uint4(0u, 0u, 0u, 0u);  // bins this thread alone read (and summed): left zeroed
  {
    const int pre = tkw_warp_sum(lane < w ? sh.wt[lane] : 0);  // keys in the warps above mine
    if (pre < K && pre + wsum >= K) {                          // the one warp holding the K-th largest key
      const int cum = pre + tkw_warp_incl(sum, lane) - sum;
      if (cum < K && cum + sum >= K) {
        const int c0 = (int)(c01 & 0xffffu), c1 = (int)(c01 >> 16), c2 = (int)(c23 & 0xffffu), c3 = (int)(c23 >> 16);
        int bb, ab, cb;
        if (cum + c0 >= K) {
          bb = hi, ab = cum, cb = c0;
        } else if (cum + c0 + c1 >= K) {
          bb = hi - 1, ab = cum + c0, cb = c1;
        } else if (cum + c0 + c1 + c2 >= K) {
          bb = hi - 2, ab = cum + c0 + c1, cb = c2;
        } else {
          bb = hi - 3, ab = cum + c0 + c1 + c2, cb = c3;
        }
        sh.res[0] = bb;
        sh.res[1] = ab;
        sh.res[2] = cb;
      }
    }
  }
  __syncthreads();
  BLOCK_MARK(1);
  const u32 ub = (u32)sh.res[0];
  int rem = K - sh.res[1];  // keys still to take from bin ub
#pragma unroll
  for (int j = 0; j < KPT; j++) k[j] = j < nv ? float_key(__uint_as_float(k[j])) : 0u;  // tk_load_keys' keys
  BLOCK_MARK(2);
  // The selection: every valid key >= lo; with tie, every key > thr and the
  // first rem keys equal to it, in index order.
  u32 lo = ub << TKR_SHIFT, thr = 0;
  bool tie = false;
  if (rem != sh.res[2]) {  // block-uniform: the bin is not taken whole
    if (tkw_act<KPT>(n)) tk_digit_count<KPT>(k, nv, ub, 10, sh.a);
    __syncthreads();
    if (w == 0) tkw_pick(sh.a, rem, sh.res + 3);
    __syncthreads();
    BLOCK_MARK(3);
    const u32 p22 = (ub << 10) | (u32)sh.res[3];
    rem = sh.res[4];
    lo = p22 << 10;
    if (rem != sh.res[5]) {  // the digit is not taken whole
      if (tkw_act<KPT>(n)) tk_digit_count<KPT>(k, nv, p22, 0, sh.b);
      __syncthreads();
      if (w == 0) tkw_pick(sh.b, rem, sh.res + 6);
      __syncthreads();
      BLOCK_MARK(4);
      thr = (p22 << 10) | (u32)sh.res[6];  // the K-th largest key
      rem = sh.res[7];                     // how many keys equal to it to take
      lo = thr;
      tie = rem != sh.res[8];  // some keys equal to thr are left out
    }
  }
  int wend;
  if (tie) {
    // The shared emit: above thr in the high half, equal in the low.
    const int before = tkw_scan(tk_counts<KPT>(k, nv, thr), sh.we, &wend);
    BLOCK_MARK(5);
    if (tkw_act<KPT>(n)) tk_emit<KPT>(k, nv, thr, before, rem, K, o, i0);
    BLOCK_MARK(6);
    return;
  }
  int cnt = 0;
#pragma unroll
  for (int j = 0; j < KPT; j++) cnt += (j < nv && k[j] >= lo);
  const int before = tkw_scan(cnt, sh.we, &wend);
  BLOCK_MARK(5);
  if constexpr (ST && KPT <= 16) {
    if (K <= 2048) {
      // The selection in index order into the digits' counts (2048 words,
      // done with), then one coalesced copy: each warp's 12 stores a thread
      // to scattered positions took ~1.5 us (session 61's marks).
      int* st = reinterpret_cast<int*>(&sh);  // a then b: TkwShared's first 2048 words
      if (tkw_act<KPT>(n)) {
        int pos = before;
#pragma unroll
        for (int j = 0; j < KPT; j++) {
          if (j < nv && k[j] >= lo) {
            if (pos < K) st[pos] = i0 + j;
            pos++;
          }
        }
      }
      const int total = min(K, tkw_warp_sum(sh.we[lane]));  // every warp's count (the scan's barrier is behind)
      __syncthreads();
      for (int i = tid; i < total; i += blockDim.x) o[i] = st[i];
      BLOCK_MARK(6);
      return;
    }
  }
  if (!tkw_act<KPT>(n)) return;
  if (wend <= K) {  // warp-uniform: no bound check per key
    int* op = o + before;
#pragma unroll
    for (int j = 0; j < KPT; j++) {
      if (j < nv && k[j] >= lo) *op++ = i0 + j;
    }
  } else {
    int pos = before;
#pragma unroll
    for (int j = 0; j < KPT; j++) {
      if (j < nv && k[j] >= lo) {
        if (pos < K) o[pos] = i0 + j;
        pos++;
      }
    }
  }
  BLOCK_MARK(6);
}

// The block's body: rows of n <= 512 * KPT keys take the KPT / 2 body
// instead of leaving half the warps without keys.
template <int KPT>
__device__ __forceinline__ void tkw_body(const float* __restrict__ scores, int ld, const int* __restrict__ lens, int T,
                                         int K, u32* hist, int* out, int ld_out) {
  __shared__ __align__(16) TkwShared sh;
  const int row = blockIdx.x, tid = threadIdx.x;
  u32* gh = hist + (size_t)row * TKR_BINS;
  // The histogram does not depend on the row's length: its load goes out
  // with lens' instead of one round trip after it.
  const uint4 hv = __ldcg((const uint4*)(gh + TKR_BINS - 4 - 4 * tid));
  // topk_radix_one_w12 (one body whatever the length): the thread's keys go
  // out with the histogram and lens' too, up to T (the row's pitch holds T
  // scores, -inf past the length), instead of one round trip after lens.
  u32 kp[KPT % 8 != 0 ? KPT : 1];
  if constexpr (KPT % 8 != 0)
    tkw_load_raw<KPT>(scores + (size_t)row * ld + tid * KPT, max(0, min(KPT, T - tid * KPT)), kp);
  const int n = tkr_n(lens, row, T);
  int* o = out + (size_t)row * ld_out;
  if (n <= K) {
    for (int j = tid; j < K; j += blockDim.x) o[j] = j < n ? j : -1;
    for (int i = tid; i < TKR_BINS; i += blockDim.x) gh[i] = 0;
    return;
  }
  const float* x = scores + (size_t)row * ld;
  if constexpr (KPT % 8 != 0) {
    // topk_radix_one_w12: no half body (6 keys would break the 16-byte key loads).
    tkw_core<KPT, true>(x, n, K, gh, hv, o, sh, kp);
  } else if (n <= 512 * KPT) {
    // The staged emit (ST) costs the 32-key kernel spills on NVRTC 11.8: its
    // half body keeps the direct stores.
    tkw_core<KPT / 2, false, (KPT <= 16)>(x, n, K, gh, hv, o, sh);
  } else {
    tkw_core<KPT>(x, n, K, gh, hv, o, sh);
  }
}

#define TKW_KERNEL(KPT)                                                                                          \
  extern "C" __global__ void __launch_bounds__(1024) topk_radix_one_w##KPT(                                      \
      const float* __restrict__ scores, int ld, const int* __restrict__ lens, int T, int K, u32* hist, int* out, \
      int ld_out) {                                                                                              \
    PDL_WAIT_MARKED();                                                                                           \
    tkw_body<KPT>(scores, ld, lens, T, K, hist, out, ld_out);                                                    \
  }
TKW_KERNEL(8)
TKW_KERNEL(16)
TKW_KERNEL(32)
// Rows of 8193..12288 keys at 12 a thread on 688 threads, where the 16-key
// kernel runs 16 on 516 (TopKOneW12, opt-in).
TKW_KERNEL(12)

// topk_radix_mark_lw: topk_radix_mark_l's selection (the same indices, in
// the same order) with topk_radix_one_w's shorter chain where the list
// top-k is on the step's critical path (rows over TopKRadixOneMaxT keys;
// session 25's traces at 131072: 3-5 us a layer past q_b):
// - the histogram's 4 bins a thread are loaded before the row's length;
//   the bin is found by warp totals and one lane scan (2 barriers where
//   tkr_find_bin's block scan takes 4);
// - the last block picks each digit in one warp (tkw_pick) instead of a
//   block-wide scan, and skips the third digit's list pass when the second
//   digit is taken whole (then every listed key with its 22-bit prefix or
//   above is in: one list pass, no ties to split);
// - without ties to split the ordered emit scans one count (one barrier).
// The mark blocks' tile loop, list and ticket are mark_l's. Scratch and
// dynamic shared memory as topk_radix_mark_l's, all left zeroed.
extern "C" __global__ void __launch_bounds__(1024, 2) topk_radix_mark_lw(const float* __restrict__ scores, int ld,
                                                                      const int* __restrict__ lens, int T, int K,
                                                                      int chunk, u32* hist, u32* cnt, u32* sure,
                                                                      int ldw, u32* l2, u32* ccnt, uint2* list,
                                                                      int ldl, int* out, int ld_out) {
  PDL_WAIT();
  extern __shared__ u32 tkr_dyn[];
  __shared__ __align__(16) u32 h[1024];
  // The histogram's bins as the threads loaded them (the bin search), then
  // the third digit's counts (the final stage): 32 registers a thread keep
  // a mark block beside one of q_b's (128 registers x 256 threads) on an SM.
  __shared__ __align__(16) u32 hb[TKR_BINS];
  __shared__ int wt[32], we[32], we2[32], woff[32];
  __shared__ int res[9];  // bin, keys above it; then digit, still to take, its count, twice
  __shared__ int last;
  const int row = blockIdx.y, tid = threadIdx.x, lane = tid & 31, wid = tid >> 5;
  u32* gh = hist + (size_t)row * TKR_BINS;
  // Thread tid's 4 bins from the top (hi .. hi - 3), loaded with the length.
  const int hi = TKR_BINS - 1 - 4 * tid;
  const uint4 hv = __ldcg((const uint4*)(gh + hi - 3));
  const int n = tkr_n(lens, row, T);
  int* o = out + (size_t)row * ld_out;
  if (n <= K) {
    if (blockIdx.x == 0) {
      for (int j = tid; j < K; j += blockDim.x) o[j] = j < n ? j : -1;
      for (int i = tid; i < TKR_BINS; i += blockDim.x) gh[i] = 0;
    }
    return;
  }
  const int start = blockIdx.x * chunk, end = min(n, start + chunk);
  if (start >= end) return;
  // The bin b holding the K-th largest key (tkw_core's search; a histogram
  // of fewer than K keys finds none: bin 0, as tkr_find_bin).
  {
    const int sum = (int)(hv.x + hv.y + hv.z + hv.w);
    *(uint4*)(hb + hi - 3) = hv;
    const int wsum = tkw_warp_sum(sum);
    if (lane == 0) wt[wid] = wsum;
    if (tid < 9) res[tid] = 0;
    h[tid] = 0;
    __syncthreads();
    const int pre = tkw_warp_sum(lane < wid ? wt[lane] : 0);
    if (pre < K && pre + wsum >= K) {
      const int cum = pre + tkw_warp_incl(sum, lane) - sum;
      if (cum < K && cum + sum >= K) {
        const int c0 = (int)hb[hi], c1 = (int)hb[hi - 1], c2 = (int)hb[hi - 2];
        if (cum + c0 >= K) {
          res[0] = hi, res[1] = cum;
        } else if (cum + c0 + c1 >= K) {
          res[0] = hi - 1, res[1] = cum + c0;
        } else if (cum + c0 + c1 + c2 >= K) {
          res[0] = hi - 2, res[1] = cum + c0 + c1;
        } else {
          res[0] = hi - 3, res[1] = cum + c0 + c1 + c2;
        }
      }
    }
    __syncthreads();
  }
  const int b = res[0], above = res[1];
  const float* x = scores + (size_t)row * ld;
  u32* sw = sure + (size_t)row * ldw;
  u32* g2 = l2 + (size_t)row * 1024;
  uint2* lst = list + (size_t)row * ldl;
  // mark_l's tile loop: sure bits, the threshold bin's keys listed and
  // their second digits counted.
#pragma unroll 1
  TKR_MARK_LIST()
  // Final stage.
  u32* sws = tkr_dyn;
  u32* cws = sws + ldw;
  const int C = (int)__ldcg(ccnt + row);
  {
    const u32 cd = __ldcg(g2 + tid);  // second digit tid's count
    g2[tid] = 0;
    h[tid] = cd;  // thread tid alone read h[tid] above
    hb[tid] = 0;  // the third digit's counts
  }
  for (int i = tid; i < TKR_BINS; i += 1024) gh[i] = 0;
  const int nw = (n + 31) >> 5;
#pragma unroll 1
  for (int w = tid; w < nw; w += 1024) {
    sws[w] = __ldcg(sw + w);
    cws[w] = 0;
    sw[w] = 0;  // left zeroed for the next call
  }
  __syncthreads();
  if (wid == 0) tkw_pick(h, K - above, res + 3);
  __syncthreads();
  if (tid == 0) ccnt[row] = 0;
  const u32 p22 = ((u32)b << 10) | (u32)res[3];  // key >> 10 of the threshold
  int rem = res[4];
  bool tie = false;
  u32 thr = 0;
  if (rem == res[5]) {
    // The digit is taken whole: every listed key of prefix >= p22 is in.
#pragma unroll 1
    for (int i = tid; i < C; i += 1024) {
      const uint2 e = __ldcg(lst + i);
      lst[i] = make_uint2(0u, 0u);
      if ((e.y >> 10) >= p22) atomicOr(&sws[e.x >> 5], 1u << (e.x & 31));
    }
  } else {
    // Third digit over the list; candidates above the 22-bit prefix are in.
#pragma unroll 1
    for (int i = tid; i < C; i += 1024) {
      const uint2 e = __ldcg(lst + i);
      const u32 pk = e.y >> 10;
      if (pk == p22) {
        atomicAdd(&hb[e.y & 1023u], 1u);
      } else if (pk > p22) {
        atomicOr(&sws[e.x >> 5], 1u << (e.x & 31));
      }
    }
    __syncthreads();
    if (wid == 0) tkw_pick(hb, rem, res + 6);
    __syncthreads();
    thr = (p22 << 10) | (u32)res[6];  // the K-th largest key
    rem = res[7];                     // how many keys equal to it to take
    tie = rem != res[8];              // some keys equal to thr are left out
#pragma unroll 1
    for (int i = tid; i < C; i += 1024) {
      const uint2 e = __ldcg(lst + i);
      lst[i] = make_uint2(0u, 0u);
      if ((e.y >> 10) == p22) {
        if (e.y > thr || (e.y == thr && !tie)) atomicOr(&sws[e.x >> 5], 1u << (e.x & 31));
        if (e.y == thr && tie) atomicOr(&cws[e.x >> 5], 1u << (e.x & 31));
      }
    }
  }
  __syncthreads();
  // Ordered emit (mark_l's): thread tid's words [w0, w1).
  const int per = (nw + 1023) >> 10, w0 = min(nw, tid * per), w1 = min(nw, w0 + per);
  int nsel = 0, wend;
  for (int w = w0; w < w1; w++) nsel += __popc(sws[w]);
  int pos = tkw_scan(nsel, we, &wend);
  if (!tie) {
    for (int w = w0; w < w1; w++) {
      u32 s = sws[w];
      while (s) {
        const int bit = __ffs(s) - 1;
        s &= s - 1;
        if (pos < K) o[pos] = (w << 5) + bit;
        pos++;
      }
    }
    return;
  }
  int neq = 0;
  for (int w = w0; w < w1; w++) neq += __popc(cws[w]);
  int eq_before = tkw_scan(neq, we2, &wend);
  pos += min(eq_before, rem);
  TKR_EMIT_EQ()
}
