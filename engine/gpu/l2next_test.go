package gpu

import (
	"fmt"
	"testing"

	"github.com/tilert-go/tilert/cuda"
	"github.com/tilert-go/tilert/cuda/kernels"
	"github.com/tilert-go/tilert/engine/internal/blockw"
	"github.com/tilert-go/tilert/engine/internal/enginetest"
)

// l2NextRanges asks for the next layer's input projections, weights then
// fp8 scales, by mode; nothing without a next layer, for a float32 q_a
// (exact mode) or with the switch off.
func TestL2NextRanges(t *testing.T) {
	fp8 := func(w, s uint64, out, in int) dlin {
		return dlin{kind: linFP8, w: cuda.DevPtr(w), s: cuda.DevPtr(s), out: out, in: in}
	}
	layer := func(qa dlin) *dlayer {
		return &dlayer{Block: &blockw.Block[dlin, cuda.DevPtr]{
			QA: qa, KVA: fp8(0x2000, 0x2100, 576, 7168), IWK: fp8(0x3000, 0x3100, 128, 7168),
			IWP: dlin{kind: linBF16, w: 0x4000, out: 64, in: 7168}, IWQ: fp8(0x5000, 0x5100, 8192, 1536),
			QB: fp8(0x6000, 0x6100, 24576, 1536),
		}}
	}
	ds := layer(fp8(0x1000, 0x1100, 1536, 7168))
	group := []kernels.L2Range{
		{P: 0x1000, N: 1536 * 7168}, {P: 0x1100, N: 4 * 12 * 56},
		{P: 0x2000, N: 576 * 7168}, {P: 0x2100, N: 4 * 5 * 56},
		{P: 0x3000, N: 128 * 7168}, {P: 0x3100, N: 4 * 1 * 56},
		{P: 0x4000, N: 2 * 64 * 7168},
	}
	wqb := append(append([]kernels.L2Range(nil), group...), kernels.L2Range{P: 0x5000, N: 8192 * 1536},
		kernels.L2Range{P: 0x5100, N: 4 * 64 * 12})
	for _, cs := range []struct {
		name string
		next *dlayer
		mode string
		want []kernels.L2Range
	}{
		{"off", ds, "", nil},
		{"0", ds, "0", nil},
		{"group", ds, "group", group},
		{"wqb", ds, "wqb", wqb},
		{"last layer", nil, "group", nil},
		{"exact mode", layer(dlin{kind: linF32, w: 0x1000, out: 1536, in: 7168}), "group", nil},
	} {
		got := l2NextRanges(cs.next, cs.mode)
		if fmt.Sprint(got) != fmt.Sprint(cs.want) {
			t.Errorf("%s: ranges\n got %v\nwant %v", cs.name, got, cs.want)
		}
		if len(got) > kernels.MaxL2Ranges {
			t.Errorf("%s: %d ranges, over one launch's %d", cs.name, len(got), kernels.MaxL2Ranges)
		}
	}
}

// TILERT_GPU_L2_NEXT changes no output: the same tokens and caches, one
// slot and two with MTP, on each value. Every prefetch ends a side chain
// that holds the shared expert (behind its down projection), a forward's
// last MoE layer asks for nothing, and (the emulator) every range lies
// inside an allocation.
func TestEmuL2Next(t *testing.T) { testL2Next(t, onEmu) }
func TestGPUL2Next(t *testing.T) { testL2Next(t, onGPU) }

func testL2Next(t *testing.T, kind deviceKind) {
	if kind == onGPU {
		gpuDevice(t)
	}
	defer func(m string) { l2NextMode = m }(l2NextMode)
	for _, pr := range enginetest.Presets {
		t.Run(pr, func(t *testing.T) {
			c := newSwitchCasePast(t, pr)
			var r [3]switchRun
			modes := []string{"", "group", "wqb"}
			for k, m := range modes {
				l2NextMode = m
				r[k] = c.run(t, kind, true)
			}
			if n := r[0].ops["l2Prefetch"]; n != 0 {
				t.Errorf("switch off: %d prefetch launches", n)
			}
			for k := 1; k < len(r); k++ {
				r[k].sameAs(t, r[0], "TILERT_GPU_L2_NEXT="+modes[k], "off")
				pf, chains := 0, 0
				var bytes []int64
				for i, run := range r[k].keep {
					n, sh := l2NextChains(t, run)
					if n >= sh && sh > 0 {
						t.Errorf("%s run %d: %d prefetches beside %d shared-expert chains (a forward's last MoE layer has none to ask for)",
							modes[k], i, n, sh)
					}
					pf, chains = pf+n, chains+sh
					for _, op := range run {
						if op.name == "l2Prefetch" {
							bytes = append(bytes, op.bytes)
						}
					}
				}
				if pf == 0 {
					t.Errorf("%s: no prefetch in %d shared-expert chains", modes[k], chains)
				}
				for _, b := range bytes {
					if b != bytes[0] {
						t.Errorf("%s: prefetches of %d and %d bytes (every layer's projections are one size)", modes[k], bytes[0], b)
						break
					}
				}
				if k == 2 && len(bytes) > 0 && len(r[1].keep) > 0 {
					if g := firstPrefetch(r[1].keep); g > 0 && bytes[0] <= g {
						t.Errorf("wqb asks for %d bytes, group for %d: wq_b is missing", bytes[0], g)
					}
				}
				t.Logf("%s %s: %d prefetch launches in %d shared-expert chains, %d bytes each", kind, modes[k], pf, chains, firstPrefetch(r[k].keep))
			}
		})
	}
}

// l2NextChains counts a recorded run's prefetches and its side chains that
// hold experts (the shared expert's), and checks each prefetch is the last
// call of such a chain.
func l2NextChains(t *testing.T, run []gop) (prefetches, shared int) {
	t.Helper()
	in, experts := false, false
	for i, op := range run {
		switch op.name {
		case "fork":
			in, experts = true, false
		case "unfork":
			if experts {
				shared++
			}
			in = false
		case "experts", "expertsGateUp":
			experts = experts || in
		case "l2Prefetch":
			prefetches++
			if !in || !experts || i+1 >= len(run) || run[i+1].name != "unfork" {
				t.Errorf("call %d: a prefetch outside the end of a shared expert's side chain", i)
			}
		}
	}
	return prefetches, shared
}

func firstPrefetch(runs [][]gop) int64 {
	for _, run := range runs {
		for _, op := range run {
			if op.name == "l2Prefetch" {
				return op.bytes
			}
		}
	}
	return 0
}
