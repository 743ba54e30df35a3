// Dataflow form of the persistent MoE half (TILERT_GPU_MOE_PERSIST=1 with
// TILERT_GPU_MOE_PERSIST_V=flow; cuda/kernels/NOTES.md "moe_flow"): the same tasks and
// arithmetic as moe_persist_m1 (persist.cuh), but no device-wide barrier. Blocks take
// tasks in one fixed global order from a ticket counter; a task waits only for the
// readiness counters of its own inputs, and every counter a task waits on is signalled
// only by tasks of lower tickets (moeFlowSchedule in moe_flow.go replays the order and
// checks this), so any number of resident blocks >= 1 finishes: no co-residency needed.
//
// Tickets (the order; n* counts, see moeFlowSchedule):
//   router rows (nr)        wait nothing; the block's norm is computed lazily under the
//                           first task's weight loads                -> ROUTER
//   shared gate/up (tgu)    wait nothing (the block's norm)          -> SHGU
//   route                   wait ROUTER; writes eidx/ewts (and h)    -> RT
//   routed gate/up (K*tgu)  wait ROUTER (the block routes once, redundantly, as
//                           moe_persist's phase B), then the expert's weights -> SLOT[j]
//   shared down (td)        weights first, then wait SHGU == tgu    -> DOWN
//   routed down (K*td)      routing (done long before), weights, wait SLOT[j] == tgu -> DOWN
//   combine (nc)            wait DOWN == (K+sh)*td and RT (the route task's norm may
//                           read x late; the combine rewrites it)    -> COMB
//   next norm (ny)          wait COMB == nc
// Control words (ctl = the launch's 256-byte control buffer; moe_persist's barrier uses
// words 0-1, its norm partials bytes 64-191): 2 ticket, 3 exits, 4 ROUTER, 5 SHGU, 6 DOWN,
// 7 COMB, 8 RT, 15 launches done (advanced by the last block out: the engine test's proof that
// this kernel ran), 48..63 SLOT[j]. The last block to leave puts every counter back to 0
// (all others have left: none reads them again), so launches and graph replays need no
// host reset.
//
// Ordering: a task's outputs are written, __syncthreads, thread 0 fences and adds 1
// (release); a waiter's thread 0 spins on ld.acquire.gpu (+ fence), then bar.sync; data
// written in the launch is then read with ld.global.cg (rlog, ey, x, the norm partials)
// or plain loads (eg rows, as moe_persist), never the non-coherent path. A wait past
// MP_TIMEOUT_NS traps.

#define MF_TICKET 2
#define MF_EXIT 3
#define MF_ROUTER 4
#define MF_SHGU 5
#define MF_DOWN 6
#define MF_COMB 7
#define MF_RT 8
#define MF_RUNS 15
#define MF_SLOT 48

// Block-wide wait until *c >= n (thread 0 spins; acquire; then the block).
__device__ __forceinline__ void mf_wait(const unsigned* c, unsigned n) {
  if (threadIdx.x == 0) {
    if (mp_ld_acquire(c) < n) {
      const u64 t0 = mp_now();
      while (mp_ld_acquire(c) < n) {
        __nanosleep(32);
        if (mp_now() - t0 > MP_TIMEOUT_NS) __trap();
      }
    }
    __threadfence();
  }
  __syncthreads();
}

// The block's writes of the task are done: count it on c (release).
__device__ __forceinline__ void mf_signal(unsigned* c) {
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    atomicAdd(c, 1u);
  }
}

// The block's h row (norm of x (+ b) by pw, or the shard's normed row x as it is) in
// shared memory (inlined: as a call, its ABI cost moe_flow_m1 12 B of spills).
__device__ __forceinline__ void mf_norm(const float* x, const float* b, const float* pw, float* hs, int H, int nt, float eps,
                                     float* red) {
  if (pw) {
    mp_norm(x, b, pw, hs, H, nt, eps, red);
  } else {
    mp_stage(x, (const float*)0, hs, H);
    __syncthreads();
  }
}

// The routing in shared memory once every router row is counted (moe_persist's phase B
// in one block). Not inlined: inlined into its four task kinds (with the norm) the
// module took 50 s instead of 19 s to compile with NVRTC 12.9 here; it runs once a block.
__device__ __noinline__ void mf_route(const unsigned* c, unsigned n, const float* rlog, float* lg, const float* bias,
                                      int* sidx, float* swts, int E, int K, int ngroup, int topk_group, int normtopk,
                                      float rscale) {
  mf_wait(c, n);
  for (int i = threadIdx.x; i < E; i += MP_THREADS) lg[i] = __ldcg(rlog + i);
  __syncthreads();
  moe_route_rank_row(lg, bias, sidx, swts, E, K, ngroup, topk_group, normtopk, rscale);
  __syncthreads();
}

// The first weight lines of ticket nx into L2 (its router row, or its tile's first
// round; routed tiles only once the block has routed: sidx != 0). Not inlined: its
// registers are free again before the task runs (inlined, moe_flow_m1 spilled 70 B).
template <int R, int LD>
__device__ __noinline__ void mf_prefetch_next(int nx, int tSG, int tRT, int tGU, int tSD, int tD, int tC, int tgu, int td,
                                              int RR, int E, int H, int MI, int Ggu, int Gd, const u16* rw, const void* shg,
                                              const void* shu, const void* shd, const void* const* T0,
                                              const void* const* T1, const void* const* T2, const int* sidx) {
  const int t = threadIdx.x;
  if (nx < tSG) {
    // a router row: its first round is the whole row at 2*H <= 4*TPR*16 bytes
    const int TPR = MP_THREADS / RR, r = t / TPR, tr = t - r * TPR;
    const int n = min(nx * RR + r, E - 1);
    const char* wr = (const char*)rw + (size_t)n * H * 2;
    for (int o = tr * 128; o < H * 2; o += TPR * 128) asm volatile("prefetch.global.L2 [%0];" ::"l"(wr + o));
  } else if (nx < tRT) {
    mp_tile_prefetch<R, LD>(shg, shu, MI, H, Ggu, nx - tSG);
  } else if (nx < tGU) {
  } else if (nx < tSD) {
    if (sidx) {
      const int j = (nx - tGU) / tgu;
      mp_tile_prefetch<R, LD>(T0[sidx[j]], T1[sidx[j]], MI, H, Ggu, (nx - tGU) - j * tgu);
    }
  } else if (nx < tD) {
    mp_tile_prefetch<R, LD>(shd, 0, H, MI, Gd, nx - tSD);
  } else if (nx < tC) {
    if (sidx) {
      const int j = (nx - tD) / td;
      mp_tile_prefetch<R, LD>(T2[sidx[j]], 0, H, MI, Gd, (nx - tD) - j * td);
    }
  }
}

template <int R, int LD, bool PF, bool NX>
__device__ __forceinline__ void moe_flow_body(float* x, const float* b, const float* __restrict__ pw, float* h, float eps,
                   const u16* __restrict__ rw, float* rlog, const float* __restrict__ bias, int* eidx, float* ewts,
                   int E, int K, int ngroup, int topk_group, int normtopk, float rscale, int RR,
                   const void* const* __restrict__ T0, const float* const* __restrict__ TS0,
                   const void* const* __restrict__ T1, const float* const* __restrict__ TS1,
                   const void* const* __restrict__ T2, const float* const* __restrict__ TS2, const void* shg,
                   const float* shgs, const void* shu, const float* shus, const void* shd, const float* shds,
                   float* eg, float* ey, int H, int MI, int Ggu, int Gd, float* y, const float* __restrict__ nw,
                   int nt, float* npart, unsigned* ctl, float* mo) {
  __shared__ __align__(16) float hs[MP_MAXH];
  __shared__ float red[32];
  __shared__ float part[MP_THREADS / 32][8];
  __shared__ float lg[256];
  __shared__ int sidx[64];
  __shared__ float swts[64];
  __shared__ float sv[8][32];
  __shared__ int stk[2];
  const int t = threadIdx.x;
  const bool hasSh = shg != 0;
  const int tgu = (((MI + R / 2 - 1) / (R / 2)) + MP_THREADS / Ggu - 1) / (MP_THREADS / Ggu);  // gate/up tiles a slot
  const int td = (((H + R - 1) / R) + MP_THREADS / Gd - 1) / (MP_THREADS / Gd);               // down tiles a slot
  const int nvw = nt / 32, per = (H + nt - 1) / nt;
  // Ticket ranges, in order (moeFlowSchedule's).
  const int tSG = (E + RR - 1) / RR;
  const int tRT = tSG + (hasSh ? tgu : 0);
  const int tGU = tRT + 1;
  const int tSD = tGU + K * tgu;
  const int tD = tSD + (hasSh ? td : 0);
  const int tC = tD + K * td;
  const int nC = mo ? (H + MP_THREADS - 1) / MP_THREADS : nvw;
  const int tY = tC + nC;
  const int total = tY + ((!mo && y) ? nvw : 0);
  bool haveH = false, haveRoute = false;  // block-uniform
  // The block's h row in shared memory, once (x and b come from before the launch; the
  // combine that rewrites x waits, through DOWN and SLOT, for every task that reads hs).
  auto ensureH = [&]() {
    if (haveH) return;
    mf_norm(x, b, pw, hs, H, nt, eps, red);
    haveH = true;
  };
  // The routing in shared memory, once: every block that needs it routes rlog itself
  // (moe_persist's phase B), after all router rows are counted.
  auto ensureRoute = [&]() {
    if (haveRoute) return;
    mf_route(ctl + MF_ROUTER, (unsigned)tSG, rlog, lg, bias, sidx, swts, E, K, ngroup, topk_group, normtopk, rscale);
    haveRoute = true;
  };
  // Two tickets ahead: the block works on tk, knows nx (its first weight lines go to L2
  // now, NX), and thread 0's atomic for the one after returns during this task (its
  // result is stored at the task's end, so nothing waits on it). Still deadlock-free: a
  // block works on the lowest ticket it holds, so the lowest unfinished ticket is always
  // being worked on, and its inputs come from lower tickets, all finished.
  if (t == 0) {
    stk[0] = (int)atomicAdd(ctl + MF_TICKET, 1u);
    stk[1] = (int)atomicAdd(ctl + MF_TICKET, 1u);
  }
  __syncthreads();
  int tk = stk[0], nx = stk[1];
  __syncthreads();
  for (;;) {
    if (tk >= total) break;
    unsigned pend = 0;
    if (t == 0) pend = atomicAdd(ctl + MF_TICKET, 1u);
    if (NX && nx < total)
      mf_prefetch_next<R, LD>(nx, tSG, tRT, tGU, tSD, tD, tC, tgu, td, RR, E, H, MI, Ggu, Gd, rw, shg, shu, shd, T0, T1, T2,
                              haveRoute ? sidx : (const int*)0);
    if (tk < tSG) {
      mp_router_task(rw, hs, rlog, E, H, RR, tk * RR, &part[0][0], mp_wait_with([&]() { ensureH(); }));
      mf_signal(ctl + MF_ROUTER);
    } else if (tk < tRT) {
      mp_tile_task<true, R, LD, PF>(shg, shgs, shu, shus, hs, eg + (size_t)K * MI, MI, H, Ggu, tk - tSG, part,
                                    mp_wait_with([&]() { ensureH(); }));
      mf_signal(ctl + MF_SHGU);
    } else if (tk < tGU) {
      ensureRoute();
      if (t < K) {
        eidx[t] = sidx[t];
        ewts[t] = swts[t];
      }
      if (pw) {
        ensureH();
        for (int i = t; i < H; i += MP_THREADS) h[i] = hs[i];
      }
      // The combine rewrites x, which this task's norm may just have read, and the next
      // norm's y may be the same buffer as h (the engine's ws.h): both wait for RT.
      mf_signal(ctl + MF_RT);
    } else if (tk < tSD) {
      const int j = (tk - tGU) / tgu, bx = (tk - tGU) - j * tgu;
      ensureRoute();
      const int e = sidx[j];
      mp_tile_task<true, R, LD, PF>(T0[e], TS0 ? TS0[e] : (const float*)0, T1[e], TS1 ? TS1[e] : (const float*)0, hs,
                                    eg + (size_t)j * MI, MI, H, Ggu, bx, part, mp_wait_with([&]() { ensureH(); }));
      mf_signal(ctl + MF_SLOT + j);
    } else if (tk < tD) {
      mp_tile_task<false, R, LD, PF>(shd, shds, 0, 0, eg + (size_t)K * MI, ey + (size_t)K * H, H, MI, Gd, tk - tSD, part,
                                     mp_wait_with([&]() { mf_wait(ctl + MF_SHGU, (unsigned)tgu); }));
      mf_signal(ctl + MF_DOWN);
    } else if (tk < tC) {
      const int j = (tk - tD) / td, bx = (tk - tD) - j * td;
      ensureRoute();
      const int e = sidx[j];
      mp_tile_task<false, R, LD, PF>(T2[e], TS2 ? TS2[e] : (const float*)0, 0, 0, eg + (size_t)j * MI, ey + (size_t)j * H, H,
                                     MI, Gd, bx, part, mp_wait_with([&]() { mf_wait(ctl + MF_SLOT + j, (unsigned)tgu); }));
      mf_signal(ctl + MF_DOWN);
    } else if (tk < tY) {
      const int v = tk - tC;
      ensureRoute();
      mf_wait(ctl + MF_RT, 1u);  // long done: its acquire round trip before DOWN's, off the critical path
      mf_wait(ctl + MF_DOWN, (unsigned)((K + (hasSh ? 1 : 0)) * td));
      if (mo) {
        // moe_combine_slots for elements v*256 + t.
        const int i = v * MP_THREADS + t;
        if (i < H) {
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
      } else {
      // moe_persist's phase D for virtual warp v.
      const int lane = t & 31, wp = t >> 5;
      for (int jv = wp; jv < per; jv += MP_THREADS / 32) {
        const int i = v * 32 + lane + jv * nt;
        if (i < H) {
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
          const float vv = xv + mv;
          x[i] = vv;
          sv[jv][lane] = vv;
        }
      }
      if (y != 0) {
        __syncthreads();
        if (wp == 0) {
          float ss = 0.0f;
          for (int jv = 0; jv < per; jv++) {
            const int i = v * 32 + lane + jv * nt;
            if (i < H) ss += sv[jv][lane] * sv[jv][lane];
          }
          ss = warp_sum(ss);
          if (lane == 0) npart[v] = ss;
        }
        mf_signal(ctl + MF_COMB);
      }
      }
    } else {
      // The next norm for virtual warp v: every partial, in order (add_rmsnorm_reg's sum).
      const int v = tk - tY;
      mf_wait(ctl + MF_COMB, (unsigned)nvw);
      if (t < nvw) red[t] = __ldcg(npart + t);
      __syncthreads();
      float r = 0.0f;
      for (int i = 0; i < nvw; i++) r += red[i];
      const float rr = rsqrtf(r / (float)H + eps);
      const int lane = t & 31, wp = t >> 5;
      for (int jv = wp; jv < per; jv += MP_THREADS / 32) {
        const int i = v * 32 + lane + jv * nt;
        if (i < H) y[i] = nw[i] * (__ldcg(x + i) * rr);
      }
      __syncthreads();  // red is reused
    }
    if (t == 0) stk[1] = (int)pend;
    __syncthreads();
    tk = nx;
    nx = stk[1];
    __syncthreads();
  }
  if (t == 0) {
    __threadfence();
    if (atomicAdd(ctl + MF_EXIT, 1u) == gridDim.x - 1) {
      // Every other block has left: none reads a counter again.
      // Atomics: the words live in L2, never in this SM's L1.
      atomicExch(ctl + MF_TICKET, 0u);
      atomicExch(ctl + MF_ROUTER, 0u);
      atomicExch(ctl + MF_SHGU, 0u);
      atomicExch(ctl + MF_DOWN, 0u);
      atomicExch(ctl + MF_COMB, 0u);
      atomicExch(ctl + MF_RT, 0u);
      for (int j = 0; j < MP_MAXK; j++) atomicExch(ctl + MF_SLOT + j, 0u);
      atomicExch(ctl + MF_EXIT, 0u);
      atomicAdd(ctl + MF_RUNS, 1u);
      __threadfence();
    }
  }
}

// Variants (the same sums; 128 registers, no spills, nvcc 11.8): moe_flow_m1 (R 8, LD 8,
// 2 blocks an SM; PF: the rest of each tile's weight lines prefetched into L2 before its
// task waits; NX: the next ticket's first weight lines prefetched during the current
// task), moe_flow_m1_pf (PF only), moe_flow_m1_np (neither: only the first round of
// loads is in flight while a task waits); moe_flow_m1_r4 at the end of the file.
extern "C" __global__ void __launch_bounds__(MP_THREADS, 2)
    moe_flow_m1(float* x, const float* b, const float* __restrict__ pw, float* h, float eps,
                   const u16* __restrict__ rw, float* rlog, const float* __restrict__ bias, int* eidx, float* ewts,
                   int E, int K, int ngroup, int topk_group, int normtopk, float rscale, int RR,
                   const void* const* __restrict__ T0, const float* const* __restrict__ TS0,
                   const void* const* __restrict__ T1, const float* const* __restrict__ TS1,
                   const void* const* __restrict__ T2, const float* const* __restrict__ TS2, const void* shg,
                   const float* shgs, const void* shu, const float* shus, const void* shd, const float* shds,
                   float* eg, float* ey, int H, int MI, int Ggu, int Gd, float* y, const float* __restrict__ nw,
                   int nt, float* npart, unsigned* bar, float* mo) {
  moe_flow_body<8, 8, true, true>(x, b, pw, h, eps, rw, rlog, bias, eidx, ewts, E, K, ngroup, topk_group, normtopk, rscale, RR, T0, TS0,
      T1, TS1, T2, TS2, shg, shgs, shu, shus, shd, shds, eg, ey, H, MI, Ggu, Gd, y, nw, nt, npart, bar, mo);
}

extern "C" __global__ void __launch_bounds__(MP_THREADS, 2)
    moe_flow_m1_np(float* x, const float* b, const float* __restrict__ pw, float* h, float eps,
                   const u16* __restrict__ rw, float* rlog, const float* __restrict__ bias, int* eidx, float* ewts,
                   int E, int K, int ngroup, int topk_group, int normtopk, float rscale, int RR,
                   const void* const* __restrict__ T0, const float* const* __restrict__ TS0,
                   const void* const* __restrict__ T1, const float* const* __restrict__ TS1,
                   const void* const* __restrict__ T2, const float* const* __restrict__ TS2, const void* shg,
                   const float* shgs, const void* shu, const float* shus, const void* shd, const float* shds,
                   float* eg, float* ey, int H, int MI, int Ggu, int Gd, float* y, const float* __restrict__ nw,
                   int nt, float* npart, unsigned* bar, float* mo) {
  moe_flow_body<8, 8, false, false>(x, b, pw, h, eps, rw, rlog, bias, eidx, ewts, E, K, ngroup, topk_group, normtopk, rscale, RR, T0, TS0,
      T1, TS1, T2, TS2, shg, shgs, shu, shus, shd, shds, eg, ey, H, MI, Ggu, Gd, y, nw, nt, npart, bar, mo);
}

extern "C" __global__ void __launch_bounds__(MP_THREADS, 2)
    moe_flow_m1_pf(float* x, const float* b, const float* __restrict__ pw, float* h, float eps,
                   const u16* __restrict__ rw, float* rlog, const float* __restrict__ bias, int* eidx, float* ewts,
                   int E, int K, int ngroup, int topk_group, int normtopk, float rscale, int RR,
                   const void* const* __restrict__ T0, const float* const* __restrict__ TS0,
                   const void* const* __restrict__ T1, const float* const* __restrict__ TS1,
                   const void* const* __restrict__ T2, const float* const* __restrict__ TS2, const void* shg,
                   const float* shgs, const void* shu, const float* shus, const void* shd, const float* shds,
                   float* eg, float* ey, int H, int MI, int Ggu, int Gd, float* y, const float* __restrict__ nw,
                   int nt, float* npart, unsigned* bar, float* mo) {
  moe_flow_body<8, 8, true, false>(x, b, pw, h, eps, rw, rlog, bias, eidx, ewts, E, K, ngroup, topk_group, normtopk, rscale, RR, T0, TS0,
      T1, TS1, T2, TS2, shg, shgs, shu, shus, shd, shds, eg, ey, H, MI, Ggu, Gd, y, nw, nt, npart, bar, mo);
}

// moe_flow_m1_r4: moe_flow_m1 with 4 tile rows a group (gate 2 + up 2), two rounds of
// loads a thread in flight (LD 8): twice the tasks of half the size (the same sums: they
// depend on the group size G only) for the TP-8 shard, whose 144 gate/up tiles of 229 KB
// leave most of the 264 blocks without one.
extern "C" __global__ void __launch_bounds__(MP_THREADS, 2)
    moe_flow_m1_r4(float* x, const float* b, const float* __restrict__ pw, float* h, float eps,
                   const u16* __restrict__ rw, float* rlog, const float* __restrict__ bias, int* eidx, float* ewts,
                   int E, int K, int ngroup, int topk_group, int normtopk, float rscale, int RR,
                   const void* const* __restrict__ T0, const float* const* __restrict__ TS0,
                   const void* const* __restrict__ T1, const float* const* __restrict__ TS1,
                   const void* const* __restrict__ T2, const float* const* __restrict__ TS2, const void* shg,
                   const float* shgs, const void* shu, const float* shus, const void* shd, const float* shds,
                   float* eg, float* ey, int H, int MI, int Ggu, int Gd, float* y, const float* __restrict__ nw,
                   int nt, float* npart, unsigned* bar, float* mo) {
  moe_flow_body<4, 8, true, true>(x, b, pw, h, eps, rw, rlog, bias, eidx, ewts, E, K, ngroup, topk_group, normtopk, rscale, RR, T0, TS0,
      T1, TS1, T2, TS2, shg, shgs, shu, shus, shd, shds, eg, ey, H, MI, Ggu, Gd, y, nw, nt, npart, bar, mo);
}
