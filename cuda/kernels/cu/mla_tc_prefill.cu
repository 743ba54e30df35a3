// mla_prefill_tc: mla_decode_tc (mla_tc.cu, whose helpers it uses: this
// file sorts after it in the module) for the many rows of a prefill chunk.
// The decode kernel runs 16 heads a block and splits its float32 queries
// into three bf16 parts again for every 32-token tile; over a prefill
// chunk (256 rows, each with its own top-k of up to 2048 entries) that
// made each tile's conversion 8 times per row and the splits most of the
// per-tile issue. Here:
// - 32 heads a block (256 threads; warp w: latent group w % 4 of head
//   group w / 4), so each gathered tile is fetched and converted once per
//   32 heads (4 times per row of 128 heads instead of 8). All 128 heads a
//   block would need the row's queries on chip: 128 x 576 x 3 bf16 parts
//   = 442 KB, twice the shared memory of an SM, and 2 parts (fp16,
//   per-head scaled) still 295 KB, so 32 it is.
// - The queries are split into their three bf16 parts once per block into
//   shared memory (3 x 32 x 584 bf16 = 112 KB); the k-steps read the parts
//   as they are, nothing is split per tile.
// The arithmetic is mla_decode_tc's: the same parts (the split is
// elementwise, so splitting once gives the same values), the same mma in
// the same order, the same online softmax with the same scale, skipped
// entries (-1, past the row's length) masked, a row reads only its own
// indices. With gridDim.x == 1 (the prefill launch: enough blocks from the
// rows) the output is normalised here; with more, partials for
// mla_combine as mla_decode_tc writes them.
// Grid: x = token split, y = query row, z = group of 32 heads. NOT yet run
// on a GPU (see cuda/kernels/NOTES.md).

#define MP_HP 2                     // head groups of 16 per block
#define MP_QS 584                   // bf16 per head row of a query part (conflict-free fragments)
// Dynamic shared memory in bytes (MLAPrefillSmemBytes in ops_mla_prefill.go):
// raw tile, bf16 tile, 3 query parts, partial scores, 3 x token slots, scales.
#define MP_SMEM_BYTES                                                                                   \
  (MT_TT * MT_CH * 16 + MT_TT * MT_KS * 2 + 3 * MP_HP * MT_HG * MP_QS * 2 + MP_HP * 4 * MT_HG * MT_TT * 4 + \
   3 * MT_TT * 4 + MT_TT * 4 * 4)

#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
extern "C" __global__ void __launch_bounds__(256) mla_prefill_tc(MT_ARGS) {
  PDL_WAIT();
  extern __shared__ uint4 mt_smem[];
  uint4* raw = mt_smem;                               // [TT][41] raw entries
  u16* Kt = (u16*)(raw + MT_TT * MT_CH);              // [TT][KS] bf16 entries (fp8 values unscaled)
  u16* Qh = Kt + MT_TT * MT_KS;                       // [3 parts][HP*HG][QS] bf16 query parts
  float* red = (float*)(Qh + 3 * MP_HP * MT_HG * MP_QS);  // [HP][4 warps][HG][TT] partial scores
  int* slots = (int*)(red + MP_HP * 4 * MT_HG * MT_TT);   // [3][TT] cache slot of each tile slot, -1 skipped
  float* scl = (float*)(slots + 3 * MT_TT);           // [TT][4] group scales (0 for skipped slots)
  const int z = blockIdx.x, qi = blockIdx.y, h0 = blockIdx.z * MT_HG * MP_HP;
  const int tid = threadIdx.x, lane = tid & 31, w = (tid >> 5) & 3, hp = tid >> 7, g = lane >> 2, t4 = lane & 3;
  const int len = lens[qi];
  const int begin = z * tps;
  const int count = min(indices ? nidx : len, begin + tps);
  if (tid < MT_TT) slots[tid] = mt_slot(indices, block_table, ld_idx, qi, len, count, begin + tid);
  // The queries' three bf16 parts, once per block (heads past H: zeros).
  for (int i = tid; i < MP_HP * MT_HG * 288; i += MP_HP * 128) {
    const int hh = i / 288, d = (i - hh * 288) * 2, h = h0 + hh;
    u32 p[3] = {0u, 0u, 0u};
    if (h < H) {
      const size_t qh = (size_t)qi * H + h;
      const float2 v = *(const float2*)(d < MLA_LAT ? qn + qh * MLA_LAT + d : qp + qh * MLA_ROPE + d - MLA_LAT);
      mt_split3(v.x, v.y, p);
    }
#pragma unroll
    for (int pp = 0; pp < 3; pp++) *(u32*)(Qh + (pp * MP_HP * MT_HG + hh) * MP_QS + d) = p[pp];
  }
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
    if (more && tid < MT_TT) slots[nxt * MT_TT + tid] = mt_slot(indices, block_table, ld_idx, qi, len, count, base + MT_TT + tid);
    asm volatile("cp.async.wait_all;" ::: "memory");
    __syncthreads();  // the tile has landed; the previous tile's Kt, scl and red are consumed
    const int* sl = slots + cur * MT_TT;
    {
      // Convert: thread takes slot j, latent group qq and half of it (part).
      const int j = tid / (4 * MP_HP), qq = (tid / MP_HP) & 3, part = tid % MP_HP;
      uint4* dst = (uint4*)(Kt + j * MT_KS);
      const uint4* src = raw + j * MT_CH;
      if (sl[j] >= 0) {
        if (part == 0) scl[j * 4 + qq] = ((const float*)(src + 32))[qq];
#pragma unroll
        for (int bp = 0; bp < 8 / MP_HP; bp++) {
          const int b = part * (8 / MP_HP) + bp;
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
        dst[64 + 2 * qq + part] = src[33 + 2 * qq + part];  // RoPE part: bf16 as stored
      } else {
        if (part == 0) scl[j * 4 + qq] = 0.0f;
        const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
        for (int b = 0; b < 16 / MP_HP; b++) dst[qq * 16 + part * (16 / MP_HP) + b] = zero;
        dst[64 + 2 * qq + part] = zero;
      }
    }
    __syncthreads();
    if (more) mt_issue(raw, cache, slots + nxt * MT_TT);
    float s[4][4];
#pragma unroll
    for (int n = 0; n < 4; n++) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
    // k-steps 0..7: latent group w (its scale applied before step 8); 8:
    // RoPE dims [512+16w, +16). Query fragments read as split.
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
#pragma unroll
      for (int p = 0; p < 3; p++) {
        const u16* q0 = Qh + (p * MP_HP * MT_HG + hp * MT_HG + g) * MP_QS + d0 + 2 * t4;
        const u32 a[4] = {*(const u32*)q0, *(const u32*)(q0 + 8 * MP_QS), *(const u32*)(q0 + 8),
                          *(const u32*)(q0 + 8 * MP_QS + 8)};
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
    mt_softmax_step(s, mx0, mx1, m0, m1, l0, l1, o);
    mt_pv_tile(o, s, scl, Kt, w, g, t4);
    cur = nxt;
  }
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
#else
extern "C" __global__ void __launch_bounds__(256) mla_prefill_tc(MT_ARGS) {
  PDL_WAIT();
  __trap();
}
#endif

// mla_prefill_tcp: mla_decode_tcp's arithmetic (mla_tc.cu mtp_body: the
// query fragments split once into registers,
// MTP_NR tiles in flight, P.V fragments by ldmatrix.trans) for the many rows
// of a prefill chunk, with the shared-memory traffic that bound it cut:
// - the score B fragments (tokens x dims) by ldmatrix.x4 (two token octets
//   a load) instead of eight 32-bit loads per k-step;
// - the four warps' partial scores through rows of MPP_RS floats, so the
//   float2 writes and reads of a quad's rows land on distinct banks (rows
//   32 floats apart put the 8 lanes of a column on one bank: 8-way
//   conflicts on 64 reads and 8 writes per thread and tile).
// Same parts, mma order per accumulator, partial-score sum order and
// softmax as mla_decode_tcp (whose bits equal mla_decode_tc's), so the
// results should equal that kernel's bits. Grid: x = token split, y = query row, z = head group of 16;
// 128 threads, two blocks an SM. NOT yet run on a GPU when written.
#define MPP_RS 40  // floats per head row of the partial scores
// Dynamic shared memory (MLAPrefillTCPSmemBytes in ops_mla_prefill.go):
// NR raw tiles, bf16 tile, partial scores, NS x token slots, scales.
#define MPP_SMEM_BYTES \
  (MTP_NR * MT_TT * MT_CH * 16 + MT_TT * MT_KS * 2 + 4 * MT_HG * MPP_RS * 4 + MTP_NS * MT_TT * 4 + MT_TT * 4 * 4)

#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
__device__ __forceinline__ void mpp_ldsm4(u32 addr, u32& r0, u32& r1, u32& r2, u32& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
}

// Four e4m3 bytes to two bf16 pairs with integer operations: a normal e4m3
// (exponent e >= 1) is bf16 with exponent e + 120 and its three mantissa
// bits on top, exactly; a word with a zero, subnormal (exponent 0) or NaN
// byte takes the conversion through float (rare in a quantized cache).
__device__ __forceinline__ void mpp_fp8x4_bf16(u32 w, u32& lo, u32& hi) {
  const u32 a = __byte_perm(w, 0u, 0x4140), b = __byte_perm(w, 0u, 0x4342);  // bytes into 16-bit lanes
  const u32 ea = a & 0x00780078u, eb = b & 0x00780078u;
  const u32 na = (a & 0x007f007fu) ^ 0x007f007fu, nb = (b & 0x007f007fu) ^ 0x007f007fu;  // a lane 0: NaN
  if ((ea & 0xffffu) && (ea >> 16) && (eb & 0xffffu) && (eb >> 16) && (na & 0xffffu) && (na >> 16) && (nb & 0xffffu) &&
      (nb >> 16)) {
    lo = (((a & 0x007f007fu) << 4) + 0x3c003c00u) | ((a & 0x00800080u) << 8);
    hi = (((b & 0x007f007fu) << 4) + 0x3c003c00u) | ((b & 0x00800080u) << 8);
  } else {
    float f[4];
    fp8x4_to_f32(w, f);
    lo = mt_bf16x2(f[0], f[1]);
    hi = mt_bf16x2(f[2], f[3]);
  }
}

// IC: the tile conversion by mpp_fp8x4_bf16 (integer) instead of through
// float (the same bf16 values).
template <bool IC>
__device__ __forceinline__ void mpp_body(MT_ARGS) {
  extern __shared__ uint4 mt_smem[];
  uint4* raw = mt_smem;                              // [NR][TT][41] raw entries
  u16* Kt = (u16*)(raw + MTP_NR * MT_TT * MT_CH);    // [TT][KS] bf16 entries (fp8 values unscaled)
  float* red = (float*)(Kt + MT_TT * MT_KS);         // [4 warps][HG][RS] partial scores
  int* slots = (int*)(red + 4 * MT_HG * MPP_RS);     // [NS][TT] cache slot of each tile slot, -1 skipped
  float* scl = (float*)(slots + MTP_NS * MT_TT);     // [TT][4] group scales (0 for skipped slots)
  const int z = blockIdx.x, qi = blockIdx.y, h0 = blockIdx.z * MT_HG;
  const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5, g = lane >> 2, t4 = lane & 3;
  const int len = lens[qi];
  const int begin = z * tps;
  const int count = min(indices ? nidx : len, begin + tps);
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
  // Score B fragments: lane l addresses row (token 8*(2nn + l/16) + l%8,
  // dims d0 + 8*((l/8)&1)) of matrix l/8: b0, b1 of token octet 2nn, then
  // of 2nn+1.
  int it = 0;
  for (int base = begin; base < count; base += MT_TT, it++) {
    const int rb = it % MTP_NR;
    int nslot = -1;
    const int fut = base + (MTP_NR + 1) * MT_TT;
    if (tid < MT_TT && fut < count) nslot = mt_slot(indices, block_table, ld_idx, qi, len, count, fut + tid);
    asm volatile("cp.async.wait_group %0;" ::"n"(MTP_NR - 1) : "memory");
    __syncthreads();  // tile it has landed; the previous tile's Kt, scl and red are consumed
    const int* sl = slots + (it % MTP_NS) * MT_TT;
    {
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
            if (IC) {
              mpp_fp8x4_bf16(ws[e], hv[2 * e], hv[2 * e + 1]);
            } else {
              float f[4];
              fp8x4_to_f32(ws[e], f);
              hv[2 * e] = mt_bf16x2(f[0], f[1]);
              hv[2 * e + 1] = mt_bf16x2(f[2], f[3]);
            }
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
      const u32 kb_lane = kt_base + (u32)((8 * (lane >> 4) + (lane & 7)) * MT_KS + 8 * ((lane >> 3) & 1)) * 2u;
      u32 kb[4][2];
      mpp_ldsm4(kb_lane + (u32)d0 * 2u, kb[0][0], kb[0][1], kb[1][0], kb[1][1]);
      mpp_ldsm4(kb_lane + (u32)(16 * MT_KS + d0) * 2u, kb[2][0], kb[2][1], kb[3][0], kb[3][1]);
#pragma unroll
      for (int p = 0; p < 3; p++) {
        const u32 a[4] = {qa[ks][0][p], qa[ks][1][p], qa[ks][2][p], qa[ks][3][p]};
#pragma unroll
        for (int n = 0; n < 4; n++) mt_mma(s[n], a, kb[n][0], kb[n][1]);
      }
    }
    float* rw = red + w * MT_HG * MPP_RS;
#pragma unroll
    for (int n = 0; n < 4; n++) {
      *(float2*)(rw + g * MPP_RS + 8 * n + 2 * t4) = make_float2(s[n][0], s[n][1]);
      *(float2*)(rw + (g + 8) * MPP_RS + 8 * n + 2 * t4) = make_float2(s[n][2], s[n][3]);
    }
    __syncthreads();
    // Full scores: the four warps' partials in warp order (float2 reads of
    // the pair this lane holds), masked and scaled.
    float mx0 = NEG_INF, mx1 = NEG_INF;
#pragma unroll
    for (int n = 0; n < 4; n++) {
#pragma unroll
      for (int hr = 0; hr < 2; hr++) {
        const int row = g + 8 * hr, col = 8 * n + 2 * t4;
        float v0 = 0.0f, v1 = 0.0f;
#pragma unroll
        for (int ww = 0; ww < 4; ww++) {
          const float2 pv = *(const float2*)(red + (ww * MT_HG + row) * MPP_RS + col);
          v0 += pv.x;
          v1 += pv.y;
        }
        s[n][2 * hr] = sl[col] >= 0 ? v0 * scale : NEG_INF;
        s[n][2 * hr + 1] = sl[col + 1] >= 0 ? v1 * scale : NEG_INF;
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
      const int mrow = 16 * kk + 8 * ((lane >> 3) & 1) + (lane & 7);
      const u32 a0 = kt_base + (u32)(mrow * MT_KS + 128 * w + 8 * (lane >> 4)) * 2u;
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

extern "C" __global__ void __launch_bounds__(128, 2) mla_prefill_tcp(MT_ARGS) {
  PDL_WAIT();
  mpp_body<false>(qn, qp, cache, block_table, indices, ld_idx, nidx, lens, out, lse, H, scale, tps, part_o, part_ml);
}
// mla_prefill_tcpi: the tile converted with integer operations.
extern "C" __global__ void __launch_bounds__(128, 2) mla_prefill_tcpi(MT_ARGS) {
  PDL_WAIT();
  mpp_body<true>(qn, qp, cache, block_table, indices, ld_idx, nidx, lens, out, lse, H, scale, tps, part_o, part_ml);
}
#else
extern "C" __global__ void __launch_bounds__(128) mla_prefill_tcp(MT_ARGS) {
  PDL_WAIT();
  __trap();
}
extern "C" __global__ void __launch_bounds__(128) mla_prefill_tcpi(MT_ARGS) {
  PDL_WAIT();
  __trap();
}
#endif
