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
    u32 ws[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int j = 0; j < 16; j++) o[j] = fp8_to_f32((ws[j >> 2] >> ((j & 3) * 8)) & 0xffu);
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

// One output row n for M input rows; the warp's lanes split K. S may be null
// (no block scales). y and resid may alias (in-place residual add).
template <class T>
__device__ __forceinline__ void gemv_row(const void* __restrict__ W, const float* __restrict__ S,
                                         const float* __restrict__ x, float* y, const float* resid,
                                         int N, int K, int M, int ldx, int ldy, int n) {
  const int lane = threadIdx.x & 31;
  const char* wrow = (const char*)W + (size_t)n * K * T::BYTES;
  const float* srow = S ? S + (size_t)(n >> 7) * ((K + 127) >> 7) : (const float*)0;
  float acc[GEMV_MAXM];
#pragma unroll
  for (int m = 0; m < GEMV_MAXM; m++) acc[m] = 0.0f;
  const bool vec = (K % T::E) == 0 && (ldx & 3) == 0 && (((size_t)W) & 15) == 0 && (((size_t)x) & 15) == 0;
  if (vec) {
    for (int k0 = lane * T::E; k0 < K; k0 += 32 * T::E) {
      uint4 wv = __ldg((const uint4*)(wrow + (size_t)k0 * T::BYTES));
      const float sc = srow ? __ldg(srow + (k0 >> 7)) : 1.0f;
      float wf[T::E];
      T::dec(wv, wf);
#pragma unroll
      for (int m = 0; m < GEMV_MAXM; m++) {
        if (m < M) {
          const float4* xp = (const float4*)(x + (size_t)m * ldx + k0);
          float p = 0.0f;
#pragma unroll
          for (int q = 0; q < T::E / 4; q++) {
            float4 xv = __ldg(xp + q);
            p += wf[4 * q] * xv.x + wf[4 * q + 1] * xv.y + wf[4 * q + 2] * xv.z + wf[4 * q + 3] * xv.w;
          }
          acc[m] += p * sc;
        }
      }
    }
  } else {
    for (int k = lane; k < K; k += 32) {
      float wv = T::one(wrow, k);
      if (srow) wv *= __ldg(srow + (k >> 7));
#pragma unroll
      for (int m = 0; m < GEMV_MAXM; m++)
        if (m < M) acc[m] += wv * x[(size_t)m * ldx + k];
    }
  }
#pragma unroll
  for (int m = 0; m < GEMV_MAXM; m++) acc[m] = warp_sum(acc[m]);
  if (lane == 0) {
    for (int m = 0; m < M; m++) {
      const size_t o = (size_t)m * ldy + n;
      y[o] = acc[m] + (resid ? resid[o] : 0.0f);
    }
  }
}

extern "C" __global__ void __launch_bounds__(256) gemv_fp8(const u8* __restrict__ W, const float* __restrict__ S,
                                                           const float* __restrict__ x, float* y,
                                                           const float* resid, int N, int K, int M, int ldx,
                                                           int ldy) {
  const int n = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (n >= N) return;
  gemv_row<WFP8>(W, S, x, y, resid, N, K, M, ldx, ldy, n);
}

extern "C" __global__ void __launch_bounds__(256) gemv_bf16(const u16* __restrict__ W, const float* __restrict__ x,
                                                            float* y, const float* resid, int N, int K, int M,
                                                            int ldx, int ldy) {
  const int n = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (n >= N) return;
  gemv_row<WBF16>(W, (const float*)0, x, y, resid, N, K, M, ldx, ldy, n);
}

extern "C" __global__ void __launch_bounds__(256) gemv_f32(const float* __restrict__ W, const float* __restrict__ x,
                                                           float* y, const float* resid, int N, int K, int M,
                                                           int ldx, int ldy) {
  const int n = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (n >= N) return;
  gemv_row<WF32>(W, (const float*)0, x, y, resid, N, K, M, ldx, ldy, n);
}

// Routed experts without a host round trip: blockIdx.y is the slot j of the
// top-k; its expert e = ids[j] picks W = Wt[e], S = St[e] from device tables
// of pointers. Input x + j*xstride (xstride 0: every slot reads the same x),
// output y + j*N. This keeps a whole MoE layer capturable in a CUDA graph.
extern "C" __global__ void __launch_bounds__(256) gemv_fp8_experts(const u8* const* __restrict__ Wt,
                                                                   const float* const* __restrict__ St,
                                                                   const int* __restrict__ ids,
                                                                   const float* __restrict__ x, int xstride,
                                                                   float* y, int N, int K) {
  const int n = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (n >= N) return;
  const int j = blockIdx.y;
  const int e = ids[j];
  gemv_row<WFP8>(Wt[e], St[e], x + (size_t)j * xstride, y + (size_t)j * N, (const float*)0, N, K, 1, K, N, n);
}
