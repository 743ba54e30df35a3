// Wide GEMV for fp8 and bf16 weights, the same math as gemv_fp8/gemv_bf16
// (y[m][n] = sum_k W[n][k]*S[n/128][k/128]*x[m][k] (+ resid), M <= GEMV_MAXM)
// laid out so that every shape keeps enough bytes in flight: a block of 256
// threads owns R output rows (R = 1, 2, 4, 8) and the 256/R threads of a row
// split K in 16-byte chunks (split-K inside the block), each issuing
// GEMV_WIDE_U chunk loads before it uses any. A row's partial sums meet in
// shared memory in a fixed warp order, so results are bit-for-bit
// reproducible. Small N (256, 576 rows) thus still fills every SM, and long K
// gets more loads in flight than one warp per row could issue. Needs whole
// 16-byte chunks in K, 16-byte aligned W and x, ldx % 4 == 0 (the launchers
// fall back to the warp-per-row kernels otherwise).

#define GEMV_WIDE_U 4

// Weights are read once per step: stream them past L1.
__device__ __forceinline__ uint4 ldg_stream16(const void* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

template <class T, int R>
__device__ __forceinline__ void gemv_wide_rows(const void* __restrict__ W, const float* __restrict__ S,
                                                   const float* __restrict__ x, float* y, const float* resid, int N,
                                                   int K, int M, int ldx, int ldy, int n0) {
  constexpr int TPR = 256 / R;  // threads per row
  constexpr int WPR = TPR / 32;  // warps per row
  __shared__ float part[8][GEMV_MAXM];
  const int t = threadIdx.x;
  const int r = t / TPR, tr = t % TPR;
  const int n = min(n0 + r, N - 1);  // rows past N repeat the last one; not written
  const char* wr = (const char*)W + (size_t)n * K * T::BYTES;
  const float* sr = S ? S + (size_t)(n >> 7) * ((K + 127) >> 7) : (const float*)0;
  const int C = K / T::E;  // 16-byte chunks of T::E weights; 128 weights share a block scale
  float acc[GEMV_MAXM];
#pragma unroll
  for (int m = 0; m < GEMV_MAXM; m++) acc[m] = 0.0f;
#ifdef TILERT_PDL_EARLY
  // PDL mode 2: the first round of weights (W, S: constants during a step)
  // before the wait; x, y and resid only after it. (The experts variant has
  // waited at its top already, before it read ids: this wait is then a
  // no-op.)
  uint4 pwv[GEMV_WIDE_U];
  float psc[GEMV_WIDE_U];
#pragma unroll
  for (int u = 0; u < GEMV_WIDE_U; u++) {
    const int c = tr + u * TPR;
    if (c < C) {
      pwv[u] = ldg_stream16(wr + (size_t)c * 16);
      psc[u] = S ? __ldg(sr + ((c * T::E) >> 7)) : 1.0f;
    } else {
      pwv[u] = make_uint4(0u, 0u, 0u, 0u);
      psc[u] = 0.0f;
    }
  }
  PDL_STREAM_WAIT();
#endif
#ifdef TILERT_PDL_EARLY
  // The round loaded before the wait: the loop's first trip, peeled so
  // those registers die here; its arithmetic block is the loop's, token for
  // token (TestPDLEarlyPrologue compares them).
  int c0s = tr;
  if (tr < C) {
    const int c0 = tr;
    const uint4 (&wv)[GEMV_WIDE_U] = pwv;
    const float (&sc)[GEMV_WIDE_U] = psc;
#pragma unroll
      for (int u = 0; u < GEMV_WIDE_U; u++) {
        const int c = c0 + u * TPR;
        if (c < C) {
          float wf[T::E];
          T::dec(wv[u], wf);
#pragma unroll
          for (int m = 0; m < GEMV_MAXM; m++) {
            if (m < M) {
              const float4* xp = (const float4*)(x + (size_t)m * ldx + (size_t)c * T::E);
              float p = 0.0f;
#pragma unroll
              for (int q = 0; q < T::E / 4; q++) {
                const float4 v = __ldg(xp + q);
                p += wf[4 * q] * v.x;
                p += wf[4 * q + 1] * v.y;
                p += wf[4 * q + 2] * v.z;
                p += wf[4 * q + 3] * v.w;
              }
              acc[m] += p * sc[u];
            }
          }
        }
      }
    c0s = tr + TPR * GEMV_WIDE_U;
  }
  for (int c0 = c0s; c0 < C; c0 += TPR * GEMV_WIDE_U) {
#else
  for (int c0 = tr; c0 < C; c0 += TPR * GEMV_WIDE_U) {
#endif
    uint4 wv[GEMV_WIDE_U];
    float sc[GEMV_WIDE_U];
#pragma unroll
    for (int u = 0; u < GEMV_WIDE_U; u++) {
      const int c = c0 + u * TPR;
      if (c < C) {
        wv[u] = ldg_stream16(wr + (size_t)c * 16);
        sc[u] = S ? __ldg(sr + ((c * T::E) >> 7)) : 1.0f;
      } else {
        wv[u] = make_uint4(0u, 0u, 0u, 0u);
        sc[u] = 0.0f;
      }
    }
#pragma unroll
    for (int u = 0; u < GEMV_WIDE_U; u++) {
      const int c = c0 + u * TPR;
      if (c < C) {
        float wf[T::E];
        T::dec(wv[u], wf);
#pragma unroll
        for (int m = 0; m < GEMV_MAXM; m++) {
          if (m < M) {
            const float4* xp = (const float4*)(x + (size_t)m * ldx + (size_t)c * T::E);
            float p = 0.0f;
#pragma unroll
            for (int q = 0; q < T::E / 4; q++) {
              const float4 v = __ldg(xp + q);
              p += wf[4 * q] * v.x;
              p += wf[4 * q + 1] * v.y;
              p += wf[4 * q + 2] * v.z;
              p += wf[4 * q + 3] * v.w;
            }
            acc[m] += p * sc[u];
          }
        }
      }
    }
  }
#ifdef TILERT_PDL_EARLY
  PDL_STREAM_TRIGGER();  // this block's last weight loads are issued
#endif
#pragma unroll
  for (int m = 0; m < GEMV_MAXM; m++) acc[m] = warp_sum(acc[m]);
  const int w = t >> 5;
  if ((t & 31) == 0) {
#pragma unroll
    for (int m = 0; m < GEMV_MAXM; m++) part[w][m] = acc[m];
  }
  __syncthreads();
  if (t < R * M) {
    const int rr = t / M, m = t - rr * M;
    float v = 0.0f;
#pragma unroll
    for (int i = 0; i < WPR; i++) v += part[rr * WPR + i][m];
    if (n0 + rr < N) {
      const size_t o = (size_t)m * ldy + n0 + rr;
      y[o] = v + (resid ? resid[o] : 0.0f);
    }
  }
}

// The launchable variants, written out (NVRTC 11.8 crashed on the same
// definitions generated by a macro).

extern "C" __global__ void __launch_bounds__(256, 4)
    gemv_fp8_wide_r1(const u8* __restrict__ W, const float* __restrict__ S, const float* __restrict__ x, float* y,
                      const float* resid, int N, int K, int M, int ldx, int ldy) {
  PDL_WAIT_STREAM();
  gemv_wide_rows<WFP8, 1>(W, S, x, y, resid, N, K, M, ldx, ldy, blockIdx.x * 1);
}

extern "C" __global__ void __launch_bounds__(256, 4)
    gemv_bf16_wide_r1(const u16* __restrict__ W, const float* __restrict__ S, const float* __restrict__ x, float* y,
                       const float* resid, int N, int K, int M, int ldx, int ldy) {
  PDL_WAIT_STREAM();
  gemv_wide_rows<WBF16, 1>(W, (const float*)0, x, y, resid, N, K, M, ldx, ldy, blockIdx.x * 1);
}

extern "C" __global__ void __launch_bounds__(256, 4)
    gemv_fp8_experts_wide_r1(const u8* const* __restrict__ Wt, const float* const* __restrict__ St,
                              const int* __restrict__ ids, const float* __restrict__ x, int xstride, float* y, int N,
                              int K) {
  PDL_WAIT();
  const int j = blockIdx.y;
  const int e = ids[j];
  gemv_wide_rows<WFP8, 1>(Wt[e], St[e], x + (size_t)j * xstride, y + (size_t)j * N, (const float*)0, N, K, 1, K, N,
                           blockIdx.x * 1);
}

extern "C" __global__ void __launch_bounds__(256, 4)
    gemv_fp8_wide_r2(const u8* __restrict__ W, const float* __restrict__ S, const float* __restrict__ x, float* y,
                      const float* resid, int N, int K, int M, int ldx, int ldy) {
  PDL_WAIT_STREAM();
  gemv_wide_rows<WFP8, 2>(W, S, x, y, resid, N, K, M, ldx, ldy, blockIdx.x * 2);
}

extern "C" __global__ void __launch_bounds__(256, 4)
    gemv_bf16_wide_r2(const u16* __restrict__ W, const float* __restrict__ S, const float* __restrict__ x, float* y,
                       const float* resid, int N, int K, int M, int ldx, int ldy) {
  PDL_WAIT_STREAM();
  gemv_wide_rows<WBF16, 2>(W, (const float*)0, x, y, resid, N, K, M, ldx, ldy, blockIdx.x * 2);
}

extern "C" __global__ void __launch_bounds__(256, 4)
    gemv_fp8_experts_wide_r2(const u8* const* __restrict__ Wt, const float* const* __restrict__ St,
                              const int* __restrict__ ids, const float* __restrict__ x, int xstride, float* y, int N,
                              int K) {
  PDL_WAIT();
  const int j = blockIdx.y;
  const int e = ids[j];
  gemv_wide_rows<WFP8, 2>(Wt[e], St[e], x + (size_t)j * xstride, y + (size_t)j * N, (const float*)0, N, K, 1, K, N,
                           blockIdx.x * 2);
}

extern "C" __global__ void __launch_bounds__(256, 4)
    gemv_fp8_wide_r4(const u8* __restrict__ W, const float* __restrict__ S, const float* __restrict__ x, float* y,
                      const float* resid, int N, int K, int M, int ldx, int ldy) {
  PDL_WAIT_STREAM();
  gemv_wide_rows<WFP8, 4>(W, S, x, y, resid, N, K, M, ldx, ldy, blockIdx.x * 4);
}

extern "C" __global__ void __launch_bounds__(256, 4)
    gemv_bf16_wide_r4(const u16* __restrict__ W, const float* __restrict__ S, const float* __restrict__ x, float* y,
                       const float* resid, int N, int K, int M, int ldx, int ldy) {
  PDL_WAIT_STREAM();
  gemv_wide_rows<WBF16, 4>(W, (const float*)0, x, y, resid, N, K, M, ldx, ldy, blockIdx.x * 4);
}

extern "C" __global__ void __launch_bounds__(256, 4)
    gemv_fp8_experts_wide_r4(const u8* const* __restrict__ Wt, const float* const* __restrict__ St,
                              const int* __restrict__ ids, const float* __restrict__ x, int xstride, float* y, int N,
                              int K) {
  PDL_WAIT();
  const int j = blockIdx.y;
  const int e = ids[j];
  gemv_wide_rows<WFP8, 4>(Wt[e], St[e], x + (size_t)j * xstride, y + (size_t)j * N, (const float*)0, N, K, 1, K, N,
                           blockIdx.x * 4);
}

extern "C" __global__ void __launch_bounds__(256, 4)
    gemv_fp8_wide_r8(const u8* __restrict__ W, const float* __restrict__ S, const float* __restrict__ x, float* y,
                      const float* resid, int N, int K, int M, int ldx, int ldy) {
  PDL_WAIT_STREAM();
  gemv_wide_rows<WFP8, 8>(W, S, x, y, resid, N, K, M, ldx, ldy, blockIdx.x * 8);
}

extern "C" __global__ void __launch_bounds__(256, 4)
    gemv_bf16_wide_r8(const u16* __restrict__ W, const float* __restrict__ S, const float* __restrict__ x, float* y,
                       const float* resid, int N, int K, int M, int ldx, int ldy) {
  PDL_WAIT_STREAM();
  gemv_wide_rows<WBF16, 8>(W, (const float*)0, x, y, resid, N, K, M, ldx, ldy, blockIdx.x * 8);
}

extern "C" __global__ void __launch_bounds__(256, 4)
    gemv_fp8_experts_wide_r8(const u8* const* __restrict__ Wt, const float* const* __restrict__ St,
                              const int* __restrict__ ids, const float* __restrict__ x, int xstride, float* y, int N,
                              int K) {
  PDL_WAIT();
  const int j = blockIdx.y;
  const int e = ids[j];
  gemv_wide_rows<WFP8, 8>(Wt[e], St[e], x + (size_t)j * xstride, y + (size_t)j * N, (const float*)0, N, K, 1, K, N,
                           blockIdx.x * 8);
}
