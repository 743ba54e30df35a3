// wq_b's one-row tile GEMV with the attention epilogue in the same launch
// (issue 10: the indexer chain wq_b -> attn_epilogue -> scores -> top-k is
// the one-row step's critical path on GLM-5 dims at 8192 and on both models
// at 131072; attn_epilogue costs a launch boundary and ~5 us there).
//
// Block 0 does attn_epilogue's block-0 work (the latent row's norm, RoPE
// and cache entry; the indexer key's LayerNorm, RoPE and cache page),
// which needs only the projections before wq_b, and writes the zero codes
// and weights of the query heads past H. Blocks 1.. run gemv_tile_body's
// tiles of y = wq_b x (the same plan as the plain launch, so y's bits);
// after each tile's stores a block adds its rows to its head's counter
// (cnt[h], int32), and the block whose rows complete the head's 128
// prepares it: idx_q_prep's RoPE, ue8m0 quantisation and head weight, the
// same expressions (IDX_Q_PREP_HEAD), with the head's values read from the
// L2. That block sets the counter back to 0, so every launch and graph
// replay finds them zeroed. Nothing waits: the last block to touch a head
// does its work, so no block spins on another and the grid needs no
// co-residency.
//
// Ordering: every thread fences its stores before the block's barrier,
// thread 0 fences again before its atomics (release), and the completing
// block's thread 0 fences after its atomic (acquire) before the barrier the
// preparing warp reads behind.

struct IdxQEpi {
  static constexpr unsigned SKIP = 1u;  // block 0: the kv / key epilogue
  enum { ON = 1 };
  const float* y;  // wq_b's output [H][128]
  const float* w;  // head weights [H] (weights_proj's output)
  const int* pos;
  const float* cos_t;
  const float* sin_t;
  u8* qh;
  float* wq;
  int H, rot, interleaved;
  float wscale;
  int* cnt;

  __device__ __forceinline__ void tile_done(int r0, int rows, int N) const {
    __shared__ int heads[4];
    __shared__ int nh;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
      int k = 0;
      const int r1 = min(r0 + rows, N);
      __threadfence();
      for (int h = r0 / IDX_D; r0 < r1 && h <= (r1 - 1) / IDX_D && k < 4; h++) {
        const int a = max(r0, h * IDX_D), b = min(r1, (h + 1) * IDX_D);
        if (atomicAdd(cnt + h, b - a) + (b - a) == IDX_D) heads[k++] = h;
      }
      __threadfence();
      nh = k;
    }
    __syncthreads();
    const int wp = threadIdx.x >> 5;
    if (wp < nh) {
      const int lane = threadIdx.x & 31, h = heads[wp], m = 0;
      const float* qr = y + (size_t)h * IDX_D + 4 * lane;
      IDX_Q_PREP_HEAD(float4 x; asm volatile("ld.global.cg.v4.f32 {%0, %1, %2, %3}, [%4];"
                                             : "=f"(x.x), "=f"(x.y), "=f"(x.z), "=f"(x.w)
                                             : "l"(qr));)
      if (lane == 0) cnt[h] = 0;
    }
  }
};

// Block 0's work, a call of its own (not inlined) so that its registers
// do not weigh on the tile loop's (the _o4 kernels hold 64).
__device__ __noinline__ void wqb_iq_block0(float* kva, int ldkv, const float* __restrict__ kvw, float kv_eps, u8* mla,
                                           int kv_il, float* ik, int ldik, const float* __restrict__ ikw,
                                           const float* __restrict__ ikb, float ik_eps, u8* idxc, int ik_il,
                                           const float* y, const float* __restrict__ iw, u8* qh, float* wq, int IH,
                                           float wscale, const int* __restrict__ pos, const float* __restrict__ cos_t,
                                           const float* __restrict__ sin_t, int rot) {
  {
    // idx_q_prep's warps of heads past H: zero codes, weight 0.
    const int H = IH, m = 0, lane = threadIdx.x & 31;
    const int interleaved = ik_il;
    const float* w = iw;
    for (int h = IH + (threadIdx.x >> 5); h < IDXQ_HEADS; h += TILE_THREADS / 32) {
      IDX_Q_PREP_HEAD(const float4 x = make_float4(0.0f, 0.0f, 0.0f, 0.0f);)
    }
  }
  // attn_epilogue's block 0 (blockIdx.x == 0, row blockIdx.y == 0).
  attn_epilogue_body(kva, ldkv, kvw, kv_eps, mla, kv_il, ik, ldik, ikw, ikb, ik_eps, idxc, ik_il, y, iw, qh, wq, IH,
                     wscale, pos, cos_t, sin_t, rot);
}

template <int R, int LD>
__device__ __forceinline__ void wqb_iq_body(const void* W, const float* S, const float* __restrict__ x, float* y, int N,
                                            int K, int G, int fold, float* kva, int ldkv, const float* __restrict__ kvw,
                                            float kv_eps, u8* mla, int kv_il, float* ik, int ldik,
                                            const float* __restrict__ ikw, const float* __restrict__ ikb, float ik_eps,
                                            u8* idxc, int ik_il, const float* __restrict__ iw, u8* qh, float* wq,
                                            int IH, float wscale, const int* __restrict__ pos,
                                            const float* __restrict__ cos_t, const float* __restrict__ sin_t, int rot,
                                            int* cnt) {
  if (blockIdx.x == 0) {
    wqb_iq_block0(kva, ldkv, kvw, kv_eps, mla, kv_il, ik, ldik, ikw, ikb, ik_eps, idxc, ik_il, y, iw, qh, wq, IH, wscale,
                  pos, cos_t, sin_t, rot);
    return;
  }
  const IdxQEpi epi = {y, iw, pos, cos_t, sin_t, qh, wq, IH, rot, ik_il, wscale, cnt};
  gemv_tile_body<TFP8, R, 1, LD, IdxQEpi>(0, 0, 0, 0, 0, 0, W, S, 0, 0, x, K, 1, 0, y, N, 0, N, K, 1, G, fold, epi);
}

// The launchable variants: the one-row fp8 tile kernels' plans (plain at
// 1..8 rows a group, _d16 at 2..8, _o4 at 4 and 8), each with its launch
// bounds.
#define WQB_IQ_PARAMS                                                                                                  \
  const void *W, const float *S, const float *__restrict__ x, float *y, int N, int K, int G, int fold, float *kva,     \
      int ldkv, const float *__restrict__ kvw, float kv_eps, u8 *mla, int kv_il, float *ik, int ldik,                  \
      const float *__restrict__ ikw, const float *__restrict__ ikb, float ik_eps, u8 *idxc, int ik_il,                 \
      const float *__restrict__ iw, u8 *qh, float *wq, int IH, float wscale, const int *__restrict__ pos,              \
      const float *__restrict__ cos_t, const float *__restrict__ sin_t, int rot, int *cnt
#define WQB_IQ_ARGS                                                                                                    \
  W, S, x, y, N, K, G, fold, kva, ldkv, kvw, kv_eps, mla, kv_il, ik, ldik, ikw, ikb, ik_eps, idxc, ik_il, iw, qh, wq,  \
      IH, wscale, pos, cos_t, sin_t, rot, cnt

extern "C" __global__ void __launch_bounds__(TILE_THREADS) gemv_tile_fp8_r8_m1_iq(WQB_IQ_PARAMS) {
  PDL_WAIT();
  wqb_iq_body<8, 8>(WQB_IQ_ARGS);
}

extern "C" __global__ void __launch_bounds__(TILE_THREADS, 2) gemv_tile_fp8_r8_m1_d16_iq(WQB_IQ_PARAMS) {
  PDL_WAIT();
  wqb_iq_body<8, 16>(WQB_IQ_ARGS);
}

extern "C" __global__ void __launch_bounds__(TILE_THREADS, 3) gemv_tile_fp8_r8_m1_o4_iq(WQB_IQ_PARAMS) {
  PDL_WAIT();
  wqb_iq_body<8, 8>(WQB_IQ_ARGS);
}

extern "C" __global__ void __launch_bounds__(TILE_THREADS) gemv_tile_fp8_r4_m1_iq(WQB_IQ_PARAMS) {
  PDL_WAIT();
  wqb_iq_body<4, 8>(WQB_IQ_ARGS);
}

extern "C" __global__ void __launch_bounds__(TILE_THREADS, 2) gemv_tile_fp8_r4_m1_d16_iq(WQB_IQ_PARAMS) {
  PDL_WAIT();
  wqb_iq_body<4, 16>(WQB_IQ_ARGS);
}

extern "C" __global__ void __launch_bounds__(TILE_THREADS, 3) gemv_tile_fp8_r4_m1_o4_iq(WQB_IQ_PARAMS) {
  PDL_WAIT();
  wqb_iq_body<4, 8>(WQB_IQ_ARGS);
}

extern "C" __global__ void __launch_bounds__(TILE_THREADS) gemv_tile_fp8_r2_m1_iq(WQB_IQ_PARAMS) {
  PDL_WAIT();
  wqb_iq_body<2, 8>(WQB_IQ_ARGS);
}

extern "C" __global__ void __launch_bounds__(TILE_THREADS, 2) gemv_tile_fp8_r2_m1_d16_iq(WQB_IQ_PARAMS) {
  PDL_WAIT();
  wqb_iq_body<2, 16>(WQB_IQ_ARGS);
}

extern "C" __global__ void __launch_bounds__(TILE_THREADS) gemv_tile_fp8_r1_m1_iq(WQB_IQ_PARAMS) {
  PDL_WAIT();
  wqb_iq_body<1, 8>(WQB_IQ_ARGS);
}
