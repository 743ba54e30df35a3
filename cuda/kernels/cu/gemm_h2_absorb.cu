// (After gemm_h2.cu in the module: it uses that file's fp16 and mma helpers.)
// Absorbed-MLA per-head products for many rows (local prefill) on tensor
// cores: the results of absorb_q_fp8 / absorb_v_fp8 (mla_absorb.cu) up to
// summation order, for fp8 W_UK / W_UV with per-row scales S[row][c/128].
//
// mode 0 (q): out[m][h][c] = sum_d q[m*ldq + h*hs + d] * W[h*K + d][c] * S[h*K + d][c/128]
//   (K = nope); the per-d scale of the block's 128 columns is folded into x.
// mode 1 (v): out[m*ldo + h*N + v] = sum_c x[(m*H + h)*K + c] * W[h*N + v][c] * S[h*N + v][c/128]
//   (K = R, N = vd); the scale is applied per output column when each
//   128-wide K block is promoted.
// Per 128-wide K block and row, x is scaled by a power of two (its largest
// |x| to [2^14, 2^15)) and split into three fp16 parts (33 bits: float32-
// exact products against e4m3 weights, which fp16 holds exactly); the
// block's tensor-core partial is promoted into a float32 total with the
// inverse scale. Block: head blockIdx.y, 128 outputs blockIdx.x, 64 rows
// blockIdx.z; 8 warps as 2 x 4 (32 x 32 each). grid (ceil(Nout/128), H,
// ceil(M/64)), 256 threads, AT_SMEM bytes.

#define AT_BM 64
#define AT_ALD 136  // A row stride in halves (272 bytes)
#define AT_BLD 144  // B row stride in bytes
#define AT_SMEM (3 * AT_BM * AT_ALD * 2 + 128 * AT_BLD + AT_BM * 4)

#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 890
extern "C" __global__ void __launch_bounds__(256) absorb_tc(const float* __restrict__ x, const u8* __restrict__ W,
                                                            const float* __restrict__ S, float* out, int mode, int M,
                                                            int H, int K, int N, int R, int ldx, int hs, int ldo) {
  PDL_WAIT();
  extern __shared__ __align__(16) u8 at_smem[];
  u16* As = (u16*)at_smem;                               // [3][64][AT_ALD]
  u8* Bt = at_smem + 3 * AT_BM * AT_ALD * 2;             // [128 n][AT_BLD] (k bytes)
  float* inv = (float*)(Bt + 128 * AT_BLD);              // [64] row scale of this K block
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int wm = warp >> 2, wn = warp & 3, g = lane >> 2, t4 = lane & 3;
  const int h = blockIdx.y, n0 = blockIdx.x * 128, m0 = blockIdx.z * AT_BM;
  const int rows = min(AT_BM, M - m0);
  const int KBR = (R + 127) >> 7;  // scale columns per weight row
  const int Nout = mode == 0 ? R : N;

  float acc[2][4][4], part[2][4][4];
#pragma unroll
  for (int i = 0; i < 2; i++)
#pragma unroll
    for (int j = 0; j < 4; j++)
#pragma unroll
      for (int c = 0; c < 4; c++) acc[i][j][c] = 0.0f;

  const int a_row = lane & 15, a_col = (lane >> 4) * 8;
  for (int kb = 0; kb * 128 < K; kb++) {
    const int k0 = kb * 128;
    __syncthreads();  // the previous block's fragments are read
    // A: thread t takes row t/4, k [32 (t%4), +32).
    {
      const int r = tid >> 2, kq = (tid & 3) * 32;
      float v[32];
      float mx = 0.0f;
      const int m = m0 + r;
#pragma unroll
      for (int i = 0; i < 32; i++) {
        const int k = k0 + kq + i;
        float a = 0.0f;
        if (r < rows && k < K) {
          if (mode == 0) {
            a = x[(size_t)m * ldx + (size_t)h * hs + k] * S[(size_t)(h * K + k) * KBR + (n0 >> 7)];
          } else {
            a = x[((size_t)m * H + h) * K + k];
          }
        }
        v[i] = a;
        mx = fmaxf(mx, fabsf(a));
      }
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      int e = 15;
      if (mx > 0.0f && mx <= 3.4e38f) {
        frexpf(mx, &e);
        e = max(-100, min(100, e));
      }
      const float sc = ldexpf(1.0f, 15 - e);
      if ((tid & 3) == 0) inv[r] = ldexpf(1.0f, e - 15);
#pragma unroll
      for (int i = 0; i < 32; i += 2) {
        float p0 = v[i] * sc, p1 = v[i + 1] * sc;
#pragma unroll
        for (int p = 0; p < 3; p++) {
          const u16 h0 = gh_f16(p0), h1 = gh_f16(p1);
          *(u32*)&As[(p * AT_BM + r) * AT_ALD + kq + i] = (u32)h0 | ((u32)h1 << 16);
          p0 -= gh_f32(h0);
          p1 -= gh_f32(h1);
        }
      }
    }
    // B as [n][k] bytes: q mode gathers column n of weight rows h*K + k;
    // v mode copies weight row h*N + n.
    if (mode == 0) {
      const int k = tid >> 1, nq = (tid & 1) * 64;
      u8* dst = Bt + k;
      if (k0 + k < K) {
        const uint4* src = (const uint4*)(W + (size_t)(h * K + k0 + k) * R + n0 + nq);
#pragma unroll
        for (int c = 0; c < 4; c++) {
          const uint4 w = __ldg(src + c);
          const u32 ws[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
          for (int b = 0; b < 16; b++) dst[(nq + c * 16 + b) * AT_BLD] = (u8)(ws[b >> 2] >> (8 * (b & 3)));
        }
      } else {
        for (int b = 0; b < 64; b++) dst[(nq + b) * AT_BLD] = 0;
      }
    } else {
      const int n = tid >> 1, kq = (tid & 1) * 64;
      uint4* dst = (uint4*)(Bt + n * AT_BLD + kq);
      const bool ok = n0 + n < N;
#pragma unroll
      for (int c = 0; c < 4; c++) {
        uint4 w = make_uint4(0u, 0u, 0u, 0u);
        if (ok && k0 + kq + 16 * c < K) w = __ldg((const uint4*)(W + (size_t)(h * N + n0 + n) * R + k0 + kq) + c);
        dst[c] = w;
      }
    }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
      for (int j = 0; j < 4; j++)
#pragma unroll
        for (int c = 0; c < 4; c++) part[i][j][c] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < 128; kk += 16) {
      u32 b[4][2];
#pragma unroll
      for (int j = 0; j < 4; j++) {
        const u8* br = Bt + (wn * 32 + j * 8 + g) * AT_BLD + kk + 2 * t4;
        b[j][0] = gh_e4m3x2(*(const u16*)br);
        b[j][1] = gh_e4m3x2(*(const u16*)(br + 8));
      }
#pragma unroll
      for (int p = 0; p < 3; p++) {
#pragma unroll
        for (int i = 0; i < 2; i++) {
          u32 a0, a1, a2, a3;
          gh_ldmatrix_x4(gh_smem_addr(As + (p * AT_BM + wm * 32 + i * 16 + a_row) * AT_ALD + kk + a_col), a0, a1, a2, a3);
#pragma unroll
          for (int j = 0; j < 4; j++) gh_mma(part[i][j], a0, a1, a2, a3, b[j][0], b[j][1]);
        }
      }
    }
    // Promote: the row's inverse scale, and in v mode the column's weight scale.
#pragma unroll
    for (int i = 0; i < 2; i++) {
      const float ia = inv[wm * 32 + i * 16 + g], ib = inv[wm * 32 + i * 16 + g + 8];
#pragma unroll
      for (int j = 0; j < 4; j++) {
        float s0 = 1.0f, s1 = 1.0f;
        if (mode != 0) {
          const int n = n0 + wn * 32 + j * 8 + 2 * t4;
          s0 = n < N ? S[(size_t)(h * N + n) * KBR + kb] : 0.0f;
          s1 = n + 1 < N ? S[(size_t)(h * N + n + 1) * KBR + kb] : 0.0f;
        }
        acc[i][j][0] = fmaf(part[i][j][0], ia * s0, acc[i][j][0]);
        acc[i][j][1] = fmaf(part[i][j][1], ia * s1, acc[i][j][1]);
        acc[i][j][2] = fmaf(part[i][j][2], ib * s0, acc[i][j][2]);
        acc[i][j][3] = fmaf(part[i][j][3], ib * s1, acc[i][j][3]);
      }
    }
  }
#pragma unroll
  for (int i = 0; i < 2; i++) {
#pragma unroll
    for (int hh = 0; hh < 2; hh++) {
      const int r = wm * 32 + i * 16 + g + hh * 8;
      if (r >= rows) continue;
      const int m = m0 + r;
      float* yr = mode == 0 ? out + ((size_t)m * H + h) * R : out + (size_t)m * ldo + (size_t)h * N;
#pragma unroll
      for (int j = 0; j < 4; j++) {
        const int n = n0 + wn * 32 + j * 8 + 2 * t4;
        if (n < Nout) yr[n] = acc[i][j][2 * hh];
        if (n + 1 < Nout) yr[n + 1] = acc[i][j][2 * hh + 1];
      }
    }
  }
}
#else
extern "C" __global__ void __launch_bounds__(256) absorb_tc(const float* __restrict__ x, const u8* __restrict__ W,
                                                            const float* __restrict__ S, float* out, int mode, int M,
                                                            int H, int K, int N, int R, int ldx, int hs, int ldo) {
  PDL_WAIT();
  __trap();
}
#endif
