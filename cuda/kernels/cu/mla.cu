// Absorbed MLA decode attention over vLLM's fp8_ds_mla cache. Per token 656
// bytes: 512 fp8 e4m3 latent values, 4 float32 scales (one per 128 values),
// 64 bf16 RoPE values; 64 tokens per page, token-interleaved, so token t of
// the sequence sits at page*64*656 + (t%64)*656 with page = block_table[t/64]
// (null: t/64).
//
// For query row q and head h (qn: [nq][H][512] = q_nope absorbed through
// W_UK; qp: [nq][H][64] after RoPE):
//   s_t = scale * (qn . c_t + qp . r_t),  out = sum_t softmax(s)_t * c_t
// over the token set: indices[q][0..nidx) (entries < 0 or >= lens[q] are
// skipped), or all t < lens[q] when indices is null. lse (optional) gets the
// log-sum-exp of the scores, -inf when no token is valid (out is then 0).
//
// Split over tokens (flash-decoding): blockIdx.z takes token positions
// [z*tps, (z+1)*tps); with gridDim.z > 1 each block writes its unnormalised
// partial (acc, m, l) to part_o / part_ml and mla_combine merges them.

#define MLA_LAT 512
#define MLA_ROPE 64
#define MLA_TOK_BYTES 656
#define MLA_TILE 32

__device__ __forceinline__ const u8* mla_token(const u8* cache, const int* block_table, int t) {
  const int page = block_table ? block_table[t >> 6] : (t >> 6);
  return cache + ((size_t)page * 64 + (t & 63)) * MLA_TOK_BYTES;
}

extern "C" __global__ void __launch_bounds__(128) mla_decode(const float* __restrict__ qn,
                                                             const float* __restrict__ qp,
                                                             const u8* __restrict__ cache,
                                                             const int* __restrict__ block_table,
                                                             const int* __restrict__ indices, int ld_idx, int nidx,
                                                             const int* __restrict__ lens, float* out, float* lse,
                                                             int H, float scale, int tps, float* part_o,
                                                             float* part_ml) {
  PDL_WAIT();
  __shared__ float qs[MLA_LAT];
  __shared__ float qps[MLA_ROPE];
  __shared__ float sc[MLA_TILE];
  __shared__ int tok[MLA_TILE];
  const int h = blockIdx.x, qi = blockIdx.y, tid = threadIdx.x, lane = tid & 31, wid = tid >> 5;
  const size_t qh = (size_t)qi * H + h;
  for (int i = tid; i < MLA_LAT; i += blockDim.x) qs[i] = qn[qh * MLA_LAT + i];
  if (tid < MLA_ROPE) qps[tid] = qp[qh * MLA_ROPE + tid];
  const int len = lens[qi];
  const int begin = blockIdx.z * tps;
  const int count = min(indices ? nidx : len, begin + tps);
  float m = NEG_INF, l = 0.0f;
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  for (int base = begin; base < count; base += MLA_TILE) {
    __syncthreads();  // qs ready / previous tile's tok and sc consumed
    if (tid < MLA_TILE) {
      const int j = base + tid;
      int t = -1;
      if (j < count) t = indices ? indices[(size_t)qi * ld_idx + j] : j;
      if (t >= len) t = -1;
      tok[tid] = t;
    }
    __syncthreads();
    // Scores: each warp takes 8 tokens, a lane 16 latent + 2 rope values.
    for (int jj = 0; jj < MLA_TILE / 4; jj++) {
      const int j = wid * (MLA_TILE / 4) + jj;
      const int t = tok[j];
      float s = NEG_INF;
      if (t >= 0) {
        const u8* row = mla_token(cache, block_table, t);
        const uint4 v = *(const uint4*)(row + lane * 16);
        const float ls = ((const float*)(row + MLA_LAT))[lane >> 3];
        const u32 ws[4] = {v.x, v.y, v.z, v.w};
        float cf[16];
#pragma unroll
        for (int b = 0; b < 4; b++) fp8x4_to_f32(ws[b], cf + 4 * b);
        float d = 0.0f;
#pragma unroll
        for (int b = 0; b < 16; b++) d += cf[b] * qs[lane * 16 + b];
        const u32 r = ((const u32*)(row + MLA_LAT + 16))[lane];
        const float rp = bf16_to_f32(r) * qps[lane * 2] + bf16_to_f32(r >> 16) * qps[lane * 2 + 1];
        s = warp_sum(d * ls + rp) * scale;
      }
      if (lane == 0) sc[j] = s;
    }
    __syncthreads();
    float tmax = NEG_INF;
    for (int j = 0; j < MLA_TILE; j++) tmax = fmaxf(tmax, sc[j]);
    const float nm = fmaxf(m, tmax);
    if (nm == NEG_INF) continue;  // nothing valid yet
    const float corr = expf(m - nm);  // m = -inf gives 0
    l *= corr;
#pragma unroll
    for (int i = 0; i < 4; i++) acc[i] *= corr;
    // Each thread owns latent dims tid*4 .. tid*4+3 (one 4-byte load).
    for (int j = 0; j < MLA_TILE; j++) {
      const int t = tok[j];
      if (t < 0) continue;
      const float p = expf(sc[j] - nm);
      l += p;
      const u8* row = mla_token(cache, block_table, t);
      const u32 cv = ((const u32*)row)[tid];
      const float cs = ((const float*)(row + MLA_LAT))[tid >> 5] * p;
      float cf[4];
      fp8x4_to_f32(cv, cf);
#pragma unroll
      for (int i = 0; i < 4; i++) acc[i] += cf[i] * cs;
    }
    m = nm;
  }
  if (gridDim.z > 1) {
    const size_t pz = qh * gridDim.z + blockIdx.z;
    float* po = part_o + pz * MLA_LAT + tid * 4;
#pragma unroll
    for (int i = 0; i < 4; i++) po[i] = acc[i];
    if (tid == 0) {
      part_ml[2 * pz] = m;
      part_ml[2 * pz + 1] = l;
    }
    return;
  }
  float* o = out + qh * MLA_LAT + tid * 4;
  const float inv = l > 0.0f ? 1.0f / l : 0.0f;
#pragma unroll
  for (int i = 0; i < 4; i++) o[i] = acc[i] * inv;
  if (lse && tid == 0) lse[qh] = l > 0.0f ? m + logf(l) : NEG_INF;
}

// Merges the gridDim.z partials of mla_decode: one block (128 threads) per
// (query row, head), blockIdx.x = q*H + h.
extern "C" __global__ void __launch_bounds__(128) mla_combine(const float* __restrict__ part_o,
                                                              const float* __restrict__ part_ml, int nsplit,
                                                              float* out, float* lse) {
  PDL_WAIT();
  const size_t qh = blockIdx.x;
  const int tid = threadIdx.x;
  float M = NEG_INF;
  for (int z = 0; z < nsplit; z++) M = fmaxf(M, part_ml[2 * (qh * nsplit + z)]);
  float L = 0.0f, acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  if (M != NEG_INF) {
    for (int z = 0; z < nsplit; z++) {
      const size_t pz = qh * nsplit + z;
      const float mz = part_ml[2 * pz];
      if (mz == NEG_INF) continue;
      const float w = expf(mz - M);
      L += part_ml[2 * pz + 1] * w;
      const float* po = part_o + pz * MLA_LAT + tid * 4;
#pragma unroll
      for (int i = 0; i < 4; i++) acc[i] += po[i] * w;
    }
  }
  const float inv = L > 0.0f ? 1.0f / L : 0.0f;
  float* o = out + qh * MLA_LAT + tid * 4;
#pragma unroll
  for (int i = 0; i < 4; i++) o[i] = acc[i] * inv;
  if (lse && tid == 0) lse[qh] = L > 0.0f ? M + logf(L) : NEG_INF;
}
