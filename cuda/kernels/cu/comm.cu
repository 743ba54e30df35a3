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
