// l2_warm reads part of a weight matrix so that its lines sit in the L2 when
// the GEMV that streams it starts (engine/gpu warm.go: o_proj's weights, read
// on a side stream while the latency-bound MLA chain leaves the HBM idle).
// The part is the first `prefix` bytes of every `period` bytes of [p, p+n):
// spread evenly, so every block of the later GEMV finds the same share of
// its rounds in the L2 whatever its row / split mapping. Each thread keeps U
// 16-byte loads in flight, so the grid (blocks x 256 threads) sets the rate
// at which it asks the HBM, not a flood that queues ahead of the chain's own
// round trips. Reads only; writes the XOR of every 32-bit word it read into
// *sum when sum is set (the check that it reads exactly the part asked).
#define L2W_THREADS 256
#define L2W_U 4

__device__ __forceinline__ uint4 l2w_load(const u8* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

extern "C" __global__ void __launch_bounds__(L2W_THREADS)
    l2_warm(const u8* __restrict__ p, long long n, long long period, long long prefix, u32* sum) {
  const long long per = prefix >> 4;  // 16-byte words a period
  const long long windows = (n + period - 1) / period;
  const long long total = windows * per;
  const long long stride = (long long)gridDim.x * L2W_THREADS;
  u32 acc = 0;
  for (long long i0 = (long long)blockIdx.x * L2W_THREADS + threadIdx.x; i0 < total; i0 += stride * L2W_U) {
    uint4 v[L2W_U];
#pragma unroll
    for (int u = 0; u < L2W_U; u++) {
      long long i = i0 + (long long)u * stride;
      long long off = (i / per) * period + (i % per) * 16;
      v[u] = make_uint4(0, 0, 0, 0);
      if (i < total && off + 16 <= n) v[u] = l2w_load(p + off);
    }
#pragma unroll
    for (int u = 0; u < L2W_U; u++) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  if (sum == 0) return;
  for (int o = 16; o > 0; o >>= 1) acc ^= __shfl_xor_sync(0xffffffffu, acc, o);
  __shared__ u32 part[L2W_THREADS / 32];
  if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = acc;
  __syncthreads();
  if (threadIdx.x == 0) {
    u32 b = 0;
    for (int w = 0; w < L2W_THREADS / 32; w++) b ^= part[w];
    atomicXor(sum, b);
  }
}
