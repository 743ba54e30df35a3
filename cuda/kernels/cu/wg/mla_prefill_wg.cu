// mla_prefill_wg: mla_prefill_h1's function (the same inputs, the same
// one-fp16-part roundings of the queries, the dequantised entries and the
// probabilities; float32 sums in another order) with its two products on
// Hopper's warpgroup MMA (wgmma.mma_async, sm_90a) instead of mma.sync.
// Serving mode only (engine: TILERT_GPU_MLA_PREFILL=5). Its own module,
// compiled with --gpu-architecture=sm_90a (wgmma does not exist on plain
// sm_90); kernels_wg.go loads it on first use.
//
// First version, simple before clever (no producer/consumer split, no
// swizzle): the block is mla_prefill_h1's (one query row, 64 heads, 256
// threads = two warpgroups, each tile gathered with cp.async and converted
// by all threads, barriers between the phases), with
// - the fp16 tile, the queries and P stored as wgmma's canonical
//   no-swizzle ("interleave") layout: 8 x 8 core matrices of 128 contiguous
//   bytes (8 rows of 16 bytes); element (row r, column c) of a matrix of R
//   rows (R a multiple of 8) at byte ((c/8) x R/8 + r/8) x 128 + (r%8) x 16
//   + (c%8) x 2 (MWG_OFF). The tile's rows are its 64 tokens, columns the
//   576 dims; the queries' rows the 64 heads; P's rows the heads, columns
//   the tile's 64 tokens.
// - QK^T: warpgroup th takes tokens [32 th, 32 th + 32) for all 64 heads:
//   36 x wgmma m64n32k16, A = queries (K-major), B = the tile (K-major: N =
//   tokens, K = dims). The accumulator fragment is mma.sync's C fragment
//   per warp (rows 16 (warp%4) + lane/4 (+8), columns 8n + 2 (lane%4)
//   (+1)), so the softmax is mla_prefill_h1's, line for line.
// - P.V: warpgroup th takes output columns [256 th, 256 th + 256): 4 x
//   wgmma m64n256k16, A = P (K-major: M = heads, K = tokens), B = the same
//   tile read N-major (imm-trans-b = 1: N = dims, K = tokens), 128 float
//   accumulators a thread.
// - Descriptors (MWG_DESC): start address / 16 in bits 0-13, the leading
//   (K-direction) core-matrix byte offset / 16 in 16-29, the stride
//   (M/N-direction) one / 16 in 32-45, base offset 0, swizzle mode 0. For
//   both majors of the no-swizzle layout LBO is the step between core
//   matrices along K and SBO along M/N (CUTLASS make_gmma_desc: MN-major
//   interleave ((1,n),(8,k)):((X,SBO),(1,LBO)), K-major ((8,n),2):((1,SBO),LBO)).
//   mla_prefill_wg_pure_test.go transcribes these addresses and fragments.
// - Generic-proxy writes of the tile, the queries and P are made visible to
//   wgmma (async proxy) by fence.proxy.async.shared::cta before the barrier.
// Shared memory: raw 41,984 + tile 73,728 + queries 73,728 + P 8,192 +
// 2,304 = 199,936 bytes (one block an SM). NOT yet run on a GPU when written.

#define MLA_LAT 512
#define MLA_ROPE 64
#define MLA_TOK_BYTES 656
#define MWG_T 64   // tokens per tile
#define MWG_HB 64  // heads per block
#define MWG_CH (MLA_TOK_BYTES / 16)
#define MWG_TILE_BYTES (72 * 8 * 128)  // 64 rows x 576 halves
#define MWG_P_BYTES (8 * 8 * 128)      // 64 heads x 64 tokens halves
#define MWG_SMEM_BYTES                                                                                  \
  (MWG_T * MLA_TOK_BYTES + 2 * MWG_TILE_BYTES + MWG_P_BYTES + 2 * MWG_HB * 4 + MWG_HB * 4 + MWG_HB * 4 + \
   2 * MWG_HB * 4 + 3 * MWG_T * 4)
// Byte offset of element (r, c) of a 64-row matrix in the no-swizzle layout.
#define MWG_OFF(r, c) (((((c) >> 3) * 8 + ((r) >> 3)) << 7) + (((r) & 7) << 4) + (((c) & 7) << 1))

#define MT_ARGS                                                                                                     \
  const float *__restrict__ qn, const float *__restrict__ qp, const u8 *__restrict__ cache,                         \
      const int *__restrict__ block_table, const int *__restrict__ indices, int ld_idx, int nidx,                   \
      const int *__restrict__ lens, float *out, float *lse, int H, float scale, int tps, float *part_o,             \
      float *part_ml

#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ == 900) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
__device__ __forceinline__ u32 mwg_smem_addr(const void* p) {
  u32 a;
  asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
  return a;
}

// Matrix descriptor: no swizzle, lbo / sbo the K- and M/N-direction steps
// between core matrices in bytes.
__device__ __forceinline__ u64 mwg_desc(u32 addr, u32 lbo, u32 sbo) {
  return (u64)((addr & 0x3ffffu) >> 4) | ((u64)(lbo >> 4) << 16) | ((u64)(sbo >> 4) << 32);
}

__device__ __forceinline__ int mwg_slot(const int* __restrict__ indices, const int* __restrict__ block_table,
                                        int ld_idx, int qi, int len, int count, int j) {
  if (j >= count) return -1;
  const int t = indices ? indices[(size_t)qi * ld_idx + j] : j;
  if (t < 0 || t >= len) return -1;
  return block_table ? block_table[t >> 6] * 64 + (t & 63) : t;
}

__device__ __forceinline__ u32 mwg_e4m3x2(u32 v) {
  u32 r;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(r) : "h"((u16)(v & 0xffffu)));
  return r;
}

__device__ __forceinline__ u32 mwg_hmul2(u32 a, u32 b) {
  u32 r;
  asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
  return r;
}

__device__ __forceinline__ u32 mwg_f16x2(float lo, float hi) {
  u32 r;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

// mla_prefill_h1's mh1_scale: fp16(scale x 2^-E) and 2^E, both halves.
__device__ __forceinline__ void mwg_scale(float sc, u32& m2, u32& p2) {
  int E = (int)((__float_as_uint(sc) >> 23) & 0xffu) - 127;
  E = min(max(E, -24), 15);
  const float m = sc * __uint_as_float((u32)(127 - E) << 23);
  u16 mh;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(mh) : "f"(m));
  const u32 ph = E >= -14 ? (u32)(E + 15) << 10 : 1u << (E + 24);
  m2 = (u32)mh | ((u32)mh << 16);
  p2 = ph | (ph << 16);
}

__device__ __forceinline__ void mwg_issue(u8* raw, const u8* __restrict__ cache, const int* sl) {
  const u32 base = mwg_smem_addr(raw);
  for (int c = threadIdx.x; c < MWG_T * MWG_CH; c += 256) {
    const int j = c / MWG_CH, p = c - j * MWG_CH;
    const int t = sl[j];
    if (t < 0) continue;
    const u8* src = cache + (size_t)t * MLA_TOK_BYTES + p * 16;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(base + (u32)(j * MLA_TOK_BYTES + p * 16)), "l"(src)
                 : "memory");
  }
  asm volatile("cp.async.commit_group;" ::: "memory");
}

__device__ __forceinline__ void mwg_fence_async() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }
__device__ __forceinline__ void mwg_wg_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void mwg_wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void mwg_wg_wait0() { asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory"); }

template <int TB>
__device__ __forceinline__ void mwg_m64n32(float* d, u64 da, u64 db) {
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "
      "%16, %17, 1, 1, 1, 0, %18;"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "l"(da), "l"(db), "n"(TB)
      : "memory");
}

template <int TB>
__device__ __forceinline__ void mwg_m64n256(float* d, u64 da, u64 db) {
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
      "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
      "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "
      "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "
      "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, "
      "%128, %129, 1, 1, 1, 0, %130;"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
        "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
        "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
        "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
        "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
        "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
        "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),
        "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
        "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
      : "l"(da), "l"(db), "n"(TB)
      : "memory");
}

// Pins accumulators in place around the asynchronous MMAs (no use of them
// moves across a wgmma fence or wait).
template <int N>
__device__ __forceinline__ void mwg_pin(float* d) {
#pragma unroll
  for (int i = 0; i < N; i++) asm volatile("" : "+f"(d[i])::"memory");
}

extern "C" __global__ void __launch_bounds__(256, 1) mla_prefill_wg(MT_ARGS) {
  extern __shared__ uint4 mwg_smem[];
  u8* raw = (u8*)mwg_smem;                           // [T][656] raw entries
  u8* Kt = raw + MWG_T * MLA_TOK_BYTES;               // tile: 64 tokens x 576 dims, MWG_OFF
  u8* Qs = Kt + MWG_TILE_BYTES;                       // queries x 2^e: 64 heads x 576 dims, MWG_OFF
  u8* Ps = Qs + MWG_TILE_BYTES;                       // P: 64 heads x 64 tokens, MWG_OFF
  float* redm = (float*)(Ps + MWG_P_BYTES);           // [2 token halves][HB] row maxima
  float* alph = redm + 2 * MWG_HB;                    // [HB] the tile's rescale factor of O
  float* qsc = alph + MWG_HB;                         // [HB] score factor: scale x log2(e) x 2^-e
  float* lsum = qsc + MWG_HB;                         // [2][HB] row sums of each token half
  int* sl = (int*)(lsum + 2 * MWG_HB);                // [3][T] cache slot of each tile slot, -1 skipped
  const int qi = blockIdx.y, h0 = blockIdx.z * MWG_HB;
  const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5, g = lane >> 2, t4 = lane & 3;
  const int len = lens[qi];
  const int count = min(indices ? nidx : len, tps);
  const int nt = (count + MWG_T - 1) / MWG_T;
  if (tid < 2 * MWG_T) sl[tid] = mwg_slot(indices, block_table, ld_idx, qi, len, count, tid);
  __syncthreads();
  if (nt > 0) mwg_issue(raw, cache, sl);
  // Queries, as mla_prefill_h1: warp w takes heads 8w..8w+7, two at a time.
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
  // Roles: warp hg of warpgroup th (rows 16 hg + g, + 8 of each wgmma);
  // QK^T tokens [32 th, +32), P.V output columns [256 th, +256).
  const int hg = w & 3, th = w >> 2;
  const int hr0 = 16 * hg + g, hr1 = hr0 + 8;
  const u32 kt_a = mwg_smem_addr(Kt), qs_a = mwg_smem_addr(Qs), ps_a = mwg_smem_addr(Ps);
  // QK^T, k-step ks: A = queries dims [16 ks, +16) (core-matrix columns 2ks, 2ks+1:
  // 2048 bytes a step, LBO 1024, SBO 128); B = tile rows [32 th, +32), same dims.
  const u32 qk_a0 = qs_a, qk_b0 = kt_a + (u32)(4 * th) * 128u;
  // P.V, k-step kk: A = P tokens [16 kk, +16) (2048 bytes a step, LBO 1024,
  // SBO 128); B = tile N-major: N = dims [256 th, +256) (core-matrix
  // columns 32 th.., SBO 1024), K = tokens [16 kk, +16) (core-matrix rows
  // 2kk, 2kk+1: 256 bytes a step, LBO 128).
  const u32 pv_b0 = kt_a + (u32)(32 * th * 8) * 128u;
  float o[128];
#pragma unroll
  for (int i = 0; i < 128; i++) o[i] = 0.0f;
  float m0 = NEG_INF, m1 = NEG_INF, l0 = 0.0f, l1 = 0.0f;  // rows hr0, hr1 (l: this lane's share of this half)
  for (int k = 0; k < nt; k++) {
    const int* slk = sl + (k % 3) * MWG_T;
    int nslot = -1;
    if (tid < MWG_T) nslot = mwg_slot(indices, block_table, ld_idx, qi, len, count, (k + 2) * MWG_T + tid);
    asm volatile("cp.async.wait_all;" ::: "memory");
    if (!__syncthreads_or(tid < MWG_T && slk[tid] >= 0)) {
      if (k + 1 < nt) mwg_issue(raw, cache, sl + ((k + 1) % 3) * MWG_T);
      if (tid < MWG_T) sl[((k + 2) % 3) * MWG_T + tid] = nslot;
      continue;
    }
    {
      // Latent: thread tid converts token j = tid % 64, 8-dim units s8 =
      // 4i + tid/64 (a warp writes 32 consecutive rows of one core-matrix
      // column: 512 contiguous bytes).
      const int j = tid & 63;
      const bool ok = slk[j] >= 0;
      const u8* rj = raw + j * MLA_TOK_BYTES;
#pragma unroll 4
      for (int i = 0; i < 16; i++) {
        const int s8 = 4 * i + (tid >> 6);
        uint4 hv = make_uint4(0u, 0u, 0u, 0u);
        if (ok) {
          const uint2 b = *(const uint2*)(rj + 8 * s8);
          u32 m2, p2;
          mwg_scale(*(const float*)(rj + MLA_LAT + 4 * (s8 >> 4)), m2, p2);
          hv.x = mwg_hmul2(mwg_hmul2(mwg_e4m3x2(b.x), m2), p2);
          hv.y = mwg_hmul2(mwg_hmul2(mwg_e4m3x2(b.x >> 16), m2), p2);
          hv.z = mwg_hmul2(mwg_hmul2(mwg_e4m3x2(b.y), m2), p2);
          hv.w = mwg_hmul2(mwg_hmul2(mwg_e4m3x2(b.y >> 16), m2), p2);
        }
        *(uint4*)(Kt + MWG_OFF(j, 8 * s8)) = hv;
      }
      // RoPE: units r = 4i + tid/64 of 8 bf16.
#pragma unroll
      for (int i = 0; i < 2; i++) {
        const int r = 4 * i + (tid >> 6);
        uint4 hv = make_uint4(0u, 0u, 0u, 0u);
        if (ok) {
          const uint4 b = *(const uint4*)(rj + 528 + 16 * r);
          hv.x = mwg_f16x2(__uint_as_float(b.x << 16), __uint_as_float(b.x & 0xffff0000u));
          hv.y = mwg_f16x2(__uint_as_float(b.y << 16), __uint_as_float(b.y & 0xffff0000u));
          hv.z = mwg_f16x2(__uint_as_float(b.z << 16), __uint_as_float(b.z & 0xffff0000u));
          hv.w = mwg_f16x2(__uint_as_float(b.w << 16), __uint_as_float(b.w & 0xffff0000u));
        }
        *(uint4*)(Kt + MWG_OFF(j, MLA_LAT + 8 * r)) = hv;
      }
    }
    mwg_fence_async();  // the tile (and, the first time, the queries) visible to wgmma
    __syncthreads();    // the fp16 tile is ready; raw is free
    if (k + 1 < nt) mwg_issue(raw, cache, sl + ((k + 1) % 3) * MWG_T);
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
    __syncthreads();  // both halves' maxima are in
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
    mwg_fence_async();  // P visible to wgmma
    __syncthreads();    // P and the rescale factors are in
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
    if (tid < MWG_T) sl[((k + 2) % 3) * MWG_T + tid] = nslot;
  }
  asm volatile("cp.async.wait_all;" ::: "memory");
  l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
  l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
  if (t4 == 0) {
    lsum[th * MWG_HB + hr0] = l0;
    lsum[th * MWG_HB + hr1] = l1;
  }
  __syncthreads();
  if (lse && th == 0 && t4 == 0) {
#pragma unroll
    for (int hr = 0; hr < 2; hr++) {
      const int hb = hr ? hr1 : hr0, h = h0 + hb;
      const float l = lsum[hb] + lsum[MWG_HB + hb], m = hr ? m1 : m0;
      if (h < H) lse[(size_t)qi * H + h] = l > 0.0f ? m * 0.6931471805599453f + logf(l) : NEG_INF;
    }
  }
#pragma unroll
  for (int hr = 0; hr < 2; hr++) {
    const int hb = hr ? hr1 : hr0, h = h0 + hb;
    if (h >= H) continue;
    const float l = lsum[hb] + lsum[MWG_HB + hb];
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
    float* po = out + ((size_t)qi * H + h) * MLA_LAT + 256 * th + 2 * t4;
#pragma unroll
    for (int i = 0; i < 32; i++) *(float2*)(po + 8 * i) = make_float2(o[4 * i + 2 * hr] * inv, o[4 * i + 2 * hr + 1] * inv);
  }
}

// mwg_probe: the kernel's two wgmma uses alone, for the GPU test to pin the
// descriptor conventions on the hardware (mla_prefill_wg_test.go). 256
// threads (two warpgroups, th as in the kernel); a [64][64] and b [64][512]
// fp16 row-major in global memory, stored at MWG_OFF as the kernel stores
// P / the queries (a) and the tile (b). mode 0: P.V as the kernel (d[h][n]
// = sum_t a[h][t] b[t][n], warpgroup th columns [256 th, +256)); mode 1:
// the same with the N-major B's LBO and SBO swapped (the other reading of
// the PTX text); mode 2: QK^T as the kernel over 64 dims (d[h][t] = sum_k
// a[h][k] b[t][k], t < 64, warpgroup th tokens [32 th, +32)). d: [64][512].
extern "C" __global__ void __launch_bounds__(256, 1) mwg_probe(const u16* __restrict__ a, const u16* __restrict__ b, float* d, int mode) {
  extern __shared__ uint4 mwg_smem[];
  u8* As = (u8*)mwg_smem;  // 64 x 64 halves
  u8* Bs = As + MWG_P_BYTES;  // 64 x 512 halves
  const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5, g = lane >> 2, t4 = lane & 3, th = w >> 2, hg = w & 3;
  for (int i = tid; i < 64 * 64; i += 256) *(u16*)(As + MWG_OFF(i >> 6, i & 63)) = a[i];
  for (int i = tid; i < 64 * 512; i += 256) *(u16*)(Bs + MWG_OFF(i >> 9, i & 511)) = b[i];
  mwg_fence_async();
  __syncthreads();
  const u32 as_a = mwg_smem_addr(As), bs_a = mwg_smem_addr(Bs);
  const int r0 = 16 * hg + g;
  if (mode == 2) {
    float s[16];
#pragma unroll
    for (int i = 0; i < 16; i++) s[i] = 0.0f;
    mwg_pin<16>(s);
    mwg_wg_fence();
    const u32 b0 = bs_a + (u32)(4 * th) * 128u;
#pragma unroll
    for (int ks = 0; ks < 4; ks++) mwg_m64n32<0>(s, mwg_desc(as_a + 2048u * ks, 1024u, 128u), mwg_desc(b0 + 2048u * ks, 1024u, 128u));
    mwg_wg_commit();
    mwg_wg_wait0();
    mwg_pin<16>(s);
#pragma unroll
    for (int n = 0; n < 4; n++)
#pragma unroll
      for (int c = 0; c < 4; c++) d[(r0 + 8 * (c >> 1)) * 512 + 32 * th + 8 * n + 2 * t4 + (c & 1)] = s[4 * n + c];
    return;
  }
  float o[128];
#pragma unroll
  for (int i = 0; i < 128; i++) o[i] = 0.0f;
  mwg_pin<128>(o);
  mwg_wg_fence();
  const u32 b0 = bs_a + (u32)(32 * th * 8) * 128u;
  const u32 lbo = mode == 1 ? 1024u : 128u, sbo = mode == 1 ? 128u : 1024u;
#pragma unroll
  for (int kk = 0; kk < 4; kk++) mwg_m64n256<1>(o, mwg_desc(as_a + 2048u * kk, 1024u, 128u), mwg_desc(b0 + 256u * kk, lbo, sbo));
  mwg_wg_commit();
  mwg_wg_wait0();
  mwg_pin<128>(o);
#pragma unroll
  for (int i = 0; i < 32; i++)
#pragma unroll
    for (int c = 0; c < 4; c++) d[(r0 + 8 * (c >> 1)) * 512 + 256 * th + 8 * i + 2 * t4 + (c & 1)] = o[4 * i + c];
}
#else
extern "C" __global__ void __launch_bounds__(256) mwg_probe(const u16* a, const u16* b, float* d, int mode) { __trap(); }
// Without sm_90a's wgmma (the module is only built for sm_90a; this keeps
// a host or other-arch parse of the file valid).
extern "C" __global__ void __launch_bounds__(256) mla_prefill_wg(MT_ARGS) { __trap(); }
#endif
