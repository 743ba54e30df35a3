// One-shot all-reduce: nranks float32 buffers that this device can address
// (ranks on one device, or peer-mapped buffers of other GPUs) each end with
// the element-wise sum, added in rank order so every rank holds the same
// bits. One pass: each element is read once from every rank and written
// once to every rank, with no intermediate round trips.
extern "C" __global__ void allreduce_oneshot_f32(float* const* bufs, int nranks, long long n) {
    long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        float s = bufs[0][i];
        for (int r = 1; r < nranks; r++) s += bufs[r][i];
        for (int r = 0; r < nranks; r++) bufs[r][i] = s;
    }
}

// Barrier between ranks on different GPUs, through flags in peer-mapped
// memory, one slot per block index. flags is this rank's own array
// [slots][nranks]; peer_flags[j] is rank j's array as this device maps it
// (peer_flags[rank] == flags). Block b of every rank takes the next epoch of
// its slot (one more than the last it signalled), writes it into slot b,
// column rank, of every rank's array, and waits until its own array's slot b
// holds that epoch (or a later one) from every rank. Every rank makes the
// same sequence of calls with the same grid, so epochs stay in step; the
// caller guarantees that no rank rewrites a buffer its peers read before
// they passed the next barrier (the engine alternates two buffers).
// A peer that never arrives (a failed rank) traps after ~10 s instead of
// hanging the device: the launch fails with an error.
#define COMM_MAX_SLOTS 1024

__device__ __forceinline__ u32 ld_acquire_sys(const u32* p) {
    u32 v;
    asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ void st_release_sys(u32* p, u32 v) {
    asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ u64 global_ns() {
    u64 t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

__device__ void peer_barrier(u32* flags, u32* const* peer_flags, int rank, int nranks) {
    __shared__ u32 epoch;
    const int slot = blockIdx.y * gridDim.x + blockIdx.x;
    if (threadIdx.x == 0) epoch = ld_acquire_sys(flags + slot * nranks + rank) + 1u;
    __syncthreads();
    const u32 e = epoch;
    if (threadIdx.x < nranks) {
        // Everything this rank wrote before (earlier launches on its stream)
        // is visible to a peer that sees the flag.
        __threadfence_system();
        st_release_sys(peer_flags[threadIdx.x] + slot * nranks + rank, e);
        const u32* f = flags + slot * nranks + threadIdx.x;
        const u64 t0 = global_ns();
        while ((int)(ld_acquire_sys(f) - e) < 0) {
            if (global_ns() - t0 > 10000000000ull) __trap();
        }
    }
    __syncthreads();
}

// The all-reduce fused with the residual add and RMSNorm after it. A row of
// D is split over gridDim.x blocks of AR_COLS columns (a hidden vector at
// batch 1 would be one SM's work otherwise); block (g, row) sums its columns
// of the nranks partial buffers in rank order, s = parts[0] + parts[1] + ...,
// writes x_o = x_0 + s into every output's residual and its share of
// sum(x^2) into scratch; the last block of the row to finish (a counter in
// scratch, reset by it for the next launch) adds the shares in block order
// and writes h_o = rmsnorm(x)*w_o for the whole row. Deterministic: every
// rank computes the same bits from the same inputs. outs is nout triples
// (x, h, w) of device pointers; every rank's residual x is the same bits
// (only ever changed by this sum), so x_0 is read and every x_o written.
// scratch: kernels.ArScratchBytes(rows, D): AR_MAX_ROWS counters (zeroed
// once; each launch leaves them zero), then the rows' shares. Ranks on one device: one
// launch, flags null. Ranks on several GPUs: each rank launches it with its
// own (x, h, w) and scratch, parts the peer-mapped partial buffers, and the
// barrier first (flags non-null). Partial reads skip L1 (ld.cg): over NVLink
// they must see the peer's latest bytes.
#define AR_COLS 1024
#define AR_MAX_ROWS 1024

extern "C" __global__ void __launch_bounds__(AR_COLS)
    allreduce_add_rmsnorm(const float* const* parts, int nranks, float* const* outs, int nout, int D, float eps,
                          float* scratch, u32* flags, u32* const* peer_flags, int rank) {
    __shared__ float sh[32];
    __shared__ int last;
    if (flags) peer_barrier(flags, peer_flags, rank, nranks);
    const int row = blockIdx.y, G = gridDim.x;
    const size_t off = (size_t)row * D;
    u32* count = (u32*)scratch + row;
    float* share = scratch + AR_MAX_ROWS + (size_t)row * G;
    const float* x0 = outs[0] + off;
    const int i = blockIdx.x * AR_COLS + threadIdx.x;
    float ss = 0.0f;
    if (i < D) {
        // All of a column's partials in flight at once, then added in rank order.
        float s = 0.0f;
        for (int r0 = 0; r0 < nranks; r0 += 8) {
            float p[8];
#pragma unroll
            for (int r = 0; r < 8; r++)
                if (r0 + r < nranks) p[r] = __ldcg(parts[r0 + r] + off + i);
#pragma unroll
            for (int r = 0; r < 8; r++)
                if (r0 + r < nranks) s = (r0 + r == 0) ? p[0] : s + p[r];
        }
        const float v = x0[i] + s;
        for (int o = 0; o < nout; o++) outs[3 * o][off + i] = v;
        ss = v * v;
    }
    __threadfence();  // this thread's x before the row's last block reads it
    ss = block_sum(ss, sh);
    if (threadIdx.x == 0) {
        share[blockIdx.x] = ss;
        __threadfence();
        last = atomicAdd(count, 1u) == (u32)(G - 1);
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    float tot = 0.0f;
    for (int g = 0; g < G; g++) tot += __ldcg(share + g);
    const float rs = rsqrtf(tot / (float)D + eps);
    if (threadIdx.x == 0) *count = 0u;  // every block of this row has counted
    for (int o = 0; o < nout; o++) {
        float* h = outs[3 * o + 1] + off;
        const float* w = outs[3 * o + 2];
#pragma unroll 8
        for (int j = threadIdx.x; j < D; j += AR_COLS) h[j] = w[j] * (__ldcg(x0 + j) * rs);
    }
}

// out = parts[0] + parts[1] + ... (rank order), n floats, parts unchanged:
// the out-of-place all-reduce of ranks on several GPUs (each rank sums the
// peers' buffers into its own out after the barrier; in place, a rank would
// overwrite a buffer its peers are still reading).
extern "C" __global__ void allreduce_to_f32(const float* const* parts, int nranks, float* out, long long n, u32* flags,
                                            u32* const* peer_flags, int rank) {
    if (flags) peer_barrier(flags, peer_flags, rank, nranks);
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        float s = __ldcv(parts[0] + i);
        for (int r = 1; r < nranks; r++) s += __ldcv(parts[r] + i);
        out[i] = s;
    }
}

// dst = src (n 32-bit words) after the barrier: the broadcast of the
// indexer's selection from the root's peer-mapped buffer.
extern "C" __global__ void broadcast_from_u32(const u32* src, u32* dst, long long n, int nranks, u32* flags,
                                              u32* const* peer_flags, int rank) {
    if (flags) peer_barrier(flags, peer_flags, rank, nranks);
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        dst[i] = __ldcv((const unsigned*)src + i);
}

// The barrier alone, one slot per block: a rank that takes part in a
// collective whose data it does not read (the root alone sums the logits)
// signals its peers with it, and waits for them.
extern "C" __global__ void peer_wait(int nranks, u32* flags, u32* const* peer_flags, int rank) {
    peer_barrier(flags, peer_flags, rank, nranks);
}
