// The sampled pick over many blocks a row (session 37). sample_rows runs a
// row through one SM: its passes over 129280 logits (the max, the radix
// selections, the Gumbel draw with two logs and a 64-bit hash a token) cost
// 127 us without filters and 1.7 ms at top-p 0.95 on an H100 (session 36),
// where the greedy pick (argmax_wide) costs 6 us. Here each pass is one
// launch of up to 256 blocks of 256 threads, each block a slice of the row,
// and the last block to finish a pass (counted in the scratch) does the
// pass's small serial part and leaves the scratch as it found it, zeroed,
// so the launches replay in a graph without a memset:
//   sample_wide_max          the row's max (every later pass works in
//                            d = (x - max) / T, as sample_rows does);
//   sample_wide_hist mode 0  three radix passes (11, 11, 10 bits of the
//                            key) counting keys: the top_k-th largest key;
//   sample_wide_hist mode 1  three radix passes adding mass: the top-p
//                            boundary key among the survivors;
//   sample_wide_draw         the Gumbel arg-max over the survivors, merged
//                            across blocks as argmax_wide merges.
// The survivors are sample_rows' (keys >= the top_k-th largest, ties kept;
// d >= log(min_p); the smallest top set whose mass reaches top_p, ties at the
// boundary kept) and the draw is the same function of (seed, step + row, i),
// so given the same survivors the same token comes out. The one difference:
// top-p's mass is e^d in 2^-40 fixed point, unnormalised, against top_p
// times its integer sum, where sample_rows divides by a float sum first.
// Integer sums do not depend on the order of the adds, so the cut is
// deterministic whatever the blocks' timing.
//
// Blocks of 256 threads (the launch bounds). Scratch a row (SampleScratchBytes): u32 cnt and u32 gen (sample_wide_one's
// barrier generation); 8 u64 of state; u64 hist[2048]; float pv[256]; int pi[256]; then, for sample_wide_one only,
// two more u64 hist[2048] and float pm[256].
#define SW_BINS 2048
#define SW_MAXB 256
#define SW_STATE_OFF 8
#define SW_HIST_OFF (SW_STATE_OFF + 64)
#define SW_PV_OFF (SW_HIST_OFF + SW_BINS * 8)
#define SW_PI_OFF (SW_PV_OFF + SW_MAXB * 4)
#define SW_HIST1_OFF (SW_PI_OFF + SW_MAXB * 4)
#define SW_PM_OFF (SW_HIST1_OFF + 2 * SW_BINS * 8)
#define SW_ROW_BYTES (SW_PM_OFF + SW_MAXB * 4)
// State words: 0 max (float bits), 1 thr (keep keys >= thr), 2 top-k prefix,
// 3 top-k mask, 4 top-k count still wanted, 5 top-p prefix, 6 top-p mask,
// 7 top-p mass still wanted.
#define SW_MX 0
#define SW_THR 1
#define SW_KPRE 2
#define SW_KMASK 3
#define SW_KREM 4
#define SW_PPRE 5
#define SW_PMASK 6
#define SW_PNEED 7
#define SW_FIX 1099511627776.0f  // 2^40

struct SwRow {
  u32* cnt;
  u32* gen;
  u64* st;
  u64* hist;
  float* pv;
  int* pi;
  u64* hist1;  // hist1 and hist1 + SW_BINS: sample_wide_one's other two regions
  float* pm;
};

__device__ __forceinline__ SwRow sw_row(unsigned char* scratch, int row) {
  unsigned char* b = scratch + (size_t)row * SW_ROW_BYTES;
  SwRow r;
  r.cnt = (u32*)b;
  r.gen = (u32*)(b + 4);
  r.st = (u64*)(b + SW_STATE_OFF);
  r.hist = (u64*)(b + SW_HIST_OFF);
  r.pv = (float*)(b + SW_PV_OFF);
  r.pi = (int*)(b + SW_PI_OFF);
  r.hist1 = (u64*)(b + SW_HIST1_OFF);
  r.pm = (float*)(b + SW_PM_OFF);
  return r;
}

// The block's slice of a row of n: [lo, hi).
__device__ __forceinline__ void sw_slice(int n, int& lo, int& hi) {
  const int per = (n + gridDim.x - 1) / gridDim.x;
  lo = blockIdx.x * per;
  hi = min(n, lo + per);
}

// Whether this block is the last of the row's to finish the pass; the
// caller's global writes are visible to the block that returns true.
__device__ __forceinline__ bool sw_last(u32* cnt, int* flag) {
  __threadfence();  // every thread's adds to the row's histogram, before the count
  __syncthreads();
  if (threadIdx.x == 0) {
    *flag = atomicAdd(cnt, 1u) == gridDim.x - 1;
  }
  __syncthreads();
  if (!*flag) return false;
  __threadfence();
  return true;
}

extern "C" __global__ void __launch_bounds__(256) sample_wide_max(const float* __restrict__ x, int n, int ld,
                                                                         int top_k, unsigned char* scratch) {
  PDL_WAIT();
  __shared__ float shf[32];
  __shared__ int last;
  const SwRow s = sw_row(scratch, blockIdx.y);
  const float* r = x + (size_t)blockIdx.y * ld;
  int lo, hi;
  sw_slice(n, lo, hi);
  float m = NEG_INF;
  for (int k = lo + threadIdx.x; k < hi; k += blockDim.x) m = fmaxf(m, r[k]);
  m = block_max(m, shf);
  if (threadIdx.x == 0) s.pv[blockIdx.x] = m;
  if (!sw_last(s.cnt, &last)) return;
  m = NEG_INF;
  for (int b = threadIdx.x; b < gridDim.x; b += blockDim.x) m = fmaxf(m, __ldcg(&s.pv[b]));
  m = block_max(m, shf);
  if (threadIdx.x == 0) {
    s.st[SW_MX] = __float_as_uint(m);
    s.st[SW_THR] = 0;
    s.st[SW_KPRE] = 0;
    s.st[SW_KMASK] = 0;
    s.st[SW_KREM] = (u64)max(top_k, 1);
    s.st[SW_PPRE] = 0;
    s.st[SW_PMASK] = 0;
    s.st[SW_PNEED] = 0;
    *s.cnt = 0;
  }
}

// sample_wide_one's passes (sw_accum, sw_digit) and draw (sw_draw_slice): the
// statements of sample_wide_hist and sample_wide_draw, which keep their own
// text (measured in session 38) until sample_wide_one has run on a GPU; then
// the three kernels can share these.
//
// One pass's adds over this block's slice [lo, hi) of row r: the digit at
// shift (21: bits 31..21, 10: bits 20..10, 0: bits 9..0) of the keys that
// match the pass's prefix so far, into the block's nbins shared bins h, then
// the non-zero bins into the row's histogram hist. mode 0 counts every key
// (top-k); mode 1 adds e^d of the survivors so far (top-p).
__device__ __forceinline__ void sw_accum(const float* __restrict__ r, int lo, int hi, u64* h, int nbins, u64* hist, int shift,
                                         int mode, u32 pre, u32 mask, u32 thr, float mx, float inv_t, float lmin) {
  const u32 dmask = (u32)nbins - 1u;
  for (int i = threadIdx.x; i < nbins; i += blockDim.x) h[i] = 0ull;
  __syncthreads();
  for (int base = lo; base < hi; base += blockDim.x) {  // whole warps each round (warp_hist_add*)
    const int k = base + threadIdx.x;
    u32 bin = NO_BIN;
    u64 v = 0ull;
    if (k < hi) {
      const float xv = r[k];
      const u32 key = float_key(xv);
      if ((key & mask) == pre) {
        if (mode == 0) {
          bin = (key >> shift) & dmask;
          v = 1ull;
        } else {
          const float d = (xv - mx) * inv_t;
          if (key >= thr && d >= lmin) {
            bin = (key >> shift) & dmask;
            v = (u64)(expf(d) * SW_FIX);
          }
        }
      }
    }
    warp_hist_add64(h, bin, v);
  }
  __syncthreads();
  for (int i = threadIdx.x; i < nbins; i += blockDim.x)
    if (h[i]) atomicAdd(&hist[i], h[i]);
}

// A pass's digit from the row's histogram hist (zeroed as it is read when
// clear): the digit where the running sum from the top reaches want (mode
// 1's first pass wants top_p times the survivors' sum) into *pick, and what
// is still wanted within it into *rest (both shared), for every thread.
__device__ __forceinline__ void sw_digit(u64* hist, bool clear, int nbins, int mode, int shift, float top_p, u64 want,
                                         u64* sh, u32* pick, u64* rest) {
  // This thread's bins, from the top, g of them.
  const int g = nbins / blockDim.x, top = nbins - 1 - threadIdx.x * g;
  u64 loc[8], sum = 0;
#pragma unroll
  for (int j = 0; j < 8; j++) {
    loc[j] = 0ull;
    if (j < g) {
      loc[j] = __ldcg(&hist[top - j]);
      if (clear) hist[top - j] = 0ull;
      sum += loc[j];
    }
  }
  u64 tot;
  const u64 before = block_excl_scan(sum, sh, &tot);
  if (mode == 1 && shift == 21) {
    want = (u64)((double)top_p * (double)tot);
    if (want == 0ull) want = 1ull;
  }
  if (want > tot && threadIdx.x == blockDim.x - 1) {
    // More wanted than there is (a row without survivors, all -inf or NaN):
    // the lowest digit, with the rest, as sample_rows falls through.
    *pick = 0u;
    *rest = want - (tot - loc[g - 1]);
  }
  if (before < want && before + sum >= want) {
    u64 cum = before;
#pragma unroll
    for (int j = 0; j < 8; j++) {
      if (j < g) {
        if (cum + loc[j] >= want) {
          *pick = (u32)(top - j);
          *rest = want - cum;
          break;
        }
        cum += loc[j];
      }
    }
  }
  __syncthreads();
}

// One radix pass: the digit at shift (21: bits 31..21, 10: bits 20..10, 0:
// bits 9..0) of the keys that match the pass's prefix so far. mode 0 counts
// every key (top-k); mode 1 adds e^d of the survivors so far (top-p; its
// first pass also sets the mass wanted, top_p times the survivors' sum). The
// last block picks the digit where the running sum from the top reaches
// what is wanted and narrows the prefix; after the last digit the prefix is
// the boundary key.
extern "C" __global__ void __launch_bounds__(256) sample_wide_hist(const float* __restrict__ x, int n, int ld,
                                                                          unsigned char* scratch, int shift, int mode,
                                                                          float temperature, float min_p, float top_p) {
  PDL_WAIT();
  const float inv_t = 1.0f / temperature;
  const float lmin = min_p > 0.0f ? logf(min_p) : NEG_INF;  // as sample_rows' cut
  __shared__ u64 h[SW_BINS];
  __shared__ u64 sh[32];
  __shared__ int last;
  __shared__ u32 pick;
  __shared__ u64 rest;
  const SwRow s = sw_row(scratch, blockIdx.y);
  const float* r = x + (size_t)blockIdx.y * ld;
  const int bits = shift == 0 ? 10 : 11, nbins = 1 << bits;
  const u32 dmask = (u32)nbins - 1u;
  const u32 pre = (u32)__ldcg(&s.st[mode ? SW_PPRE : SW_KPRE]), mask = (u32)__ldcg(&s.st[mode ? SW_PMASK : SW_KMASK]);
  const u32 thr = (u32)__ldcg(&s.st[SW_THR]);
  const float mx = __uint_as_float((u32)__ldcg(&s.st[SW_MX]));
  for (int i = threadIdx.x; i < nbins; i += blockDim.x) h[i] = 0ull;
  __syncthreads();
  int lo, hi;
  sw_slice(n, lo, hi);
  for (int base = lo; base < hi; base += blockDim.x) {  // whole warps each round (warp_hist_add*)
    const int k = base + threadIdx.x;
    u32 bin = NO_BIN;
    u64 v = 0ull;
    if (k < hi) {
      const float xv = r[k];
      const u32 key = float_key(xv);
      if ((key & mask) == pre) {
        if (mode == 0) {
          bin = (key >> shift) & dmask;
          v = 1ull;
        } else {
          const float d = (xv - mx) * inv_t;
          if (key >= thr && d >= lmin) {
            bin = (key >> shift) & dmask;
            v = (u64)(expf(d) * SW_FIX);
          }
        }
      }
    }
    warp_hist_add64(h, bin, v);
  }
  __syncthreads();
  for (int i = threadIdx.x; i < nbins; i += blockDim.x)
    if (h[i]) atomicAdd(&s.hist[i], h[i]);
  if (!sw_last(s.cnt, &last)) return;
  // The last block: this thread's bins, from the top, g of them.
  const int g = nbins / blockDim.x, top = nbins - 1 - threadIdx.x * g;
  u64 loc[8], sum = 0;
#pragma unroll
  for (int j = 0; j < 8; j++) {
    loc[j] = 0ull;
    if (j < g) {
      loc[j] = __ldcg(&s.hist[top - j]);
      s.hist[top - j] = 0ull;
      sum += loc[j];
    }
  }
  u64 tot;
  const u64 before = block_excl_scan(sum, sh, &tot);
  u64 want = __ldcg(&s.st[mode ? SW_PNEED : SW_KREM]);
  if (mode == 1 && shift == 21) {
    want = (u64)((double)top_p * (double)tot);
    if (want == 0ull) want = 1ull;
  }
  if (want > tot && threadIdx.x == blockDim.x - 1) {
    // More wanted than there is (a row without survivors, all -inf or NaN):
    // the lowest digit, with the rest, as sample_rows falls through.
    pick = 0u;
    rest = want - (tot - loc[g - 1]);
  }
  if (before < want && before + sum >= want) {
    u64 cum = before;
#pragma unroll
    for (int j = 0; j < 8; j++) {
      if (j < g) {
        if (cum + loc[j] >= want) {
          pick = (u32)(top - j);
          rest = want - cum;
          break;
        }
        cum += loc[j];
      }
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    const u32 npre = pre | (pick << shift), nmask = mask | (dmask << shift);
    u64 left = rest;
    if (left == 0ull) left = 1ull;
    s.st[mode ? SW_PPRE : SW_KPRE] = npre;
    s.st[mode ? SW_PMASK : SW_KMASK] = nmask;
    s.st[mode ? SW_PNEED : SW_KREM] = left;
    if (shift == 0) s.st[SW_THR] = mode ? max(thr, npre) : npre;
    *s.cnt = 0;
  }
}

// This thread's share of the draw over [lo, hi): the arg-max of d - log(-log(u)) over the survivors (key >= thr,
// d >= lmin), u = rng_uniform(seed, ctr, i).
__device__ __forceinline__ void sw_draw_slice(const float* __restrict__ r, int lo, int hi, float inv_t, u32 thr, float mx,
                                              float lmin, u64 seed, u64 ctr, float& v, int& vi) {
  for (int k = lo + threadIdx.x; k < hi; k += blockDim.x) {
    const float xv = r[k];
    const float d = (xv - mx) * inv_t;
    if (float_key(xv) >= thr && d >= lmin) {
      const float u = rng_uniform(seed, ctr, (u64)k);
      argmax_merge(v, vi, d - logf(-logf(u)), k);
    }
  }
}

// The draw: arg-max over the survivors of d - log(-log(u)) with
// u = rng_uniform(seed, step + row, i) (greedy when temperature <= 0: the
// plain arg-max, without sample_wide_max before it). With step_at set the
// counter is step plus the int there (a row's position, uploaded with the
// step), so a captured step replays with a new counter each time.
extern "C" __global__ void __launch_bounds__(256) sample_wide_draw(const float* __restrict__ x, int n, int ld,
                                                                          unsigned char* scratch, int* out, float temperature,
                                                                          float min_p, u64 seed, u64 step,
                                                                          const int* step_at) {
  PDL_WAIT();
  if (step_at) step += (u64)(u32)__ldcg(step_at);
  const float lmin = min_p > 0.0f ? logf(min_p) : NEG_INF;
  __shared__ float shv[32];
  __shared__ int shi[32];
  __shared__ int last;
  const SwRow s = sw_row(scratch, blockIdx.y);
  const float* r = x + (size_t)blockIdx.y * ld;
  int lo, hi;
  sw_slice(n, lo, hi);
  float v = NEG_INF;
  int vi = 0x7fffffff;
  if (!(temperature > 0.0f)) {
    for (int k = lo + threadIdx.x; k < hi; k += blockDim.x) argmax_merge(v, vi, r[k], k);
  } else {
    const float inv_t = 1.0f / temperature;
    const u32 thr = (u32)__ldcg(&s.st[SW_THR]);
    const float mx = __uint_as_float((u32)__ldcg(&s.st[SW_MX]));
    for (int k = lo + threadIdx.x; k < hi; k += blockDim.x) {
      const float xv = r[k];
      const float d = (xv - mx) * inv_t;
      if (float_key(xv) >= thr && d >= lmin) {
        const float u = rng_uniform(seed, step + blockIdx.y, (u64)k);
        argmax_merge(v, vi, d - logf(-logf(u)), k);
      }
    }
  }
  block_argmax(v, vi, shv, shi);
  if (threadIdx.x == 0) {
    s.pv[blockIdx.x] = v;
    s.pi[blockIdx.x] = vi;
  }
  if (!sw_last(s.cnt, &last)) return;
  v = NEG_INF;
  vi = 0x7fffffff;
  for (int b = threadIdx.x; b < gridDim.x; b += blockDim.x) argmax_merge(v, vi, __ldcg(&s.pv[b]), __ldcg(&s.pi[b]));
  block_argmax(v, vi, shv, shi);
  if (threadIdx.x == 0) {
    out[blockIdx.y] = vi;
    *s.cnt = 0;
  }
}

// A barrier over the row's blocks (sample_wide_one: a cooperative launch,
// so every block is resident). cnt counts arrivals and is left 0; gen moves
// on at each release (read before arriving, so a block cannot miss it). The
// block's global writes before it are visible to every block's __ldcg after.
__device__ __forceinline__ void sw_grid_sync(u32* cnt, u32* gen) {
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    volatile u32* vg = gen;
    const u32 g = *vg;
    if (atomicAdd(cnt, 1u) == gridDim.x - 1) {
      atomicExch(cnt, 0u);
      __threadfence();
      atomicAdd(gen, 1u);
    } else {
      while (*vg == g) __nanosleep(32);
    }
    __threadfence();
  }
  __syncthreads();
}

// Zeroes this block's share of one histogram region.
__device__ __forceinline__ void sw_zero_share(u64* hb) {
  const int per = (SW_BINS + gridDim.x - 1) / gridDim.x, i0 = blockIdx.x * per;
  for (int i = threadIdx.x; i < per && i0 + i < SW_BINS; i += blockDim.x) hb[i0 + i] = 0ull;
}

// The sampled pick in one launch (kernels.SampleWideOne, opt-in; session 38,
// NOT RUN): sample_wide_max, the radix passes of sample_wide_hist and
// sample_wide_draw as phases of one grid, separated by grid barriers
// (sw_grid_sync) instead of launch boundaries, which session 38 measured at
// ~6 us each. Every block reads each pass's histogram and picks the same
// digit (sw_digit on the same integer sums), so no block waits for another's
// serial part, and the state stays in registers. The passes' histograms
// rotate over three regions: pass q sums into region q % 3 while each block
// zeroes its share of region (q - 2) % 3, which every block read before the
// barrier of pass q - 1; the last two are zeroed in the draw and after its
// barrier, so the scratch is left as found (gen aside) for a graph replay.
// Survivors, cut and draw are sample_wide_*'s, so the token is theirs.
// temperature > 0 only (the greedy pick is sample_wide_draw's alone).
extern "C" __global__ void __launch_bounds__(256) sample_wide_one(const float* __restrict__ x, int n, int ld,
                                                                         unsigned char* scratch, int* out, float temperature,
                                                                         int top_k, float top_p, float min_p, u64 seed,
                                                                         u64 step, const int* step_at) {
  PDL_WAIT();
  if (step_at) step += (u64)(u32)__ldcg(step_at);
  const float inv_t = 1.0f / temperature;
  const float lmin = min_p > 0.0f ? logf(min_p) : NEG_INF;
  __shared__ u64 h[SW_BINS];
  __shared__ u64 sh[32];
  __shared__ float shv[32];
  __shared__ int shi[32];
  __shared__ u32 pick;
  __shared__ u64 rest;
  const SwRow s = sw_row(scratch, blockIdx.y);
  const float* r = x + (size_t)blockIdx.y * ld;
  int lo, hi;
  sw_slice(n, lo, hi);
  // The max.
  float mx = NEG_INF;
  for (int k = lo + threadIdx.x; k < hi; k += blockDim.x) mx = fmaxf(mx, r[k]);
  mx = block_max(mx, shv);
  if (threadIdx.x == 0) s.pm[blockIdx.x] = mx;
  sw_grid_sync(s.cnt, s.gen);
  mx = NEG_INF;
  for (int b = threadIdx.x; b < gridDim.x; b += blockDim.x) mx = fmaxf(mx, __ldcg(&s.pm[b]));
  mx = block_max(mx, shv);
  // The passes: top-k (mode 0) by counts, then top-p (mode 1) by masses.
  u32 thr = 0u;
  int q = 0;
  for (int mode = 0; mode < 2; mode++) {
    if (mode == 0 ? !(top_k > 0 && top_k < n) : !(top_p < 1.0f)) continue;
    u32 pre = 0u, mask = 0u;
    u64 need = mode == 0 ? (u64)max(top_k, 1) : 0ull;
    for (int shift = 21; shift >= 0; shift = shift == 21 ? 10 : shift - 10) {
      const int nbins = shift == 0 ? 1024 : SW_BINS;
      const u32 dmask = (u32)nbins - 1u;
      u64* hb = q % 3 == 0 ? s.hist : s.hist1 + (q % 3 - 1) * SW_BINS;
      if (q >= 2) sw_zero_share((q + 1) % 3 == 0 ? s.hist : s.hist1 + ((q + 1) % 3 - 1) * SW_BINS);
      sw_accum(r, lo, hi, h, nbins, hb, shift, mode, pre, mask, thr, mx, inv_t, lmin);
      sw_grid_sync(s.cnt, s.gen);
      sw_digit(hb, false, nbins, mode, shift, top_p, need, sh, &pick, &rest);
      pre |= pick << shift;
      mask |= dmask << shift;
      need = rest == 0ull ? 1ull : rest;
      if (shift == 0) thr = mode ? max(thr, pre) : pre;
      q++;
      __syncthreads();  // pick and rest are rewritten by the next pass's sw_digit
    }
  }
  // The draw, zeroing the region of pass q - 2 (read before the last barrier).
  if (q >= 2) sw_zero_share((q - 2) % 3 == 0 ? s.hist : s.hist1 + ((q - 2) % 3 - 1) * SW_BINS);
  float v = NEG_INF;
  int vi = 0x7fffffff;
  sw_draw_slice(r, lo, hi, inv_t, thr, mx, lmin, seed, step + blockIdx.y, v, vi);
  block_argmax(v, vi, shv, shi);
  if (threadIdx.x == 0) {
    s.pv[blockIdx.x] = v;
    s.pi[blockIdx.x] = vi;
  }
  sw_grid_sync(s.cnt, s.gen);
  if (q >= 1) sw_zero_share((q - 1) % 3 == 0 ? s.hist : s.hist1 + ((q - 1) % 3 - 1) * SW_BINS);
  if (blockIdx.x != 0) return;
  v = NEG_INF;
  vi = 0x7fffffff;
  for (int b = threadIdx.x; b < gridDim.x; b += blockDim.x) argmax_merge(v, vi, __ldcg(&s.pv[b]), __ldcg(&s.pi[b]));
  block_argmax(v, vi, shv, shi);
  if (threadIdx.x == 0) out[blockIdx.y] = vi;
}
