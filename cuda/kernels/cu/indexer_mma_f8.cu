// Lightning indexer scores on the fp8 tensor-core instruction (sm_89+):
// mma.sync m16n8k32 e4m3 x e4m3 -> f32 takes the key bytes as they are
// (indexer_scores_mma_pf converts every key pair to f16 and needs two
// m16n8k16 for each k32). Same inputs, outputs and histogram as
// idx_scores_body<true>; the sums may differ in their last bits if the
// instruction's accumulation is not f32's (f8_mma_probe measures it).
//
// Fragments (PTX ISA, m16n8k32 .e4m3): lane (g = lane/4, c = lane%4) holds
// A row g, k 4c..4c+3 (reg 0) and 16+4c.. (reg 2), rows g+8 in regs 1, 3;
// B column g, k 4c..4c+3 (reg 0) and 16+4c.. (reg 1); C/D as m16n8k16.
// k permutation (the same for query and keys): in k-step s, lane c's logical
// k 4c+i is the physical dimension P(2s, c)+i and 16+4c+i is P(2s+1, c)+i,
// with idx_q_prep's P (indexer_mma.cu). So a lane's key bytes are again its
// two 16-byte loads (words 2s, 2s+1 for step s), and its A fragment of step
// s is its own idx_q_prep entries (mt, 2s) and (mt, 2s+1), bytes {0,1,4,5}
// (head g) and {2,3,6,7} (head g+8): no other lane's bytes.

// The e4m3 mma.sync is PTX ISA 8.4 (CUDA 12.4): an older NVRTC (11.8 in CI)
// builds the module without this file's kernels (their launchers say so).
#if __CUDACC_VER_MAJOR__ > 12 || (__CUDACC_VER_MAJOR__ == 12 && __CUDACC_VER_MINOR__ >= 4)

__device__ __forceinline__ void mma_e4m3_16832(float* d, const uint4& a, u32 b0, u32 b1) {
#if __CUDA_ARCH__ >= 890
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a.x), "r"(a.y), "r"(a.z), "r"(a.w), "r"(b0), "r"(b1));
#else
  __trap();  // the launcher refuses devices below sm_89
#endif
}

// The A fragment of (mt, s, lane) from idx_q_prep's entries (mt, 2s) and
// (mt, 2s+1) of the same lane.
__device__ __forceinline__ uint4 idx_f8_afrag(const uint2* src, int mt, int s, int lane) {
  const uint2 v0 = src[(mt * 8 + 2 * s) * 32 + lane], v1 = src[(mt * 8 + 2 * s + 1) * 32 + lane];
  uint4 f;
  f.x = __byte_perm(v0.x, v0.y, 0x5410);
  f.y = __byte_perm(v0.x, v0.y, 0x7632);
  f.z = __byte_perm(v1.x, v1.y, 0x5410);
  f.w = __byte_perm(v1.x, v1.y, 0x7632);
  return f;
}

// idx_scores_body<true>'s work (one key group of 16 per warp at a time, the
// next prefetched, 64 heads as four m-tiles) with the fp8 instruction: per
// group 32 mma and no conversions (was 64 mma and 16 cvt).
template <bool ROWS>
__device__ __forceinline__ void idx_scores_f8_body(const u8* __restrict__ qh, const float* __restrict__ wq,
                                                   const u8* __restrict__ cache, const int* __restrict__ block_table,
                                                   const int* __restrict__ lens, float* out, int T, int ld_out,
                                                   u32* hist, const long long* __restrict__ row_base) {
  __shared__ uint4 qa[4 * 4 * 32];  // [mt][s][lane] e4m3 A fragments, 8 KB
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
  for (int i = tid; i < 4 * 4 * 32; i += 256) qa[i] = idx_f8_afrag(src, i >> 7, (i >> 5) & 3, i & 31);
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
  const u8* npg = cache;
  auto load = [&](int gg) {
    const int blk = gg >> 2;
    const int page = block_table ? block_table[blk] : blk;
    npg = cache + (size_t)page * IDX_PAGE_BYTES;
    const u8* ka = npg + (((gg << 4) & 63) + g) * IDX_D + 16 * c;
    na0 = *(const uint4*)ka;
    na1 = *(const uint4*)(ka + 64);
    nb0 = *(const uint4*)(ka + 8 * IDX_D);
    nb1 = *(const uint4*)(ka + 8 * IDX_D + 64);
  };
  int gi = blockIdx.x * 8 + wid;
  if (gi < ngroups) load(gi);
  for (; gi < ngroups; gi += gs) {
    const uint4 a0 = na0, a1 = na1, b0 = nb0, b1 = nb1;
    const u8* pg = npg;
    if (gi + gs < ngroups) load(gi + gs);
    const int t0 = gi << 4, tp = t0 & 63;
    float acc[4][2][4];
#pragma unroll
    for (int mt = 0; mt < 4; mt++)
#pragma unroll
      for (int i = 0; i < 4; i++) acc[mt][0][i] = acc[mt][1][i] = 0.0f;
#pragma unroll
    for (int s = 0; s < 4; s++) {
      const uint4& ka = s < 2 ? a0 : a1;
      const uint4& kb = s < 2 ? b0 : b1;
      const u32 ka0 = u4_word(ka, (2 * s) & 3), ka1 = u4_word(ka, (2 * s + 1) & 3);
      const u32 kb0 = u4_word(kb, (2 * s) & 3), kb1 = u4_word(kb, (2 * s + 1) & 3);
#pragma unroll
      for (int mt = 0; mt < 4; mt++) {
        const uint4 A = qa[(mt * 4 + s) * 32 + lane];
        mma_e4m3_16832(acc[mt][0], A, ka0, ka1);
        mma_e4m3_16832(acc[mt][1], A, kb0, kb1);
      }
    }
    // The epilogue of idx_scores_body (the same order of sums).
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
      const float* scl = (const float*)(pg + IDX_PAGE * IDX_D) + tp;
#pragma unroll
      for (int nt = 0; nt < 2; nt++)
#pragma unroll
        for (int j = 0; j < 2; j++) {
          const int tt = 8 * nt + 2 * c + j;
          if (t0 + tt < n) {
            const float v = sv[nt][j] * scl[tt];
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

// indexer_scores_mma_pf's arguments and grid (nbx, nq), 256 threads.
extern "C" __global__ void __launch_bounds__(256, 2) indexer_scores_f8(const u8* __restrict__ qh,
                                                                       const float* __restrict__ wq,
                                                                       const u8* __restrict__ cache,
                                                                       const int* __restrict__ block_table,
                                                                       const int* __restrict__ lens, float* out, int T,
                                                                       int ld_out, u32* hist) {
  PDL_WAIT();
  idx_scores_f8_body<false>(qh, wq, cache, block_table, lens, out, T, ld_out, hist, nullptr);
}

// indexer_scores_mma_rows's arguments (row r's pages at row_base[r] + cache).
extern "C" __global__ void __launch_bounds__(256, 2) indexer_scores_f8_rows(const u8* __restrict__ qh,
                                                                            const float* __restrict__ wq,
                                                                            const u8* __restrict__ cache,
                                                                            const long long* __restrict__ row_base,
                                                                            const int* __restrict__ lens, float* out,
                                                                            int T, int ld_out, u32* hist) {
  PDL_WAIT();
  idx_scores_f8_body<true>(qh, wq, cache, nullptr, lens, out, T, ld_out, hist, row_base);
}

// One m16n8k32 e4m3 mma of a warp (check only): a [16][32] and b [8][32]
// (row n holds column n's k values) as e4m3 bytes, c and d [16][8] f32
// row-major. d = a.b^T + c in the instruction's own arithmetic, to measure
// its accumulation against exact sums. One warp.
extern "C" __global__ void f8_mma_probe(const u8* __restrict__ a, const u8* __restrict__ b,
                                        const float* __restrict__ c, float* d, int count) {
  const int lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
  for (int it = blockIdx.x; it < count; it += gridDim.x) {
    const u8* A = a + (size_t)it * 16 * 32;
    const u8* B = b + (size_t)it * 8 * 32;
    const float* C = c + (size_t)it * 16 * 8;
    float* D = d + (size_t)it * 16 * 8;
    uint4 fa;
    fa.x = *(const u32*)(A + g * 32 + 4 * q);
    fa.y = *(const u32*)(A + (g + 8) * 32 + 4 * q);
    fa.z = *(const u32*)(A + g * 32 + 16 + 4 * q);
    fa.w = *(const u32*)(A + (g + 8) * 32 + 16 + 4 * q);
    const u32 b0 = *(const u32*)(B + g * 32 + 4 * q), b1 = *(const u32*)(B + g * 32 + 16 + 4 * q);
    float acc[4] = {C[g * 8 + 2 * q], C[g * 8 + 2 * q + 1], C[(g + 8) * 8 + 2 * q], C[(g + 8) * 8 + 2 * q + 1]};
    mma_e4m3_16832(acc, fa, b0, b1);
    D[g * 8 + 2 * q] = acc[0];
    D[g * 8 + 2 * q + 1] = acc[1];
    D[(g + 8) * 8 + 2 * q] = acc[2];
    D[(g + 8) * 8 + 2 * q + 1] = acc[3];
  }
}

#endif  // CUDA 12.4

// f8_mma_probe's product through the f16 path of indexer_scores_mma_pf (the
// e4m3 bytes converted to f16, two m16n8k16 with f32 accumulation, k 0..15
// then 16..31): the baseline the fp8 instruction's sums are compared with.
extern "C" __global__ void f16_mma_probe(const u8* __restrict__ a, const u8* __restrict__ b,
                                         const float* __restrict__ c, float* d, int count) {
  const int lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
  for (int it = blockIdx.x; it < count; it += gridDim.x) {
    const u8* A = a + (size_t)it * 16 * 32;
    const u8* B = b + (size_t)it * 8 * 32;
    const float* C = c + (size_t)it * 16 * 8;
    float* D = d + (size_t)it * 16 * 8;
    float acc[4] = {C[g * 8 + 2 * q], C[g * 8 + 2 * q + 1], C[(g + 8) * 8 + 2 * q], C[(g + 8) * 8 + 2 * q + 1]};
#pragma unroll
    for (int k0 = 0; k0 < 32; k0 += 16) {
      uint4 fa;
      fa.x = e4m3x2_to_f16x2(*(const u16*)(A + g * 32 + k0 + 2 * q));
      fa.y = e4m3x2_to_f16x2(*(const u16*)(A + (g + 8) * 32 + k0 + 2 * q));
      fa.z = e4m3x2_to_f16x2(*(const u16*)(A + g * 32 + k0 + 8 + 2 * q));
      fa.w = e4m3x2_to_f16x2(*(const u16*)(A + (g + 8) * 32 + k0 + 8 + 2 * q));
      const u32 b0 = e4m3x2_to_f16x2(*(const u16*)(B + g * 32 + k0 + 2 * q));
      const u32 b1 = e4m3x2_to_f16x2(*(const u16*)(B + g * 32 + k0 + 8 + 2 * q));
      mma_f16_16816(acc, fa, b0, b1);
    }
    D[g * 8 + 2 * q] = acc[0];
    D[g * 8 + 2 * q + 1] = acc[1];
    D[(g + 8) * 8 + 2 * q] = acc[2];
    D[(g + 8) * 8 + 2 * q + 1] = acc[3];
  }
}
