// Normalisations, RoPE and element-wise ops. All activations are float32.

// RMSNorm per row (one block per row): y = x * rsqrt(mean(x^2) + eps) * w.
// y may alias x.
extern "C" __global__ void __launch_bounds__(1024) rmsnorm(const float* x, const float* __restrict__ w, float* y,
                                                           int D, int ldx, int ldy, float eps) {
  PDL_WAIT();
  __shared__ float sh[32];
  const float* xr = x + (size_t)blockIdx.x * ldx;
  float* yr = y + (size_t)blockIdx.x * ldy;
  float ss = 0.0f;
  for (int i = threadIdx.x; i < D; i += blockDim.x) {
    float v = xr[i];
    ss += v * v;
  }
  ss = block_sum(ss, sh);
  const float r = rsqrtf(ss / (float)D + eps);
  for (int i = threadIdx.x; i < D; i += blockDim.x) yr[i] = w[i] * (xr[i] * r);
}

// Residual add fused into the RMSNorm after it, one block per row:
// x += b, then y = x * rsqrt(mean(x^2) + eps) * w. Each thread adds, squares
// and scales the same elements in the same order as add_f32 followed by
// rmsnorm (same block size), so x and y are bit-identical to the two launches.
// y must not alias x or b.
extern "C" __global__ void __launch_bounds__(1024) add_rmsnorm(float* x, const float* b, const float* __restrict__ w,
                                                               float* y, int D, int ldx, int ldb, int ldy, float eps) {
  PDL_WAIT();
  __shared__ float sh[32];
  float* xr = x + (size_t)blockIdx.x * ldx;
  const float* br = b + (size_t)blockIdx.x * ldb;
  float* yr = y + (size_t)blockIdx.x * ldy;
  float ss = 0.0f;
  for (int i = threadIdx.x; i < D; i += blockDim.x) {
    const float v = xr[i] + br[i];
    xr[i] = v;
    ss += v * v;
  }
  ss = block_sum(ss, sh);
  const float r = rsqrtf(ss / (float)D + eps);
  for (int i = threadIdx.x; i < D; i += blockDim.x) yr[i] = w[i] * (xr[i] * r);
}

// LayerNorm per row with optional weight and bias (null: 1 and 0).
// Two passes over the row so the variance does not cancel.
extern "C" __global__ void __launch_bounds__(1024) layernorm(const float* x, const float* __restrict__ w,
                                                             const float* __restrict__ b, float* y, int D, int ldx,
                                                             int ldy, float eps) {
  PDL_WAIT();
  __shared__ float sh[32];
  const float* xr = x + (size_t)blockIdx.x * ldx;
  float* yr = y + (size_t)blockIdx.x * ldy;
  float s = 0.0f;
  for (int i = threadIdx.x; i < D; i += blockDim.x) s += xr[i];
  const float mean = block_sum(s, sh) / (float)D;
  float v = 0.0f;
  for (int i = threadIdx.x; i < D; i += blockDim.x) {
    float d = xr[i] - mean;
    v += d * d;
  }
  const float r = rsqrtf(block_sum(v, sh) / (float)D + eps);
  for (int i = threadIdx.x; i < D; i += blockDim.x) {
    float o = (xr[i] - mean) * r;
    if (w) o *= w[i];
    if (b) o += b[i];
    yr[i] = o;
  }
}

// RoPE in place on dims [off, off+rot) of each row of x ([rows][ld]).
// Row r belongs to token r / rows_per_tok at position pos[token]; cos/sin
// tables are [max_pos][rot/2] (built by the host with the model's YaRN).
// interleaved != 0: pairs (2i, 2i+1) (DeepSeek/GLM main attention, GLM
// indexer); otherwise half-split pairs (i, i+rot/2) (DeepSeek-V3.2 indexer).
extern "C" __global__ void rope(float* x, const int* __restrict__ pos, const float* __restrict__ cos_t,
                                const float* __restrict__ sin_t, int rows, int rows_per_tok, int ld, int off,
                                int rot, int interleaved) {
  PDL_WAIT();
  const int half = rot >> 1;
  const long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= (long long)rows * half) return;
  const int r = (int)(idx / half), i = (int)(idx % half);
  const int p = pos[r / rows_per_tok];
  const float c = cos_t[(size_t)p * half + i], s = sin_t[(size_t)p * half + i];
  float* xr = x + (size_t)r * ld + off;
  const int i0 = interleaved ? 2 * i : i;
  const int i1 = interleaved ? 2 * i + 1 : i + half;
  const float a = xr[i0], b = xr[i1];
  xr[i0] = a * c - b * s;
  xr[i1] = b * c + a * s;
}

// y = a + b (y may alias either).
extern "C" __global__ void add_f32(float* y, const float* a, const float* b, long long n) {
  PDL_WAIT();
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
    y[i] = a[i] + b[i];
}

// out[r][i] = silu(gate[r][i]) * up[r][i], i < I; strides per row.
extern "C" __global__ void silu_mul(const float* __restrict__ gate, const float* __restrict__ up, float* out, int rows,
                                    int I, int ldg, int ldu, int ldo) {
  PDL_WAIT();
  const long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= (long long)rows * I) return;
  const int r = (int)(idx / I), i = (int)(idx % I);
  const float g = gate[(size_t)r * ldg + i];
  out[(size_t)r * ldo + i] = g / (1.0f + expf(-g)) * up[(size_t)r * ldu + i];
}

// One row of a bf16 table to float32 by the block, for embed_bf16 /
// embed_bf16_checked. Every 16-byte load of the row is issued before the
// first store: an element loop waits an HBM round trip per element a thread
// owns (its loads stay behind the stores, out not being restrict), 10.6 us
// for a cold 6144-wide row as the first kernel of every decode step (session
// 39's H200 trace; this form measured -6..-11 us a step in session 40). A
// row of D % 8 != 0 or not 16-byte aligned takes the element loop. The same
// values either way.
#define EMBED_VECS 4
__device__ __forceinline__ void embed_row(const u16* __restrict__ row, float* __restrict__ o, int D) {
  if ((D & 7) == 0 && ((reinterpret_cast<size_t>(row) | reinterpret_cast<size_t>(o)) & 15) == 0) {
    const uint4* r4 = reinterpret_cast<const uint4*>(row);
    float4* o4 = reinterpret_cast<float4*>(o);
    const int n8 = D >> 3;
    for (int base = 0; base < n8; base += EMBED_VECS * blockDim.x) {
      uint4 v[EMBED_VECS];
#pragma unroll
      for (int j = 0; j < EMBED_VECS; j++) {
        const int i = base + j * blockDim.x + threadIdx.x;
        v[j] = i < n8 ? __ldg(r4 + i) : make_uint4(0u, 0u, 0u, 0u);
      }
#pragma unroll
      for (int j = 0; j < EMBED_VECS; j++) {
        const int i = base + j * blockDim.x + threadIdx.x;
        if (i < n8) {
          o4[2 * i] = make_float4(bf16_to_f32(v[j].x), bf16_to_f32(v[j].x >> 16), bf16_to_f32(v[j].y), bf16_to_f32(v[j].y >> 16));
          o4[2 * i + 1] = make_float4(bf16_to_f32(v[j].z), bf16_to_f32(v[j].z >> 16), bf16_to_f32(v[j].w), bf16_to_f32(v[j].w >> 16));
        }
      }
    }
    return;
  }
  for (int i = threadIdx.x; i < D; i += blockDim.x) o[i] = bf16_to_f32(row[i]);
}

// out[t][:] = table[ids[t]][:] from a bf16 table [V][D]; one block per token.
extern "C" __global__ void embed_bf16(const u16* __restrict__ table, const int* __restrict__ ids, float* out, int D) {
  PDL_WAIT();
  embed_row(table + (size_t)ids[blockIdx.x] * D, out + (size_t)blockIdx.x * D, D);
}

// embed_bf16 with an id outside [0, V) giving a NaN row instead of a read
// outside the table: a pick over non-finite logits (arg-max 0x7fffffff) is
// fed to the next forward on the device by the pipelined step before the
// host can refuse it.
extern "C" __global__ void embed_bf16_checked(const u16* __restrict__ table, const int* __restrict__ ids, float* out, int D,
                                              int V) {
  PDL_WAIT();
  const int id = ids[blockIdx.x];
  float* o = out + (size_t)blockIdx.x * D;
  if ((unsigned)id >= (unsigned)V) {
    for (int i = threadIdx.x; i < D; i += blockDim.x) o[i] = __int_as_float(0x7fc00000);
    return;
  }
  embed_row(table + (size_t)id * D, o, D);
}

// out[n] = (resid ? resid[n] : 0) + sum_j w[j] * y[j][n]: the weighted sum of
// the routed experts' outputs (k slots of N) plus the residual stream.
extern "C" __global__ void moe_combine(const float* __restrict__ y, const float* __restrict__ w, const float* resid,
                                       float* out, int k, int N) {
  PDL_WAIT();
  const int n = blockIdx.x * blockDim.x + threadIdx.x;
  if (n >= N) return;
  float s = 0.0f;
  for (int j = 0; j < k; j++) s += w[j] * y[(size_t)j * N + n];
  out[n] = (resid ? resid[n] : 0.0f) + s;
}

// rmsnorm and add_rmsnorm with every load of the row issued before the first
// use (NORM_REGS elements per thread, D <= NORM_REGS * blockDim.x): the loop
// kernels above wait one L2 round trip per element a thread owns (their
// loads sit behind the previous element's store, and x, b, y may alias), 7 in
// a row at D = 7168. Same element-to-thread assignment (i = t + j*blockDim),
// same per-thread order of the squares, same block_sum: bit-identical to
// them.
#define NORM_REGS 8

// A load issued where it is written: as a plain or .nc load, w's loads were
// sunk past the block's barrier (an HBM round trip after the reduction); a
// volatile coherent load stays before it.
__device__ __forceinline__ float ld_early(const float* p) {
  float v;
  asm volatile("ld.global.f32 %0, [%1];" : "=f"(v) : "l"(p));
  return v;
}

extern "C" __global__ void __launch_bounds__(1024) rmsnorm_reg(const float* x, const float* __restrict__ w, float* y,
                                                               int D, int ldx, int ldy, float eps) {
  PDL_WAIT();
  __shared__ float sh[32];
  const float* xr = x + (size_t)blockIdx.x * ldx;
  float* yr = y + (size_t)blockIdx.x * ldy;
  const int t = threadIdx.x, nt = blockDim.x;
  float v[NORM_REGS], wv[NORM_REGS];
#pragma unroll
  for (int j = 0; j < NORM_REGS; j++) {
    const int i = t + j * nt;
    v[j] = i < D ? xr[i] : 0.0f;
    wv[j] = i < D ? ld_early(w + i) : 0.0f;
  }
  float ss = 0.0f;
#pragma unroll
  for (int j = 0; j < NORM_REGS; j++)
    if (t + j * nt < D) ss += v[j] * v[j];
  ss = block_sum(ss, sh);
  const float r = rsqrtf(ss / (float)D + eps);
#pragma unroll
  for (int j = 0; j < NORM_REGS; j++) {
    const int i = t + j * nt;
    if (i < D) yr[i] = wv[j] * (v[j] * r);
  }
}

// add_rmsnorm_row: row blockIdx.x of x += b, then y = rmsnorm(x) * w, every
// load issued before the first store (add_rmsnorm_reg's body; a separate
// inlined body since add_rmsnorm_pf shared it, kept so the kernel's PTX stays
// the code measured on the H200).
__device__ __forceinline__ void add_rmsnorm_row(float* x, const float* b, const float* __restrict__ w, float* y,
                                                int D, int ldx, int ldb, int ldy, float eps) {
  __shared__ float sh[32];
  float* xr = x + (size_t)blockIdx.x * ldx;
  const float* br = b + (size_t)blockIdx.x * ldb;
  float* yr = y + (size_t)blockIdx.x * ldy;
  const int t = threadIdx.x, nt = blockDim.x;
  float v[NORM_REGS], bv[NORM_REGS], wv[NORM_REGS];
#pragma unroll
  for (int j = 0; j < NORM_REGS; j++) {
    const int i = t + j * nt;
    v[j] = i < D ? xr[i] : 0.0f;
    bv[j] = i < D ? br[i] : 0.0f;
    wv[j] = i < D ? ld_early(w + i) : 0.0f;
  }
  float ss = 0.0f;
#pragma unroll
  for (int j = 0; j < NORM_REGS; j++) {
    const int i = t + j * nt;
    if (i < D) {
      v[j] = v[j] + bv[j];
      xr[i] = v[j];
      ss += v[j] * v[j];
    }
  }
  ss = block_sum(ss, sh);
  const float r = rsqrtf(ss / (float)D + eps);
#pragma unroll
  for (int j = 0; j < NORM_REGS; j++) {
    const int i = t + j * nt;
    if (i < D) yr[i] = wv[j] * (v[j] * r);
  }
}

extern "C" __global__ void __launch_bounds__(1024) add_rmsnorm_reg(float* x, const float* b,
                                                                   const float* __restrict__ w, float* y, int D,
                                                                   int ldx, int ldb, int ldy, float eps) {
  PDL_WAIT();
  add_rmsnorm_row(x, b, w, y, D, ldx, ldb, ldy, eps);
}

// moe_combine_norm_cl: moe_combine_slots (mo = resid + the weighted sum
// of each row's k <= MCN_KMAX slots) then add_rmsnorm_reg (x += mo in place,
// y = rmsnorm(x) * w) in one launch, for the decode rows that end a MoE
// layer: two dependent launches (~1.7 + 3.8 us a layer on the H200 decode
// graph's critical path), the second one block (one SM) a row.
//
// Row m (blockIdx.y) is a cluster of MCN_CL blocks. add_rmsnorm_reg runs
// nt = normThreads(D) threads on the row (thread t owns elements
// t + j * nt); block c here plays its warps [c * wpb, (c + 1) * wpb) with
// wpb = blockDim.x / 32 (threads t >= nt own nothing): each thread owns the
// same elements, computes each element's combine with moe_combine_slots'
// operations in its order (fma over the slots from 0, then + resid), adds
// and squares in add_rmsnorm_row's order, and reduces its warp with the
// same warp_sum. The warp partials meet in distributed shared memory; every
// block sums all nt / 32 of them serially from 0, as block_sum does, so r,
// x, y and mo carry add_rmsnorm_reg's and moe_combine_slots' bits. The
// two kernels' PTX has fma.rn for the products summed and add.f32 /
// mul.f32 elsewhere with no product feeding a sum; the intrinsics here give
// the same operations (fma.rn, add.rn, mul.rn) with nothing left for the
// compiler to contract differently. sm_90 (clusters); kernels.MoECombineNorm launches it. Session
// 15 removed a one-block-a-row form (the 9 slot rows through one SM, the
// slot loop not unrolled: slower than the two launches); here the reads
// are spread over 8 SMs and every load is in flight at once.
#define MCN_CL 8
#define MCN_KMAX 8

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
// barrier.cluster's default semantics: arrive = release, wait = acquire.
__device__ __forceinline__ void mcn_arrive() { asm volatile("barrier.cluster.arrive.aligned;" ::: "memory"); }
__device__ __forceinline__ void mcn_wait() { asm volatile("barrier.cluster.wait.aligned;" ::: "memory"); }

// The float at p (this block's shared memory) in block rank's copy.
__device__ __forceinline__ float mcn_ld(const float* p, u32 rank) {
  const u32 a = (u32)__cvta_generic_to_shared(p);
  u32 r;
  float v;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(rank));
  asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(r) : "memory");
  return v;
}

extern "C" __global__ void __cluster_dims__(MCN_CL, 1, 1) __launch_bounds__(128)
    moe_combine_norm_cl(const float* __restrict__ ey, const float* __restrict__ ew, const float* resid,
                            float* mo, float* x, const float* __restrict__ w, float* y, int k, int D, int nt,
                            float eps) {
  PDL_WAIT();
  __shared__ float part[4];  // this block's warp partials (read by the cluster)
  __shared__ float all[32];  // the row's warp partials, in warp order
  const int lane = threadIdx.x & 31, wl = threadIdx.x >> 5, wpb = blockDim.x >> 5;
  const int t = blockIdx.x * blockDim.x + threadIdx.x;  // add_rmsnorm_reg's thread
  const int m = blockIdx.y, nw = nt >> 5;
  const size_t ro = (size_t)m * D;
  const float* ym = ey + (size_t)m * k * D;
  const float* wm = ew + (size_t)m * k;
  float* xr = x + ro;
  float* mr = mo + ro;
  float* yr = y + ro;
  const bool own = t < nt;
  float wk[MCN_KMAX];
#pragma unroll
  for (int jj = 0; jj < MCN_KMAX; jj++) wk[jj] = jj < k ? wm[jj] : 0.0f;
  // Every load of the thread's elements issued before the first use.
  float v[NORM_REGS], rv[NORM_REGS], wv[NORM_REGS], yv[NORM_REGS][MCN_KMAX];
#pragma unroll
  for (int j = 0; j < NORM_REGS; j++) {
    const int i = t + j * nt;
    const bool in = own && i < D;
    v[j] = in ? xr[i] : 0.0f;
    rv[j] = in && resid ? resid[ro + i] : 0.0f;
    wv[j] = in ? ld_early(w + i) : 0.0f;
#pragma unroll
    for (int jj = 0; jj < MCN_KMAX; jj++) yv[j][jj] = in && jj < k ? ym[(size_t)jj * D + i] : 0.0f;
  }
  float ss = 0.0f;
#pragma unroll
  for (int j = 0; j < NORM_REGS; j++) {
    const int i = t + j * nt;
    if (own && i < D) {
      float s = 0.0f;
#pragma unroll
      for (int jj = 0; jj < MCN_KMAX; jj++)
        if (jj < k) s = __fmaf_rn(wk[jj], yv[j][jj], s);
      const float c = __fadd_rn(s, rv[j]);  // moe_combine_slots' out
      mr[i] = c;
      v[j] = __fadd_rn(v[j], c);
      xr[i] = v[j];
      ss = __fmaf_rn(v[j], v[j], ss);
    }
  }
  ss = warp_sum(ss);
  if (lane == 0) part[wl] = ss;
  mcn_arrive();
  mcn_wait();
  if (threadIdx.x < nw) all[threadIdx.x] = mcn_ld(&part[threadIdx.x % wpb], (u32)(threadIdx.x / wpb));
  mcn_arrive();  // done reading the cluster's shared memory; waited for before exit
  __syncthreads();
  float r = 0.0f;
  for (int g = 0; g < nw; g++) r += all[g];
  r = rsqrtf(r / (float)D + eps);
#pragma unroll
  for (int j = 0; j < NORM_REGS; j++) {
    const int i = t + j * nt;
    if (own && i < D) yr[i] = __fmul_rn(wv[j], __fmul_rn(v[j], r));
  }
  mcn_wait();
}
#endif
