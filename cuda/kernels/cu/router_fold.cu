// The MoE router folded through o_proj (engine/gpu NOTES.md
// "TILERT_GPU_ROUTER_FOLD=1"). The router is linear and the post-attention norm
// only scales, so
//   W_r h = W_r diag(w) (x + W_o v) / rms = (A x + M v) / rms,
//   A = W_r diag(w), M = A W_o:
// A x needs only the layer's input residual and M v only o_proj's input,
// so neither GEMV waits for o_proj; the norm's block then finishes the
// routing from the two parts (add_rmsnorm_route). A and M are kept as
// hi/lo bf16 pairs ([2E][cols]: rows j and E + j, hi = bf16(v), lo =
// bf16(v - hi)): the bytes of float32 at ~2^-17 relative, read by the wide
// bf16 GEMV (the float32 GEMV keeps one 512-byte chunk a row in flight).

// rf_split stores v as the pair (hi, lo) at rows j and E + j of a [2E][n]
// bf16 matrix.
__device__ __forceinline__ void rf_split(u16* p, float v, int E, int j, int n, int col) {
  const u16 hi = f32_to_bf16(v);
  p[(size_t)j * n + col] = hi;
  p[(size_t)(E + j) * n + col] = f32_to_bf16(v - bf16_to_f32(hi));
}

// router_fold_a: A[j][i] = float(W_r[j][i]) * w[i] (one rounding, the
// float32 product) into a ([E][H] float32, router_fold_m's input) and as
// hi/lo pairs into a2 ([2E][H] bf16). wr_kind 1: bf16 W_r, 2: float32.
// Grid (cdiv(H, 256), E).
extern "C" __global__ void __launch_bounds__(256) router_fold_a(float* __restrict__ a, u16* __restrict__ a2,
                                                                const void* __restrict__ wr, int wr_kind,
                                                                const float* __restrict__ w, int E, int H) {
  const int i = blockIdx.x * 256 + threadIdx.x, j = blockIdx.y;
  if (i >= H || j >= E) return;
  const size_t o = (size_t)j * H + i;
  const float r = wr_kind == 1 ? bf16_to_f32(((const u16*)wr)[o]) : ((const float*)wr)[o];
  const float v = r * w[i];
  a[o] = v;
  rf_split(a2, v, E, j, H, i);
}

// router_fold_m: M = A W_o in float64, rounded once to float32 and stored
// as hi/lo pairs in m2 ([2E][K] bf16). W_o is
// [H][K] (o_proj: out H, in K): wo_kind 0 e4m3 with float32 block scales
// [cdiv(H,128)][cdiv(K,128)] (the fp8 linears' layout), 1 bf16, 2 float32.
// A block owns RF_J rows of M and 256 of its columns (thread t column
// k0 + t), and walks H in chunks of RF_I: A's chunk in shared memory, each
// thread its column's W_o values (coalesced across the block). Runs once
// a layer at load (30 GFLOP at DeepSeek-V3.2's 256 x 7168 x 16384).
#define RF_J 16
#define RF_I 32
extern "C" __global__ void __launch_bounds__(256) router_fold_m(u16* __restrict__ m2, const float* __restrict__ a,
                                                                const void* __restrict__ wo,
                                                                const float* __restrict__ wos, int wo_kind, int E,
                                                                int H, int K) {
  __shared__ float as[RF_J][RF_I];
  const int t = threadIdx.x, k = blockIdx.x * 256 + t, j0 = blockIdx.y * RF_J;
  const int kb = (K + 127) / 128;
  double acc[RF_J];
#pragma unroll
  for (int jj = 0; jj < RF_J; jj++) acc[jj] = 0.0;
  for (int i0 = 0; i0 < H; i0 += RF_I) {
    for (int e = t; e < RF_J * RF_I; e += 256) {
      const int jj = e / RF_I, ii = e % RF_I;
      as[jj][ii] = (j0 + jj < E && i0 + ii < H) ? a[(size_t)(j0 + jj) * H + i0 + ii] : 0.0f;
    }
    __syncthreads();
    if (k < K) {
      for (int ii = 0; ii < RF_I && i0 + ii < H; ii++) {
        const int i = i0 + ii;
        const size_t o = (size_t)i * K + k;
        float v;
        if (wo_kind == 0) {
          v = fp8_to_f32(((const unsigned char*)wo)[o]) * wos[(size_t)(i / 128) * kb + k / 128];
        } else if (wo_kind == 1) {
          v = bf16_to_f32(((const u16*)wo)[o]);
        } else {
          v = ((const float*)wo)[o];
        }
#pragma unroll
        for (int jj = 0; jj < RF_J; jj++) acc[jj] = fma((double)as[jj][ii], (double)v, acc[jj]);
      }
    }
    __syncthreads();
  }
  if (k < K) {
#pragma unroll
    for (int jj = 0; jj < RF_J; jj++)
      if (j0 + jj < E) rf_split(m2, (float)acc[jj], E, j0 + jj, K, k);
  }
}

// add_rmsnorm_route: add_rmsnorm_reg's row (x += b, y = rmsnorm(x) * w:
// the same bits), then the row's routing (moe_route_rank's rule and
// outputs) on the logits (A x + M v) * (1/rms), from r1 = A2 x and
// r2 = M2 v ([rows][2E]: the hi and lo rows' products, summed here) of the
// row before the add. One block a row of normThreads(D) >= E threads.
extern "C" __global__ void __launch_bounds__(1024) add_rmsnorm_route(
    float* x, const float* b, const float* __restrict__ w, float* y, int D, int ldx, int ldb, int ldy, float eps,
    const float* r1, const float* r2, const float* __restrict__ bias, int* idx, float* wts, int E, int K, int ngroup,
    int topk_group, int norm, float scale) {
  PDL_WAIT();
  __shared__ float lg[1024];
  const int t = threadIdx.x;
  const size_t row = blockIdx.x;
  const float* q1 = r1 + row * 2 * E;
  const float* q2 = r2 + row * 2 * E;
  const float p1 = t < E ? q1[t] + q1[E + t] : 0.0f, p2 = t < E ? q2[t] + q2[E + t] : 0.0f;
  const float r = add_rmsnorm_row(x, b, w, y, D, ldx, ldb, ldy, eps);
  if (t < E) lg[t] = (p1 + p2) * r;
  __syncthreads();
  moe_route_rank_row(lg, bias, idx + row * K, wts + row * K, E, K, ngroup, topk_group, norm, scale);
}
