// The fp16 helpers of the tensor-core kernels that take x in fp16 parts
// (gemm_h2_absorb.cu's absorb_tc, gemm_p1.cu, gemm_p1_absorb.cu): float <->
// fp16, a row's power-of-two scale, and (sm_89+) the shared-address, e4m3
// pair conversion, mma and ldmatrix wrappers. The fp16-part FP8 GEMMs this
// file held (gemm_split_h2, gemm_fp8_h2_*, gemm_fp8_experts_h2_*; opt-in
// TILERT_GPU_GEMM_H2=1) were removed in session 55: no faster than
// gemm_tc.cu's three bf16 parts on the H200 and past the tiny models' cache
// bound with two parts (cuda/kernels/NOTES.md "gemm_h2 removed (session 55)").

__device__ __forceinline__ u16 gh_f16(float f) {
  u16 h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return h;
}
__device__ __forceinline__ float gh_f32(u16 h) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
}

// row_exp2 (256 threads, all calling): the e with |x| max of the K values
// of xr = f 2^e, f in [0.5, 1), clamped to [-100, 100]; 15 (scale 1) for a
// zero, inf or NaN row, so NaN and inf carry through. red: 8 floats of
// shared memory. gemm_split_p1 scales the row by 2^(15-e), bringing its largest |x| into [2^14, 2^15).
__device__ __forceinline__ int row_exp2(const float* __restrict__ xr, int K, float* red) {
  const int tid = threadIdx.x;
  float mx = 0.0f;
  for (int k = tid; k < K; k += 256) mx = fmaxf(mx, fabsf(xr[k]));
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  if ((tid & 31) == 0) red[tid >> 5] = mx;
  __syncthreads();
  mx = red[0];
#pragma unroll
  for (int i = 1; i < 8; i++) mx = fmaxf(mx, red[i]);
  int e = 0;
  if (mx > 0.0f && mx <= 3.4e38f) {
    frexpf(mx, &e);  // mx = f 2^e, f in [0.5, 1)
    e = max(-100, min(100, e));
  } else {
    e = 15;
  }
  return e;
}

#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 890
__device__ __forceinline__ u32 gh_smem_addr(const void* p) { return (u32)__cvta_generic_to_shared(p); }

__device__ __forceinline__ u32 gh_e4m3x2(u16 v) {
  u32 r;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(r) : "h"(v));
  return r;
}

__device__ __forceinline__ void gh_mma(float* c, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void gh_ldmatrix_x4(u32 addr, u32& r0, u32& r1, u32& r2, u32& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
}
#endif
