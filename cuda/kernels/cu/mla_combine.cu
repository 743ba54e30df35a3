// Merges the nsplit unnormalised partials of a split MLA decode (the layout
// of mla_combine in mla.cu: part_o [q*H+h][nsplit][512], part_ml [..][2] =
// (max, sum)) with every partial's load in flight at once: the weights
// exp(m_z - M) are computed in parallel into shared memory first, then each
// thread sums its float4 column over z, 8 loads ahead. mla_combine walks z
// one dependent load at a time (~0.7 us per split from L2).
// PRE > 0: the first PRE partials' columns are loaded before the weights
// are computed (their L2 round trip overlaps the max and sum reductions);
// the same sums in the same order, so the same bits as PRE = 0.
// One block (128 threads) per (query row, head), blockIdx.x = q*H + h;
// nsplit <= 256.
template <int PRE>
__device__ __forceinline__ void mla_combine_body(const float* __restrict__ part_o, const float* __restrict__ part_ml,
                                                 int nsplit, float* out, float* lse) {
  __shared__ float wz[256];
  __shared__ float sh[32];
  const size_t qh = blockIdx.x;
  const int tid = threadIdx.x;
  const float4* po = (const float4*)(part_o + qh * nsplit * MLA_LAT) + tid;
  float4 pre[PRE > 0 ? PRE : 1];
#pragma unroll
  for (int z = 0; z < PRE; z++)
    if (z < nsplit) pre[z] = po[(size_t)z * (MLA_LAT / 4)];
  const float* ml = part_ml + 2 * qh * nsplit;
  float mz = NEG_INF;
  for (int z = tid; z < nsplit; z += 128) mz = fmaxf(mz, ml[2 * z]);
  const float M = block_max(mz, sh);
  float lz = 0.0f;
  for (int z = tid; z < nsplit; z += 128) {
    const float m = ml[2 * z];
    const float w = m == NEG_INF ? 0.0f : expf(m - M);  // an empty range: weight 0 (its acc is 0)
    wz[z] = w;
    lz += ml[2 * z + 1] * w;
  }
  const float L = block_sum(lz, sh);  // also orders wz's writes before the reads below
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
    const float4 v = po[(size_t)z * (MLA_LAT / 4)];
    acc.x = fmaf(v.x, w, acc.x);
    acc.y = fmaf(v.y, w, acc.y);
    acc.z = fmaf(v.z, w, acc.z);
    acc.w = fmaf(v.w, w, acc.w);
  }
  const float inv = L > 0.0f ? 1.0f / L : 0.0f;
  *(float4*)(out + qh * MLA_LAT + tid * 4) = make_float4(acc.x * inv, acc.y * inv, acc.z * inv, acc.w * inv);
  if (lse && tid == 0) lse[qh] = L > 0.0f ? M + logf(L) : NEG_INF;
}

extern "C" __global__ void __launch_bounds__(128) mla_combine_wide(const float* __restrict__ part_o,
                                                                   const float* __restrict__ part_ml, int nsplit,
                                                                   float* out, float* lse) {
  PDL_WAIT();
  mla_combine_body<32>(part_o, part_ml, nsplit, out, lse);
}

// mla_combine_wide without the early loads: 64 registers, so more blocks
// per SM; the launcher picks it for grids of more than one such wave.
extern "C" __global__ void __launch_bounds__(128) mla_combine_wide_v1(const float* __restrict__ part_o,
                                                                      const float* __restrict__ part_ml, int nsplit,
                                                                      float* out, float* lse) {
  PDL_WAIT();
  mla_combine_body<0>(part_o, part_ml, nsplit, out, lse);
}
