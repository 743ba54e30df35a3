// Absorbed-MLA per-head products over fp8 weights with per-row scales
// (S[row][c/128], the converter's row_scale layout), spread over all SMs:
// the same results as eng_absorb_q / eng_absorb_v (engine.cu) up to the
// summation order. Every weight byte is read once per launch, in 16-byte
// loads issued before any is used; the query rows (M) loop over the weights
// held in registers.

// absorb_q_fp8: out[m][h][c] = sum_d q[m*ldq + h*hs + d] * W[h][d][c]
// (W_UK [H][nope][R]); optionally qpe[m][h][0..P) = q[m*ldq + h*hs + nope + i]
// (the RoPE part of q, split out for mla decode), written by column block 0,
// rotated as the rope kernel does (position pos[m], tables [pos][P/2]) when
// pos is given.
// Block: head h, CW = 16*G columns [c0, c0+CW) (inside one 128-column scale
// block); thread t takes 16 columns (t % G) of rows d = t/G + i*(256/G),
// i < NR; the row lanes meet through shuffles, then shared memory.
// grid (H * R/CW), 256 threads; G in {2, 4, 8}; nope <= NR*256/G.
template <int NR>
__device__ __forceinline__ void absorb_q_body(float* out, float* qpe, const float* __restrict__ q,
                                              const u8* __restrict__ W, const float* __restrict__ S, int M, int H,
                                              int nope, int R, int ldq, int hs, int G, int P,
                                              const int* __restrict__ pos, const float* __restrict__ cos_t,
                                              const float* __restrict__ sin_t, int interleaved) {
  __shared__ float coef[8 * 256];   // [8 rows of M][nope] q times the row's scale
  __shared__ float red[2][8][128];  // [m parity][warp][column]
  const int CW = 16 * G, nb = R / CW;
  const int h = blockIdx.x / nb, c0 = (blockIdx.x % nb) * CW;
  const int tid = threadIdx.x, lane = tid & 31, wid = tid >> 5;
  const int g = tid % G, r = tid / G, RL = 256 / G;
  const int rb = (R + 127) >> 7;
  // Issue every weight load of this thread first.
  uint4 wv[NR];
  absorb_q_load<NR>(W, h, nope, R, c0, g, r, RL, wv);
  if (qpe && c0 == 0) {
    const int half = P >> 1;
    for (int i = tid; i < M * half; i += 256) {
      const int m = i / half, e = i - m * half;
      const float* src = q + (size_t)m * ldq + (size_t)h * hs + nope;
      float* dst = qpe + ((size_t)m * H + h) * P;
      const int i0 = interleaved ? 2 * e : e, i1 = interleaved ? 2 * e + 1 : e + half;
      const float a = src[i0], b = src[i1];
      if (pos) {
        const int p = pos[m];
        const float c = cos_t[(size_t)p * half + e], s = sin_t[(size_t)p * half + e];
        dst[i0] = a * c - b * s;
        dst[i1] = b * c + a * s;
      } else {
        dst[i0] = a;
        dst[i1] = b;
      }
    }
  }
  const float* Sh = S + (size_t)h * nope * rb + (c0 >> 7);
  for (int m0 = 0; m0 < M; m0 += 8) {
    const int mc = min(8, M - m0);
    __syncthreads();  // coef of the previous chunk consumed
    for (int i = tid; i < mc * nope; i += 256) {
      const int mm = i / nope, d = i - mm * nope;
      coef[mm * 256 + d] = q[(size_t)(m0 + mm) * ldq + (size_t)h * hs + d] * Sh[(size_t)d * rb];
    }
    __syncthreads();
    for (int mm = 0; mm < mc; mm++) {
      float acc[16];
#pragma unroll
      for (int k = 0; k < 16; k++) acc[k] = 0.0f;
#pragma unroll
      for (int i = 0; i < NR; i++) {
        const int d = r + i * RL;
        if (d < nope) absorb_fma16(wv[i], coef[mm * 256 + d], acc);
      }
      for (int off = G; off < 32; off <<= 1) {
#pragma unroll
        for (int k = 0; k < 16; k++) acc[k] += __shfl_xor_sync(0xffffffffu, acc[k], off);
      }
      float* rd = red[mm & 1][wid];
      if (lane < G) {
#pragma unroll
        for (int k = 0; k < 16; k++) rd[lane * 16 + k] = acc[k];
      }
      __syncthreads();
      if (tid < CW) {
        float s = 0.0f;
#pragma unroll
        for (int w = 0; w < 8; w++) s += red[mm & 1][w][tid];
        out[((size_t)(m0 + mm) * H + h) * R + c0 + tid] = s;
      }
      // The next row writes the other half of red; the one after waits
      // for this row's readers at its own __syncthreads.
    }
  }
}

// NR = rows a thread holds (8, or 4 when nope <= 4 * 256/G: half the
// registers, twice the blocks resident per SM).
extern "C" __global__ void __launch_bounds__(256) absorb_q_fp8(float* out, float* qpe, const float* __restrict__ q,
                                                               const u8* __restrict__ W, const float* __restrict__ S,
                                                               int M, int H, int nope, int R, int ldq, int hs, int G,
                                                               int P, const int* __restrict__ pos,
                                                               const float* __restrict__ cos_t,
                                                               const float* __restrict__ sin_t, int interleaved) {
  PDL_WAIT();
  absorb_q_body<8>(out, qpe, q, W, S, M, H, nope, R, ldq, hs, G, P, pos, cos_t, sin_t, interleaved);
}

extern "C" __global__ void __launch_bounds__(256) absorb_q_fp8_r4(float* out, float* qpe, const float* __restrict__ q,
                                                                    const u8* __restrict__ W,
                                                                    const float* __restrict__ S, int M, int H, int nope,
                                                                    int R, int ldq, int hs, int G, int P,
                                                                    const int* __restrict__ pos,
                                                                    const float* __restrict__ cos_t,
                                                                    const float* __restrict__ sin_t, int interleaved) {
  PDL_WAIT();
  absorb_q_body<4>(out, qpe, q, W, S, M, H, nope, R, ldq, hs, G, P, pos, cos_t, sin_t, interleaved);
}

// absorb_v_fp8: out[m*ldo + h*vd + v] = sum_c W[h][v][c] * x[m][h][c]
// (W_UV [H][vd][R], R = 512: a warp covers a row, 16 bytes a lane).
// Block: 8 warps of RW rows each, 8*RW consecutive rows of one head.
// grid (H * ceil(vd / (8*RW))), 256 threads; RW in {1, 2, 4}.
extern "C" __global__ void __launch_bounds__(256) absorb_v_fp8(float* out, const float* __restrict__ x,
                                                               const u8* __restrict__ W, const float* __restrict__ S,
                                                               int M, int H, int vd, int ldo, int RW) {
  PDL_WAIT();
  const int R = 512, rb = 4;
  const int nvb = (vd + 8 * RW - 1) / (8 * RW);
  const int h = blockIdx.x / nvb, v0 = (blockIdx.x % nvb) * 8 * RW + (threadIdx.x >> 5) * RW;
  const int lane = threadIdx.x & 31;
  uint4 wv[4];
  float sc[4];
#pragma unroll
  for (int j = 0; j < 4; j++) {
    wv[j] = make_uint4(0u, 0u, 0u, 0u);
    sc[j] = 0.0f;
    if (j < RW && v0 + j < vd) {
      const size_t row = (size_t)h * vd + v0 + j;
      wv[j] = *(const uint4*)(W + row * R + lane * 16);
      sc[j] = S[row * rb + (lane >> 3)];
    }
  }
  for (int m = 0; m < M; m++) {
    const float4* xp = (const float4*)(x + ((size_t)m * H + h) * R + lane * 16);
    float xv[16];
    ABSORB_X16(xv, xp[b])
#pragma unroll
    for (int j = 0; j < 4; j++) {
      if (j >= RW) break;
      ABSORB_DOT16(acc, wv[j], xv)
      const float a = warp_sum(acc * sc[j]);
      if (lane == 0 && v0 + j < vd) out[(size_t)m * ldo + (size_t)h * vd + v0 + j] = a;
    }
  }
}
