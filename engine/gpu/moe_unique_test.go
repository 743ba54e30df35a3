package gpu

import (
	"testing"

	"github.com/tilert-go/tilert/engine"
	"github.com/tilert-go/tilert/engine/internal/enginetest"
)

// The routed experts grouped by expert (TILERT_GPU_MOE_UNIQUE=1: every
// round of several rows) must give what the per-slot launches (=0) give: the same tokens and cache bytes, one
// slot and two slots with MTP (1..4 rows a step). A step of several rows
// must run them, one table and two grouped launches in place of the two
// per-slot launches; the default (unset) only its rounds of 3-4 rows.
func TestEmuMoEUniqueEqual(t *testing.T) { testMoEUniqueEqual(t, onEmu) }
func TestGPUMoEUniqueEqual(t *testing.T) { testMoEUniqueEqual(t, onGPU) }

func testMoEUniqueEqual(t *testing.T, kind deviceKind) {
	if kind == onGPU {
		gpuDevice(t)
	}
	defer func(v string) { moeUniqueMode = v }(moeUniqueMode)
	for _, pr := range enginetest.Presets {
		t.Run(pr, func(t *testing.T) {
			c := newSwitchCasePast(t, pr)
			var r [2]switchRun
			for k, v := range []string{"0", "1"} {
				moeUniqueMode = v
				r[k] = c.run(t, kind, true)
			}
			r[1].sameAs(t, r[0], "grouped by expert", "per slot")
			u, g := r[1].ops["moeUnique"], r[1].ops["expertsUniqueGateUp"]
			if r[0].ops["moeUnique"] != 0 || u == 0 || g != u || r[1].ops["expertsUnique"] != u {
				t.Errorf("launches: moeUnique %d off, %d on; grouped gate/up %d, down %d on (want 0, some, and one of each a table)",
					r[0].ops["moeUnique"], u, g, r[1].ops["expertsUnique"])
			}
			for _, name := range []string{"experts", "expertsGateUp"} {
				if r[1].ops[name]+u != r[0].ops[name] {
					t.Errorf("%s: %d launches off, %d on beside %d grouped (want each grouped launch to replace one)",
						name, r[0].ops[name], r[1].ops[name], u)
				}
			}
			t.Logf("%s launches off/on: expertsGateUp %d/%d experts %d/%d; moeUnique %d", kind,
				r[0].ops["expertsGateUp"], r[1].ops["expertsGateUp"], r[0].ops["experts"], r[1].ops["experts"], u)
			// The default groups only rounds of 3-4 rows: the two slots
			// with MTP (4 rows) but not one slot with MTP (2 rows).
			moeUniqueMode = ""
			d := c.run(t, kind, true)
			d.sameAs(t, r[0], "default", "per slot")
			if du := d.ops["moeUnique"]; du == 0 || du >= u {
				t.Errorf("the default ran %d tables, want some and fewer than =1's %d", du, u)
			}
		})
	}
}

// Greedy decoding equals the CPU engine's with the routed experts grouped
// by expert (the GPU check of the grouped kernels' bits inside the engine).
func TestGPUGreedyMatchesCPUMoEUnique(t *testing.T) {
	defer func(v string) { moeUniqueMode = v }(moeUniqueMode)
	moeUniqueMode = "1"
	testGreedyCases(t, onGPU, engine.CacheFP8DSMLA, genCases, " (TILERT_GPU_MOE_UNIQUE=1)")
}

// The tile kernels' default takes rounds of 3 and 4 rows only (where it
// measured faster); the tensor-core forms are the default for experts as
// long as the dense GEMVs that take the tensor cores (the real models: 2048
// x 7168 for DeepSeek-V3.2, 2048 x 6144 for GLM-5), not the tiny presets'.
func TestMoEUniqueAuto(t *testing.T) {
	for m, want := range map[int]bool{1: false, 2: false, 3: true, 4: true, 5: false, 8: false} {
		if got := moeUniqueAuto(m); got != want {
			t.Errorf("moeUniqueAuto(%d) = %v, want %v", m, got, want)
		}
	}
	defer func(on bool) { gemvMMAOn = on }(gemvMMAOn)
	for _, cs := range []struct {
		on    bool
		MI, H int
		want  bool
	}{{true, 2048, 7168, true}, {true, 2048, 6144, true}, {true, 256, 512, false}, {true, 1024, 7168, false},
		{true, 2048, 1024, false}, {false, 2048, 7168, false}} {
		gemvMMAOn = cs.on
		if got := moeMMAAuto(cs.MI, cs.H); got != cs.want {
			t.Errorf("moeMMAAuto(%d, %d) with the tensor-core GEMVs on=%v: %v, want %v", cs.MI, cs.H, cs.on, got, cs.want)
		}
	}
}

// TILERT_GPU_MOE_UNIQUE=x with TILERT_GPU_SIDE_SH_ONCE=1: the grouped
// launches take the tensor-core kernel and the side stream's shared expert
// runs once over a step's rows (a gateUp and a gemvFP8 in place of its two
// dense-slot launches). The emulator's float32 products are the same
// function either way, so there the tokens and caches equal the per-slot
// run's; on the GPU the bits differ (TestGPUGreedyMatchesCPUMoEUniqueMMA
// checks the tokens against the CPU engine).
func TestEmuMoEUniqueMMA(t *testing.T) { testMoEUniqueMMA(t, onEmu) }
func TestGPUMoEUniqueMMA(t *testing.T) { testMoEUniqueMMA(t, onGPU) }

func testMoEUniqueMMA(t *testing.T, kind deviceKind) {
	if kind == onGPU {
		gpuDevice(t)
	}
	defer func(v, s string) { moeUniqueMode, sideShOnceMode = v, s }(moeUniqueMode, sideShOnceMode)
	for _, pr := range enginetest.Presets {
		t.Run(pr, func(t *testing.T) {
			c := newSwitchCasePast(t, pr)
			moeUniqueMode, sideShOnceMode = "0", ""
			off := c.run(t, kind, true)
			moeUniqueMode, sideShOnceMode = "x", "1"
			on := c.run(t, kind, true)
			if kind == onEmu {
				on.sameAs(t, off, "grouped on the tensor cores, shared expert once", "per slot")
			}
			u := on.ops["moeUnique"]
			if u == 0 || on.ops["expertsUniqueGateUp"] != u || on.ops["expertsUnique"] != u {
				t.Errorf("launches on: moeUnique %d, grouped gate/up %d, down %d (want some, and one of each a table)",
					u, on.ops["expertsUniqueGateUp"], on.ops["expertsUnique"])
			}
			// Each step of several rows: two grouped launches replace the
			// routed ones, and the shared expert's two leave the experts
			// launches for a gateUp and a gemvFP8.
			sh := on.ops["gateUp"] - off.ops["gateUp"]
			if sh <= 0 || on.ops["gemvFP8"]-off.ops["gemvFP8"] != sh {
				t.Errorf("shared expert once: gateUp %d -> %d, gemvFP8 %d -> %d (want as many more of each, some)",
					off.ops["gateUp"], on.ops["gateUp"], off.ops["gemvFP8"], on.ops["gemvFP8"])
			}
			for _, name := range []string{"experts", "expertsGateUp"} {
				if got, want := on.ops[name], off.ops[name]-u-sh; got != want {
					t.Errorf("%s: %d launches off, %d on (want %d: less the %d grouped and the %d shared-once)", name, off.ops[name], got, want, u, sh)
				}
			}
			t.Logf("%s: %d tables, %d shared-once steps; tokens on %v, off %v", kind, u, sh, on.toks, off.toks)
		})
	}
}

// Greedy decoding equals the CPU engine's with the grouped experts on the
// tensor cores and the shared expert once (their bits differ from the
// per-slot launches').
func TestGPUGreedyMatchesCPUMoEUniqueMMA(t *testing.T) {
	defer func(v, s string) { moeUniqueMode, sideShOnceMode = v, s }(moeUniqueMode, sideShOnceMode)
	moeUniqueMode, sideShOnceMode = "x", "1"
	testGreedyCases(t, onGPU, engine.CacheFP8DSMLA, genCases, " (TILERT_GPU_MOE_UNIQUE=x, TILERT_GPU_SIDE_SH_ONCE=1)")
}
