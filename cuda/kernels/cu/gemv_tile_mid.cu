// Mid-size grouped GEMVs of one input row (TILERT_GPU_GEMV_MID=1; helper
// gmid, issue 10): the attention inputs of a decode step (q_a, kv_a,
// indexer wk and weights_proj: 2304 x 7168; q_b and indexer wq_b: 32768 x
// 1536) as gemv_tile_group.cu's launch with more weight loads in flight per
// thread, or fewer rows per block, so a block streams its whole share in
// one round and more of the SMs' room holds loads.
//
// The default grouped kernels issue 8 loads a round (R rows x 8/R chunks):
// with the layer input's G = 256 and R = 8 a thread streams its two chunks
// of each row in two round trips one after the other (288 blocks of 57 KB);
// with q_b's G = 64 and R = 8 likewise (the tile GEMV's _d16 runs q_b in
// one). The variants here run gemv_group_body with LD loads a round (R
// rows x LD/R chunks): a thread's chunks, their order, the FMA order and
// the fixed-order combine depend on G alone, so every output is bit for bit
// the default grouped launch's (and the separate tile GEMV's with that G).
//
//   gemv_mid_group_r8_m1_d16: R = 8, 16 loads, <= 128 registers (2 blocks an SM)
//   gemv_mid_group_r4_m1_d16: R = 4, 16 loads, <= 128 registers
//   gemv_mid_group_r4_m1_o4:  R = 4, 8 loads, <= 64 registers (4 blocks an SM)
//   gemv_mid_group_r2_m1_o4:  R = 2, 8 loads, <= 64 registers
//
// Arguments and segment layout are gemv_group_*'s (the launcher is
// GemvGroupMid in ops_group.go); one input row (M = 1), the loop norm
// prologue when nw != 0. Sorts after gemv_tile_group.cu (one module in
// name order) and reuses its body.

template <int R, int LD>
__device__ __forceinline__ void gemv_mid_run(const float* __restrict__ x, int ldx, int K, int M,
                                             const float* __restrict__ nw, float eps, int nf, const void* w0,
                                             const float* s0, float* y0, int n0, int ldy0, int cfg0, const void* w1,
                                             const float* s1, float* y1, int n1, int ldy1, int cfg1, const void* w2,
                                             const float* s2, float* y2, int n2, int ldy2, int cfg2, const void* w3,
                                             const float* s3, float* y3, int n3, int ldy3, int cfg3) {
  __shared__ float part[TILE_THREADS / 32][32];
  __shared__ float nsh[1][32];
  __shared__ float rs[1];
  int blk = blockIdx.x;
  const void* W = w0;
  const float* S = s0;
  float* y = y0;
  int N = n0, ldy = ldy0, cfg = cfg0;
  int nb = group_blocks<R>(n0, cfg0);
  if (blk >= nb) {
    blk -= nb;
    W = w1, S = s1, y = y1, N = n1, ldy = ldy1, cfg = cfg1;
    nb = group_blocks<R>(n1, cfg1);
    if (blk >= nb) {
      blk -= nb;
      W = w2, S = s2, y = y2, N = n2, ldy = ldy2, cfg = cfg2;
      nb = group_blocks<R>(n2, cfg2);
      if (blk >= nb) {
        blk -= nb;
        W = w3, S = s3, y = y3, N = n3, ldy = ldy3, cfg = cfg3;
      }
    }
  }
  const int G = cfg & 1023, fold = (nf >> 16) & 1, fastnorm = (nf >> 17) & 1, nthr = nf & 0xffff;
  if ((cfg >> 14) & 1) {
    gemv_group_body<TBF16, R, 1, false, LD>(W, S, y, ldy, N, G, blk, x, ldx, K, M, nw, eps, nthr, fold, fastnorm,
                                            part, nsh, rs);
  } else {
    gemv_group_body<TFP8, R, 1, false, LD>(W, S, y, ldy, N, G, blk, x, ldx, K, M, nw, eps, nthr, fold, fastnorm,
                                           part, nsh, rs);
  }
}

extern "C" __global__ void __launch_bounds__(TILE_THREADS, 2)
    gemv_mid_group_r8_m1_d16(const float* __restrict__ x, int ldx, int K, int M, const float* __restrict__ nw,
                             float eps, int nf, const void* w0, const float* s0, float* y0, int n0, int ldy0,
                             int cfg0, const void* w1, const float* s1, float* y1, int n1, int ldy1, int cfg1,
                             const void* w2, const float* s2, float* y2, int n2, int ldy2, int cfg2, const void* w3,
                             const float* s3, float* y3, int n3, int ldy3, int cfg3) {
  PDL_WAIT();
  gemv_mid_run<8, 16>(x, ldx, K, M, nw, eps, nf, w0, s0, y0, n0, ldy0, cfg0, w1, s1, y1, n1, ldy1, cfg1, w2, s2, y2,
                      n2, ldy2, cfg2, w3, s3, y3, n3, ldy3, cfg3);
}

extern "C" __global__ void __launch_bounds__(TILE_THREADS, 2)
    gemv_mid_group_r4_m1_d16(const float* __restrict__ x, int ldx, int K, int M, const float* __restrict__ nw,
                             float eps, int nf, const void* w0, const float* s0, float* y0, int n0, int ldy0,
                             int cfg0, const void* w1, const float* s1, float* y1, int n1, int ldy1, int cfg1,
                             const void* w2, const float* s2, float* y2, int n2, int ldy2, int cfg2, const void* w3,
                             const float* s3, float* y3, int n3, int ldy3, int cfg3) {
  PDL_WAIT();
  gemv_mid_run<4, 16>(x, ldx, K, M, nw, eps, nf, w0, s0, y0, n0, ldy0, cfg0, w1, s1, y1, n1, ldy1, cfg1, w2, s2, y2,
                      n2, ldy2, cfg2, w3, s3, y3, n3, ldy3, cfg3);
}

extern "C" __global__ void __launch_bounds__(TILE_THREADS, 4)
    gemv_mid_group_r4_m1_o4(const float* __restrict__ x, int ldx, int K, int M, const float* __restrict__ nw,
                            float eps, int nf, const void* w0, const float* s0, float* y0, int n0, int ldy0,
                            int cfg0, const void* w1, const float* s1, float* y1, int n1, int ldy1, int cfg1,
                            const void* w2, const float* s2, float* y2, int n2, int ldy2, int cfg2, const void* w3,
                            const float* s3, float* y3, int n3, int ldy3, int cfg3) {
  PDL_WAIT();
  gemv_mid_run<4, 8>(x, ldx, K, M, nw, eps, nf, w0, s0, y0, n0, ldy0, cfg0, w1, s1, y1, n1, ldy1, cfg1, w2, s2, y2,
                     n2, ldy2, cfg2, w3, s3, y3, n3, ldy3, cfg3);
}

extern "C" __global__ void __launch_bounds__(TILE_THREADS, 4)
    gemv_mid_group_r2_m1_o4(const float* __restrict__ x, int ldx, int K, int M, const float* __restrict__ nw,
                            float eps, int nf, const void* w0, const float* s0, float* y0, int n0, int ldy0,
                            int cfg0, const void* w1, const float* s1, float* y1, int n1, int ldy1, int cfg1,
                            const void* w2, const float* s2, float* y2, int n2, int ldy2, int cfg2, const void* w3,
                            const float* s3, float* y3, int n3, int ldy3, int cfg3) {
  PDL_WAIT();
  gemv_mid_run<2, 8>(x, ldx, K, M, nw, eps, nf, w0, s0, y0, n0, ldy0, cfg0, w1, s1, y1, n1, ldy1, cfg1, w2, s2, y2,
                     n2, ldy2, cfg2, w3, s3, y3, n3, ldy3, cfg3);
}
