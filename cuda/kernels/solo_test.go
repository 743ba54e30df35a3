package kernels

import (
	"fmt"
	"math/rand/v2"
	"regexp"
	"strings"
	"testing"

	"github.com/tilert-go/tilert/cuda"
)

// TestSoloSelection: TILERT_GPU_SOLO's values (no GPU): unset and 0 name
// nothing, 1 the default list, a list of prefixes is kept, a prefix of no
// soloable kernel is refused with a hint; every default entry names a
// soloable kernel and every soloable kernel is defined in a module.
func TestSoloSelection(t *testing.T) {
	for _, c := range []struct {
		v    string
		want []string
		bad  string
	}{
		{"", nil, ""},
		{"0", nil, ""},
		{"1", strings.Split(soloDefault, ","), ""},
		{"topk_radix_one_w16, moe_route", []string{"topk_radix_one_w16", "moe_route"}, ""},
		{"add_rmsnorm_reg,gemv_tile_fp8_r8_m1", nil, `"gemv_tile_fp8_r8_m1" is the start of no kernel`},
		{"2", nil, `"2" is the start of no kernel`},
	} {
		got, err := parseSolo(c.v)
		switch {
		case c.bad != "":
			if err == nil || !strings.Contains(err.Error(), c.bad) {
				t.Errorf("%q: %v, want an error with %q", c.v, err, c.bad)
			}
		case err != nil:
			t.Errorf("%q: %v", c.v, err)
		case fmt.Sprint(got) != fmt.Sprint(c.want):
			t.Errorf("%q: %v, want %v", c.v, got, c.want)
		}
	}
	for _, p := range strings.Split(soloDefault, ",") {
		if _, err := parseSolo(p); err != nil {
			t.Errorf("default entry %q: %v", p, err)
		}
	}
	src := KernelSource() + FewKernelSource()
	// The top-k kernels are defined by macros: NAME##KPT from MACRO(KPT).
	macros := map[string]string{"topk_radix_one_w": "TKW_KERNEL", "topk_fast": "TKF_KERNEL"}
	for name := range soloKernels {
		def := regexp.MustCompile(`__global__ void(?: __launch_bounds__\([^)]*\))?\s+` + name + `\(`).MatchString(src)
		for pre, m := range macros {
			if kpt, ok := strings.CutPrefix(name, pre); ok {
				def = def || strings.Contains(src, "\n"+m+"("+kpt+")")
			}
		}
		if !def {
			t.Errorf("%s is not defined in the kernels", name)
		}
	}
}

// TestSoloShared: the dynamic shared memory of a solo launch (no GPU): all
// a block may opt into less the kernel's own, where that keeps another
// block's reserve out of the SM; none where the device does not say or it
// would not.
func TestSoloShared(t *testing.T) {
	h200 := cuda.DeviceInfo{MaxSharedOptin: 232448, MaxSharedPerSM: 233472, ReservedShared: 1024}
	for _, c := range []struct {
		name   string
		info   cuda.DeviceInfo
		static int
		want   int
	}{
		{"H200, no static", h200, 0, 232448},
		{"H200, 8 KB static", h200, 8192, 232448 - 8192},
		{"static past the opt-in", h200, 240000, 0},
		{"no per-SM figure", cuda.DeviceInfo{MaxSharedOptin: 232448, ReservedShared: 1024}, 0, 0},
		{"no reserve: a zero-memory block would fit beside", cuda.DeviceInfo{MaxSharedOptin: 232448, MaxSharedPerSM: 233472}, 0, 0},
		{"room for two", cuda.DeviceInfo{MaxSharedOptin: 100 << 10, MaxSharedPerSM: 228 << 10, ReservedShared: 1024}, 0, 0},
	} {
		if got := soloShared(c.info, c.static); got != c.want {
			t.Errorf("%s: %d, want %d", c.name, got, c.want)
		}
	}
}

// TestKernelSolo: solo launches (TILERT_GPU_SOLO) of the default list's
// main-module kernels on fresh inputs give the plain launches' outputs bit
// for bit (add_rmsnorm_reg, rmsnorm_reg, moe_route_rank, the one-block
// top-k), and the occupancy query says one block of each fills an SM.
// Fails unless the launches were made solo.
func TestKernelSolo(t *testing.T) {
	defer func(sel []string) { soloSel = sel }(soloSel)
	onGPU(t, func(c *cuda.Ctx, k *Set, a *allocs, r *rand.Rand) {
		s := c.Stream()
		info := c.Info()
		if soloShared(info, 0) == 0 {
			t.Skipf("this device's shared memory (%d a block, %d an SM, %d reserved) cannot keep a block alone",
				info.MaxSharedOptin, info.MaxSharedPerSM, info.ReservedShared)
		}
		const D, E, T, K = 7168, 256, 8192, 2048
		x, b, w := randF32(r, D, 1), randF32(r, D, 1), a.up(randF32(r, D, 1))
		lg, bias := a.up(randF32(r, E, 2)), a.up(randF32(r, E, 0.1))
		scores, lens := a.up(randF32(r, T, 1)), a.up([]int32{T})
		bb := a.up(b)
		run := func() [][]byte {
			x1, y1, y2 := a.up(x), a.poisoned(D), a.poisoned(D)
			idx, wts, out := a.poisoned(8), a.poisoned(8), a.poisoned(K)
			scratch := a.raw(TopKRadixScratchBytes(1, T))
			chk(c.MemsetD32(scratch, 0, TopKRadixScratchBytes(1, T)/4, s))
			withSmall(true, func() {
				chk(k.AddRMSNorm(s, y1, x1, bb, w, 1, D, D, D, D, 1e-6))
				chk(k.RMSNorm(s, y2, y1, w, 1, D, D, D, 1e-6))
				chk(k.MoERoute(s, idx, wts, lg, bias, 1, E, 8, 8, 4, true, 2.5))
			})
			chk(k.TopKRadixWith(s, out, scores, lens, scratch, 1, T, K, T, K, TopKRadixOne))
			return [][]byte{bytesF32(downF32(c, x1, D)), bytesF32(downF32(c, y1, D)), bytesF32(downF32(c, y2, D)),
				bytesF32(downF32(c, idx, 8)), bytesF32(downF32(c, wts, 8)), bytesF32(downF32(c, out, K))}
		}
		soloSel = nil
		want := run()
		soloSel = strings.Split(soloDefault, ",")
		n0 := SoloLaunches()
		got := run()
		bad := 0
		for i := range want {
			bad += diffBytes(want[i], got[i])
		}
		record(t, "solo launches vs plain: add_rmsnorm_reg, rmsnorm_reg, moe_route_rank, one-block top-k", "mismatched bytes", float64(bad), 0)
		if n := SoloLaunches() - n0; n < 3 {
			t.Errorf("%d solo launches, want at least the norms' and the routing's", n)
		}
		for _, name := range []struct {
			fn    string
			block int
		}{{"add_rmsnorm_reg", 1024}, {"rmsnorm_reg", 1024}, {"moe_route_rank", 256}, {"topk_radix_one_w16", 516}} {
			f, err := k.fn(name.fn)
			chk(err)
			dyn := soloShared(info, f.StaticShared)
			chk(c.SetMaxDynamicShared(f, dyn))
			n, err := c.MaxActiveBlocks(f, name.block, dyn)
			if err != nil {
				t.Logf("%s: occupancy not queried: %v", name.fn, err)
				continue
			}
			t.Logf("%s: %d B static + %d B dynamic shared memory, %d block(s) an SM", name.fn, f.StaticShared, dyn, n)
			if n != 1 {
				t.Errorf("%s solo: %d blocks an SM, want 1", name.fn, n)
			}
		}
	})
}
