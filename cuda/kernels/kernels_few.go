package kernels

import (
	"embed"
	"io/fs"
	"sort"
	"strings"

	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/cuda"
)

// The "few" module (cu/few/*.cu): the latency kernels of a few-heads
// decode layer (TP-8 shard), opt-in: mla_decode_few + mla_combine_few
// (TILERT_GPU_MLA_FEW=1) and topk_fast (TILERT_GPU_TOPK_FAST=1). A module of
// its own, compiled for the device's arch after common.cuh and loaded on
// first use, so the default module's source (and its kernel cache entry and
// PTX) stays as it is.

//go:embed cu/few/*.cu
var fewFS embed.FS

// FewKernelSource is the module's source: common.cuh, topk_radix.cuh (the
// top-k selection's key loads, digit counts and ordered emit, the default
// module's text), then every cu/few/*.cu in name order, each marked with
// #line. (Until session 12 it also held indexer_mma.cu and a prelude for
// the fused scores + top-k, indexer_scores_topk: removed, slower.)
func FewKernelSource() string {
	var b strings.Builder
	for _, f := range []struct {
		fs   embed.FS
		name string
	}{{kernelFS, "cu/common.cuh"}, {kernelFS, topkRadixHeader}} {
		src, err := f.fs.ReadFile(f.name)
		if err != nil {
			panic(err) // embedded at build time
		}
		b.WriteString("#line 1 \"" + strings.TrimPrefix(f.name, "cu/") + "\"\n")
		b.Write(src)
		b.WriteString("\n")
	}
	names, err := fs.Glob(fewFS, "cu/few/*.cu")
	if err != nil {
		panic(err)
	}
	sort.Strings(names)
	for _, n := range names {
		src, err := fewFS.ReadFile(n)
		if err != nil {
			panic(err)
		}
		b.WriteString("\n#line 1 \"" + strings.TrimPrefix(n, "cu/") + "\"\n")
		b.Write(src)
	}
	return b.String()
}

// CompileFew compiles the module for a device of compute capability
// major.minor through the cache (no GPU needed).
func CompileFew(nv *cuda.NVRTC, major, minor int, cache cuda.KernelCache) (*cuda.Compiled, error) {
	return cuda.CompileModule(nv, major, minor, FewKernelSource(), "tilert_kernels_few.cu", kernelOptions, cache)
}

var fewModule = &extraModule{
	name: "tilert_kernels_few",
	need: func(i cuda.DeviceInfo) error {
		if i.CCMajor < 9 {
			return errors.Newf("the few-heads kernels need sm_90 (fp8 conversions); this device is %d.%d", i.CCMajor, i.CCMinor)
		}
		return nil
	},
	compile: func(nv *cuda.NVRTC, i cuda.DeviceInfo) (*cuda.Compiled, error) {
		return CompileFew(nv, i.CCMajor, i.CCMinor, cuda.DefaultKernelCache())
	},
}

// few loads the module in k's context on first use (a failure is kept).
func (k *Set) few() (*cuda.Module, error) { return fewModule.load(k) }

// FewSupported says whether the module loads here, and if not why.
func (k *Set) FewSupported() error {
	_, err := k.few()
	return err
}

func (k *Set) fewFn(name string) (*cuda.Function, error) {
	mod, err := k.few()
	if err != nil {
		return nil, errors.WithHint(errors.Wrap(err, name), "the few-heads kernels need an sm_90 device; unset TILERT_GPU_MLA_FEW / TILERT_GPU_TOPK_FAST")
	}
	return k.c.Function(mod, name)
}

const (
	// MLAFewMaxHeads is the most heads MLADecodeFew takes (its partials and
	// the switch's intent: a tensor-parallel rank's share).
	MLAFewMaxHeads = 32
	// mlaFewChunk: tokens a chunk of mla_decode_few (MFW_TT); a split is a
	// whole number of chunks.
	mlaFewChunk = 16
	// mlaFewHeads: heads a block (MFW_HB).
	mlaFewHeads = 8
	// mlaFewMaxSplits bounds mla_combine_few's splits (its wz[1024]).
	mlaFewMaxSplits = 1024
)

// MLAFewSplits plans MLADecodeFew's token ranges: one 16-token chunk a
// block where the workspace that MLAHeadsWorkspaceBytes(nq, H) sizes
// allows it (the engine's scratch; for one row and H <= 32: 128 ranges, so
// 2048 tokens are one chunk a range), fewer, longer ranges otherwise.
func MLAFewSplits(nq, H, nidx int) int {
	most := mlaHeadsSplitsFor(mlaHeadsMaxSMs, nq, H, 1<<30)
	ns := max(1, min(cdiv(nidx, mlaFewChunk), most, mlaFewMaxSplits))
	tps := cdiv(cdiv(nidx, ns), mlaFewChunk) * mlaFewChunk
	return cdiv(nidx, tps)
}

// MLADecodeFew is MLADecodeTCF's operation (same arguments and results up
// to float32 rounding: float32 products here) for H <= 32 heads on
// mla_decode_few, split MLAFewSplits ways and merged by mla_combine_few.
// ws: MLAWorkspaceBytes(nq, H, MLAFewSplits(nq, H, nidx)) bytes (within
// MLAHeadsWorkspaceBytes(nq, H)). rowBase != 0: per-row cache bases (cache
// then the layer's offset; no block table).
func (k *Set) MLADecodeFew(s cuda.Stream, out, lse, qn, qp, cache, blockTable, rowBase, indices, lens, ws cuda.DevPtr, nq, H, nidx, ldIdx int, scale float32) error {
	if nq <= 0 || nq > 65535 || H <= 0 || H > MLAFewMaxHeads || nidx <= 0 || (indices != 0 && ldIdx < nidx) {
		return errors.Newf("mla few: nq=%d H=%d (1..%d) nidx=%d ldIdx=%d", nq, H, MLAFewMaxHeads, nidx, ldIdx)
	}
	if out == 0 || qn == 0 || qp == 0 || lens == 0 {
		return errors.Newf("mla few: out %#x qn %#x qp %#x lens %#x", uint64(out), uint64(qn), uint64(qp), uint64(lens))
	}
	if rowBase != 0 && blockTable != 0 {
		return errors.New("mla few: per-row cache bases take no block table")
	}
	ns := MLAFewSplits(nq, H, nidx)
	tps := cdiv(cdiv(nidx, ns), mlaFewChunk) * mlaFewChunk
	if ns > 1 && ws == 0 {
		return errors.Newf("mla few: %d splits need the workspace", ns)
	}
	f, err := k.fewFn("mla_decode_few")
	if err != nil {
		return err
	}
	partO, partML := ws, ws.Add(int64(nq*H*ns)*MLALatentDim*4)
	if err := k.launchFn(f, cuda.D3(ns, nq, cdiv(H, mlaFewHeads)), cuda.D1(256), 0, s,
		qn, qp, cache, blockTable, indices, ldIdx, nidx, lens, out, lse, H, scale, tps, partO, partML, rowBase); err != nil {
		return err
	}
	if ns == 1 {
		return nil
	}
	c, err := k.fewFn("mla_combine_few")
	if err != nil {
		return err
	}
	return k.launchFn(c, cuda.D3(nq*H, MLALatentDim/32, 1), cuda.D1(128), 0, s, partO, partML, ns, out, lse)
}

// TopKFastMaxT is the longest row TopKFastAfterHist selects (512 threads x
// 64 keys in registers).
const TopKFastMaxT = 512 * 64

// topkFastKernel is the topk_fast variant whose keys per thread cover T.
func topkFastKernel(T int) string {
	switch {
	case T <= 512*16:
		return "topk_fast16"
	case T <= 512*32:
		return "topk_fast32"
	}
	return "topk_fast64"
}

// TopKFastAfterHist is TopKRadixAfterHistWith(..., TopKRadixOne) (the same
// arguments and output, element for element; the histogram in scratch left
// zeroed) on topk_fast, for T <= TopKFastMaxT and K <= 32767.
func (k *Set) TopKFastAfterHist(s cuda.Stream, out, scores, lens, scratch cuda.DevPtr, rows, T, K, ld, ldOut int) error {
	if err := topkRadixCheck(rows, T, K, ld, ldOut, scratch); err != nil {
		return err
	}
	if T > TopKFastMaxT || K > 32767 {
		return errors.Newf("topk fast: T=%d (<= %d) K=%d (<= 32767)", T, TopKFastMaxT, K)
	}
	f, err := k.fewFn(topkFastKernel(T))
	if err != nil {
		return err
	}
	return k.launchFn(f, cuda.D1(rows), cuda.D1(512), 0, s, scores, ld, lens, T, K, TopKRadixHist(scratch), out, ldOut)
}

// TopKFast is TopKRadixWith(..., TopKRadixOne) on topk_fast: the 12-bit
// histogram (topk_radix_hist, the default module) then the selection.
func (k *Set) TopKFast(s cuda.Stream, out, scores, lens, scratch cuda.DevPtr, rows, T, K, ld, ldOut int) error {
	if err := topkRadixCheck(rows, T, K, ld, ldOut, scratch); err != nil {
		return err
	}
	if T > TopKFastMaxT || K > 32767 {
		return errors.Newf("topk fast: T=%d (<= %d) K=%d (<= 32767)", T, TopKFastMaxT, K)
	}
	nb, chunk := topkRadixPlan(k.c.Info().SMs, rows, T)
	if err := k.launch("topk_radix_hist", cuda.D3(nb, rows, 1), cuda.D1(256), 0, s, scores, ld, lens, T, K, chunk, TopKRadixHist(scratch)); err != nil {
		return err
	}
	return k.TopKFastAfterHist(s, out, scores, lens, scratch, rows, T, K, ld, ldOut)
}
