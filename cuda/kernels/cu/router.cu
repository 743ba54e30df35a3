// Fused MoE router for decode rows (M <= 8): the router GEMV and
// the routing in one launch, where the engine ran gemv_bf16_wide_r<R> and
// then moe_route_rank (two short, latency-bound launches a MoE layer).
//
// GEMV part: gemv_bf16_wide_r<R>'s grid (a block of 256 threads owns R
// logits rows, split-K inside the block), with gemv_wide_rows's element-to-
// thread map, FMA order and fixed-order reductions, so every logit has the
// wide kernel's bits. The differences: each thread's first round of weight
// loads is issued before PDL_WAIT (weights are never written during a step;
// the loop's first trip is peeled onto those registers, which changes no
// arithmetic), and up to 8 rows of x run in one pass (a row's sums never mix
// with another row's, so a row has the same bits as in the <= 4-row
// launches the engine splits 8 rows into; MM = 4 or 8 sizes the
// accumulators: the 8-row form needs more registers). The logits are still
// written to y.
//
// Routing part: each block takes a ticket on ctr (an acq_rel atomic add
// after a barrier, so its stores are released with it); the block that
// takes the last one routes the M rows one after the other with
// moe_route_rank_row (moe_route_rank's bits), reading the logits through L2
// (ld.global.cg: other blocks wrote them in this launch) into shared memory,
// and puts ctr back to 0, so the next launch or graph replay needs no memset.
// Needs E <= 256 (one thread per expert in a 256-thread block).


__device__ __forceinline__ float ld_cg_f32(const float* p) {
  float v;
  asm volatile("ld.global.cg.f32 %0, [%1];" : "=f"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ unsigned atom_add_acq_rel(unsigned* p) {
  unsigned old;
  asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;" : "=r"(old) : "l"(p) : "memory");
  return old;
}

template <int R, int MM>
__device__ __forceinline__ void router_route(const u16* __restrict__ W, const float* __restrict__ x, float* y,
                                             const float* __restrict__ bias, int* idx, float* wts,
                                             unsigned* ctr, int N, int K, int M, int ldx, int ldy, int RK,
                                             int ngroup, int topk_group, int norm, float scale) {
  typedef WBF16 T;
  constexpr int TPR = 256 / R;  // threads per row
  constexpr int WPR = TPR / 32;  // warps per row
  __shared__ float part[8][MM];
  __shared__ float lgs[256];
  __shared__ int last;
  const int n0 = blockIdx.x * R;
  const int t = threadIdx.x;
  const int r = t / TPR, tr = t % TPR;
  const int n = min(n0 + r, N - 1);  // rows past N repeat the last one; not written
  const char* wr = (const char*)W + (size_t)n * K * T::BYTES;
  const int C = K / T::E;  // 16-byte chunks of T::E weights
  // The first trip's weights, before the wait (weights only).
  uint4 w0[GEMV_WIDE_U];
#pragma unroll
  for (int u = 0; u < GEMV_WIDE_U; u++) {
    const int c = tr + u * TPR;
    w0[u] = c < C ? ldg_stream16(wr + (size_t)c * 16) : make_uint4(0u, 0u, 0u, 0u);
  }
  PDL_WAIT();
  float acc[MM];
#pragma unroll
  for (int m = 0; m < MM; m++) acc[m] = 0.0f;
  for (int c0 = tr; c0 < C; c0 += TPR * GEMV_WIDE_U) {
    uint4 wv[GEMV_WIDE_U];
    if (c0 == tr) {
#pragma unroll
      for (int u = 0; u < GEMV_WIDE_U; u++) wv[u] = w0[u];
    } else {
#pragma unroll
      for (int u = 0; u < GEMV_WIDE_U; u++) {
        const int c = c0 + u * TPR;
        wv[u] = c < C ? ldg_stream16(wr + (size_t)c * 16) : make_uint4(0u, 0u, 0u, 0u);
      }
    }
#pragma unroll
    for (int u = 0; u < GEMV_WIDE_U; u++) {
      const int c = c0 + u * TPR;
      if (c < C) {
        float wf[T::E];
        T::dec(wv[u], wf);
#pragma unroll
        for (int m = 0; m < MM; m++) {
          if (m < M) {
            const float4* xp = (const float4*)(x + (size_t)m * ldx + (size_t)c * T::E);
            float p = 0.0f;
#pragma unroll
            for (int q = 0; q < T::E / 4; q++) {
              const float4 v = __ldg(xp + q);
              p += wf[4 * q] * v.x;
              p += wf[4 * q + 1] * v.y;
              p += wf[4 * q + 2] * v.z;
              p += wf[4 * q + 3] * v.w;
            }
            // gemv_wide_rows adds p * sc with sc = 1.0f for bf16: the same value.
            acc[m] += p;
          }
        }
      }
    }
  }
#pragma unroll
  for (int m = 0; m < MM; m++) acc[m] = warp_sum(acc[m]);
  const int w = t >> 5;
  if ((t & 31) == 0) {
#pragma unroll
    for (int m = 0; m < MM; m++) part[w][m] = acc[m];
  }
  __syncthreads();
  if (t < R * M) {
    const int rr = t / M, m = t - rr * M;
    float v = 0.0f;
#pragma unroll
    for (int i = 0; i < WPR; i++) v += part[rr * WPR + i][m];
    if (n0 + rr < N) {
      // gemv_wide_rows with resid = 0 stores v + 0.0f (-0 becomes +0).
      y[(size_t)m * ldy + n0 + rr] = v + 0.0f;
    }
  }
  // The ticket: the barrier orders the block's logit stores before thread
  // 0's acq_rel add at GPU scope (release: they are visible to whoever
  // acquires a later value of ctr; acquire: the last block then sees every
  // block's stores, and its barrier passes that on to its threads). A
  // cooperative grid sync's pattern, with acq_rel in place of
  // __threadfence()'s sequentially consistent fences, which cost more.
  __syncthreads();
  if (t == 0) last = atom_add_acq_rel(ctr) == gridDim.x - 1;
  __syncthreads();
  if (!last) return;
  if (t == 0) *ctr = 0u;  // every block has taken its ticket
  for (int m = 0; m < M; m++) {
    if (t < N) lgs[t] = ld_cg_f32(y + (size_t)m * ldy + t);
    __syncthreads();
    moe_route_rank_row(lgs, bias, idx + (size_t)m * RK, wts + (size_t)m * RK, N, RK, ngroup, topk_group, norm,
                       scale);
    __syncthreads();
  }
}

// Written out per R and MM (NVRTC 11.8 crashed on macro-generated
// definitions in gemv_wide.cu). The first statement is router_route's
// pre-wait weight loads, not PDL_WAIT(): pdl.go's pdlWeightsFirst lists
// these. Launch bounds (ptxas 12.9, sm_90a): capped at 64 registers (4
// blocks an SM, as gemv_bf16_wide) the 4-row forms spilled 8 bytes and the
// 8-row forms 32; at 3 blocks an SM the 4-row forms take 80 and at 2 the
// 8-row forms 114, no spills, and E = 256 one-row blocks still fit 132 SMs.

extern "C" __global__ void __launch_bounds__(256, 3)
    moe_router_route_r1_m4(const u16* __restrict__ W, const float* __restrict__ x, float* y,
                           const float* __restrict__ bias, int* idx, float* wts, unsigned* ctr, int N, int K, int M,
                           int ldx, int ldy, int RK, int ngroup, int topk_group, int norm, float scale) {
  router_route<1, 4>(W, x, y, bias, idx, wts, ctr, N, K, M, ldx, ldy, RK, ngroup, topk_group, norm, scale);
}

extern "C" __global__ void __launch_bounds__(256, 2)
    moe_router_route_r1_m8(const u16* __restrict__ W, const float* __restrict__ x, float* y,
                           const float* __restrict__ bias, int* idx, float* wts, unsigned* ctr, int N, int K, int M,
                           int ldx, int ldy, int RK, int ngroup, int topk_group, int norm, float scale) {
  router_route<1, 8>(W, x, y, bias, idx, wts, ctr, N, K, M, ldx, ldy, RK, ngroup, topk_group, norm, scale);
}

extern "C" __global__ void __launch_bounds__(256, 3)
    moe_router_route_r2_m4(const u16* __restrict__ W, const float* __restrict__ x, float* y,
                           const float* __restrict__ bias, int* idx, float* wts, unsigned* ctr, int N, int K, int M,
                           int ldx, int ldy, int RK, int ngroup, int topk_group, int norm, float scale) {
  router_route<2, 4>(W, x, y, bias, idx, wts, ctr, N, K, M, ldx, ldy, RK, ngroup, topk_group, norm, scale);
}

extern "C" __global__ void __launch_bounds__(256, 2)
    moe_router_route_r2_m8(const u16* __restrict__ W, const float* __restrict__ x, float* y,
                           const float* __restrict__ bias, int* idx, float* wts, unsigned* ctr, int N, int K, int M,
                           int ldx, int ldy, int RK, int ngroup, int topk_group, int norm, float scale) {
  router_route<2, 8>(W, x, y, bias, idx, wts, ctr, N, K, M, ldx, ldy, RK, ngroup, topk_group, norm, scale);
}

extern "C" __global__ void __launch_bounds__(256, 3)
    moe_router_route_r4_m4(const u16* __restrict__ W, const float* __restrict__ x, float* y,
                           const float* __restrict__ bias, int* idx, float* wts, unsigned* ctr, int N, int K, int M,
                           int ldx, int ldy, int RK, int ngroup, int topk_group, int norm, float scale) {
  router_route<4, 4>(W, x, y, bias, idx, wts, ctr, N, K, M, ldx, ldy, RK, ngroup, topk_group, norm, scale);
}

extern "C" __global__ void __launch_bounds__(256, 2)
    moe_router_route_r4_m8(const u16* __restrict__ W, const float* __restrict__ x, float* y,
                           const float* __restrict__ bias, int* idx, float* wts, unsigned* ctr, int N, int K, int M,
                           int ldx, int ldy, int RK, int ngroup, int topk_group, int norm, float scale) {
  router_route<4, 8>(W, x, y, bias, idx, wts, ctr, N, K, M, ldx, ldy, RK, ngroup, topk_group, norm, scale);
}

extern "C" __global__ void __launch_bounds__(256, 3)
    moe_router_route_r8_m4(const u16* __restrict__ W, const float* __restrict__ x, float* y,
                           const float* __restrict__ bias, int* idx, float* wts, unsigned* ctr, int N, int K, int M,
                           int ldx, int ldy, int RK, int ngroup, int topk_group, int norm, float scale) {
  router_route<8, 4>(W, x, y, bias, idx, wts, ctr, N, K, M, ldx, ldy, RK, ngroup, topk_group, norm, scale);
}

extern "C" __global__ void __launch_bounds__(256, 2)
    moe_router_route_r8_m8(const u16* __restrict__ W, const float* __restrict__ x, float* y,
                           const float* __restrict__ bias, int* idx, float* wts, unsigned* ctr, int N, int K, int M,
                           int ldx, int ldy, int RK, int ngroup, int topk_group, int norm, float scale) {
  router_route<8, 8>(W, x, y, bias, idx, wts, ctr, N, K, M, ldx, ldy, RK, ngroup, topk_group, norm, scale);
}
