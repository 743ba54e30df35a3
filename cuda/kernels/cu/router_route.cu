// The MoE router's one-row GEMV with the routing in its last block (issue
// 10: one DeepSeek-V3.2 MoE layer at 8192 spends 15.5 us between o_proj and
// the routed experts on the norm, the router GEMV (3.7 MB, 6.1 us charged)
// and moe_route_rank, a one-block launch charged 5.7 us after it; only the
// shared expert's gate/up streams beside them).
//
// Every block runs gemv_bf16_wide_r<R>'s rows (gemv_wide_rows, the same
// expressions, so the logits' bits) and counts itself on one int32 counter;
// the block that counts last loads the row's E logits from the L2 into
// shared memory and runs moe_route_rank_row on them (E <= the block's 256
// threads), so idx and wts carry moe_route_rank's bits. It sets the counter
// back to 0, so every launch and graph replay finds it zeroed. No block
// waits on another: the grid needs no co-residency. The fences are
// wqb_iq.cu's (release before the count, acquire after it).

template <int R>
__device__ __forceinline__ void router_route_rows(const u16* __restrict__ W, const float* __restrict__ x, float* y,
                                                  int E, int K, const float* __restrict__ bias, int* idx, float* wts,
                                                  int topk, int ngroup, int topk_group, int norm, float scale,
                                                  int* cnt) {
  gemv_wide_rows<WBF16, R>(W, (const float*)0, x, y, (const float*)0, E, K, 1, K, E, blockIdx.x * R);
  __shared__ int last;
  __shared__ float lg[256];
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    last = atomicAdd(cnt, 1) == (int)gridDim.x - 1;
    __threadfence();
  }
  __syncthreads();
  if (!last) return;  // block-uniform
  const int t = threadIdx.x;
  if (t < E) {
    float v;
    asm volatile("ld.global.cg.f32 %0, [%1];" : "=f"(v) : "l"(y + t));
    lg[t] = v;
  }
  __syncthreads();
  moe_route_rank_row(lg, bias, idx, wts, E, topk, ngroup, topk_group, norm, scale);
  if (t == 0) *cnt = 0;
}

#define ROUTER_RT_PARAMS                                                                                               \
  const u16 *__restrict__ W, const float *__restrict__ x, float *y, int E, int K, const float *__restrict__ bias,      \
      int *idx, float *wts, int topk, int ngroup, int topk_group, int norm, float scale, int *cnt

// The launchable variants, one per gemv_bf16_wide_r<R>, with its launch
// bounds (written out: NVRTC 11.8 crashed on macro-generated definitions).

extern "C" __global__ void __launch_bounds__(256, 4) gemv_bf16_wide_r1_rt(ROUTER_RT_PARAMS) {
  PDL_WAIT();
  router_route_rows<1>(W, x, y, E, K, bias, idx, wts, topk, ngroup, topk_group, norm, scale, cnt);
}

extern "C" __global__ void __launch_bounds__(256, 4) gemv_bf16_wide_r2_rt(ROUTER_RT_PARAMS) {
  PDL_WAIT();
  router_route_rows<2>(W, x, y, E, K, bias, idx, wts, topk, ngroup, topk_group, norm, scale, cnt);
}

extern "C" __global__ void __launch_bounds__(256, 4) gemv_bf16_wide_r4_rt(ROUTER_RT_PARAMS) {
  PDL_WAIT();
  router_route_rows<4>(W, x, y, E, K, bias, idx, wts, topk, ngroup, topk_group, norm, scale, cnt);
}

extern "C" __global__ void __launch_bounds__(256, 4) gemv_bf16_wide_r8_rt(ROUTER_RT_PARAMS) {
  PDL_WAIT();
  router_route_rows<8>(W, x, y, E, K, bias, idx, wts, topk, ngroup, topk_group, norm, scale, cnt);
}
