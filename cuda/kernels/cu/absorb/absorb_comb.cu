// absorb_v_comb (session 20, issue 10): one row's split sparse-MLA merge
// and its W_UV product in one launch, for the decode step's one-row
// attention tail (mla_decode_wg2b / tcf2 partials -> mla_combine_wide ->
// absorb_v_fast: two launches and an 8 MB partial round trip through a
// kernel boundary). Bit for bit those two launches:
//   - the merge of head h is mla_combine_body<PRE>'s for block qh = h run
//     by threads 0..127 (the same loop partition over the splits, the
//     same weights exp(m_z - M), the same fmaf order over z, the same
//     block_max / block_sum: threads 128..255 add only NEG_INF / +0 to
//     them, which change no bit), so x[h] has mla_combine_wide's bits;
//   - the products are absorb_v_fast's: one warp a v row, lane l the 16
//     latent columns 16l.., the same fp8 conversion, fmaf order and
//     warp_sum (a row's sum does not depend on how many rows a warp takes,
//     so RW is free).
// One block per (head, 8 RW v rows): every v row of a DeepSeek-V3.2 head
// (vd 128) in one block, so each head's partials are read once.
// grid (H * ceil(vd / (8 RW))), 256 threads; nsplit 2..256, R = 512.
#define AVC_LAT 512  // mla.cu's MLA_LAT (not in this module)
template <int RW, int PRE>
__device__ __forceinline__ void absorb_v_comb_body(float* out, float* xout, const float* __restrict__ part_o,
                                                   const float* __restrict__ part_ml, int nsplit,
                                                   const u8* __restrict__ W, const float* __restrict__ S, int H, int vd) {
  __shared__ float4 xs[128];  // x[h], 512 floats
  __shared__ float wz[256];
  __shared__ float sh[32];
  const int R = 512, rb = 4;
  const int nvb = (vd + 8 * RW - 1) / (8 * RW);
  const int h = blockIdx.x / nvb, v0 = (blockIdx.x % nvb) * 8 * RW + (threadIdx.x >> 5) * RW;
  const int tid = threadIdx.x, lane = tid & 31;
  const bool cm = tid < 128;  // mla_combine_wide's threads
  // This warp's weights first: they do not depend on the merge.
  uint4 wv[RW];
  float sc[RW];
#pragma unroll
  for (int j = 0; j < RW; j++) {
    wv[j] = make_uint4(0u, 0u, 0u, 0u);
    sc[j] = 0.0f;
    if (v0 + j < vd) {
      const size_t row = (size_t)h * vd + v0 + j;
      wv[j] = *(const uint4*)(W + row * R + lane * 16);
      sc[j] = S[row * rb + (lane >> 3)];
    }
  }
  // mla_combine_body<PRE> for qh = h.
  const float4* po = (const float4*)(part_o + (size_t)h * nsplit * AVC_LAT) + (cm ? tid : 0);
  float4 pre[PRE];
#pragma unroll
  for (int z = 0; z < PRE; z++)
    if (cm && z < nsplit) pre[z] = po[(size_t)z * (AVC_LAT / 4)];
  const float* ml = part_ml + 2 * (size_t)h * nsplit;
  float mz = NEG_INF;
  if (cm)
    for (int z = tid; z < nsplit; z += 128) mz = fmaxf(mz, ml[2 * z]);
  const float M = block_max(mz, sh);
  float lz = 0.0f;
  if (cm)
    for (int z = tid; z < nsplit; z += 128) {
      const float m = ml[2 * z];
      const float w = m == NEG_INF ? 0.0f : expf(m - M);
      wz[z] = w;
      lz += ml[2 * z + 1] * w;
    }
  const float L = block_sum(lz, sh);  // also orders wz's writes before the reads below
  if (cm) {
    float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
    for (int z = 0; z < PRE; z++) {
      if (z < nsplit) {
        const float w = wz[z];
        acc.x = fmaf(pre[z].x, w, acc.x);
        acc.y = fmaf(pre[z].y, w, acc.y);
        acc.z = fmaf(pre[z].z, w, acc.z);
        acc.w = fmaf(pre[z].w, w, acc.w);
      }
    }
#pragma unroll 8
    for (int z = PRE; z < nsplit; z++) {
      const float w = wz[z];
      const float4 v = po[(size_t)z * (AVC_LAT / 4)];
      acc.x = fmaf(v.x, w, acc.x);
      acc.y = fmaf(v.y, w, acc.y);
      acc.z = fmaf(v.z, w, acc.z);
      acc.w = fmaf(v.w, w, acc.w);
    }
    const float inv = L > 0.0f ? 1.0f / L : 0.0f;
    const float4 x4 = make_float4(acc.x * inv, acc.y * inv, acc.z * inv, acc.w * inv);
    xs[tid] = x4;
    if (xout && blockIdx.x % nvb == 0) *(float4*)(xout + (size_t)h * AVC_LAT + tid * 4) = x4;
  }
  __syncthreads();
  // absorb_v_fast_body's products.
  float xv[16];
  ABSORB_X16(xv, xs[lane * 4 + b])
#pragma unroll
  for (int j = 0; j < RW; j++) {
    ABSORB_DOT16(acc, wv[j], xv)
    const float a = warp_sum(acc * sc[j]);
    if (lane == 0 && v0 + j < vd) out[(size_t)h * vd + v0 + j] = a;
  }
}

extern "C" __global__ void __launch_bounds__(256, 1)
    absorb_v_comb_rw16(float* out, float* xout, const float* __restrict__ part_o, const float* __restrict__ part_ml,
                       int nsplit, const u8* __restrict__ W, const float* __restrict__ S, int H, int vd) {
  PDL_WAIT();
  absorb_v_comb_body<16, 16>(out, xout, part_o, part_ml, nsplit, W, S, H, vd);
}
