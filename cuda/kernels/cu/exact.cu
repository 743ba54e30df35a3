// Wide MLA / indexer caches for the GPU decode engine (engine/gpu): the
// float32 caches of exact mode and vLLM's bf16 MLA cache of serving mode.
// Contiguous regions (position p at p * entry size):
//   MLA float32: 576 floats per token (512 latent, 64 RoPE'd key), 2304 bytes;
//   MLA bf16:    576 bf16 per token (512 latent, 64 rope), 1152 bytes, the
//                bytes of engine.EncodeMLABF16 (RNE);
//   indexer float32: 128 floats per token.

#define MLAW_DIM 576
#define MLAW_TILE 32

// n rows of src ([n][ld]: 512 latent then 64 rope values) stored at
// positions pos[i] (<0 skipped) as float32 (bf16 == 0) or bf16 entries.
// One block of 128 threads per row.
template <int BF16>
__device__ __forceinline__ void mla_cache_write_wide(const float* __restrict__ src, int ld, void* cache,
                                                     const int* __restrict__ pos) {
  const int p = pos[blockIdx.x];
  if (p < 0) return;
  const float* s = src + (size_t)blockIdx.x * ld;
  for (int i = threadIdx.x; i < MLAW_DIM; i += blockDim.x) {
    if (BF16) {
      ((u16*)cache)[(size_t)p * MLAW_DIM + i] = f32_to_bf16(s[i]);
    } else {
      ((float*)cache)[(size_t)p * MLAW_DIM + i] = s[i];
    }
  }
}

extern "C" __global__ void __launch_bounds__(128) eng_mla_cache_write_f32(const float* __restrict__ src, int ld,
                                                                          float* cache, const int* __restrict__ pos) {
  PDL_WAIT();
  mla_cache_write_wide<0>(src, ld, cache, pos);
}

extern "C" __global__ void __launch_bounds__(128) eng_mla_cache_write_bf16(const float* __restrict__ src, int ld,
                                                                           u16* cache, const int* __restrict__ pos) {
  PDL_WAIT();
  mla_cache_write_wide<1>(src, ld, cache, pos);
}

// Indexer keys (128 floats, src row stride ld) copied to float32 entries at
// positions pos[i] (<0 skipped). One warp per row.
extern "C" __global__ void __launch_bounds__(32) eng_indexer_cache_write_f32(const float* __restrict__ src, int ld,
                                                                             float* cache,
                                                                             const int* __restrict__ pos) {
  PDL_WAIT();
  const int p = pos[blockIdx.x];
  if (p < 0) return;
  const float4 v = ((const float4*)(src + (size_t)blockIdx.x * ld))[threadIdx.x];
  ((float4*)(cache + (size_t)p * 128))[threadIdx.x] = v;
}

// Lightning indexer over the float32 key cache: out[q][t] (row stride
// ld_out) = sum_h w[q][h] * ReLU(qk_scale * q[q][h] . k_t) for t < lens[q],
// -inf for lens[q] <= t < T. q: [nq][H][128], w: [nq][H]. One block (256
// threads) per (64-token tile, query row), as indexer_scores.
extern "C" __global__ void __launch_bounds__(256) eng_indexer_scores_f32(const float* __restrict__ q,
                                                                         const float* __restrict__ w,
                                                                         const float* __restrict__ cache,
                                                                         const int* __restrict__ lens, float* out,
                                                                         int H, int T, int ld_out, float qk_scale) {
  PDL_WAIT();
  __shared__ float kf[64][128 + 1];
  __shared__ float qs[16][128];
  __shared__ float ws[16];
  __shared__ float part[4][64];
  const int tile = blockIdx.x, qi = blockIdx.y, tid = threadIdx.x;
  const int len = lens[qi];
  const int t0 = tile * 64;
  float* orow = out + (size_t)qi * ld_out;
  if (t0 >= len) {
    for (int j = tid; j < 64; j += blockDim.x)
      if (t0 + j < T) orow[t0 + j] = NEG_INF;
    return;
  }
  // Keys of the tile; rows at or past len are never written: zeros.
  for (int i = tid; i < 64 * 128; i += blockDim.x) {
    const int tk = i >> 7, d = i & 127;
    kf[tk][d] = (t0 + tk < len) ? cache[(size_t)(t0 + tk) * 128 + d] : 0.0f;
  }
  const int tok = tid & 63, hg = tid >> 6;
  float acc = 0.0f;
  const float* qrow = q + (size_t)qi * H * 128;
  for (int h0 = 0; h0 < H; h0 += 16) {
    __syncthreads();
    for (int i = tid; i < 16 * 128; i += blockDim.x) {
      const int hh = h0 + (i >> 7);
      qs[i >> 7][i & 127] = hh < H ? qrow[(size_t)hh * 128 + (i & 127)] : 0.0f;
    }
    if (tid < 16) ws[tid] = (h0 + tid < H) ? w[(size_t)qi * H + h0 + tid] : 0.0f;
    __syncthreads();
#pragma unroll
    for (int j = 0; j < 4; j++) {
      const int hl = hg * 4 + j;
      float d = 0.0f;
#pragma unroll 8
      for (int k = 0; k < 128; k++) d += qs[hl][k] * kf[tok][k];
      acc += ws[hl] * fmaxf(d * qk_scale, 0.0f);
    }
  }
  part[hg][tok] = acc;
  __syncthreads();
  if (tid < 64) {
    const int t = t0 + tid;
    if (t < T) orow[t] = (t < len) ? (part[0][tid] + part[1][tid]) + (part[2][tid] + part[3][tid]) : NEG_INF;
  }
}

// Lane's 16 latent values (lane*16 ..) and 2 rope values (lane*2 ..) of token t.
template <int BF16>
__device__ __forceinline__ void mlaw_load_score(const void* cache, int t, int lane, float* cf, float* rp) {
  if (BF16) {
    const u16* row = (const u16*)cache + (size_t)t * MLAW_DIM;
    const uint4 a = *(const uint4*)(row + lane * 16);
    const uint4 b = *(const uint4*)(row + lane * 16 + 8);
    const u32 v[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
    for (int i = 0; i < 8; i++) {
      cf[2 * i] = bf16_to_f32(v[i]);
      cf[2 * i + 1] = bf16_to_f32(v[i] >> 16);
    }
    const u32 r = *(const u32*)(row + 512 + lane * 2);
    rp[0] = bf16_to_f32(r);
    rp[1] = bf16_to_f32(r >> 16);
  } else {
    const float* row = (const float*)cache + (size_t)t * MLAW_DIM;
#pragma unroll
    for (int i = 0; i < 4; i++) {
      const float4 v = *(const float4*)(row + lane * 16 + 4 * i);
      cf[4 * i] = v.x;
      cf[4 * i + 1] = v.y;
      cf[4 * i + 2] = v.z;
      cf[4 * i + 3] = v.w;
    }
    const float2 r = *(const float2*)(row + 512 + lane * 2);
    rp[0] = r.x;
    rp[1] = r.y;
  }
}

// Latent values tid*4 .. tid*4+3 of token t.
template <int BF16>
__device__ __forceinline__ void mlaw_load_acc(const void* cache, int t, int tid, float* cf) {
  if (BF16) {
    const uint2 v = *(const uint2*)((const u16*)cache + (size_t)t * MLAW_DIM + tid * 4);
    cf[0] = bf16_to_f32(v.x);
    cf[1] = bf16_to_f32(v.x >> 16);
    cf[2] = bf16_to_f32(v.y);
    cf[3] = bf16_to_f32(v.y >> 16);
  } else {
    const float4 v = *(const float4*)((const float*)cache + (size_t)t * MLAW_DIM + tid * 4);
    cf[0] = v.x;
    cf[1] = v.y;
    cf[2] = v.z;
    cf[3] = v.w;
  }
}

// Absorbed MLA decode over a wide (float32 or bf16) cache, the contract of
// mla_decode without splits or block table: for query row qi and head h,
// s_t = scale * (qn . c_t + qp . r_t) over the token set (indices[qi][0..nidx),
// entries < 0 or >= lens[qi] skipped; all t < lens[qi] when indices is
// null), out = sum_t softmax(s)_t c_t (0 when no token is valid).
// grid (H, nq), 128 threads.
template <int BF16>
__device__ __forceinline__ void mla_decode_wide(const float* __restrict__ qn, const float* __restrict__ qp,
                                                const void* __restrict__ cache, const int* __restrict__ indices,
                                                int ld_idx, int nidx, const int* __restrict__ lens, float* out,
                                                int H, float scale) {
  __shared__ float qs[512];
  __shared__ float qps[64];
  __shared__ float sc[MLAW_TILE];
  __shared__ int tok[MLAW_TILE];
  const int h = blockIdx.x, qi = blockIdx.y, tid = threadIdx.x, lane = tid & 31, wid = tid >> 5;
  const size_t qh = (size_t)qi * H + h;
  for (int i = tid; i < 512; i += blockDim.x) qs[i] = qn[qh * 512 + i];
  if (tid < 64) qps[tid] = qp[qh * 64 + tid];
  const int len = lens[qi];
  const int count = indices ? nidx : len;
  float m = NEG_INF, l = 0.0f;
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  for (int base = 0; base < count; base += MLAW_TILE) {
    __syncthreads();
    if (tid < MLAW_TILE) {
      const int j = base + tid;
      int t = -1;
      if (j < count) t = indices ? indices[(size_t)qi * ld_idx + j] : j;
      if (t >= len) t = -1;
      tok[tid] = t;
    }
    __syncthreads();
    for (int jj = 0; jj < MLAW_TILE / 4; jj++) {
      const int j = wid * (MLAW_TILE / 4) + jj;
      const int t = tok[j];
      float s = NEG_INF;
      if (t >= 0) {
        float cf[16], rp[2];
        mlaw_load_score<BF16>(cache, t, lane, cf, rp);
        float d = 0.0f;
#pragma unroll
        for (int b = 0; b < 16; b++) d += cf[b] * qs[lane * 16 + b];
        d += rp[0] * qps[lane * 2] + rp[1] * qps[lane * 2 + 1];
        s = warp_sum(d) * scale;
      }
      if (lane == 0) sc[j] = s;
    }
    __syncthreads();
    float tmax = NEG_INF;
    for (int j = 0; j < MLAW_TILE; j++) tmax = fmaxf(tmax, sc[j]);
    const float nm = fmaxf(m, tmax);
    if (nm == NEG_INF) continue;
    const float corr = expf(m - nm);
    l *= corr;
#pragma unroll
    for (int i = 0; i < 4; i++) acc[i] *= corr;
    for (int j = 0; j < MLAW_TILE; j++) {
      const int t = tok[j];
      if (t < 0) continue;
      const float p = expf(sc[j] - nm);
      l += p;
      float cf[4];
      mlaw_load_acc<BF16>(cache, t, tid, cf);
#pragma unroll
      for (int i = 0; i < 4; i++) acc[i] += cf[i] * p;
    }
    m = nm;
  }
  float* o = out + qh * 512 + tid * 4;
  const float inv = l > 0.0f ? 1.0f / l : 0.0f;
#pragma unroll
  for (int i = 0; i < 4; i++) o[i] = acc[i] * inv;
}

extern "C" __global__ void __launch_bounds__(128) eng_mla_decode_f32(const float* __restrict__ qn,
                                                                     const float* __restrict__ qp,
                                                                     const float* __restrict__ cache,
                                                                     const int* __restrict__ indices, int ld_idx,
                                                                     int nidx, const int* __restrict__ lens,
                                                                     float* out, int H, float scale) {
  PDL_WAIT();
  mla_decode_wide<0>(qn, qp, cache, indices, ld_idx, nidx, lens, out, H, scale);
}

extern "C" __global__ void __launch_bounds__(128) eng_mla_decode_bf16(const float* __restrict__ qn,
                                                                      const float* __restrict__ qp,
                                                                      const u16* __restrict__ cache,
                                                                      const int* __restrict__ indices, int ld_idx,
                                                                      int nidx, const int* __restrict__ lens,
                                                                      float* out, int H, float scale) {
  PDL_WAIT();
  mla_decode_wide<1>(qn, qp, cache, indices, ld_idx, nidx, lens, out, H, scale);
}
