// (After gemm_h2.cu in the module: it uses that file's fp16 and mma helpers.)
// One-part absorbed-MLA products for serving-mode prefill
// (TILERT_GPU_GEMM_SPLITS=1; engine/gpu absorbP1On): absorb_tc's products
// (gemm_h2_absorb.cu) with x rounded ONCE to fp16 instead of split into
// three parts, as gemm_p1.cu does for the linear layers. Exact mode never
// takes it (its absorbs stay float32-exact).
//
// mode 0 (q): out[m][h][c] = sum_d q[m*ldx + h*hs + d] * W[h*K + d][c] * S[h*K + d][c/128]
//   (K = nope, Nout = R); the per-d scale of the block's 128 columns is
//   folded into x before the rounding (x_d = q_d * S[h*K + d][c/128], a
//   float32 product), the weights stay raw e4m3.
// mode 1 (v): out[m*ldo + h*N + v] = sum_c x[(m*H + h)*K + c] * W[h*N + v][c] * S[h*N + v][c/128]
//   (K = R, N = vd); the weight scale is applied per output column when
//   each 128-wide K block's partial is promoted.
// Per 128-wide K block and row, x is scaled by a power of two 2^s (its
// largest |x| over the block's 128 values into [2^14, 2^15); s = 0 for a
// zero, inf or NaN block) and rounded to fp16 (cvt.rn: 2^-11 relative per
// value; below 2^-28 of the block's largest the subnormal step, 2^-39 of
// it); every e4m3 weight is exactly an fp16, so the tensor-core products
// are exact and accumulate in float32; the block's partial is promoted
// into a float32 total with 2^-s (times the column's weight scale in v
// mode). engine/gpu emu (absorbQP1 / absorbVP1) transcribes this rounding.
//
// Block: head blockIdx.y, 128 outputs blockIdx.x, 64 rows blockIdx.z; 8
// warps as 2 x 4 (32 x 32 outputs each), 256 threads, AP_SMEM bytes, grid
// (ceil(Nout/128), H, ceil(M/64)). Each warp loads 8 rows of x for a K
// block, a lane 4 consecutive values (a warp instruction reads 512
// contiguous bytes of one row: float4 loads when vec, else scalars), and
// reduces each row's largest |x| across the warp. B: v mode copies weight
// rows h*N + n as [n][k] bytes (absorb_tc's layout; e4m3 pairs converted
// in the fragment loads); q mode reads weight rows h*K + k (16 columns a
// 16-byte load), converts them to fp16 as [k][n] and takes the fragments
// with ldmatrix.trans (rows k, 8 halves of n each: lane l gets k = 2 (l%4)
// + {0,1} at n = l/4, mma m16n8k16's B layout). K tails are zero on both
// sides (x zero-filled, weight rows past K zero-filled), rows past M are
// zero and not written, nor columns past Nout.

#define AP_BM 64
#define AP_ALD 136  // A row stride in halves (272 bytes: the 8 rows of an ldmatrix hit distinct 16-byte bank groups)
#define AP_BLD 144  // v mode B row stride in bytes
#define AP_BHLD 136 // q mode B row stride in halves
#define AP_SMEM (AP_BM * AP_ALD * 2 + 128 * AP_BHLD * 2 + AP_BM * 4)

#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 890
__device__ __forceinline__ void ap_ldmatrix_x4_trans(u32 addr, u32& r0, u32& r1, u32& r2, u32& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
}

template <int MODE>
__device__ __forceinline__ void absorb_p1_body(const float* __restrict__ x, const u8* __restrict__ W,
                                               const float* __restrict__ S, float* out, int M, int H, int K, int N,
                                               int R, int ldx, int hs, int ldo, int vec) {
  extern __shared__ __align__(16) u8 ap_smem[];
  u16* As = (u16*)ap_smem;                           // [64][AP_ALD] fp16
  u8* Bs = ap_smem + AP_BM * AP_ALD * 2;             // v: [128 n][AP_BLD] e4m3; q: [128 k][AP_BHLD] fp16
  float* inv = (float*)(Bs + 128 * AP_BHLD * 2);     // [64] 2^-s of this K block's rows
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int wm = warp >> 2, wn = warp & 3, g = lane >> 2, t4 = lane & 3;
  const int h = blockIdx.y, n0 = blockIdx.x * 128, m0 = blockIdx.z * AP_BM;
  const int rows = min(AP_BM, M - m0);
  const int KBR = (R + 127) >> 7;  // scale columns per weight row
  const int Nout = MODE == 0 ? R : N;
  const int cb = n0 >> 7;

  float acc[2][4][4], part[2][4][4];
#pragma unroll
  for (int i = 0; i < 2; i++)
#pragma unroll
    for (int j = 0; j < 4; j++)
#pragma unroll
      for (int c = 0; c < 4; c++) acc[i][j][c] = 0.0f;

  const int a_row = lane & 15, a_col = (lane >> 4) * 8;
  // q mode ldmatrix.trans: lanes 8i..8i+7 address matrix i's rows: k +
  // 8 (i & 1), n + 8 (i >> 1).
  const int bt_k = (lane & 7) + ((lane >> 3) & 1) * 8, bt_n = (lane >> 4) * 8;
  for (int kb = 0; kb * 128 < K; kb++) {
    const int k0 = kb * 128;
    __syncthreads();  // the previous block's fragments and row scales are read
    // A: warp w rows 8w .. 8w+7, lane k0 + 4 lane .. + 3.
    {
      const int kq = k0 + 4 * lane;
      float sk[4] = {1.0f, 1.0f, 1.0f, 1.0f};
      if (MODE == 0) {
#pragma unroll
        for (int j = 0; j < 4; j++) sk[j] = kq + j < K ? S[(size_t)(h * K + kq + j) * KBR + cb] : 0.0f;
      }
      float v[8][4];
#pragma unroll
      for (int i = 0; i < 8; i++) {
        const int r = warp * 8 + i;
        const int m = m0 + r;
        const float* src = MODE == 0 ? x + (size_t)m * ldx + (size_t)h * hs : x + ((size_t)m * H + h) * K;
        if (vec && r < rows && kq < K) {
          const float4 f = __ldg((const float4*)(src + kq));
          v[i][0] = f.x;
          v[i][1] = f.y;
          v[i][2] = f.z;
          v[i][3] = f.w;
        } else {
#pragma unroll
          for (int j = 0; j < 4; j++) v[i][j] = r < rows && kq + j < K ? src[kq + j] : 0.0f;
        }
      }
      float mx[8];
#pragma unroll
      for (int i = 0; i < 8; i++) {
        mx[i] = 0.0f;
#pragma unroll
        for (int j = 0; j < 4; j++) {
          if (MODE == 0) v[i][j] *= sk[j];
          mx[i] = fmaxf(mx[i], fabsf(v[i][j]));
        }
      }
#pragma unroll
      for (int o = 16; o > 0; o >>= 1)
#pragma unroll
        for (int i = 0; i < 8; i++) mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], o));
#pragma unroll
      for (int i = 0; i < 8; i++) {
        const int r = warp * 8 + i;
        int e = 15;
        if (mx[i] > 0.0f && mx[i] <= 3.4e38f) {
          frexpf(mx[i], &e);  // mx = f 2^e, f in [0.5, 1)
          e = max(-100, min(100, e));
        }
        const float sc = ldexpf(1.0f, 15 - e);
        if (lane == 0) inv[r] = ldexpf(1.0f, e - 15);
        const u32 lo = (u32)gh_f16(v[i][0] * sc) | ((u32)gh_f16(v[i][1] * sc) << 16);
        const u32 hi = (u32)gh_f16(v[i][2] * sc) | ((u32)gh_f16(v[i][3] * sc) << 16);
        *(uint2*)&As[r * AP_ALD + 4 * lane] = make_uint2(lo, hi);
      }
    }
    if (MODE == 0) {
      // B as [k][n] fp16: chunk c = tid + 256 i is row k = c / 8, columns
      // 16 (c % 8) .. + 15.
#pragma unroll
      for (int i = 0; i < 4; i++) {
        const int c = tid + 256 * i, k = c >> 3, nn = (c & 7) * 16;
        uint4 w = make_uint4(0u, 0u, 0u, 0u);
        if (k0 + k < K) w = __ldg((const uint4*)(W + (size_t)(h * K + k0 + k) * R + n0 + nn));
        const u32 ws[4] = {w.x, w.y, w.z, w.w};
        u32 hv[8];
#pragma unroll
        for (int b = 0; b < 4; b++) {
          hv[2 * b] = gh_e4m3x2((u16)(ws[b] & 0xffffu));
          hv[2 * b + 1] = gh_e4m3x2((u16)(ws[b] >> 16));
        }
        uint4* dst = (uint4*)(Bs + (k * AP_BHLD + nn) * 2);
        dst[0] = make_uint4(hv[0], hv[1], hv[2], hv[3]);
        dst[1] = make_uint4(hv[4], hv[5], hv[6], hv[7]);
      }
    } else {
      // B as [n][k] bytes: weight row h*N + n.
      const int n = tid >> 1, kq = (tid & 1) * 64;
      uint4* dst = (uint4*)(Bs + n * AP_BLD + kq);
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
      if (MODE == 0) {
#pragma unroll
        for (int jp = 0; jp < 2; jp++)
          ap_ldmatrix_x4_trans(gh_smem_addr(Bs + ((kk + bt_k) * AP_BHLD + wn * 32 + jp * 16 + bt_n) * 2), b[2 * jp][0],
                               b[2 * jp][1], b[2 * jp + 1][0], b[2 * jp + 1][1]);
      } else {
#pragma unroll
        for (int j = 0; j < 4; j++) {
          const u8* br = Bs + (wn * 32 + j * 8 + g) * AP_BLD + kk + 2 * t4;
          b[j][0] = gh_e4m3x2(*(const u16*)br);
          b[j][1] = gh_e4m3x2(*(const u16*)(br + 8));
        }
      }
#pragma unroll
      for (int i = 0; i < 2; i++) {
        u32 a0, a1, a2, a3;
        gh_ldmatrix_x4(gh_smem_addr(As + (wm * 32 + i * 16 + a_row) * AP_ALD + kk + a_col), a0, a1, a2, a3);
#pragma unroll
        for (int j = 0; j < 4; j++) gh_mma(part[i][j], a0, a1, a2, a3, b[j][0], b[j][1]);
      }
    }
    // Promote: the row's 2^-s, and in v mode the column's weight scale.
#pragma unroll
    for (int i = 0; i < 2; i++) {
      const float ia = inv[wm * 32 + i * 16 + g], ib = inv[wm * 32 + i * 16 + g + 8];
#pragma unroll
      for (int j = 0; j < 4; j++) {
        float s0 = 1.0f, s1 = 1.0f;
        if (MODE != 0) {
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
  // Accumulator c[0..1]: row g, cols 2 t4 + {0, 1}; c[2..3]: row g + 8.
  const bool v2 = ((size_t)out & 7) == 0 && (MODE == 0 ? (R & 1) == 0 : ((ldo | N) & 1) == 0);
#pragma unroll
  for (int i = 0; i < 2; i++) {
#pragma unroll
    for (int hh = 0; hh < 2; hh++) {
      const int r = wm * 32 + i * 16 + g + hh * 8;
      if (r >= rows) continue;
      const int m = m0 + r;
      float* yr = MODE == 0 ? out + ((size_t)m * H + h) * R : out + (size_t)m * ldo + (size_t)h * N;
#pragma unroll
      for (int j = 0; j < 4; j++) {
        const int n = n0 + wn * 32 + j * 8 + 2 * t4;
        const float o0 = acc[i][j][2 * hh], o1 = acc[i][j][2 * hh + 1];
        if (v2 && n + 1 < Nout) {
          *(float2*)(yr + n) = make_float2(o0, o1);
        } else {
          if (n < Nout) yr[n] = o0;
          if (n + 1 < Nout) yr[n + 1] = o1;
        }
      }
    }
  }
}

extern "C" __global__ void __launch_bounds__(256, 2) absorb_p1(const float* __restrict__ x, const u8* __restrict__ W,
                                                               const float* __restrict__ S, float* out, int mode, int M,
                                                               int H, int K, int N, int R, int ldx, int hs, int ldo,
                                                               int vec) {
  PDL_WAIT();
  if (mode == 0) {
    absorb_p1_body<0>(x, W, S, out, M, H, K, N, R, ldx, hs, ldo, vec);
  } else {
    absorb_p1_body<1>(x, W, S, out, M, H, K, N, R, ldx, hs, ldo, vec);
  }
}
#else
extern "C" __global__ void __launch_bounds__(256, 2) absorb_p1(const float* __restrict__ x, const u8* __restrict__ W,
                                                               const float* __restrict__ S, float* out, int mode, int M,
                                                               int H, int K, int N, int R, int ldx, int hs, int ldo,
                                                               int vec) {
  PDL_WAIT();
  __trap();
}
#endif
