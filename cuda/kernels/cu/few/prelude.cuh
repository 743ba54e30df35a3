// The few-heads module's prelude (kernels_few.go FewKernelSource: common.cuh,
// this file, the default module's indexer_mma.cu as it is, then cu/few/*.cu):
// what indexer_mma.cu takes from the default module's other files, so that
// topk_fused.cu runs its scores body (idx_scores_body) unchanged.

// indexer.cu's page layout.
#define IDX_D 128
#define IDX_PAGE 64
#define IDX_PAGE_BYTES (IDX_PAGE * IDX_D + IDX_PAGE * 4)

// engine.cu's (idx_q_prep_body uses it; the same text).
__device__ __forceinline__ float ue8m0_ceil_f32(float s) {
  const u32 u = __float_as_uint(s);
  if ((u & 0x007fffffu) == 0u) return s;
  return __uint_as_float((u & 0x7f800000u) + 0x00800000u);
}
