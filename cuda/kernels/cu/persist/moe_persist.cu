// Persistent MoE half of a decode layer for ONE input row (TILERT_GPU_MOE_PERSIST=1;
// cuda/kernels/moe_persist.go, NOTES.md "Persistent MoE (pmoe)"). Its own module
// (common.cuh + moe.cu + this file): the default module's source is untouched.
//
// One launch of co-resident blocks (the launcher sizes the grid to fit) does, with
// device-wide barriers on a global counter pair between the phases:
//   A  every block: x' = x (+ b), h = rmsnorm(x') * pw in shared memory (block 0 also
//      writes h); router rows (bf16 wide-GEMV arithmetic, TPR = 256/RR threads a row)
//      -> rlog; the shared expert's gate/up tiles (they do not wait for the routing)
//      -> eg row K.                                                        barrier 1
//   B  the shared expert's down tiles -> ey row K; then every block routes rlog
//      redundantly (moe_route_rank_row; block 0 writes eidx/ewts) and runs the routed
//      slots' gate/up tiles -> eg rows 0..K-1.                             barrier 2
//   C  the routed slots' down tiles -> ey rows 0..K-1.                     barrier 3
//   D  (mo set: every block, mo = shared + sum_j w_j ey_j, moe_combine_slots; x is then the
//      normed row itself, pw = 0, no norm in A: the TP shard's h in, its partial out.) Else
//      block v < nt/32 (one norm "virtual warp" of add_rmsnorm's nt threads):
//      x = x' + (shared + sum_j w_j ey_j) for its elements, the warp's sum of squares
//      -> part[v]; (y != 0) the nt/32 blocks meet at barrier 4, sum part[] in order and
//      write y = nw * (x * r). y == 0: the deferred norm (moe_combine_slots_res).
//
// Bits: every output is the default chain's at M = 1 (add_rmsnorm_reg / rmsnorm,
// gemv_bf16_wide_rR, moe_route_rank, gemv_tile_fp8_* of group size G, moe_combine_slots,
// add_rmsnorm_reg): the same per-thread order of products (split among the same
// number of threads, emulated where this block has fewer), the same fixed reduction
// orders. What differs is only which block computes a value and how many loads are
// in flight, which the sums do not depend on (gemv_tile.cu's variants rely on the same).
//
// Data written inside the launch is read with ld.global.cg (L2) or plain loads after the
// barrier's acquire, never through the non-coherent (__ldg / .nc) path.

// Shared device functions: persist.cuh.

template <int R, int LD>
__device__ __forceinline__ void moe_persist_body(float* x, const float* b, const float* __restrict__ pw, float* h, float eps,
                   const u16* __restrict__ rw, float* rlog, const float* __restrict__ bias, int* eidx, float* ewts,
                   int E, int K, int ngroup, int topk_group, int normtopk, float rscale, int RR,
                   const void* const* __restrict__ T0, const float* const* __restrict__ TS0,
                   const void* const* __restrict__ T1, const float* const* __restrict__ TS1,
                   const void* const* __restrict__ T2, const float* const* __restrict__ TS2, const void* shg,
                   const float* shgs, const void* shu, const float* shus, const void* shd, const float* shds,
                   float* eg, float* ey, int H, int MI, int Ggu, int Gd, float* y, const float* __restrict__ nw,
                   int nt, float* npart, unsigned* bar, float* mo) {
  __shared__ __align__(16) float hs[MP_MAXH];
  __shared__ float red[32];
  __shared__ float part[MP_THREADS / 32][8];
  __shared__ float lg[256];
  __shared__ int sidx[64];
  __shared__ float swts[64];
  __shared__ float sv[8][32];
  const unsigned nb = gridDim.x;
  const int bid = blockIdx.x, t = threadIdx.x;
  const bool hasSh = shg != 0;
  const int tguPer = (((MI + R / 2 - 1) / (R / 2)) + MP_THREADS / Ggu - 1) / (MP_THREADS / Ggu);  // gate/up tiles a slot
  const int tdPer = (((H + R - 1) / R) + MP_THREADS / Gd - 1) / (MP_THREADS / Gd);               // down tiles a slot

  // ---- A: norm, router, shared gate/up
  if (pw) {
    mp_norm(x, b, pw, hs, H, nt, eps, red);
    if (bid == 0) {
      for (int i = t; i < H; i += MP_THREADS) h[i] = hs[i];
    }
  } else {
    // x is the normed row already (the shard's h).
    mp_stage(x, (const float*)0, hs, H);
    __syncthreads();
  }
  {
    const int nr = (E + RR - 1) / RR;
    const int nA = nr + (hasSh ? tguPer : 0);
    for (int task = bid; task < nA; task += nb) {
      if (task < nr) {
        mp_router_task(rw, hs, rlog, E, H, RR, task * RR, &part[0][0], mp_nowait());
      } else {
        mp_tile_task<true, R, LD, false>(shg, shgs, shu, shus, hs, eg + (size_t)K * MI, MI, H, Ggu, task - nr, part, mp_nowait());
      }
    }
  }
  mp_barrier(bar, nb);

  // ---- B: shared down, routing, routed gate/up
  if (hasSh) {
    for (int task = bid; task < tdPer; task += nb)
      mp_tile_task<false, R, LD, false>(shd, shds, 0, 0, eg + (size_t)K * MI, ey + (size_t)K * H, H, MI, Gd, task, part, mp_nowait());
  }
  for (int i = t; i < E; i += MP_THREADS) lg[i] = __ldcg(rlog + i);
  __syncthreads();
  moe_route_rank_row(lg, bias, sidx, swts, E, K, ngroup, topk_group, normtopk, rscale);
  __syncthreads();
  if (bid == 0 && t < K) {
    eidx[t] = sidx[t];
    ewts[t] = swts[t];
  }
  for (int task = bid; task < K * tguPer; task += nb) {
    const int j = task / tguPer, bx = task - j * tguPer;
    const int e = sidx[j];
    mp_tile_task<true, R, LD, false>(T0[e], TS0 ? TS0[e] : (const float*)0, T1[e], TS1 ? TS1[e] : (const float*)0, hs,
                       eg + (size_t)j * MI, MI, H, Ggu, bx, part, mp_nowait());
  }
  mp_barrier(bar, nb);

  // ---- C: routed down
  for (int task = bid; task < K * tdPer; task += nb) {
    const int j = task / tdPer, bx = task - j * tdPer;
    const int e = sidx[j];
    mp_tile_task<false, R, LD, false>(T2[e], TS2 ? TS2[e] : (const float*)0, 0, 0, eg + (size_t)j * MI, ey + (size_t)j * H, H, MI,
                        Gd, bx, part, mp_nowait());
  }
  mp_barrier(bar, nb);

  // ---- D: combine + residual (+ norm)
  if (mo) {
    // The combine alone (moe_combine_slots): mo = shared + sum_j w_j ey_j.
    for (int i = bid * MP_THREADS + t; i < H; i += nb * MP_THREADS) {
      float yv[MP_MAXK];
#pragma unroll
      for (int jj = 0; jj < MP_MAXK; jj++) yv[jj] = jj < K ? __ldcg(ey + (size_t)jj * H + i) : 0.0f;
      const float shv = hasSh ? __ldcg(ey + (size_t)K * H + i) : 0.0f;
      float s = 0.0f;
#pragma unroll
      for (int jj = 0; jj < MP_MAXK; jj++)
        if (jj < K) s += swts[jj] * yv[jj];
      mo[i] = (hasSh ? shv : 0.0f) + s;
    }
    return;
  }
  const int nvw = nt / 32, per = (H + nt - 1) / nt;
  if (bid >= nvw) return;
  const int lane = t & 31, wp = t >> 5;
  for (int j = wp; j < per; j += MP_THREADS / 32) {
    const int i = bid * 32 + lane + j * nt;
    if (i < H) {
      // Every load first (one L2 round trip), then moe_combine_slots' and add_rmsnorm's
      // arithmetic in their order.
      float yv[MP_MAXK];
#pragma unroll
      for (int jj = 0; jj < MP_MAXK; jj++) yv[jj] = jj < K ? __ldcg(ey + (size_t)jj * H + i) : 0.0f;
      const float shv = hasSh ? __ldcg(ey + (size_t)K * H + i) : 0.0f;
      float xv = __ldcg(x + i);
      const float bv = b ? __ldcg(b + i) : 0.0f;
      float s = 0.0f;
#pragma unroll
      for (int jj = 0; jj < MP_MAXK; jj++)
        if (jj < K) s += swts[jj] * yv[jj];
      const float mv = (hasSh ? shv : 0.0f) + s;
      if (b) xv = xv + bv;
      const float v = xv + mv;
      x[i] = v;
      sv[j][lane] = v;
    }
  }
  if (y == 0) return;
  __syncthreads();
  if (wp == 0) {
    float ss = 0.0f;
    for (int j = 0; j < per; j++) {
      const int i = bid * 32 + lane + j * nt;
      if (i < H) ss += sv[j][lane] * sv[j][lane];
    }
    ss = warp_sum(ss);
    if (lane == 0) npart[bid] = ss;
  }
  mp_barrier(bar, (unsigned)nvw);
  if (t < nvw) red[t] = __ldcg(npart + t);  // one round trip, then the in-order sum
  __syncthreads();
  float r = 0.0f;
  for (int i = 0; i < nvw; i++) r += red[i];
  const float rr = rsqrtf(r / (float)H + eps);
  for (int j = wp; j < per; j += MP_THREADS / 32) {
    const int i = bid * 32 + lane + j * nt;
    if (i < H) y[i] = nw[i] * (sv[j][lane] * rr);
  }
}

extern "C" __global__ void __launch_bounds__(MP_THREADS, 2)
    moe_persist_m1(float* x, const float* b, const float* __restrict__ pw, float* h, float eps,
                   const u16* __restrict__ rw, float* rlog, const float* __restrict__ bias, int* eidx, float* ewts,
                   int E, int K, int ngroup, int topk_group, int normtopk, float rscale, int RR,
                   const void* const* __restrict__ T0, const float* const* __restrict__ TS0,
                   const void* const* __restrict__ T1, const float* const* __restrict__ TS1,
                   const void* const* __restrict__ T2, const float* const* __restrict__ TS2, const void* shg,
                   const float* shgs, const void* shu, const float* shus, const void* shd, const float* shds,
                   float* eg, float* ey, int H, int MI, int Ggu, int Gd, float* y, const float* __restrict__ nw,
                   int nt, float* npart, unsigned* bar, float* mo) {
  moe_persist_body<8, 8>(x, b, pw, h, eps, rw, rlog, bias, eidx, ewts, E, K, ngroup, topk_group, normtopk, rscale, RR, T0, TS0, T1, TS1, T2,
      TS2, shg, shgs, shu, shus, shd, shds, eg, ey, H, MI, Ggu, Gd, y, nw, nt, npart, bar, mo);
}

extern "C" __global__ void __launch_bounds__(MP_THREADS, 2)
    moe_persist_m1_d16(float* x, const float* b, const float* __restrict__ pw, float* h, float eps,
                   const u16* __restrict__ rw, float* rlog, const float* __restrict__ bias, int* eidx, float* ewts,
                   int E, int K, int ngroup, int topk_group, int normtopk, float rscale, int RR,
                   const void* const* __restrict__ T0, const float* const* __restrict__ TS0,
                   const void* const* __restrict__ T1, const float* const* __restrict__ TS1,
                   const void* const* __restrict__ T2, const float* const* __restrict__ TS2, const void* shg,
                   const float* shgs, const void* shu, const float* shus, const void* shd, const float* shds,
                   float* eg, float* ey, int H, int MI, int Ggu, int Gd, float* y, const float* __restrict__ nw,
                   int nt, float* npart, unsigned* bar, float* mo) {
  moe_persist_body<4, 16>(x, b, pw, h, eps, rw, rlog, bias, eidx, ewts, E, K, ngroup, topk_group, normtopk, rscale, RR, T0, TS0, T1, TS1, T2,
      TS2, shg, shgs, shu, shus, shd, shds, eg, ey, H, MI, Ggu, Gd, y, nw, nt, npart, bar, mo);
}

extern "C" __global__ void __launch_bounds__(MP_THREADS, 3)
    moe_persist_m1_b3(float* x, const float* b, const float* __restrict__ pw, float* h, float eps,
                   const u16* __restrict__ rw, float* rlog, const float* __restrict__ bias, int* eidx, float* ewts,
                   int E, int K, int ngroup, int topk_group, int normtopk, float rscale, int RR,
                   const void* const* __restrict__ T0, const float* const* __restrict__ TS0,
                   const void* const* __restrict__ T1, const float* const* __restrict__ TS1,
                   const void* const* __restrict__ T2, const float* const* __restrict__ TS2, const void* shg,
                   const float* shgs, const void* shu, const float* shus, const void* shd, const float* shds,
                   float* eg, float* ey, int H, int MI, int Ggu, int Gd, float* y, const float* __restrict__ nw,
                   int nt, float* npart, unsigned* bar, float* mo) {
  moe_persist_body<4, 8>(x, b, pw, h, eps, rw, rlog, bias, eidx, ewts, E, K, ngroup, topk_group, normtopk, rscale, RR, T0, TS0, T1, TS1, T2,
      TS2, shg, shgs, shu, shus, shd, shds, eg, ey, H, MI, Ggu, Gd, y, nw, nt, npart, bar, mo);
}
