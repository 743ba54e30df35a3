// Logit adjustments and logprobs around the token choice (vLLM's order:
// logit_bias and min_tokens, then the penalties, then the choice; logprobs
// of the raw logits). engine/penalty.go is the CPU reference; the
// arithmetic is the same float32 operations in the same order.

// One adjusted logit: int32 words {row, tok, bias, rep, sub, block}, the
// float ones as their bits.
//   v = x[row][tok] + bias; block: v = -inf; else rep != 1: v = v > 0 ?
//   v / rep : v * rep; v -= sub.
extern "C" __global__ void adjust_logits(float* x, int ld, const int* e, int n) {
  PDL_WAIT();
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const int* a = e + 6 * i;
  float* p = x + (size_t)a[0] * ld + a[1];
  float v = *p + __int_as_float(a[2]);
  if (a[5]) {
    v = NEG_INF;
  } else {
    const float rep = __int_as_float(a[3]);
    if (rep != 1.0f) v = v > 0.0f ? v / rep : v * rep;
    v -= __int_as_float(a[4]);
  }
  *p = v;
}

// Raw logprobs, one block per row: lp[row] = x[tok[row]] - logsumexp(x)
// and the k most likely tokens (value desc, index asc; NaN skipped) with
// theirs, in top_id/top_lp [row][k]. Each of the k passes takes the best
// element below the previous one in that order, so a pass reads the row
// once and keeps no exclusion list.
extern "C" __global__ void __launch_bounds__(1024) logprob_rows(const float* __restrict__ x, int n, int ld,
                                                                const int* __restrict__ tok, float* lp, int k,
                                                                int* top_id, float* top_lp) {
  PDL_WAIT();
  __shared__ float sh[32];
  __shared__ float shv[32];
  __shared__ int shi[32];
  const float* r = x + (size_t)blockIdx.x * ld;
  float m = NEG_INF;
  for (int i = threadIdx.x; i < n; i += blockDim.x) m = fmaxf(m, r[i]);  // fmaxf skips NaN
  m = block_max(m, sh);
  float s = 0.0f;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const float v = r[i];
    if (v == v) s += expf(v - m);
  }
  s = block_sum(s, sh);
  const float lse = m + logf(s);
  if (threadIdx.x == 0) lp[blockIdx.x] = r[tok[blockIdx.x]] - lse;
  float pv = POS_INF;
  int pi = -1;
  for (int j = 0; j < k; j++) {
    float v = NEG_INF;
    int vi = 0x7fffffff;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
      const float xv = r[i];
      if (xv == xv && (xv < pv || (xv == pv && i > pi))) argmax_merge(v, vi, xv, i);
    }
    block_argmax(v, vi, shv, shi);
    if (threadIdx.x == 0) {
      top_id[blockIdx.x * k + j] = vi;
      top_lp[blockIdx.x * k + j] = v - lse;
    }
    pv = v;
    pi = vi;
    __syncthreads();
  }
}
