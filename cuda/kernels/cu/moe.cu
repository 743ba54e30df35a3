// MoE router (DeepSeek-V3 / GLM-5 style), one block per token, blockDim >= E
// (E <= 1024, ngroup <= 32):
//   s = sigmoid(logits); c = s + bias (bias only steers the choice);
//   ngroup > 1: group score = sum of the group's two largest c; keep the
//   topk_group best groups, others' experts drop out (-inf);
//   pick K experts by c (descending, ties to the lower index);
//   weight = s[e], normalised by their sum (+1e-20) when norm != 0, times scale.
// Outputs idx[t][K] (int32) and wts[t][K] in selection order.
// moe_route_row is one token's block (lg, idx, wts: that token's rows).
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

// moe_route_rank: moe_route's rule and outputs bit for bit, with its serial
// stages made parallel (one block per token, blockDim = E rounded up to 32):
// - a group of 32 experts is one warp, whose two largest c come from two
//   warp arg-max passes (the same multiset, so the same m1 + m2); other group
//   sizes keep moe_route's loop;
// - a group is kept when fewer than topk_group groups beat it (higher score,
//   or equal with a lower index): moe_route's repeated pick of the best
//   group, ties to the lower index;
// - an expert's place in the selection is the number of experts that beat it
//   the same way (K rounds of block arg-max pick exactly that order); only
//   kept groups can beat a kept expert of finite c, and an expert dropped
//   with its group (c = -inf) cannot be chosen while K experts are finite;
// - weight sum in selection order by every thread r < K, as moe_route's
//   thread 0 does.
// Replaces ~8 block arg-max rounds (2 barriers each) and two one-thread
// loops with 3 barriers and one pass over the kept experts per thread.
// moe_route_rank_row is one token's block (blockDim >= E, every thread
// calls it).
//
// SORT (moe_route_sort, kernels.RouteSort, the default since session 52,
// after its block clocks timed moe_route_rank's one block at 5.5 us on
// DeepSeek-V3.2 dims and 6.6-8.4 on GLM-5 dims, whose one group has every
// thread compare against all 256 experts): where every c is a number and at
// least K are finite, each warp sorts its 32 experts by (c descending, index
// ascending) in registers (a bitonic network over shuffles) and offers its
// first min(K, 32): an expert among the K chosen is beaten only by chosen
// ones, so it is among its warp's first K. A candidate's place is then the
// number of candidates that beat it, which is its place among all experts:
// the same selection, order and weights. Elsewhere (a NaN, fewer than K
// finite) the rank loop below runs.
__device__ __forceinline__ bool route_beats(float av, int ai, float bv, int bi) {
  return av > bv || (av == bv && ai < bi);
}

template <bool SORT>
__device__ __forceinline__ void moe_route_rank_t(const float* lg, const float* __restrict__ bias, int* idx,
                                                 float* wts, int E, int K, int ngroup, int topk_group, int norm,
                                                 float scale) {
  __shared__ float c[1024];
  __shared__ float gsc[32];
  __shared__ int keepg[32];
  __shared__ int chosen[64];
  __shared__ float sv[64];
  __shared__ float sx[SORT ? 1024 : 1];      // s by expert (SORT)
  __shared__ float2 cand[SORT ? 1024 : 1];   // (c, index as float bits) by candidate (SORT)
  const int t = threadIdx.x, lane = t & 31, wp = t >> 5;
  float s = 0.0f, ct = NEG_INF;
  if (t < E) {
    s = 1.0f / (1.0f + expf(-lg[t]));
    ct = s + (bias ? bias[t] : 0.0f);
    c[t] = ct;
    if constexpr (SORT) sx[t] = s;
  }
  const bool grouped = ngroup > 1 && topk_group < ngroup;
  const int gs = grouped ? E / ngroup : E;
  if (grouped) {
    if (gs == 32) {
      float m1 = ct;
      int i1 = lane;
      warp_argmax(m1, i1);
      float m2 = lane == i1 ? NEG_INF : ct;
      int i2 = lane;
      warp_argmax(m2, i2);
      if (lane == 0 && wp < ngroup) gsc[wp] = m1 + m2;
      __syncthreads();
    } else {
      __syncthreads();
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
      }
      __syncthreads();
    }
    if (t < ngroup) {
      const float gv = gsc[t];
      int r = 0;
      for (int h = 0; h < ngroup; h++) {
        const float hv = gsc[h];
        r += (hv > gv || (hv == gv && h < t)) ? 1 : 0;
      }
      keepg[t] = r < topk_group;
    }
    __syncthreads();
    if (t < E && !keepg[t / gs]) {
      ct = NEG_INF;
      c[t] = ct;
    }
  }
  // Finite experts after the group drop (NaN counts as not finite).
  const int nfin = __syncthreads_count(t < E && ct > NEG_INF);
  bool ranked = false;  // block-uniform: the sorted candidates chose (SORT)
  if constexpr (SORT) {
    if (nfin >= K && !__syncthreads_or(t < E && ct != ct)) {  // block-uniform
      float v = ct;  // t >= E: -inf, beaten by every finite expert
      int i = t;
#pragma unroll
      for (int k = 2; k <= 32; k <<= 1) {
#pragma unroll
        for (int j = k >> 1; j > 0; j >>= 1) {
          const float ov = __shfl_xor_sync(0xffffffffu, v, j);
          const int oi = __shfl_xor_sync(0xffffffffu, i, j);
          // The lower lane of a pair keeps the better in a run sorted
          // best-first ((lane & k) == 0; all of it at k = 32), the worse
          // in the other runs.
          const bool take = (((lane & j) == 0) == ((lane & k) == 0)) == route_beats(ov, oi, v, i);
          if (take) {
            v = ov;
            i = oi;
          }
        }
      }
      const int kc = min(K, 32), nc = (int)(blockDim.x >> 5) * kc;
      if (lane < kc) cand[wp * kc + lane] = make_float2(v, __int_as_float(i));
      __syncthreads();
      if (t < nc) {
        const float2 me = cand[t];
        const int mi = __float_as_int(me.y);
        int r = 0;
        for (int u = 0; u < nc; u++) {
          const float2 o = cand[u];
          r += route_beats(o.x, __float_as_int(o.y), me.x, mi) ? 1 : 0;
        }
        if (r < K) {
          chosen[r] = mi;
          sv[r] = sx[mi];
        }
      }
      ranked = true;
    }
  }
  if (!ranked && t < E && (ct > NEG_INF || nfin < K)) {
    // Only kept groups can beat a finite c; otherwise scan every expert.
    const bool all = !(ct > NEG_INF) || !grouped;
    int r = 0;
    for (int g = 0; g < (all ? 1 : ngroup); g++) {
      if (!all && !keepg[g]) continue;
      const int j0 = all ? 0 : g * gs, j1 = all ? E : (g + 1) * gs;
      for (int j = j0; j < j1; j++) {
        const float v = c[j];
        r += (v > ct || (v == ct && j < t)) ? 1 : 0;
      }
    }
    if (r < K) {
      chosen[r] = t;
      sv[r] = s;
    }
  }
  __syncthreads();
  if (t < K) {
    float sum = 0.0f;
    for (int r = 0; r < K; r++) sum += sv[r];
    float o = sv[t];
    if (norm) o /= (sum + 1e-20f);
    idx[t] = chosen[t];
    wts[t] = o * scale;
  }
}

__device__ void moe_route_rank_row(const float* lg, const float* __restrict__ bias, int* idx, float* wts, int E,
                                   int K, int ngroup, int topk_group, int norm, float scale) {
  moe_route_rank_t<false>(lg, bias, idx, wts, E, K, ngroup, topk_group, norm, scale);
}

extern "C" __global__ void __launch_bounds__(1024) moe_route_rank(const float* __restrict__ logits,
                                                                 const float* __restrict__ bias, int* idx,
                                                                 float* wts, int E, int K, int ngroup,
                                                                 int topk_group, int norm, float scale) {
  PDL_WAIT();
  moe_route_rank_row(logits + (size_t)blockIdx.x * E, bias, idx + (size_t)blockIdx.x * K,
                     wts + (size_t)blockIdx.x * K, E, K, ngroup, topk_group, norm, scale);
}

extern "C" __global__ void __launch_bounds__(1024) moe_route_sort(const float* __restrict__ logits,
                                                                 const float* __restrict__ bias, int* idx,
                                                                 float* wts, int E, int K, int ngroup,
                                                                 int topk_group, int norm, float scale) {
  PDL_WAIT();
  moe_route_rank_t<true>(logits + (size_t)blockIdx.x * E, bias, idx + (size_t)blockIdx.x * K,
                         wts + (size_t)blockIdx.x * K, E, K, ngroup, topk_group, norm, scale);
}
