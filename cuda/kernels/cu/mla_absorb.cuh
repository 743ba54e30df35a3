// The absorb products' pieces shared by the default module's mla_absorb.cu
// (absorb_q_fp8, absorb_v_fp8) and the absorb module's one-row forms of
// them (cu/absorb/); each module's source puts this after common.cuh
// (kernels.go, kernels_absorb.go). One
// text for the weight loads and each thread's FMA order, so the one-row
// kernels stay the default ones bit for bit without a transcription to
// keep in step.

// absorb_q: thread (g = t % G, r = t / G) of head h's block of columns
// [c0, c0 + 16 G) loads its 16 columns of rows d = r + i*RL (i < NR, d <
// nope; zeros past nope) of W_UK [H][nope][R], every load before any use.
template <int NR>
__device__ __forceinline__ void absorb_q_load(const u8* __restrict__ W, int h, int nope, int R, int c0, int g, int r,
                                              int RL, uint4* wv) {
#pragma unroll
  for (int i = 0; i < NR; i++) {
    const int d = r + i * RL;
    wv[i] = make_uint4(0u, 0u, 0u, 0u);
    if (d < nope) wv[i] = LD16_ONCE(W + ((size_t)h * nope + d) * R + c0 + g * 16);
  }
}

// acc[k] += a * w's k-th fp8 weight (k < 16), in k order: one row d of
// absorb_q's sums (a: the query's coefficient for d times the row's scale).
__device__ __forceinline__ void absorb_fma16(const uint4& w, float a, float* acc) {
  const u32 ws[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
  for (int b = 0; b < 4; b++) {
    float f[4];
    fp8x4_to_f32(ws[b], f);
#pragma unroll
    for (int k = 0; k < 4; k++) acc[4 * b + k] = fmaf(a, f[k], acc[4 * b + k]);
  }
}

// absorb_v: ABSORB_X16 puts a lane's 16 values of x into xv[16] from four
// float4 (x4b: the b-th, b < 4, read from global or shared memory);
// ABSORB_DOT16 declares acc, the lane's sum over its 16 columns of one row,
// wq's fp8 weights times xv in column order (the caller scales it and sums
// the warp). Statement macros, not functions: inlined as functions they
// renumber the PTX registers of the absorb module's one-row absorb_v
// (scripts/kernel_ptx_diff.py), whose PTX is to stay as it was.
#define ABSORB_X16(xv, x4b)                        \
  _Pragma("unroll") for (int b = 0; b < 4; b++) {  \
    const float4 f = x4b;                          \
    xv[4 * b] = f.x;                               \
    xv[4 * b + 1] = f.y;                           \
    xv[4 * b + 2] = f.z;                           \
    xv[4 * b + 3] = f.w;                           \
  }

#define ABSORB_DOT16(acc, wq, xv)                                                        \
  const u32 ws[4] = {wq.x, wq.y, wq.z, wq.w};                                            \
  float acc = 0.0f;                                                                      \
  _Pragma("unroll") for (int b = 0; b < 4; b++) {                                        \
    float f[4];                                                                          \
    fp8x4_to_f32(ws[b], f);                                                              \
    _Pragma("unroll") for (int k = 0; k < 4; k++) acc = fmaf(f[k], xv[4 * b + k], acc);  \
  }

// absorb_q's one-row block sums (the absorb module's kernels): ABSORB_Q_COLS
// has thread (g, r) sum its NR rows' 16 columns (wv, cf: the query's
// coefficient times the row's scale, rows past nope skipped) in row order,
// the warp's r's by xor shuffles from G up, then threads tid < 16 G sum
// the 8 warps' partials (red [8][128]) from 0.0f into the lvalue DST (an
// expression of tid), times rq when QN. A statement macro, as ABSORB_DOT16,
// so the kernels that run it keep their PTX.
#define ABSORB_Q_COLS(G, NR, QN, wv, cf, r, RL, nope, red, lane, wid, tid, rq, DST)               \
  {                                                                                               \
    float acc_[16];                                                                               \
    _Pragma("unroll") for (int k = 0; k < 16; k++) acc_[k] = 0.0f;                                \
    _Pragma("unroll") for (int i = 0; i < NR; i++) {                                              \
      const int d_ = r + i * RL;                                                                  \
      if (d_ < nope) absorb_fma16(wv[i], cf[i], acc_);                                            \
    }                                                                                             \
    _Pragma("unroll") for (int off = G; off < 32; off <<= 1) {                                    \
      _Pragma("unroll") for (int k = 0; k < 16; k++) acc_[k] += __shfl_xor_sync(0xffffffffu, acc_[k], off); \
    }                                                                                             \
    if (lane < G) {                                                                               \
      _Pragma("unroll") for (int k = 0; k < 16; k++) red[wid][lane * 16 + k] = acc_[k];           \
    }                                                                                             \
    __syncthreads();                                                                              \
    if (tid < 16 * G) {                                                                           \
      float s_ = 0.0f;                                                                            \
      _Pragma("unroll") for (int w = 0; w < 8; w++) s_ += red[w][tid];                            \
      if constexpr (QN) s_ = s_ * rq;                                                             \
      DST = s_;                                                                                   \
    }                                                                                             \
  }

// absorb_q's RoPE part of one head (the absorb module's kernels): thread
// tid's pair (i0, i1) of q's RoPE values (a, b), rotated by (c, s) where
// rot, times rq when QN, into dst. A statement macro, as ABSORB_Q_COLS.
#define ABSORB_Q_ROPE(QN, dst, i0, i1, a, b, c, s, rq, rot) \
  if (rot) {                                                \
    if constexpr (QN) {                                     \
      dst[i0] = (a * c - b * s) * rq;                       \
      dst[i1] = (b * c + a * s) * rq;                       \
    } else {                                                \
      dst[i0] = a * c - b * s;                              \
      dst[i1] = b * c + a * s;                              \
    }                                                       \
  } else if constexpr (QN) {                                \
    dst[i0] = a * rq;                                       \
    dst[i1] = b * rq;                                       \
  } else {                                                  \
    dst[i0] = a;                                            \
    dst[i1] = b;                                            \
  }
