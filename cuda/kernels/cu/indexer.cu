// Lightning indexer (DSA): score[q][t] = sum_h w[q][h] * ReLU(qk_scale * q[q][h] . k[t])
// over vLLM's fp8 indexer cache: per 64-token page, 64x128 fp8 e4m3 keys then
// 64 float32 scales (8448 bytes); k[t] = fp8 * scale[t].
// Keys t >= lens[q] score -inf (causality / padding) up to T columns.
// block_table maps the 64-token block b of the sequence to its page (null:
// page b). One block per (64-token tile, query row).

#define IDX_D 128
#define IDX_PAGE 64
#define IDX_PAGE_BYTES (IDX_PAGE * IDX_D + IDX_PAGE * 4)
#define IDX_HCHUNK 16

extern "C" __global__ void __launch_bounds__(256) indexer_scores(const float* __restrict__ q,
                                                                 const float* __restrict__ w,
                                                                 const u8* __restrict__ cache,
                                                                 const int* __restrict__ block_table,
                                                                 const int* __restrict__ lens, float* out, int H,
                                                                 int T, int ld_out, float qk_scale) {
  PDL_WAIT();
  __shared__ float kf[IDX_PAGE][IDX_D + 1];
  __shared__ float qs[IDX_HCHUNK][IDX_D];
  __shared__ float ws[IDX_HCHUNK];
  __shared__ float part[4][IDX_PAGE];
  const int tile = blockIdx.x, qi = blockIdx.y, tid = threadIdx.x;
  const int len = lens[qi];
  const int t0 = tile * IDX_PAGE;
  float* orow = out + (size_t)qi * ld_out;
  if (t0 >= len) {  // whole tile beyond the sequence: no cache reads
    for (int j = tid; j < IDX_PAGE; j += blockDim.x)
      if (t0 + j < T) orow[t0 + j] = NEG_INF;
    return;
  }
  const int page = block_table ? block_table[tile] : tile;
  const u8* pg = cache + (size_t)page * IDX_PAGE_BYTES;
  const float* scl = (const float*)(pg + IDX_PAGE * IDX_D);
  // Dequantise the page's keys into shared memory, 4 bytes per load.
  for (int wi = tid; wi < IDX_PAGE * IDX_D / 4; wi += blockDim.x) {
    const int tok = wi >> 5, d0 = (wi & 31) * 4;
    const u32 v = ((const u32*)pg)[wi];
    const float s = scl[tok];
    float f[4];
    fp8x4_to_f32(v, f);
#pragma unroll
    for (int b = 0; b < 4; b++) kf[tok][d0 + b] = f[b] * s;
  }
  const int tok = tid & 63, hg = tid >> 6;  // 4 head groups x 64 tokens
  float acc = 0.0f;
  const float* qrow = q + (size_t)qi * H * IDX_D;
  for (int h0 = 0; h0 < H; h0 += IDX_HCHUNK) {
    __syncthreads();
    for (int i = tid; i < IDX_HCHUNK * IDX_D; i += blockDim.x) {
      const int hh = h0 + i / IDX_D;
      qs[i / IDX_D][i % IDX_D] = hh < H ? qrow[(size_t)hh * IDX_D + (i % IDX_D)] : 0.0f;
    }
    if (tid < IDX_HCHUNK) ws[tid] = (h0 + tid < H) ? w[(size_t)qi * H + h0 + tid] : 0.0f;
    __syncthreads();
#pragma unroll
    for (int j = 0; j < IDX_HCHUNK / 4; j++) {
      const int hl = hg * (IDX_HCHUNK / 4) + j;
      float d = 0.0f;
#pragma unroll 8
      for (int k = 0; k < IDX_D; k++) d += qs[hl][k] * kf[tok][k];
      acc += ws[hl] * fmaxf(d * qk_scale, 0.0f);
    }
  }
  part[hg][tok] = acc;
  __syncthreads();
  if (tid < IDX_PAGE) {
    const int t = t0 + tid;
    if (t < T) orow[t] = (t < len) ? (part[0][tid] + part[1][tid]) + (part[2][tid] + part[3][tid]) : NEG_INF;
  }
}

// Top-k per row by radix select on order-preserving float keys: the K
// largest of row[0..n), n = min(lens[row], T) (lens may be null: n = T),
// written in ascending index order; ties at the threshold go to the lower
// indices. n <= K: indices 0..n-1, then -1 padding. One block (1024 threads)
// per row.
extern "C" __global__ void __launch_bounds__(1024) topk_rows(const float* __restrict__ scores, int ld,
                                                             const int* __restrict__ lens, int T, int K, int* out,
                                                             int ld_out) {
  PDL_WAIT();
  __shared__ u32 hist[256];
  __shared__ int shs[32];
  __shared__ u32 sel[2];
  const int row = blockIdx.x, tid = threadIdx.x;
  const float* x = scores + (size_t)row * ld;
  int* o = out + (size_t)row * ld_out;
  int n = T;
  if (lens && lens[row] < n) n = lens[row];
  if (n <= K) {
    for (int j = tid; j < K; j += blockDim.x) o[j] = j < n ? j : -1;
    return;
  }
  u32 prefix = 0, mask = 0;
  int remaining = K;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int i = tid; i < 256; i += blockDim.x) hist[i] = 0;
    __syncthreads();
    for (int i = tid; i < n; i += blockDim.x) {
      const u32 k = float_key(x[i]);
      if ((k & mask) == prefix) atomicAdd(&hist[(k >> shift) & 255u], 1u);
    }
    __syncthreads();
    if (tid == 0) {
      u32 cum = 0;
      int d = 255;
      for (; d > 0; d--) {
        if (cum + hist[d] >= (u32)remaining) break;
        cum += hist[d];
      }
      sel[0] = (u32)d;
      sel[1] = (u32)remaining - cum;
    }
    __syncthreads();
    prefix |= sel[0] << shift;
    mask |= 255u << shift;
    remaining = (int)sel[1];
    __syncthreads();
  }
  // prefix is the K-th largest key; take every key above it and the first
  // `remaining` equal ones, scanning tiles in index order.
  int base = 0, eq_taken = 0;
  for (int start = 0; start < n; start += blockDim.x) {
    const int i = start + tid;
    const u32 k = i < n ? float_key(x[i]) : 0u;
    const int gt = (i < n && k > prefix) ? 1 : 0;
    const int eq = (i < n && k == prefix) ? 1 : 0;
    int tot;
    const int pre = block_excl_scan(gt | (eq << 16), shs, &tot);
    const int pre_gt = pre & 0xffff, pre_eq = pre >> 16;
    const int tot_gt = tot & 0xffff, tot_eq = tot >> 16;
    const int quota = remaining - eq_taken;
    const int eq_before = min(pre_eq, quota);
    if (gt || (eq && pre_eq < quota)) o[base + pre_gt + eq_before] = i;
    const int eq_tile = min(tot_eq, quota);
    base += tot_gt + eq_tile;
    eq_taken += eq_tile;
  }
}
