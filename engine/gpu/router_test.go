package gpu

import (
	"bytes"
	"testing"

	"github.com/tilert-go/tilert/engine"
	"github.com/tilert-go/tilert/engine/internal/enginetest"
)

// The fused router (routerRoute, TILERT_GPU_ROUTE_FUSED) must give what
// the router GEMV then moeRoute give: the same tokens and cache bytes, one
// slot and two slots with MTP (several rows a step). The step must run it
// where routeFused allows and never moeRoute beside it for the same layer:
// the test counts the launches.
func TestEmuRouteFusedEqualUnfused(t *testing.T) { testRouteFusedEqualUnfused(t, onEmu) }
func TestGPURouteFusedEqualUnfused(t *testing.T) { testRouteFusedEqualUnfused(t, onGPU) }

func testRouteFusedEqualUnfused(t *testing.T, kind deviceKind) {
	if kind == onGPU {
		gpuDevice(t)
	}
	defer func(n int) { routeFusedMaxM = n }(routeFusedMaxM)
	for _, pr := range enginetest.Presets {
		t.Run(pr, func(t *testing.T) {
			w, src := hfSourceOf(t, enginetest.PresetDir(t, pr))
			vocab := w.Config().VocabSize
			prompt := enginetest.Prompt(w.Config().IndexTopK+20, vocab, 7)
			n := 12
			opts := engine.Options{MTP: true, MaxSeqLen: len(prompt) + n + 16, Slots: 2}
			var toks [2][]int
			var caches [2][]byte
			var batch [2][][]int
			var count [2]map[string]int
			for k, rows := range []int{0, 4} {
				routeFusedMaxM = rows
				e := newTestEngine(t, kind, src, opts)
				e.m.graphs.keep = [][]gop{}
				toks[k] = enginetest.GenerateKeep(t, e, 0, prompt, engine.Params{}, n)
				caches[k] = exportBytes(t, e, 0)
				e.Release(0)
				batch[k] = generateBatch(t, e, [][]int{prompt[:len(prompt)-3], prompt}, engine.Params{}, n)
				count[k] = map[string]int{}
				for _, run := range e.m.graphs.keep {
					for _, op := range run {
						count[k][op.name]++
					}
				}
			}
			if i := enginetest.FirstDiff(toks[1], toks[0]); i >= 0 {
				t.Errorf("fused router tokens differ from unfused at %d:\n got %v\nwant %v", i, toks[1], toks[0])
			}
			if !bytes.Equal(caches[0], caches[1]) {
				t.Errorf("caches differ between the fused and unfused router")
			}
			for s := range batch[0] {
				if i := enginetest.FirstDiff(batch[1][s], batch[0][s]); i >= 0 {
					t.Errorf("batched slot %d: fused router tokens differ from unfused at %d", s, i)
				}
			}
			if count[0]["routerRoute"] != 0 || count[1]["routerRoute"] == 0 {
				t.Errorf("routerRoute launches: %d unfused, %d fused (want 0 and some)", count[0]["routerRoute"], count[1]["routerRoute"])
			}
			// Every routing is either launch: the fused one replaces moeRoute.
			if a, b := count[0]["moeRoute"], count[1]["moeRoute"]+count[1]["routerRoute"]; a != b {
				t.Errorf("routings: %d unfused, %d fused (moeRoute %d + routerRoute %d)", a, b, count[1]["moeRoute"], count[1]["routerRoute"])
			}
			t.Logf("%s graph launches unfused/fused: moeRoute %d/%d gemvBF16 %d/%d routerRoute %d", kind, count[0]["moeRoute"],
				count[1]["moeRoute"], count[0]["gemvBF16"], count[1]["gemvBF16"], count[1]["routerRoute"])
		})
	}
}

// routeFused follows gemvBF16's kernel choice: the wide kernel's rows only,
// up to TILERT_GPU_ROUTE_FUSED's rows.
func TestRouteFusedRule(t *testing.T) {
	defer func(n int, tile bool, wide string) { routeFusedMaxM, gemvTileOn, gemvWideMode = n, tile, wide }(routeFusedMaxM, gemvTileOn, gemvWideMode)
	for v, want := range map[string]int{"": 4, "0": 0, "1": 1, "2": 2, "4": 4, "8": 8, "9": 4, "on": 4, "-1": 4} {
		if got := routeFusedRows(v); got != want {
			t.Errorf("TILERT_GPU_ROUTE_FUSED=%q: %d rows, want %d", v, got, want)
		}
	}
	routeFusedMaxM, gemvTileOn, gemvWideMode = 4, true, ""
	r := dlin{kind: linBF16, out: 256, in: 7168}
	for M := 1; M <= 4; M++ {
		if !routeFused(r, M, 256, 7168) {
			t.Errorf("M=%d: not fused", M)
		}
	}
	for _, M := range []int{0, 5, 8, 9, 64} {
		if routeFused(r, M, 256, 7168) {
			t.Errorf("M=%d fused while the tile kernel (or a GEMM) computes those logits", M)
		}
	}
	if routeFused(dlin{kind: linFP8, out: 256, in: 7168}, 1, 256, 7168) || routeFused(r, 1, 128, 7168) {
		t.Errorf("fused a non-bf16 router or a router of another shape")
	}
	gemvTileOn = false
	if routeFused(r, 8, 256, 7168) {
		t.Errorf("8 rows fused with TILERT_GPU_ROUTE_FUSED unset (4 rows at most)")
	}
	routeFusedMaxM = 8
	if !routeFused(r, 8, 256, 7168) {
		t.Errorf("tile kernels off, TILERT_GPU_ROUTE_FUSED=8: 8 rows run the wide kernel, not fused")
	}
	gemvWideMode = "0"
	if routeFused(r, 1, 256, 7168) {
		t.Errorf("TILERT_GPU_GEMV_WIDE=0: fused though the warp-per-row GEMV computes the logits")
	}
	gemvWideMode, gemvTileOn, routeFusedMaxM = "", true, 1
	if routeFused(r, 2, 256, 7168) || !routeFused(r, 1, 256, 7168) {
		t.Errorf("TILERT_GPU_ROUTE_FUSED=1: not exactly the one-row steps fused")
	}
	routeFusedMaxM = 0
	if routeFused(r, 1, 256, 7168) {
		t.Errorf("TILERT_GPU_ROUTE_FUSED=0: fused")
	}
}
