// Writes of new tokens into the vLLM-layout caches. slots[i] is the cache
// slot (page*64 + offset) of row i; a negative slot is skipped (padding).
// Scales: ue8m0 != 0: smallest power of two >= amax/448; else amax/448
// (amax 0 gives scale 1). Values are stored as fp8(x / scale), RNE, saturated.

__device__ __forceinline__ float quant_scale(float amax, int ue8m0) {
  if (ue8m0) return ue8m0_scale(amax);
  return amax > 0.0f ? amax / FP8_MAX : 1.0f;
}

// fp8_ds_mla: 656 bytes per token (512 fp8, 4 float32 scales, 64 bf16 rope).
// One block of 128 threads per row; a warp covers one 128-value group.
extern "C" __global__ void __launch_bounds__(128) mla_cache_write(const float* __restrict__ lat,
                                                                  const float* __restrict__ rope, u8* cache,
                                                                  const int* __restrict__ slots, int ue8m0) {
  PDL_WAIT();
  const int slot = slots[blockIdx.x];
  if (slot < 0) return;
  const int tid = threadIdx.x;
  u8* row = cache + (size_t)slot * 656;
  const float4 v = ((const float4*)(lat + (size_t)blockIdx.x * 512))[tid];
  const float amax = warp_max(fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w))));
  const float s = quant_scale(amax, ue8m0);
  const u32 q = (u32)f32_to_fp8(v.x / s) | ((u32)f32_to_fp8(v.y / s) << 8) | ((u32)f32_to_fp8(v.z / s) << 16) |
                ((u32)f32_to_fp8(v.w / s) << 24);
  ((u32*)row)[tid] = q;
  if ((tid & 31) == 0) ((float*)(row + 512))[tid >> 5] = s;
  if (tid < 64) ((u16*)(row + 528))[tid] = f32_to_bf16(rope[(size_t)blockIdx.x * 64 + tid]);
}

// Indexer keys: per 64-token page 64x128 fp8 then 64 float32 scales.
// One warp per row.
extern "C" __global__ void __launch_bounds__(32) indexer_cache_write(const float* __restrict__ k, u8* cache,
                                                                     const int* __restrict__ slots, int ue8m0) {
  PDL_WAIT();
  const int slot = slots[blockIdx.x];
  if (slot < 0) return;
  const int lane = threadIdx.x;
  u8* page = cache + (size_t)(slot >> 6) * (64 * 128 + 64 * 4);
  const int off = slot & 63;
  const float4 v = ((const float4*)(k + (size_t)blockIdx.x * 128))[lane];
  const float amax = warp_max(fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w))));
  const float s = quant_scale(amax, ue8m0);
  const u32 q = (u32)f32_to_fp8(v.x / s) | ((u32)f32_to_fp8(v.y / s) << 8) | ((u32)f32_to_fp8(v.z / s) << 16) |
                ((u32)f32_to_fp8(v.w / s) << 24);
  ((u32*)(page + off * 128))[lane] = q;
  if (lane == 0) ((float*)(page + 64 * 128))[off] = s;
}
