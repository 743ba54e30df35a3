// gemv_bulk_fp8_g<G>_r8: one input row's fp8 GEMV (y = W x with 128x128
// block scales, + resid) whose weights reach shared memory by the bulk copy
// engine (cp.async.bulk, sm_90) through a ring of stages, each completed on
// its own mbarrier (kernels.GemvBulk, the tile plan variant _bk;
// cuda/kernels/NOTES.md "gemv_bulk"). Why: a 16-byte ld.global stream keeps
// a request per load in flight, and an SM so streams at about its share of
// the copy rate however early the others finish (session 15), so a launch
// takes its busiest SM's bytes; a bulk copy moves a whole range per
// instruction (TestKernelTimingSMRate measures both).
//
// Rows: group tiles of 8 rows, dealt out as the _d16s tile kernels deal
// them: block b's group grp takes tiles ((it * NG + grp) * grid + b), NG =
// 256 / G groups a block, so every SM is within one tile of the mean. The
// sums: lane tg of a group sums chunks tg, tg + G, ... of each of its rows
// (stage kc holds chunk kc * G + tg of every row), each chunk with
// TILE_CHUNK_M1 and its scale, then warp_sum and the group's warps in
// order: gemv_tile_gs_body's one-row sums statement for statement, so the
// same floats bit for bit as every G plan (TestKernelGemvBulk).
//
// A stage is NG x 8 row slices of G x 16 bytes (32 KB for G 32 and 64),
// one bulk copy a slice issued by a lane of warp 0; the first NS stages are
// issued before the PDL wait by gemv_bulk_issue, which reads nothing but W
// (weights: never written during a step; TestPDLWeightsFirst). Dynamic
// shared memory: the stages' mbarriers (GB_BARS bytes), then NS stages.
// Needs N % 8 == 0, K % (16 G) == 0, 16-byte aligned W, NS <= GB_MAX_STAGES.

#define GB_ROWS 8
#define GB_MAX_STAGES 8
#define GB_BARS 128

__device__ __forceinline__ void gb_expect(u64* bar, u32 bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  u64 st;
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 %0, [%1], %2;"
               : "=l"(st)
               : "r"((u32)__cvta_generic_to_shared(bar)), "r"(bytes)
               : "memory");
#endif
}

__device__ __forceinline__ void gb_copy(void* dst, const void* src, u32 bytes, u64* bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                   (u32)__cvta_generic_to_shared(dst)),
               "l"(src), "r"(bytes), "r"((u32)__cvta_generic_to_shared(bar))
               : "memory");
#endif
}

__device__ __forceinline__ void gb_wait(u64* bar, u32 parity) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "{\n .reg .pred P;\n"
      "GB_WAIT:\n mbarrier.try_wait.parity.shared::cta.b64 P, [%0], %1;\n @!P bra GB_WAIT;\n}" ::"r"(
          (u32)__cvta_generic_to_shared(bar)),
      "r"(parity)
      : "memory");
#endif
}

// Stage j of the block's sequence (tile round j / spt, chunk column j % spt)
// into ring slot j % ns: warp 0 only; lane 0 arms the slot's barrier with the
// round's bytes, then lane l copies row slice l (group l / 8, row l % 8).
template <int G>
__device__ __forceinline__ void gb_issue(const u8* __restrict__ W, int N, int K, int j, int spt, int ns, u8* ring,
                                         u64* bars) {
  constexpr int NG = TILE_THREADS / G, KS = G * 16;
  const int lane = threadIdx.x & 31;
  const int it = j / spt, kc = j - it * spt, slot = j % ns;
  const int grid = (int)gridDim.x, b = (int)blockIdx.x;
  // Groups with a tile this round: the first ones (tiles grow with grp).
  int live = 0;
#pragma unroll
  for (int g = 0; g < NG; g++) live += ((it * NG + g) * grid + b) * GB_ROWS < N;
  if (lane == 0) gb_expect(bars + slot, (u32)(live * GB_ROWS * KS));
  __syncwarp();
  for (int l = lane; l < NG * GB_ROWS; l += 32) {
    const int g = l / GB_ROWS, r = l - g * GB_ROWS;
    const int n0 = ((it * NG + g) * grid + b) * GB_ROWS;
    if (n0 < N)
      gb_copy(ring + (size_t)slot * NG * GB_ROWS * KS + (size_t)l * KS, W + (size_t)(n0 + r) * K + (size_t)kc * KS, KS,
              bars + slot);
  }
}

// The block's stage count: rounds of its group tiles times stage columns.
template <int G>
__device__ __forceinline__ int gb_total(int N, int K) {
  constexpr int NG = TILE_THREADS / G;
  const int grid = (int)gridDim.x;
  return ((N / GB_ROWS + grid * NG - 1) / (grid * NG)) * (K / (G * 16));
}

// Before the PDL wait: thread 0 initialises the stages' barriers, then warp
// 0 issues the first ns stages. Reads W only.
template <int G>
__device__ __forceinline__ void gemv_bulk_issue(const u8* __restrict__ W, int N, int K, int ns) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ __align__(128) u8 gb_sh[];
  u64* bars = (u64*)gb_sh;
  if (threadIdx.x == 0) {
    for (int s = 0; s < ns; s++)
      asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"((u32)__cvta_generic_to_shared(bars + s)) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncwarp();
  const int total = gb_total<G>(N, K), spt = K / (G * 16);
  if ((threadIdx.x >> 5) == 0)
    for (int j = 0; j < ns && j < total; j++) gb_issue<G>(W, N, K, j, spt, ns, gb_sh + GB_BARS, bars);
#endif
}

// After the wait: the sums as the stages land, the next stages issued as
// slots free up.
template <int G>
__device__ __forceinline__ void gemv_bulk_body(const u8* __restrict__ W, const float* __restrict__ S,
                                               const float* __restrict__ x, float* y, const float* resid, int N,
                                               int K, int ns) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr int NG = TILE_THREADS / G, KS = G * 16, R = GB_ROWS;
  extern __shared__ __align__(128) u8 gb_sh[];
  u64* bars = (u64*)gb_sh;
  u8* gb_ring = gb_sh + GB_BARS;
  __shared__ float part[TILE_THREADS / 32][R];
  const int grp = threadIdx.x / G, tg = threadIdx.x - grp * G;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int grid = (int)gridDim.x, b = (int)blockIdx.x;
  const int kb = (K + 127) >> 7, spt = K / KS;
  const int total = gb_total<G>(N, K);
  __syncthreads();  // the barriers' init, before any thread waits on them
  float acc[R];
#pragma unroll
  for (int r = 0; r < R; r++) acc[r] = 0.0f;
  for (int j = 0; j < total; j++) {
    const int it = j / spt, kc = j - it * spt, slot = j % ns;
    const int n0 = ((it * NG + grp) * grid + b) * R;
    gb_wait(bars + slot, (u32)((j / ns) & 1));
    if (n0 < N) {
      const int c = kc * G + tg;
      const uint4* sl = (const uint4*)(gb_ring + (size_t)slot * NG * R * KS + (size_t)grp * R * KS) + tg;
      uint4 wv[R];
#pragma unroll
      for (int r = 0; r < R; r++) wv[r] = sl[(size_t)r * (KS / 16)];
      const float s = S[(size_t)(n0 >> 7) * kb + ((c * TFP8::E) >> 7)];
      const float* xc = x + (size_t)c * TFP8::E;
      float p[R];
      TILE_CHUNK_M1(TFP8, R, xc, (const float*)0, 1.0f, wv, p)
#pragma unroll
      for (int r = 0; r < R; r++) acc[r] = fmaf(p[r], s, acc[r]);
    }
    __syncthreads();  // every thread is done with the slot
    if (warp == 0 && j + ns < total) gb_issue<G>(W, N, K, j + ns, spt, ns, gb_ring, bars);
    if (kc == spt - 1) {
      // The round's rows: gemv_tile_gs_body's reduction.
#pragma unroll
      for (int r = 0; r < R; r++) acc[r] = warp_sum(acc[r]);
      if (lane == 0) {
#pragma unroll
        for (int r = 0; r < R; r++) part[warp][r] = acc[r];
      }
      __syncthreads();
      for (int t = tg; t < R; t += G) {
        const int wpg = G >> 5, w0i = grp * wpg;
        float v = 0.0f;
        for (int i = 0; i < wpg; i++) v += part[w0i + i][t];
        if (n0 + t < N) y[n0 + t] = v + (resid ? resid[n0 + t] : 0.0f);
      }
#pragma unroll
      for (int r = 0; r < R; r++) acc[r] = 0.0f;
      if (j + 1 < total) __syncthreads();  // part is reused next round
    }
  }
#endif
}

extern "C" __global__ void __launch_bounds__(TILE_THREADS, 1)
    gemv_bulk_fp8_g32_r8(const u8* __restrict__ W, const float* __restrict__ S, const float* __restrict__ x, float* y,
                         const float* resid, int N, int K, int ns) {
  gemv_bulk_issue<32>(W, N, K, ns);
  PDL_WAIT();
  gemv_bulk_body<32>(W, S, x, y, resid, N, K, ns);
}

extern "C" __global__ void __launch_bounds__(TILE_THREADS, 1)
    gemv_bulk_fp8_g64_r8(const u8* __restrict__ W, const float* __restrict__ S, const float* __restrict__ x, float* y,
                         const float* resid, int N, int K, int ns) {
  gemv_bulk_issue<64>(W, N, K, ns);
  PDL_WAIT();
  gemv_bulk_body<64>(W, S, x, y, resid, N, K, ns);
}
