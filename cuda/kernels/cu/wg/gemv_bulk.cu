// Bulk-copy GEMV (TILERT_GPU_GEMV_BULK=1; gemv_bulk.go): the tile GEMV of one
// input row of fp8 weights (dense, with residual, gate/up/SwiGLU paired,
// routed expert slots plus dense slots) with the weights streamed into a
// shared-memory ring by Hopper's 1-D bulk async copies
// (cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes, PTX
// 8.0: hence the sm_90a module, which NVRTC 12 compiles; NVRTC 11.8 has no
// PTX 8.0).
//
// y[j][n] = sum_k W_j[n][k]*S_j[n/128][k/128]*x[xr_j][k] (+ resid[j][n]),
// slots j as in gemv_tile.cu (j < slots: routed, W0 = T0[ids[j]], input row
// j/xdiv; j >= slots: dense W0, input row xsh + j - slots); with W1/T1
// every slot writes silu(W0 x) * (W1 x).
//
// Block: 288 threads = 8 consumer warps (256 threads) + 1 producer warp.
// The consumers form 256/G groups of G threads (G = 32..256, the tile
// kernel's group size); a group owns GB_RG = 4 weight rows (paired: 2 gate
// rows, then the same 2 rows of W1), so a row tile is 256/G*4 weight rows
// (1024/G) and 256/G*4 (paired 256/G*2) output rows. K is cut into slices
// of KS = 16*G bytes (the last one shorter when K % KS != 0); one stage of
// the ring holds one slice of every weight row of a row tile, rows KS bytes
// apart: 1024/G * 16*G = 16 KiB. The producer warp walks the block's
// (tile, slice) sequence and, per stage, waits for the stage to be empty,
// arms its full barrier with the stage's byte count (arrive.expect_tx) and
// issues one bulk copy per valid weight row (lane r copies rows r, r+32,
// ..); it runs up to nst stages ahead of the consumers, across row tiles
// (the ring never drains between tiles). Persistent blocks: the launcher
// sizes the grid so that every block takes the same number of tiles
// (tiles t = blockIdx.x, +gridDim.x, ..., slot-major).
//
// Arithmetic (the summation order, fixed; it is the tile kernel's M = 1
// order for the same G, so the same floats bit for bit): thread tg of a
// group takes the 16-byte chunk at k = sl*KS + 16*tg of every slice sl in
// ascending order; per chunk and row, p = fmaf chain over the 16 weights
// in address order (p starts at 0; weight = e4m3 -> f16 -> f32, exact),
// then acc = fmaf(p, S[n/128][k/128], acc) (acc starts at 0; S = 1 without
// scales). Per row tile: acc summed over the warp by the xor butterfly
// 16, 8, 4, 2, 1 (warp_sum); a group's G/32 warp sums added in warp order
// into v = 0.0f; paired: v = v / (1 + expf(-v)) * u (u the up row's v);
// then y = v + resid (resid absent: + 0.0f).
//
// Needs K % 16 == 0, 16-byte aligned weight rows, x and ldx % 4 == 0 (the
// launcher checks).

#define GB_CONSUMERS 256
#define GB_THREADS 288
#define GB_RG 4
#define GB_STAGE 16384

__device__ __forceinline__ u32 gb_sa(const void* p) { return (u32)__cvta_generic_to_shared(p); }

__device__ __forceinline__ void gb_bar_init(u64* b, u32 count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(gb_sa(b)), "r"(count) : "memory");
}

__device__ __forceinline__ void gb_expect(u64* b, u32 bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(gb_sa(b)), "r"(bytes) : "memory");
}

__device__ __forceinline__ void gb_arrive(u64* b) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(gb_sa(b)) : "memory");
}

__device__ __forceinline__ void gb_wait(u64* b, u32 parity) {
  asm volatile(
      "{\n\t.reg .pred P1;\n"
      "GB_WAIT:\n\t"
      "mbarrier.try_wait.parity.shared::cta.b64 P1, [%0], %1;\n\t"
      "@P1 bra GB_DONE;\n\t"
      "bra GB_WAIT;\n"
      "GB_DONE:\n\t}" ::"r"(gb_sa(b)),
      "r"(parity)
      : "memory");
}

__device__ __forceinline__ void gb_copy(void* dst, const void* src, u32 bytes, u64* b) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                   gb_sa(dst)),
               "l"(src), "r"(bytes), "r"(gb_sa(b))
               : "memory");
}

__device__ __forceinline__ void gb_consumers_sync() { asm volatile("bar.sync 1, 256;" ::: "memory"); }

// gb_slot: slot j's weights, scales and input row.
__device__ __forceinline__ void gb_slot(int j, const void* const* __restrict__ T0, const float* const* __restrict__ TS0,
                                        const void* const* __restrict__ T1, const float* const* __restrict__ TS1,
                                        const int* __restrict__ ids, int slots, const void* W0, const float* S0,
                                        const void* W1, const float* S1, int xdiv, int xsh, const u8*& w0,
                                        const u8*& w1, const float*& s0, const float*& s1, int& xr) {
  if (j < slots) {
    const int e = ids[j];
    w0 = (const u8*)T0[e];
    s0 = TS0 ? TS0[e] : (const float*)0;
    w1 = T1 ? (const u8*)T1[e] : (const u8*)0;
    s1 = TS1 ? TS1[e] : (const float*)0;
    xr = j / xdiv;
  } else {
    w0 = (const u8*)W0;
    s0 = S0;
    w1 = (const u8*)W1;
    s1 = S1;
    xr = xsh + (j - slots);
  }
}

extern "C" __global__ void __launch_bounds__(GB_THREADS, 2)
    gemv_bulk_fp8(const void* const* __restrict__ T0, const float* const* __restrict__ TS0,
                  const void* const* __restrict__ T1, const float* const* __restrict__ TS1,
                  const int* __restrict__ ids, int slots, const void* W0, const float* S0, const void* W1,
                  const float* S1, const float* __restrict__ x, int ldx, int xdiv, int xsh, float* y, int ldy,
                  const float* resid, int N, int K, int G, int nslots, int nst) {
  extern __shared__ __align__(128) u8 gb_raw[];
  u8* ring = gb_raw;
  u64* full = (u64*)(gb_raw + (size_t)nst * GB_STAGE);
  u64* empty = full + nst;
  float* part = (float*)(empty + nst);  // [2][8][GB_RG]
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  if (tid == 0) {
    for (int s = 0; s < nst; s++) {
      gb_bar_init(full + s, 1);
      gb_bar_init(empty + s, GB_CONSUMERS / 32);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  PDL_WAIT_STREAM();
  // Paired when the slots carry up weights (the launcher checks that routed
  // and dense slots agree).
  const bool pair = slots > 0 ? T1 != 0 : W1 != 0;
  const int rout = pair ? GB_RG / 2 : GB_RG;
  const int groups = GB_CONSUMERS / G;
  const int tileRows = groups * rout;  // output rows of a row tile
  const int srows = groups * GB_RG;    // weight rows of a stage
  const int tilesPer = (N + tileRows - 1) / tileRows;
  const int tiles = tilesPer * nslots;
  const int KS = G * 16;
  const int nsl = (K + KS - 1) / KS;
  if (warp == GB_CONSUMERS / 32) {
    // Producer warp.
    int st = 0;
    u32 ph = 0;
    bool wrapped = false;
    for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
      const int j = t / tilesPer, b = t - j * tilesPer;
      const u8 *w0, *w1;
      const float *s0, *s1;
      int xr;
      gb_slot(j, T0, TS0, T1, TS1, ids, slots, W0, S0, W1, S1, xdiv, xsh, w0, w1, s0, s1, xr);
      const int r0 = b * tileRows;
      const int vout = min(tileRows, N - r0);  // valid output rows
      for (int sl = 0; sl < nsl; sl++) {
        const int koff = sl * KS;
        const u32 ls = (u32)min(KS, K - koff);  // bytes of each row in this slice
        if (wrapped) gb_wait(empty + st, ph ^ 1u);
        if (lane == 0) gb_expect(full + st, ls * (u32)(pair ? 2 * vout : vout));
        __syncwarp();
        u8* stage = ring + (size_t)st * GB_STAGE;
        for (int sr = lane; sr < srows; sr += 32) {
          const int grp = sr / GB_RG, r = sr - grp * GB_RG;
          const bool second = pair && r >= rout;
          const int o = grp * rout + (second ? r - rout : r);  // output row in the tile
          if (o < vout) {
            const u8* src = (second ? w1 : w0) + (size_t)(r0 + o) * K + koff;
            gb_copy(stage + (size_t)sr * KS, src, ls, full + st);
          }
        }
        if (++st == nst) {
          st = 0;
          ph ^= 1u;
          wrapped = true;
        }
      }
    }
    return;
  }
  // Consumer warps.
  const int grp = tid / G, tg = tid - grp * G;
  const int kb = (K + 127) >> 7;
  int st = 0;
  u32 ph = 0;
  int buf = 0;
  for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
    const int j = t / tilesPer, b = t - j * tilesPer;
    const u8 *w0, *w1;
    const float *s0, *s1;
    int xr;
    gb_slot(j, T0, TS0, T1, TS1, ids, slots, W0, S0, W1, S1, xdiv, xsh, w0, w1, s0, s1, xr);
    const int n0 = b * tileRows + grp * rout;  // the group's first output row
    // The group's rows lie in one 128-row scale block (rout divides 128).
    const int nsc = min(n0, N - 1) >> 7;
    const float* sg = s0 ? s0 + (size_t)nsc * kb : (const float*)0;
    const float* su = pair && s1 ? s1 + (size_t)nsc * kb : (const float*)0;
    const float* xb = x + (size_t)xr * ldx;
    float acc[GB_RG];
#pragma unroll
    for (int r = 0; r < GB_RG; r++) acc[r] = 0.0f;
    for (int sl = 0; sl < nsl; sl++) {
      const int k = sl * KS + tg * 16;
      const bool on = k < K;
      float xv[16];
      float scg = 1.0f, scu = 1.0f;
      if (on) {
#pragma unroll
        for (int q = 0; q < 4; q++) {
          const float4 v = __ldg((const float4*)(xb + k + 4 * q));
          xv[4 * q] = v.x;
          xv[4 * q + 1] = v.y;
          xv[4 * q + 2] = v.z;
          xv[4 * q + 3] = v.w;
        }
        if (sg) scg = __ldg(sg + (k >> 7));
        if (su) scu = __ldg(su + (k >> 7));
      }
      gb_wait(full + st, ph);
      if (on) {
        const u8* srow = ring + (size_t)st * GB_STAGE + (size_t)(grp * GB_RG) * KS + tg * 16;
        uint4 wv[GB_RG];
#pragma unroll
        for (int r = 0; r < GB_RG; r++) wv[r] = *(const uint4*)(srow + (size_t)r * KS);
#pragma unroll
        for (int r = 0; r < GB_RG; r++) {
          const bool second = pair && r >= rout;
          if (n0 + (second ? r - rout : r) < N) {
            float p = 0.0f;
#pragma unroll
            for (int q = 0; q < 4; q++) {
              const u32 wq = q == 0 ? wv[r].x : q == 1 ? wv[r].y : q == 2 ? wv[r].z : wv[r].w;
              float wf[4];
              fp8x4_to_f32(wq, wf);
#pragma unroll
              for (int e = 0; e < 4; e++) p = fmaf(wf[e], xv[4 * q + e], p);
            }
            acc[r] = fmaf(p, second ? scu : scg, acc[r]);
          }
        }
      }
      __syncwarp();
      if (lane == 0) gb_arrive(empty + st);
      if (++st == nst) {
        st = 0;
        ph ^= 1u;
      }
    }
#pragma unroll
    for (int r = 0; r < GB_RG; r++) acc[r] = warp_sum(acc[r]);
    float* pb = part + buf * (GB_CONSUMERS / 32) * GB_RG;
    if (lane == 0) {
#pragma unroll
      for (int r = 0; r < GB_RG; r++) pb[warp * GB_RG + r] = acc[r];
    }
    gb_consumers_sync();
    if (tg < rout) {
      const int wpg = G >> 5, w0i = grp * wpg;
      float v = 0.0f;
      for (int i = 0; i < wpg; i++) v += pb[(w0i + i) * GB_RG + tg];
      if (pair) {
        float u = 0.0f;
        for (int i = 0; i < wpg; i++) u += pb[(w0i + i) * GB_RG + tg + rout];
        v = v / (1.0f + expf(-v)) * u;  // silu(gate) * up, as silu_mul
      }
      const int n = n0 + tg;
      if (n < N) {
        const size_t o = (size_t)j * ldy + n;
        y[o] = v + (resid ? resid[o] : 0.0f);
      }
    }
    buf ^= 1;  // part[buf] is written again two tiles on, after the next barrier
  }
}
