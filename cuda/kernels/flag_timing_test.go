package kernels

// What a persistent step would pay per dependent stage against a kernel
// boundary (issue 10: the attention front is a chain of ~10 small dependent
// launches, and the persistent step, TileRT's approach, replaces their
// boundaries by flags). The same chain of stages, each depending on another
// block's output of the stage before, runs as programmatic launches in a
// graph and as one launch whose blocks wait on flags: a grid-wide counter
// (every block waits for all of the stage before, as a GEMV's consumer
// does) or one flag per block (each waits only for the block it reads
// from, per-tile dataflow). Each result is checked exactly (a missed wait
// loses increments); the times are reported, never asserted
// (TILERT_GPU_TIMING=1).

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/tilert-go/tilert/cuda"
)

// flagChainSource is common.cuh (PDL_WAIT) and two kernels. Stage s: block
// b adds 1 to every element of tile (b + s) % B, a tile block (b + 1) % B
// wrote in stage s - 1, so every stage depends on the one before through
// another block.
func flagChainSource() string {
	common, err := kernelFS.ReadFile("cu/common.cuh")
	if err != nil {
		panic(err)
	}
	return string(common) + `
// One stage a launch (programmatic: the next stage's blocks wait in PDL_WAIT).
extern "C" __global__ void __launch_bounds__(256) flag_step(float* x, int tile, int s) {
  PDL_WAIT();
  const int B = gridDim.x, b = blockIdx.x;
  float* t = x + (size_t)((b + s) % B) * tile;
  for (int i = threadIdx.x; i < tile; i += blockDim.x) t[i] = __ldcg(t + i) + 1.0f;
}

// Every stage in one launch; the grid must be resident at once (B <= the
// SMs, nothing else running). flags: zero at launch; mode 0 uses flags[s],
// a count of the blocks done with stage s (a grid-wide wait); mode 1 uses
// flags[s * B + b], set when block b is done with stage s (the consumer
// waits for its one producer). Thread 0 waits with acquire loads and
// publishes after a fence; the block's barrier orders its other threads.
extern "C" __global__ void __launch_bounds__(256) flag_chain(float* x, int tile, int stages, unsigned* flags, int mode) {
  const int B = gridDim.x, b = blockIdx.x;
  for (int s = 0; s < stages; s++) {
    if (s > 0 && threadIdx.x == 0) {
      const unsigned* f = mode == 0 ? flags + (s - 1) : flags + (size_t)(s - 1) * B + (b + 1) % B;
      const unsigned want = mode == 0 ? (unsigned)B : 1u;
      unsigned v;
      do {
        asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(f) : "memory");
      } while (v < want);
    }
    __syncthreads();
    float* t = x + (size_t)((b + s) % B) * tile;
    for (int i = threadIdx.x; i < tile; i += blockDim.x) t[i] = __ldcg(t + i) + 1.0f;
    __syncthreads();
    if (threadIdx.x == 0) {
      __threadfence();
      if (mode == 0) {
        atomicAdd(flags + s, 1u);
      } else {
        asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(flags + (size_t)s * B + b), "r"(1u) : "memory");
      }
    }
  }
}
`
}

// TestKernelTimingFlagChain: per stage, a programmatic kernel boundary
// against a grid-wide flag wait and a per-block flag wait inside one
// launch, graph-timed at 1 and 64 stages (the slope is the cost a stage).
func TestKernelTimingFlagChain(t *testing.T) {
	needTiming(t)
	onGPU(t, func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
		nv, err := cuda.LoadNVRTC()
		chk(err)
		info := c.Info()
		ck, err := cuda.CompileModule(nv, info.CCMajor, info.CCMinor, flagChainSource(), "flag_chain.cu", kernelOptions, cuda.DefaultKernelCache())
		chk(err)
		m, err := c.LoadModule("flag_chain", ck.Image)
		chk(err)
		step, err := c.Function(m, "flag_step")
		chk(err)
		chain, err := c.Function(m, "flag_chain")
		chk(err)
		s := c.Stream()
		const tile, long = 1024, 64
		for _, B := range []int{info.SMs, max(1, info.SMs/4), 8} {
			n := B * tile
			x := a.raw(int64(4 * n))
			flags := a.raw(int64(4 * long * B))
			// way 0: programmatic launches; 1: grid-wide counter; 2: per-block flags.
			run := func(way, stages int) {
				if way == 0 {
					for st := range stages {
						chk(c.LaunchEx(step, cuda.D1(B), cuda.D1(256), 0, s, true, x, tile, st))
					}
					return
				}
				chk(c.MemsetD32(flags, 0, int64(long*B), s))
				chk(c.LaunchEx(chain, cuda.D1(B), cuda.D1(256), 0, s, false, x, tile, stages, flags, way-1))
			}
			names := []string{"programmatic launches", "one launch, grid-wide counter", "one launch, per-block flags"}
			var per [3]float64
			for way := range 3 {
				// Exact check first: every element gets +stages.
				chk(c.MemsetD32(x, 0, int64(n), s))
				run(way, long)
				chk(c.SyncStream(s))
				if xs := downF32(c, x, n); !allEqual(xs, long) {
					t.Fatalf("%s, %d blocks: elements not all %d (x[0]=%v x[n-1]=%v): a wait let a stage read early", names[way], B, long, xs[0], xs[n-1])
				}
				var us [2]float64
				for i, stages := range []int{1, long} {
					chk(c.BeginCapture(s))
					run(way, stages)
					g, err := c.EndCapture(s)
					chk(err)
					us[i] = medianUs(c, s, 5, 11, func() { chk(c.LaunchGraph(g, s)) })
					chk(c.DestroyGraph(g))
				}
				per[way] = (us[1] - us[0]) / (long - 1)
				t.Logf("%-32s %4d blocks x 256, tile %d floats: graph 1 stage %6.2f us, %d stages %7.2f us: %.2f us a stage",
					names[way], B, tile, us[0], long, us[1], per[way])
			}
			reportMu.Lock()
			timingRows = append(timingRows, timingRow{Name: fmt.Sprintf("flag chain %d blocks: us a stage", B), Median: per[2],
				Comment: fmt.Sprintf("programmatic launch %.2f, grid-wide counter %.2f, per-block flags %.2f", per[0], per[1], per[2])})
			reportMu.Unlock()
		}
	})
}

// allEqual reports whether every value of xs is v.
func allEqual(xs []float32, v float32) bool {
	for _, x := range xs {
		if x != v {
			return false
		}
	}
	return true
}

// TestNVRTCCompilesTimingSources: the timing tests' own sources compile
// (sm_90), so that a syntax error shows in CI rather than on the device.
func TestNVRTCCompilesTimingSources(t *testing.T) {
	nv, err := cuda.LoadNVRTC()
	if err != nil {
		t.Skipf("no NVRTC here, compile check skipped: %v", err)
	}
	for name, src := range map[string]string{"pdl_chain.cu": pdlChainSource(), "flag_chain.cu": flagChainSource(), "sm_rate.cu": smRateSource()} {
		if _, err := cuda.CompileModule(nv, 9, 0, src, name, kernelOptions, cuda.KernelCache{Dir: t.TempDir()}); err != nil {
			t.Errorf("%s: %+v", name, err)
		}
	}
}
