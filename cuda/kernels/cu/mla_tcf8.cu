// mla_decode_tcf8: mla_decode_tcf2's arithmetic (two fp16 parts of the
// queries and probabilities) with 8 warps per head
// group instead of 4: warp w takes 64 latent dims (4 k-steps, its half of
// scale group w/2) of the scores and the same 64 output columns of P.V, the
// RoPE k-steps on warps 0-3. Each warp holds half of tcf's query fragments
// and accumulators (<= 128 registers), so two blocks of 8 warps fit an SM:
// 16 warps to hide the per-tile chain's latencies instead of 8. The partial
// scores of 8 warps meet in shared memory. Split + combine (no cluster).

#define MT8_W 8                      // warps per head group
#define MT8_DW (MLA_LAT / MT8_W)     // latent dims (and output columns) of a warp: 64
#define MT8_NR 4                     // raw tiles in flight
#define MT8_NS (MT8_NR + 1)
// Dynamic shared memory (MLATCF8SmemBytes in ops_mla_tcf.go): NR raw tiles,
// partial scores of 8 warps, NS x token slots, RoPE query parts of warps 0-3.
#define MT8_SMEM_BYTES (MT8_NR * MT_TT * MT_CH * 16 + MT8_W * MT_HG * MT_TT * 4 + MT8_NS * MT_TT * 4 + 4 * 12 * 32 * 4)

#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
__device__ __forceinline__ void mt8_issue(int tid, uint4* raw, const u8* __restrict__ cache, const int* slots) {
  mtf_issue_n<32 * MT8_W>(tid, raw, cache, slots);
}

__device__ __forceinline__ void mt8_body(const float* __restrict__ qn, const float* __restrict__ qp,
                                         const u8* __restrict__ cache, const int* __restrict__ block_table,
                                         const int* __restrict__ indices, int ld_idx, int nidx,
                                         const int* __restrict__ lens, float* out, float* lse, int H, float scale,
                                         int tps, float* part_o, float* part_ml,
                                         const long long* __restrict__ row_base) {
  extern __shared__ uint4 mt_smem[];
  uint4* raw = mt_smem;                                     // [NR][TT][41] raw entries
  float* red = (float*)(raw + MT8_NR * MT_TT * MT_CH);      // [8 warps][HG][TT] partial scores
  int* slots = (int*)(red + MT8_W * MT_HG * MT_TT);         // [NS][TT]
  u32* qrs = (u32*)(slots + MT8_NS * MT_TT);                // [4 warps][12][32] RoPE query parts
  const int z = blockIdx.x, qi = blockIdx.y, h0 = blockIdx.z * MT_HG;
  const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5, g = lane >> 2, t4 = lane & 3;
  const int gw = w >> 1;  // scale group of the warp's dims
  if (row_base) cache += row_base[qi];
  const int len = lens[qi];
  const int begin = z * tps;
  const int count = min(indices ? nidx : len, begin + tps);
  mtf_slots0(slots, MT8_NR * MT_TT, 32 * MT8_W, tid, indices, block_table, ld_idx, nidx, qi, len, count, begin, begin + tps);
  __syncthreads();
#pragma unroll
  for (int b = 0; b < MT8_NR - 1; b++) {
    if (begin + b * MT_TT < count) {
      mt8_issue(tid, raw + b * MT_TT * MT_CH, cache, slots + b * MT_TT);
    } else {
      asm volatile("cp.async.commit_group;" ::: "memory");
    }
  }
  // Query fragments: latent k-steps ks of dims 64w + 16ks + 4t4 .. +3,
  // scaled per (head, warp) by a power of two, two fp16 parts; warps 0-3
  // also the RoPE k-step (dims 512 + 16w + 4t4 ..) in bf16 parts.
  u32 qa[4][4][2];
  float ia, ib;
  {
    const int ha = h0 + g, hb = h0 + g + 8;
    float4 va[4], vb[4];
    const float4 zero4 = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    const float* qa0 = qn + ((size_t)qi * H + ha) * MLA_LAT + MT8_DW * w + 4 * t4;
    const float* qb0 = qn + ((size_t)qi * H + hb) * MLA_LAT + MT8_DW * w + 4 * t4;
#pragma unroll
    for (int ks = 0; ks < 4; ks++) {
      va[ks] = ha < H ? *(const float4*)(qa0 + 16 * ks) : zero4;
      vb[ks] = hb < H ? *(const float4*)(qb0 + 16 * ks) : zero4;
    }
    float ma = 0.0f, mb = 0.0f;
#pragma unroll
    for (int ks = 0; ks < 4; ks++) {
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
    for (int ks = 0; ks < 4; ks++) {
      mtf_splith<2>(va[ks].x * fa, va[ks].y * fa, qa[ks][0]);
      mtf_splith<2>(vb[ks].x * fb, vb[ks].y * fb, qa[ks][1]);
      mtf_splith<2>(va[ks].z * fa, va[ks].w * fa, qa[ks][2]);
      mtf_splith<2>(vb[ks].z * fb, vb[ks].w * fb, qa[ks][3]);
    }
    if (w < 4) {
      const float4 ra = ha < H ? *(const float4*)(qp + ((size_t)qi * H + ha) * MLA_ROPE + 16 * w + 4 * t4) : zero4;
      const float4 rb = hb < H ? *(const float4*)(qp + ((size_t)qi * H + hb) * MLA_ROPE + 16 * w + 4 * t4) : zero4;
      u32 qr[4][3];
      mt_split3(ra.x, ra.y, qr[0]);
      mt_split3(rb.x, rb.y, qr[1]);
      mt_split3(ra.z, ra.w, qr[2]);
      mt_split3(rb.z, rb.w, qr[3]);
#pragma unroll
      for (int i = 0; i < 12; i++) qrs[(w * 12 + i) * 32 + lane] = qr[i / 3][i % 3];
    }
  }
  __syncwarp();
  float o[8][4];
#pragma unroll
  for (int j = 0; j < 8; j++) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
  float m0 = NEG_INF, m1 = NEG_INF, l0 = 0.0f, l1 = 0.0f;
  int E = -126;
  const u32 raw_base = mt_smem_addr(raw);
  int it = 0;
  for (int base = begin; base < count; base += MT_TT, it++) {
    const int rb = it % MT8_NR;
    int nslot = -1;
    const int fut = base + MT8_NR * MT_TT;
    if (tid < MT_TT && fut < count) nslot = mt_slot(indices, block_table, ld_idx, qi, len, count, fut + tid);
    asm volatile("cp.async.wait_group %0;" ::"n"(MT8_NR - 2) : "memory");
    __syncthreads();
    if (base + (MT8_NR - 1) * MT_TT < count) {
      mt8_issue(tid, raw + ((it + MT8_NR - 1) % MT8_NR) * MT_TT * MT_CH, cache, slots + ((it + MT8_NR - 1) % MT8_NS) * MT_TT);
    } else {
      asm volatile("cp.async.commit_group;" ::: "memory");
    }
    const int* sl = slots + (it % MT8_NS) * MT_TT;
    const u8* tb = (const u8*)(raw + rb * MT_TT * MT_CH);
    float s[4][4];
#pragma unroll
    for (int n = 0; n < 4; n++) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
    for (int ks = 0; ks < 4; ks++) {
      u32 kb[4][2];
#pragma unroll
      for (int n = 0; n < 4; n++) {
        const u32 x = *(const u32*)(tb + (8 * n + g) * MLA_TOK_BYTES + MT8_DW * w + 16 * ks + 4 * t4);
        kb[n][0] = mtf_e4m3x2(x);
        kb[n][1] = mtf_e4m3x2(x >> 16);
      }
#pragma unroll
      for (int p = 0; p < 2; p++) {
        const u32 a[4] = {qa[ks][0][p], qa[ks][1][p], qa[ks][2][p], qa[ks][3][p]};
#pragma unroll
        for (int n = 0; n < 4; n++) mtf_mma_h(s[n], a, kb[n][0], kb[n][1]);
      }
    }
    float sc[4][2];
#pragma unroll
    for (int n = 0; n < 4; n++) {
      sc[n][0] = *(const float*)(tb + (8 * n + 2 * t4) * MLA_TOK_BYTES + MLA_LAT + 4 * gw);
      sc[n][1] = *(const float*)(tb + (8 * n + 2 * t4 + 1) * MLA_TOK_BYTES + MLA_LAT + 4 * gw);
      s[n][0] = s[n][0] * ia * sc[n][0];
      s[n][1] = s[n][1] * ia * sc[n][1];
      s[n][2] = s[n][2] * ib * sc[n][0];
      s[n][3] = s[n][3] * ib * sc[n][1];
    }
    if (w < 4) {
#pragma unroll
      for (int n = 0; n < 4; n++) {
        const uint2 kv = *(const uint2*)(tb + (8 * n + g) * MLA_TOK_BYTES + MLA_LAT + 16 + 32 * w + 8 * t4);
#pragma unroll
        for (int p = 0; p < 3; p++) {
          const u32* qw = qrs + w * 12 * 32 + lane;
          const u32 a[4] = {qw[(0 * 3 + p) * 32], qw[(1 * 3 + p) * 32], qw[(2 * 3 + p) * 32], qw[(3 * 3 + p) * 32]};
          mt_mma(s[n], a, kv.x, kv.y);
        }
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
        for (int ww = 0; ww < MT8_W; ww++) {
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
    {
      // mt_softmax_step over 8 output n-tiles.
      mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
      mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
      mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
      mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
      const float nm0 = fmaxf(m0, mx0), nm1 = fmaxf(m1, mx1);
      const float c0 = nm0 == NEG_INF ? 1.0f : expf(m0 - nm0);
      const float c1 = nm1 == NEG_INF ? 1.0f : expf(m1 - nm1);
      float ls0 = 0.0f, ls1 = 0.0f;
#pragma unroll
      for (int n = 0; n < 4; n++) {
        s[n][0] = nm0 == NEG_INF ? 0.0f : expf(s[n][0] - nm0);
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
      float smax = 0.0f;
#pragma unroll
      for (int n = 0; n < 4; n++) smax = fmaxf(smax, fmaxf(sc[n][0], sc[n][1]));
      smax = fmaxf(smax, __shfl_xor_sync(0xffffffffu, smax, 1));
      smax = fmaxf(smax, __shfl_xor_sync(0xffffffffu, smax, 2));
      const int et = smax > 0.0f ? (int)((__float_as_uint(smax) >> 23) & 0xffu) - 126 : -126;
      float r = 1.0f;
      if (et > E) {
        r = mtf_pow2(max(-126, E - et));
        E = min(et, 140);
      }
      const float r0 = c0 * r, r1 = c1 * r;
#pragma unroll
      for (int j = 0; j < 8; j++) {
        o[j][0] *= r0;
        o[j][1] *= r0;
        o[j][2] *= r1;
        o[j][3] *= r1;
      }
    }
    const float fe = mtf_pow2(max(-126, min(127, 14 - E)));
    const u32 tile_addr = raw_base + (u32)(rb * MT_TT * MT_CH * 16);
#pragma unroll
    for (int kk = 0; kk < 2; kk++) {
      const float fa0 = sc[2 * kk][0] * fe, fa1 = sc[2 * kk][1] * fe;
      const float fb0 = sc[2 * kk + 1][0] * fe, fb1 = sc[2 * kk + 1][1] * fe;
      u32 pp[4][2];
      mtf_splith<2>(s[2 * kk][0] * fa0, s[2 * kk][1] * fa1, pp[0]);
      mtf_splith<2>(s[2 * kk][2] * fa0, s[2 * kk][3] * fa1, pp[1]);
      mtf_splith<2>(s[2 * kk + 1][0] * fb0, s[2 * kk + 1][1] * fb1, pp[2]);
      mtf_splith<2>(s[2 * kk + 1][2] * fb0, s[2 * kk + 1][3] * fb1, pp[3]);
      const int mi = lane >> 3;
      const u32 a0 = tile_addr + (u32)((16 * kk + 8 * (mi & 1) + (lane & 7)) * MLA_TOK_BYTES + MT8_DW * w + 16 * (mi >> 1));
#pragma unroll
      for (int cp = 0; cp < MT8_DW / 32; cp++) {
        u32 r0, r1, r2, r3;
        mtp_ldsm4t(a0 + 32u * cp, r0, r1, r2, r3);
        const u32 y0 = __byte_perm(r0, 0u, 0x3120), y1 = __byte_perm(r1, 0u, 0x3120);
        const u32 y2 = __byte_perm(r2, 0u, 0x3120), y3 = __byte_perm(r3, 0u, 0x3120);
        const u32 e0 = mtf_e4m3x2(y0), e1 = mtf_e4m3x2(y1), d0 = mtf_e4m3x2(y0 >> 16), d1 = mtf_e4m3x2(y1 >> 16);
        const u32 e2 = mtf_e4m3x2(y2), e3 = mtf_e4m3x2(y3), d2 = mtf_e4m3x2(y2 >> 16), d3 = mtf_e4m3x2(y3 >> 16);
#pragma unroll
        for (int p = 0; p < 2; p++) {
          const u32 a[4] = {pp[0][p], pp[1][p], pp[2][p], pp[3][p]};
          mtf_mma_h(o[4 * cp], a, e0, e1);
          mtf_mma_h(o[4 * cp + 1], a, d0, d1);
          mtf_mma_h(o[4 * cp + 2], a, e2, e3);
          mtf_mma_h(o[4 * cp + 3], a, d2, d3);
        }
      }
    }
    if (tid < MT_TT) slots[((it + MT8_NR) % MT8_NS) * MT_TT + tid] = nslot;
  }
  asm volatile("cp.async.wait_all;" ::: "memory");
  l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
  l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
  // o[2cc + par][e]: column 64w + 16cc + 4t4 + par + 2(e & 1) of head g
  // (e < 2) or g + 8.
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
      po = part_o + pz * MLA_LAT + MT8_DW * w + 4 * t4;
      if (w == 0 && t4 == 0) {
        part_ml[2 * pz] = m;
        part_ml[2 * pz + 1] = l;
      }
    } else {
      f = l > 0.0f ? ue / l : 0.0f;
      po = out + qh * MLA_LAT + MT8_DW * w + 4 * t4;
      if (lse && w == 0 && t4 == 0) lse[qh] = l > 0.0f ? m + logf(l) : NEG_INF;
    }
#pragma unroll
    for (int cc = 0; cc < MT8_DW / 16; cc++)
      *(float4*)(po + 16 * cc) = make_float4(o[2 * cc][2 * hr] * f, o[2 * cc + 1][2 * hr] * f,
                                             o[2 * cc][2 * hr + 1] * f, o[2 * cc + 1][2 * hr + 1] * f);
  }
}

extern "C" __global__ void __launch_bounds__(256, 2) mla_decode_tcf8(MT_ARGS, const long long* __restrict__ row_base) {
  PDL_WAIT();
  mt8_body(qn, qp, cache, block_table, indices, ld_idx, nidx, lens, out, lse, H, scale, tps, part_o, part_ml, row_base);
}
#else
extern "C" __global__ void __launch_bounds__(256) mla_decode_tcf8(MT_ARGS, const long long* __restrict__ row_base) {
  PDL_WAIT();
  __trap();
}
#endif
