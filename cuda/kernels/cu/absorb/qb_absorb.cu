// qb_absorb: a one-row step's q_b and the query absorption (absorb_q_fast's
// _n or plain form) in one launch, CL blocks a head (TILERT_GPU_QB_ABSORB=1,
// kernels.QBAbsorb; session 60, issue 10). Today the query's chain is q_b
// (24576 rows of 1536 fp8 on DeepSeek-V3.2 dims, 384 blocks), a boundary,
// then absorb_q's 512 blocks, which run beside the indexer's one-block
// top-k and lengthen it (session 56's H200 trace: 8.8 us after the scores
// against 6.2 alone). Here the blocks of head h sum its hs q_b rows, keep
// them in shared memory (a cluster's blocks trade their halves through
// distributed shared memory) and absorb them: one boundary fewer, and the
// head's W_UK slice asked into the L2 while q_b's rows stream.
//
// Bits: a q_b row is the tile GEMV's one-row sum for groups of GQ threads
// (TILE_CHUNK_M1 over the thread's chunks c = tg, tg + GQ, ... in order,
// each times its block scale by fmaf, warp_sum, then the group's warps
// from 0.0f, + 0.0f as the launch without a residual), written to qo as
// q_b's launch writes it; every absorbed sum and the rotated RoPE part are
// absorb_q_fast_body's at its g 8 (kernels.absorbCols on 132 SMs), with
// rq as its QN form takes it. So qo, out and qpe are the two launches'
// bit for bit (TestKernelQBAbsorb).
#define QBA_HS_MAX 512

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
__device__ __forceinline__ void qba_arrive() { asm volatile("barrier.cluster.arrive.aligned;" ::: "memory"); }
__device__ __forceinline__ void qba_wait() { asm volatile("barrier.cluster.wait.aligned;" ::: "memory"); }
__device__ __forceinline__ u32 qba_rank() {
  u32 r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}
// v into the float at p (this block's shared memory) in block rank's copy.
__device__ __forceinline__ void qba_st(float* p, u32 rank, float v) {
  const u32 a = (u32)__cvta_generic_to_shared(p);
  u32 r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(rank));
  asm volatile("st.shared::cluster.f32 [%0], %1;" ::"r"(r), "f"(v) : "memory");
}
#else
__device__ __forceinline__ void qba_arrive() {}
__device__ __forceinline__ void qba_wait() {}
__device__ __forceinline__ u32 qba_rank() { return 0; }
__device__ __forceinline__ void qba_st(float* p, u32 rank, float v) {}
#endif

// grid (H * CL), 256 threads, clusters of CL. q_b: Wq [H*hs][K] fp8, Sq its
// 128x128 block scales, x the input row (K floats); W_UK [H][nope][R] fp8,
// S [H*nope][R/128]. Needs hs % (8 * CL) == 0, hs <= QBA_HS_MAX, K % 16 == 0,
// R % (128 * CL) == 0, nope <= NR * 32, P / 2 <= 256 (kernels.QBAbsorbOK).
template <int GQ, int NR, int CL, bool QN>
__device__ __forceinline__ void qb_absorb_body(float* qo, float* out, float* qpe, const float* __restrict__ x,
                                               const u8* __restrict__ Wq, const float* __restrict__ Sq, int K,
                                               const u8* __restrict__ W, const float* __restrict__ S, int nope, int R,
                                               int hs, int P, const int* __restrict__ pos,
                                               const float* __restrict__ cos_t, const float* __restrict__ sin_t,
                                               int interleaved, const float* __restrict__ ss, int nss, int KQ,
                                               float eps, int pf) {
  constexpr int RQ = 8, NI = 2;          // the q_b rows a group and chunks a row a round: _d16's 16 loads
  constexpr int NG = TILE_THREADS / GQ;  // groups a block
  constexpr int G = 8, CW = 16 * G, RL = 256 / G;
  __shared__ float qsh[QBA_HS_MAX];
  __shared__ float part[2][TILE_THREADS / 32][RQ];
  __shared__ float red[8][128];
  const u32 rank = CL > 1 ? qba_rank() : 0u;
  if (CL > 1) qba_arrive();  // every block of the cluster has started (waited on before the first remote store)
  const int h = blockIdx.x / CL;
  const int tid = threadIdx.x, lane = tid & 31, wid = tid >> 5;
  const int ncb = R / CW / CL, cb0 = (int)rank * ncb;  // this block's absorb column blocks
  if (pf) {
    // The block's W_UK slice into the L2 (128-byte lines), read after q_b.
    const int lpr = ncb * CW / 128, lines = nope * lpr;
    for (int l = tid; l < lines; l += TILE_THREADS) {
      const int d = l / lpr, c = cb0 * CW + (l - d * lpr) * 128;
      asm volatile("prefetch.global.L2 [%0];" ::"l"(W + ((size_t)h * nope + d) * R + c));
    }
  }
  // q_b: this block's rows [j00, j00 + rows) of head h.
  const int rows = hs / CL, j00 = (int)rank * rows;
  {
    const int grp = tid / GQ, tg = tid - grp * GQ;
    const int kb = (K + 127) >> 7, C = K / TFP8::E;
    const int npass = (rows + NG * RQ - 1) / (NG * RQ);
    for (int ps = 0; ps < npass; ps++) {
      const int j0 = j00 + (ps * NG + grp) * RQ;
      const bool live = j0 < j00 + rows;
      const size_t n0 = (size_t)h * hs + (live ? j0 : j00);
      const char* wb = (const char*)Wq + n0 * K;  // the group's rows, K bytes apart
      const float* sg = Sq + (n0 >> 7) * kb;
      float acc[RQ];
#pragma unroll
      for (int r = 0; r < RQ; r++) acc[r] = 0.0f;
      const int Cl = live ? C : 0;
      for (int c0 = tg; c0 < Cl; c0 += GQ * NI) {
        uint4 wv[NI][RQ];
        float scg[NI];
#pragma unroll
        for (int i = 0; i < NI; i++) {
          const int c = c0 + i * GQ;
#pragma unroll
          for (int r = 0; r < RQ; r++)
            wv[i][r] = c < Cl ? tile_ld16(wb + (size_t)r * K + (size_t)c * 16) : make_uint4(0u, 0u, 0u, 0u);
          scg[i] = c < Cl ? __ldg(sg + ((c * TFP8::E) >> 7)) : 0.0f;
        }
#pragma unroll
        for (int i = 0; i < NI; i++) {
          const int c = c0 + i * GQ;
          if (c < Cl) {
            const float* xc = x + (size_t)c * TFP8::E;
            float p[RQ];
            TILE_CHUNK_M1(TFP8, RQ, xc, (const float*)0, 1.0f, wv[i], p)
#pragma unroll
            for (int r = 0; r < RQ; r++) acc[r] = fmaf(p[r], scg[i], acc[r]);
          }
        }
      }
#pragma unroll
      for (int r = 0; r < RQ; r++) acc[r] = warp_sum(acc[r]);
      if constexpr (GQ == 32) {
        // A group is one warp: lane r holds row r's sum already, and the
        // warps run their passes without waiting for each other.
        if (live && lane < RQ) {
          float a = acc[0];
#pragma unroll
          for (int r = 1; r < RQ; r++)
            if (lane == r) a = acc[r];
          float v = 0.0f;
          v += a;
          v = v + 0.0f;  // the launch's y = v + 0 without a residual
          qo[n0 + lane] = v;
          qsh[j0 + lane] = v;
        }
      } else {
        // The group's warps meet at a barrier of their own (ids 1..NG), on
        // a part buffer a pass apart from the one the last pass read.
        float(*pt)[RQ] = part[ps & 1];
        if (lane == 0) {
#pragma unroll
          for (int r = 0; r < RQ; r++) pt[wid][r] = acc[r];
        }
        asm volatile("bar.sync %0, %1;" ::"r"(1 + grp), "r"(GQ) : "memory");
        if (live && tg < RQ) {
          constexpr int wpg = GQ >> 5;
          float v = 0.0f;
          for (int i = 0; i < wpg; i++) v += pt[grp * wpg + i][tg];
          v = v + 0.0f;
          qo[n0 + tg] = v;
          qsh[j0 + tg] = v;
        }
      }
    }
    __syncthreads();  // qsh holds this block's rows
  }
  BLOCK_MARK(0);
  if (CL > 1) {
    // This block's rows into every other block's copy, then the cluster's
    // barrier (release / acquire) before any block reads them.
    qba_wait();
    for (int j = tid; j < rows; j += TILE_THREADS) {
#pragma unroll
      for (int o = 1; o < CL; o++) qba_st(&qsh[j00 + j], (rank + o) % CL, qsh[j00 + j]);
    }
    qba_arrive();
    qba_wait();
  }
  // absorb_q_fast_body<8, NR, QN> over this block's column blocks, q from qsh.
  const int g = tid % G, r = tid / G;
  const int rb = (R + 127) >> 7;
  float rq = 1.0f;
  if constexpr (QN) {
    const float a = ss_lane_sum(ss, nss, lane);
    rq = rsqrtf(warp_sum(a) / (float)KQ + eps);
  }
  BLOCK_MARK(1);
  for (int cb = cb0; cb < cb0 + ncb; cb++) {
    const int c0 = cb * CW;
    uint4 wv[NR];
    absorb_q_load<NR>(W, h, nope, R, c0, g, r, RL, wv);
    const float* Sh = S + (size_t)h * nope * rb + (c0 >> 7);
    float cf[NR];
#pragma unroll
    for (int i = 0; i < NR; i++) {
      const int d = r + i * RL;
      cf[i] = 0.0f;
      if (d < nope) cf[i] = qsh[d] * Sh[(size_t)d * rb];
    }
    ABSORB_Q_COLS(G, NR, QN, wv, cf, r, RL, nope, red, lane, wid, tid, rq, out[(size_t)h * R + c0 + tid])
    __syncthreads();  // red is reused by the next column block
  }
  BLOCK_MARK(2);
  // The RoPE part (absorb_q_fast's blocks of column 0 write it).
  const int half = P >> 1;
  if (qpe && rank == 0 && tid < half) {
    const int i0 = interleaved ? 2 * tid : tid;
    const int i1 = interleaved ? 2 * tid + 1 : tid + half;
    const float ra = qsh[nope + i0], rbv = qsh[nope + i1];
    float* dst = qpe + (size_t)h * P;
    // The position's cos / sin, read in the macro's rotating branch only.
    ABSORB_Q_ROPE(QN, dst, i0, i1, ra, rbv, cos_t[(size_t)pos[0] * half + tid], sin_t[(size_t)pos[0] * half + tid], rq,
                  pos)
  }
}

// The launchable forms, written out (NVRTC 11.8 crashes on macro-generated
// kernel definitions): q_b on groups of 32 (DeepSeek-V3.2 dims' 1536-byte
// rows, kernels.OneRowWholeChunks) or 64 (GLM-5 dims' 2048), nope up to 128
// (r4) or 256 (r8), one or two blocks a head, plain or QN (_n).
#define QBA_ARGS                                                                                                     \
  float *qo, float *out, float *qpe, const float *__restrict__ x, const u8 *__restrict__ Wq,                          \
      const float *__restrict__ Sq, int K, const u8 *__restrict__ W, const float *__restrict__ S, int nope, int R,   \
      int hs, int P, const int *__restrict__ pos, const float *__restrict__ cos_t, const float *__restrict__ sin_t, \
      int interleaved, const float *__restrict__ ss, int nss, int KQ, float eps, int pf
#define QBA_PASS qo, out, qpe, x, Wq, Sq, K, W, S, nope, R, hs, P, pos, cos_t, sin_t, interleaved, ss, nss, KQ, eps, pf

extern "C" __global__ void __launch_bounds__(TILE_THREADS) qb_absorb_g32_r4(QBA_ARGS) {
  PDL_WAIT_MARKED();
  qb_absorb_body<32, 4, 1, false>(QBA_PASS);
}
extern "C" __global__ void __launch_bounds__(TILE_THREADS) qb_absorb_g32_r4_n(QBA_ARGS) {
  PDL_WAIT_MARKED();
  qb_absorb_body<32, 4, 1, true>(QBA_PASS);
}
extern "C" __global__ void __launch_bounds__(TILE_THREADS) qb_absorb_g64_r8(QBA_ARGS) {
  PDL_WAIT_MARKED();
  qb_absorb_body<64, 8, 1, false>(QBA_PASS);
}
extern "C" __global__ void __launch_bounds__(TILE_THREADS) qb_absorb_g64_r8_n(QBA_ARGS) {
  PDL_WAIT_MARKED();
  qb_absorb_body<64, 8, 1, true>(QBA_PASS);
}
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
extern "C" __global__ void __cluster_dims__(2, 1, 1) __launch_bounds__(TILE_THREADS) qb_absorb_g32_r4_c2(QBA_ARGS) {
  PDL_WAIT_MARKED();
  qb_absorb_body<32, 4, 2, false>(QBA_PASS);
}
extern "C" __global__ void __cluster_dims__(2, 1, 1) __launch_bounds__(TILE_THREADS) qb_absorb_g32_r4_c2_n(QBA_ARGS) {
  PDL_WAIT_MARKED();
  qb_absorb_body<32, 4, 2, true>(QBA_PASS);
}
extern "C" __global__ void __cluster_dims__(2, 1, 1) __launch_bounds__(TILE_THREADS) qb_absorb_g64_r8_c2(QBA_ARGS) {
  PDL_WAIT_MARKED();
  qb_absorb_body<64, 8, 2, false>(QBA_PASS);
}
extern "C" __global__ void __cluster_dims__(2, 1, 1) __launch_bounds__(TILE_THREADS) qb_absorb_g64_r8_c2_n(QBA_ARGS) {
  PDL_WAIT_MARKED();
  qb_absorb_body<64, 8, 2, true>(QBA_PASS);
}
#endif
