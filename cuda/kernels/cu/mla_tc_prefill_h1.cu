// mla_prefill_h1: sparse MLA for the many rows of a prefill chunk with ONE
// fp16 part of the queries, keys, values and probabilities (FlashMLA's
// sparse prefill does its math in bf16; fp16's 11 bits are 4x finer), for
// serving mode only (engine: TILERT_GPU_MLA_PREFILL=4; exact mode never
// reaches it). The other prefill kernels (mla_tc_prefill.cu) split q and p
// into three bf16 parts for float32-exact products, which costs 3x the mma
// and keeps 16 heads a block; here the block runs 64 heads of one query row
// with all products single fp16 mma.sync m16n8k16 (f32 accumulate).
//
// Block: one query row (blockIdx.y), 64 heads (blockIdx.z), 256 threads.
// - Queries once per block: per head, the largest |q| over its 576 dims
//   (latent and RoPE alike) picks a power of two 2^e that puts it in
//   [2^14, 2^15); q x 2^e rounded to fp16 into shared memory (exact
//   scaling, one rounding); 2^-e folds into the per-head score factor with
//   the softmax scale and log2(e).
// - Tiles of 64 selected entries (656 bytes each) gathered with cp.async
//   into one raw buffer; the next tile's gather is issued as soon as this
//   tile is converted, so it has a whole tile's math to land (the 5.4 MB
//   cache of 8192 tokens stays in L2).
// - Conversion once per tile for all 64 heads: each e4m3 pair to fp16
//   (exact), times the group scale as fp16(scale x 2^-E) then 2^E (E the
//   scale's exponent, so the scale's fp16 keeps 11 bits whatever its size):
//   the dequantised latent rounded to fp16; the bf16 RoPE part to fp16
//   (exact for |x| in [2^-14, 65504]). Skipped slots (-1, past the row's
//   length, past nidx) are zero rows and masked scores. The same fp16 tile
//   is the keys of QK^T and the values of P.V.
// - QK^T: warp w takes heads 16(w&3).. and tokens 32(w>>2).. of the tile
//   (36 k-steps of 16, ldmatrix fragments); the two warps of a head group
//   exchange their row maxima through shared memory, compute the same new
//   running max, and write exp2(s - m) as fp16 P into shared memory.
// - Tiles without a valid slot are skipped (the same bits: they change
//   nothing), so a causal prefill's short rows cost only their valid tiles.
// - P.V: warp w takes output columns [64w, 64w+64) for all 64 heads
//   (4 m-tiles x 8 n-tiles, 128 float accumulators a thread): P and V by
//   ldmatrix (V transposed), O rescaled by the per-head factor first.
// Unsplit (gridDim.x must be 1): the output is normalised here, lse in
// natural-log units as the other MLA kernels write it.
// Shared memory: raw 41,984 + Kt 74,752 + Qs 74,752 + P 9,216 + 2,560 =
// 203,008 bytes (one block an SM). NOT yet run on a GPU when written.

#define MH1_T 64    // tokens per tile
#define MH1_HB 64   // heads per block
#define MH1_KS 584  // halves per token row of the fp16 tile (576 + 8: conflict-free ldmatrix rows)
#define MH1_QS 584  // halves per head row of the fp16 queries
#define MH1_PS 72   // halves per head row of P (64 + 8)
#define MH1_SMEM_BYTES                                                                                         \
  (MH1_T * MLA_TOK_BYTES + MH1_T * MH1_KS * 2 + MH1_HB * MH1_QS * 2 + MH1_HB * MH1_PS * 2 + 2 * MH1_HB * 4 + MH1_HB * 4 + \
   MH1_HB * 4 + 2 * MH1_HB * 4 + 3 * MH1_T * 4)

#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 890
__device__ __forceinline__ u32 mh1_e4m3x2(u32 v) {
  u32 r;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(r) : "h"((u16)(v & 0xffffu)));
  return r;
}

__device__ __forceinline__ u32 mh1_hmul2(u32 a, u32 b) {
  u32 r;
  asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
  return r;
}

// Two floats to packed fp16, round to nearest even (lo in the low half).
__device__ __forceinline__ u32 mh1_f16x2(float lo, float hi) {
  u32 r;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

__device__ __forceinline__ void mh1_mma(float* c, const u32* a, u32 b0, u32 b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void mh1_ldsm4(u32 addr, u32* r) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

__device__ __forceinline__ void mh1_ldsm4t(u32 addr, u32* r) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// A group scale as two fp16 factors (both halves of each word): m = scale x
// 2^-E in [1, 2) rounded to fp16 and 2^E exact, E = the scale's exponent
// clamped to fp16's [-24, 15] (fp16 holds 2^-24 .. 2^15 exactly).
__device__ __forceinline__ void mh1_scale(float sc, u32& m2, u32& p2) {
  int E = (int)((__float_as_uint(sc) >> 23) & 0xffu) - 127;
  E = min(max(E, -24), 15);
  const float m = sc * __uint_as_float((u32)(127 - E) << 23);
  u16 mh;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(mh) : "f"(m));
  const u32 ph = E >= -14 ? (u32)(E + 15) << 10 : 1u << (E + 24);
  m2 = (u32)mh | ((u32)mh << 16);
  p2 = ph | (ph << 16);
}

// The tile's gather: 64 entries x 41 chunks of 16 bytes; skipped slots
// are left as they are (the conversion writes zeros for them).
__device__ __forceinline__ void mh1_issue(u8* raw, const u8* __restrict__ cache, const int* sl) {
  const u32 base = mt_smem_addr(raw);
  for (int c = threadIdx.x; c < MH1_T * MT_CH; c += 256) {
    const int j = c / MT_CH, p = c - j * MT_CH;
    const int t = sl[j];
    if (t < 0) continue;
    const u8* src = cache + (size_t)t * MLA_TOK_BYTES + p * 16;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(base + (u32)(j * MLA_TOK_BYTES + p * 16)), "l"(src)
                 : "memory");
  }
  asm volatile("cp.async.commit_group;" ::: "memory");
}

extern "C" __global__ void __launch_bounds__(256, 1) mla_prefill_h1(MT_ARGS) {
  PDL_WAIT();
  extern __shared__ uint4 mt_smem[];
  u8* raw = (u8*)mt_smem;                                 // [T][656] raw entries
  u16* Kt = (u16*)(raw + MH1_T * MLA_TOK_BYTES);           // [T][KS] fp16 keys = values (latent scaled, RoPE)
  u16* Qs = Kt + MH1_T * MH1_KS;                            // [HB][QS] fp16 queries x 2^e
  u16* Ps = Qs + MH1_HB * MH1_QS;                           // [HB][PS] fp16 probabilities of the tile
  float* redm = (float*)(Ps + MH1_HB * MH1_PS);             // [2 token halves][HB] row maxima
  float* alph = redm + 2 * MH1_HB;                         // [HB] the tile's rescale factor of O
  float* qsc = alph + MH1_HB;                              // [HB] score factor: scale x log2(e) x 2^-e
  float* lsum = qsc + MH1_HB;                              // [2][HB] row sums of each token half
  int* sl = (int*)(lsum + 2 * MH1_HB);                     // [3][T] cache slot of each tile slot, -1 skipped
  const int qi = blockIdx.y, h0 = blockIdx.z * MH1_HB;
  const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5, g = lane >> 2, t4 = lane & 3;
  const int len = lens[qi];
  const int count = min(indices ? nidx : len, tps);
  const int nt = (count + MH1_T - 1) / MH1_T;
  if (tid < 2 * MH1_T) sl[tid] = mt_slot(indices, block_table, ld_idx, qi, len, count, tid);
  __syncthreads();
  if (nt > 0) mh1_issue(raw, cache, sl);
  // Queries: warp w takes heads 8w..8w+7, two at a time (a lane: latent
  // float4s lane + 32i, RoPE float4 lane < 16).
  for (int hp = 0; hp < 8; hp += 2) {
    float4 v[2][5];
#pragma unroll
    for (int r = 0; r < 2; r++) {
      const int h = h0 + 8 * w + hp + r;
      const float4 z4 = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
      for (int i = 0; i < 5; i++) v[r][i] = z4;
      if (h < H) {
        const size_t qh = (size_t)qi * H + h;
#pragma unroll
        for (int i = 0; i < 4; i++) v[r][i] = ((const float4*)(qn + qh * MLA_LAT))[lane + 32 * i];
        if (lane < 16) v[r][4] = ((const float4*)(qp + qh * MLA_ROPE))[lane];
      }
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
      const int hh = 8 * w + hp + r;
      float mx = 0.0f;
#pragma unroll
      for (int i = 0; i < 5; i++)
        mx = fmaxf(mx, fmaxf(fmaxf(fabsf(v[r][i].x), fabsf(v[r][i].y)), fmaxf(fabsf(v[r][i].z), fabsf(v[r][i].w))));
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
      // 2^e puts mx in [2^14, 2^15); a zero row keeps e = 0.
      int e = mx > 0.0f ? 14 - ((int)((__float_as_uint(mx) >> 23) & 0xffu) - 127) : 0;
      e = min(max(e, -126), 126);
      const float f = __uint_as_float((u32)(127 + e) << 23);
      if (lane == 0) qsc[hh] = scale * 1.4426950408889634f * __uint_as_float((u32)(127 - e) << 23);
#pragma unroll
      for (int i = 0; i < 5; i++) {
        if (i == 4 && lane >= 16) continue;
        const int d = i < 4 ? 4 * (lane + 32 * i) : MLA_LAT + 4 * lane;
        *(uint2*)(Qs + hh * MH1_QS + d) =
            make_uint2(mh1_f16x2(v[r][i].x * f, v[r][i].y * f), mh1_f16x2(v[r][i].z * f, v[r][i].w * f));
      }
    }
  }
  // QK roles: head group hg (16 heads), token half th (32 tokens).
  const int hg = w & 3, th = w >> 2;
  const int hr0 = 16 * hg + g, hr1 = hr0 + 8;  // this lane's two score rows (block heads)
  const u32 qa_lane = mt_smem_addr(Qs) + (u32)((16 * hg + (lane & 7) + 8 * ((lane >> 3) & 1)) * MH1_QS + 8 * (lane >> 4)) * 2u;
  const u32 kb_lane = mt_smem_addr(Kt) + (u32)((32 * th + 8 * (lane >> 4) + (lane & 7)) * MH1_KS + 8 * ((lane >> 3) & 1)) * 2u;
  // P.V: A (P rows) and B (V transposed) lane addresses.
  const u32 pa_lane = mt_smem_addr(Ps) + (u32)(((lane & 7) + 8 * ((lane >> 3) & 1)) * MH1_PS + 8 * (lane >> 4)) * 2u;
  const u32 vb_lane = mt_smem_addr(Kt) + (u32)(((lane & 7) + 8 * ((lane >> 3) & 1)) * MH1_KS + 64 * w + 8 * (lane >> 4)) * 2u;
  float o[4][8][4];
#pragma unroll
  for (int a = 0; a < 4; a++)
#pragma unroll
    for (int b = 0; b < 8; b++) o[a][b][0] = o[a][b][1] = o[a][b][2] = o[a][b][3] = 0.0f;
  float m0 = NEG_INF, m1 = NEG_INF, l0 = 0.0f, l1 = 0.0f;  // rows hr0, hr1 (l: this lane's share of this half)
  for (int k = 0; k < nt; k++) {
    const int* slk = sl + (k % 3) * MH1_T;
    int nslot = -1;
    if (tid < MH1_T) nslot = mt_slot(indices, block_table, ld_idx, qi, len, count, (k + 2) * MH1_T + tid);
    asm volatile("cp.async.wait_all;" ::: "memory");
    // Tile k has landed; the previous tile's P.V is done with Kt. A tile
    // with no valid slot (the -1 padding of a causal row's short
    // selection) would leave m, l and O exactly as they are (max with
    // -inf, factor 1, P = 0): skip its math, issue the next tile.
    if (!__syncthreads_or(tid < MH1_T && slk[tid] >= 0)) {
      if (k + 1 < nt) mh1_issue(raw, cache, sl + ((k + 1) % 3) * MH1_T);
      if (tid < MH1_T) sl[((k + 2) % 3) * MH1_T + tid] = nslot;
      continue;
    }
    // Latent: 16 units of 8 bytes a thread (token 4i + tid/64, unit tid%64, group (tid%64)/16).
#pragma unroll 2
    for (int i = 0; i < 16; i++) {
      const int j = 4 * i + (tid >> 6), s8 = tid & 63;
      uint4 hv = make_uint4(0u, 0u, 0u, 0u);
      if (slk[j] >= 0) {
        const u8* rj = raw + j * MLA_TOK_BYTES;
        const uint2 b = *(const uint2*)(rj + 8 * s8);
        u32 m2, p2;
        mh1_scale(*(const float*)(rj + MLA_LAT + 4 * (s8 >> 4)), m2, p2);
        hv.x = mh1_hmul2(mh1_hmul2(mh1_e4m3x2(b.x), m2), p2);
        hv.y = mh1_hmul2(mh1_hmul2(mh1_e4m3x2(b.x >> 16), m2), p2);
        hv.z = mh1_hmul2(mh1_hmul2(mh1_e4m3x2(b.y), m2), p2);
        hv.w = mh1_hmul2(mh1_hmul2(mh1_e4m3x2(b.y >> 16), m2), p2);
      }
      *(uint4*)(Kt + j * MH1_KS + 8 * s8) = hv;
    }
    // RoPE: 2 units of 8 bf16 a thread (token c/8, unit c%8).
#pragma unroll
    for (int i = 0; i < 2; i++) {
      const int c = 256 * i + tid, j = c >> 3, r = c & 7;
      uint4 hv = make_uint4(0u, 0u, 0u, 0u);
      if (slk[j] >= 0) {
        const uint4 b = *(const uint4*)(raw + j * MLA_TOK_BYTES + 528 + 16 * r);
        hv.x = mh1_f16x2(__uint_as_float(b.x << 16), __uint_as_float(b.x & 0xffff0000u));
        hv.y = mh1_f16x2(__uint_as_float(b.y << 16), __uint_as_float(b.y & 0xffff0000u));
        hv.z = mh1_f16x2(__uint_as_float(b.z << 16), __uint_as_float(b.z & 0xffff0000u));
        hv.w = mh1_f16x2(__uint_as_float(b.w << 16), __uint_as_float(b.w & 0xffff0000u));
      }
      *(uint4*)(Kt + j * MH1_KS + MLA_LAT + 8 * r) = hv;
    }
    __syncthreads();  // the fp16 tile is ready; raw is free
    if (k + 1 < nt) mh1_issue(raw, cache, sl + ((k + 1) % 3) * MH1_T);
    // S[16 heads][32 tokens] over 576 dims.
    float s[4][4];
#pragma unroll
    for (int n = 0; n < 4; n++) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll 6
    for (int ks = 0; ks < 36; ks++) {
      u32 a[4], b[8];
      mh1_ldsm4(qa_lane + 32u * ks, a);
      mh1_ldsm4(kb_lane + 32u * ks, b);
      mh1_ldsm4(kb_lane + (u32)(16 * MH1_KS * 2) + 32u * ks, b + 4);
#pragma unroll
      for (int n = 0; n < 4; n++) mh1_mma(s[n], a, b[2 * n], b[2 * n + 1]);
    }
    // Scores in log2 units, masked; this half's row maxima.
    const float f0 = qsc[hr0], f1 = qsc[hr1];
    float mx0 = NEG_INF, mx1 = NEG_INF;
#pragma unroll
    for (int n = 0; n < 4; n++) {
      const int col = 32 * th + 8 * n + 2 * t4;
      const bool va = slk[col] >= 0, vb = slk[col + 1] >= 0;
      s[n][0] = va ? s[n][0] * f0 : NEG_INF;
      s[n][1] = vb ? s[n][1] * f0 : NEG_INF;
      s[n][2] = va ? s[n][2] * f1 : NEG_INF;
      s[n][3] = vb ? s[n][3] * f1 : NEG_INF;
      mx0 = fmaxf(mx0, fmaxf(s[n][0], s[n][1]));
      mx1 = fmaxf(mx1, fmaxf(s[n][2], s[n][3]));
    }
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
    if (t4 == 0) {
      redm[th * MH1_HB + hr0] = mx0;
      redm[th * MH1_HB + hr1] = mx1;
    }
    __syncthreads();  // both halves' maxima are in
    {
      // Both warps of a head group compute the same new max (max is exact).
      const float nm0 = fmaxf(m0, fmaxf(redm[hr0], redm[MH1_HB + hr0]));
      const float nm1 = fmaxf(m1, fmaxf(redm[hr1], redm[MH1_HB + hr1]));
      const float al0 = nm0 == NEG_INF ? 1.0f : exp2f(m0 - nm0);  // first valid tile: 0 (o and l are 0)
      const float al1 = nm1 == NEG_INF ? 1.0f : exp2f(m1 - nm1);
      float ls0 = 0.0f, ls1 = 0.0f;
#pragma unroll
      for (int n = 0; n < 4; n++) {
        s[n][0] = nm0 == NEG_INF ? 0.0f : exp2f(s[n][0] - nm0);  // skipped slot: 0
        s[n][1] = nm0 == NEG_INF ? 0.0f : exp2f(s[n][1] - nm0);
        s[n][2] = nm1 == NEG_INF ? 0.0f : exp2f(s[n][2] - nm1);
        s[n][3] = nm1 == NEG_INF ? 0.0f : exp2f(s[n][3] - nm1);
        ls0 += s[n][0] + s[n][1];
        ls1 += s[n][2] + s[n][3];
        const int col = 32 * th + 8 * n + 2 * t4;
        *(u32*)(Ps + hr0 * MH1_PS + col) = mh1_f16x2(s[n][0], s[n][1]);
        *(u32*)(Ps + hr1 * MH1_PS + col) = mh1_f16x2(s[n][2], s[n][3]);
      }
      l0 = l0 * al0 + ls0;
      l1 = l1 * al1 + ls1;
      m0 = nm0;
      m1 = nm1;
      if (th == 0 && t4 == 0) {
        alph[hr0] = al0;
        alph[hr1] = al1;
      }
    }
    __syncthreads();  // P and the rescale factors are in
    // O[64 heads][64 columns of warp w] = O x alpha + P . V.
#pragma unroll
    for (int mt = 0; mt < 4; mt++) {
      const float a0 = alph[16 * mt + g], a1 = alph[16 * mt + g + 8];
#pragma unroll
      for (int n = 0; n < 8; n++) {
        o[mt][n][0] *= a0;
        o[mt][n][1] *= a0;
        o[mt][n][2] *= a1;
        o[mt][n][3] *= a1;
      }
    }
#pragma unroll
    for (int kk = 0; kk < 4; kk++) {
      u32 pa[4][4], vb[4][4];
#pragma unroll
      for (int mt = 0; mt < 4; mt++) mh1_ldsm4(pa_lane + (u32)(16 * mt * MH1_PS * 2) + 32u * kk, pa[mt]);
#pragma unroll
      for (int jj = 0; jj < 4; jj++) mh1_ldsm4t(vb_lane + (u32)(16 * kk * MH1_KS * 2) + 32u * jj, vb[jj]);
#pragma unroll
      for (int mt = 0; mt < 4; mt++)
#pragma unroll
        for (int jj = 0; jj < 4; jj++) {
          mh1_mma(o[mt][2 * jj], pa[mt], vb[jj][0], vb[jj][1]);
          mh1_mma(o[mt][2 * jj + 1], pa[mt], vb[jj][2], vb[jj][3]);
        }
    }
    if (tid < MH1_T) sl[((k + 2) % 3) * MH1_T + tid] = nslot;
  }
  asm volatile("cp.async.wait_all;" ::: "memory");
  // Row sums: this lane's share, the quad, then the two token halves.
  l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
  l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
  if (t4 == 0) {
    lsum[th * MH1_HB + hr0] = l0;
    lsum[th * MH1_HB + hr1] = l1;
  }
  __syncthreads();
  if (lse && th == 0 && t4 == 0) {
#pragma unroll
    for (int hr = 0; hr < 2; hr++) {
      const int hb = hr ? hr1 : hr0, h = h0 + hb;
      const float l = lsum[hb] + lsum[MH1_HB + hb], m = hr ? m1 : m0;
      if (h < H) lse[(size_t)qi * H + h] = l > 0.0f ? m * 0.6931471805599453f + logf(l) : NEG_INF;
    }
  }
#pragma unroll
  for (int mt = 0; mt < 4; mt++) {
#pragma unroll
    for (int hr = 0; hr < 2; hr++) {
      const int hb = 16 * mt + g + 8 * hr, h = h0 + hb;
      if (h >= H) continue;
      const float l = lsum[hb] + lsum[MH1_HB + hb];
      const float inv = l > 0.0f ? 1.0f / l : 0.0f;
      float* po = out + ((size_t)qi * H + h) * MLA_LAT + 64 * w + 2 * t4;
#pragma unroll
      for (int n = 0; n < 8; n++) *(float2*)(po + 8 * n) = make_float2(o[mt][n][2 * hr] * inv, o[mt][n][2 * hr + 1] * inv);
    }
  }
}
#else
extern "C" __global__ void __launch_bounds__(256) mla_prefill_h1(MT_ARGS) {
  PDL_WAIT();
  __trap();
}
#endif
