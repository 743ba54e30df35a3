// MLA decode on tensor cores (same semantics and partial layout as
// mla_decode in mla.cu). MLA is multi-query attention in its latent space,
// so per query row it is two small GEMMs: S[16 heads][tokens] = Q [16][576]
// . K^T over the selected entries, and O[16][512] += P . C.
// A block takes 16 heads and a range of tokens; each 32-token tile of
// 656-byte entries is fetched once with cp.async (the next tile's fetch
// overlaps this tile's math; its token ids are read one tile ahead into
// shared memory, so no fetch waits on an index load), converted once into
// shared memory as bf16 (fp8 latent values and the bf16 RoPE part are exact
// in bf16; the group scales stay float32 beside them), and the four warps
// run mma.sync m16n8k16 (bf16 in, f32 accumulate). Warp w takes latent
// group w (columns [128w, 128w+128), whose scale it applies to its partial
// scores in float32) plus RoPE dims [512+16w, +16); the four partial scores
// meet in shared memory; then warp w accumulates the same 128 output
// columns from P times its group scale. Queries and probabilities are split
// into three bf16 parts (three mma each), so the products carry float32's
// 24 mantissa bits: float32 results, not bf16 ones (the tiny models' greedy
// and logprob checks against the CPU engine need that).
//
// Grid: x = token split z (tps tokens each), y = query row, z = head group
// of 16. 128 threads. With gridDim.x > 1 each block writes its unnormalised
// partial for mla_combine.

#define MT_HG 16                   // heads per block (the mma M)
#define MT_TT 32                   // tokens per tile
#define MT_KS 584                  // bf16 per token row in shared memory (576 + 8: conflict-free fragments)
#define MT_QS 584                  // floats per head row of the staged queries
#define MT_CH (MLA_TOK_BYTES / 16) // 16-byte chunks per entry (41)
// Dynamic shared memory of mla_decode_tc in bytes (MLATCSmemBytes in ops_mla.go):
// raw tile, bf16 tile, float queries, partial scores, 3 x token slots, scales.
// HP head groups of 16 per block (HP * 128 threads) share each converted tile.
#define MT_SMEM(HP)                                                                                          \
  (MT_TT * MT_CH * 16 + MT_TT * MT_KS * 2 + (HP) * MT_HG * MT_QS * 4 + (HP) * 4 * MT_HG * MT_TT * 4 + 3 * MT_TT * 4 + \
   MT_TT * 4 * 4)
#define MT_SMEM_BYTES MT_SMEM(1)

// The tensor-core MLA kernels' parameters (the real kernels and the
// stubs below sm_80 alike).
#define MT_ARGS                                                                                                     \
  const float *__restrict__ qn, const float *__restrict__ qp, const u8 *__restrict__ cache,                         \
      const int *__restrict__ block_table, const int *__restrict__ indices, int ld_idx, int nidx,                   \
      const int *__restrict__ lens, float *out, float *lse, int H, float scale, int tps, float *part_o,             \
      float *part_ml

// mma.sync, cp.async and the bf16x2 conversion need sm_80; older devices get
// a kernel that traps (the launcher refuses them first).
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
__device__ __forceinline__ u32 mt_smem_addr(const void* p) {
  u32 a;
  asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
  return a;
}

// Two floats to packed bf16, round to nearest even (lo in the low half).
__device__ __forceinline__ u32 mt_bf16x2(float lo, float hi) {
  u32 r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

// (a, b) = hi + mid + lo, each the bf16 rounding of what the previous parts
// leave: 24 mantissa bits, float32's precision (bf16 x bf16 products are
// exact in the float32 accumulator).
__device__ __forceinline__ void mt_split3(float a, float b, u32* p) {
  p[0] = mt_bf16x2(a, b);
  a -= __uint_as_float(p[0] << 16);
  b -= __uint_as_float(p[0] & 0xffff0000u);
  p[1] = mt_bf16x2(a, b);
  a -= __uint_as_float(p[1] << 16);
  b -= __uint_as_float(p[1] & 0xffff0000u);
  p[2] = mt_bf16x2(a, b);
}

__device__ __forceinline__ void mt_mma(float* c, const u32* a, u32 b0, u32 b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Cache slot (page*64 + offset) of selection slot j (< count), or -1 when skipped.
__device__ __forceinline__ int mt_slot(const int* __restrict__ indices, const int* __restrict__ block_table,
                                       int ld_idx, int qi, int len, int count, int j) {
  if (j >= count) return -1;
  const int t = indices ? indices[(size_t)qi * ld_idx + j] : j;
  if (t < 0 || t >= len) return -1;
  return block_table ? block_table[t >> 6] * 64 + (t & 63) : t;
}

// Starts the asynchronous copy of the tile's entries (slots from shared
// memory) into raw; skipped slots are left as they are (the conversion
// zeroes them).
__device__ __forceinline__ void mt_issue(uint4* raw, const u8* __restrict__ cache, const int* slots) {
  for (int c = threadIdx.x; c < MT_TT * MT_CH; c += blockDim.x) {
    const int j = c / MT_CH, p = c - j * MT_CH;
    const int t = slots[j];
    if (t < 0) continue;
    const u8* src = cache + (size_t)t * MLA_TOK_BYTES + p * 16;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(mt_smem_addr(raw + c)), "l"(src) : "memory");
  }
  asm volatile("cp.async.commit_group;" ::: "memory");
}

// mt_softmax_step is one tile's online-softmax update for a warp's 16 heads
// (rows g and g + 8 of the m16n8 fragments s): the quad's row maxima mx0/mx1
// joined, the running max m and sum l rescaled, s replaced by exp(s - m) (0
// for a skipped slot) and the output o rescaled. mt_body keeps its own copy
// inline: through this function nvcc 11.8 schedules mla_decode_tc's same
// instructions in another order, and that kernel's code is the one the
// H200 measured (checked by comparing the cubins' SASS).
__device__ __forceinline__ void mt_softmax_step(float (&s)[4][4], float mx0, float mx1, float& m0, float& m1,
                                                float& l0, float& l1, float (&o)[16][4]) {
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
}

// mt_pv_tile adds P times the tile's latent columns to o: this warp's 128
// columns of Kt, 2 k-steps of 16 tokens, P (times each token's group-w scale
// in scl) split in three bf16 parts.
__device__ __forceinline__ void mt_pv_tile(float (&o)[16][4], const float (&s)[4][4], const float* scl,
                                           const u16* Kt, int w, int g, int t4) {
#pragma unroll
  for (int kk = 0; kk < 2; kk++) {
    const int ta = 16 * kk + 2 * t4;
    const float sa = scl[ta * 4 + w], sb = scl[(ta + 1) * 4 + w];
    const float sc = scl[(ta + 8) * 4 + w], sd = scl[(ta + 9) * 4 + w];
    u32 pp[4][3];
    mt_split3(s[2 * kk][0] * sa, s[2 * kk][1] * sb, pp[0]);
    mt_split3(s[2 * kk][2] * sa, s[2 * kk][3] * sb, pp[1]);
    mt_split3(s[2 * kk + 1][0] * sc, s[2 * kk + 1][1] * sd, pp[2]);
    mt_split3(s[2 * kk + 1][2] * sc, s[2 * kk + 1][3] * sd, pp[3]);
    const u32 p0[4] = {pp[0][0], pp[1][0], pp[2][0], pp[3][0]};
    const u32 p1[4] = {pp[0][1], pp[1][1], pp[2][1], pp[3][1]};
    const u32 p2[4] = {pp[0][2], pp[1][2], pp[2][2], pp[3][2]};
    const u16* k0 = Kt + ta * MT_KS + 128 * w + g;
#pragma unroll
    for (int j = 0; j < 16; j++) {
      const u16* kc = k0 + 8 * j;
      const u32 b0 = (u32)kc[0] | ((u32)kc[MT_KS] << 16);
      const u32 b1 = (u32)kc[8 * MT_KS] | ((u32)kc[9 * MT_KS] << 16);
      mt_mma(o[j], p0, b0, b1);
      mt_mma(o[j], p1, b0, b1);
      mt_mma(o[j], p2, b0, b1);
    }
  }
}

// The queries are staged with cp.async in the first tile's group (every
// load in flight at once; plain loads, which the compiler issued one L2
// round trip at a time, were v3, removed in session 54).
// HP: head groups of 16 per block (warp w: latent group w % 4 of head group
// w / 4), converting each tile once for all of them.
template <int HP>
__device__ __forceinline__ void mt_body(const float* __restrict__ qn, const float* __restrict__ qp,
                                        const u8* __restrict__ cache, const int* __restrict__ block_table,
                                        const int* __restrict__ indices, int ld_idx, int nidx,
                                        const int* __restrict__ lens, float* out, float* lse, int H, float scale,
                                        int tps, float* part_o, float* part_ml) {
  extern __shared__ uint4 mt_smem[];
  uint4* raw = mt_smem;                       // [TT][41] raw entries
  u16* Kt = (u16*)(raw + MT_TT * MT_CH);      // [TT][KS] bf16 entries (fp8 values unscaled)
  float* Qs = (float*)(Kt + MT_TT * MT_KS);   // [HP*HG][QS] queries
  float* red = Qs + HP * MT_HG * MT_QS;       // [HP][4 warps][HG][TT] partial scores
  int* slots = (int*)(red + HP * 4 * MT_HG * MT_TT);  // [3][TT] cache slot of each tile slot, -1 skipped
  float* scl = (float*)(slots + 3 * MT_TT);   // [TT][4] group scales (0 for skipped slots)
  const int z = blockIdx.x, qi = blockIdx.y, h0 = blockIdx.z * MT_HG * HP;
  const int tid = threadIdx.x, lane = tid & 31, w = (tid >> 5) & 3, hp = tid >> 7, g = lane >> 2, t4 = lane & 3;
  const int len = lens[qi];
  const int begin = z * tps;
  const int count = min(indices ? nidx : len, begin + tps);
  if (tid < MT_TT) slots[tid] = mt_slot(indices, block_table, ld_idx, qi, len, count, begin + tid);
  for (int i = tid; i < HP * MT_HG * 144; i += HP * 128) {
    const int hh = i / 144, d = (i - hh * 144) * 4, h = h0 + hh;
    float* dst = Qs + hh * MT_QS + d;
    if (h >= H) {
      *(float4*)dst = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      continue;
    }
    const size_t qh = (size_t)qi * H + h;
    const float* src = d < MLA_LAT ? qn + qh * MLA_LAT + d : qp + qh * MLA_ROPE + d - MLA_LAT;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(mt_smem_addr(dst)), "l"(src) : "memory");
  }
  // The copies join the first tile's group (mt_issue commits it; an empty
  // range commits it here), waited for before any use.
  if (begin >= count) asm volatile("cp.async.commit_group;" ::: "memory");
  __syncthreads();
  if (begin < count) mt_issue(raw, cache, slots);
  float o[16][4];
#pragma unroll
  for (int j = 0; j < 16; j++) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
  float m0 = NEG_INF, m1 = NEG_INF, l0 = 0.0f, l1 = 0.0f;  // heads g and g+8 (l: this lane's share)
  int cur = 0;
  for (int base = begin; base < count; base += MT_TT) {
    const int nxt = cur == 2 ? 0 : cur + 1;
    const bool more = base + MT_TT < count;
    // The next tile's slots (its buffer was last read two tiles ago).
    if (more && tid < MT_TT) slots[nxt * MT_TT + tid] = mt_slot(indices, block_table, ld_idx, qi, len, count, base + MT_TT + tid);
    asm volatile("cp.async.wait_all;" ::: "memory");
    __syncthreads();  // the tile has landed; the previous tile's Kt, scl and red are consumed
    const int* sl = slots + cur * MT_TT;
    {
      // Convert: thread takes slot j, latent group qq (128 values) and 16
      // RoPE values (HP = 2: half of them, part 0 or 1).
      const int j = tid / (4 * HP), qq = (tid / HP) & 3, part = tid % HP;
      uint4* dst = (uint4*)(Kt + j * MT_KS);
      const uint4* src = raw + j * MT_CH;
      if (sl[j] >= 0) {
        if (part == 0) scl[j * 4 + qq] = ((const float*)(src + 32))[qq];
#pragma unroll
        for (int bp = 0; bp < 8 / HP; bp++) {
          const int b = part * (8 / HP) + bp;
          const uint4 v = src[qq * 8 + b];
          const u32 ws[4] = {v.x, v.y, v.z, v.w};
          u32 hv[8];
#pragma unroll
          for (int e = 0; e < 4; e++) {
            float f[4];
            fp8x4_to_f32(ws[e], f);
            hv[2 * e] = mt_bf16x2(f[0], f[1]);
            hv[2 * e + 1] = mt_bf16x2(f[2], f[3]);
          }
          dst[qq * 16 + 2 * b] = make_uint4(hv[0], hv[1], hv[2], hv[3]);
          dst[qq * 16 + 2 * b + 1] = make_uint4(hv[4], hv[5], hv[6], hv[7]);
        }
#pragma unroll
        for (int rp = 0; rp < 2 / HP; rp++) {
          const int rr = part * (2 / HP) + rp;
          dst[64 + 2 * qq + rr] = src[33 + 2 * qq + rr];  // RoPE part: bf16 as stored
        }
      } else {
        if (part == 0) scl[j * 4 + qq] = 0.0f;
        const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
        for (int b = 0; b < 16 / HP; b++) dst[qq * 16 + part * (16 / HP) + b] = zero;
#pragma unroll
        for (int rp = 0; rp < 2 / HP; rp++) dst[64 + 2 * qq + part * (2 / HP) + rp] = zero;
      }
    }
    __syncthreads();
    if (more) mt_issue(raw, cache, slots + nxt * MT_TT);
    // Partial scores: 4 n-tiles of 8 tokens; latent group w, its scale per
    // token, then the RoPE dims (unscaled) into the same accumulators.
    float s[4][4];
#pragma unroll
    for (int n = 0; n < 4; n++) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
    // k-steps 0..7: latent group w; 8: RoPE dims [512+16w, +16). The query
    // fragments (hi, mid, lo) come from the float32 queries each time.
#pragma unroll
    for (int ks = 0; ks < 9; ks++) {
      const int d0 = ks < 8 ? 128 * w + 16 * ks : MLA_LAT + 16 * w;
      if (ks == 8) {
#pragma unroll
        for (int n = 0; n < 4; n++) {
          const float sa = scl[(8 * n + 2 * t4) * 4 + w], sb = scl[(8 * n + 2 * t4 + 1) * 4 + w];
          s[n][0] *= sa;
          s[n][1] *= sb;
          s[n][2] *= sa;
          s[n][3] *= sb;
        }
      }
      u32 qa[4][3];
      {
        const float* q0 = Qs + (hp * MT_HG + g) * MT_QS + d0 + 2 * t4;
        const float* q1 = q0 + 8 * MT_QS;
        const float2 v0 = *(const float2*)q0, v1 = *(const float2*)q1;
        const float2 v2 = *(const float2*)(q0 + 8), v3 = *(const float2*)(q1 + 8);
        mt_split3(v0.x, v0.y, qa[0]);
        mt_split3(v1.x, v1.y, qa[1]);
        mt_split3(v2.x, v2.y, qa[2]);
        mt_split3(v3.x, v3.y, qa[3]);
      }
#pragma unroll
      for (int p = 0; p < 3; p++) {
        const u32 a[4] = {qa[0][p], qa[1][p], qa[2][p], qa[3][p]};
#pragma unroll
        for (int n = 0; n < 4; n++) {
          const u16* kr = Kt + (8 * n + g) * MT_KS + d0 + 2 * t4;
          mt_mma(s[n], a, *(const u32*)kr, *(const u32*)(kr + 8));
        }
      }
    }
    float* rw = red + (hp * 4 + w) * MT_HG * MT_TT;
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
        for (int ww = 0; ww < 4; ww++) v += red[((hp * 4 + ww) * MT_HG + row) * MT_TT + col];
        s[n][e] = sl[col] >= 0 ? v * scale : NEG_INF;
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
    mt_pv_tile(o, s, scl, Kt, w, g, t4);
    cur = nxt;
  }
  asm volatile("cp.async.wait_all;" ::: "memory");  // an empty range's query copies
  l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
  l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
#pragma unroll
  for (int hr = 0; hr < 2; hr++) {
    const int h = h0 + hp * MT_HG + g + 8 * hr;
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

extern "C" __global__ void __launch_bounds__(128) mla_decode_tc(MT_ARGS) {
  PDL_WAIT();
  mt_body<1>(qn, qp, cache, block_table, indices, ld_idx, nidx, lens, out, lse, H, scale, tps, part_o, part_ml);
}
// (mla_decode_tc32, mt_body<2>: 32 heads a block, each tile converted once
// per 32 heads; no faster on the H200, 24.60 against 24.30 us; removed in
// session 55.)
#else
extern "C" __global__ void __launch_bounds__(128) mla_decode_tc(MT_ARGS) {
  PDL_WAIT();
  __trap();
}
#endif

// mla_decode_tcp: mla_decode_tc's arithmetic (the same mma in the same
// order: the same bits) with a shorter chain per tile.
// - The query fragments are split into their three bf16 parts once per
//   block and kept in registers (108 per thread), loaded straight from
//   global memory: no float query tile in shared memory and no split
//   recomputed per tile (36 per thread per tile in mla_decode_tc).
// - NR raw tile buffers: tiles 0..NR-1 are in flight from the start and
//   tile i+NR is issued right after tile i's conversion, so a block with
//   <= NR tiles issues every fetch at once.
// - Token slots: tiles 0..NR read in the prologue (one round trip); in tile
//   i, warp 0 loads tile i+NR+1's slots into a register at the top and
//   stores them at the bottom (a ring of NR+2 tiles), so no barrier waits
//   on that load.
// - The P.V B fragments come from ldmatrix.trans (8 per k-step instead of
//   64 two-byte loads).
// DIAG (timing only, wrong results): 1 skips the conversion, 2 the score
// mma, 4 the P.V mma (H200, 128 heads, 32 splits: 20.8 us -> 17.3 / 15.2 /
// 19.4; docs/measured/h200-2026-12-01-attn/run1).
#define MTP_NR 3
#define MTP_NS (MTP_NR + 2)
// Dynamic shared memory of mla_decode_tcp in bytes (MLATCPSmemBytes in ops_mla.go):
// NR raw tiles, bf16 tile, partial scores, NS x token slots, scales.
#define MTP_SMEM_BYTES \
  (MTP_NR * MT_TT * MT_CH * 16 + MT_TT * MT_KS * 2 + 4 * MT_HG * MT_TT * 4 + MTP_NS * MT_TT * 4 + MT_TT * 4 * 4)

#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
__device__ __forceinline__ void mtp_ldsm4t(u32 addr, u32& r0, u32& r1, u32& r2, u32& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
}

// mt_issue by 128 threads (tid: the caller's thread, < 128).
__device__ __forceinline__ void mtp_issue(int tid, uint4* raw, const u8* __restrict__ cache, const int* slots) {
  for (int c = tid; c < MT_TT * MT_CH; c += 128) {
    const int j = c / MT_CH, p = c - j * MT_CH;
    const int t = slots[j];
    if (t < 0) continue;
    const u8* src = cache + (size_t)t * MLA_TOK_BYTES + p * 16;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(mt_smem_addr(raw + c)), "l"(src) : "memory");
  }
  asm volatile("cp.async.commit_group;" ::: "memory");
}

template <int DIAG>
__device__ __forceinline__ void mtp_body(const float* __restrict__ qn, const float* __restrict__ qp,
                                         const u8* __restrict__ cache, const int* __restrict__ block_table,
                                         const int* __restrict__ indices, int ld_idx, int nidx,
                                         const int* __restrict__ lens, float* out, float* lse, int H, float scale,
                                         int tps, float* part_o, float* part_ml,
                                         const long long* __restrict__ row_base) {
  extern __shared__ uint4 mt_smem[];
  uint4* raw = mt_smem;                                // [NR][TT][41] raw entries
  u16* Kt = (u16*)(raw + MTP_NR * MT_TT * MT_CH);      // [TT][KS] bf16 entries (fp8 values unscaled)
  float* red = (float*)(Kt + MT_TT * MT_KS);           // [4 warps][HG][TT] partial scores
  int* slots = (int*)(red + 4 * MT_HG * MT_TT);        // [NS][TT] cache slot of each tile slot, -1 skipped
  float* scl = (float*)(slots + MTP_NS * MT_TT);       // [TT][4] group scales (0 for skipped slots)
  const int z = blockIdx.x, qi = blockIdx.y, h0 = blockIdx.z * MT_HG;
  const int tid = threadIdx.x & 127, lane = tid & 31, w = tid >> 5, g = lane >> 2, t4 = lane & 3;
  // Rows of several slots in one launch: row qi's cache region is
  // row_base[qi] + cache (cache then holds the layer's offset).
  if (row_base) cache += row_base[qi];
  const int len = lens[qi];
  const int begin = z * tps;
  const int count = min(indices ? nidx : len, begin + tps);
  // Slots of tiles 0..NR (the prologue's issues and tile 0's).
  for (int j = tid; j < (MTP_NR + 1) * MT_TT; j += 128)
    slots[j] = mt_slot(indices, block_table, ld_idx, qi, len, count, begin + j);
  __syncthreads();
#pragma unroll
  for (int b = 0; b < MTP_NR; b++) {
    if (begin + b * MT_TT < count) {
      mtp_issue(tid, raw + b * MT_TT * MT_CH, cache, slots + b * MT_TT);
    } else {
      asm volatile("cp.async.commit_group;" ::: "memory");
    }
  }
  // The query fragments: heads g and g+8 of the group, k-step ks of warp w
  // (latent group w, then RoPE dims [512+16w, +16)), split once.
  u32 qa[9][4][3];
  {
    const int ha = h0 + g, hb = h0 + g + 8;
#pragma unroll
    for (int ks = 0; ks < 9; ks++) {
      float2 v[4];
#pragma unroll
      for (int r = 0; r < 4; r++) {
        const int h = (r & 1) ? hb : ha;
        const int d = (ks < 8 ? 128 * w + 16 * ks : MLA_LAT + 16 * w) + 2 * t4 + 8 * (r >> 1);
        v[r] = make_float2(0.0f, 0.0f);
        if (h < H) {
          const size_t qh = (size_t)qi * H + h;
          v[r] = d < MLA_LAT ? *(const float2*)(qn + qh * MLA_LAT + d) : *(const float2*)(qp + qh * MLA_ROPE + d - MLA_LAT);
        }
      }
#pragma unroll
      for (int r = 0; r < 4; r++) mt_split3(v[r].x, v[r].y, qa[ks][r]);
    }
  }
  float o[16][4];
#pragma unroll
  for (int j = 0; j < 16; j++) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
  float m0 = NEG_INF, m1 = NEG_INF, l0 = 0.0f, l1 = 0.0f;  // heads g and g+8 (l: this lane's share)
  const u32 kt_base = mt_smem_addr(Kt);
  int it = 0;
  for (int base = begin; base < count; base += MT_TT, it++) {
    const int rb = it % MTP_NR;
    // Tile it+NR+1's slots: loaded now, stored at the bottom (its ring entry
    // was tile it-1's, consumed before the barrier below).
    int nslot = -1;
    const int fut = base + (MTP_NR + 1) * MT_TT;
    if (tid < MT_TT && fut < count) nslot = mt_slot(indices, block_table, ld_idx, qi, len, count, fut + tid);
    asm volatile("cp.async.wait_group %0;" ::"n"(MTP_NR - 1) : "memory");
    __syncthreads();  // tile it has landed; the previous tile's Kt, scl and red are consumed
    const int* sl = slots + (it % MTP_NS) * MT_TT;
    if (!(DIAG & 1)) {
      const int j = tid >> 2, qq = tid & 3;
      uint4* dst = (uint4*)(Kt + j * MT_KS);
      const uint4* src = raw + (rb * MT_TT + j) * MT_CH;
      if (sl[j] >= 0) {
        scl[j * 4 + qq] = ((const float*)(src + 32))[qq];
#pragma unroll
        for (int b = 0; b < 8; b++) {
          const uint4 v = src[qq * 8 + b];
          const u32 ws[4] = {v.x, v.y, v.z, v.w};
          u32 hv[8];
#pragma unroll
          for (int e = 0; e < 4; e++) {
            float f[4];
            fp8x4_to_f32(ws[e], f);
            hv[2 * e] = mt_bf16x2(f[0], f[1]);
            hv[2 * e + 1] = mt_bf16x2(f[2], f[3]);
          }
          dst[qq * 16 + 2 * b] = make_uint4(hv[0], hv[1], hv[2], hv[3]);
          dst[qq * 16 + 2 * b + 1] = make_uint4(hv[4], hv[5], hv[6], hv[7]);
        }
        dst[64 + 2 * qq] = src[33 + 2 * qq];  // RoPE part: bf16 as stored
        dst[64 + 2 * qq + 1] = src[33 + 2 * qq + 1];
      } else {
        scl[j * 4 + qq] = 0.0f;
        const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
        for (int b = 0; b < 16; b++) dst[qq * 16 + b] = zero;
        dst[64 + 2 * qq] = zero;
        dst[64 + 2 * qq + 1] = zero;
      }
    }
    __syncthreads();
    // Tile it+NR into the raw buffer just converted (an empty group past the end).
    if (base + MTP_NR * MT_TT < count) {
      mtp_issue(tid, raw + rb * MT_TT * MT_CH, cache, slots + ((it + MTP_NR) % MTP_NS) * MT_TT);
    } else {
      asm volatile("cp.async.commit_group;" ::: "memory");
    }
    float s[4][4];
#pragma unroll
    for (int n = 0; n < 4; n++) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
    for (int ks = 0; ks < 9; ks++) {
      const int d0 = ks < 8 ? 128 * w + 16 * ks : MLA_LAT + 16 * w;
      if (ks == 8) {
#pragma unroll
        for (int n = 0; n < 4; n++) {
          const float sa = scl[(8 * n + 2 * t4) * 4 + w], sb = scl[(8 * n + 2 * t4 + 1) * 4 + w];
          s[n][0] *= sa;
          s[n][1] *= sb;
          s[n][2] *= sa;
          s[n][3] *= sb;
        }
      }
      if (!(DIAG & 2)) {
        u32 kb[4][2];
#pragma unroll
        for (int n = 0; n < 4; n++) {
          const u16* kr = Kt + (8 * n + g) * MT_KS + d0 + 2 * t4;
          kb[n][0] = *(const u32*)kr;
          kb[n][1] = *(const u32*)(kr + 8);
        }
#pragma unroll
        for (int p = 0; p < 3; p++) {
          const u32 a[4] = {qa[ks][0][p], qa[ks][1][p], qa[ks][2][p], qa[ks][3][p]};
#pragma unroll
          for (int n = 0; n < 4; n++) mt_mma(s[n], a, kb[n][0], kb[n][1]);
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
      for (int e = 0; e < 4; e++) {
        const int row = g + (e >> 1) * 8, col = 8 * n + 2 * t4 + (e & 1);
        float v = 0.0f;
#pragma unroll
        for (int ww = 0; ww < 4; ww++) v += red[(ww * MT_HG + row) * MT_TT + col];
        s[n][e] = sl[col] >= 0 ? v * scale : NEG_INF;
      }
      mx0 = fmaxf(mx0, fmaxf(s[n][0], s[n][1]));
      mx1 = fmaxf(mx1, fmaxf(s[n][2], s[n][3]));
    }
    mt_softmax_step(s, mx0, mx1, m0, m1, l0, l1, o);
#pragma unroll
    for (int kk = 0; kk < 2; kk++) {
      const int ta = 16 * kk + 2 * t4;
      const float sa = scl[ta * 4 + w], sb = scl[(ta + 1) * 4 + w];
      const float sc = scl[(ta + 8) * 4 + w], sd = scl[(ta + 9) * 4 + w];
      u32 pp[4][3];
      mt_split3(s[2 * kk][0] * sa, s[2 * kk][1] * sb, pp[0]);
      mt_split3(s[2 * kk][2] * sa, s[2 * kk][3] * sb, pp[1]);
      mt_split3(s[2 * kk + 1][0] * sc, s[2 * kk + 1][1] * sd, pp[2]);
      mt_split3(s[2 * kk + 1][2] * sc, s[2 * kk + 1][3] * sd, pp[3]);
      const u32 p0[4] = {pp[0][0], pp[1][0], pp[2][0], pp[3][0]};
      const u32 p1[4] = {pp[0][1], pp[1][1], pp[2][1], pp[3][1]};
      const u32 p2[4] = {pp[0][2], pp[1][2], pp[2][2], pp[3][2]};
      // ldmatrix.trans x4: matrices (tokens 16kk+0..7, 16kk+8..15) x (columns
      // 8j..8j+7, 8j+8..8j+15): b0, b1 of n-tile j, then of j+1. Lane l gives
      // the row address of matrix l/8: token 16kk + 8*((l/8)&1) + l%8,
      // columns 128w + 8*(2jj + l/16).
      const int mrow = 16 * kk + 8 * ((lane >> 3) & 1) + (lane & 7);
      const u32 a0 = kt_base + (u32)(mrow * MT_KS + 128 * w + 8 * (lane >> 4)) * 2u;
      if (!(DIAG & 4)) {
#pragma unroll
        for (int jj = 0; jj < 8; jj++) {
          u32 b0, b1, b2, b3;
          mtp_ldsm4t(a0 + jj * 32u, b0, b1, b2, b3);
          mt_mma(o[2 * jj], p0, b0, b1);
          mt_mma(o[2 * jj], p1, b0, b1);
          mt_mma(o[2 * jj], p2, b0, b1);
          mt_mma(o[2 * jj + 1], p0, b2, b3);
          mt_mma(o[2 * jj + 1], p1, b2, b3);
          mt_mma(o[2 * jj + 1], p2, b2, b3);
        }
      }
    }
    if (tid < MT_TT) slots[((it + MTP_NR + 1) % MTP_NS) * MT_TT + tid] = nslot;
  }
  asm volatile("cp.async.wait_all;" ::: "memory");
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

extern "C" __global__ void __launch_bounds__(128, 2) mla_decode_tcp(MT_ARGS, const long long* __restrict__ row_base) {
  PDL_WAIT();
  mtp_body<0>(qn, qp, cache, block_table, indices, ld_idx, nidx, lens, out, lse, H, scale, tps, part_o, part_ml, row_base);
}
#else
extern "C" __global__ void __launch_bounds__(128) mla_decode_tcp(MT_ARGS, const long long* __restrict__ row_base) {
  PDL_WAIT();
  __trap();
}
#endif
