// gemv_stage_fp8_r8_m1: one input row's fp8 GEMV (y = W x with 128x128 block
// scales, + resid) whose blocks copy their whole share of W and its scales
// into shared memory BEFORE their PDL wait, so that under a programmatic
// launch the weights stream while the kernel before it still runs, and after
// the wait only x's read, the products from shared memory and the stores
// remain (kernels.GemvStage, the tile plan variant _st; cuda/kernels/NOTES.md
// "gemv_stage"). Meant for the indexer's wq_b, which follows the layer-input
// grouped GEMV (~9 us of streaming that leaves bandwidth spare) and heads the
// step's critical chain: a tile GEMV waits before its first load, so today
// its 12.6 MB stream only after q_a is complete, beside q_b.
//
// Block b owns rows [RB b, RB b + RB), RB = 8 x its warps: warp w is a
// gemv_tile group of G 32 threads and R 8 rows (rows RB b + 8 w ..), and its
// lane tg sums the 16-byte chunks tg, tg + 32, .. of those rows in that order
// with TILE_CHUNK_M1, scales each chunk's sum once, then warp_sum, as
// gemv_tile_body's one-row path does with G 32 / R 8: the same floats bit for
// bit (TestKernelGemvStage). Needs N % RB == 0 (so RB divides 128 and the
// block's rows share one scale row), K % 512 == 0 (every lane the same chunk
// count), RB x K + K / 32 bytes of dynamic shared memory, 16-byte aligned W
// and x (the launcher checks and falls back to the tile kernels).
//
// Before the wait a block reads only W and S (weights: never written during
// a step) and writes only its own shared memory (TestPDLWeightsFirst checks
// the body's form). cp.async: sm_80+.

// The block's weights and scale row into dynamic shared memory: RB rows of K
// bytes (contiguous in W), then the scale row's K / 128 floats.
__device__ __forceinline__ void gemv_stage_issue(const void* __restrict__ W, const float* __restrict__ S, int K) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  extern __shared__ __align__(16) uint4 gst_sh[];
  const int rb = (int)blockDim.x >> 2;  // 8 rows a warp
  const int chunks = rb * (K >> 4);
  const char* src = (const char*)W + (size_t)blockIdx.x * rb * K;
#ifdef TILERT_L2_EVICT_FIRST
  u64 pol;
  asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
#endif
  for (int i = threadIdx.x; i < chunks; i += blockDim.x) {
    const u32 dst = (u32)__cvta_generic_to_shared(gst_sh + i);
#ifdef TILERT_L2_EVICT_FIRST
    asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2;" ::"r"(dst), "l"(src + (size_t)i * 16),
                 "l"(pol)
                 : "memory");
#else
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src + (size_t)i * 16) : "memory");
#endif
  }
  const int kb = K >> 7;
  if ((int)threadIdx.x < kb) {
    const float* srow = S + (size_t)((blockIdx.x * rb) >> 7) * kb;
    const u32 dst = (u32)__cvta_generic_to_shared((float*)(gst_sh + chunks) + threadIdx.x);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(dst), "l"(srow + threadIdx.x) : "memory");
  }
  asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}

// After the wait: the block's sums from shared memory (gemv_tile_body's
// one-row path with G 32 / R 8, statement for statement).
__device__ __forceinline__ void gemv_stage_body(const float* __restrict__ x, float* y, const float* resid, int K) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  extern __shared__ __align__(16) uint4 gst_sh[];
  asm volatile("cp.async.wait_all;" ::: "memory");
  __syncthreads();  // the scale row was copied by other threads
  const int rb = (int)blockDim.x >> 2;
  const int C = K >> 4;
  const int w = threadIdx.x >> 5, tg = threadIdx.x & 31;
  const uint4* wrow = gst_sh + (size_t)w * 8 * C;
  const float* sc = (const float*)(gst_sh + rb * C);
  float acc[8];
#pragma unroll
  for (int r = 0; r < 8; r++) acc[r] = 0.0f;
  for (int c = tg; c < C; c += 32) {
    const float* xc = x + (size_t)c * TFP8::E;
    const float s = sc[(c * TFP8::E) >> 7];
    // Four rows at a time (a row's sums do not depend on the others': the
    // same floats as all eight at once, in fewer registers).
#pragma unroll
    for (int h = 0; h < 8; h += 4) {
      uint4 wv[4];
#pragma unroll
      for (int r = 0; r < 4; r++) wv[r] = wrow[(size_t)(h + r) * C + c];
      float p[4];
      TILE_CHUNK_M1(TFP8, 4, xc, (const float*)0, 1.0f, wv, p)
#pragma unroll
      for (int r = 0; r < 4; r++) acc[h + r] = fmaf(p[r], s, acc[h + r]);
    }
  }
  // warp_sum leaves every lane the same sum (each butterfly step adds the
  // same two values); lane r stores row r as gemv_tile_body's group does:
  // 0 + the one warp's partial, + resid or 0.
  float mine = 0.0f;
#pragma unroll
  for (int r = 0; r < 8; r++) {
    const float v = warp_sum(acc[r]);
    if (tg == r) mine = v;
  }
  if (tg < 8) {
    const int n = (int)blockIdx.x * rb + w * 8 + tg;
    float v = 0.0f;
    v += mine;
    y[n] = v + (resid ? resid[n] : 0.0f);
  }
#endif
}

// (4 blocks of 256 an SM: at most 64 registers, TestNVRTCStageRegisters.)
extern "C" __global__ void __launch_bounds__(TILE_THREADS, 4)
    gemv_stage_fp8_r8_m1(const void* __restrict__ W, const float* __restrict__ S, const float* __restrict__ x,
                         float* y, const float* resid, int K) {
  gemv_stage_issue(W, S, K);
  PDL_WAIT();
  gemv_stage_body(x, y, resid, K);
}
