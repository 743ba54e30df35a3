package kernels

import (
	"math/rand/v2"
	"testing"

	"github.com/tilert-go/tilert/cuda"
)

// TestLaunchPriority (device): launches at the device's greatest priority
// (SetPriority), plainly and programmatically (the priority attribute
// beside PDL's in one cuLaunchKernelEx), eagerly and captured into a graph
// instantiated with its nodes' priorities and replayed, give the bits of
// a launch at the stream's priority, on fresh random inputs; the setting
// holds until changed back.
func TestLaunchPriority(t *testing.T) {
	onGPU(t, func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
		least, greatest, err := c.StreamPriorityRange()
		chk(err)
		t.Logf("priorities: least %d, greatest %d", least, greatest)
		if greatest == least {
			t.Skip("the device has one scheduling priority")
		}
		defer k.SetPriority(0) // the Set is the context's: later tests launch at the stream's
		const rows, I = 3, 4099
		gate, up := make([]float32, rows*I), make([]float32, rows*I)
		for i := range gate {
			gate[i], up[i] = float32(r.NormFloat64()), float32(r.NormFloat64())
		}
		g, u := a.up(gate), a.up(up)
		s := c.Stream()
		out := func(run func(dst cuda.DevPtr)) []float32 {
			dst := a.poisoned(rows * I)
			run(dst)
			chk(c.SyncStream(s))
			return downF32(c, dst, rows*I)
		}
		silu := func(dst cuda.DevPtr) { chk(k.SiluMul(s, dst, g, u, rows, I, I, I, I)) }
		defer k.SetPDL(k.PDL())
		k.SetPDL(false)
		want := out(silu)
		same := func(name string, got []float32) {
			bad := 0.0
			for i := range got {
				if got[i] != want[i] {
					bad++
				}
			}
			record(t, "launch priority: "+name, "values differing", bad, 0)
		}
		if prev := k.SetPriority(greatest); prev != 0 {
			t.Errorf("SetPriority's previous priority %d, want 0", prev)
		}
		same("plain", out(silu))
		k.SetPDL(true)
		if k.PDL() {
			same("programmatic", out(silu))
		}
		same("captured", out(func(dst cuda.DevPtr) {
			chk(c.BeginCapture(s))
			err := k.SiluMul(s, dst, g, u, rows, I, I, I, I)
			x, cerr := c.EndCaptureWith(s, true)
			chk(err)
			chk(cerr)
			defer func() { chk(c.DestroyGraph(x)) }()
			chk(c.LaunchGraph(x, s))
		}))
		if p := k.Priority(); p != greatest {
			t.Errorf("Priority() = %d after the launches, want %d", p, greatest)
		}
		if prev := k.SetPriority(0); prev != greatest {
			t.Errorf("SetPriority's previous priority %d, want %d", prev, greatest)
		}
		same("back at the stream's", out(silu))
	})
}
