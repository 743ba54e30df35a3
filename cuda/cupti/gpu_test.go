package cupti

import (
	"os"
	"testing"

	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/cuda"
	"github.com/tilert-go/tilert/cuda/cudatest"
)

func TestMain(m *testing.M) {
	code := m.Run()
	_ = cudatest.Close()
	os.Exit(code)
}

// timelineSource: three kernels, each spinning a little so its interval is
// well above the timer's resolution.
const timelineSource = `
extern "C" __global__ void tl_first(float* x, int n) {
  float v = x[threadIdx.x];
  for (int i = 0; i < n; i++) v = v * 0.999f + 1.0f;
  x[blockIdx.x * blockDim.x + threadIdx.x] = v;
}
extern "C" __global__ void tl_second(float* x, int n) {
  float v = x[threadIdx.x];
  for (int i = 0; i < n; i++) v = v * 0.998f + 2.0f;
  x[(blockIdx.y * gridDim.x + blockIdx.x) * blockDim.x * blockDim.y + threadIdx.y * blockDim.x + threadIdx.x] = v;
}
extern "C" __global__ void tl_third(float* x, int n) {
  float v = x[threadIdx.x];
  for (int i = 0; i < n; i++) v = v * 0.997f + 3.0f;
  x[threadIdx.x] = v;
}
`

// TestGPUTraceGraph captures the three kernels as one graph, replays it
// traced twice (two Start/Stop rounds in one process) and checks what
// CUPTI recorded against what was launched.
func TestGPUTraceGraph(t *testing.T) {
	dev := cudatest.Device(t)
	tr, err := Open()
	if err != nil {
		t.Skipf("no libcupti here (set %s to its path): %v", EnvLib, err)
	}
	t.Logf("libcupti: %s", tr.Path())
	type launch struct {
		name        string
		grid, block cuda.Dim3
	}
	launches := []launch{
		{"tl_first", cuda.D1(4), cuda.D1(128)},
		{"tl_second", cuda.D3(2, 3, 1), cuda.D3(64, 2, 1)},
		{"tl_third", cuda.D1(1), cuda.D1(32)},
	}
	err = dev.Do(func(c *cuda.Ctx) error {
		nv, err := cuda.LoadNVRTC()
		if err != nil {
			return err
		}
		info := c.Info()
		ck, err := cuda.CompileModule(nv, info.CCMajor, info.CCMinor, timelineSource, "cupti_timeline.cu",
			func(arch string) []string { return []string{"--gpu-architecture=" + arch} }, cuda.DefaultKernelCache())
		if err != nil {
			return err
		}
		m, err := c.LoadModule("cupti_timeline", ck.Image)
		if err != nil {
			return err
		}
		x, err := c.Alloc(4 * 4096)
		if err != nil {
			return err
		}
		defer c.Free(x)
		s, err := c.NewStream()
		if err != nil {
			return err
		}
		defer c.DestroyStream(s)
		// The graph is captured while the first trace runs, as the engine's
		// TimelineStep does (CUPTI has seen the graph made); the second
		// round replays it in a new Start/Stop.
		var g *cuda.Graph
		capture := func() error {
			if err := c.BeginCapture(s); err != nil {
				return err
			}
			for _, l := range launches {
				f, err := c.Function(m, l.name)
				if err == nil {
					err = c.Launch(f, l.grid, l.block, 0, s, x, 20000)
				}
				if err != nil {
					_, _ = c.EndCapture(s)
					return err
				}
			}
			var err error
			g, err = c.EndCapture(s)
			return err
		}
		defer func() {
			if g != nil {
				_ = c.DestroyGraph(g)
			}
		}()
		for round := range 2 {
			if err := tr.Start(); err != nil {
				return err
			}
			err := func() error {
				if round == 0 {
					if err := capture(); err != nil {
						return err
					}
				}
				if err := c.LaunchGraph(g, s); err != nil {
					return err
				}
				return c.SyncStream(s)
			}()
			if err != nil {
				_, _ = tr.Stop()
				return err
			}
			recs, err := tr.Stop()
			if err != nil {
				return err
			}
			if len(recs) != len(launches) {
				return errors.Newf("round %d: %d kernel records, want %d: %+v", round, len(recs), len(launches), recs)
			}
			for i, r := range recs {
				l := launches[i]
				t.Logf("round %d: %s %d ns stream %d graph %d node %d corr %d grid %v block %v", round, r.Name, r.End-r.Start,
					r.Stream, r.GraphID, r.GraphNodeID, r.Correlation, r.Grid, r.Block)
				if r.Name != l.name {
					t.Errorf("round %d: record %d is %s, want %s (in launch order)", round, i, r.Name, l.name)
				}
				if r.Start >= r.End || (i > 0 && r.Start < recs[i-1].End) {
					t.Errorf("round %d: %s runs [%d, %d], after [%d, %d] of the one before", round, r.Name, r.Start, r.End,
						recs[max(i-1, 0)].Start, recs[max(i-1, 0)].End)
				}
				if r.GraphNodeID == 0 || r.GraphID == 0 {
					t.Errorf("round %d: %s without its graph (graph %d node %d)", round, r.Name, r.GraphID, r.GraphNodeID)
				}
				if r.Correlation != recs[0].Correlation { // a fact to learn, not a requirement
					t.Logf("round %d: %s correlation %d, the first kernel's %d", round, r.Name, r.Correlation, recs[0].Correlation)
				}
				if r.Grid != [3]int32{int32(l.grid.X), int32(l.grid.Y), int32(l.grid.Z)} ||
					r.Block != [3]int32{int32(l.block.X), int32(l.block.Y), int32(l.block.Z)} {
					t.Errorf("round %d: %s grid %v block %v, want %v %v", round, r.Name, r.Grid, r.Block, l.grid, l.block)
				}
			}
			tl, err := Analyze(recs, Options{})
			if err != nil {
				return err
			}
			if tl.Kernels != 3 || tl.BusyNs > tl.SpanNs || tl.SpanNs > 1e9 {
				t.Errorf("round %d: analysis %+v", round, tl)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("%+v", err)
	}
}
