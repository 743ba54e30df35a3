// MLA decode with the heads as the M dimension (same semantics and partial
// layout as mla_decode in mla.cu). MLA is multi-query attention in its
// latent space: every head reads the same 656-byte entries, so a block takes
// 16 heads and a range of tokens, dequantises each 32-token tile into shared
// memory once (latent times its group scale, RoPE part as float), and runs
// the two products of the tile as small matrix products from shared memory:
// S[16 heads][32 tokens] over 576 values, then O[16][512] += P[16][32] C.
// mla_decode instead walks the entries once per head (128x the loads).
//
// Grid: x = token split z (tps tokens each), y = query row, z = head group.
// 256 threads. The next tile's raw bytes are loaded into registers while the
// current one is computed. With gridDim.x > 1 each block writes its
// unnormalised partial for mla_combine.

#define MH_HG 16   // heads per block
#define MH_TC 32   // tokens per tile
#define MH_D 576   // latent + RoPE values per entry
#define MH_KS 580  // floats per token row in shared memory: 16-byte aligned, conflict-free float4 columns

// Dynamic shared memory of mla_decode_heads, in bytes (kept in step with
// MLAHeadsSmemBytes in ops_mla.go).
#define MH_SMEM_FLOATS (MH_HG * MH_D + MH_TC * MH_KS + 8 * MH_HG * MH_TC + MH_TC * MH_HG + 3 * MH_HG + MH_TC)

// One loader thread's share of token slot j of a tile: 64 latent bytes
// (part lp of 8), that group's scale and 8 RoPE values.
__device__ __forceinline__ int mh_fetch(const u8* __restrict__ cache, const int* __restrict__ block_table,
                                        const int* __restrict__ indices, int ld_idx, int qi, int len, int count,
                                        int j, int lp, uint4* raw, uint4& rr, float& sc) {
  int t = -1;
  if (j < count) t = indices ? indices[(size_t)qi * ld_idx + j] : j;
  if (t < 0 || t >= len) return -1;
  const u8* row = mla_token(cache, block_table, t);
  const uint4* lat = (const uint4*)(row + lp * 64);
#pragma unroll
  for (int b = 0; b < 4; b++) raw[b] = lat[b];
  sc = ((const float*)(row + MLA_LAT))[lp >> 1];
  rr = *(const uint4*)(row + MLA_LAT + 16 + lp * 16);
  return t;
}

extern "C" __global__ void __launch_bounds__(256, 1) mla_decode_heads(const float* __restrict__ qn,
                                                                   const float* __restrict__ qp,
                                                                   const u8* __restrict__ cache,
                                                                   const int* __restrict__ block_table,
                                                                   const int* __restrict__ indices, int ld_idx,
                                                                   int nidx, const int* __restrict__ lens, float* out,
                                                                   float* lse, int H, float scale, int tps,
                                                                   float* part_o, float* part_ml) {
  PDL_WAIT();
  extern __shared__ float4 mh_smem4[];
  float* qs = (float*)mh_smem4;           // [HG][576]
  float* kvs = qs + MH_HG * MH_D;         // [TC][KS]
  float* red = kvs + MH_TC * MH_KS;       // [8 warps][HG][TC] partial scores
  float* ps = red + 8 * MH_HG * MH_TC;    // [TC][HG] probabilities
  float* mst = ps + MH_TC * MH_HG;        // running max per head
  float* lst = mst + MH_HG;               // running sum per head
  float* cst = lst + MH_HG;               // this tile's rescale per head
  int* tok = (int*)(cst + MH_HG);         // [TC] token of each slot, -1 invalid
  const int z = blockIdx.x, qi = blockIdx.y, h0 = blockIdx.z * MH_HG;
  const int tid = threadIdx.x, lane = tid & 31, wid = tid >> 5;
  for (int i = tid; i < MH_HG * MH_D; i += 256) {
    const int hh = i / MH_D, d = i - hh * MH_D, h = h0 + hh;
    float v = 0.0f;
    if (h < H) {
      const size_t qh = (size_t)qi * H + h;
      v = d < MLA_LAT ? qn[qh * MLA_LAT + d] : qp[qh * MLA_ROPE + d - MLA_LAT];
    }
    qs[i] = v;
  }
  if (tid < MH_HG) {
    mst[tid] = NEG_INF;
    lst[tid] = 0.0f;
  }
  const int len = lens[qi];
  const int begin = z * tps;
  const int count = min(indices ? nidx : len, begin + tps);
  const int lj = tid >> 3, lp = tid & 7;  // loader: token slot, eighth of the entry
  const int c4 = tid & 127, hg = tid >> 7;  // PV: float4 column of the latent, 8-head half
  uint4 raw[4], rr;
  float sc = 0.0f;
  int ltok = -1;
  if (begin < count) ltok = mh_fetch(cache, block_table, indices, ld_idx, qi, len, count, begin + lj, lp, raw, rr, sc);
  float4 acc[8];
#pragma unroll
  for (int i = 0; i < 8; i++) acc[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  for (int base = begin; base < count; base += MH_TC) {
    // Store the fetched tile (zeros for invalid slots: p = 0 there).
    {
      float4* dst = (float4*)(kvs + lj * MH_KS + lp * 64);
      float4* rdst = (float4*)(kvs + lj * MH_KS + MLA_LAT + lp * 8);
      if (ltok >= 0) {
#pragma unroll
        for (int b = 0; b < 4; b++) {
          const u32 w[4] = {raw[b].x, raw[b].y, raw[b].z, raw[b].w};
#pragma unroll
          for (int q = 0; q < 4; q++) {
            float f[4];
            fp8x4_to_f32(w[q], f);
            dst[b * 4 + q] = make_float4(f[0] * sc, f[1] * sc, f[2] * sc, f[3] * sc);
          }
        }
        rdst[0] = make_float4(bf16_to_f32(rr.x), bf16_to_f32(rr.x >> 16), bf16_to_f32(rr.y), bf16_to_f32(rr.y >> 16));
        rdst[1] = make_float4(bf16_to_f32(rr.z), bf16_to_f32(rr.z >> 16), bf16_to_f32(rr.w), bf16_to_f32(rr.w >> 16));
      } else {
        const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
        for (int b = 0; b < 16; b++) dst[b] = zero;
        rdst[0] = zero;
        rdst[1] = zero;
      }
      if (lp == 0) tok[lj] = ltok;
    }
    __syncthreads();
    if (base + MH_TC < count) {
      ltok = mh_fetch(cache, block_table, indices, ld_idx, qi, len, count, base + MH_TC + lj, lp, raw, rr, sc);
    }
    // Scores: warp wid takes values [72*wid, 72*wid+72) of all 16 heads,
    // lane = token slot; the 8 partial sums meet in red.
    {
      float s[MH_HG];
#pragma unroll
      for (int h = 0; h < MH_HG; h++) s[h] = 0.0f;
      const float* kr = kvs + lane * MH_KS + wid * 72;
      const float* qb = qs + wid * 72;
#pragma unroll 2
      for (int d = 0; d < 72; d += 4) {
        const float4 k4 = *(const float4*)(kr + d);
#pragma unroll
        for (int h = 0; h < MH_HG; h++) {
          const float4 q4 = *(const float4*)(qb + h * MH_D + d);
          s[h] = fmaf(k4.x, q4.x, s[h]);
          s[h] = fmaf(k4.y, q4.y, s[h]);
          s[h] = fmaf(k4.z, q4.z, s[h]);
          s[h] = fmaf(k4.w, q4.w, s[h]);
        }
      }
#pragma unroll
      for (int h = 0; h < MH_HG; h++) red[(wid * MH_HG + h) * MH_TC + lane] = s[h];
    }
    __syncthreads();
    // Online softmax: warp wid owns heads 2*wid and 2*wid+1, lane = slot.
#pragma unroll
    for (int hh = 0; hh < 2; hh++) {
      const int h = wid * 2 + hh;
      float v = 0.0f;
#pragma unroll
      for (int w = 0; w < 8; w++) v += red[(w * MH_HG + h) * MH_TC + lane];
      v = tok[lane] >= 0 ? v * scale : NEG_INF;
      const float mo = mst[h];
      const float nm = fmaxf(mo, warp_max(v));
      float p = 0.0f, corr = 1.0f;
      if (nm != NEG_INF) {
        p = expf(v - nm);     // invalid slot: 0
        corr = expf(mo - nm);  // first valid tile: 0 (acc and l are 0)
      }
      const float ls = warp_sum(p);
      ps[lane * MH_HG + h] = p;
      __syncwarp();
      if (lane == 0) {
        lst[h] = lst[h] * corr + ls;
        mst[h] = nm;
        cst[h] = corr;
      }
    }
    __syncthreads();
    // O[8 heads of half hg][float4 column c4] += P C.
#pragma unroll
    for (int i = 0; i < 8; i++) {
      const float cr = cst[hg * 8 + i];
      acc[i].x *= cr;
      acc[i].y *= cr;
      acc[i].z *= cr;
      acc[i].w *= cr;
    }
#pragma unroll 4
    for (int j = 0; j < MH_TC; j++) {
      const float4 k4 = *(const float4*)(kvs + j * MH_KS + c4 * 4);
      const float4 pa = *(const float4*)(ps + j * MH_HG + hg * 8);
      const float4 pb = *(const float4*)(ps + j * MH_HG + hg * 8 + 4);
      const float pv[8] = {pa.x, pa.y, pa.z, pa.w, pb.x, pb.y, pb.z, pb.w};
#pragma unroll
      for (int i = 0; i < 8; i++) {
        acc[i].x = fmaf(pv[i], k4.x, acc[i].x);
        acc[i].y = fmaf(pv[i], k4.y, acc[i].y);
        acc[i].z = fmaf(pv[i], k4.z, acc[i].z);
        acc[i].w = fmaf(pv[i], k4.w, acc[i].w);
      }
    }
    __syncthreads();  // kvs, ps and tok are rewritten by the next tile
  }
  __syncthreads();  // mst/lst final (also when no tile ran)
#pragma unroll
  for (int i = 0; i < 8; i++) {
    const int hl = hg * 8 + i, h = h0 + hl;
    if (h >= H) continue;
    const size_t qh = (size_t)qi * H + h;
    const float m = mst[hl], l = lst[hl];
    if (gridDim.x > 1) {
      const size_t pz = qh * gridDim.x + z;
      *(float4*)(part_o + pz * MLA_LAT + c4 * 4) = acc[i];
      if (c4 == 0) {
        part_ml[2 * pz] = m;
        part_ml[2 * pz + 1] = l;
      }
      continue;
    }
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
    *(float4*)(out + qh * MLA_LAT + c4 * 4) = make_float4(acc[i].x * inv, acc[i].y * inv, acc[i].z * inv, acc[i].w * inv);
    if (lse && c4 == 0) lse[qh] = l > 0.0f ? m + logf(l) : NEG_INF;
  }
}
