// Token choice on the device, one block (1024 threads) per row of logits, so
// decode steps chain without a host round trip.

// Greedy: out[row] = arg-max (ties to the lower index); val optional.
extern "C" __global__ void __launch_bounds__(1024) argmax_rows(const float* __restrict__ x, int n, int ld, int* out,
                                                               float* val) {
  PDL_WAIT();
  __shared__ float shv[32];
  __shared__ int shi[32];
  const float* r = x + (size_t)blockIdx.x * ld;
  float v = NEG_INF;
  int i = 0x7fffffff;
  for (int k = threadIdx.x; k < n; k += blockDim.x) argmax_merge(v, i, r[k], k);
  block_argmax(v, i, shv, shi);
  if (threadIdx.x == 0) {
    out[blockIdx.x] = i;
    if (val) val[blockIdx.x] = v;
  }
}

// Shared-memory histogram adds, aggregated by warp: the lanes that hit one
// bin add once (integer sums, so a bin's bits do not depend on the
// grouping). The logits' keys crowd into a few bins of a digit, and one
// atomic a lane there serialised the sampler (session 36: 1.7 ms a row).
// Every lane of the warp calls these; bin NO_BIN adds nothing.
#define NO_BIN 0xffffffffu
__device__ __forceinline__ void warp_hist_add(u32* hist, u32 bin) {
#if __CUDA_ARCH__ >= 700
  const u32 peers = __match_any_sync(0xffffffffu, bin);
  if (bin != NO_BIN && (threadIdx.x & 31) == (u32)(__ffs(peers) - 1)) atomicAdd(&hist[bin], (u32)__popc(peers));
#else
  if (bin != NO_BIN) atomicAdd(&hist[bin], 1u);
#endif
}
// v <= ~2^40: its two 20-bit halves summed over 32 lanes fit 32 bits.
__device__ __forceinline__ void warp_hist_add64(unsigned long long* hist, u32 bin, unsigned long long v) {
#if __CUDA_ARCH__ >= 800
  const u32 peers = __match_any_sync(0xffffffffu, bin);
  const u32 lo = __reduce_add_sync(peers, (u32)(v & 0xFFFFFull));
  const u32 hi = __reduce_add_sync(peers, (u32)(v >> 20));
  if (bin != NO_BIN && (threadIdx.x & 31) == (u32)(__ffs(peers) - 1))
    atomicAdd(&hist[bin], ((unsigned long long)hi << 20) + (unsigned long long)lo);
#else
  if (bin != NO_BIN) atomicAdd(&hist[bin], v);
#endif
}

// Key threshold for "keep the K largest" (ties at the threshold all kept):
// radix select of the K-th largest key among x[0..n).
__device__ u32 kth_largest_key(const float* x, int n, int K, u32* hist, u32* sel) {
  u32 prefix = 0, mask = 0;
  int remaining = K;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int i = threadIdx.x; i < 256; i += blockDim.x) hist[i] = 0;
    __syncthreads();
    for (int base = 0; base < n; base += blockDim.x) {  // whole warps each round (warp_hist_add)
      const int i = base + threadIdx.x;
      u32 bin = NO_BIN;
      if (i < n) {
        const u32 k = float_key(x[i]);
        if ((k & mask) == prefix) bin = (k >> shift) & 255u;
      }
      warp_hist_add(hist, bin);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      u32 cum = 0;
      int d = 255;
      for (; d > 0; d--) {
        if (cum + hist[d] >= (u32)remaining) break;
        cum += hist[d];
      }
      sel[0] = (u32)d;
      sel[1] = (u32)remaining - cum;
    }
    __syncthreads();
    prefix |= sel[0] << shift;
    mask |= 255u << shift;
    remaining = (int)sel[1];
    __syncthreads();
  }
  return prefix;
}

// Sampling with temperature, top-k, min_p and top-p, seeded:
//   temperature <= 0: arg-max.
//   survivors: keys >= the top_k-th largest logit (top_k <= 0 or >= n: all)
//   whose (x - max) / temperature >= log(min_p) (min_p <= 0: all), that is
//   whose probability is at least min_p times the most likely token's;
//   p_i = softmax over survivors of logits / temperature;
//   top_p < 1: keep the smallest set of most likely survivors whose mass
//   reaches top_p (ties at the boundary kept);
//   draw by the Gumbel-max trick: arg-max of x_i/T - log(-log(u_i)) with
//   u_i = rng_uniform(seed, step + row, i), exactly a draw from p restricted
//   to the survivors.
// Probability mass is summed in 2^-40 fixed point, so the top-p cut is
// deterministic.
extern "C" __global__ void __launch_bounds__(1024) sample_rows(const float* __restrict__ logits, int n, int ld,
                                                               int* out, float temperature, int top_k, float top_p,
                                                               float min_p, u64 seed, u64 step) {
  PDL_WAIT();
  __shared__ u32 hist[256];
  __shared__ unsigned long long mass[256];
  __shared__ u32 sel[2];
  __shared__ float shv[32];
  __shared__ int shi[32];
  __shared__ float shf[32];
  const float* x = logits + (size_t)blockIdx.x * ld;
  const int tid = threadIdx.x;
  float v = NEG_INF;
  int vi = 0x7fffffff;
  if (!(temperature > 0.0f)) {
    for (int k = tid; k < n; k += blockDim.x) argmax_merge(v, vi, x[k], k);
    block_argmax(v, vi, shv, shi);
    if (tid == 0) out[blockIdx.x] = vi;
    return;
  }
  const float invT = 1.0f / temperature;
  u32 thr = 0;  // keep keys >= thr
  if (top_k > 0 && top_k < n) thr = kth_largest_key(x, n, top_k, hist, sel);
  // Max over survivors (the global max always survives).
  float mx = NEG_INF;
  for (int k = tid; k < n; k += blockDim.x) mx = fmaxf(mx, x[k]);
  mx = block_max(mx, shf);
  // min_p's cut in units of (x - mx) / T; the most likely token (0) always passes.
  const float lmin = min_p > 0.0f ? logf(min_p) : NEG_INF;
  if (top_p < 1.0f) {
    float z = 0.0f;
    for (int k = tid; k < n; k += blockDim.x)
      if (float_key(x[k]) >= thr && (x[k] - mx) * invT >= lmin) z += expf((x[k] - mx) * invT);
    z = block_sum(z, shf);
    const float inv_z = 1.0f / z;
    const unsigned long long target = (unsigned long long)((double)top_p * 1099511627776.0);
    // Radix select on the key by mass, from the top: the boundary key b has
    // mass(keys > b) < target <= mass(keys >= b).
    u32 prefix = 0, mask = 0;
    unsigned long long need = target;
    for (int shift = 24; shift >= 0; shift -= 8) {
      for (int i = tid; i < 256; i += blockDim.x) mass[i] = 0ull;
      __syncthreads();
      for (int base = 0; base < n; base += blockDim.x) {  // whole warps each round (warp_hist_add64)
        const int k = base + tid;
        u32 bin = NO_BIN;
        unsigned long long v = 0ull;
        if (k < n) {
          const u32 key = float_key(x[k]);
          if (key >= thr && (key & mask) == prefix && (x[k] - mx) * invT >= lmin) {
            const float p = expf((x[k] - mx) * invT) * inv_z;
            bin = (key >> shift) & 255u;
            v = (unsigned long long)(p * 1099511627776.0f);
          }
        }
        warp_hist_add64(mass, bin, v);
      }
      __syncthreads();
      if (tid == 0) {
        unsigned long long cum = 0;
        int d = 255;
        for (; d > 0; d--) {
          if (cum + mass[d] >= need) break;
          cum += mass[d];
        }
        sel[0] = (u32)d;
        mass[0] = need > cum ? need - cum : 0ull;  // the rest of the target, for the next digit
      }
      __syncthreads();
      prefix |= sel[0] << shift;
      mask |= 255u << shift;
      need = mass[0];
      __syncthreads();
    }
    if (prefix > thr) thr = prefix;
  }
  for (int k = tid; k < n; k += blockDim.x) {
    const float xv = x[k];
    if (float_key(xv) >= thr && (xv - mx) * invT >= lmin) {
      const float u = rng_uniform(seed, step + blockIdx.x, (u64)k);
      argmax_merge(v, vi, (xv - mx) * invT - logf(-logf(u)), k);
    }
  }
  block_argmax(v, vi, shv, shi);
  if (tid == 0) out[blockIdx.x] = vi;
}

// Greedy over many blocks per row (grid nblk x rows, 256 threads): each block
// reduces a contiguous slice, the last block of a row to finish (counted in
// cnt[row]) merges the nblk partials and resets cnt[row] to 0, so the scratch
// needs no memset between launches or graph replays. The merge (max, ties to
// the lower index, NaN never wins) does not depend on order, so out and val
// equal argmax_rows' exactly. Scratch: cnt [rows], pv/pi [rows][nblk].
extern "C" __global__ void __launch_bounds__(256) argmax_wide(const float* __restrict__ x, int n, int ld, int* out,
                                                              float* val, u32* cnt, float* pv, int* pi) {
  PDL_WAIT();
  __shared__ float shv[32];
  __shared__ int shi[32];
  __shared__ int last;
  const int row = blockIdx.y, nb = gridDim.x, bd = blockDim.x;
  const float* r = x + (size_t)row * ld;
  const int per = (n + nb - 1) / nb;
  const int lo = blockIdx.x * per, hi = min(n, lo + per);
  float v = NEG_INF;
  int i = 0x7fffffff;
  int k = lo + threadIdx.x;
  // Eight independent loads in flight per thread before merging them.
  for (; k + 7 * bd < hi; k += 8 * bd) {
    float a[8];
#pragma unroll
    for (int j = 0; j < 8; j++) a[j] = r[k + j * bd];
#pragma unroll
    for (int j = 0; j < 8; j++) argmax_merge(v, i, a[j], k + j * bd);
  }
  for (; k < hi; k += bd) argmax_merge(v, i, r[k], k);
  block_argmax(v, i, shv, shi);
  if (threadIdx.x == 0) {
    pv[(size_t)row * nb + blockIdx.x] = v;
    pi[(size_t)row * nb + blockIdx.x] = i;
    __threadfence();
    last = atomicAdd(&cnt[row], 1u) == (u32)(nb - 1);
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  v = NEG_INF;
  i = 0x7fffffff;
  for (int b = threadIdx.x; b < nb; b += bd)
    argmax_merge(v, i, __ldcg(&pv[(size_t)row * nb + b]), __ldcg(&pi[(size_t)row * nb + b]));
  block_argmax(v, i, shv, shi);
  if (threadIdx.x == 0) {
    out[row] = i;
    if (val) val[row] = v;
    cnt[row] = 0;
  }
}
