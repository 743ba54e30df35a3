// l2_prefetch: asks the L2 for every 128-byte line of up to 12 byte ranges
// (prefetch.global.L2, normal priority) and returns. Nothing is written and
// nothing waits for the lines: weights never change during a step, so a
// prefetch that is dropped or arrives late costs only speed. The engine
// (engine/gpu l2next.go) runs it beside a MoE layer's routed experts for the
// next layer's input projections: the streams around it load evict-first
// (TILERT_L2_EVICT_FIRST), so the lines it brings stay in the L2 until the
// next layer's first launch reads them, while the HBM is busy anyway.
__device__ __forceinline__ void l2_prefetch_lines(const char* p, long long n) {
  if (!p || n <= 0) return;
  const long long lines = (n + 127) >> 7;
  const long long step = (long long)gridDim.x * blockDim.x;
  for (long long l = (long long)blockIdx.x * blockDim.x + threadIdx.x; l < lines; l += step)
    asm volatile("prefetch.global.L2 [%0];" ::"l"(p + (l << 7)));
}

extern "C" __global__ void __launch_bounds__(256)
    l2_prefetch(
                const char* p0, long long n0, const char* p1, long long n1, const char* p2, long long n2,
                const char* p3, long long n3, const char* p4, long long n4, const char* p5, long long n5,
                const char* p6, long long n6, const char* p7, long long n7, const char* p8, long long n8,
                const char* p9, long long n9, const char* p10, long long n10, const char* p11, long long n11) {
  l2_prefetch_lines(p0, n0);
  l2_prefetch_lines(p1, n1);
  l2_prefetch_lines(p2, n2);
  l2_prefetch_lines(p3, n3);
  l2_prefetch_lines(p4, n4);
  l2_prefetch_lines(p5, n5);
  l2_prefetch_lines(p6, n6);
  l2_prefetch_lines(p7, n7);
  l2_prefetch_lines(p8, n8);
  l2_prefetch_lines(p9, n9);
  l2_prefetch_lines(p10, n10);
  l2_prefetch_lines(p11, n11);
}
