package kernels

// What programmatic dependent launch saves per launch: a chain of small
// dependent kernels (each reads what the one before wrote, through other
// blocks), replayed as one graph and launched one by one, plain and
// programmatic, and its result checked exactly (a missing wait would lose
// increments). Reported, never asserted (TILERT_GPU_TIMING=1).

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/tilert-go/tilert/cuda"
)

// pdlChainSource is common.cuh (for PDL_WAIT) and one kernel: element i
// gets +1, read and written by a different block than in the kernel before
// (rot shifts the mapping), so each kernel depends on all of the previous
// one. mode 0: no wait; 1: griddepcontrol.wait only (the next kernel
// launches as this one's blocks exit); 2: PDL_WAIT() (wait, then let the
// next kernel launch at once).
func pdlChainSource() string {
	common, err := kernelFS.ReadFile("cu/common.cuh")
	if err != nil {
		panic(err)
	}
	return string(common) + `
extern "C" __global__ void pdl_chain(float* x, int n, int rot, int mode) {
  if (mode == 2) {
    PDL_WAIT();
  } else if (mode == 1) {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
  }
  const int stride = gridDim.x * blockDim.x;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    const int j = (i + rot) % n;
    x[j] = x[j] + 1.0f;
  }
}

// A latency-bound small kernel (one block: RMSNorm-like, in place) and a
// weight-streaming kernel after it (grid-wide, 16-byte loads of W, which
// never changes, combined with the small kernel's output). pf 0: the wait
// first; 1: each thread prefetches its first 8 loads to L2 before the wait;
// 2: the block prefetches its whole share of W (a line per 128 bytes)
// before the wait. What a GEMV could gain by streaming its weights while the
// kernel before it runs.
extern "C" __global__ void __launch_bounds__(1024) pdl_small(float* a, int n) {
  PDL_WAIT();
  __shared__ float sh[32];
  float v = 0.0f;
  for (int i = threadIdx.x; i < n; i += blockDim.x) v += a[i] * a[i];
  v = block_sum(v, sh);
  const float r = rsqrtf(v / n + 1e-6f);
  __syncthreads();
  for (int i = threadIdx.x; i < n; i += blockDim.x) a[i] = a[i] * r * 1.0001f;
}

extern "C" __global__ void __launch_bounds__(256) pdl_stream(const uint4* W, long long nvec, const float* a, u32* out,
                                                              int pf) {
  const long long per = (nvec + gridDim.x - 1) / gridDim.x;
  const long long lo = (long long)blockIdx.x * per, hi = min(nvec, lo + per);
  if (pf == 1) {
    for (int k = 0; k < 8; k++) {
      const long long i = lo + threadIdx.x + (long long)k * blockDim.x;
      if (i < hi) asm volatile("prefetch.global.L2 [%0];" ::"l"(W + i));
    }
  } else if (pf == 2) {
    for (long long i = lo + 8 * threadIdx.x; i < hi; i += 8 * blockDim.x) asm volatile("prefetch.global.L2 [%0];" ::"l"(W + i));
  }
  PDL_WAIT();
  u32 acc = __float_as_uint(a[0]);
  for (long long i = lo + threadIdx.x; i < hi; i += 4 * blockDim.x) {
    uint4 v[4];
#pragma unroll
    for (int u = 0; u < 4; u++) {
      const long long j = i + (long long)u * blockDim.x;
      v[u] = j < hi ? __ldg(W + j) : make_uint4(0u, 0u, 0u, 0u);
    }
#pragma unroll
    for (int u = 0; u < 4; u++) acc ^= v[u].x + v[u].y + v[u].z + v[u].w;
  }
  out[(size_t)blockIdx.x * blockDim.x + threadIdx.x] = acc;
}
`
}

// loadPDLChain compiles and loads pdlChainSource's kernels.
func loadPDLChain(c *cuda.Ctx) *cuda.Module {
	nv, err := cuda.LoadNVRTC()
	chk(err)
	info := c.Info()
	ck, err := cuda.CompileModule(nv, info.CCMajor, info.CCMinor, pdlChainSource(), "pdl_chain.cu", kernelOptions, cuda.DefaultKernelCache())
	chk(err)
	m, err := c.LoadModule("pdl_chain", ck.Image)
	chk(err)
	return m
}

func TestKernelTimingPDLChain(t *testing.T) {
	needTiming(t)
	onGPU(t, func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
		m, info := loadPDLChain(c), c.Info()
		f, err := c.Function(m, "pdl_chain")
		chk(err)
		s := c.Stream()
		const chain = 64
		t.Logf("programmatic launch supported here: %v (%s, driver %d)", c.PDLSupported(), info.Arch(), info.DriverVersion)
		for _, size := range []struct{ blocks, n int }{{info.SMs, info.SMs * 256}, {4 * info.SMs, 4 * info.SMs * 256 * 8}} {
			x, y := a.raw(int64(4*size.n)), a.raw(int64(4*size.n))
			// chain kernels on x, a copy x -> y and a memset between (nodes
			// that are not kernels), chain more on y: y ends at 2*chain,
			// x at chain, whatever ran early.
			run := func(mode int) {
				chk(c.MemsetD32(x, 0, int64(size.n), s))
				for i := range chain {
					chk(c.LaunchEx(f, cuda.D1(size.blocks), cuda.D1(256), 0, s, mode > 0, x, size.n, 37*i+1, mode))
				}
				chk(c.CopyDtoD(y, x, int64(4*size.n), s))
				chk(c.MemsetD32(x.Add(int64(4*(size.n-1))), 0x3f800000, 1, s)) // x[n-1] = 1, then +chain: chain+1
				for i := range chain {
					chk(c.LaunchEx(f, cuda.D1(size.blocks), cuda.D1(256), 0, s, mode > 0, y, size.n, 53*i+7, mode))
					chk(c.LaunchEx(f, cuda.D1(size.blocks), cuda.D1(256), 0, s, mode > 0, x.Add(int64(4*(size.n-1))), 1, 0, mode))
				}
			}
			check := func(what string) {
				chk(c.SyncStream(s))
				xs, ys := downF32(c, x, size.n), downF32(c, y, size.n)
				bad := 0
				for i := range size.n {
					wx := float32(chain)
					if i == size.n-1 {
						wx = chain + 1
					}
					if xs[i] != wx || ys[i] != 2*chain {
						bad++
					}
				}
				if bad > 0 {
					t.Errorf("%s, %d blocks: %d of %d elements wrong (x[0]=%v y[0]=%v, want %d and %d)", what, size.blocks, bad, size.n, xs[0], ys[0], chain, 2*chain)
				}
			}
			var us [3][2]float64
			for mode := range 3 {
				name := []string{"plain launches", "programmatic, wait only", "programmatic, PDL_WAIT (wait + launch_dependents)"}[mode]
				run(mode)
				check(name + ", launched")
				us[mode][0] = medianUs(c, s, 3, 11, func() { run(mode) })
				check(name + ", launched (timed)")
				chk(c.BeginCapture(s))
				run(mode)
				g, err := c.EndCapture(s)
				chk(err)
				chk(c.LaunchGraph(g, s))
				check(name + ", graph")
				us[mode][1] = medianUs(c, s, 5, 11, func() { chk(c.LaunchGraph(g, s)) })
				check(name + ", graph (timed)")
				chk(c.DestroyGraph(g))
				n := float64(3 * chain)
				t.Logf("%-52s %4d blocks x 256, %3d kernels: launched %7.1f us (%.2f us/kernel), graph %7.1f us (%.2f us/kernel)",
					name, size.blocks, 3*chain, us[mode][0], us[mode][0]/n, us[mode][1], us[mode][1]/n)
			}
			addPDLRow(fmt.Sprintf("pdl chain %d blocks: graph us/kernel plain, wait, PDL_WAIT", size.blocks),
				us[0][1]/(3*chain), us[1][1]/(3*chain), us[2][1]/(3*chain))
		}
	})
}

// addPDLRow puts a chain result into the timing report (three figures in
// the comment, the PDL_WAIT one as the row's time).
func addPDLRow(name string, plain, wait, full float64) {
	reportMu.Lock()
	defer reportMu.Unlock()
	timingRows = append(timingRows, timingRow{Name: name, Median: full,
		Comment: fmt.Sprintf("plain %.2f us, wait only %.2f us, PDL_WAIT %.2f us per kernel", plain, wait, full)})
}

// TestKernelTimingPDLPrefetch: pairs of (small kernel, weight stream) in
// one graph, the weights cycled over copies so each is read cold, with the
// stream's weight prefetch before its wait off, its first loads, or its
// whole share; plain launches as the baseline. Says what issuing a GEMV's
// weight loads before PDL_WAIT would save (not done in the GEMVs yet).
func TestKernelTimingPDLPrefetch(t *testing.T) {
	needTiming(t)
	onGPU(t, func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
		m, info := loadPDLChain(c), c.Info()
		small, err := c.Function(m, "pdl_small")
		chk(err)
		stream, err := c.Function(m, "pdl_stream")
		chk(err)
		s := c.Stream()
		const pairs, D = 8, 7168
		x := a.up(randF32(r, D, 1))
		blocks := 2 * info.SMs
		out := a.raw(int64(4 * blocks * 256))
		for _, mb := range []int{4, 12, 38} { // kv_a, idx wq_b, q_b of DeepSeek-V3.2
			bytes := int64(mb) << 20
			ws := make([]cuda.DevPtr, pairs)
			for i := range ws {
				ws[i] = a.raw(bytes)
				fillRandom(c, r, ws[i], bytes, "fp8")
			}
			run := func(pdl bool, pf int) {
				for i := range pairs {
					chk(c.LaunchEx(small, cuda.D1(1), cuda.D1(1024), 0, s, pdl, x, D))
					chk(c.LaunchEx(stream, cuda.D1(blocks), cuda.D1(256), 0, s, pdl, ws[i], bytes/16, x, out, pf))
				}
			}
			var us [4]float64
			for v := range 4 {
				pdl, pf := v > 0, max(v-1, 0)
				chk(c.BeginCapture(s))
				run(pdl, pf)
				g, err := c.EndCapture(s)
				chk(err)
				us[v] = medianUs(c, s, 5, 11, func() { chk(c.LaunchGraph(g, s)) }) / pairs
				chk(c.DestroyGraph(g))
			}
			t.Logf("small kernel + %2d MB stream, per pair as a graph: plain %.2f us, PDL %.2f us, PDL + prefetch of the first loads %.2f us, PDL + prefetch of the whole share %.2f us",
				mb, us[0], us[1], us[2], us[3])
			reportMu.Lock()
			timingRows = append(timingRows, timingRow{Name: fmt.Sprintf("pdl small kernel + %d MB stream (pair, graph)", mb),
				Bytes: float64(bytes), Median: us[3], GBps: float64(bytes) / us[3] / 1e3,
				Comment: fmt.Sprintf("plain %.2f, PDL %.2f, +first-loads prefetch %.2f, +whole-share prefetch %.2f us", us[0], us[1], us[2], us[3])})
			reportMu.Unlock()
		}
	})
}
