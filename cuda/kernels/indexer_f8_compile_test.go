package kernels

import (
	"fmt"
	"strings"
	"testing"

	"github.com/tilert-go/tilert/cuda"
)

// TestNVRTCCompilesIndexerF8: the default module with the fp8 scores kernels
// compiles for sm_90 with this NVRTC (the e4m3 mma.sync needs 12.4+: set
// TILERT_NVRTC; an older one builds the module without them), and ptxas
// -v's registers and spills of the new kernels and of indexer_scores_mma_pf
// (their baseline) are logged; a spill fails.
func TestNVRTCCompilesIndexerF8(t *testing.T) {
	nv, err := cuda.LoadNVRTC()
	if err != nil {
		t.Skipf("no NVRTC here, compile check skipped: %v", err)
	}
	img, log, err := nv.CompileLog(KernelSource(), "tilert_kernels.cu", append(kernelOptions("sm_90"), "-Xptxas", "-v"), true)
	if err != nil {
		t.Fatalf("NVRTC %s: %+v", nv.Version(), err)
	}
	t.Logf("NVRTC %s: %d bytes", nv.Version(), len(img))
	want := map[string]bool{"indexer_scores_mma_pf": true, "f16_mma_probe": true}
	var major, minor int
	if _, err := fmt.Sscanf(nv.Version(), "%d.%d", &major, &minor); err == nil && (major > 12 || major == 12 && minor >= 4) {
		want["indexer_scores_f8"], want["indexer_scores_f8_rows"], want["f8_mma_probe"] = true, true, true
	} else {
		t.Logf("NVRTC %s: no e4m3 mma.sync, the module is built without indexer_scores_f8", nv.Version())
	}
	seen := 0
	for _, part := range strings.Split(log, "Compiling entry function '")[1:] {
		name, rest, _ := strings.Cut(part, "'")
		if !want[name] {
			continue
		}
		seen++
		var lines []string
		for _, l := range strings.Split(rest, "\n")[1:] {
			if strings.Contains(l, "Compiling entry function") || strings.Contains(l, "Function properties for") && len(lines) > 2 {
				break
			}
			if l = strings.TrimSpace(l); l != "" {
				lines = append(lines, l)
			}
		}
		t.Logf("%s: %s", name, strings.Join(lines, " | "))
	}
	if seen != len(want) {
		t.Errorf("ptxas -v named %d of the %d kernels looked for", seen, len(want))
	}
	sp, _ := ptxasSpills(log)
	for name := range want {
		if n, ok := sp[name]; ok {
			t.Errorf("%s spills (%s bytes of spill stores)", name, n)
		}
	}
}
