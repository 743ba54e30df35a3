package gpu

import (
	"os"
	"testing"

	"github.com/tilert-go/tilert/cuda"
	"github.com/tilert-go/tilert/cuda/kernels"
	"github.com/tilert-go/tilert/engine"
)

// TestGPUGemvBulk: greedy decoding with TILERT_GPU_GEMV_BULK=1 (set here,
// whatever the environment) matches the CPU engine, and the bulk GEMV
// actually ran (no silent fallback to the tile kernels) on a compute
// capability 9.0 device, where the sm_90a module must load.
func TestGPUGemvBulk(t *testing.T) {
	if os.Getenv("TILERT_GPU_BULK_CHECK") != "1" {
		t.Skip("opt-in until the bulk GEMV has run on a GPU: TILERT_GPU_BULK_CHECK=1 (docs/measured/next5/gbulk.sh)")
	}
	var cc [2]int
	var wgErr error
	if err := gpuDevice(t).Do(func(c *cuda.Ctx) error {
		k, err := kernels.Load(c)
		if err != nil {
			return err
		}
		cc = [2]int{c.Info().CCMajor, c.Info().CCMinor}
		wgErr = k.WGSupported()
		return nil
	}); err != nil {
		t.Fatalf("%+v", err)
	}
	if cc != [2]int{9, 0} {
		t.Skipf("the bulk GEMV needs compute capability 9.0 (this device is %d.%d)", cc[0], cc[1])
	}
	if wgErr != nil {
		t.Fatalf("the sm_90a module does not load on this 9.0 device: %+v", wgErr)
	}
	if !gemvTileOn {
		t.Skip("TILERT_GPU_GEMV_TILE=0: the bulk GEMV is off with the tile kernels")
	}
	defer func(on bool) { gemvBulkOn = on }(gemvBulkOn)
	gemvBulkOn = true
	n0 := gemvBulkLaunches.Load()
	testGreedyCases(t, onGPU, engine.CacheFP8DSMLA, genCases, " gemv bulk")
	n := gemvBulkLaunches.Load() - n0
	if n == 0 {
		t.Fatal("TILERT_GPU_GEMV_BULK=1: no GEMV ran gemv_bulk_fp8")
	}
	t.Logf("gemv_bulk_fp8 ran %d launches", n)
}
