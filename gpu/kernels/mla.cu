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
                                                             int H, float scale) {
  __shared__ float qs[MLA_LAT];
  __shared__ float qps[MLA_ROPE];
  __shared__ float sc[MLA_TILE];
  __shared__ int tok[MLA_TILE];
  const int h = blockIdx.x, qi = blockIdx.y, tid = threadIdx.x, lane = tid & 31, wid = tid >> 5;
  const size_t qh = (size_t)qi * H + h;
  for (int i = tid; i < MLA_LAT; i += blockDim.x) qs[i] = qn[qh * MLA_LAT + i];
  if (tid < MLA_ROPE) qps[tid] = qp[qh * MLA_ROPE + tid];
  const int len = lens[qi];
  const int count = indices ? nidx : len;
  float m = NEG_INF, l = 0.0f;
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  for (int base = 0; base < count; base += MLA_TILE) {
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
        float d = 0.0f;
#pragma unroll
        for (int b = 0; b < 16; b++) d += fp8_to_f32((ws[b >> 2] >> ((b & 3) * 8)) & 0xffu) * qs[lane * 16 + b];
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
#pragma unroll
      for (int i = 0; i < 4; i++) acc[i] += fp8_to_f32((cv >> (8 * i)) & 0xffu) * cs;
    }
    m = nm;
  }
  float* o = out + qh * MLA_LAT + tid * 4;
  const float inv = l > 0.0f ? 1.0f / l : 0.0f;
#pragma unroll
  for (int i = 0; i < 4; i++) o[i] = acc[i] * inv;
  if (lse && tid == 0) lse[qh] = l > 0.0f ? m + logf(l) : NEG_INF;
}
