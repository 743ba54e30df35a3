// MLA decode on tensor cores (same semantics and partial layout as
// mla_decode in mla.cu). MLA is multi-query attention in its latent space,
// so per query row it is two small GEMMs: S[16 heads][tokens] = Q [16][576]
// . K^T over the selected entries, and O[16][512] += P S-softmaxed . C.
// A block takes 16 heads and a range of tokens; each 32-token tile of
// 656-byte entries is fetched once with cp.async (the next tile's fetch
// overlaps this tile's math), dequantised once into shared memory as fp16
// (latent times its group scale; RoPE part), and the four warps run
// mma.sync m16n8k16 (fp16 in, f32 accumulate): warp w takes latent columns
// [128w, 128w+128) plus RoPE dims [512+16w, +16) of the score product (the
// four partial scores meet in shared memory) and the same 128 latent
// columns of the output. The queries and probabilities are rounded to fp16
// (2^-11 relative), the cache values are exact in fp16 up to the rounding
// of value times scale.
//
// Grid: x = token split z (tps tokens each), y = query row, z = head group
// of 16. 128 threads. With gridDim.x > 1 each block writes its unnormalised
// partial for mla_combine.

#define MT_HG 16                // heads per block (the mma M)
#define MT_TT 32                // tokens per tile
#define MT_KS 584               // fp16 per token row in shared memory (576 + 8: conflict-free fragments)
#define MT_CH (MLA_TOK_BYTES / 16)  // 16-byte chunks per entry (41)
// Dynamic shared memory of mla_decode_tc in bytes (MLATCSmemBytes in ops_mla.go).
#define MT_SMEM_BYTES (MT_TT * MT_CH * 16 + MT_TT * MT_KS * 2 + MT_HG * MT_KS * 2 + 4 * MT_HG * MT_TT * 4 + MT_TT * 4)

// mma.sync, cp.async and the f16x2 conversion need sm_80; older devices get
// a kernel that traps (the launcher refuses them first).
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
__device__ __forceinline__ u32 mt_smem_addr(const void* p) {
  u32 a;
  asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
  return a;
}

// Two floats to packed fp16 (lo in the low half).
__device__ __forceinline__ u32 mt_pack_f16(float lo, float hi) {
  u32 r;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

__device__ __forceinline__ void mt_mma(float* c, const u32* a, u32 b0, u32 b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Token of selection slot j (< count), or -1 when skipped.
__device__ __forceinline__ int mt_token(const int* __restrict__ indices, int ld_idx, int qi, int len, int count,
                                        int j) {
  if (j >= count) return -1;
  const int t = indices ? indices[(size_t)qi * ld_idx + j] : j;
  return (t < 0 || t >= len) ? -1 : t;
}

// Starts the asynchronous copy of the entries of slots [base, base+MT_TT)
// into raw (invalid slots are left as they are: the dequantisation zeroes them).
__device__ __forceinline__ void mt_issue(uint4* raw, const u8* __restrict__ cache, const int* __restrict__ block_table,
                                         const int* __restrict__ indices, int ld_idx, int qi, int len, int count,
                                         int base) {
  for (int c = threadIdx.x; c < MT_TT * MT_CH; c += 128) {
    const int j = c / MT_CH, p = c - j * MT_CH;
    const int t = mt_token(indices, ld_idx, qi, len, count, base + j);
    if (t < 0) continue;
    const u8* src = mla_token(cache, block_table, t) + p * 16;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(mt_smem_addr(raw + c)), "l"(src) : "memory");
  }
  asm volatile("cp.async.commit_group;" ::: "memory");
}

extern "C" __global__ void __launch_bounds__(128) mla_decode_tc(const float* __restrict__ qn,
                                                                const float* __restrict__ qp,
                                                                const u8* __restrict__ cache,
                                                                const int* __restrict__ block_table,
                                                                const int* __restrict__ indices, int ld_idx, int nidx,
                                                                const int* __restrict__ lens, float* out, float* lse,
                                                                int H, float scale, int tps, float* part_o,
                                                                float* part_ml) {
  extern __shared__ uint4 mt_smem[];
  uint4* raw = mt_smem;                          // [TT][41] raw entries
  u16* Kt = (u16*)(raw + MT_TT * MT_CH);         // [TT][KS] fp16 entries
  u16* Qs = Kt + MT_TT * MT_KS;                  // [HG][KS] fp16 queries
  float* red = (float*)(Qs + MT_HG * MT_KS);     // [4 warps][HG][TT] partial scores
  int* tok = (int*)(red + 4 * MT_HG * MT_TT);    // [TT] token of each slot, -1 skipped
  const int z = blockIdx.x, qi = blockIdx.y, h0 = blockIdx.z * MT_HG;
  const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5, g = lane >> 2, t4 = lane & 3;
  const int len = lens[qi];
  const int begin = z * tps;
  const int count = min(indices ? nidx : len, begin + tps);
  if (begin < count) {
    mt_issue(raw, cache, block_table, indices, ld_idx, qi, len, count, begin);
  }
  for (int i = tid; i < MT_HG * 288; i += 128) {
    const int hh = i / 288, d = (i - hh * 288) * 2, h = h0 + hh;
    float a = 0.0f, b = 0.0f;
    if (h < H) {
      const size_t qh = (size_t)qi * H + h;
      const float* src = d < MLA_LAT ? qn + qh * MLA_LAT + d : qp + qh * MLA_ROPE + d - MLA_LAT;
      a = src[0];
      b = src[1];
    }
    *(u32*)(Qs + hh * MT_KS + d) = mt_pack_f16(a, b);
  }
  __syncthreads();
  // This warp's query fragments: k-steps 0..7 its latent columns, 8 its RoPE dims.
  u32 qa[9][4];
#pragma unroll
  for (int ks = 0; ks < 9; ks++) {
    const int d0 = ks < 8 ? 128 * w + 16 * ks : MLA_LAT + 16 * w;
    qa[ks][0] = *(const u32*)(Qs + g * MT_KS + d0 + 2 * t4);
    qa[ks][1] = *(const u32*)(Qs + (g + 8) * MT_KS + d0 + 2 * t4);
    qa[ks][2] = *(const u32*)(Qs + g * MT_KS + d0 + 8 + 2 * t4);
    qa[ks][3] = *(const u32*)(Qs + (g + 8) * MT_KS + d0 + 8 + 2 * t4);
  }
  float o[16][4];
#pragma unroll
  for (int j = 0; j < 16; j++) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
  float m0 = NEG_INF, m1 = NEG_INF, l0 = 0.0f, l1 = 0.0f;  // heads g and g+8 (l: this lane's share)
  for (int base = begin; base < count; base += MT_TT) {
    asm volatile("cp.async.wait_all;" ::: "memory");
    __syncthreads();  // the tile has landed; the previous tile's Kt, tok and red are consumed
    {
      // Dequantise: thread takes slot j, latent group qq (128 values) and
      // 16 RoPE values.
      const int j = tid >> 2, qq = tid & 3;
      const int t = mt_token(indices, ld_idx, qi, len, count, base + j);
      if (qq == 0) tok[j] = t;
      uint4* dst = (uint4*)(Kt + j * MT_KS);
      const uint4* src = raw + j * MT_CH;
      if (t >= 0) {
        const float sc = ((const float*)(src + 32))[qq];
#pragma unroll
        for (int b = 0; b < 8; b++) {
          const uint4 v = src[qq * 8 + b];
          const u32 ws[4] = {v.x, v.y, v.z, v.w};
          u32 hv[8];
#pragma unroll
          for (int e = 0; e < 4; e++) {
            float f[4];
            fp8x4_to_f32(ws[e], f);
            hv[2 * e] = mt_pack_f16(f[0] * sc, f[1] * sc);
            hv[2 * e + 1] = mt_pack_f16(f[2] * sc, f[3] * sc);
          }
          dst[qq * 16 + 2 * b] = make_uint4(hv[0], hv[1], hv[2], hv[3]);
          dst[qq * 16 + 2 * b + 1] = make_uint4(hv[4], hv[5], hv[6], hv[7]);
        }
        const uint4 r0 = src[33 + 2 * qq], r1 = src[34 + 2 * qq];
        const u32 rs[8] = {r0.x, r0.y, r0.z, r0.w, r1.x, r1.y, r1.z, r1.w};
        u32 hv[8];
#pragma unroll
        for (int e = 0; e < 8; e++) hv[e] = mt_pack_f16(bf16_to_f32(rs[e]), bf16_to_f32(rs[e] >> 16));
        dst[64 + 2 * qq] = make_uint4(hv[0], hv[1], hv[2], hv[3]);
        dst[65 + 2 * qq] = make_uint4(hv[4], hv[5], hv[6], hv[7]);
      } else {
        const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
        for (int b = 0; b < 16; b++) dst[qq * 16 + b] = zero;
        dst[64 + 2 * qq] = zero;
        dst[65 + 2 * qq] = zero;
      }
    }
    __syncthreads();
    if (base + MT_TT < count) {
      mt_issue(raw, cache, block_table, indices, ld_idx, qi, len, count, base + MT_TT);
    }
    // Partial scores of this warp's dims: 4 n-tiles of 8 tokens.
    float s[4][4];
#pragma unroll
    for (int n = 0; n < 4; n++) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
    for (int ks = 0; ks < 9; ks++) {
      const int d0 = ks < 8 ? 128 * w + 16 * ks : MLA_LAT + 16 * w;
#pragma unroll
      for (int n = 0; n < 4; n++) {
        const u16* kr = Kt + (8 * n + g) * MT_KS + d0 + 2 * t4;
        mt_mma(s[n], qa[ks], *(const u32*)kr, *(const u32*)(kr + 8));
      }
    }
    float* rw = red + w * MT_HG * MT_TT;
#pragma unroll
    for (int n = 0; n < 4; n++) {
      *(float2*)(rw + g * MT_TT + 8 * n + 2 * t4) = make_float2(s[n][0], s[n][1]);
      *(float2*)(rw + (g + 8) * MT_TT + 8 * n + 2 * t4) = make_float2(s[n][2], s[n][3]);
    }
    __syncthreads();
    // Full scores (the four warps' partials in a fixed order), masked and scaled.
    float mx0 = NEG_INF, mx1 = NEG_INF;
#pragma unroll
    for (int n = 0; n < 4; n++) {
#pragma unroll
      for (int e = 0; e < 4; e++) {
        const int row = g + (e >> 1) * 8, col = 8 * n + 2 * t4 + (e & 1);
        float v = 0.0f;
#pragma unroll
        for (int ww = 0; ww < 4; ww++) v += red[(ww * MT_HG + row) * MT_TT + col];
        v = tok[col] >= 0 ? v * scale : NEG_INF;
        s[n][e] = v;
      }
      mx0 = fmaxf(mx0, fmaxf(s[n][0], s[n][1]));
      mx1 = fmaxf(mx1, fmaxf(s[n][2], s[n][3]));
    }
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
    const float nm0 = fmaxf(m0, mx0), nm1 = fmaxf(m1, mx1);
    const float c0 = nm0 == NEG_INF ? 1.0f : expf(m0 - nm0);  // first valid tile: 0 (o and l are 0)
    const float c1 = nm1 == NEG_INF ? 1.0f : expf(m1 - nm1);
    float ls0 = 0.0f, ls1 = 0.0f;
#pragma unroll
    for (int n = 0; n < 4; n++) {
      s[n][0] = nm0 == NEG_INF ? 0.0f : expf(s[n][0] - nm0);  // skipped slot: 0
      s[n][1] = nm0 == NEG_INF ? 0.0f : expf(s[n][1] - nm0);
      s[n][2] = nm1 == NEG_INF ? 0.0f : expf(s[n][2] - nm1);
      s[n][3] = nm1 == NEG_INF ? 0.0f : expf(s[n][3] - nm1);
      ls0 += s[n][0] + s[n][1];
      ls1 += s[n][2] + s[n][3];
    }
    l0 = l0 * c0 + ls0;
    l1 = l1 * c1 + ls1;
    m0 = nm0;
    m1 = nm1;
#pragma unroll
    for (int j = 0; j < 16; j++) {
      o[j][0] *= c0;
      o[j][1] *= c0;
      o[j][2] *= c1;
      o[j][3] *= c1;
    }
    // O += P C over this warp's 128 latent columns: 2 k-steps of 16 tokens.
#pragma unroll
    for (int kk = 0; kk < 2; kk++) {
      const u32 pa[4] = {mt_pack_f16(s[2 * kk][0], s[2 * kk][1]), mt_pack_f16(s[2 * kk][2], s[2 * kk][3]),
                         mt_pack_f16(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                         mt_pack_f16(s[2 * kk + 1][2], s[2 * kk + 1][3])};
      const u16* k0 = Kt + (16 * kk + 2 * t4) * MT_KS + 128 * w + g;
#pragma unroll
      for (int j = 0; j < 16; j++) {
        const u16* kc = k0 + 8 * j;
        const u32 b0 = (u32)kc[0] | ((u32)kc[MT_KS] << 16);
        const u32 b1 = (u32)kc[8 * MT_KS] | ((u32)kc[9 * MT_KS] << 16);
        mt_mma(o[j], pa, b0, b1);
      }
    }
  }
  l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
  l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
#pragma unroll
  for (int hr = 0; hr < 2; hr++) {
    const int h = h0 + g + 8 * hr;
    if (h >= H) continue;
    const size_t qh = (size_t)qi * H + h;
    const float m = hr ? m1 : m0, l = hr ? l1 : l0;
    if (gridDim.x > 1) {
      const size_t pz = qh * gridDim.x + z;
      float* po = part_o + pz * MLA_LAT + 128 * w + 2 * t4;
#pragma unroll
      for (int j = 0; j < 16; j++) *(float2*)(po + 8 * j) = make_float2(o[j][2 * hr], o[j][2 * hr + 1]);
      if (w == 0 && t4 == 0) {
        part_ml[2 * pz] = m;
        part_ml[2 * pz + 1] = l;
      }
      continue;
    }
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
    float* po = out + qh * MLA_LAT + 128 * w + 2 * t4;
#pragma unroll
    for (int j = 0; j < 16; j++) *(float2*)(po + 8 * j) = make_float2(o[j][2 * hr] * inv, o[j][2 * hr + 1] * inv);
    if (lse && w == 0 && t4 == 0) lse[qh] = l > 0.0f ? m + logf(l) : NEG_INF;
  }
}
#else
extern "C" __global__ void __launch_bounds__(128) mla_decode_tc(const float* qn, const float* qp, const u8* cache,
                                                                const int* block_table, const int* indices, int ld_idx,
                                                                int nidx, const int* lens, float* out, float* lse,
                                                                int H, float scale, int tps, float* part_o,
                                                                float* part_ml) {
  __trap();
}
#endif
