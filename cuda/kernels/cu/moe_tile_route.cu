// The routed experts' gate/up tile GEMV with the routing inside (issue 10,
// TILERT_GPU_ROUTE_IN_GEMV=1; kernels.ExpertsFP8Routed). At one to four
// decode rows the MoE front is a latency chain: router GEMV -> moe_route_rank
// (one block a row) -> this GEMV, and the routing launch costs its launch
// boundary more than its work. Here every block of a routed slot routes its
// own row right after its PDL wait (the row's E router logits are in L2),
// with moe_route_rank_row itself - the same code, so the same experts and
// weights bit for bit - into shared memory, and takes its slot's expert from
// there; gemv_tile_body then runs as in gemv_tile_fp8_r*_m1_d16 (the same
// sums). Block 0 of each row's first slot also stores the row's ids and
// weights (the down GEMV and the combine read them; they run after this
// launch has completed). Dense slots (the shared expert) route nothing.
//
// Needs blockDim (TILE_THREADS) >= E (moe_route_rank_row's contract),
// xdiv = topk (slot j is row j / topk's choice j % topk) and slots <=
// ROUTE_IN_SLOTS; the launcher checks and otherwise runs moe_route_rank and
// the plain kernel.
#define ROUTE_IN_SLOTS 64

template <int R>
__device__ __forceinline__ void gemv_tile_route_body(const void* const* __restrict__ T0,
                                                     const float* const* __restrict__ TS0,
                                                     const void* const* __restrict__ T1,
                                                     const float* const* __restrict__ TS1, int slots, const void* W0,
                                                     const float* S0, const void* W1, const float* S1,
                                                     const float* __restrict__ x, int ldx, int xsh, float* y, int ldy,
                                                     int N, int K, int G, int fold, const float* lg,
                                                     const float* __restrict__ bias, int* eidx, float* ewts, int E,
                                                     int topk, int ngroup, int topk_group, int norm, float scale) {
  // Slot j's expert is rid[j] (gemv_tile_body reads ids[blockIdx.y]); only
  // this block's row's topk entries are written.
  __shared__ int rid[ROUTE_IN_SLOTS];
  __shared__ float rwt[ROUTE_IN_SLOTS];
  const int j = blockIdx.y;
  if (j < slots) {  // uniform over the block: its barriers are safe
    const int row = j / topk, r0 = row * topk;
    moe_route_rank_row(lg + (size_t)row * E, bias, rid + r0, rwt + r0, E, topk, ngroup, topk_group, norm, scale);
    __syncthreads();
    if (blockIdx.x == 0 && j == r0 && threadIdx.x < topk) {
      eidx[r0 + threadIdx.x] = rid[r0 + threadIdx.x];
      ewts[r0 + threadIdx.x] = rwt[r0 + threadIdx.x];
    }
  }
  gemv_tile_body<TFP8, R, 1, 16>(T0, TS0, T1, TS1, rid, slots, W0, S0, W1, S1, x, ldx, topk, xsh, y, ldy,
                                 (const float*)0, N, K, 1, G, fold);
}

// The launchable variants, written out (NVRTC 11.8 crashes on macro-generated
// kernel definitions): gemv_tile_fp8_r{2,4,8}_m1_d16 with the routing.
extern "C" __global__ void __launch_bounds__(TILE_THREADS, 2)
    gemv_tile_fp8_r2_m1_d16_route(const void* const* __restrict__ T0, const float* const* __restrict__ TS0,
                                  const void* const* __restrict__ T1, const float* const* __restrict__ TS1,
                                  int slots, const void* W0, const float* S0, const void* W1, const float* S1,
                                  const float* __restrict__ x, int ldx, int xsh, float* y, int ldy, int N, int K,
                                  int G, int fold, const float* lg, const float* __restrict__ bias, int* eidx,
                                  float* ewts, int E, int topk, int ngroup, int topk_group, int norm, float scale) {
  PDL_WAIT();
  gemv_tile_route_body<2>(T0, TS0, T1, TS1, slots, W0, S0, W1, S1, x, ldx, xsh, y, ldy, N, K, G, fold, lg, bias, eidx,
                          ewts, E, topk, ngroup, topk_group, norm, scale);
}

extern "C" __global__ void __launch_bounds__(TILE_THREADS, 2)
    gemv_tile_fp8_r4_m1_d16_route(const void* const* __restrict__ T0, const float* const* __restrict__ TS0,
                                  const void* const* __restrict__ T1, const float* const* __restrict__ TS1,
                                  int slots, const void* W0, const float* S0, const void* W1, const float* S1,
                                  const float* __restrict__ x, int ldx, int xsh, float* y, int ldy, int N, int K,
                                  int G, int fold, const float* lg, const float* __restrict__ bias, int* eidx,
                                  float* ewts, int E, int topk, int ngroup, int topk_group, int norm, float scale) {
  PDL_WAIT();
  gemv_tile_route_body<4>(T0, TS0, T1, TS1, slots, W0, S0, W1, S1, x, ldx, xsh, y, ldy, N, K, G, fold, lg, bias, eidx,
                          ewts, E, topk, ngroup, topk_group, norm, scale);
}

extern "C" __global__ void __launch_bounds__(TILE_THREADS, 2)
    gemv_tile_fp8_r8_m1_d16_route(const void* const* __restrict__ T0, const float* const* __restrict__ TS0,
                                  const void* const* __restrict__ T1, const float* const* __restrict__ TS1,
                                  int slots, const void* W0, const float* S0, const void* W1, const float* S1,
                                  const float* __restrict__ x, int ldx, int xsh, float* y, int ldy, int N, int K,
                                  int G, int fold, const float* lg, const float* __restrict__ bias, int* eidx,
                                  float* ewts, int E, int topk, int ngroup, int topk_group, int norm, float scale) {
  PDL_WAIT();
  gemv_tile_route_body<8>(T0, TS0, T1, TS1, slots, W0, S0, W1, S1, x, ldx, xsh, y, ldy, N, K, G, fold, lg, bias, eidx,
                          ewts, E, topk, ngroup, topk_group, norm, scale);
}
