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

#define MP_THREADS 256
#define MP_MAXH 8192   // hidden size bound (shared h row)
// Variants (template R = tile rows per group, gate R/2 + up R/2 when paired; LD = 16-byte loads in
// flight a thread in a tile round; B = blocks an SM): the same sums (they do not depend on R or LD).
//   moe_persist_m1      R 8, LD 8,  B 2: 128 registers, no spills (nvcc 11.8)   64 KB in flight an SM
//   moe_persist_m1_d16  R 4, LD 16, B 2: 128 registers, 12 B spilled             128 KB
//   moe_persist_m1_b3   R 4, LD 8,  B 3:  80 registers, 20 B spilled              96 KB
#define MP_TIMEOUT_NS 2000000000ull
#define MP_MAXK 16     // routed slots (top-k) at most

__device__ __forceinline__ uint4 mp_ld16(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

__device__ __forceinline__ u32 mp_word(uint4 v, int q) { return q == 0 ? v.x : q == 1 ? v.y : q == 2 ? v.z : v.w; }

__device__ __forceinline__ unsigned mp_ld_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ u64 mp_now() {
  u64 t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Device-wide barrier of n blocks on bar[0] (arrivals) and bar[1] (generation).
// The last arrival resets the count and then bumps the generation, so the pair is
// left as it was found apart from the generation: safe to reuse within a launch,
// across launches and graph replays, with no host reset. A wait longer than
// MP_TIMEOUT_NS traps (a launch error instead of a hang).
__device__ void mp_barrier(unsigned* bar, unsigned n) {
  __syncthreads();
  if (threadIdx.x == 0) {
    const unsigned gen = mp_ld_acquire(bar + 1);
    __threadfence();
    const unsigned old = atomicAdd(bar, 1u);
    if (old == n - 1) {
      atomicExch(bar, 0u);
      __threadfence();
      atomicExch(bar + 1, gen + 1u);
    } else {
      const u64 t0 = mp_now();
      while (mp_ld_acquire(bar + 1) == gen) {
        __nanosleep(64);
        if (mp_now() - t0 > MP_TIMEOUT_NS) __trap();
      }
    }
    __threadfence();
  }
  __syncthreads();
}

// dst[i] = src[i] (+ add[i]) for i < D: each thread issues 16 loads of a round (32 with add)
// before it uses any (a loop of single loads would wait one L2 round trip each).
__device__ __forceinline__ void mp_stage(const float* src, const float* add, float* dst, int D) {
  for (int i0 = threadIdx.x; i0 < D; i0 += 16 * MP_THREADS) {
    float v[16], a[16];
#pragma unroll
    for (int u = 0; u < 16; u++) {
      const int i = i0 + u * MP_THREADS;
      v[u] = i < D ? __ldcg(src + i) : 0.0f;
    }
    if (add) {
#pragma unroll
      for (int u = 0; u < 16; u++) {
        const int i = i0 + u * MP_THREADS;
        a[u] = i < D ? __ldcg(add + i) : 0.0f;
      }
#pragma unroll
      for (int u = 0; u < 16; u++) v[u] = v[u] + a[u];  // add_rmsnorm's x + b
    }
#pragma unroll
    for (int u = 0; u < 16; u++) {
      const int i = i0 + u * MP_THREADS;
      if (i < D) dst[i] = v[u];
    }
  }
}

// rmsnorm / add_rmsnorm_reg of one row of D for a block of nt threads (nt % 32 == 0,
// nt <= 1024), emulated by this block's 256: virtual thread v owns elements
// v + j*nt in j order, warp sums of virtual warps, their sum in virtual-warp order.
// hs[i] = w[i] * (x'[i] * r), x' = x + b (b may be 0).
__device__ void mp_norm(const float* x, const float* b, const float* __restrict__ w, float* hs, int D, int nt,
                        float eps, float* red) {
  const int t = threadIdx.x, lane = t & 31, wp = t >> 5;
  const int per = (D + nt - 1) / nt;
  mp_stage(x, b, hs, D);
  __syncthreads();
  for (int v0 = wp * 32; v0 < nt; v0 += MP_THREADS) {  // warp-uniform
    const int vt = v0 + lane;
    float ss = 0.0f;
    for (int j = 0; j < per; j++) {
      const int i = vt + j * nt;
      if (i < D) {
        const float v = hs[i];
        ss += v * v;
      }
    }
    ss = warp_sum(ss);
    if (lane == 0) red[v0 >> 5] = ss;
  }
  __syncthreads();
  float r = 0.0f;
  for (int i = 0; i < nt / 32; i++) r += red[i];
  const float rr = rsqrtf(r / (float)D + eps);
  for (int i0 = t; i0 < D; i0 += 16 * MP_THREADS) {
    float wv[16];
#pragma unroll
    for (int u = 0; u < 16; u++) {
      const int i = i0 + u * MP_THREADS;
      wv[u] = i < D ? __ldg(w + i) : 0.0f;
    }
#pragma unroll
    for (int u = 0; u < 16; u++) {
      const int i = i0 + u * MP_THREADS;
      if (i < D) hs[i] = wv[u] * (hs[i] * rr);
    }
  }
  __syncthreads();
}

// One router task: rows n0.. n0+RR-1 of the bf16 [N][K] router times hs (shared),
// gemv_wide_rows<WBF16, RR>'s arithmetic (TPR = 256/RR threads a row, chunks
// tr, tr+TPR, ... in order, warp sums, WPR warps' sum in order, + 0).
__device__ void mp_router_task(const u16* __restrict__ W, const float* hs, float* y, int N, int K, int RR, int n0,
                               float* part) {
  const int t = threadIdx.x;
  const int TPR = MP_THREADS / RR, WPR = TPR / 32;
  const int r = t / TPR, tr = t - r * TPR;
  const int n = min(n0 + r, N - 1);
  const char* wr = (const char*)W + (size_t)n * K * 2;
  const int C = K / 8;
  float acc = 0.0f;
  for (int c0 = tr; c0 < C; c0 += TPR * 4) {
    uint4 wv[4];
#pragma unroll
    for (int u = 0; u < 4; u++) {
      const int c = c0 + u * TPR;
      wv[u] = c < C ? mp_ld16(wr + (size_t)c * 16) : make_uint4(0u, 0u, 0u, 0u);
    }
#pragma unroll
    for (int u = 0; u < 4; u++) {
      const int c = c0 + u * TPR;
      if (c < C) {
        const u32 ws[4] = {wv[u].x, wv[u].y, wv[u].z, wv[u].w};
        float wf[8];
#pragma unroll
        for (int j = 0; j < 8; j++) wf[j] = bf16_to_f32(ws[j >> 1] >> ((j & 1) * 16));
        const float4* xp = (const float4*)(hs + (size_t)c * 8);
        float p = 0.0f;
#pragma unroll
        for (int q = 0; q < 2; q++) {
          const float4 v = xp[q];
          p += wf[4 * q] * v.x;
          p += wf[4 * q + 1] * v.y;
          p += wf[4 * q + 2] * v.z;
          p += wf[4 * q + 3] * v.w;
        }
        acc += p * 1.0f;
      }
    }
  }
  acc = warp_sum(acc);
  if ((t & 31) == 0) part[t >> 5] = acc;
  __syncthreads();
  if (t < RR) {
    float v = 0.0f;
    for (int i = 0; i < WPR; i++) v += part[t * WPR + i];
    if (n0 + t < N) y[n0 + t] = v + 0.0f;
  }
  __syncthreads();  // part is reused
}

// One tile of one slot: gemv_tile_body<TFP8, R, 1>'s arithmetic for group size G
// (tile bx: groups' rows n0 = (bx*(256/G) + grp)*rout), x a row of K floats (shared
// memory when XS, else global memory written in this launch, read through L2).
// Paired (w1 != 0): silu(gate)*up.
template <bool XS, int R, int LD>
__device__ void mp_tile_task(const void* w0, const float* s0, const void* w1, const float* s1, const float* xb, float* y,
                             int N, int K, int G, int bx, float (*part)[8]) {
  constexpr int NI = LD / R;
  const bool pair = w1 != 0;
  const int rout = pair ? R / 2 : R;
  const int grp = threadIdx.x / G, tg = threadIdx.x - grp * G;
  const int kb = (K + 127) >> 7;
  const int n0 = (bx * (MP_THREADS / G) + grp) * rout;
  const char* wr[R];
#pragma unroll
  for (int r = 0; r < R; r++) {
    const bool second = pair && r >= rout;
    const int n = min(n0 + (second ? r - rout : r), N - 1);
    const char* base = (const char*)(second ? w1 : w0);
    wr[r] = base + (size_t)n * K;
  }
  const int nsc = min(n0, N - 1) >> 7;
  const float* sg = s0 ? s0 + (size_t)nsc * kb : (const float*)0;
  const float* su = pair && s1 ? s1 + (size_t)nsc * kb : (const float*)0;
  float acc[R];
#pragma unroll
  for (int r = 0; r < R; r++) acc[r] = 0.0f;
  const int C = n0 < N ? K / 16 : 0;
  for (int c0 = tg; c0 < C; c0 += G * NI) {
    uint4 wv[NI][R];
    float scg[NI], scu[NI];
#pragma unroll
    for (int i = 0; i < NI; i++) {
      const int c = c0 + i * G;
#pragma unroll
      for (int r = 0; r < R; r++) wv[i][r] = c < C ? mp_ld16(wr[r] + (size_t)c * 16) : make_uint4(0u, 0u, 0u, 0u);
      scg[i] = c < C ? (sg ? __ldg(sg + ((c * 16) >> 7)) : 1.0f) : 0.0f;
      scu[i] = c < C ? (su ? __ldg(su + ((c * 16) >> 7)) : 1.0f) : 0.0f;
    }
#pragma unroll
    for (int i = 0; i < NI; i++) {
      const int c = c0 + i * G;
      if (c < C) {
        const float* xc = xb + (size_t)c * 16;
        float p[R];
#pragma unroll
        for (int r = 0; r < R; r++) p[r] = 0.0f;
#pragma unroll
        for (int q = 0; q < 4; q++) {
          // Shared memory (XS), or an eg row written before the last barrier: a plain
          // (L1-cached) load, which the barrier's acquire orders after those writes
          // (never the non-coherent path).
          const float4 x4 = *(const float4*)(xc + q * 4);
          const float xv[4] = {x4.x, x4.y, x4.z, x4.w};
#pragma unroll
          for (int r = 0; r < R; r++) {
            float wf[4];
            fp8x4_to_f32(mp_word(wv[i][r], q), wf);
#pragma unroll
            for (int e = 0; e < 4; e++) p[r] = fmaf(wf[e], xv[e], p[r]);
          }
        }
#pragma unroll
        for (int r = 0; r < R; r++) acc[r] = fmaf(p[r], (pair && r >= rout ? scu[i] : scg[i]), acc[r]);
      }
    }
  }
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
#pragma unroll
  for (int r = 0; r < R; r++) acc[r] = warp_sum(acc[r]);
  if (lane == 0) {
#pragma unroll
    for (int r = 0; r < R; r++) part[warp][r] = acc[r];
  }
  __syncthreads();
  for (int t = tg; t < rout; t += G) {
    const int rr = t;
    const int wpg = G >> 5, w0i = grp * wpg;
    float v = 0.0f;
    for (int i = 0; i < wpg; i++) v += part[w0i + i][rr];
    if (pair) {
      float u = 0.0f;
      for (int i = 0; i < wpg; i++) u += part[w0i + i][rr + rout];
      v = v / (1.0f + expf(-v)) * u;  // silu(gate) * up, as silu_mul
    }
    if (n0 + rr < N) y[n0 + rr] = v + 0.0f;
  }
  __syncthreads();  // part is reused by the next task
}

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
        mp_router_task(rw, hs, rlog, E, H, RR, task * RR, &part[0][0]);
      } else {
        mp_tile_task<true, R, LD>(shg, shgs, shu, shus, hs, eg + (size_t)K * MI, MI, H, Ggu, task - nr, part);
      }
    }
  }
  mp_barrier(bar, nb);

  // ---- B: shared down, routing, routed gate/up
  if (hasSh) {
    for (int task = bid; task < tdPer; task += nb)
      mp_tile_task<false, R, LD>(shd, shds, 0, 0, eg + (size_t)K * MI, ey + (size_t)K * H, H, MI, Gd, task, part);
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
    mp_tile_task<true, R, LD>(T0[e], TS0 ? TS0[e] : (const float*)0, T1[e], TS1 ? TS1[e] : (const float*)0, hs,
                       eg + (size_t)j * MI, MI, H, Ggu, bx, part);
  }
  mp_barrier(bar, nb);

  // ---- C: routed down
  for (int task = bid; task < K * tdPer; task += nb) {
    const int j = task / tdPer, bx = task - j * tdPer;
    const int e = sidx[j];
    mp_tile_task<false, R, LD>(T2[e], TS2 ? TS2[e] : (const float*)0, 0, 0, eg + (size_t)j * MI, ey + (size_t)j * H, H, MI,
                        Gd, bx, part);
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
