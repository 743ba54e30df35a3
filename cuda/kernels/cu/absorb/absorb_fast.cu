// One-row absorb products (TILERT_GPU_ABSORB_FAST=1; helper absorb, issue
// 10): absorb_q_fp8 / absorb_v_fp8 (mla_absorb.cu) for ONE query row, in a
// module of their own (kernels_absorb.go). Same block shapes, the same
// element-to-thread map, FMA order and reductions (the weight loads and a
// thread's sums are mla_absorb.cuh's, the default kernels' own text), so
// every output is the default kernels' bit for bit; what changes is the
// latency chain:
//   - absorb_q_fast: no shared-memory staging of the coefficients (each
//     thread loads q[d] and the row's scale for its own rows right behind
//     its weight loads, no barrier before the FMAs); the RoPE part's
//     position is loaded before the weights and its cos/sin before the
//     FMAs, the rotation written last (absorb_q_fp8 ran pos -> cos/sin ->
//     the coefficients' loads in a row before any FMA in the blocks of
//     column 0); at most 64 registers (4 blocks an SM: all 512 blocks of
//     128 heads in one wave on 132 SMs, where absorb_q_fp8_r4's 80
//     registers left 3 an SM, 1.3 waves).
//   - absorb_v_fast: the head's 512 latent values staged once a block in
//     shared memory (2 KB; absorb_v_fp8 read them from L2 once a warp, 8x),
//     the weights and their scales in flight across the barrier.

// absorb_q_fast<G, NR>: out[h][c] = sum_d q[h*hs + d] * S[h*nope + d][c/128] * W[h][d][c]
// for one row; qpe[h][0..P) = q's RoPE part rotated (pos[0]) as absorb_q_fp8
// does. grid (H * R/(16*G)), 256 threads; nope <= NR*256/G, P/2 <= 256.
// QN (the _n kernels, TILERT_GPU_QA_NORM=late): q is q_b of q_a times
// q_a_layernorm's weight, not yet scaled by RMSNorm's rsqrt; every output
// (the sums and the rotated RoPE part) is multiplied by
// rq = rsqrt(sum(ss[0..nss)) / K + eps), ss the layer-input group's
// per-block sums of q_a's squares. Each warp sums them itself (lane i from
// ss[i] in steps of 32, then the butterfly): the same rq in every thread,
// no barrier, the loads out with the coefficients'.
template <int G, int NR, bool QN = false>
__device__ __forceinline__ void absorb_q_fast_body(float* out, float* qpe, const float* __restrict__ q,
                                                   const u8* __restrict__ W, const float* __restrict__ S, int H,
                                                   int nope, int R, int hs, int P, const int* __restrict__ pos,
                                                   const float* __restrict__ cos_t, const float* __restrict__ sin_t,
                                                   int interleaved, const float* __restrict__ ss = nullptr,
                                                   int nss = 0, int K = 1, float eps = 0.0f) {
  __shared__ float red[8][128];  // [warp][column]
  constexpr int CW = 16 * G, RL = 256 / G;
  const int nb = R / CW;
  const int h = blockIdx.x / nb, c0 = (blockIdx.x % nb) * CW;
  const int tid = threadIdx.x, lane = tid & 31, wid = tid >> 5;
  const int g = tid % G, r = tid / G;
  const int rb = (R + 127) >> 7;
  const int half = P >> 1;
  const bool rope = qpe && c0 == 0 && tid < half;
  const float* qh = q + (size_t)h * hs;
  // The RoPE part's position first (its tables need it).
  int p = 0;
  if (rope && pos) p = pos[0];
  // Every weight load of this thread.
  uint4 wv[NR];
  absorb_q_load<NR>(W, h, nope, R, c0, g, r, RL, wv);
  // This thread's coefficients: q times the row's scale (absorb_q_fp8's coef).
  const float* Sh = S + (size_t)h * nope * rb + (c0 >> 7);
  float cf[NR];
#pragma unroll
  for (int i = 0; i < NR; i++) {
    const int d = r + i * RL;
    cf[i] = 0.0f;
    if (d < nope) cf[i] = qh[d] * Sh[(size_t)d * rb];
  }
  float rq = 1.0f;
  if constexpr (QN) {
    float a = 0.0f;
    for (int i = lane; i < nss; i += 32) a += ss[i];
    rq = rsqrtf(warp_sum(a) / (float)K + eps);
  }
  float ra = 0.0f, rbv = 0.0f, rc = 0.0f, rs = 0.0f;
  int i0 = 0, i1 = 0;
  if (rope) {
    i0 = interleaved ? 2 * tid : tid;
    i1 = interleaved ? 2 * tid + 1 : tid + half;
    ra = qh[nope + i0];
    rbv = qh[nope + i1];
    if (pos) {
      rc = cos_t[(size_t)p * half + tid];
      rs = sin_t[(size_t)p * half + tid];
    }
  }
  ABSORB_Q_COLS(G, NR, QN, wv, cf, r, RL, nope, red, lane, wid, tid, rq, out[(size_t)h * R + c0 + tid])
  if (rope) {
    float* dst = qpe + (size_t)h * P;
    ABSORB_Q_ROPE(QN, dst, i0, i1, ra, rbv, rc, rs, rq, pos)
  }
}

#define ABSORB_Q_FAST(G, NR, MINB)                                                                                   \
  extern "C" __global__ void __launch_bounds__(256, MINB) absorb_q_fast_g##G##_r##NR(                                \
      float* out, float* qpe, const float* __restrict__ q, const u8* __restrict__ W, const float* __restrict__ S,    \
      int H, int nope, int R, int hs, int P, const int* __restrict__ pos, const float* __restrict__ cos_t,           \
      const float* __restrict__ sin_t, int interleaved) {                                                            \
    PDL_WAIT();                                                                                                      \
    absorb_q_fast_body<G, NR>(out, qpe, q, W, S, H, nope, R, hs, P, pos, cos_t, sin_t, interleaved);                 \
  }

// The shapes kernels.absorbQFastKernel names: nope <= 256 takes 4 rows a
// thread at g 2 and 4, so only g 8 has an r8 (g2_r8 and g4_r8, never
// launched, were removed in session 54).
ABSORB_Q_FAST(2, 4, 4)
ABSORB_Q_FAST(4, 4, 4)
ABSORB_Q_FAST(8, 4, 4)
ABSORB_Q_FAST(8, 8, 2)

// absorb_q_fast_g<G>_r<NR>_n: the QN form (TILERT_GPU_QA_NORM=late).
#define ABSORB_Q_FAST_N(G, NR, MINB)                                                                                 \
  extern "C" __global__ void __launch_bounds__(256, MINB) absorb_q_fast_g##G##_r##NR##_n(                            \
      float* out, float* qpe, const float* __restrict__ q, const u8* __restrict__ W, const float* __restrict__ S,    \
      int H, int nope, int R, int hs, int P, const int* __restrict__ pos, const float* __restrict__ cos_t,           \
      const float* __restrict__ sin_t, int interleaved, const float* __restrict__ ss, int nss, int K, float eps) {   \
    PDL_WAIT();                                                                                                      \
    absorb_q_fast_body<G, NR, true>(out, qpe, q, W, S, H, nope, R, hs, P, pos, cos_t, sin_t, interleaved, ss, nss, K, \
                                    eps);                                                                            \
  }

ABSORB_Q_FAST_N(2, 4, 4)
ABSORB_Q_FAST_N(4, 4, 4)
ABSORB_Q_FAST_N(8, 4, 4)
ABSORB_Q_FAST_N(8, 8, 2)

// absorb_v_fast<RW>: out[h*vd + v] = sum_c W[h][v][c] * x[h][c] for one row
// (W_UV [H][vd][R], R = 512), absorb_v_fp8's warp-per-row sums.
// grid (H * ceil(vd / (8*RW))), 256 threads.
template <int RW>
__device__ __forceinline__ void absorb_v_fast_body(float* out, const float* __restrict__ x, const u8* __restrict__ W,
                                                   const float* __restrict__ S, int H, int vd) {
  __shared__ float4 xs[128];  // x[h], 512 floats
  const int R = 512, rb = 4;
  const int nvb = (vd + 8 * RW - 1) / (8 * RW);
  const int h = blockIdx.x / nvb, v0 = (blockIdx.x % nvb) * 8 * RW + (threadIdx.x >> 5) * RW;
  const int lane = threadIdx.x & 31;
  uint4 wv[RW];
  float sc[RW];
#pragma unroll
  for (int j = 0; j < RW; j++) {
    wv[j] = make_uint4(0u, 0u, 0u, 0u);
    sc[j] = 0.0f;
    if (v0 + j < vd) {
      const size_t row = (size_t)h * vd + v0 + j;
      wv[j] = LD16_ONCE(W + row * R + lane * 16);
      sc[j] = S[row * rb + (lane >> 3)];
    }
  }
  if (threadIdx.x < 128) xs[threadIdx.x] = ((const float4*)(x + (size_t)h * R))[threadIdx.x];
  __syncthreads();
  float xv[16];
  ABSORB_X16(xv, xs[lane * 4 + b])
#pragma unroll
  for (int j = 0; j < RW; j++) {
    ABSORB_DOT16(acc, wv[j], xv)
    const float a = warp_sum(acc * sc[j]);
    if (lane == 0 && v0 + j < vd) out[(size_t)h * vd + v0 + j] = a;
  }
}

#define ABSORB_V_FAST(RW, MINB)                                                                                     \
  extern "C" __global__ void __launch_bounds__(256, MINB) absorb_v_fast_rw##RW(                                     \
      float* out, const float* __restrict__ x, const u8* __restrict__ W, const float* __restrict__ S, int H, int vd) { \
    PDL_WAIT();                                                                                                     \
    absorb_v_fast_body<RW>(out, x, W, S, H, vd);                                                                    \
  }

ABSORB_V_FAST(1, 4)
ABSORB_V_FAST(2, 8)
ABSORB_V_FAST(4, 4)
ABSORB_V_FAST(8, 2)
