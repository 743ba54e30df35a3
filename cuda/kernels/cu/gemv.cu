// GEMV / small-M GEMM: y[m][n] = sum_k W[n][k] * x[m][k] (+ resid[m][n]),
// M <= 4 input rows sharing every weight load. W is row-major [N][K] (the
// out x in layout of a checkpoint's Linear weight). One warp per output row;
// each lane streams 16 bytes of the row at a time.
//
// FP8 weights carry float32 block scales S[ceil(N/128)][ceil(K/128)]:
// W[n][k] = w[n][k] * S[n/128][k/128]; a partial block shares its scale.

#define GEMV_MAXM 4

struct WFP8 {
  enum { E = 16, BYTES = 1 };
  static __device__ __forceinline__ void dec(uint4 v, float* o) {
    fp8x4_to_f32(v.x, o);
    fp8x4_to_f32(v.y, o + 4);
    fp8x4_to_f32(v.z, o + 8);
    fp8x4_to_f32(v.w, o + 12);
  }
  static __device__ __forceinline__ float one(const void* w, size_t k) {
    return fp8_to_f32(((const u8*)w)[k]);
  }
};

struct WBF16 {
  enum { E = 8, BYTES = 2 };
  static __device__ __forceinline__ void dec(uint4 v, float* o) {
    u32 ws[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int j = 0; j < 8; j++) o[j] = bf16_to_f32(ws[j >> 1] >> ((j & 1) * 16));
  }
  static __device__ __forceinline__ float one(const void* w, size_t k) {
    return bf16_to_f32(((const u16*)w)[k]);
  }
};

struct WF32 {
  enum { E = 4, BYTES = 4 };
  static __device__ __forceinline__ void dec(uint4 v, float* o) {
    o[0] = __uint_as_float(v.x);
    o[1] = __uint_as_float(v.y);
    o[2] = __uint_as_float(v.z);
    o[3] = __uint_as_float(v.w);
  }
  static __device__ __forceinline__ float one(const void* w, size_t k) {
    return ((const float*)w)[k];
  }
};

// Output rows n0 .. n0+R-1 (those < N) for M input rows; the warp's lanes
// split K. R rows per warp reuse each x load R times and keep R independent
// 16-byte weight loads in flight. S may be null (no block scales). y and
// resid may alias (in-place residual add).
template <class T, int R>
__device__ __forceinline__ void gemv_rows(const void* __restrict__ W, const float* __restrict__ S,
                                          const float* __restrict__ x, float* y, const float* resid, int N, int K,
                                          int M, int ldx, int ldy, int n0) {
  const int lane = threadIdx.x & 31;
  const int kb = (K + 127) >> 7;
  const char* wr[R];
  const float* sr[R];
#pragma unroll
  for (int r = 0; r < R; r++) {
    const int n = min(n0 + r, N - 1);  // rows past N repeat the last one; not written
    wr[r] = (const char*)W + (size_t)n * K * T::BYTES;
    sr[r] = S ? S + (size_t)(n >> 7) * kb : (const float*)0;
  }
  float acc[R][GEMV_MAXM];
#pragma unroll
  for (int r = 0; r < R; r++)
#pragma unroll
    for (int m = 0; m < GEMV_MAXM; m++) acc[r][m] = 0.0f;
  const bool vec = (K % T::E) == 0 && (ldx & 3) == 0 && (((size_t)W) & 15) == 0 && (((size_t)x) & 15) == 0;
  if (vec) {
    for (int k0 = lane * T::E; k0 < K; k0 += 32 * T::E) {
      uint4 wv[R];
#pragma unroll
      for (int r = 0; r < R; r++) wv[r] = W_LD16(wr[r] + (size_t)k0 * T::BYTES);
      float sc[R];
#pragma unroll
      for (int r = 0; r < R; r++) sc[r] = S ? __ldg(sr[r] + (k0 >> 7)) : 1.0f;
      float wf[R][T::E];
#pragma unroll
      for (int r = 0; r < R; r++) T::dec(wv[r], wf[r]);
#pragma unroll
      for (int m = 0; m < GEMV_MAXM; m++) {
        if (m < M) {
          const float4* xp = (const float4*)(x + (size_t)m * ldx + k0);
          float xv[T::E];
#pragma unroll
          for (int q = 0; q < T::E / 4; q++) {
            float4 v = __ldg(xp + q);
            xv[4 * q] = v.x;
            xv[4 * q + 1] = v.y;
            xv[4 * q + 2] = v.z;
            xv[4 * q + 3] = v.w;
          }
#pragma unroll
          for (int r = 0; r < R; r++) {
            float p = 0.0f;
#pragma unroll
            for (int e = 0; e < T::E; e++) p += wf[r][e] * xv[e];
            acc[r][m] += p * sc[r];
          }
        }
      }
    }
  } else {
    for (int k = lane; k < K; k += 32) {
#pragma unroll
      for (int r = 0; r < R; r++) {
        float wv = T::one(wr[r], k);
        if (S) wv *= __ldg(sr[r] + (k >> 7));
#pragma unroll
        for (int m = 0; m < GEMV_MAXM; m++)
          if (m < M) acc[r][m] += wv * x[(size_t)m * ldx + k];
      }
    }
  }
#pragma unroll
  for (int r = 0; r < R; r++)
#pragma unroll
    for (int m = 0; m < GEMV_MAXM; m++)
      if (m < M) acc[r][m] = warp_sum(acc[r][m]);
  if (lane == 0) {
#pragma unroll
    for (int r = 0; r < R; r++) {
      if (n0 + r < N) {
#pragma unroll
        for (int m = 0; m < GEMV_MAXM; m++) {  // constant indices keep acc in registers
          if (m < M) {
            const size_t o = (size_t)m * ldy + n0 + r;
            y[o] = acc[r][m] + (resid ? resid[o] : 0.0f);
          }
        }
      }
    }
  }
}

// One kernel per weight type and rows-per-warp R (the launcher picks R so
// small N still spreads over every SM).
#define GEMV_KERNELS(NAME, T, WT, R)                                                                          \
  extern "C" __global__ void __launch_bounds__(256)                                                          \
      NAME(const WT* __restrict__ W, const float* __restrict__ S, const float* __restrict__ x, float* y,     \
           const float* resid, int N, int K, int M, int ldx, int ldy) {                                     \
    PDL_WAIT();                                                                                             \
    const int n0 = (blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5)) * R;                                \
    if (n0 >= N) return;                                                                                     \
    gemv_rows<T, R>(W, S, x, y, resid, N, K, M, ldx, ldy, n0);                                               \
  }

GEMV_KERNELS(gemv_fp8_r1, WFP8, u8, 1)
GEMV_KERNELS(gemv_fp8_r2, WFP8, u8, 2)
GEMV_KERNELS(gemv_fp8_r4, WFP8, u8, 4)
GEMV_KERNELS(gemv_bf16_r1, WBF16, u16, 1)
GEMV_KERNELS(gemv_bf16_r2, WBF16, u16, 2)
GEMV_KERNELS(gemv_bf16_r4, WBF16, u16, 4)
GEMV_KERNELS(gemv_f32_r1, WF32, float, 1)
GEMV_KERNELS(gemv_f32_r4, WF32, float, 4)

// Routed experts without a host round trip: blockIdx.y is the slot j of the
// top-k; its expert e = ids[j] picks W = Wt[e], S = St[e] from device tables
// of pointers. Input x + j*xstride (xstride 0: every slot reads the same x),
// output y + j*N. This keeps a whole MoE layer capturable in a CUDA graph.
template <int R>
__device__ __forceinline__ void gemv_experts(const u8* const* __restrict__ Wt, const float* const* __restrict__ St,
                                             const int* __restrict__ ids, const float* __restrict__ x, int xstride,
                                             float* y, int N, int K) {
  const int n0 = (blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5)) * R;
  if (n0 >= N) return;
  const int j = blockIdx.y;
  const int e = ids[j];
  gemv_rows<WFP8, R>(Wt[e], St[e], x + (size_t)j * xstride, y + (size_t)j * N, (const float*)0, N, K, 1, K, N, n0);
}

extern "C" __global__ void __launch_bounds__(256) gemv_fp8_experts_r1(const u8* const* __restrict__ Wt,
                                                                      const float* const* __restrict__ St,
                                                                      const int* __restrict__ ids,
                                                                      const float* __restrict__ x, int xstride,
                                                                      float* y, int N, int K) {
  PDL_WAIT();
  gemv_experts<1>(Wt, St, ids, x, xstride, y, N, K);
}

extern "C" __global__ void __launch_bounds__(256) gemv_fp8_experts_r4(const u8* const* __restrict__ Wt,
                                                                      const float* const* __restrict__ St,
                                                                      const int* __restrict__ ids,
                                                                      const float* __restrict__ x, int xstride,
                                                                      float* y, int N, int K) {
  PDL_WAIT();
  gemv_experts<4>(Wt, St, ids, x, xstride, y, N, K);
}
