// Device functions shared by the persistent MoE kernels (moe_persist.cu's phases with
// grid barriers, moe_flow.cu's ticketed tasks with readiness counters): the norm, the
// router row task and the fp8 tile task, with the default chain's arithmetic.
// PersistKernelSource places this header after common.cuh + moe.cu and before
// cu/persist/*.cu (one module; NVRTC sees one translation unit).
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


// A wait hook that waits for nothing (moe_persist's phases: the barrier before the
// phase already did).
// hook = false keeps the loop's original shape (loads at the top of every round):
// the peeled first round costs moe_persist_m1_b3 / _d16 spills (nvcc 11.8).
struct mp_nowait {
  static constexpr bool hook = false;
  __device__ __forceinline__ void operator()() const {}
};

// A wait hook running f (moe_flow: the block's norm, or a readiness counter).
template <class F>
struct mp_hook {
  static constexpr bool hook = true;
  F f;
  __device__ __forceinline__ void operator()() const { f(); }
};
template <class F>
__device__ __forceinline__ mp_hook<F> mp_wait_with(F f) { return mp_hook<F>{f}; }

// One router task: rows n0.. n0+RR-1 of the bf16 [N][K] router times hs (shared),
// gemv_wide_rows<WBF16, RR>'s arithmetic (TPR = 256/RR threads a row, chunks
// tr, tr+TPR, ... in order, warp sums, WPR warps' sum in order, + 0).
// wait() runs once, by every thread, after the first round's weight loads are
// issued and before hs is read (moe_flow: the block's norm is computed there, under
// the weights' round trip).
template <class Wt>
__device__ void mp_router_task(const u16* __restrict__ W, const float* hs, float* y, int N, int K, int RR, int n0,
                               float* part, Wt wait) {
  const int t = threadIdx.x;
  const int TPR = MP_THREADS / RR, WPR = TPR / 32;
  const int r = t / TPR, tr = t - r * TPR;
  const int n = min(n0 + r, N - 1);
  const char* wr = (const char*)W + (size_t)n * K * 2;
  const int C = K / 8;
  float acc = 0.0f;
  uint4 wv[4];
  auto load = [&](int c0) {
#pragma unroll
    for (int u = 0; u < 4; u++) {
      const int c = c0 + u * TPR;
      wv[u] = c < C ? mp_ld16(wr + (size_t)c * 16) : make_uint4(0u, 0u, 0u, 0u);
    }
  };
  if (Wt::hook) {
    if (tr < C) load(tr);
    wait();
  }
  for (int c0 = tr; c0 < C; c0 += TPR * 4) {
    if (!Wt::hook || c0 != tr) load(c0);
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
// Paired (w1 != 0): silu(gate)*up. wait() runs once, by every thread, after the
// first round's weight loads are issued (and, PF, the rest of the tile's weight
// lines are prefetched into L2) and before x is read: moe_flow waits there for the
// task's input, so the weights stream while it waits.
template <bool XS, int R, int LD, bool PF, class Wt>
__device__ void mp_tile_task(const void* w0, const float* s0, const void* w1, const float* s1, const float* xb, float* y,
                             int N, int K, int G, int bx, float (*part)[8], Wt wait) {
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
  uint4 wv[NI][R];
  float scg[NI], scu[NI];
  auto load = [&](int c0) {
#pragma unroll
    for (int i = 0; i < NI; i++) {
      const int c = c0 + i * G;
#pragma unroll
      for (int r = 0; r < R; r++) wv[i][r] = c < C ? mp_ld16(wr[r] + (size_t)c * 16) : make_uint4(0u, 0u, 0u, 0u);
      scg[i] = c < C ? (sg ? __ldg(sg + ((c * 16) >> 7)) : 1.0f) : 0.0f;
      scu[i] = c < C ? (su ? __ldg(su + ((c * 16) >> 7)) : 1.0f) : 0.0f;
    }
  };
  if (Wt::hook && tg < C) load(tg);
  if (PF && C > 0) {
    // The rest of this group's rows, one 128-byte line a thread at a time, into L2:
    // no registers held, so the whole tile is in flight while the task waits.
#pragma unroll
    for (int r = 0; r < R; r++)
      for (int o = G * NI * 16 + tg * 128; o < K; o += G * 128)
        asm volatile("prefetch.global.L2 [%0];" ::"l"(wr[r] + o));
  }
  if (Wt::hook) wait();
  for (int c0 = tg; c0 < C; c0 += G * NI) {
    if (!Wt::hook || c0 != tg) load(c0);
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
          // Shared memory (XS), or an eg row written in this launch before the
          // barrier (moe_persist) or the counter (moe_flow) this block acquired: a
          // plain (L1-cached) load, which that acquire (ld.acquire.gpu + fence by
          // thread 0, then bar.sync) orders after those writes (never the
          // non-coherent path).
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

// The first round's weight lines of tile bx (mp_tile_task's rows and chunks: bytes
// [0, G*LD/R*16) of each of its rows) prefetched into L2: moe_flow issues it for the
// block's next ticket while the current task runs, so that task's first loads find
// L2 instead of waiting a full HBM round trip. No registers held.
template <int R, int LD>
__device__ __forceinline__ void mp_tile_prefetch(const void* w0, const void* w1, int N, int K, int G, int bx) {
  constexpr int NI = LD / R;
  const bool pair = w1 != 0;
  const int rout = pair ? R / 2 : R;
  const int grp = threadIdx.x / G, tg = threadIdx.x - grp * G;
  const int n0 = (bx * (MP_THREADS / G) + grp) * rout;
  if (n0 >= N) return;
  const int end = min(K, G * NI * 16);
#pragma unroll
  for (int r = 0; r < R; r++) {
    const bool second = pair && r >= rout;
    const int n = min(n0 + (second ? r - rout : r), N - 1);
    const char* wr = (const char*)(second ? w1 : w0) + (size_t)n * K;
    for (int o = tg * 128; o < end; o += G * 128) asm volatile("prefetch.global.L2 [%0];" ::"l"(wr + o));
  }
}
