// Fused per-row kernels of the decode step (issue 10): each replaces a run of
// small launches that cost more in launch latency than the bytes they move.
// Every output is bit-identical to the launches it replaces: each value is
// computed by the same expressions in the same order (the same per-thread
// element assignment and reduction trees as those kernels' launches).

// Defined later in the module (indexer_mma.cu).
__device__ void idx_q_prep_body(const float* __restrict__ q, const float* __restrict__ w, const int* __restrict__ pos,
                                const float* __restrict__ cos_t, const float* __restrict__ sin_t, u8* qh, float* wq,
                                int H, int rot, int interleaved, float wscale, int hb, int m);
__device__ void idx_q_prep_body_s(const float* __restrict__ q, const float* __restrict__ w,
                                  const int* __restrict__ pos, const float* __restrict__ cos_t,
                                  const float* __restrict__ sin_t, u8* qh, float* wq, int H, int rot, int interleaved,
                                  float wscale, int hb, int m, const float* __restrict__ ss, int nss, int K,
                                  float eps);

// One RoPE pair of the rope kernel (same expressions, so the same rounding).
__device__ __forceinline__ void fz_rope_pair(float* x, int i, int half, float c, float s, int interleaved) {
  const int i0 = interleaved ? 2 * i : i;
  const int i1 = interleaved ? 2 * i + 1 : i + half;
  const float a = x[i0], b = x[i1];
  x[i0] = a * c - b * s;
  x[i1] = b * c + a * s;
}

// The attention side's per-row epilogue once the projections exist, one
// launch for rows m < gridDim.y at positions pos[m]:
//  block x = 0, warps 0-3 (mla != null): rmsnorm of kva[m][0..512) (as the
//    rmsnorm kernel with its 128 threads), RoPE of kva[m][512..576), the
//    row written back and its fp8_ds_mla entry stored at mla + pos*656
//    (eng_mla_cache_write);
//  block x = 0, warp 4 (idxc != null): layernorm of ik[m] (128 values, the
//    layernorm kernel's 32 threads), RoPE of its first rot values, written
//    back and stored in the indexer pages at idxc (eng_indexer_cache_write);
//  blocks x = 1..4 (qh != null): idx_q_prep of row m.
// A negative position writes nothing (as the cache writes skip it).
// grid (1 or 5, rows), 512 threads.
// attn_epilogue's work (a separate inlined body since attn_epilogue_pf
// shared it; kept so the kernel's PTX stays the code measured on the H200).
__device__ __forceinline__ void attn_epilogue_body(float* kva, int ldkv, const float* __restrict__ kvw, float kv_eps,
                                                  u8* mla, int kv_il, float* ik, int ldik, const float* __restrict__ ikw, const float* __restrict__ ikb, float ik_eps, u8* idxc,
                  int ik_il, const float* __restrict__ iq, const float* __restrict__ iw, u8* qh, float* wq, int IH,
                  float wscale, const int* __restrict__ pos, const float* __restrict__ cos_t,
                  const float* __restrict__ sin_t, int rot) {
  const int m = blockIdx.y;
  if (blockIdx.x > 0) {
    idx_q_prep_body(iq, iw, pos, cos_t, sin_t, qh, wq, IH, rot, ik_il, wscale, blockIdx.x - 1, m);
    return;
  }
  __shared__ __align__(16) float kv[576];  // float4 loads below
  __shared__ __align__(16) float kk[128];
  __shared__ float sh[4];
  const int t = threadIdx.x, lane = t & 31;
  float* kr = kva + (size_t)m * ldkv;
  float* ir = ik + (size_t)m * ldik;
  // The rows' values go out with the position (they do not need it), and
  // the position's table entries before the norms' reductions (session 62:
  // the position, the rows and the entries were three round trips in a row).
  const bool kvw_ = mla && t < 128, ikw_ = idxc && t >= 128 && t < 160;
  float xv[4] = {0.0f, 0.0f, 0.0f, 0.0f}, xr = 0.0f;
  if (kvw_) {
#pragma unroll
    for (int j = 0; j < 4; j++) xv[j] = kr[t + 128 * j];
    if (t < 64) xr = kr[512 + t];
  } else if (ikw_) {
#pragma unroll
    for (int j = 0; j < 4; j++) xv[j] = ir[lane + 32 * j];
  }
  const int p = pos[m];
  if (p < 0) return;  // block-uniform
  const int half = rot >> 1;
  const float* ct = cos_t + (size_t)p * half;
  const float* st = sin_t + (size_t)p * half;
  float rc[2] = {0.0f, 0.0f}, rs[2] = {0.0f, 0.0f};  // rot <= 128: a lane's pairs i = lane, lane + 32
  if (kvw_ && t < half) {
    rc[0] = ct[t];
    rs[0] = st[t];
  } else if (ikw_) {
#pragma unroll
    for (int u = 0; u < 2; u++) {
      if (lane + 32 * u < half) {
        rc[u] = ct[lane + 32 * u];
        rs[u] = st[lane + 32 * u];
      }
    }
  }
  if (kvw_) {
    float ss = 0.0f;
#pragma unroll
    for (int j = 0; j < 4; j++) ss += xv[j] * xv[j];
    ss = warp_sum(ss);
    if (lane == 0) sh[t >> 5] = ss;
    if (t < 64) kv[512 + t] = xr;
    // named barrier of the four kv warps
    asm volatile("bar.sync 1, 128;" ::: "memory");
    BLOCK_MARK(0);
    float r = 0.0f;
#pragma unroll
    for (int i = 0; i < 4; i++) r += sh[i];
    r = rsqrtf(r / 512.0f + kv_eps);
#pragma unroll
    for (int j = 0; j < 4; j++) kv[t + 128 * j] = kvw[t + 128 * j] * (xv[j] * r);
    if (t < half) fz_rope_pair(kv + 512, t, half, rc[0], rs[0], kv_il);
  } else if (ikw_) {
    float s = 0.0f;
#pragma unroll
    for (int j = 0; j < 4; j++) s += xv[j];
    const float mean = (0.0f + warp_sum(s)) / 128.0f;
    float v = 0.0f;
#pragma unroll
    for (int j = 0; j < 4; j++) {
      const float d = xv[j] - mean;
      v += d * d;
    }
    const float r = rsqrtf((0.0f + warp_sum(v)) / 128.0f + ik_eps);
#pragma unroll
    for (int j = 0; j < 4; j++) {
      float o = (xv[j] - mean) * r;
      if (ikw) o *= ikw[lane + 32 * j];
      if (ikb) o += ikb[lane + 32 * j];
      kk[lane + 32 * j] = o;
    }
    __syncwarp();
#pragma unroll
    for (int u = 0; u < 2; u++)
      if (lane + 32 * u < half) fz_rope_pair(kk, lane + 32 * u, half, rc[u], rs[u], ik_il);
  }
  __syncthreads();
  BLOCK_MARK(1);
  if (mla && t < 128) {
    // eng_mla_cache_write of the row in kv
    const float4 v4 = ((const float4*)kv)[t];
    const float v[4] = {round_bf16(v4.x), round_bf16(v4.y), round_bf16(v4.z), round_bf16(v4.w)};
    const float amax = warp_max(fmaxf(fmaxf(fabsf(v[0]), fabsf(v[1])), fmaxf(fabsf(v[2]), fabsf(v[3]))));
    const float sc = fmaxf(amax / FP8_MAX, 1.17549435e-38f);
    const u32 q = (u32)f32_to_fp8(v[0] / sc) | ((u32)f32_to_fp8(v[1] / sc) << 8) |
                  ((u32)f32_to_fp8(v[2] / sc) << 16) | ((u32)f32_to_fp8(v[3] / sc) << 24);
    u8* row = mla + (size_t)p * 656;
    ((u32*)row)[t] = q;
    if (lane == 0) ((float*)(row + 512))[t >> 5] = sc;
    if (t < 64) ((u16*)(row + 528))[t] = f32_to_bf16(kv[512 + t]);
    ((float4*)kr)[t] = v4;
    if (t < 16) ((float4*)(kr + 512))[t] = ((const float4*)(kv + 512))[t];
    BLOCK_MARK(2);
  } else if (idxc && t >= 128 && t < 160) {
    // eng_indexer_cache_write of the key in kk
    const float4 v4 = ((const float4*)kk)[lane];
    const float v[4] = {round_bf16(v4.x), round_bf16(v4.y), round_bf16(v4.z), round_bf16(v4.w)};
    const float amax = warp_max(fmaxf(fmaxf(fabsf(v[0]), fabsf(v[1])), fmaxf(fabsf(v[2]), fabsf(v[3]))));
    const float sc = ue8m0_ceil_f32(fmaxf(amax, 1e-4f) / FP8_MAX);
    u8* page = idxc + (size_t)(p >> 6) * (64 * 128 + 64 * 4);
    const int off = p & 63;
    const u32 q = (u32)f32_to_fp8(v[0] / sc) | ((u32)f32_to_fp8(v[1] / sc) << 8) |
                  ((u32)f32_to_fp8(v[2] / sc) << 16) | ((u32)f32_to_fp8(v[3] / sc) << 24);
    ((u32*)(page + off * 128))[lane] = q;
    if (lane == 0) ((float*)(page + 64 * 128))[off] = sc;
    ((float4*)ir)[lane] = v4;
  }
}

extern "C" __global__ void __launch_bounds__(512)
    attn_epilogue(float* kva, int ldkv, const float* __restrict__ kvw, float kv_eps, u8* mla, int kv_il, float* ik,
                  int ldik, const float* __restrict__ ikw, const float* __restrict__ ikb, float ik_eps, u8* idxc,
                  int ik_il, const float* __restrict__ iq, const float* __restrict__ iw, u8* qh, float* wq, int IH,
                  float wscale, const int* __restrict__ pos, const float* __restrict__ cos_t,
                  const float* __restrict__ sin_t, int rot) {
  PDL_WAIT_MARKED();
  attn_epilogue_body(kva, ldkv, kvw, kv_eps, mla, kv_il, ik, ldik, ikw, ikb, ik_eps, idxc, ik_il, iq, iw, qh, wq, IH,
                     wscale, pos, cos_t, sin_t, rot);
}

// attn_epilogue for TILERT_GPU_QA_NORM=late (one row): wq_b ran on q_a times
// its norm weight, so the query blocks (x >= 1) take RMSNorm's scale
// rq = rsqrt(sum(ss[0..nss)) / K + eps) from the layer-input group's
// per-block sums of q_a's squares (idx_q_prep_body_s: loaded after the
// query, summed as the absorb module's _n kernels do) and multiply the
// query by it before its RoPE and quantisation; block 0 is attn_epilogue's.
extern "C" __global__ void __launch_bounds__(512)
    attn_epilogue_qs(float* kva, int ldkv, const float* __restrict__ kvw, float kv_eps, u8* mla, int kv_il, float* ik,
                     int ldik, const float* __restrict__ ikw, const float* __restrict__ ikb, float ik_eps, u8* idxc,
                     int ik_il, const float* __restrict__ iq, const float* __restrict__ iw, u8* qh, float* wq, int IH,
                     float wscale, const int* __restrict__ pos, const float* __restrict__ cos_t,
                     const float* __restrict__ sin_t, int rot, const float* __restrict__ ss, int nss, int K,
                     float eps) {
  PDL_WAIT_MARKED();
  if (blockIdx.x > 0) {
    idx_q_prep_body_s(iq, iw, pos, cos_t, sin_t, qh, wq, IH, rot, ik_il, wscale, blockIdx.x - 1, blockIdx.y, ss, nss, K,
                      eps);
    return;
  }
  attn_epilogue_body(kva, ldkv, kvw, kv_eps, mla, kv_il, ik, ldik, ikw, ikb, ik_eps, idxc, ik_il, iq, iw, qh, wq, IH,
                     wscale, pos, cos_t, sin_t, rot);
}

// attn_epilogue over the rows of several slots in one launch (the engine's
// steps with TILERT_GPU_SLOT_MERGE): row m's MLA cache is row_base[m] +
// mla_off and its indexer pages row_base[m] + idx_off (row_base: int64 per
// row, the row's slot buffer), each part on when its flag is set. The rest
// is attn_epilogue_body as it is, so every row's output is attn_epilogue's
// on that row's caches; attn_epilogue keeps its own code.
extern "C" __global__ void __launch_bounds__(512)
    attn_epilogue_rows(float* kva, int ldkv, const float* __restrict__ kvw, float kv_eps, long long mla_off, int has_mla,
                       int kv_il, float* ik, int ldik, const float* __restrict__ ikw, const float* __restrict__ ikb,
                       float ik_eps, long long idx_off, int has_idx, int ik_il, const float* __restrict__ iq,
                       const float* __restrict__ iw, u8* qh, float* wq, int IH, float wscale,
                       const int* __restrict__ pos, const float* __restrict__ cos_t, const float* __restrict__ sin_t,
                       int rot, const long long* __restrict__ row_base) {
  PDL_WAIT_MARKED();
  const long long b = row_base[blockIdx.y];
  u8* mla = has_mla ? (u8*)(b + mla_off) : nullptr;
  u8* idxc = has_idx ? (u8*)(b + idx_off) : nullptr;
  attn_epilogue_body(kva, ldkv, kvw, kv_eps, mla, kv_il, ik, ldik, ikw, ikb, ik_eps, idxc, ik_il, iq, iw, qh, wq, IH,
                     wscale, pos, cos_t, sin_t, rot);
}
