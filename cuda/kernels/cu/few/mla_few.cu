// mla_decode_few (TILERT_GPU_MLA_FEW=1; its own module, kernels_few.go): the
// sparse MLA decode of mla_decode_tcf for few heads (H <= 32: a TP-8 shard's
// 16 or 8, 32), the tokens split over many blocks. mla_decode_tcf takes one
// 32-token tile of 16 heads a block, so 16 heads x 2048 tokens are 64 blocks
// of one long chain each (~1540 instructions a warp a tile). Here a block is
// 8 heads x a range of whole 16-token chunks (grid: splits x rows x head
// groups of 8; 16 heads x 2048 tokens = 256 blocks of one chunk), 256
// threads, float32 arithmetic on the CUDA cores:
// - the chunk's raw entries (16 x 656 bytes) land in shared memory by
//   cp.async (skipped slots zero-filled), the next chunk's in flight while
//   this one is computed;
// - scores: warp w takes tokens 2w, 2w+1; lane l dequantises dims
//   128i + 4l .. +3 (i < 4) and RoPE dims 2l, 2l+1 of both (value x group
//   scale, float32), reads each head's query dims from shared memory
//   and the 16 (head, token) partials are reduced over the warp by a
//   transposing butterfly (lane l < 16 ends with head l & 7 of token l >> 3);
// - softmax per head over the chunk with a running max and sum (expf of
//   scaled scores, as mla_decode_tc: the same (max, sum) partials);
// - P.V: thread t owns output columns 2t, 2t+1 of the 8 heads.
// Partials (unnormalised o, max, sum) in mla_decode_tc's workspace layout;
// mla_combine_few merges them (the same weights exp(m_z - M), sum and lse
// as mla_combine_wide, the splits summed in 16 interleaved chains then in a
// fixed order: run-to-run identical). One split: out and lse written
// directly.

#define MFW_TT 16      // tokens a chunk
#define MFW_HB 8       // heads a block
#define MFW_CH 41      // 16-byte pieces of an entry
#define MFW_TOK 656    // bytes of an entry
#define MFW_LAT 512
#define MFW_ROPE 64
#define MFW_QD 576     // query floats of a head (latent + rope)

#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 890
__device__ __forceinline__ float2 mfw_e4m3x2(u32 x) {  // two e4m3 bytes (low first) to floats, exact
  u32 r;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(r) : "h"((u16)(x & 0xffffu)));
  float lo, hi;
  asm("cvt.f32.f16 %0, %1;" : "=f"(lo) : "h"((u16)(r & 0xffffu)));
  asm("cvt.f32.f16 %0, %1;" : "=f"(hi) : "h"((u16)(r >> 16)));
  return make_float2(lo, hi);
}
#define MFW_OK 1
#else
#define MFW_OK 0
#endif

__device__ __forceinline__ int mfw_slot(const int* __restrict__ indices, const int* __restrict__ block_table, int ld_idx,
                                        int qi, int len, int count, int j) {
  if (j >= count) return -1;
  const int t = indices ? indices[(size_t)qi * ld_idx + j] : j;
  if (t < 0 || t >= len) return -1;
  return block_table ? block_table[t >> 6] * 64 + (t & 63) : t;
}

// The chunk's entries into raw (16 tokens x 41 pieces; 256 threads), a
// skipped slot's zero-filled; one commit group.
__device__ __forceinline__ void mfw_issue(int tid, uint4* raw, const u8* __restrict__ cache, const int* slots) {
  for (int p = tid; p < MFW_TT * MFW_CH; p += 256) {
    const int j = p / MFW_CH, c = p - j * MFW_CH;
    const int t = slots[j];
    if (t < 0) {
      raw[p] = make_uint4(0u, 0u, 0u, 0u);
    } else {
      u32 d;
      asm("{ .reg .u64 a; cvta.to.shared.u64 a, %1; cvt.u32.u64 %0, a; }" : "=r"(d) : "l"(raw + p));
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(d), "l"(cache + (size_t)t * MFW_TOK + 16 * c)
                   : "memory");
    }
  }
  asm volatile("cp.async.commit_group;" ::: "memory");
}

// One butterfly step: of its 2S values a lane keeps the upper S where it
// has bit S (the lower otherwise), added to the partner's same half.
template <int S>
__device__ __forceinline__ void mfw_bfly(float* part, int lane) {
  const bool up = (lane & S) != 0;
#pragma unroll
  for (int i = 0; i < S; i++) {
    const float send = up ? part[i] : part[i + S];
    const float keep = up ? part[i + S] : part[i];
    part[i] = keep + __shfl_xor_sync(0xffffffffu, send, S);
  }
}

// Shared memory (static): queries 8 x 576 floats, two raw chunks, scores /
// probabilities [8][16], slots [2][16], running max / sum / rescale [8].
extern "C" __global__ void __launch_bounds__(256) mla_decode_few(
    const float* __restrict__ qn, const float* __restrict__ qp, const u8* __restrict__ cache,
    const int* __restrict__ block_table, const int* __restrict__ indices, int ld_idx, int nidx,
    const int* __restrict__ lens, float* out, float* lse, int H, float scale, int tps, float* part_o, float* part_ml,
    const long long* __restrict__ row_base) {
  PDL_WAIT();
#if MFW_OK
  __shared__ __align__(16) float Qs[MFW_HB * MFW_QD];
  __shared__ __align__(16) uint4 raw[2][MFW_TT * MFW_CH];
  __shared__ __align__(16) float P[MFW_HB][MFW_TT];
  __shared__ int slots[2][MFW_TT];
  __shared__ float mrun[MFW_HB], lrun[MFW_HB], corr[MFW_HB];
  const int z = blockIdx.x, qi = blockIdx.y, h0 = blockIdx.z * MFW_HB;
  const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
  if (row_base) cache += row_base[qi];
  const int len = lens[qi];
  const int begin = z * tps;
  const int count = min(indices ? nidx : len, begin + tps);
  if (tid < MFW_TT) {
    // The first chunk's slots: with a selection the index load does not
    // wait for the row's length (only the range check does), so the two
    // round trips overlap. The same slots as mfw_slot.
    const int j = begin + tid;
    int t = j;
    if (indices) t = j < min(nidx, begin + tps) ? indices[(size_t)qi * ld_idx + j] : -1;
    if (j >= count || t < 0 || t >= len) t = -1;
    slots[0][tid] = t >= 0 && block_table ? block_table[t >> 6] * 64 + (t & 63) : t;
  }
  if (tid < MFW_HB) {
    mrun[tid] = NEG_INF;
    lrun[tid] = 0.0f;
  }
  // Queries of heads h0 .. h0+7 (zeros past H) loaded into registers now,
  // stored after the first chunk's gather is issued: the two round trips
  // overlap (the loop's first barrier orders the stores before the reads).
  constexpr int QV = MFW_HB * (MFW_QD / 4);  // float4 of the block's queries
  float4 qv[(QV + 255) / 256];
#pragma unroll
  for (int u = 0; u < (QV + 255) / 256; u++) {
    const int i = tid + 256 * u;
    const int hh = i / (MFW_QD / 4), d = (i - hh * (MFW_QD / 4)) * 4, h = h0 + hh;
    qv[u] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (i < QV && h < H) {
      const size_t qh = (size_t)qi * H + h;
      qv[u] = d < MFW_LAT ? *(const float4*)(qn + qh * MFW_LAT + d) : *(const float4*)(qp + qh * MFW_ROPE + d - MFW_LAT);
    }
  }
  __syncthreads();  // the first chunk's slots
  if (begin < count) mfw_issue(tid, raw[0], cache, slots[0]);
#pragma unroll
  for (int u = 0; u < (QV + 255) / 256; u++) {
    const int i = tid + 256 * u;
    const int hh = i / (MFW_QD / 4), d = (i - hh * (MFW_QD / 4)) * 4;
    if (i < QV) *(float4*)(Qs + hh * MFW_QD + d) = qv[u];
  }
  float acc[MFW_HB][2];
#pragma unroll
  for (int h = 0; h < MFW_HB; h++) acc[h][0] = acc[h][1] = 0.0f;
  int it = 0;
  for (int base = begin; base < count; base += MFW_TT, it++) {
    const int cur = it & 1, nxt = cur ^ 1;
    const bool more = base + MFW_TT < count;
    if (more && tid < MFW_TT) slots[nxt][tid] = mfw_slot(indices, block_table, ld_idx, qi, len, count, base + MFW_TT + tid);
    asm volatile("cp.async.wait_all;" ::: "memory");
    __syncthreads();  // chunk it landed (all threads' copies), the next chunk's slots written, P of it-1 consumed
    if (more) mfw_issue(tid, raw[nxt], cache, slots[nxt]);
    const u8* tb = (const u8*)raw[cur];
    // Scores of tokens 2w, 2w+1.
    float part[16];  // [tk * 8 + h]
    {
      float k[2][18];
#pragma unroll
      for (int tk = 0; tk < 2; tk++) {
        const u8* e = tb + (2 * w + tk) * MFW_TOK;
#pragma unroll
        for (int i = 0; i < 4; i++) {
          const u32 x = *(const u32*)(e + 128 * i + 4 * lane);
          const float s = *(const float*)(e + MFW_LAT + 4 * i);
          const float2 a = mfw_e4m3x2(x), b = mfw_e4m3x2(x >> 16);
          k[tk][4 * i] = a.x * s;
          k[tk][4 * i + 1] = a.y * s;
          k[tk][4 * i + 2] = b.x * s;
          k[tk][4 * i + 3] = b.y * s;
        }
        const u32 r = *(const u32*)(e + MFW_LAT + 16 + 4 * lane);
        k[tk][16] = __uint_as_float(r << 16);
        k[tk][17] = __uint_as_float(r & 0xffff0000u);
      }
#pragma unroll
      for (int h = 0; h < MFW_HB; h++) {
        const float* q = Qs + h * MFW_QD;
        float s0 = 0.0f, s1 = 0.0f;
#pragma unroll
        for (int i = 0; i < 4; i++) {
          const float4 v = *(const float4*)(q + 128 * i + 4 * lane);
          s0 = fmaf(v.x, k[0][4 * i], s0);
          s0 = fmaf(v.y, k[0][4 * i + 1], s0);
          s0 = fmaf(v.z, k[0][4 * i + 2], s0);
          s0 = fmaf(v.w, k[0][4 * i + 3], s0);
          s1 = fmaf(v.x, k[1][4 * i], s1);
          s1 = fmaf(v.y, k[1][4 * i + 1], s1);
          s1 = fmaf(v.z, k[1][4 * i + 2], s1);
          s1 = fmaf(v.w, k[1][4 * i + 3], s1);
        }
        const float2 r = *(const float2*)(q + MFW_LAT + 2 * lane);
        s0 = fmaf(r.x, k[0][16], s0);
        s0 = fmaf(r.y, k[0][17], s0);
        s1 = fmaf(r.x, k[1][16], s1);
        s1 = fmaf(r.y, k[1][17], s1);
        part[h] = s0;
        part[8 + h] = s1;
      }
    }
    // Butterfly: xor 16 sums all 16 values; xor 8, 4, 2, 1 each halve the
    // values a lane keeps (the upper half where the lane has the bit), so
    // lane l ends with value l & 15 summed over the warp.
#pragma unroll
    for (int i = 0; i < 16; i++) part[i] += __shfl_xor_sync(0xffffffffu, part[i], 16);
    mfw_bfly<8>(part, lane);
    mfw_bfly<4>(part, lane);
    mfw_bfly<2>(part, lane);
    mfw_bfly<1>(part, lane);
    if (lane < 16) {
      const int tk = lane >> 3, h = lane & 7, j = 2 * w + tk;
      P[h][j] = slots[cur][j] >= 0 ? part[0] * scale : NEG_INF;
    }
    __syncthreads();
    // Softmax of the chunk: threads 0..127 = head tid >> 4, token tid & 15.
    if (tid < MFW_HB * MFW_TT) {
      const int h = tid >> 4, j = tid & 15;
      const float s = P[h][j];
      float mx = s;
#pragma unroll
      for (int o = 8; o >= 1; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
      const float mo = mrun[h];
      const float mn = fmaxf(mo, mx);
      const float p = mn == NEG_INF ? 0.0f : expf(s - mn);  // a skipped slot: 0
      float sp = p;
#pragma unroll
      for (int o = 8; o >= 1; o >>= 1) sp += __shfl_xor_sync(0xffffffffu, sp, o);
      const float c = mn == NEG_INF ? 1.0f : expf(mo - mn);  // first valid chunk: 0 (o and l are 0)
      __syncwarp();
      P[h][j] = p;
      if (j == 0) {
        corr[h] = c;
        mrun[h] = mn;
        lrun[h] = lrun[h] * c + sp;
      }
    }
    __syncthreads();
    // P.V: columns 2 tid, 2 tid + 1 (latent group tid >> 6).
    {
      const int c0 = 2 * tid, grp = tid >> 6;
#pragma unroll
      for (int h = 0; h < MFW_HB; h++) {
        const float c = corr[h];
        acc[h][0] *= c;
        acc[h][1] *= c;
      }
#pragma unroll
      for (int j4 = 0; j4 < MFW_TT; j4 += 4) {
        float2 v[4];
#pragma unroll
        for (int u = 0; u < 4; u++) {
          const u8* e = tb + (j4 + u) * MFW_TOK;
          const float s = *(const float*)(e + MFW_LAT + 4 * grp);
          const float2 a = mfw_e4m3x2(*(const u16*)(e + c0));
          v[u] = make_float2(a.x * s, a.y * s);
        }
#pragma unroll
        for (int h = 0; h < MFW_HB; h++) {
          const float4 p = *(const float4*)(&P[h][j4]);
          acc[h][0] = fmaf(p.x, v[0].x, acc[h][0]);
          acc[h][1] = fmaf(p.x, v[0].y, acc[h][1]);
          acc[h][0] = fmaf(p.y, v[1].x, acc[h][0]);
          acc[h][1] = fmaf(p.y, v[1].y, acc[h][1]);
          acc[h][0] = fmaf(p.z, v[2].x, acc[h][0]);
          acc[h][1] = fmaf(p.z, v[2].y, acc[h][1]);
          acc[h][0] = fmaf(p.w, v[3].x, acc[h][0]);
          acc[h][1] = fmaf(p.w, v[3].y, acc[h][1]);
        }
      }
    }
  }
  asm volatile("cp.async.wait_all;" ::: "memory");
  __syncthreads();  // mrun / lrun final (an empty range: NEG_INF, 0)
  const int c0 = 2 * tid;
#pragma unroll
  for (int hh = 0; hh < MFW_HB; hh++) {
    const int h = h0 + hh;
    if (h >= H) break;
    const size_t qh = (size_t)qi * H + h;
    const float m = mrun[hh], l = lrun[hh];
    if (gridDim.x > 1) {
      const size_t pz = qh * gridDim.x + z;
      *(float2*)(part_o + pz * MFW_LAT + c0) = make_float2(acc[hh][0], acc[hh][1]);
      if (tid == 0) {
        part_ml[2 * pz] = m;
        part_ml[2 * pz + 1] = l;
      }
    } else {
      const float f = l > 0.0f ? 1.0f / l : 0.0f;
      *(float2*)(out + qh * MFW_LAT + c0) = make_float2(acc[hh][0] * f, acc[hh][1] * f);
      if (lse && tid == 0) lse[qh] = l > 0.0f ? m + logf(l) : NEG_INF;
    }
  }
#else
  __trap();
#endif
}

// mla_combine_few: the partials of mla_decode_few (part_o [q*H+h][nsplit][512],
// part_ml [..][2] = (max, sum)) merged as mla_combine_wide merges them
// (weights exp(m_z - M), an empty range weight 0, out = sum w o / L, lse =
// M + log L), spread wider: grid (nq*H, 16 chunks of 32 columns), 128
// threads; thread (c = tid & 7, r = tid >> 3) sums float4 column c of the
// chunk over splits r, r+16, ...: the first 8 of them (all of 128 splits)
// loaded before the weights are computed, so their round trip overlaps the
// max / sum; then the 16 chains are added in order r = 0..15 (run-to-run
// identical). nsplit <= 1024.
#define MFC_R 16  // split chains
#define MFC_PRE 8 // loads a chain issues first
extern "C" __global__ void __launch_bounds__(128) mla_combine_few(const float* __restrict__ part_o,
                                                                  const float* __restrict__ part_ml, int nsplit,
                                                                  float* out, float* lse) {
  PDL_WAIT();
  __shared__ float wz[1024];
  __shared__ float red[4];
  __shared__ __align__(16) float4 sacc[MFC_R][8];
  const size_t qh = blockIdx.x;
  const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5, c = tid & 7, r = tid >> 3;
  const int col = blockIdx.y * 32 + 4 * c;
  const float* po = part_o + qh * nsplit * MFW_LAT + col;
  float4 pre[MFC_PRE];
#pragma unroll
  for (int i = 0; i < MFC_PRE; i++) {
    const int z = r + MFC_R * i;
    pre[i] = z < nsplit ? *(const float4*)(po + (size_t)z * MFW_LAT) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }
  const float* ml = part_ml + 2 * qh * nsplit;
  float mz = NEG_INF;
  for (int z = tid; z < nsplit; z += 128) mz = fmaxf(mz, ml[2 * z]);
#pragma unroll
  for (int o = 16; o >= 1; o >>= 1) mz = fmaxf(mz, __shfl_xor_sync(0xffffffffu, mz, o));
  if (lane == 0) red[w] = mz;
  __syncthreads();
  const float M = fmaxf(fmaxf(red[0], red[1]), fmaxf(red[2], red[3]));
  float lz = 0.0f;
  for (int z = tid; z < nsplit; z += 128) {
    const float m = ml[2 * z];
    const float wt = m == NEG_INF ? 0.0f : expf(m - M);
    wz[z] = wt;
    lz += ml[2 * z + 1] * wt;
  }
#pragma unroll
  for (int o = 16; o >= 1; o >>= 1) lz += __shfl_xor_sync(0xffffffffu, lz, o);
  __syncthreads();  // red's maxima read by all; wz written
  if (lane == 0) red[w] = lz;
  __syncthreads();
  const float L = (red[0] + red[1]) + (red[2] + red[3]);
  float4 a = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
  for (int i = 0; i < MFC_PRE; i++) {
    const int z = r + MFC_R * i;
    const float wt = z < nsplit ? wz[z] : 0.0f;
    a.x = fmaf(pre[i].x, wt, a.x);
    a.y = fmaf(pre[i].y, wt, a.y);
    a.z = fmaf(pre[i].z, wt, a.z);
    a.w = fmaf(pre[i].w, wt, a.w);
  }
#pragma unroll 4
  for (int z = r + MFC_R * MFC_PRE; z < nsplit; z += MFC_R) {
    const float wt = wz[z];
    const float4 v = *(const float4*)(po + (size_t)z * MFW_LAT);
    a.x = fmaf(v.x, wt, a.x);
    a.y = fmaf(v.y, wt, a.y);
    a.z = fmaf(v.z, wt, a.z);
    a.w = fmaf(v.w, wt, a.w);
  }
  sacc[r][c] = a;
  __syncthreads();
  if (tid < 8) {
    float4 t = sacc[0][c];
#pragma unroll
    for (int i = 1; i < MFC_R; i++) {
      const float4 b = sacc[i][c];
      t.x += b.x;
      t.y += b.y;
      t.z += b.z;
      t.w += b.w;
    }
    const float inv = L > 0.0f ? 1.0f / L : 0.0f;
    *(float4*)(out + qh * MFW_LAT + col) = make_float4(t.x * inv, t.y * inv, t.z * inv, t.w * inv);
    if (lse && blockIdx.y == 0 && tid == 0) lse[qh] = L > 0.0f ? M + logf(L) : NEG_INF;
  }
}
