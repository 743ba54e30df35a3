// mla_prefill_wg2: mla_prefill_wg (and so mla_prefill_h1: the same inputs,
// the same one-fp16-part roundings, the same per-tile online-softmax
// update, the same per-element float32 accumulation order) with the
// gather and the fp8 -> fp16 conversion taken off the MMAs' critical path
// by warp specialisation. Serving mode only (engine:
// TILERT_GPU_MLA_PREFILL=6); sm_90a module (helpers and MWG_* from
// mla_prefill_wg.cu, which precedes this file in the module).
//
// Block: one query row (blockIdx.y), 64 heads (blockIdx.z), 384 threads =
// three warpgroups:
// - warpgroups 0 and 1 (threads 0..255), the consumers: exactly
//   mla_prefill_wg's block (the same queries in shared memory, the same
//   wgmma descriptors relative to the tile, the same fragments, softmax,
//   rescale, P and output), with the tile taken from the stage the
//   producer filled, and a named barrier among the 256 of them where wg has
//   __syncthreads.
// - warpgroup 2 (threads 256..383), the producer: per tile of 64 selected
//   entries, the slots (any valid: else the tile is skipped, as h1 skips
//   it), then the entries straight from global memory (16-byte loads, 8
//   tokens x 64 contiguous bytes a warp load: whole 32-byte sectors)
//   converted as wg converts them (the same e4m3 -> fp16, the same two
//   fp16 multiplies by the group scale, the same bf16 -> fp16 RoPE) into
//   the fp16 stage at MWG_OFF (a quarter warp stores 8 rows of one core
//   matrix: 128 contiguous bytes, no bank conflict).
// - Two fp16 stages: the producer fills stage n%2 with the n-th valid tile
//   while the consumers run the MMAs and softmax of tile n-1 on the other.
//   Handoff by named barriers: FULL[s] (producer bar.arrive after its
//   writes and fence.proxy.async; consumers bar.sync), EMPTY[s] (consumers
//   bar.arrive after their P.V on s has completed; producer bar.sync before
//   refilling s). A last handoff with done = 1 ends the consumers' loop;
//   every EMPTY arrival is matched by a producer wait (none left pending).
// - There is no room for a raw (fp8) stage: 2 fp16 stages + queries + P =
//   229,376 bytes of the 232,448 a block may have. So the producer keeps
//   its loads in registers (three batches a tile) and setmaxnreg moves
//   registers from it to the consumers (MW2_PREG / MW2_CREG).
// Why 64 heads a block and not 128 (the tile converted once a row): the
//   output accumulator of 128 heads x 512 columns in float32 is 256 KB, the
//   whole register file; 64 heads (wg's 128 accumulators a consumer
//   thread) is what fits beside a producer.
// Shared memory: 2 stages 147,456 + queries 73,728 + P 8,192 + row maxima
// 512 + rescale 256 + score factors 256 + row sums 512 + slots 512 + done
// flags 8 = 231,432 bytes. NOT yet run on a GPU when written.

#define MW2_SMEM_BYTES \
  (3 * MWG_TILE_BYTES + MWG_P_BYTES + 2 * MWG_HB * 4 + MWG_HB * 4 + MWG_HB * 4 + 2 * MWG_HB * 4 + 2 * MWG_T * 4 + 2 * 4)
#define MW2_BAR_C 1      // the consumers' barrier (256 threads)
#define MW2_BAR_P 2      // the producer's barrier (128 threads)
#define MW2_BAR_FULL 3   // + stage: the stage is filled (384 threads)
#define MW2_BAR_EMPTY 5  // + stage: the stage is free again (384 threads)
#ifndef MW2_PREG
#define MW2_PREG 120  // producer registers a thread after setmaxnreg.dec
#endif
#ifndef MW2_CREG
#define MW2_CREG 192  // consumer registers a thread after setmaxnreg.inc (2 x 192 + 120 = 3 x 168)
#endif

#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ == 900) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
// Named barriers (ids and counts immediates, so ptxas reserves only those used).
template <int ID, int N>
__device__ __forceinline__ void mw2_bar_sync() {
  asm volatile("bar.sync %0, %1;" ::"n"(ID), "n"(N) : "memory");
}
template <int ID, int N>
__device__ __forceinline__ void mw2_bar_arrive() {
  asm volatile("bar.arrive %0, %1;" ::"n"(ID), "n"(N) : "memory");
}
// The stage's FULL / EMPTY barrier, st in {0, 1}, N threads.
template <int BASE, int N>
__device__ __forceinline__ void mw2_bar_sync_st(int st) {
  if (st) mw2_bar_sync<BASE + 1, N>();
  else mw2_bar_sync<BASE, N>();
}
template <int BASE, int N>
__device__ __forceinline__ void mw2_bar_arrive_st(int st) {
  if (st) mw2_bar_arrive<BASE + 1, N>();
  else mw2_bar_arrive<BASE, N>();
}
// bar.red.or over n threads of barrier id: whether any of them has p.
template <int ID, int N>
__device__ __forceinline__ bool mw2_bar_or(bool p) {
  u32 r;
  asm volatile(
      "{ .reg .pred p, q; setp.ne.u32 p, %1, 0; bar.red.or.pred q, %2, %3, p; selp.u32 %0, 1, 0, q; }"
      : "=r"(r)
      : "r"((u32)p), "n"(ID), "n"(N)
      : "memory");
  return r != 0;
}

// mwg_slot's first half: selection j's token (-1 past count).
__device__ __forceinline__ int mw2_token(const int* __restrict__ indices, int ld_idx, int qi, int count, int j) {
  if (j >= count) return -1;
  return indices ? __ldg(indices + (size_t)qi * ld_idx + j) : j;
}

// mwg_slot's second half: the token's cache slot, -1 outside [0, len).
__device__ __forceinline__ int mw2_slot(int t, int len, const int* __restrict__ block_table) {
  if (t < 0 || t >= len) return -1;
  return block_table ? block_table[t >> 6] * 64 + (t & 63) : t;
}

// Four fp8 (one u32) of a group to four fp16 (a uint2), wg's conversion.
__device__ __forceinline__ uint2 mw2_cvt4(u32 b, u32 m2, u32 p2) {
  return make_uint2(mwg_hmul2(mwg_hmul2(mwg_e4m3x2(b), m2), p2), mwg_hmul2(mwg_hmul2(mwg_e4m3x2(b >> 16), m2), p2));
}

// One latent chunk (16 fp8 of tile slot j, dims 16c..16c+15) with its
// group scale sc into the fp16 stage Kt, wg's conversion; zeros for a
// skipped slot (its cache slot ts < 0).
__device__ __forceinline__ void mw2_put_lat(u8* Kt, int j, int c, uint4 v, float sc, int ts) {
  const uint4 z4 = make_uint4(0u, 0u, 0u, 0u);
  u32 m2, p2;
  mwg_scale(sc, m2, p2);
  const uint2 a = mw2_cvt4(v.x, m2, p2), bb = mw2_cvt4(v.y, m2, p2);
  const uint2 cc = mw2_cvt4(v.z, m2, p2), d = mw2_cvt4(v.w, m2, p2);
  *(uint4*)(Kt + MWG_OFF(j, 16 * c)) = ts >= 0 ? make_uint4(a.x, a.y, bb.x, bb.y) : z4;
  *(uint4*)(Kt + MWG_OFF(j, 16 * c + 8)) = ts >= 0 ? make_uint4(cc.x, cc.y, d.x, d.y) : z4;
}

// One RoPE chunk (8 bf16 of tile slot j, chunk r) as fp16 into Kt; zeros
// for a skipped slot (*ts < 0; read after the conversion, where both
// callers' code read it).
__device__ __forceinline__ void mw2_put_rope(u8* Kt, int j, int r, uint4 x, const int* ts) {
  const uint4 z4 = make_uint4(0u, 0u, 0u, 0u);
  uint4 hv;
  hv.x = mwg_f16x2(__uint_as_float(x.x << 16), __uint_as_float(x.x & 0xffff0000u));
  hv.y = mwg_f16x2(__uint_as_float(x.y << 16), __uint_as_float(x.y & 0xffff0000u));
  hv.z = mwg_f16x2(__uint_as_float(x.z << 16), __uint_as_float(x.z & 0xffff0000u));
  hv.w = mwg_f16x2(__uint_as_float(x.w << 16), __uint_as_float(x.w & 0xffff0000u));
  *(uint4*)(Kt + MWG_OFF(j, MLA_LAT + 8 * r)) = *ts >= 0 ? hv : z4;
}

// The producer's conversion of one tile into the stage Kt: latent chunk c
// (16 bytes, dims 16c..16c+15) of token j for i = 0..15 (q = 4i + pw: row
// 8(q%8) + lane%8, chunk 4(q/8) + lane/8), RoPE chunk r (8 bf16) of token j
// for i = 0..3 (the same with q = 4i + pw). Three batches (latent i =
// 0..7, latent 8..15, RoPE), each batch's loads all issued before its first
// conversion (a skipped slot loads row 0 of the cache, always there, and
// stores zeros): three round trips to L2 a tile. (Fully unrolled, ptxas
// interleaves loads and conversions and spills at 120 registers.)
template <int NPW, int PB>
__device__ __forceinline__ void mw2_fill(u8* Kt, const u8* __restrict__ cache, const int* sls, int pw, int lane) {
#pragma unroll 1
  for (int b = 0; b < 64 / NPW / PB; b++) {
    uint4 v[PB];
    float sc[PB];
    int ts[PB];
#pragma unroll
    for (int u = 0; u < PB; u++) {
      const int q = NPW * (PB * b + u) + pw, j = 8 * (q & 7) + (lane & 7), c = 4 * (q >> 3) + (lane >> 3);
      ts[u] = sls[j];
      const u8* e = cache + (size_t)max(ts[u], 0) * MLA_TOK_BYTES;
      v[u] = __ldg((const uint4*)(e + 16 * c));
      sc[u] = __ldg((const float*)(e + MLA_LAT + 4 * (c >> 3)));
    }
#pragma unroll
    for (int u = 0; u < PB; u++) {
      const int q = NPW * (PB * b + u) + pw, j = 8 * (q & 7) + (lane & 7), c = 4 * (q >> 3) + (lane >> 3);
      mw2_put_lat(Kt, j, c, v[u], sc[u], ts[u]);
    }
  }
  uint4 rv[16 / NPW];
  int rt[16 / NPW];
#pragma unroll
  for (int i = 0; i < 16 / NPW; i++) {
    const int q = NPW * i + pw, j = 8 * (q & 7) + (lane & 7), r = 4 * (q >> 3) + (lane >> 3);
    rt[i] = sls[j];
    rv[i] = __ldg((const uint4*)(cache + (size_t)max(rt[i], 0) * MLA_TOK_BYTES + 528 + 16 * r));
  }
#pragma unroll
  for (int i = 0; i < 16 / NPW; i++) {
    const int q = NPW * i + pw, j = 8 * (q & 7) + (lane & 7), r = 4 * (q >> 3) + (lane >> 3);
    mw2_put_rope(Kt, j, r, rv[i], rt + i);
  }
}

// mw2_fill's conversion (the same per-element operations, so the same
// bits) from the raw tile the producer gathered into shared memory with
// cp.async (raw: 64 rows of MLA_TOK_BYTES, row j = tile slot j; a skipped
// slot's row is never written and its output is zeros, as mw2_fill's).
template <int NPW, int PB>
__device__ __forceinline__ void mw2_fill_raw(u8* Kt, const u8* raw, const int* sls, int pw, int lane) {
#pragma unroll 1
  for (int b = 0; b < 64 / NPW / PB; b++) {
#pragma unroll
    for (int u = 0; u < PB; u++) {
      const int q = NPW * (PB * b + u) + pw, j = 8 * (q & 7) + (lane & 7), c = 4 * (q >> 3) + (lane >> 3);
      const int ts = sls[j];
      const u8* e = raw + j * MLA_TOK_BYTES;
      mw2_put_lat(Kt, j, c, *(const uint4*)(e + 16 * c), *(const float*)(e + MLA_LAT + 4 * (c >> 3)), ts);
    }
  }
#pragma unroll
  for (int i = 0; i < 16 / NPW; i++) {
    const int q = NPW * i + pw, j = 8 * (q & 7) + (lane & 7), r = 4 * (q >> 3) + (lane >> 3);
    mw2_put_rope(Kt, j, r, *(const uint4*)(raw + j * MLA_TOK_BYTES + 528 + 16 * r), sls + j);
  }
}

// mla_decode_wg2b's row stride (floats) of the block's output staged in
// shared memory: 520 = 8 mod 32 banks, so a half-warp's float2 stores
// (rows g, g+1, .. 8 apart in banks) do not conflict.
#define MW2_OSTRIDE 520

// The block with NPW producer warps (mla_prefill_wg2: 4, 384 threads), PB
// latent chunks a producer thread has in flight, PREG / CREG the
// producer's and the consumers' registers after setmaxnreg (the consumers
// gain what the producers give up: 256 (CREG - R0) = 32 NPW (R0 - PREG),
// R0 = 168 the launch's). (8 producer warps, 512 threads, do not compile:
// at 128 registers a thread at launch ptxas refuses P.V's m64n256k16.)
// V (mla_decode_wg2b; 0 everywhere else): bit 1, the queries' loads four
// heads at a time (two round trips a warp, not four); bit 2, a block of
// one tile gathers it with cp.async into the unused second stage in one
// round trip and converts it from there (mw2_fill: three); bit 4, a split
// block's partial staged in shared memory and stored as whole rows; bit 8
// (mla_decode_wg2h), 32 heads a block instead of 64: rows 32..63 of the
// products run on zero queries and are never stored, so a block's query
// loads and partial stores halve while its gather and products stay. Each
// head's arithmetic is its own row's (no step mixes rows), so the same
// bits as V = 0. (Bit 16, 16 heads a block, mla_decode_wg2q, measured
// slower in session 38 and removed.)
template <int NPW, int PB, int PREG, int CREG, bool DEC = false, int V = 0>
__device__ __forceinline__ void mw2_block(MT_ARGS, const long long* __restrict__ row_base = nullptr) {
  constexpr int NT = 256 + 32 * NPW;  // the block's threads (FULL / EMPTY count)
  extern __shared__ uint4 mw2_smem[];
  u8* Kt0 = (u8*)mw2_smem;                            // 2 stages: 64 tokens x 576 dims, MWG_OFF
  u8* Qs = Kt0 + 2 * MWG_TILE_BYTES;                  // queries x 2^e: 64 heads x 576 dims, MWG_OFF
  u8* Ps = Qs + MWG_TILE_BYTES;                       // P: 64 heads x 64 tokens, MWG_OFF
  float* redm = (float*)(Ps + MWG_P_BYTES);           // [2 token halves][HB] row maxima
  float* alph = redm + 2 * MWG_HB;                    // [HB] the tile's rescale factor of O
  float* qsc = alph + MWG_HB;                         // [HB] score factor: scale x log2(e) x 2^-e
  float* lsum = qsc + MWG_HB;                         // [2][HB] row sums of each token half
  int* sl = (int*)(lsum + 2 * MWG_HB);                // [2 stages][T] cache slot of each tile slot, -1 skipped
  int* done = sl + 2 * MWG_T;                         // [2 stages] 1: no more tiles
  constexpr int HPB = (V & 8) ? 32 : MWG_HB;  // heads a block (the product rows stay MWG_HB)
  const int qi = blockIdx.y, h0 = blockIdx.z * HPB;
  const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5, g = lane >> 2, t4 = lane & 3;
  // DEC (mla_decode_wg2): block x takes the selections [x tps, x tps + tps)
  // and, split, writes its unnormalised partial; row qi's cache region is
  // row_base[qi] + cache where row bases are given (rows of several slots).
  if (DEC && row_base) cache += row_base[qi];
  const int len = lens[qi];
  const int begin = DEC ? (int)blockIdx.x * tps : 0;
  const int count = min(indices ? nidx : len, begin + tps);
  const int nt = count > begin ? (count - begin + MWG_T - 1) / MWG_T : 0;
  if (tid >= 256) {
    // The producer warps.
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(PREG) : "memory");
    const int pt = tid - 256, pw = pt >> 5;
    int n = 0;  // handoffs so far
    // mwg_slot in two halves: the selection's raw token is loaded one tile
    // ahead (its latency hidden behind this tile's fill), then checked and
    // mapped through the block table.
    int traw = pt < MWG_T ? mw2_token(indices, ld_idx, qi, count, begin + pt) : -1;
    for (int k = 0; k < nt; k++) {
      const int slot = mw2_slot(traw, len, block_table);
      traw = pt < MWG_T && k + 1 < nt ? mw2_token(indices, ld_idx, qi, count, begin + (k + 1) * MWG_T + pt) : -1;
      // A tile with no valid slot leaves m, l and O as they are (h1 skips its math): not handed off.
      if (!mw2_bar_or<MW2_BAR_P, 32 * NPW>(slot >= 0)) continue;
      const int st = n & 1;
      if (n >= 2) mw2_bar_sync_st<MW2_BAR_EMPTY, NT>(st);  // the consumers are done with handoff n - 2
      int* sls = sl + st * MWG_T;
      if (pt < MWG_T) sls[pt] = slot;
      if (pt == 0) done[st] = 0;
      mw2_bar_sync<MW2_BAR_P, 32 * NPW>();  // the slots are in
      if ((V & 2) && nt == 1) {
        // One tile: stage 1 is free, so the raw tile lands there in one round trip.
        u8* raw = Kt0 + MWG_TILE_BYTES;
        const u32 rb = mwg_smem_addr(raw);
        for (int c = pt; c < MWG_T * MWG_CH; c += 32 * NPW) {
          const int j = c / MWG_CH, p = c - j * MWG_CH, t = sls[j];
          if (t < 0) continue;
          asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(rb + (u32)(j * MLA_TOK_BYTES + p * 16)),
                       "l"(cache + (size_t)t * MLA_TOK_BYTES + p * 16)
                       : "memory");
        }
        asm volatile("cp.async.commit_group;" ::: "memory");
        asm volatile("cp.async.wait_all;" ::: "memory");
        mw2_bar_sync<MW2_BAR_P, 32 * NPW>();  // every producer thread's rows are in
        mw2_fill_raw<NPW, PB>(Kt0, raw, sls, pw, lane);
      } else {
        mw2_fill<NPW, PB>(Kt0 + st * MWG_TILE_BYTES, cache, sls, pw, lane);
      }
      mwg_fence_async();  // the tile visible to wgmma
      mw2_bar_arrive_st<MW2_BAR_FULL, NT>(st);
      n++;
    }
    const int st = n & 1;
    if (n >= 2) mw2_bar_sync_st<MW2_BAR_EMPTY, NT>(st);
    if (pt == 0) done[st] = 1;
    mw2_bar_arrive_st<MW2_BAR_FULL, NT>(st);
    if (n >= 1) mw2_bar_sync_st<MW2_BAR_EMPTY, NT>(((n - 1) & 1));  // the last tile's release
    return;
  }
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(CREG) : "memory");
  // Queries, as mla_prefill_wg: warp w takes heads 8w..8w+7, two at a time
  // (V & 1: four).
  constexpr int QR = (V & 1) ? 4 : 2;
  for (int hp = 0; hp < 8; hp += QR) {
    float4 v[QR][5];
#pragma unroll
    for (int r = 0; r < QR; r++) {
      const int h = h0 + 8 * w + hp + r;
      const float4 z4 = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
      for (int i = 0; i < 5; i++) v[r][i] = z4;
      if (h < H && (HPB == MWG_HB || 8 * w + hp + r < HPB)) {
        const size_t qh = (size_t)qi * H + h;
#pragma unroll
        for (int i = 0; i < 4; i++) v[r][i] = ((const float4*)(qn + qh * MLA_LAT))[lane + 32 * i];
        if (lane < 16) v[r][4] = ((const float4*)(qp + qh * MLA_ROPE))[lane];
      }
    }
#pragma unroll
    for (int r = 0; r < QR; r++) {
      const int hh = 8 * w + hp + r;
      float mx = 0.0f;
#pragma unroll
      for (int i = 0; i < 5; i++)
        mx = fmaxf(mx, fmaxf(fmaxf(fabsf(v[r][i].x), fabsf(v[r][i].y)), fmaxf(fabsf(v[r][i].z), fabsf(v[r][i].w))));
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
      int e = mx > 0.0f ? 14 - ((int)((__float_as_uint(mx) >> 23) & 0xffu) - 127) : 0;
      e = min(max(e, -126), 126);
      const float f = __uint_as_float((u32)(127 + e) << 23);
      if (lane == 0) qsc[hh] = scale * 1.4426950408889634f * __uint_as_float((u32)(127 - e) << 23);
#pragma unroll
      for (int i = 0; i < 5; i++) {
        if (i == 4 && lane >= 16) continue;
        const int d = i < 4 ? 4 * (lane + 32 * i) : MLA_LAT + 4 * lane;
        *(uint2*)(Qs + MWG_OFF(hh, d)) =
            make_uint2(mwg_f16x2(v[r][i].x * f, v[r][i].y * f), mwg_f16x2(v[r][i].z * f, v[r][i].w * f));
      }
    }
  }
  mwg_fence_async();  // the queries visible to wgmma
  mw2_bar_sync<MW2_BAR_C, 256>();
  // Roles as mla_prefill_wg: warp hg of warpgroup th (rows 16 hg + g, + 8);
  // QK^T tokens [32 th, +32), P.V output columns [256 th, +256).
  const int hg = w & 3, th = w >> 2;
  const int hr0 = 16 * hg + g, hr1 = hr0 + 8;
  const u32 kt_a0 = mwg_smem_addr(Kt0), qs_a = mwg_smem_addr(Qs), ps_a = mwg_smem_addr(Ps);
  const u32 qk_a0 = qs_a;
  float o[128];
#pragma unroll
  for (int i = 0; i < 128; i++) o[i] = 0.0f;
  float m0 = NEG_INF, m1 = NEG_INF, l0 = 0.0f, l1 = 0.0f;  // rows hr0, hr1 (l: this lane's share of this half)
  for (int k = 0;; k++) {
    const int st = k & 1;
    mw2_bar_sync_st<MW2_BAR_FULL, NT>(st);  // stage st is filled (or done)
    if (done[st]) break;
    const int* slk = sl + st * MWG_T;
    const u32 kt_a = kt_a0 + (u32)st * (u32)MWG_TILE_BYTES;
    const u32 qk_b0 = kt_a + (u32)(4 * th) * 128u;
    const u32 pv_b0 = kt_a + (u32)(32 * th * 8) * 128u;
    // S[64 heads][32 tokens of this warpgroup] over 576 dims.
    float s[16];
#pragma unroll
    for (int i = 0; i < 16; i++) s[i] = 0.0f;
    mwg_pin<16>(s);
    mwg_wg_fence();
#pragma unroll
    for (int ks = 0; ks < 36; ks++)
      mwg_m64n32<0>(s, mwg_desc(qk_a0 + 2048u * ks, 1024u, 128u), mwg_desc(qk_b0 + 2048u * ks, 1024u, 128u));
    mwg_wg_commit();
    mwg_wg_wait0();
    mwg_pin<16>(s);
    // From here on mla_prefill_h1's softmax (s[n][c] = s[4n + c]).
    const float f0 = qsc[hr0], f1 = qsc[hr1];
    float mx0 = NEG_INF, mx1 = NEG_INF;
#pragma unroll
    for (int n = 0; n < 4; n++) {
      const int col = 32 * th + 8 * n + 2 * t4;
      const bool va = slk[col] >= 0, vb = slk[col + 1] >= 0;
      s[4 * n + 0] = va ? s[4 * n + 0] * f0 : NEG_INF;
      s[4 * n + 1] = vb ? s[4 * n + 1] * f0 : NEG_INF;
      s[4 * n + 2] = va ? s[4 * n + 2] * f1 : NEG_INF;
      s[4 * n + 3] = vb ? s[4 * n + 3] * f1 : NEG_INF;
      mx0 = fmaxf(mx0, fmaxf(s[4 * n + 0], s[4 * n + 1]));
      mx1 = fmaxf(mx1, fmaxf(s[4 * n + 2], s[4 * n + 3]));
    }
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
    if (t4 == 0) {
      redm[th * MWG_HB + hr0] = mx0;
      redm[th * MWG_HB + hr1] = mx1;
    }
    mw2_bar_sync<MW2_BAR_C, 256>();  // both halves' maxima are in
    {
      const float nm0 = fmaxf(m0, fmaxf(redm[hr0], redm[MWG_HB + hr0]));
      const float nm1 = fmaxf(m1, fmaxf(redm[hr1], redm[MWG_HB + hr1]));
      const float al0 = nm0 == NEG_INF ? 1.0f : exp2f(m0 - nm0);
      const float al1 = nm1 == NEG_INF ? 1.0f : exp2f(m1 - nm1);
      float ls0 = 0.0f, ls1 = 0.0f;
#pragma unroll
      for (int n = 0; n < 4; n++) {
        s[4 * n + 0] = nm0 == NEG_INF ? 0.0f : exp2f(s[4 * n + 0] - nm0);
        s[4 * n + 1] = nm0 == NEG_INF ? 0.0f : exp2f(s[4 * n + 1] - nm0);
        s[4 * n + 2] = nm1 == NEG_INF ? 0.0f : exp2f(s[4 * n + 2] - nm1);
        s[4 * n + 3] = nm1 == NEG_INF ? 0.0f : exp2f(s[4 * n + 3] - nm1);
        ls0 += s[4 * n + 0] + s[4 * n + 1];
        ls1 += s[4 * n + 2] + s[4 * n + 3];
        const int col = 32 * th + 8 * n + 2 * t4;
        *(u32*)(Ps + MWG_OFF(hr0, col)) = mwg_f16x2(s[4 * n + 0], s[4 * n + 1]);
        *(u32*)(Ps + MWG_OFF(hr1, col)) = mwg_f16x2(s[4 * n + 2], s[4 * n + 3]);
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
    mwg_fence_async();             // P visible to wgmma
    mw2_bar_sync<MW2_BAR_C, 256>();  // P and the rescale factors are in
    // O[64 heads][256 columns of warpgroup th] = O x alpha + P . V.
    {
      const float a0 = alph[hr0], a1 = alph[hr1];
#pragma unroll
      for (int i = 0; i < 32; i++) {
        o[4 * i + 0] *= a0;
        o[4 * i + 1] *= a0;
        o[4 * i + 2] *= a1;
        o[4 * i + 3] *= a1;
      }
    }
    mwg_pin<128>(o);
    mwg_wg_fence();
#pragma unroll
    for (int kk = 0; kk < 4; kk++)
      mwg_m64n256<1>(o, mwg_desc(ps_a + 2048u * kk, 1024u, 128u), mwg_desc(pv_b0 + 256u * kk, 128u, 1024u));
    mwg_wg_commit();
    mwg_wg_wait0();
    mwg_pin<128>(o);
    mw2_bar_arrive_st<MW2_BAR_EMPTY, NT>(st);  // this warpgroup is done with stage st
  }
  l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
  l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
  if (t4 == 0) {
    lsum[th * MWG_HB + hr0] = l0;
    lsum[th * MWG_HB + hr1] = l1;
  }
  mw2_bar_sync<MW2_BAR_C, 256>();
  if (DEC && gridDim.x > 1) {
    // mla_combine's layout: part_o [q H + h][split][512] unnormalised,
    // part_ml [..][2] = (max in natural-log units, sum); m is kept in log2
    // units here (scores x log2 e), so the max is scaled back by ln 2.
    if (V & 4) {
      // The stages are free (every wgmma waited on): O goes through them so
      // that each head's 2 KB leaves as whole rows of 16-byte stores.
      float* os = (float*)Kt0;
#pragma unroll
      for (int hr = 0; hr < 2; hr++) {
        float* orow = os + (hr ? hr1 : hr0) * MW2_OSTRIDE + 256 * th + 2 * t4;
#pragma unroll
        for (int i = 0; i < 32; i++) *(float2*)(orow + 8 * i) = make_float2(o[4 * i + 2 * hr], o[4 * i + 2 * hr + 1]);
      }
      mw2_bar_sync<MW2_BAR_C, 256>();
      const int c4 = tid & 127;
#pragma unroll 4
      for (int hb = tid >> 7; hb < HPB; hb += 2) {
        const int h = h0 + hb;
        if (h >= H) break;
        const size_t pz = ((size_t)qi * H + h) * gridDim.x + blockIdx.x;
        ((float4*)(part_o + pz * MLA_LAT))[c4] = *(const float4*)(os + hb * MW2_OSTRIDE + 4 * c4);
      }
    }
#pragma unroll
    for (int hr = 0; hr < 2; hr++) {
      const int hb = hr ? hr1 : hr0, h = h0 + hb;
      if (h >= H || (HPB < MWG_HB && hb >= HPB)) continue;
      const size_t pz = ((size_t)qi * H + h) * gridDim.x + blockIdx.x;
      float* po = part_o + pz * MLA_LAT + 256 * th + 2 * t4;
      if (!(V & 4)) {
#pragma unroll
        for (int i = 0; i < 32; i++) *(float2*)(po + 8 * i) = make_float2(o[4 * i + 2 * hr], o[4 * i + 2 * hr + 1]);
      }
      if (th == 0 && t4 == 0) {
        const float m = hr ? m1 : m0;
        part_ml[2 * pz] = m == NEG_INF ? NEG_INF : m * 0.6931471805599453f;
        part_ml[2 * pz + 1] = lsum[hb] + lsum[MWG_HB + hb];
      }
    }
    return;
  }
  if (lse && th == 0 && t4 == 0) {
#pragma unroll
    for (int hr = 0; hr < 2; hr++) {
      const int hb = hr ? hr1 : hr0, h = h0 + hb;
      const float l = lsum[hb] + lsum[MWG_HB + hb], m = hr ? m1 : m0;
      if (h < H && (HPB == MWG_HB || hb < HPB)) lse[(size_t)qi * H + h] = l > 0.0f ? m * 0.6931471805599453f + logf(l) : NEG_INF;
    }
  }
#pragma unroll
  for (int hr = 0; hr < 2; hr++) {
    const int hb = hr ? hr1 : hr0, h = h0 + hb;
    if (h >= H || (HPB < MWG_HB && hb >= HPB)) continue;
    const float l = lsum[hb] + lsum[MWG_HB + hb];
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
    float* po = out + ((size_t)qi * H + h) * MLA_LAT + 256 * th + 2 * t4;
#pragma unroll
    for (int i = 0; i < 32; i++) *(float2*)(po + 8 * i) = make_float2(o[4 * i + 2 * hr] * inv, o[4 * i + 2 * hr + 1] * inv);
  }
}

extern "C" __global__ void __launch_bounds__(384, 1) mla_prefill_wg2(MT_ARGS) {
  mw2_block<4, 8, MW2_PREG, MW2_CREG>(qn, qp, cache, block_table, indices, ld_idx, nidx, lens, out, lse, H, scale, tps, part_o,
                                      part_ml);
}

// mla_decode_wg2: the decode step's sparse MLA on mla_prefill_wg2's block
// (the same one-fp16-part arithmetic), the selections split over blockIdx.x
// (tps each, whole 64-token tiles) so that a row's two head blocks fill the
// SMs; each split writes its partial for mla_combine (gridDim.x > 1).
// row_base: per-row cache bases of rows of several slots (or null).
extern "C" __global__ void __launch_bounds__(384, 1) mla_decode_wg2(MT_ARGS, const long long* __restrict__ row_base) {
  mw2_block<4, 8, MW2_PREG, MW2_CREG, true>(qn, qp, cache, block_table, indices, ld_idx, nidx, lens, out, lse, H, scale, tps,
                                            part_o, part_ml, row_base);
}

// mla_decode_wg2b: mla_decode_wg2 (the same bits) with mw2_block's V = 7
// (queries four heads a round, a one-tile block's gather in one cp.async
// round trip, the partial stored as whole rows) and a programmatic launch.
extern "C" __global__ void __launch_bounds__(384, 1) mla_decode_wg2b(MT_ARGS, const long long* __restrict__ row_base) {
  PDL_WAIT();
  mw2_block<4, 8, MW2_PREG, MW2_CREG, true, 7>(qn, qp, cache, block_table, indices, ld_idx, nidx, lens, out, lse, H, scale,
                                               tps, part_o, part_ml, row_base);
}

// mla_decode_wg2h: mla_decode_wg2b (the same bits) on 32 heads a block
// (mw2_block's V bit 8): twice the blocks, each with half the query loads
// and half the partial stores of a one-tile block (MLADecodeWG2 with
// MLAHeadsPerBlock).
extern "C" __global__ void __launch_bounds__(384, 1) mla_decode_wg2h(MT_ARGS, const long long* __restrict__ row_base) {
  PDL_WAIT();
  mw2_block<4, 8, MW2_PREG, MW2_CREG, true, 15>(qn, qp, cache, block_table, indices, ld_idx, nidx, lens, out, lse, H, scale,
                                                tps, part_o, part_ml, row_base);
}
#else
extern "C" __global__ void __launch_bounds__(384) mla_decode_wg2b(MT_ARGS, const long long* __restrict__ row_base) { __trap(); }
extern "C" __global__ void __launch_bounds__(384) mla_decode_wg2h(MT_ARGS, const long long* __restrict__ row_base) { __trap(); }
extern "C" __global__ void __launch_bounds__(384) mla_prefill_wg2(MT_ARGS) { __trap(); }
extern "C" __global__ void __launch_bounds__(384) mla_decode_wg2(MT_ARGS, const long long* __restrict__ row_base) { __trap(); }
#endif
