package kernels

import (
	"strings"
	"testing"

	"github.com/tilert-go/tilert/cuda"
)

// TestNVRTCIndexerDeepNoSpills: the deep scores kernels (indexer_mma.cu's
// idx_scores_deep_body: up to four 16-key groups in registers a warp, two
// blocks of 256 threads an SM, so at most 128 registers) compile for sm_90
// without spilling (no GPU needed).
func TestNVRTCIndexerDeepNoSpills(t *testing.T) {
	nv, err := cuda.LoadNVRTC()
	if err != nil {
		t.Skipf("no NVRTC here, compile check skipped: %v", err)
	}
	_, log, err := nv.CompileLog(KernelSource(), "tilert_kernels.cu", append(kernelOptions("sm_90"), "-Xptxas", "-v"), true)
	if err != nil {
		t.Skipf("NVRTC %s refused sm_90 with -Xptxas -v (registers and spills not shown): %v", nv.Version(), err)
	}
	sp, _ := ptxasSpills(log)
	seen := 0
	for _, blk := range strings.Split(log, "Compiling entry function '")[1:] {
		name := blk[:strings.IndexByte(blk, '\'')]
		if !strings.HasPrefix(name, "indexer_scores_mma") {
			continue
		}
		seen++
		if i := strings.Index(blk, "Used "); i >= 0 {
			t.Logf("%s: %s", name, strings.SplitN(blk[i:], "\n", 2)[0])
		}
		if n, ok := sp[name]; ok {
			t.Errorf("%s spills (%s bytes of spill stores)", name, n)
		}
	}
	if seen < 2*len(IndexerMMADepths)+3 {
		t.Errorf("ptxas -v named %d indexer_scores_mma kernels, want the 3 before and %d deep ones", seen, 2*len(IndexerMMADepths))
	}
}

// TestIndexerMMADeepNames: every depth the launcher takes names a kernel
// of the module; others are refused.
func TestIndexerMMADeepNames(t *testing.T) {
	src := KernelSource()
	for _, d := range IndexerMMADepths {
		for _, rows := range []bool{false, true} {
			name, err := indexerMMADeepName(d, rows)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(src, "IDX_DEEP_KERNELS("+name[len(name)-1:]+")") || !strings.Contains(src, "indexer_scores_mma_d##D") {
				t.Errorf("%s: not instantiated in indexer_mma.cu", name)
			}
			if !pdlKernels[name] {
				t.Errorf("%s: not in pdlKernels (it begins with PDL_WAIT)", name)
			}
		}
	}
	if _, err := indexerMMADeepName(5, false); err == nil {
		t.Error("depth 5 accepted")
	}
	if IndexerMMADeepDepth != 4 {
		t.Errorf("engine depth %d", IndexerMMADeepDepth)
	}
}

// TestTopKClusterKernelPick: the topk_cl variant covers T (8 blocks x 512
// threads x keys a thread) and is the smallest that does.
func TestTopKClusterKernelPick(t *testing.T) {
	for _, c := range []struct {
		T    int
		want string
	}{{1, "topk_cl8"}, {32768, "topk_cl8"}, {32769, "topk_cl12"}, {33024, "topk_cl12"}, {40000, "topk_cl12"},
		{49153, "topk_cl16"}, {65536, "topk_cl16"}, {65537, "topk_cl24"}, {98305, "topk_cl32"}, {131072, "topk_cl32"},
		{131073, "topk_cl40"}, {131328, "topk_cl40"}, {163841, "topk_cl48"}, {196609, "topk_cl64"}, {TopKClusterMaxT, "topk_cl64"}} {
		if got := topkClusterKernel(c.T); got != c.want {
			t.Errorf("T=%d: %s, want %s", c.T, got, c.want)
		}
	}
	if TopKClusterMaxT != 262144 {
		t.Errorf("TopKClusterMaxT %d", TopKClusterMaxT)
	}
	src := FewKernelSource()
	for _, kpt := range topkClusterKPT {
		if kpt%4 != 0 || !strings.Contains(src, fmtName("TKC_KERNEL(%d)", kpt)) {
			t.Errorf("topk_cl%d not instantiated (or not a multiple of 4: tk_load_keys's float4 loads)", kpt)
		}
		if !pdlMoreKernels[fmtName("topk_cl%d", kpt)] {
			t.Errorf("topk_cl%d is on neither PDL list", kpt)
		}
	}
}
