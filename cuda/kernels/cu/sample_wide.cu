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
// Blocks of 256 threads (the launch bounds). Scratch a row (SampleScratchBytes): u32 cnt and pad; 8 u64 of state; u64
// hist[2048]; float pv[256]; int pi[256].
#define SW_BINS 2048
#define SW_MAXB 256
#define SW_STATE_OFF 8
#define SW_HIST_OFF (SW_STATE_OFF + 64)
#define SW_PV_OFF (SW_HIST_OFF + SW_BINS * 8)
#define SW_PI_OFF (SW_PV_OFF + SW_MAXB * 4)
#define SW_ROW_BYTES (SW_PI_OFF + SW_MAXB * 4)
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
  u64* st;
  u64* hist;
  float* pv;
  int* pi;
};

__device__ __forceinline__ SwRow sw_row(unsigned char* scratch, int row) {
  unsigned char* b = scratch + (size_t)row * SW_ROW_BYTES;
  SwRow r;
  r.cnt = (u32*)b;
  r.st = (u64*)(b + SW_STATE_OFF);
  r.hist = (u64*)(b + SW_HIST_OFF);
  r.pv = (float*)(b + SW_PV_OFF);
  r.pi = (int*)(b + SW_PI_OFF);
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
