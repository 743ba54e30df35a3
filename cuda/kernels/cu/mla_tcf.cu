// mla_decode_tcf: the sparse MLA decode of mla_decode_tcp (same launch,
// arguments, splits and partials) with the cache entries fed
// to the tensor cores as fp16 straight from the raw tile, with no converted
// bf16 tile in shared memory:
// - e4m3 -> f16 is exact and one cvt per two values (tcp: e4m3 -> f16 ->
//   f32 -> bf16, four per two, then a store, a barrier and a reload).
// - Scores: warp w (latent group w) reads its B fragments as 32-bit words
//   of the raw entries, the k order permuted alike for queries and keys
//   (mma k 2t4, 2t4+1, 2t4+8, 2t4+9 = dims 4t4..4t4+3 of the k-step), so
//   each word is two fragment registers. The queries of (head, group) are
//   scaled by a power of two into [2^14, 2^15) and split into three fp16
//   parts (33 bits >= float32's 24: exact products, as tcp's bf16 parts).
//   The RoPE k-step stays bf16 (stored as bf16; three bf16 query parts).
// - P.V: ldmatrix.trans over the raw fp8 rows (8 tokens x 16 bytes a
//   matrix) gives each thread two tokens' byte pairs of one column pair; a
//   byte permute and two cvt make the B fragments of an even and an odd
//   column n-tile (the output's columns are stored back in order).
//   P times the token's group scale is scaled by 2^(14 - E), 2^E above
//   every scale seen so far (a running max like the softmax's, o rescaled
//   by the power of two when it grows), then split in three fp16 parts.
// - Two barriers a tile (tcp: three); NR raw tiles in flight; skipped
//   slots are zero-filled so that 0 x garbage never makes a NaN.
// The products are float32-exact as in tcp; the sums run in another order
// (score partials scaled after the latent sum, rope added after), so the
// results equal tcp's to float32 rounding, not bit for bit.

#define MTF_NR 4
#define MTF_NS (MTF_NR + 1)
// Dynamic shared memory in bytes (MLATCFSmemBytes in ops_mla_tcf.go): NR raw tiles, partial scores, NS x token slots, the
// RoPE query parts ([4 warps][12][32 lanes] words: registers are short).
#define MTF_SMEM_BYTES (MTF_NR * MT_TT * MT_CH * 16 + 4 * MT_HG * MT_TT * 4 + MTF_NS * MT_TT * 4 + 4 * 12 * 32 * 4)

#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
// Two e4m3 bytes (low byte -> low half) to exact fp16s.
__device__ __forceinline__ u32 mtf_e4m3x2(u32 x) {
  u32 r;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(r) : "h"((u16)(x & 0xffffu)));
  return r;
}

__device__ __forceinline__ u32 mtf_f16x2(float lo, float hi) {
  u32 r;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

__device__ __forceinline__ float mtf_h2f(u32 h) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"((u16)(h & 0xffffu)));
  return f;
}

// (a, b) = hi + mid + lo in fp16 parts, each the rounding of what the
// previous parts leave (the caller scales a and b to below 2^15).
__device__ __forceinline__ void mtf_split3h(float a, float b, u32* p) {
  p[0] = mtf_f16x2(a, b);
  a -= mtf_h2f(p[0]);
  b -= mtf_h2f(p[0] >> 16);
  p[1] = mtf_f16x2(a, b);
  a -= mtf_h2f(p[1]);
  b -= mtf_h2f(p[1] >> 16);
  p[2] = mtf_f16x2(a, b);
}

// NP = 2: hi + lo only (22 bits: ~2^-22 of the largest value of the
// scaled group, not float32-exact; the timing comparison of mma counts).
template <int NP>
__device__ __forceinline__ void mtf_splith(float a, float b, u32* p) {
  if (NP == 3) {
    mtf_split3h(a, b, p);
  } else {
    p[0] = mtf_f16x2(a, b);
    a -= mtf_h2f(p[0]);
    b -= mtf_h2f(p[0] >> 16);
    p[1] = mtf_f16x2(a, b);
  }
}

__device__ __forceinline__ void mtf_mma_h(float* c, const u32* a, u32 b0, u32 b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// 2^e as a float (e in [-126, 127]).
__device__ __forceinline__ float mtf_pow2(int e) { return __int_as_float((e + 127) << 23); }

// The exponent e with max * 2^e in [2^14, 2^15) (0 for max 0), kept where
// 2^e and 2^-e are normal floats.
__device__ __forceinline__ int mtf_qexp(float mx) {
  if (!(mx > 0.0f)) return 0;
  const int ex = (int)((__float_as_uint(mx) >> 23) & 0xffu) - 127;
  return min(126, max(-126, 14 - ex));
}

// The cp.async of one tile by NT threads (slots from shared memory): NT/32
// threads a token, each a fixed share of its 41 chunks, so the slot is
// read and the row address formed once per thread and tile. A skipped
// slot's row is zero-filled (its scale 0, its bytes no NaN).
template <int NT>
__device__ __forceinline__ void mtf_issue_n(int tid, uint4* raw, const u8* __restrict__ cache, const int* slots) {
  constexpr int TPJ = NT / MT_TT;  // threads a token
  const int j = tid / TPJ, p0 = tid - j * TPJ;
  const int t = slots[j];
  uint4* dst = raw + j * MT_CH;
  if (t < 0) {
#pragma unroll
    for (int p = p0; p < MT_CH; p += TPJ) dst[p] = make_uint4(0u, 0u, 0u, 0u);
  } else {
    const u8* src = cache + (size_t)t * MLA_TOK_BYTES;
    const u32 d = mt_smem_addr(dst);
#pragma unroll
    for (int p = p0; p < MT_CH; p += TPJ)
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(d + 16u * p), "l"(src + 16 * p) : "memory");
  }
  asm volatile("cp.async.commit_group;" ::: "memory");
}
__device__ __forceinline__ void mtf_issue(int tid, uint4* raw, const u8* __restrict__ cache, const int* slots) {
  mtf_issue_n<128>(tid, raw, cache, slots);
}

// mt_slot for the prologue's tiles: with a selection, the index loads do
// not wait for the row's length (only the range check does), so the
// lengths' and the indices' L2 round trips overlap instead of following
// each other before the first gather. The same slots as mt_slot.
__device__ __forceinline__ void mtf_slots0(int* slots, int n, int stride, int tid, const int* __restrict__ indices,
                                           const int* __restrict__ block_table, int ld_idx, int nidx, int qi,
                                           int len, int count, int begin, int end) {
  const int sel = min(nidx, end);  // the selection's count, whatever len is
  for (int j = tid; j < n; j += stride) {
    int t = begin + j;
    if (indices) t = t < sel ? indices[(size_t)qi * ld_idx + t] : -1;
    if (begin + j >= count || t < 0 || t >= len) t = -1;
    slots[j] = t >= 0 && block_table ? block_table[t >> 6] * 64 + (t & 63) : t;
  }
}

template <int NP = 3>
__device__ __forceinline__ void mtf_body(const float* __restrict__ qn, const float* __restrict__ qp,
                                         const u8* __restrict__ cache, const int* __restrict__ block_table,
                                         const int* __restrict__ indices, int ld_idx, int nidx,
                                         const int* __restrict__ lens, float* out, float* lse, int H, float scale,
                                         int tps, float* part_o, float* part_ml,
                                         const long long* __restrict__ row_base) {
  extern __shared__ uint4 mt_smem[];
  uint4* raw = mt_smem;                              // [NR][TT][41] raw entries
  float* red = (float*)(raw + MTF_NR * MT_TT * MT_CH);  // [4 warps][HG][TT] partial scores
  int* slots = (int*)(red + 4 * MT_HG * MT_TT);     // [NS][TT] cache slot of each tile slot, -1 skipped
  u32* qrs = (u32*)(slots + MTF_NS * MT_TT);        // [4 warps][12][32] RoPE query parts
  const int z = blockIdx.x, qi = blockIdx.y, h0 = blockIdx.z * MT_HG;
  const int tid = threadIdx.x & 127, lane = tid & 31, w = tid >> 5, g = lane >> 2, t4 = lane & 3;
  if (row_base) cache += row_base[qi];
  const int len = lens[qi];
  const int begin = z * tps;
  const int count = min(indices ? nidx : len, begin + tps);
  // Slots of tiles 0..NR-1 (the prologue's issues and tile 0's).
  mtf_slots0(slots, MTF_NR * MT_TT, 128, tid, indices, block_table, ld_idx, nidx, qi, len, count, begin, begin + tps);
  __syncthreads();
#pragma unroll
  for (int b = 0; b < MTF_NR - 1; b++) {
    if (begin + b * MT_TT < count) {
      mtf_issue(tid, raw + b * MT_TT * MT_CH, cache, slots + b * MT_TT);
    } else {
      asm volatile("cp.async.commit_group;" ::: "memory");
    }
  }
  // Query fragments of heads g (va) and g+8 (vb): latent k-step ks of group
  // w = dims 128w + 16ks + 4t4 .. +3 (permuted k), scaled by 2^ea / 2^eb
  // and split into fp16 parts; the RoPE k-step (dims 512 + 16w + 4t4 ..)
  // in bf16 parts, unscaled.
  u32 qa[8][4][NP];
  float ia, ib;  // 2^-ea, 2^-eb
  {
    const int ha = h0 + g, hb = h0 + g + 8;
    float4 va[8], vb[8];
    const float4 zero4 = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    const float* qa0 = qn + ((size_t)qi * H + ha) * MLA_LAT + 128 * w + 4 * t4;
    const float* qb0 = qn + ((size_t)qi * H + hb) * MLA_LAT + 128 * w + 4 * t4;
#pragma unroll
    for (int ks = 0; ks < 8; ks++) {
      va[ks] = ha < H ? *(const float4*)(qa0 + 16 * ks) : zero4;
      vb[ks] = hb < H ? *(const float4*)(qb0 + 16 * ks) : zero4;
    }
    const float4 ra = ha < H ? *(const float4*)(qp + ((size_t)qi * H + ha) * MLA_ROPE + 16 * w + 4 * t4) : zero4;
    const float4 rb = hb < H ? *(const float4*)(qp + ((size_t)qi * H + hb) * MLA_ROPE + 16 * w + 4 * t4) : zero4;
    float ma = 0.0f, mb = 0.0f;
#pragma unroll
    for (int ks = 0; ks < 8; ks++) {
      ma = fmaxf(ma, fmaxf(fmaxf(fabsf(va[ks].x), fabsf(va[ks].y)), fmaxf(fabsf(va[ks].z), fabsf(va[ks].w))));
      mb = fmaxf(mb, fmaxf(fmaxf(fabsf(vb[ks].x), fabsf(vb[ks].y)), fmaxf(fabsf(vb[ks].z), fabsf(vb[ks].w))));
    }
    ma = fmaxf(ma, __shfl_xor_sync(0xffffffffu, ma, 1));
    ma = fmaxf(ma, __shfl_xor_sync(0xffffffffu, ma, 2));
    mb = fmaxf(mb, __shfl_xor_sync(0xffffffffu, mb, 1));
    mb = fmaxf(mb, __shfl_xor_sync(0xffffffffu, mb, 2));
    const int ea = mtf_qexp(ma), eb = mtf_qexp(mb);
    const float fa = mtf_pow2(ea), fb = mtf_pow2(eb);
    ia = mtf_pow2(-ea);
    ib = mtf_pow2(-eb);
#pragma unroll
    for (int ks = 0; ks < 8; ks++) {
      mtf_splith<NP>(va[ks].x * fa, va[ks].y * fa, qa[ks][0]);
      mtf_splith<NP>(vb[ks].x * fb, vb[ks].y * fb, qa[ks][1]);
      mtf_splith<NP>(va[ks].z * fa, va[ks].w * fa, qa[ks][2]);
      mtf_splith<NP>(vb[ks].z * fb, vb[ks].w * fb, qa[ks][3]);
    }
    u32 qr[4][3];
    mt_split3(ra.x, ra.y, qr[0]);
    mt_split3(rb.x, rb.y, qr[1]);
    mt_split3(ra.z, ra.w, qr[2]);
    mt_split3(rb.z, rb.w, qr[3]);
#pragma unroll
    for (int i = 0; i < 12; i++) qrs[(w * 12 + i) * 32 + lane] = qr[i / 3][i % 3];
  }
  __syncwarp();
  float o[16][4];
#pragma unroll
  for (int j = 0; j < 16; j++) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
  float m0 = NEG_INF, m1 = NEG_INF, l0 = 0.0f, l1 = 0.0f;  // heads g and g+8 (l: this lane's share)
  int E = -126;  // 2^E above every group-w scale so far (warp-uniform)
  const u32 raw_base = mt_smem_addr(raw);
  int it = 0;
  for (int base = begin; base < count; base += MT_TT, it++) {
    const int rb = it % MTF_NR;
    // Tile it+NR's slots: loaded now, stored at the bottom (ring of NR+1:
    // tiles it..it+NR-1 are still read from it).
    int nslot = -1;
    const int fut = base + MTF_NR * MT_TT;
    if (tid < MT_TT && fut < count) nslot = mt_slot(indices, block_table, ld_idx, qi, len, count, fut + tid);
    asm volatile("cp.async.wait_group %0;" ::"n"(MTF_NR - 2) : "memory");
    __syncthreads();  // tile it has landed; tile it-1's raw buffer and red are consumed
    // Tile it+NR-1 into tile it-1's buffer (an empty group past the end).
    if (base + (MTF_NR - 1) * MT_TT < count) {
      mtf_issue(tid, raw + ((it + MTF_NR - 1) % MTF_NR) * MT_TT * MT_CH, cache,
                slots + ((it + MTF_NR - 1) % MTF_NS) * MT_TT);
    } else {
      asm volatile("cp.async.commit_group;" ::: "memory");
    }
    const int* sl = slots + (it % MTF_NS) * MT_TT;
    const u8* tb = (const u8*)(raw + rb * MT_TT * MT_CH);
    float s[4][4];
#pragma unroll
    for (int n = 0; n < 4; n++) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
    for (int ks = 0; ks < 8; ks++) {
      u32 kb[4][2];
#pragma unroll
      for (int n = 0; n < 4; n++) {
        const u32 x = *(const u32*)(tb + (8 * n + g) * MLA_TOK_BYTES + 128 * w + 16 * ks + 4 * t4);
        kb[n][0] = mtf_e4m3x2(x);
        kb[n][1] = mtf_e4m3x2(x >> 16);
      }
#pragma unroll
      for (int p = 0; p < NP; p++) {
        const u32 a[4] = {qa[ks][0][p], qa[ks][1][p], qa[ks][2][p], qa[ks][3][p]};
#pragma unroll
        for (int n = 0; n < 4; n++) mtf_mma_h(s[n], a, kb[n][0], kb[n][1]);
      }
    }
    // Group-w scales of this thread's tokens 8n + 2t4 + {0, 1}: the latent
    // partials back to the true scale (2^-e exact, then the group scale),
    // then the RoPE k-step (bf16 as stored: dims 16w + 4t4 .. +3 of token
    // 8n + g) into the same accumulators, as tcp orders it.
    float sc[4][2];
#pragma unroll
    for (int n = 0; n < 4; n++) {
      sc[n][0] = *(const float*)(tb + (8 * n + 2 * t4) * MLA_TOK_BYTES + MLA_LAT + 4 * w);
      sc[n][1] = *(const float*)(tb + (8 * n + 2 * t4 + 1) * MLA_TOK_BYTES + MLA_LAT + 4 * w);
      s[n][0] = s[n][0] * ia * sc[n][0];
      s[n][1] = s[n][1] * ia * sc[n][1];
      s[n][2] = s[n][2] * ib * sc[n][0];
      s[n][3] = s[n][3] * ib * sc[n][1];
      const uint2 kv = *(const uint2*)(tb + (8 * n + g) * MLA_TOK_BYTES + MLA_LAT + 16 + 32 * w + 8 * t4);
#pragma unroll
      for (int p = 0; p < 3; p++) {
        const u32* qw = qrs + w * 12 * 32 + lane;
        const u32 a[4] = {qw[(0 * 3 + p) * 32], qw[(1 * 3 + p) * 32], qw[(2 * 3 + p) * 32], qw[(3 * 3 + p) * 32]};
        mt_mma(s[n], a, kv.x, kv.y);
      }
    }
    float* rw = red + w * MT_HG * MT_TT;
#pragma unroll
    for (int n = 0; n < 4; n++) {
      *(float2*)(rw + g * MT_TT + 8 * n + 2 * t4) = make_float2(s[n][0], s[n][1]);
      *(float2*)(rw + (g + 8) * MT_TT + 8 * n + 2 * t4) = make_float2(s[n][2], s[n][3]);
    }
    __syncthreads();
    float mx0 = NEG_INF, mx1 = NEG_INF;
#pragma unroll
    for (int n = 0; n < 4; n++) {
#pragma unroll
      for (int hr = 0; hr < 2; hr++) {
        const int row = g + 8 * hr, col = 8 * n + 2 * t4;
        float2 v = make_float2(0.0f, 0.0f);
#pragma unroll
        for (int ww = 0; ww < 4; ww++) {
          const float2 x = *(const float2*)(red + (ww * MT_HG + row) * MT_TT + col);
          v.x += x.x;
          v.y += x.y;
        }
        s[n][2 * hr] = sl[col] >= 0 ? v.x * scale : NEG_INF;
        s[n][2 * hr + 1] = sl[col + 1] >= 0 ? v.y * scale : NEG_INF;
      }
      mx0 = fmaxf(mx0, fmaxf(s[n][0], s[n][1]));
      mx1 = fmaxf(mx1, fmaxf(s[n][2], s[n][3]));
    }
    mt_softmax_step(s, mx0, mx1, m0, m1, l0, l1, o);
    // The P.V scale: 2^E above this tile's group-w scales too (skipped
    // slots have scale 0); o rescaled exactly when E grows.
    {
      float smax = 0.0f;
#pragma unroll
      for (int n = 0; n < 4; n++) smax = fmaxf(smax, fmaxf(sc[n][0], sc[n][1]));
      smax = fmaxf(smax, __shfl_xor_sync(0xffffffffu, smax, 1));
      smax = fmaxf(smax, __shfl_xor_sync(0xffffffffu, smax, 2));
      const int et = smax > 0.0f ? (int)((__float_as_uint(smax) >> 23) & 0xffu) - 126 : -126;
      if (et > E) {
        const float r = mtf_pow2(max(-126, E - et));
#pragma unroll
        for (int j = 0; j < 16; j++) {
          o[j][0] *= r;
          o[j][1] *= r;
          o[j][2] *= r;
          o[j][3] *= r;
        }
        E = min(et, 140);
      }
    }
    const float fe = mtf_pow2(max(-126, min(127, 14 - E)));
    const u32 tile_addr = raw_base + (u32)(rb * MT_TT * MT_CH * 16);
#pragma unroll
    for (int kk = 0; kk < 2; kk++) {
      // A: P of tokens 16kk + 2t4 (+1) and 16kk + 8 + 2t4 (+1), times the
      // token's scale and 2^(14-E), in three fp16 parts.
      const float fa0 = sc[2 * kk][0] * fe, fa1 = sc[2 * kk][1] * fe;
      const float fb0 = sc[2 * kk + 1][0] * fe, fb1 = sc[2 * kk + 1][1] * fe;
      u32 pp[4][NP];
      mtf_splith<NP>(s[2 * kk][0] * fa0, s[2 * kk][1] * fa1, pp[0]);
      mtf_splith<NP>(s[2 * kk][2] * fa0, s[2 * kk][3] * fa1, pp[1]);
      mtf_splith<NP>(s[2 * kk + 1][0] * fb0, s[2 * kk + 1][1] * fb1, pp[2]);
      mtf_splith<NP>(s[2 * kk + 1][2] * fb0, s[2 * kk + 1][3] * fb1, pp[3]);
      const u32 p0[4] = {pp[0][0], pp[1][0], pp[2][0], pp[3][0]};
      const u32 p1[4] = {pp[0][1], pp[1][1], pp[2][1], pp[3][1]};
      const u32 p2[4] = {pp[0][NP - 1], pp[1][NP - 1], pp[2][NP - 1], pp[3][NP - 1]};
      // ldmatrix.trans x4 over the raw rows: matrix mi = tokens 16kk +
      // 8(mi&1) .. +7, bytes 128w + 16(cc + (mi>>1)) .. +15. Thread (g, t4)
      // gets, per matrix, bytes 2g, 2g+1 of tokens 2t4 and 2t4+1: permuted
      // to (2t4, 2t4+1) of column 2g (low half) and of column 2g+1 (high).
      const int mi = lane >> 3;
      const u32 a0 = tile_addr + (u32)((16 * kk + 8 * (mi & 1) + (lane & 7)) * MLA_TOK_BYTES + 128 * w + 16 * (mi >> 1));
#pragma unroll
      for (int cp = 0; cp < 4; cp++) {
        u32 r0, r1, r2, r3;
        mtp_ldsm4t(a0 + 32u * cp, r0, r1, r2, r3);
        const u32 y0 = __byte_perm(r0, 0u, 0x3120), y1 = __byte_perm(r1, 0u, 0x3120);
        const u32 y2 = __byte_perm(r2, 0u, 0x3120), y3 = __byte_perm(r3, 0u, 0x3120);
        // n-tile 2cc (even columns) and 2cc+1 (odd) of chunk cc = 2cp, then 2cp+1.
        const u32 e0 = mtf_e4m3x2(y0), e1 = mtf_e4m3x2(y1), d0 = mtf_e4m3x2(y0 >> 16), d1 = mtf_e4m3x2(y1 >> 16);
        const u32 e2 = mtf_e4m3x2(y2), e3 = mtf_e4m3x2(y3), d2 = mtf_e4m3x2(y2 >> 16), d3 = mtf_e4m3x2(y3 >> 16);
        mtf_mma_h(o[4 * cp], p0, e0, e1);
        mtf_mma_h(o[4 * cp + 1], p0, d0, d1);
        mtf_mma_h(o[4 * cp + 2], p0, e2, e3);
        mtf_mma_h(o[4 * cp + 3], p0, d2, d3);
        mtf_mma_h(o[4 * cp], p1, e0, e1);
        mtf_mma_h(o[4 * cp + 1], p1, d0, d1);
        mtf_mma_h(o[4 * cp + 2], p1, e2, e3);
        mtf_mma_h(o[4 * cp + 3], p1, d2, d3);
        if (NP == 3) {
          mtf_mma_h(o[4 * cp], p2, e0, e1);
          mtf_mma_h(o[4 * cp + 1], p2, d0, d1);
          mtf_mma_h(o[4 * cp + 2], p2, e2, e3);
          mtf_mma_h(o[4 * cp + 3], p2, d2, d3);
        }
      }
    }
    if (tid < MT_TT) slots[((it + MTF_NR) % MTF_NS) * MT_TT + tid] = nslot;
  }
  asm volatile("cp.async.wait_all;" ::: "memory");
  l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
  l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
  // o back to the true scale; o[2cc + par][e] holds column 128w + 16cc +
  // 4t4 + par + 2(e & 1) of head g (e < 2) or g + 8.
  const float ue = mtf_pow2(max(-126, min(127, E - 14)));
#pragma unroll
  for (int hr = 0; hr < 2; hr++) {
    const int h = h0 + g + 8 * hr;
    if (h >= H) continue;
    const size_t qh = (size_t)qi * H + h;
    const float m = hr ? m1 : m0, l = hr ? l1 : l0;
    float f = ue;
    float* po;
    if (gridDim.x > 1) {
      const size_t pz = qh * gridDim.x + z;
      po = part_o + pz * MLA_LAT + 128 * w + 4 * t4;
      if (w == 0 && t4 == 0) {
        part_ml[2 * pz] = m;
        part_ml[2 * pz + 1] = l;
      }
    } else {
      f = l > 0.0f ? ue / l : 0.0f;
      po = out + qh * MLA_LAT + 128 * w + 4 * t4;
      if (lse && w == 0 && t4 == 0) lse[qh] = l > 0.0f ? m + logf(l) : NEG_INF;
    }
#pragma unroll
    for (int cc = 0; cc < 8; cc++)
      *(float4*)(po + 16 * cc) = make_float4(o[2 * cc][2 * hr] * f, o[2 * cc + 1][2 * hr] * f,
                                             o[2 * cc][2 * hr + 1] * f, o[2 * cc + 1][2 * hr + 1] * f);
  }
}

extern "C" __global__ void __launch_bounds__(128, 2) mla_decode_tcf(MT_ARGS, const long long* __restrict__ row_base) {
  PDL_WAIT();
  mtf_body<>(qn, qp, cache, block_table, indices, ld_idx, nidx, lens, out, lse, H, scale, tps, part_o, part_ml, row_base);
}
// Two fp16 parts of the queries and probabilities (timing comparison:
// a third fewer mma; ~2^-22 relative products, not float32-exact).
extern "C" __global__ void __launch_bounds__(128, 2) mla_decode_tcf2(MT_ARGS, const long long* __restrict__ row_base) {
  PDL_WAIT();
  mtf_body<2>(qn, qp, cache, block_table, indices, ld_idx, nidx, lens, out, lse, H, scale, tps, part_o, part_ml, row_base);
}
#else
extern "C" __global__ void __launch_bounds__(128) mla_decode_tcf2(MT_ARGS, const long long* __restrict__ row_base) { __trap(); }
extern "C" __global__ void __launch_bounds__(128) mla_decode_tcf(MT_ARGS, const long long* __restrict__ row_base) {
  PDL_WAIT();
  __trap();
}
#endif
