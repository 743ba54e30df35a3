// MoE router (DeepSeek-V3 / GLM-5 style), one block per token, blockDim >= E
// (E <= 1024, ngroup <= 32):
//   s = sigmoid(logits); c = s + bias (bias only steers the choice);
//   ngroup > 1: group score = sum of the group's two largest c; keep the
//   topk_group best groups, others' experts drop out (-inf);
//   pick K experts by c (descending, ties to the lower index);
//   weight = s[e], normalised by their sum (+1e-20) when norm != 0, times scale.
// Outputs idx[t][K] (int32) and wts[t][K] in selection order.
// moe_route_row is one token's block (lg, idx, wts: that token's rows), also
// run by the last block of fused.cu's router_route.
__device__ void moe_route_row(const float* lg, const float* __restrict__ bias, int* idx, float* wts, int E, int K,
                              int ngroup, int topk_group, int norm, float scale) {
  __shared__ float c[1024];
  __shared__ float gsc[32];
  __shared__ int keep[32];
  __shared__ float shv[32];
  __shared__ int shi[32];
  __shared__ int chosen[64];
  const int t = threadIdx.x;
  float s = 0.0f;
  if (t < E) {
    s = 1.0f / (1.0f + expf(-lg[t]));
    c[t] = s + (bias ? bias[t] : 0.0f);
  }
  __syncthreads();
  if (ngroup > 1 && topk_group < ngroup) {
    const int gs = E / ngroup;
    if (t < ngroup) {
      float m1 = NEG_INF, m2 = NEG_INF;
      for (int i = t * gs; i < (t + 1) * gs; i++) {
        float v = c[i];
        if (v > m1) {
          m2 = m1;
          m1 = v;
        } else if (v > m2) {
          m2 = v;
        }
      }
      gsc[t] = gs >= 2 ? m1 + m2 : m1;
      keep[t] = 0;
    }
    __syncthreads();
    if (t == 0) {
      for (int r = 0; r < topk_group; r++) {
        int bi = -1;
        float bv = NEG_INF;
        for (int g = 0; g < ngroup; g++)
          if (!keep[g] && (bi < 0 || gsc[g] > bv)) {
            bi = g;
            bv = gsc[g];
          }
        keep[bi] = 1;
      }
    }
    __syncthreads();
    if (t < E && !keep[t / gs]) c[t] = NEG_INF;
    __syncthreads();
  }
  // K rounds of block arg-max; a chosen expert leaves the race.
  bool taken = false;
  for (int r = 0; r < K; r++) {
    float v = (t < E && !taken) ? c[t] : NEG_INF;
    int i = (t < E && !taken) ? t : 0x7fffffff;
    block_argmax(v, i, shv, shi);
    if (t == 0) chosen[r] = i;
    if (t == i) taken = true;
  }
  __syncthreads();
  if (t == 0) {
    float sum = 0.0f;
    float wv[64];
    for (int r = 0; r < K; r++) {
      wv[r] = 1.0f / (1.0f + expf(-lg[chosen[r]]));
      sum += wv[r];
    }
    for (int r = 0; r < K; r++) {
      float o = wv[r];
      if (norm) o /= (sum + 1e-20f);
      idx[r] = chosen[r];
      wts[r] = o * scale;
    }
  }
}

extern "C" __global__ void __launch_bounds__(1024) moe_route(const float* __restrict__ logits,
                                                            const float* __restrict__ bias, int* idx, float* wts,
                                                            int E, int K, int ngroup, int topk_group, int norm,
                                                            float scale) {
  PDL_WAIT();
  moe_route_row(logits + (size_t)blockIdx.x * E, bias, idx + (size_t)blockIdx.x * K, wts + (size_t)blockIdx.x * K, E, K,
                ngroup, topk_group, norm, scale);
}
