// The top-k selection's pieces shared by the default module's
// topk_radix.cu (topk_radix_one_w) and the few module's cu/few/topk_fast.cu
// (topk_fast); each module's source
// puts this after common.cuh (kernels.go, kernels_few.go). One text for the
// row length, the keys a thread holds, the digit counts over them and the
// ordered emit, so topk_fast's selection stays topk_radix_one_w's element
// for element without a transcription to keep in step.

#define TKR_BINS 4096
#define TKR_SHIFT 20

__device__ __forceinline__ int tkr_n(const int* lens, int row, int T) {
  int n = T;
  if (lens && lens[row] < n) n = lens[row];
  return n;
}

// A thread's KPT keys k[j] = float_key(x[j]) (j < nv; 0 past nv), read
// through L2 (__ldcg: the fused tail reads what other blocks of its grid
// wrote), 16 bytes at a time where the run is whole and aligned.
template <int KPT>
__device__ __forceinline__ void tk_load_keys(const float* x, int nv, u32* k) {
  if (nv == KPT && ((size_t)x & 15) == 0) {
#pragma unroll
    for (int j = 0; j < KPT; j += 4) {
      const float4 v = __ldcg((const float4*)(x + j));
      k[j] = float_key(v.x);
      k[j + 1] = float_key(v.y);
      k[j + 2] = float_key(v.z);
      k[j + 3] = float_key(v.w);
    }
  } else {
#pragma unroll
    for (int j = 0; j < KPT; j++) k[j] = j < nv ? float_key(__ldcg(x + j)) : 0u;
  }
}

// The next 10-bit digit's counts: every held key whose bits above shift + 10
// equal prefix adds one to h[its bits shift .. shift + 9] (shared memory).
template <int KPT>
__device__ __forceinline__ void tk_digit_count(const u32* k, int nv, u32 prefix, int shift, u32* h) {
#pragma unroll
  for (int j = 0; j < KPT; j++)
    if (j < nv && (k[j] >> (shift + 10)) == prefix) atomicAdd(&h[(k[j] >> shift) & 1023u], 1u);
}

// The ordered emit's scan input: the held keys above thr (< K of them) in
// the high half, those equal to it (<= n <= 65535) in the low half.
template <int KPT>
__device__ __forceinline__ int tk_counts(const u32* k, int nv, u32 thr) {
  int nsel = 0, neq = 0;
#pragma unroll
  for (int j = 0; j < KPT; j++) {
    if (j < nv) {
      nsel += k[j] > thr;
      neq += k[j] == thr;
    }
  }
  return (nsel << 16) | neq;
}

// The ordered emit: before is the block's exclusive scan of tk_counts; the
// keys above thr and the first rem keys equal to it, in index order (i0: the
// index of k[0]), into o[0..K).
template <int KPT>
__device__ __forceinline__ void tk_emit(const u32* k, int nv, u32 thr, int before, int rem, int K, int* o, int i0) {
  int eq_before = before & 0xffff;
  int pos = (before >> 16) + min(eq_before, rem);
#pragma unroll
  for (int j = 0; j < KPT; j++) {
    if (j < nv) {
      bool take = k[j] > thr;
      if (k[j] == thr) {
        take = eq_before < rem;
        eq_before++;
      }
      if (take) {
        if (pos < K) o[pos] = i0 + j;
        pos++;
      }
    }
  }
}
