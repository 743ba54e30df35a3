// o_proj's one-row tile GEMV with the post-attention add + RMSNorm in its
// last tile (issue 10: add_rmsnorm_reg is a one-block launch of ~3.5 us on
// the one-row step's critical path between o_proj and the router, on both
// models at every length).
//
// The tiles (gemv_tile_body, or gemv_tile_gs_body for the strided `_d16s`
// plan) run on the plan the plain launch takes, so y's bits. After each
// tile's stores a block counts the tile (one int32 counter); the block
// that counts the launch's last tile runs add_rmsnorm_row on the row:
// x += y, h = w * (x * r), its nt threads played by the block's 256
// (thread t plays t, t + 256, ...: each played thread's elements, sums and
// warp butterflies are its own, the warp partials summed in order), so x
// and h carry add_rmsnorm_reg's bits. It sets the counter back to 0. The
// fences are wqb_iq.cu's.

// add_rmsnorm_row of row 0 by the block's TILE_THREADS threads playing nt
// (a multiple of 32, at most 1024) threads; b was written in this launch
// (read from the L2), x only by this block.
__device__ __noinline__ void add_rmsnorm_played(float* x, const float* b, const float* __restrict__ w, float* y, int D,
                                                int nt, float eps) {
  __shared__ float sh[32];
  const int t = threadIdx.x, lane = t & 31, wp = t >> 5;
  for (int q = 0; q * TILE_THREADS < nt; q++) {
    const int vt = t + q * TILE_THREADS;
    float ss = 0.0f;
    if (vt < nt) {
#pragma unroll
      for (int j = 0; j < NORM_REGS; j++) {
        const int i = vt + j * nt;
        if (i < D) {
          float xv, bv;
          asm volatile("ld.global.cg.f32 %0, [%1];" : "=f"(xv) : "l"(x + i));
          asm volatile("ld.global.cg.f32 %0, [%1];" : "=f"(bv) : "l"(b + i));
          const float v = xv + bv;
          x[i] = v;
          ss += v * v;
        }
      }
    }
    ss = warp_sum(ss);
    if (lane == 0 && vt < nt) sh[vt >> 5] = ss;
  }
  __syncthreads();
  float r = 0.0f;
  for (int i = 0; i < (nt >> 5); i++) r += sh[i];
  r = rsqrtf(r / (float)D + eps);
  for (int q = 0; q * TILE_THREADS < nt; q++) {
    const int vt = t + q * TILE_THREADS;
    if (vt < nt) {
#pragma unroll
      for (int j = 0; j < NORM_REGS; j++) {
        const int i = vt + j * nt;
        if (i < D) y[i] = w[i] * (x[i] * r);
      }
    }
  }
}

struct AddNormEpi {
  static constexpr unsigned SKIP = 0u;
  enum { ON = 1 };
  float* x;         // the residual row, x += o_proj's output
  const float* b;   // o_proj's output (this launch's y)
  const float* w;   // the post-attention norm's weights
  float* h;         // the normed row
  int D, nt;
  float eps;
  int* cnt;

  __device__ __forceinline__ void tile_done(int, int, int, int calls) const {
    __shared__ int last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
      __threadfence();
      last = atomicAdd(cnt, 1) == calls - 1;
      __threadfence();
    }
    __syncthreads();
    if (last) {  // block-uniform
      add_rmsnorm_played(x, b, w, h, D, nt, eps);
      if (threadIdx.x == 0) *cnt = 0;
    }
  }
};

#define OPROJ_AN_PARAMS                                                                                                \
  const void *W, const float *S, const float *__restrict__ x, float *y, int N, int K, int G, int fold, float *xres,   \
      const float *__restrict__ nw, float *h, int nt, float eps, int *cnt
#define OPROJ_AN_EPI \
  const AddNormEpi epi = {xres, y, nw, h, N, nt, eps, cnt}

// The launchable variants: the one-row fp8 tile plans (plain at 1..8 rows
// a group, _d16 at 2..8, _o4 at 4 and 8) and the strided _d16s, each with
// its twin's launch bounds.
extern "C" __global__ void __launch_bounds__(TILE_THREADS) gemv_tile_fp8_r8_m1_an(OPROJ_AN_PARAMS) {
  PDL_WAIT();
  OPROJ_AN_EPI;
  gemv_tile_body<TFP8, 8, 1, 8, AddNormEpi>(0, 0, 0, 0, 0, 0, W, S, 0, 0, x, K, 1, 0, y, N, 0, N, K, 1, G, fold, epi);
}

extern "C" __global__ void __launch_bounds__(TILE_THREADS, 2) gemv_tile_fp8_r8_m1_d16_an(OPROJ_AN_PARAMS) {
  PDL_WAIT();
  OPROJ_AN_EPI;
  gemv_tile_body<TFP8, 8, 1, 16, AddNormEpi>(0, 0, 0, 0, 0, 0, W, S, 0, 0, x, K, 1, 0, y, N, 0, N, K, 1, G, fold, epi);
}

extern "C" __global__ void __launch_bounds__(TILE_THREADS, 4) gemv_tile_fp8_r8_m1_o4_an(OPROJ_AN_PARAMS) {
  PDL_WAIT();
  OPROJ_AN_EPI;
  gemv_tile_body<TFP8, 8, 1, 8, AddNormEpi>(0, 0, 0, 0, 0, 0, W, S, 0, 0, x, K, 1, 0, y, N, 0, N, K, 1, G, fold, epi);
}

extern "C" __global__ void __launch_bounds__(TILE_THREADS) gemv_tile_fp8_r4_m1_an(OPROJ_AN_PARAMS) {
  PDL_WAIT();
  OPROJ_AN_EPI;
  gemv_tile_body<TFP8, 4, 1, 8, AddNormEpi>(0, 0, 0, 0, 0, 0, W, S, 0, 0, x, K, 1, 0, y, N, 0, N, K, 1, G, fold, epi);
}

extern "C" __global__ void __launch_bounds__(TILE_THREADS, 2) gemv_tile_fp8_r4_m1_d16_an(OPROJ_AN_PARAMS) {
  PDL_WAIT();
  OPROJ_AN_EPI;
  gemv_tile_body<TFP8, 4, 1, 16, AddNormEpi>(0, 0, 0, 0, 0, 0, W, S, 0, 0, x, K, 1, 0, y, N, 0, N, K, 1, G, fold, epi);
}

extern "C" __global__ void __launch_bounds__(TILE_THREADS, 4) gemv_tile_fp8_r4_m1_o4_an(OPROJ_AN_PARAMS) {
  PDL_WAIT();
  OPROJ_AN_EPI;
  gemv_tile_body<TFP8, 4, 1, 8, AddNormEpi>(0, 0, 0, 0, 0, 0, W, S, 0, 0, x, K, 1, 0, y, N, 0, N, K, 1, G, fold, epi);
}

extern "C" __global__ void __launch_bounds__(TILE_THREADS, 2) gemv_tile_fp8_r8_m1_d16s_an(OPROJ_AN_PARAMS) {
  PDL_WAIT();
  OPROJ_AN_EPI;
  gemv_tile_gs_body<TFP8, 8, 16, AddNormEpi>(W, S, x, K, 0, y, 0, N, K, G, epi);
}

extern "C" __global__ void __launch_bounds__(TILE_THREADS, 2) gemv_tile_fp8_r4_m1_d16s_an(OPROJ_AN_PARAMS) {
  PDL_WAIT();
  OPROJ_AN_EPI;
  gemv_tile_gs_body<TFP8, 4, 16, AddNormEpi>(W, S, x, K, 0, y, 0, N, K, G, epi);
}

extern "C" __global__ void __launch_bounds__(TILE_THREADS) gemv_tile_fp8_r2_m1_an(OPROJ_AN_PARAMS) {
  PDL_WAIT();
  OPROJ_AN_EPI;
  gemv_tile_body<TFP8, 2, 1, 8, AddNormEpi>(0, 0, 0, 0, 0, 0, W, S, 0, 0, x, K, 1, 0, y, N, 0, N, K, 1, G, fold, epi);
}

extern "C" __global__ void __launch_bounds__(TILE_THREADS, 2) gemv_tile_fp8_r2_m1_d16_an(OPROJ_AN_PARAMS) {
  PDL_WAIT();
  OPROJ_AN_EPI;
  gemv_tile_body<TFP8, 2, 1, 16, AddNormEpi>(0, 0, 0, 0, 0, 0, W, S, 0, 0, x, K, 1, 0, y, N, 0, N, K, 1, G, fold, epi);
}

extern "C" __global__ void __launch_bounds__(TILE_THREADS) gemv_tile_fp8_r1_m1_an(OPROJ_AN_PARAMS) {
  PDL_WAIT();
  OPROJ_AN_EPI;
  gemv_tile_body<TFP8, 1, 1, 8, AddNormEpi>(0, 0, 0, 0, 0, 0, W, S, 0, 0, x, K, 1, 0, y, N, 0, N, K, 1, G, fold, epi);
}
