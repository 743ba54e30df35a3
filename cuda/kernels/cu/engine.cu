// Kernels of the GPU decode engine (engine/gpu) beyond the forward kernels:
// cache writes with the exact rounding of engine/layout.go (values rounded to
// bf16 before quantisation, as vLLM's bf16 tensors are), the indexer query's
// fp8 round trip, strided copies and the absorbed-MLA per-head products.

// Smallest power of two >= s for a positive normal float32 s (s itself when
// it already is one): engine.UE8M0Ceil, computed on the float32 quotient so
// host and device pick the same scale.
__device__ __forceinline__ float ue8m0_ceil_f32(float s) {
  const u32 u = __float_as_uint(s);
  if ((u & 0x007fffffu) == 0u) return s;
  return __uint_as_float((u & 0x7f800000u) + 0x00800000u);
}

__device__ __forceinline__ float round_bf16(float f) { return bf16_to_f32(f32_to_bf16(f)); }

// fp8_ds_mla entries (656 bytes: 512 fp8, 4 float32 scales, 64 bf16 rope)
// for n rows of src ([n][ld]: 512 latent values then 64 rope values) at
// token positions pos[i] of a contiguous cache region (page p holds tokens
// 64p..64p+63). Scale = max(amax/448, FLT_MIN) over the bf16-rounded
// latent, as engine.EncodeMLAFP8. One block of 128 threads per row, a warp
// per 128-value group.
extern "C" __global__ void __launch_bounds__(128) eng_mla_cache_write(const float* __restrict__ src, int ld, u8* cache,
                                                                      const int* __restrict__ pos) {
  PDL_WAIT();
  const int p = pos[blockIdx.x];
  if (p < 0) return;
  const int tid = threadIdx.x;
  const float* s = src + (size_t)blockIdx.x * ld;
  u8* row = cache + (size_t)p * 656;
  const float4 v4 = ((const float4*)s)[tid];
  const float v[4] = {round_bf16(v4.x), round_bf16(v4.y), round_bf16(v4.z), round_bf16(v4.w)};
  const float amax = warp_max(fmaxf(fmaxf(fabsf(v[0]), fabsf(v[1])), fmaxf(fabsf(v[2]), fabsf(v[3]))));
  const float sc = fmaxf(amax / FP8_MAX, 1.17549435e-38f);
  const u32 q = (u32)f32_to_fp8(v[0] / sc) | ((u32)f32_to_fp8(v[1] / sc) << 8) | ((u32)f32_to_fp8(v[2] / sc) << 16) |
                ((u32)f32_to_fp8(v[3] / sc) << 24);
  ((u32*)row)[tid] = q;
  if ((tid & 31) == 0) ((float*)(row + 512))[tid >> 5] = sc;
  if (tid < 64) ((u16*)(row + 528))[tid] = f32_to_bf16(s[512 + tid]);
}

// Indexer keys (128 values, src row stride ld) into 8448-byte pages at
// positions pos[i]: bf16-rounded, scale = UE8M0Ceil(max(amax,1e-4)/448), as
// engine.EncodeIndexerKey. One warp per row.
extern "C" __global__ void __launch_bounds__(32) eng_indexer_cache_write(const float* __restrict__ src, int ld,
                                                                         u8* cache, const int* __restrict__ pos) {
  PDL_WAIT();
  const int p = pos[blockIdx.x];
  if (p < 0) return;
  const int lane = threadIdx.x;
  const float4 v4 = ((const float4*)(src + (size_t)blockIdx.x * ld))[lane];
  const float v[4] = {round_bf16(v4.x), round_bf16(v4.y), round_bf16(v4.z), round_bf16(v4.w)};
  const float amax = warp_max(fmaxf(fmaxf(fabsf(v[0]), fabsf(v[1])), fmaxf(fabsf(v[2]), fabsf(v[3]))));
  const float sc = ue8m0_ceil_f32(fmaxf(amax, 1e-4f) / FP8_MAX);
  u8* page = cache + (size_t)(p >> 6) * (64 * 128 + 64 * 4);
  const int off = p & 63;
  const u32 q = (u32)f32_to_fp8(v[0] / sc) | ((u32)f32_to_fp8(v[1] / sc) << 8) | ((u32)f32_to_fp8(v[2] / sc) << 16) |
                ((u32)f32_to_fp8(v[3] / sc) << 24);
  ((u32*)(page + off * 128))[lane] = q;
  if (lane == 0) ((float*)(page + 64 * 128))[off] = sc;
}

// In place, per group of 128 floats: x = fp8(x/s)*s with s =
// UE8M0Ceil(max(amax,1e-10)/448) (engine.QuantFP8UE8M0, vLLM's fp8 indexer
// query). One warp per group.
extern "C" __global__ void __launch_bounds__(32) eng_quant_ue8m0(float* x) {
  PDL_WAIT();
  float* g = x + (size_t)blockIdx.x * 128;
  const int lane = threadIdx.x;
  float4 v = ((float4*)g)[lane];
  const float amax = warp_max(fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w))));
  const float sc = ue8m0_ceil_f32(fmaxf(amax, 1e-10f) / FP8_MAX);
  v.x = fp8_to_f32(f32_to_fp8(v.x / sc)) * sc;
  v.y = fp8_to_f32(f32_to_fp8(v.y / sc)) * sc;
  v.z = fp8_to_f32(f32_to_fp8(v.z / sc)) * sc;
  v.w = fp8_to_f32(f32_to_fp8(v.w / sc)) * sc;
  ((float4*)g)[lane] = v;
}

// dst[r][c] = src[r][c] for c < cols, row strides ldd / lds (floats).
extern "C" __global__ void eng_copy2d(float* dst, const float* __restrict__ src, int rows, int cols, int ldd, int lds) {
  PDL_WAIT();
  const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= (long long)rows * cols) return;
  const int r = (int)(i / cols), c = (int)(i % cols);
  dst[(size_t)r * ldd + c] = src[(size_t)r * lds + c];
}

// x[i] *= a for i < n.
extern "C" __global__ void eng_scale(float* x, float a, int n) {
  PDL_WAIT();
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] *= a;
}

// Absorbed MLA, query side: out[m][h][c] = sum_d W[h][d][c] * q[m*ldq + h*hs + d]
// for c < R (W = W_UK: [H][nope][R]). fp8 != 0: W is e4m3 with one float32
// scale per row and 128 columns, S[h][d][c/128] (the converter's row_scale
// layout); else W is float32 and S unused. Threads own columns, so each
// accumulates over d in order, as the CPU engine's axpy loop.
// grid (H, M), 128 threads.
extern "C" __global__ void __launch_bounds__(128) eng_absorb_q(float* out, const float* __restrict__ q,
                                                               const void* __restrict__ W,
                                                               const float* __restrict__ S, int fp8, int nope, int R,
                                                               int ldq, int hs) {
  PDL_WAIT();
  // Each output sums over d in order (as before); the weights of 16 d are
  // loaded before they are used so many loads are in flight per thread.
  __shared__ float qsh[1024];
  const int h = blockIdx.x, m = blockIdx.y, H = gridDim.x;
  const float* qh = q + (size_t)m * ldq + (size_t)h * hs;
  const int rb = (R + 127) >> 7;
  float* o = out + ((size_t)m * H + h) * R;
  const bool staged = nope <= 1024;
  if (staged)
    for (int d = threadIdx.x; d < nope; d += blockDim.x) qsh[d] = qh[d];
  __syncthreads();
  const float* qv = staged ? qsh : qh;
  for (int c = threadIdx.x; c < R; c += blockDim.x) {
    float acc = 0.0f;
    int d = 0;
    if (fp8) {
      const u8* Wc = (const u8*)W + (size_t)h * nope * R + c;
      const float* Sc = S + (size_t)h * nope * rb + (c >> 7);
      for (; d + 16 <= nope; d += 16) {
        u8 wb[16];
        float sv[16];
#pragma unroll
        for (int k = 0; k < 16; k++) {
          wb[k] = Wc[(size_t)(d + k) * R];
          sv[k] = Sc[(size_t)(d + k) * rb];
        }
#pragma unroll
        for (int k = 0; k < 16; k++) {
          const float w = fp8_to_f32(wb[k]) * sv[k];
          acc += qv[d + k] * w;
        }
      }
    }
    for (; d < nope; d++) {
      const size_t row = (size_t)h * nope + d;
      float w;
      if (fp8) {
        w = fp8_to_f32(((const u8*)W)[row * R + c]) * S[row * rb + (c >> 7)];
      } else {
        w = ((const float*)W)[row * R + c];
      }
      acc += qv[d] * w;
    }
    o[c] = acc;
  }
}

// Absorbed MLA, output side: out[m*ldo + h*vd + v] = sum_c W[h][v][c] * x[m][h][c]
// (W = W_UV: [H][vd][R], same weight forms as eng_absorb_q; x: [M][H][R]).
// grid (H * ceil(vd/32), M), 128 threads: a warp per 8 output rows.
extern "C" __global__ void __launch_bounds__(128) eng_absorb_v(float* out, const float* __restrict__ x,
                                                               const void* __restrict__ W,
                                                               const float* __restrict__ S, int fp8, int vd, int R,
                                                               int ldo) {
  PDL_WAIT();
  // grid (H * ceil(vd/32), M): a block takes 32 output rows of one head, a
  // warp 8 rows at once (8 independent loads per step); per row the lane
  // order and the warp reduction are as before.
  const int nvb = (vd + 31) >> 5;
  const int h = blockIdx.x / nvb, vb = blockIdx.x % nvb, m = blockIdx.y, H = gridDim.x / nvb;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const float* xh = x + ((size_t)m * H + h) * R;
  const int rb = (R + 127) >> 7;
  const int v0 = vb * 32 + warp * 8;
  float acc[8];
#pragma unroll
  for (int j = 0; j < 8; j++) acc[j] = 0.0f;
  for (int c = lane; c < R; c += 32) {
    const float xc = xh[c];
#pragma unroll
    for (int j = 0; j < 8; j++) {
      const int v = min(v0 + j, vd - 1);
      const size_t row = (size_t)h * vd + v;
      float w;
      if (fp8) {
        w = fp8_to_f32(((const u8*)W)[row * R + c]) * S[row * rb + (c >> 7)];
      } else {
        w = ((const float*)W)[row * R + c];
      }
      acc[j] += w * xc;
    }
  }
#pragma unroll
  for (int j = 0; j < 8; j++) {
    const float a = warp_sum(acc[j]);
    if (lane == 0 && v0 + j < vd) out[(size_t)m * ldo + (size_t)h * vd + v0 + j] = a;
  }
}
