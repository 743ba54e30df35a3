// indexer_scores with register tiling (same semantics; float32 sums in
// another order): per 64-key page a block dequantises the keys once into
// shared memory and each thread computes 2 keys x 4 heads of a 32-head chunk
// with float4 loads (the key rows shared by a warp's lanes, the query rows
// broadcast), instead of one shared-memory load per multiply-add. 256
// threads; dynamic shared memory IDXW_SMEM_FLOATS floats.

#define IDXW_KS 132  // floats per key row: 16-byte aligned, conflict-free float4 rows
#define IDXW_HC 32   // heads per chunk
#define IDXW_SMEM_FLOATS (IDX_PAGE * IDXW_KS + IDXW_HC * IDX_D + IDXW_HC + 8 * IDX_PAGE)

extern "C" __global__ void __launch_bounds__(256) indexer_scores_wide(const float* __restrict__ q,
                                                                      const float* __restrict__ w,
                                                                      const u8* __restrict__ cache,
                                                                      const int* __restrict__ block_table,
                                                                      const int* __restrict__ lens, float* out,
                                                                      int H, int T, int ld_out, float qk_scale) {
  PDL_WAIT();
  extern __shared__ float4 idxw_smem4[];
  float* kf = (float*)idxw_smem4;       // [64][KS]
  float* qs = kf + IDX_PAGE * IDXW_KS;  // [HC][128]
  float* ws = qs + IDXW_HC * IDX_D;     // [HC]
  float* part = ws + IDXW_HC;           // [8 warps][64]
  const int tile = blockIdx.x, qi = blockIdx.y, tid = threadIdx.x, lane = tid & 31, wid = tid >> 5;
  const int len = lens[qi];
  const int t0 = tile * IDX_PAGE;
  float* orow = out + (size_t)qi * ld_out;
  if (t0 >= len) {
    for (int j = tid; j < IDX_PAGE; j += blockDim.x)
      if (t0 + j < T) orow[t0 + j] = NEG_INF;
    return;
  }
  const int page = block_table ? block_table[tile] : tile;
  const u8* pg = cache + (size_t)page * IDX_PAGE_BYTES;
  const float* scl = (const float*)(pg + IDX_PAGE * IDX_D);
  // 64 x 128 fp8 keys: 512 uint4 loads, 2 per thread.
  for (int wi = tid; wi < IDX_PAGE * IDX_D / 16; wi += 256) {
    const int tok = wi >> 3, d0 = (wi & 7) * 16;
    const uint4 v = ((const uint4*)pg)[wi];
    const float s = scl[tok];
    const u32 ww[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int b = 0; b < 4; b++) {
      float f[4];
      fp8x4_to_f32(ww[b], f);
      *(float4*)(kf + tok * IDXW_KS + d0 + 4 * b) = make_float4(f[0] * s, f[1] * s, f[2] * s, f[3] * s);
    }
  }
  const float* qrow = q + (size_t)qi * H * IDX_D;
  float acc0 = 0.0f, acc1 = 0.0f;  // keys lane and lane+32, this warp's heads
  for (int h0 = 0; h0 < H; h0 += IDXW_HC) {
    __syncthreads();  // kf ready / previous chunk's qs consumed
    for (int i = tid; i < IDXW_HC * IDX_D; i += 256) {
      const int hh = h0 + i / IDX_D;
      qs[i] = hh < H ? qrow[(size_t)hh * IDX_D + (i % IDX_D)] : 0.0f;
    }
    if (tid < IDXW_HC) ws[tid] = (h0 + tid < H) ? w[(size_t)qi * H + h0 + tid] : 0.0f;
    __syncthreads();
    float d[4][2];
#pragma unroll
    for (int i = 0; i < 4; i++) d[i][0] = d[i][1] = 0.0f;
    const float* ka = kf + lane * IDXW_KS;
    const float* kb = kf + (lane + 32) * IDXW_KS;
    const float* qb = qs + wid * 4 * IDX_D;
#pragma unroll 4
    for (int k = 0; k < IDX_D; k += 4) {
      const float4 a = *(const float4*)(ka + k);
      const float4 b = *(const float4*)(kb + k);
#pragma unroll
      for (int i = 0; i < 4; i++) {
        const float4 qq = *(const float4*)(qb + i * IDX_D + k);
        d[i][0] = fmaf(qq.x, a.x, d[i][0]);
        d[i][0] = fmaf(qq.y, a.y, d[i][0]);
        d[i][0] = fmaf(qq.z, a.z, d[i][0]);
        d[i][0] = fmaf(qq.w, a.w, d[i][0]);
        d[i][1] = fmaf(qq.x, b.x, d[i][1]);
        d[i][1] = fmaf(qq.y, b.y, d[i][1]);
        d[i][1] = fmaf(qq.z, b.z, d[i][1]);
        d[i][1] = fmaf(qq.w, b.w, d[i][1]);
      }
    }
#pragma unroll
    for (int i = 0; i < 4; i++) {
      const float wh = ws[wid * 4 + i];
      acc0 += wh * fmaxf(d[i][0] * qk_scale, 0.0f);
      acc1 += wh * fmaxf(d[i][1] * qk_scale, 0.0f);
    }
  }
  part[wid * IDX_PAGE + lane] = acc0;
  part[wid * IDX_PAGE + lane + 32] = acc1;
  __syncthreads();
  if (tid < IDX_PAGE) {
    const int t = t0 + tid;
    float v = 0.0f;
#pragma unroll
    for (int k = 0; k < 8; k++) v += part[k * IDX_PAGE + tid];
    if (t < T) orow[t] = (t < len) ? v : NEG_INF;
  }
}
