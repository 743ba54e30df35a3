// Routed experts read once a launch for several rows (kernels.MoEUnique /
// ExpertsFP8Unique; engine/gpu TILERT_GPU_MOE_UNIQUE; issue 10: with M rows a
// step, the per-slot launches read an expert's weights once for every row
// that routed to it, so rows that share experts cost as much as rows that do
// not).
//
// moe_unique writes the table of n routed slots (ids[j], slot j = row * k +
// its rank) grouped by expert, groups of at most mmax slots (a group past
// mmax slots of one expert starts another), in the order of their first
// slots:
//   tab[g]                  the group's expert, -1 for g >= the groups
//   tab[n + g]              its slot count (0 past the groups)
//   tab[2n + g*mmax + i]    its i-th slot, in slot order (0 past its count)
// One block of 64 threads (n <= 64).

#define UQ_MAX_SLOTS 64

extern "C" __global__ void __launch_bounds__(UQ_MAX_SLOTS)
    moe_unique(const int* __restrict__ ids, int n, int mmax, int* tab) {
  PDL_WAIT();
  __shared__ int sid[UQ_MAX_SLOTS], rank[UQ_MAX_SLOTS], lead[UQ_MAX_SLOTS], gcnt[UQ_MAX_SLOTS];
  const int t = threadIdx.x;
  const int e = t < n ? ids[t] : -1;
  sid[t] = e;
  __syncthreads();
  // p: the earlier slots of the same expert; same: all of them.
  int p = 0, same = 0;
  for (int i = 0; i < n; i++) {
    const int hit = t < n && sid[i] == e;
    same += hit;
    if (i < t) p += hit;
  }
  lead[t] = t < n && p % mmax == 0;
  __syncthreads();
  int before = 0, groups = 0;
  for (int i = 0; i < n; i++) {
    groups += lead[i];
    if (i < t) before += lead[i];
  }
  rank[t] = before;
  gcnt[t] = 0;
  __syncthreads();
  if (t < n) {
    // This slot's group: the leader of (e, p / mmax).
    const int want = p - p % mmax;
    int q = 0, g = 0;
    for (int i = 0; i <= t; i++) {
      if (sid[i] == e) {
        if (q == want) g = rank[i];
        q++;
      }
    }
    tab[2 * n + g * mmax + p % mmax] = t;
    if (lead[t]) {
      tab[g] = e;
      tab[n + g] = min(mmax, same - p);
      gcnt[g] = min(mmax, same - p);
    }
  }
  if (t >= groups && t < n) {
    tab[t] = -1;
    tab[n + t] = 0;
  }
  __syncthreads();
  // Zero the lists past their counts (a table is the same bytes each time).
  for (int i = t; i < n * mmax; i += UQ_MAX_SLOTS)
    if (i % mmax >= gcnt[i / mmax]) tab[2 * n + i] = 0;
}

// gemv_tile_fp8_r<R>_m<MM>_u: ExpertsFP8's routed slots with the slots of
// one expert in one block row (blockIdx.y = group g of moe_unique's table):
// the expert's weights are read once for up to MM slots. Slot j's input row
// is x + (j / xdiv) * ldx, its output y + j * ldy (ExpertsFP8's layout).
// Each slot's sums are gemv_tile_body's one-row sums for the same G
// statement for statement (a chunk's products in element order, then its
// scale, then warp_sum and the group's warps in order; silu(gate) * up for a
// pair), so every output is the per-slot launch's bit for bit
// (TestKernelExpertsUnique). A chunk's partials are taken one slot at a time
// (R registers, not R x MM), so a thread keeps 12 weight loads in flight at
// two blocks an SM, near the per-slot launch's _d16 (16; 16 here spills)
// (session 57's first form, 8 loads and R x MM partials, streamed slower
// than the per-slot launches on rows that share nothing). grid (row tiles, n), 256 threads.
template <int R, int MM, int LD>
__device__ __forceinline__ void gemv_tile_u_body(const void* const* __restrict__ T0,
                                                 const float* const* __restrict__ TS0,
                                                 const void* const* __restrict__ T1,
                                                 const float* const* __restrict__ TS1, const int* __restrict__ tab,
                                                 int n, int mmax, const float* __restrict__ x, int ldx, int xdiv,
                                                 float* y, int ldy, int N, int K, int G) {
  constexpr int NI = LD / R;  // R * NI = LD loads in flight a thread
  __shared__ float part[TILE_THREADS / 32][R * MM];
  const int u = blockIdx.y;
  const int e = tab[u];
  if (e < 0) return;  // block-uniform: no such group
  const int M = min(tab[n + u], MM);
  // The group's slots and their input rows, in shared memory (registers
  // go to the loads in flight).
  __shared__ int js[MM], xr[MM];
  if ((int)threadIdx.x < M) {
    js[threadIdx.x] = tab[2 * n + u * mmax + threadIdx.x];
    xr[threadIdx.x] = js[threadIdx.x] / xdiv;
  }
  __syncthreads();
  const void* w0 = T0[e];
  const float* s0 = TS0 ? TS0[e] : (const float*)0;
  const void* w1 = T1 ? T1[e] : (const void*)0;
  const float* s1 = TS1 ? TS1[e] : (const float*)0;
  const bool pair = w1 != 0;
  const int rout = pair ? R / 2 : R;
  const int grp = threadIdx.x / G, tg = threadIdx.x - grp * G;
  const int kb = (K + 127) >> 7;
  const int tiles = (((N + rout - 1) / rout) + TILE_THREADS / G - 1) / (TILE_THREADS / G);
  for (int bx = blockIdx.x; bx < tiles; bx += gridDim.x) {
    const int n0 = (bx * (TILE_THREADS / G) + grp) * rout;
    const int nsc = min(n0, N - 1) >> 7;
    const float* sg = s0 ? s0 + (size_t)nsc * kb : (const float*)0;
    const float* su = pair && s1 ? s1 + (size_t)nsc * kb : (const float*)0;
    float acc[R][MM];
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
      for (int m = 0; m < MM; m++) acc[r][m] = 0.0f;
    const int C = n0 < N ? K / TFP8::E : 0;
    for (int c0 = tg; c0 < C; c0 += G * NI) {
      uint4 wv[NI][R];
      float scg[NI], scu[NI];
#pragma unroll
      for (int i = 0; i < NI; i++) {
        const int c = c0 + i * G;
#pragma unroll
        for (int r = 0; r < R; r++) {
          // Row r of the group (gate rows, then up rows for a pair); rows
          // past N repeat the last one (not written).
          const bool second = pair && r >= rout;
          const char* wr = (const char*)(second ? w1 : w0) + (size_t)min(n0 + (second ? r - rout : r), N - 1) * K;
          wv[i][r] = c < C ? tile_ld16(wr + (size_t)c * 16) : make_uint4(0u, 0u, 0u, 0u);
        }
        scg[i] = c < C ? (sg ? __ldg(sg + ((c * TFP8::E) >> 7)) : 1.0f) : 0.0f;
        scu[i] = c < C ? (su ? __ldg(su + ((c * TFP8::E) >> 7)) : 1.0f) : 0.0f;
      }
#pragma unroll
      for (int i = 0; i < NI; i++) {
        const int c = c0 + i * G;
        if (c < C) {
#pragma unroll
          for (int m = 0; m < MM; m++) {
            if (m < M) {
              const float* xc = x + (size_t)xr[m] * ldx + (size_t)c * TFP8::E;
              float p[R];
              TILE_CHUNK_M1(TFP8, R, xc, (const float*)0, 1.0f, wv[i], p)
#pragma unroll
              for (int r = 0; r < R; r++) acc[r][m] = fmaf(p[r], (pair && r >= rout ? scu[i] : scg[i]), acc[r][m]);
            }
          }
        }
      }
    }
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
      for (int m = 0; m < MM; m++)
        if (m < M) acc[r][m] = warp_sum(acc[r][m]);
    if (lane == 0) {
#pragma unroll
      for (int r = 0; r < R; r++)
#pragma unroll
        for (int m = 0; m < MM; m++) part[warp][r * MM + m] = acc[r][m];
    }
    __syncthreads();
    for (int t = tg; t < rout * M; t += G) {
      const int rr = t / M, m = t - rr * M;
      const int wpg = G >> 5, w0i = grp * wpg;
      float v = 0.0f;
      for (int i = 0; i < wpg; i++) v += part[w0i + i][rr * MM + m];
      if (pair) {
        float uu = 0.0f;
        for (int i = 0; i < wpg; i++) uu += part[w0i + i][(rr + rout) * MM + m];
        v = v / (1.0f + expf(-v)) * uu;  // silu(gate) * up, as silu_mul
      }
      if (n0 + rr < N) y[(size_t)js[m] * ldy + n0 + rr] = v + 0.0f;
    }
    if (bx + gridDim.x < tiles) __syncthreads();  // part is reused by the next tile
  }
}

extern "C" __global__ void __launch_bounds__(TILE_THREADS, 2)
    gemv_tile_fp8_r4_m4_u(const void* const* __restrict__ T0, const float* const* __restrict__ TS0,
                          const void* const* __restrict__ T1, const float* const* __restrict__ TS1,
                          const int* __restrict__ tab, int n, int mmax, const float* __restrict__ x, int ldx, int xdiv,
                          float* y, int ldy, int N, int K, int G) {
  PDL_WAIT();
  gemv_tile_u_body<4, 4, 12>(T0, TS0, T1, TS1, tab, n, mmax, x, ldx, xdiv, y, ldy, N, K, G);
}

extern "C" __global__ void __launch_bounds__(TILE_THREADS, 2)
    gemv_tile_fp8_r2_m8_u(const void* const* __restrict__ T0, const float* const* __restrict__ TS0,
                          const void* const* __restrict__ T1, const float* const* __restrict__ TS1,
                          const int* __restrict__ tab, int n, int mmax, const float* __restrict__ x, int ldx, int xdiv,
                          float* y, int ldy, int N, int K, int G) {
  PDL_WAIT();
  gemv_tile_u_body<2, 8, 8>(T0, TS0, T1, TS1, tab, n, mmax, x, ldx, xdiv, y, ldy, N, K, G);
}

// gemv_mmx_fp8_r2_u1_pu: ExpertsFP8Unique's groups on the tensor cores
// (kernels.ExpertsFP8UniqueMMA; TILERT_GPU_MOE_UNIQUE=x). The tile kernels
// above spend MM FMAs a weight and streamed an expert shared by 4 rows at
// 0.9-1.4 TB/s on an H100 (session 58 call A's trace), a third of the
// one-row launches' rate; here the group's rows are the columns of
// gemv_mmx_fp8_r2_u1_p's mma (cu/gemv_mma_x.cu, the 4-row dense GEMVs'
// kernel), so a slot's output is that kernel's for its row alone, bit for
// bit (the columns of an mma do not mix), and not the per-slot tile
// launch's. grid (ceil(N / (16 * tout)), n): blockIdx.y is group g of
// moe_unique's table (groups of at most 8 slots), 256 threads.
extern "C" __global__ void __launch_bounds__(GM_THREADS, 2)
    gemv_mmx_fp8_r2_u1_pu(const void* const* __restrict__ T0, const float* const* __restrict__ TS0,
                          const void* const* __restrict__ T1, const float* const* __restrict__ TS1,
                          const int* __restrict__ tab, int n, int mmax, const float* __restrict__ x, int ldx, int xdiv,
                          float* y, int ldy, int N, int K) {
  PDL_WAIT();
  const int u = blockIdx.y;
  const int e = tab[u];
  if (e < 0) return;  // block-uniform: no such group
  const int M = min(min(tab[n + u], mmax), 8);
  __shared__ int xm[8], ym[8];
  if ((int)threadIdx.x < M) {
    const int j = tab[2 * n + u * mmax + threadIdx.x];
    xm[threadIdx.x] = j / xdiv;
    ym[threadIdx.x] = j;
  }
  __syncthreads();
  gemv_mmx_body<true, 2, 1, 1, true>(T0[e], TS0[e], T1 ? T1[e] : (const void*)0, T1 ? TS1[e] : (const float*)0, x,
                                     ldx, y, ldy, (const float*)0, N, K, M, blockIdx.x, xm, ym);
}
