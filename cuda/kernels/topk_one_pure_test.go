package kernels

import (
	"math"
	"math/rand/v2"
	"testing"
)

// topk_radix_one_w (cu/topk_radix.cu: tkw_body, tkw_core, tkw_pick) transcribed
// on the CPU, warp by warp and lane by lane, so that its phases' logic (the
// KPT / 2 body, the bin from warp totals, the one-warp digit picks, the
// passes skipped when a prefix is taken whole, the emit with and without
// ties) is checked against refTopK without a GPU. The GPU checks
// (topk_one_test.go) run the kernel itself.

// tkwPath names the stage at which the model's selection was fixed.
const (
	tkwShort = "n <= K"
	tkwBin   = "bin taken whole"
	tkwDigit = "second digit taken whole"
	tkwThr   = "threshold taken whole"
	tkwTie   = "ties split"
)

// tkwFloatKey is float_key (common.cuh).
func tkwFloatKey(f float32) uint32 {
	if f != f {
		return 0
	}
	b := math.Float32bits(f)
	if b&0x80000000 != 0 {
		return ^b
	}
	return b | 0x80000000
}

// topkModelShort is a one-block top-k's output for a row of n <= K keys
// (0..n-1, then -1); ok is false for longer rows.
func topkModelShort(n, K int) (out []int32, ok bool) {
	if n > K {
		return nil, false
	}
	out = make([]int32, K)
	for j := range K {
		out[j] = -1
		if j < n {
			out[j] = int32(j)
		}
	}
	return out, true
}

// topkModelKeys lays row x[0..n) out as a one-block top-k holds it: the
// 12-bit histogram the scores kernel (or topk_radix_hist) leaves, and nt
// threads' kpt keys each (nv[t] of them valid).
func topkModelKeys(x []float32, n, kpt, nt int) (gh []int, k [][]uint32, nv []int) {
	gh = make([]int, 4096)
	for i := range n {
		gh[tkwFloatKey(x[i])>>20]++
	}
	k = make([][]uint32, nt)
	nv = make([]int, nt)
	for tid := range nt {
		i0 := tid * kpt
		nv[tid] = max(0, min(kpt, n-i0))
		k[tid] = make([]uint32, kpt)
		for j := range nv[tid] {
			k[tid][j] = tkwFloatKey(x[i0+j])
		}
	}
	return gh, k, nv
}

// tkwKPT is the keys a thread the kernel's body holds for a row of n keys
// in the kernel that topkRadixOneKernel picks for T.
func tkwKPT(T, n int) int {
	kpt := 32
	switch {
	case T <= 1024*8:
		kpt = 8
	case TopKOneW12 && T <= 1024*12:
		return 12 // topk_radix_one_w12: no half body
	case T <= 1024*16:
		kpt = 16
	}
	if n <= 512*kpt {
		kpt /= 2
	}
	return kpt
}

// tkwModel returns the selection of row x[0..n) (out[j] = MaxInt32 where
// nothing was written), the path it took, and whether an unchecked store
// (the emit's warp fast path) would have gone past K.
func tkwModel(x []float32, n, K, T int) (out []int32, path string, overflow bool) {
	const nt, warps = 1024, 32
	if short, ok := topkModelShort(n, K); ok {
		return short, tkwShort, false
	}
	out = make([]int32, K)
	for j := range out {
		out[j] = math.MaxInt32
	}
	kpt := tkwKPT(T, n)
	gh, k, nv := topkModelKeys(x, n, kpt, nt)
	act := func(tid int) bool { return (tid&^31)*kpt < n }
	// The bin: warp totals, each warp's prefix, a lane scan in the warp
	// holding the K-th key.
	var res [9]int
	sum := make([]int, nt)
	wsum := make([]int, warps)
	for tid := range nt {
		hi := 4095 - 4*tid
		sum[tid] = gh[hi] + gh[hi-1] + gh[hi-2] + gh[hi-3]
		wsum[tid>>5] += sum[tid]
	}
	pre := 0
	for w := range warps {
		if pre < K && pre+wsum[w] >= K {
			cum := pre
			for lane := range 32 {
				tid := w*32 + lane
				hi := 4095 - 4*tid
				if cum < K && cum+sum[tid] >= K {
					c := []int{gh[hi], gh[hi-1], gh[hi-2], gh[hi-3]}
					a := cum
					for q := range 4 {
						if a+c[q] >= K {
							res[0], res[1], res[2] = hi-q, a, c[q]
							break
						}
						a += c[q]
					}
				}
				cum += sum[tid]
			}
		}
		pre += wsum[w]
	}
	ub := uint32(res[0])
	rem := K - res[1]
	lo, thr, tie := ub<<20, uint32(0), false
	path = tkwBin
	count := func(prefix uint32, shift int) []int {
		h := make([]int, 1024)
		for tid := range nt {
			if !act(tid) {
				continue
			}
			for j := range nv[tid] {
				if k[tid][j]>>(shift+10) == prefix {
					h[(k[tid][j]>>shift)&1023]++
				}
			}
		}
		return h
	}
	if rem != res[2] {
		tkwPickModel(count(ub, 10), rem, res[3:6])
		p22 := ub<<10 | uint32(res[3])
		rem = res[4]
		lo, path = p22<<10, tkwDigit
		if rem != res[5] {
			tkwPickModel(count(p22, 0), rem, res[6:9])
			thr = p22<<10 | uint32(res[6])
			rem = res[7]
			lo, path = thr, tkwThr
			if rem != res[8] {
				tie, path = true, tkwTie
			}
		}
	}
	// The emit: per-thread counts, their block scan (the lane scan and each
	// warp's prefix), then each thread's keys in order.
	v := make([]int, nt)
	for tid := range nt {
		for j := range nv[tid] {
			switch {
			case tie:
				if k[tid][j] > thr {
					v[tid] += 1 << 16
				}
				if k[tid][j] == thr {
					v[tid]++
				}
			case k[tid][j] >= lo:
				v[tid]++
			}
		}
	}
	before := make([]int, nt)
	wend := make([]int, nt) // the sum to the end of the thread's warp
	s := 0
	for w := range warps {
		ws := 0
		for lane := range 32 {
			ws += v[w*32+lane]
		}
		for lane := range 32 {
			tid := w*32 + lane
			before[tid] = s
			s += v[tid]
			wend[tid] = before[w*32] + ws
		}
	}
	for tid := range nt {
		if !act(tid) {
			continue
		}
		i0 := tid * kpt
		if tie {
			// tk_emit
			eqBefore := before[tid] & 0xffff
			pos := before[tid]>>16 + min(eqBefore, rem)
			for j := range nv[tid] {
				take := k[tid][j] > thr
				if k[tid][j] == thr {
					take = eqBefore < rem
					eqBefore++
				}
				if take {
					if pos < K {
						out[pos] = int32(i0 + j)
					}
					pos++
				}
			}
			continue
		}
		pos := before[tid]
		for j := range nv[tid] {
			if k[tid][j] >= lo {
				if pos < K {
					out[pos] = int32(i0 + j)
				} else if wend[tid] <= K {
					overflow = true // the unchecked store would have gone past K
				}
				pos++
			}
		}
	}
	return out, path, overflow
}

// tkwPickModel is tkw_pick: lane l's group l from the top (digits 1023 -
// 32 l down to 992 - 32 l), the first group whose inclusive sum reaches
// rem, then its digits from the top.
func tkwPickModel(h []int, rem int, res []int) {
	incl := 0
	for l := range 32 {
		s := 0
		for d := 992 - 32*l; d < 1024-32*l; d++ {
			s += h[d]
		}
		if incl+s >= rem {
			r := rem - incl
			in2 := 0
			for j := range 32 {
				d := 1023 - 32*l - j
				if in2+h[d] >= r {
					res[0], res[1], res[2] = d, r-in2, h[d]
					return
				}
				in2 += h[d]
			}
		}
		incl += s
	}
}

// tkwRow draws a row of n scores: dist names the shape (the GPU checks
// draw theirs the same way).
func tkwRow(r *rand.Rand, dist string, n, K int) []float32 {
	x := make([]float32, n)
	switch dist {
	case "normal":
		for i := range x {
			x[i] = float32(r.NormFloat64())
		}
	case "offset": // ~10% of the keys in the threshold's 12-bit bin
		for i := range x {
			x[i] = 10 + float32(r.NormFloat64())
		}
	case "ties": // 64 values: the threshold shared by ~n/64 keys
		for i := range x {
			x[i] = float32(r.IntN(64)) / 8
		}
	case "narrow": // one 12-bit bin, ~2 keys a value
		for i := range x {
			x[i] = 1 + float32(r.IntN(1<<12))/(1<<22)
		}
	case "distinct narrow": // one 12-bit bin, every key distinct: the third digit decides, no ties
		p := r.Perm(1 << 15)
		for i := range x {
			x[i] = 1 + float32(p[i])/(1<<22)
		}
	case "equal":
		for i := range x {
			x[i] = 0.25
		}
	case "split": // exactly K keys in a higher 12-bit bin than the rest
		for i := range x {
			x[i] = 1
		}
		for _, i := range r.Perm(n)[:min(K, n)] {
			x[i] = 2
		}
	case "small bin": // a few keys in the threshold's bin, spread over many bins
		for i := range x {
			x[i] = float32(math.Ldexp(1+r.Float64(), r.IntN(200)-100))
		}
	}
	return x
}

// TestTopKOneWModel (CI): tkwModel equals refTopK element for element on
// normal, offset, tied, narrow, distinct narrow, all-equal, split and
// spread rows of lengths around K, 8192 (in its own and in an 8448-key
// bucket, the KPT / 2 body), 16384 and 32768, lengths not a multiple of
// 32, K 2048 and 64; every path is taken at least once and no fast-path
// store goes past K.
func TestTopKOneWModel(t *testing.T) {
	r := rand.New(rand.NewPCG(10, 11))
	seen := map[string]int{}
	// Every case as the launcher picks, then under TopKOneW12 (12 keys a
	// thread in buckets of 8193..12288 keys; elsewhere the same).
	for _, w12 := range []bool{false, true} {
		withTopKOneW12(t, w12)
		for _, c := range []struct {
			dist    string
			T, n, K int
		}{
			{"normal", 8192, 8192, 2048}, {"normal", 8448, 8192, 2048}, {"normal", 16384, 16384, 2048},
			{"normal", 32768, 32768, 2048}, {"normal", 2049, 2049, 2048}, {"normal", 8192, 8000, 2048},
			{"normal", 32768, 20001, 2048}, {"normal", 16384, 8193, 2048}, {"normal", 1500, 1500, 2048},
			{"offset", 8448, 8192, 2048}, {"offset", 32768, 30000, 2048},
			{"ties", 8192, 8192, 2048}, {"ties", 32768, 30011, 2048}, {"ties", 4000, 3001, 2048},
			{"narrow", 16384, 16384, 2048}, {"narrow", 8448, 8192, 2048},
			{"distinct narrow", 8192, 8192, 2048}, {"distinct narrow", 32768, 32768, 2048},
			{"equal", 5000, 5000, 2048}, {"equal", 32768, 32768, 2048},
			{"split", 8192, 8192, 2048}, {"split", 16384, 12345, 2048}, {"split", 8192, 4097, 2048},
			{"small bin", 8192, 8192, 2048}, {"small bin", 32768, 32768, 2048},
			{"normal", 8192, 100, 64}, {"ties", 8192, 999, 64}, {"normal", 1024, 1000, 64},
			{"normal", 8448, 8256, 2048}, {"ties", 12288, 12288, 2048}, {"narrow", 12288, 10000, 2048},
			{"split", 8448, 8300, 2048}, {"distinct narrow", 12288, 9001, 2048}, {"small bin", 8448, 8448, 2048},
			{"normal", 8448, 100, 64}, {"equal", 12288, 12000, 2048},
		} {
			x := tkwRow(r, c.dist, c.n, c.K)
			want := refTopK(x, c.n, c.K)
			got, path, overflow := tkwModel(x, c.n, c.K, c.T)
			seen[path]++
			bad := 0
			for j := range want {
				if got[j] != want[j] {
					bad++
				}
			}
			if bad != 0 || overflow {
				t.Errorf("%s T=%d n=%d K=%d (%s): %d of %d indices differ, fast-path store past K: %v", c.dist, c.T, c.n, c.K, path, bad, c.K, overflow)
			}
		}
	}
	withTopKOneW12(t, false)
	for _, p := range []string{tkwShort, tkwBin, tkwDigit, tkwThr, tkwTie} {
		if seen[p] == 0 {
			t.Errorf("no case took the path %q (seen %v)", p, seen)
		}
	}
	t.Logf("paths: %v", seen)
}

// The bodies the launcher's kernels run: KPT / 2 from half their capacity.
func TestTopKOneWKPT(t *testing.T) {
	withTopKOneW12(t, false)
	for _, c := range []struct{ T, n, want int }{
		{8192, 8192, 8}, {8192, 4097, 8}, {8192, 4096, 4}, {8448, 8192, 8}, {8448, 8193, 16},
		{16384, 16384, 16}, {32768, 16384, 16}, {32768, 16385, 32}, {2049, 2049, 4},
	} {
		if got := tkwKPT(c.T, c.n); got != c.want {
			t.Errorf("T=%d n=%d: %d keys a thread, want %d", c.T, c.n, got, c.want)
		}
	}
	// TopKOneW12: buckets of 8193..12288 keys at 12 a thread, any length.
	withTopKOneW12(t, true)
	for _, c := range []struct{ T, n, want int }{{8448, 8256, 12}, {8448, 100, 12}, {12288, 12288, 12}, {12289, 12289, 16}, {8192, 8192, 8}} {
		if got := tkwKPT(c.T, c.n); got != c.want {
			t.Errorf("TopKOneW12: T=%d n=%d: %d keys a thread, want %d", c.T, c.n, got, c.want)
		}
	}
	if got := topkRadixOneKernel(8448); got != "topk_radix_one_w12" {
		t.Errorf("TopKOneW12: T=8448 launches %s, want topk_radix_one_w12", got)
	}
	if !pdlKernels["topk_radix_one_w12"] {
		t.Error("topk_radix_one_w12 is not among the programmatic-launch kernels (pdl.go)")
	}
	withTopKOneW12(t, false)
	// The kernel names the launcher picks.
	for _, c := range []struct {
		T    int
		want string
	}{{2049, "topk_radix_one_w8"}, {8192, "topk_radix_one_w8"}, {8193, "topk_radix_one_w16"}, {16384, "topk_radix_one_w16"},
		{16385, "topk_radix_one_w32"}, {32768, "topk_radix_one_w32"}} {
		if got := topkRadixOneKernel(c.T); got != c.want {
			t.Errorf("T=%d: %s, want %s", c.T, got, c.want)
		}
	}
	for _, name := range []string{"topk_radix_one_w8", "topk_radix_one_w16", "topk_radix_one_w32"} {
		if !pdlKernels[name] {
			t.Errorf("%s is not among the programmatic-launch kernels (pdl.go)", name)
		}
	}
}

// withTopKOneW12 sets TopKOneW12 for the rest of the test (restored at its end).
func withTopKOneW12(t *testing.T, on bool) {
	old := TopKOneW12
	TopKOneW12 = on
	t.Cleanup(func() { TopKOneW12 = old })
}
