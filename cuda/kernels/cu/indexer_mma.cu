// Lightning indexer on the tensor cores (serving mode, fp8 pages).
//
// The scores are a GEMM per row: 64 heads x 128 (the fp8 query) against
// T x 128 fp8 keys. e4m3 values are exact in f16, so mma.sync m16n8k16 with
// f16 inputs and float32 accumulation forms every head's dot product of the
// fp8 codes with exact products; the power-of-two scales come out of the
// ReLU: score[t] = ks[t] * sum_h wq[h] * relu(sum_k q8[h][k] * k8[t][k]),
// with wq[h] = w[h] * H^-0.5 * qk_scale * qs[h] (idx_q_prep).
//
// The query is stored once per row as fp8 codes in mma fragment order
// (IDXQ_ROW_BYTES per row, 64 heads, heads >= H zero): byte
// ((mt*8 + ks)*32 + lane)*8 + j holds head 16mt + g + 8*hi, dimension
// P(ks, c) + off, where g = lane/4, c = lane%4, j = 2*hi + off (off 0, 1)
// or 4 + 2*hi + off - 2 (off 2, 3), and P(ks, c) = 16c + 4ks (ks < 4) or
// 64 + 16c + 4(ks - 4). That permutation of the k dimension (the same for
// the query and the keys, so the dot products are unchanged) lets a thread
// load its key bytes of all eight k-steps as two 16-byte loads.

#define IDXQ_ROW_BYTES 8192
#define IDXQ_HEADS 64
#define IDXM_BINS 4096  // TKR_BINS of topk_radix.cu (defined after this file)

__device__ __forceinline__ u32 e4m3x2_to_f16x2(u32 v) {
#if __CUDA_ARCH__ >= 890
  u32 r;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(r) : "h"((u16)(v & 0xffffu)));
  return r;
#else
  // e4m3 -> f16 by the bit rule: the exponent field reinterpreted with
  // f16's bias is 2^-8 of the value (subnormals included); scale by 256.
  u32 h = ((v & 0x80u) << 8) | ((v & 0x7fu) << 7) | ((v & 0x8000u) << 16) | ((v & 0x7f00u) << 15);
  u32 r;
  asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(r) : "r"(h), "r"(0x5c005c00u));
  return r;
#endif
}

__device__ __forceinline__ void mma_f16_16816(float* d, const uint4& a, u32 b0, u32 b1) {
#if __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a.x), "r"(a.y), "r"(a.z), "r"(a.w), "r"(b0), "r"(b1));
#else
  __trap();  // the launcher refuses devices below sm_80
#endif
}

__device__ __forceinline__ u32 u4_word(const uint4& v, int i) { return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w; }

// RoPE (the rope kernel's arithmetic) over dimensions [0, rot) of each head,
// then per head the fp8 ue8m0 quantisation of eng_quant_ue8m0, written as
// codes in fragment order, and wq[h] = w[h] * wscale * scale[h] (0 for
// h >= H). q: [M][H][128] (before RoPE), w: [M][H], qh: [M][8192] bytes,
// wq: [M][64]. grid (4, M), 512 threads: a warp per head, 4 values a lane.
// idx_q_prep_body is one block's work (heads 16*hb.., row m), also run by
// fused.cu's attn_epilogue; idx_q_prep_body_s (attn_epilogue_qs,
// TILERT_GPU_QA_NORM=late) first multiplies each loaded value by
// rq = rsqrt(sum(ss[0..nss)) / K + eps), the partials loaded after the
// query's own load (each warp: lane i from ss[i] in steps of 32, then the
// butterfly).
template <bool QS>
__device__ __forceinline__ void idx_q_prep_t(const float* __restrict__ q, const float* __restrict__ w,
                                             const int* __restrict__ pos, const float* __restrict__ cos_t,
                                             const float* __restrict__ sin_t, u8* qh, float* wq, int H, int rot,
                                             int interleaved, float wscale, int hb, int m,
                                             const float* __restrict__ ss, int nss, int K, float eps) {
  const int lane = threadIdx.x & 31, h = hb * 16 + (threadIdx.x >> 5);
  float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  float sc = 1.0f;
  u32 code = 0;
  if (h < H) {  // warp-uniform
    const float4 x = ((const float4*)(q + ((size_t)m * H + h) * IDX_D))[lane];
    // The position and this lane's RoPE table entries go out before the
    // query's scale is summed (their round trips beside the query's and the
    // partials', not after them); the same entries as the RoPE below reads.
    const int half = rot >> 1, p = pos[m];
    const float* ct = cos_t + (size_t)p * half;
    const float* st = sin_t + (size_t)p * half;
    float cs[4] = {0.0f, 0.0f, 0.0f, 0.0f}, sn[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int b = 0; b < 4; b++) {
      const int d = 4 * lane + b;
      if (d < rot && (!interleaved || (b & 1) == 0)) {
        const int e = interleaved ? d >> 1 : (d < half ? d : d - half);
        cs[b] = ct[e];
        sn[b] = st[e];
      }
    }
    v[0] = x.x;
    v[1] = x.y;
    v[2] = x.z;
    v[3] = x.w;
    if constexpr (QS) {  // h < H is warp-uniform: every lane sums
      const float a = ss_lane_sum(ss, nss, lane);
      const float rq = rsqrtf(warp_sum(a) / (float)K + eps);
#pragma unroll
      for (int b = 0; b < 4; b++) v[b] = v[b] * rq;
    }
    BLOCK_MARK(3);
    float r[4] = {v[0], v[1], v[2], v[3]};
    if (interleaved) {
#pragma unroll
      for (int b = 0; b < 4; b += 2) {
        const int d = 4 * lane + b;
        if (d < rot) {
          const float c = cs[b], s = sn[b];
          const float a = v[b], bb = v[b + 1];
          r[b] = a * c - bb * s;
          r[b + 1] = bb * c + a * s;
        }
      }
    } else {
      // Partner of dimension d: d + half (d < half) or d - half, in the
      // lane half/4 away (the launcher checks half % 4 == 0).
      const int q4 = half >> 2;
      const int src = (4 * lane < half) ? lane + q4 : (lane >= q4 ? lane - q4 : lane);
      float pv[4];
#pragma unroll
      for (int b = 0; b < 4; b++) pv[b] = __shfl_sync(0xffffffffu, v[b], src);
#pragma unroll
      for (int b = 0; b < 4; b++) {
        const int d = 4 * lane + b;
        if (d < half) {
          const float c = cs[b], s = sn[b];
          const float a = v[b], bb = pv[b];
          r[b] = a * c - bb * s;
        } else if (d < rot) {
          const float c = cs[b], s = sn[b];
          const float a = pv[b], bb = v[b];
          r[b] = bb * c + a * s;
        }
      }
    }
    const float amax = warp_max(fmaxf(fmaxf(fabsf(r[0]), fabsf(r[1])), fmaxf(fabsf(r[2]), fabsf(r[3]))));
    sc = ue8m0_ceil_f32(fmaxf(amax, 1e-10f) / FP8_MAX);
    code = (u32)f32_to_fp8(r[0] / sc) | ((u32)f32_to_fp8(r[1] / sc) << 8) | ((u32)f32_to_fp8(r[2] / sc) << 16) |
           ((u32)f32_to_fp8(r[3] / sc) << 24);
    BLOCK_MARK(4);
  }
  // Dimensions 4*lane..4*lane+3 share k-step and column group.
  const int d = 4 * lane, dd = d & 63;
  const int ks = ((d >> 6) << 2) + ((dd & 15) >> 2), c = dd >> 4;
  const int mt = h >> 4, rr = h & 15, g = rr & 7, hi = rr >> 3;
  u8* o = qh + (size_t)m * IDXQ_ROW_BYTES + ((size_t)((mt * 8 + ks) * 32 + g * 4 + c)) * 8;
  ((u16*)o)[hi] = (u16)(code & 0xffffu);
  ((u16*)o)[2 + hi] = (u16)(code >> 16);
  if (lane == 0) wq[(size_t)m * IDXQ_HEADS + h] = h < H ? w[(size_t)m * H + h] * wscale * sc : 0.0f;
  if (h < H) BLOCK_MARK(5);  // a block past the heads stores zeros only: not a query block's time
}

__device__ void idx_q_prep_body(const float* __restrict__ q, const float* __restrict__ w, const int* __restrict__ pos,
                                const float* __restrict__ cos_t, const float* __restrict__ sin_t, u8* qh, float* wq,
                                int H, int rot, int interleaved, float wscale, int hb, int m) {
  idx_q_prep_t<false>(q, w, pos, cos_t, sin_t, qh, wq, H, rot, interleaved, wscale, hb, m, nullptr, 0, 1, 0.0f);
}

__device__ void idx_q_prep_body_s(const float* __restrict__ q, const float* __restrict__ w,
                                  const int* __restrict__ pos, const float* __restrict__ cos_t,
                                  const float* __restrict__ sin_t, u8* qh, float* wq, int H, int rot, int interleaved,
                                  float wscale, int hb, int m, const float* __restrict__ ss, int nss, int K,
                                  float eps) {
  idx_q_prep_t<true>(q, w, pos, cos_t, sin_t, qh, wq, H, rot, interleaved, wscale, hb, m, ss, nss, K, eps);
}

extern "C" __global__ void __launch_bounds__(512) idx_q_prep(const float* __restrict__ q, const float* __restrict__ w,
                                                             const int* __restrict__ pos,
                                                             const float* __restrict__ cos_t,
                                                             const float* __restrict__ sin_t, u8* qh, float* wq, int H,
                                                             int rot, int interleaved, float wscale) {
  PDL_WAIT_MARKED();
  idx_q_prep_body(q, w, pos, cos_t, sin_t, qh, wq, H, rot, interleaved, wscale, blockIdx.x, blockIdx.y);
}

// Scores of nq rows over the fp8 pages (block_table as indexer_scores):
// out[row][t] for t < n = min(lens[row], T), -inf for n <= t < T. Each warp
// takes 16 keys at a time (two n-tiles) against all 64 heads (four
// m-tiles), the query fragments in shared memory as f16. hist != null: also
// add every written score to the row's topk_radix histogram (hist[row]
// [TKR_BINS], the top 12 bits of its order-preserving key), which saves
// TopKRadix its first pass. Each warp loads its next key group before the
// products of this one (two groups in flight; indexer_scores_mma, without
// that prefetch, was removed in session 54). grid (nbx, nq), 256 threads.
// ROWS (indexer_scores_mma_rows, one launch over several slots' caches):
// row's pages start at row_base[row] + cache (cache then holds the layer's
// offset); without it the body is the one measured before. (The unnamed
// first parameter, always true, was PF, the prefetch: kept so the shared
// arrays' names, and with them the kernels' PTX, stay as they were.)
template <bool = true, bool ROWS = false>
__device__ __forceinline__ void idx_scores_body(const u8* __restrict__ qh, const float* __restrict__ wq,
                                                const u8* __restrict__ cache, const int* __restrict__ block_table,
                                                const int* __restrict__ lens, float* out, int T, int ld_out,
                                                u32* hist, const long long* __restrict__ row_base = nullptr) {
  __shared__ uint4 qa[4 * 8 * 32];  // [mt][ks][lane] f16 A fragments, 16 KB
  __shared__ u32 hs[IDXM_BINS];      // score histogram (hist != null), 16 KB
  const int row = blockIdx.y, tid = threadIdx.x, lane = tid & 31, wid = tid >> 5;
  const int g = lane >> 2, c = lane & 3;
  const int n = min(lens[row], T);
  if (ROWS) cache += row_base[row];
  float* orow = out + (size_t)row * ld_out;
  for (int t = max(n, 0) + blockIdx.x * 256 + tid; t < T; t += gridDim.x * 256) orow[t] = NEG_INF;
  const int ngroups = (n + 15) >> 4;
  if (blockIdx.x * 8 >= ngroups) return;  // block-uniform
  const uint2* src = (const uint2*)(qh + (size_t)row * IDXQ_ROW_BYTES);
  for (int i = tid; i < 4 * 8 * 32; i += 256) {
    const uint2 v = src[i];
    uint4 f;
    f.x = e4m3x2_to_f16x2(v.x & 0xffffu);
    f.y = e4m3x2_to_f16x2(v.x >> 16);
    f.z = e4m3x2_to_f16x2(v.y & 0xffffu);
    f.w = e4m3x2_to_f16x2(v.y >> 16);
    qa[i] = f;
  }
  if (hist)
    for (int i = tid; i < IDXM_BINS; i += 256) hs[i] = 0;
  float wlo[4], whi[4];
#pragma unroll
  for (int mt = 0; mt < 4; mt++) {
    wlo[mt] = wq[(size_t)row * IDXQ_HEADS + 16 * mt + g];
    whi[mt] = wq[(size_t)row * IDXQ_HEADS + 16 * mt + 8 + g];
  }
  __syncthreads();
  const int gs = gridDim.x * 8;
  uint4 na0, na1, nb0, nb1;
  float2 ns0, ns1;
  auto load = [&](int gg) {
    const int blk = gg >> 2;
    const int page = block_table ? block_table[blk] : blk;
    const u8* pg = cache + (size_t)page * IDX_PAGE_BYTES;
    const int tp = (gg << 4) & 63;
    const u8* ka = pg + (tp + g) * IDX_D + 16 * c;
    na0 = *(const uint4*)ka;
    na1 = *(const uint4*)(ka + 64);
    nb0 = *(const uint4*)(ka + 8 * IDX_D);
    nb1 = *(const uint4*)(ka + 8 * IDX_D + 64);
    // The group's key scales ride with its keys: loaded after the products
    // they left every group waiting on memory a second time (ncu, session
    // 24: a fifth of the stall samples at 131072 keys on that FMUL).
    const float* scl = (const float*)(pg + IDX_PAGE * IDX_D) + tp + 2 * c;
    ns0 = *(const float2*)scl;
    ns1 = *(const float2*)(scl + 8);
  };
  int gi = blockIdx.x * 8 + wid;
  if (gi < ngroups) load(gi);
  for (; gi < ngroups; gi += gs) {
    const uint4 a0 = na0, a1 = na1, b0 = nb0, b1 = nb1;
    const float sk[2][2] = {{ns0.x, ns0.y}, {ns1.x, ns1.y}};
    if (gi + gs < ngroups) load(gi + gs);
    const int t0 = gi << 4;
    float acc[4][2][4];
#pragma unroll
    for (int mt = 0; mt < 4; mt++)
#pragma unroll
      for (int i = 0; i < 4; i++) acc[mt][0][i] = acc[mt][1][i] = 0.0f;
#pragma unroll
    for (int ks = 0; ks < 8; ks++) {
      const u32 wa = u4_word(ks < 4 ? a0 : a1, ks & 3), wb = u4_word(ks < 4 ? b0 : b1, ks & 3);
      const u32 ba0 = e4m3x2_to_f16x2(wa & 0xffffu), ba1 = e4m3x2_to_f16x2(wa >> 16);
      const u32 bb0 = e4m3x2_to_f16x2(wb & 0xffffu), bb1 = e4m3x2_to_f16x2(wb >> 16);
#pragma unroll
      for (int mt = 0; mt < 4; mt++) {
        const uint4 A = qa[(mt * 8 + ks) * 32 + lane];
        mma_f16_16816(acc[mt][0], A, ba0, ba1);
        mma_f16_16816(acc[mt][1], A, bb0, bb1);
      }
    }
    // Lane (g, c) holds heads 16mt+g (acc 0, 1) and 16mt+g+8 (acc 2, 3) of
    // keys 8nt + 2c + {0, 1}: weight, sum its heads, then over g.
    float sv[2][2];
#pragma unroll
    for (int nt = 0; nt < 2; nt++)
#pragma unroll
      for (int j = 0; j < 2; j++) {
        float s = 0.0f;
#pragma unroll
        for (int mt = 0; mt < 4; mt++)
          s += wlo[mt] * fmaxf(acc[mt][nt][j], 0.0f) + whi[mt] * fmaxf(acc[mt][nt][2 + j], 0.0f);
        s += __shfl_xor_sync(0xffffffffu, s, 4);
        s += __shfl_xor_sync(0xffffffffu, s, 8);
        s += __shfl_xor_sync(0xffffffffu, s, 16);
        sv[nt][j] = s;
      }
    if (g == 0) {
#pragma unroll
      for (int nt = 0; nt < 2; nt++)
#pragma unroll
        for (int j = 0; j < 2; j++) {
          const int tt = 8 * nt + 2 * c + j;
          if (t0 + tt < n) {
            const float v = sv[nt][j] * sk[nt][j];
            orow[t0 + tt] = v;
            if (hist) atomicAdd(&hs[float_key(v) >> 20], 1u);
          }
        }
    }
  }
  if (hist) {
    __syncthreads();
    u32* gh = hist + (size_t)row * IDXM_BINS;
    for (int i = tid; i < IDXM_BINS; i += 256)
      if (hs[i]) atomicAdd(&gh[i], hs[i]);
  }
}

extern "C" __global__ void __launch_bounds__(256, 2) indexer_scores_mma_pf(const u8* __restrict__ qh,
                                                                           const float* __restrict__ wq,
                                                                           const u8* __restrict__ cache,
                                                                           const int* __restrict__ block_table,
                                                                           const int* __restrict__ lens, float* out,
                                                                           int T, int ld_out, u32* hist) {
  PDL_WAIT();
  idx_scores_body<>(qh, wq, cache, block_table, lens, out, T, ld_out, hist);
}

// indexer_scores_mma_pf over rows of several slots' caches (row_base[row]
// + cache: see idx_scores_body's ROWS).
extern "C" __global__ void __launch_bounds__(256, 2) indexer_scores_mma_rows(const u8* __restrict__ qh,
                                                                             const float* __restrict__ wq,
                                                                             const u8* __restrict__ cache,
                                                                             const long long* __restrict__ row_base,
                                                                             const int* __restrict__ lens, float* out,
                                                                             int T, int ld_out, u32* hist) {
  PDL_WAIT();
  idx_scores_body<true, true>(qh, wq, cache, nullptr, lens, out, T, ld_out, hist, row_base);
}
