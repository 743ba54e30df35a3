package kernels

import (
	"math"
	"math/rand/v2"
	"testing"
)

// A transcription of indexer_topk_one's selection (cu/indexer_one.cu) run
// on the CPU, block by block and phase by phase with its thread layout
// (256 threads, warps of 32, the digit picks' ownership, the difference
// arrays and the two-segment emit passes), against refTopK: the
// algorithm's bookkeeping checked without a GPU. The list order is
// shuffled (the kernel appends in whatever order the blocks' atomics
// land).

func simFloatKey(f float32) uint32 {
	if f != f {
		return 0
	}
	b := math.Float32bits(f)
	if b&0x80000000 != 0 {
		return ^b
	}
	return b | 0x80000000
}

// simPick is idx1_pick: thread t holds c[t][i], the count of digit
// top(t) - NP + 1 + i; threads in descending digit order.
func simPick(c [][]uint32, top func(int) int, rem int) (digit, left, cnt int) {
	cum := 0
	for t := range c {
		sum := 0
		for _, v := range c[t] {
			sum += int(v)
		}
		if cum < rem && cum+sum >= rem {
			cc := cum
			for i := len(c[t]) - 1; i >= 0; i-- {
				ci := int(c[t][i])
				if cc < rem && cc+ci >= rem {
					digit, left, cnt = top(t)-(len(c[t])-1)+i, rem-cc, ci
				}
				cc += ci
			}
		}
		cum += sum
	}
	return
}

func simIdxOne(r *rand.Rand, x []float32, n, K, nb int) []int32 {
	o := make([]int32, K)
	for i := range o {
		o[i] = math.MaxInt32 // poison
	}
	if n <= K {
		for j := range K {
			o[j] = -1
			if j < n {
				o[j] = int32(j)
			}
		}
		return o
	}
	var hist [4096]uint32
	for t := range n {
		hist[simFloatKey(x[t])>>20]++
	}
	nseg := (n + 127) >> 7
	mysegOf := func(b int) int {
		if b < nseg {
			return (nseg-1-b)/nb + 1
		}
		return 0
	}
	// Phase 2 (every block finds the same bin).
	hc := make([][]uint32, 256)
	for t := range hc {
		hc[t] = make([]uint32, 16)
		for i := range 16 {
			hc[t][i] = hist[4096-16*(t+1)+i]
		}
	}
	tbi, rem, C := simPick(hc, func(t int) int { return 4095 - 16*t }, K)
	tb := uint32(tbi)
	segc := make([]uint32, nseg)
	type ent struct{ idx, key uint32 }
	var list []ent
	for b := range nb {
		nk := mysegOf(b) * 128
		for j := range nk {
			t := (b+(j>>7)*nb)*128 + j&127
			if t >= n {
				continue
			}
			k := simFloatKey(x[t])
			if k>>20 > tb {
				segc[b+(j>>7)*nb]++
			}
			if k>>20 == tb {
				list = append(list, ent{uint32(t), k})
			}
		}
	}
	if len(list) != C {
		panic("list length != hist[tb]")
	}
	r.Shuffle(len(list), func(i, j int) { list[i], list[j] = list[j], list[i] })
	// Phase 3: the digits (the same in every block).
	var h [1024]uint32
	for _, e := range list {
		h[(e.key>>10)&1023]++
	}
	h4 := func() [][]uint32 {
		c := make([][]uint32, 256)
		for t := range c {
			c[t] = append([]uint32(nil), h[1020-4*t:1024-4*t]...)
		}
		return c
	}
	d2, rem2, _ := simPick(h4(), func(t int) int { return 1023 - 4*t }, rem)
	p22 := tb<<10 | uint32(d2)
	h = [1024]uint32{}
	for _, e := range list {
		if e.key>>10 == p22 {
			h[e.key&1023]++
		}
	}
	d3, rem3, _ := simPick(h4(), func(t int) int { return 1023 - 4*t }, rem2)
	thr := p22<<10 | uint32(d3)
	// Per block: offsets and the emit.
	for b := range nb {
		myseg := mysegOf(b)
		var dG, dE [17]uint32
		for _, e := range list {
			gt, eq := e.key > thr, e.key == thr
			if gt || eq {
				s := int(e.idx >> 7)
				kmin := 0
				if s >= b {
					kmin = (s-b)/nb + 1
				}
				if kmin < myseg {
					if gt {
						dG[kmin]++
					} else {
						dE[kmin]++
					}
				}
			}
		}
		var sPre [16]uint32
		per := (nseg + 255) >> 8
		run := uint32(0)
		for tid := range 256 {
			s0 := min(nseg, tid*per)
			s1 := min(nseg, s0+per)
			for s := s0; s < s1; s++ {
				if s >= b && (s-b)%nb == 0 {
					sPre[(s-b)/nb] = run
				}
				run += segc[s]
			}
		}
		var g, q uint32
		for kk := range myseg {
			g += dG[kk]
			q += dE[kk]
			dG[kk], dE[kk] = g, q
		}
		nk := myseg * 128
		for j0 := 0; j0 < nk; j0 += 256 {
			var gm, em [8]uint32
			type th struct {
				t      int
				gt, eq bool
			}
			var ths [256]th
			for tid := range 256 {
				j := j0 + tid
				kk := j >> 7
				t := (b+kk*nb)*128 + j&127
				ok := j < nk && t < n
				var k uint32
				if j < nk && t < n {
					k = simFloatKey(x[t])
				}
				ths[tid] = th{t, ok && k > thr, ok && k == thr}
				if ths[tid].gt {
					gm[tid>>5] |= 1 << (tid & 31)
				}
				if ths[tid].eq {
					em[tid>>5] |= 1 << (tid & 31)
				}
			}
			for tid := range 256 {
				e := ths[tid]
				if !e.gt && !e.eq {
					continue
				}
				j := j0 + tid
				kk, half, wid, lane := j>>7, tid>>7, tid>>5, tid&31
				lt := uint32(1)<<lane - 1
				gb := popc(gm[wid] & lt)
				eb := popc(em[wid] & lt)
				for w := half * 4; w < wid; w++ {
					gb += popc(gm[w])
					eb += popc(em[w])
				}
				gb += int(sPre[kk] + dG[kk])
				eb += int(dE[kk])
				pos := gb + min(eb, rem3)
				if (e.gt || eb < rem3) && pos < K {
					if o[pos] != math.MaxInt32 {
						panic("position written twice")
					}
					o[pos] = int32(e.t)
				}
			}
		}
	}
	return o
}

func popc(v uint32) int {
	n := 0
	for ; v != 0; v &= v - 1 {
		n++
	}
	return n
}

func TestIdxOneSelectionTranscription(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 11))
	for _, cs := range []struct {
		name    string
		T, n, K int
		dist    string
	}{
		{"normal", 131072, 131072, 2048, "normal"},
		{"normal lens", 131328, 131300, 2048, "normal"},
		{"K+1", 40000, 2049, 2048, "normal"},
		{"K", 40000, 2048, 2048, "normal"},
		{"ties", 65536, 65536, 2048, "ties"},
		{"ties lens", 131328, 100001, 2048, "ties"},
		{"narrow", 65536, 60000, 2048, "narrow"},
		{"all equal", 65536, 65536, 2048, "equal"},
		{"offset", 131072, 131072, 2048, "offset"},
		{"small K", 33000, 33000, 7, "ties"},
	} {
		x := make([]float32, cs.T)
		for i := range x {
			switch cs.dist {
			case "ties":
				x[i] = float32(r.IntN(64)) / 8
			case "narrow":
				x[i] = 1 + float32(r.IntN(1<<12))/(1<<22)
			case "equal":
				x[i] = 0.25
			case "offset":
				x[i] = 10 + float32(r.NormFloat64())
			default:
				x[i] = float32(r.NormFloat64())
			}
		}
		for _, nq := range []int{1, 4} {
			nb, ok := idxOnePlan(132, 2, nq, cs.T)
			if !ok {
				t.Errorf("%s: plan refuses %d rows of %d", cs.name, nq, cs.T)
				continue
			}
			if nb*nq > 264 {
				t.Errorf("%s: %d blocks x %d rows exceed one wave", cs.name, nb, nq)
			}
			got := simIdxOne(r, x, cs.n, cs.K, nb)
			want := refTopK(x, cs.n, cs.K)
			bad := 0
			for j := range want {
				if got[j] != want[j] {
					bad++
				}
			}
			if bad != 0 {
				t.Errorf("%s (nb=%d): %d of %d indices differ from refTopK", cs.name, nb, bad, cs.K)
			}
		}
	}
}

// The plan: one wave for every row count, at most 2048 keys a block.
func TestIdxOnePlan(t *testing.T) {
	for _, nq := range []int{1, 2, 3, 4, 8} {
		for _, T := range []int{1, 1000, 32768, 65536, 131072, 131328, 163840, 262144} {
			nb, ok := idxOnePlan(132, 2, nq, T)
			if nb*nq > 264 {
				t.Errorf("nq=%d T=%d: %d blocks a row exceed one wave", nq, T, nb)
			}
			if ok && cdiv(cdiv(T, 16), 8*nb)*128 > idxOneKeysPerBlock {
				t.Errorf("nq=%d T=%d: plan ok with more than %d keys a block", nq, T, idxOneKeysPerBlock)
			}
			if nq == 1 && T <= 262144 && !ok {
				t.Errorf("one row of %d keys refused", T)
			}
		}
	}
}
