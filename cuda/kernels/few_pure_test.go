package kernels

import (
	"math"
	"math/rand/v2"
	"testing"
)

// TestMLAFewButterfly (CI): mla_decode_few's score reduction transcribed
// lane by lane: xor 16 adds all 16 values, then mfw_bfly<8/4/2/1> (a lane
// keeps the upper half of its values where it has the step's bit and adds
// the partner's same half): lane l must end with value l & 15 summed over
// the 32 lanes (the kernel writes it as head l & 7 of token l >> 3).
func TestMLAFewButterfly(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	var v [32][16]float64
	var want [16]float64
	for l := range 32 {
		for i := range 16 {
			v[l][i] = float64(r.IntN(1000))
			want[i] += v[l][i]
		}
	}
	var nv [32][16]float64
	for l := range 32 {
		for i := range 16 {
			nv[l][i] = v[l][i] + v[l^16][i]
		}
	}
	v = nv
	for _, s := range []int{8, 4, 2, 1} {
		send := func(l, i int) float64 {
			if l&s != 0 {
				return v[l][i]
			}
			return v[l][i+s]
		}
		for l := range 32 {
			for i := range s {
				keep := v[l][i]
				if l&s != 0 {
					keep = v[l][i+s]
				}
				nv[l][i] = keep + send(l^s, i)
			}
		}
		v = nv
	}
	for l := range 32 {
		if v[l][0] != want[l&15] {
			t.Fatalf("lane %d: %v, want value %d's sum %v", l, v[l][0], l&15, want[l&15])
		}
	}
}

// tkfModel transcribes tkf_body's phases (nt threads, kpt keys each; a
// barrier between phases, so each phase runs thread by thread) on one row,
// with the 12-bit histogram built as the scores kernel builds it.
func tkfModel(x []float32, n, K, kpt, nt int) []int32 {
	bpt, dpt := 4096/nt, 1024/nt
	if short, ok := topkModelShort(n, K); ok {
		return short
	}
	out := make([]int32, K)
	for j := range out {
		out[j] = math.MaxInt32 // unwritten
	}
	gh, k, nv := topkModelKeys(x, n, kpt, nt)
	// exclusive scan over threads
	scan := func(v []int) []int {
		out := make([]int, len(v))
		s := 0
		for i, a := range v {
			out[i] = s
			s += a
		}
		return out
	}
	// 12-bit bin
	sums := make([]int, nt)
	cs := make([][]int, nt)
	for tid := range nt {
		hi := 4095 - bpt*tid
		cs[tid] = make([]int, bpt)
		for j := range bpt {
			cs[tid][j] = gh[hi-j]
			sums[tid] += cs[tid][j]
		}
	}
	cum := scan(sums)
	b, above := 0, 0
	for tid := range nt {
		if cum[tid] < K && cum[tid]+sums[tid] >= K {
			a, bb := cum[tid], 4095-bpt*tid
			for j := range bpt {
				if a+cs[tid][j] >= K {
					break
				}
				a += cs[tid][j]
				bb--
			}
			b, above = bb, a
		}
	}
	pick := func(h []int, rem int) (int, int) {
		s := make([]int, nt)
		for tid := range nt {
			for j := range dpt {
				s[tid] += h[1023-dpt*tid-j]
			}
		}
		c := scan(s)
		for tid := range nt {
			if c[tid] < rem && c[tid]+s[tid] >= rem {
				a, d := c[tid], 1023-dpt*tid
				for j := range dpt {
					if a+h[1023-dpt*tid-j] >= rem {
						break
					}
					a += h[1023-dpt*tid-j]
					d--
				}
				return d, rem - a
			}
		}
		return 0, 0
	}
	h := make([]int, 1024)
	for tid := range nt {
		for j := range nv[tid] {
			if k[tid][j]>>20 == uint32(b) {
				h[(k[tid][j]>>10)&1023]++
			}
		}
	}
	d2, rem := pick(h, K-above)
	p22 := uint32(b)<<10 | uint32(d2)
	h = make([]int, 1024)
	for tid := range nt {
		for j := range nv[tid] {
			if k[tid][j]>>10 == p22 {
				h[k[tid][j]&1023]++
			}
		}
	}
	d3, rem := pick(h, rem)
	thr := p22<<10 | uint32(d3)
	packed := make([]int, nt)
	for tid := range nt {
		nsel, neq := 0, 0
		for j := range nv[tid] {
			if k[tid][j] > thr {
				nsel++
			}
			if k[tid][j] == thr {
				neq++
			}
		}
		packed[tid] = nsel<<16 | neq
	}
	before := scan(packed)
	for tid := range nt {
		eq := before[tid] & 0xffff
		pos := before[tid]>>16 + min(eq, rem)
		for j := range nv[tid] {
			take := k[tid][j] > thr
			if k[tid][j] == thr {
				take = eq < rem
				eq++
			}
			if take {
				if pos < K {
					out[pos] = int32(tid*kpt + j)
				}
				pos++
			}
		}
	}
	return out
}

// TestTopKFastModel (CI): tkfModel (topk_fast transcribed) equals refTopK
// element for element on normal, tied, narrow, all-equal, offset and short
// rows, for topk_fast (512 threads x 16/32/64 keys) and the fused tail (256
// threads x 32/48/64: 16 bins and 4 digits a thread) - the phases' logic;
// the GPU tests check the kernels themselves.
func TestTopKFastModel(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	const K = 2048
	ran := 0
	defer func() {
		if ran < 15 {
			t.Errorf("only %d model runs", ran)
		}
	}()
	for _, c := range []struct {
		dist string
		n    int
	}{{"normal", 8192}, {"normal", 8000}, {"ties", 8192}, {"narrow", 16384}, {"equal", 5000}, {"normal", 32768},
		{"ties", 30000}, {"normal", 2049}, {"normal", 1000}, {"offset", 20000}} {
		x := make([]float32, c.n)
		for i := range x {
			switch c.dist {
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
		want := refTopK(x, c.n, K)
		// topk_fast (512 threads) and the fused tail (256 threads, rows up
		// to 16384 keys), each at the keys a thread its launcher picks.
		for _, v := range []struct {
			nt   int
			kpts []int
		}{{512, []int{16, 32, 64}}, {256, []int{32, 48, 64}}} {
			nt, kpt := v.nt, 0
			for _, k := range v.kpts {
				if kpt == 0 && c.n <= nt*k {
					kpt = k
				}
			}
			if kpt == 0 {
				continue
			}
			ran++
			got := tkfModel(x, c.n, K, kpt, nt)
			bad := 0
			for j := range want {
				if got[j] != want[j] {
					bad++
				}
			}
			if bad != 0 {
				t.Errorf("%s n=%d, %d threads x %d keys: %d of %d indices differ", c.dist, c.n, nt, kpt, bad, K)
			}
		}
	}
}

// TestMLAFewSoftmaxModel (CI): mla_decode_few's per-block recurrence (16-token
// chunks: chunk max, m' = max(m, chunk max), p = exp(s - m'), corr =
// exp(m - m') on l and o, skipped slots p = 0, an all-skipped chunk leaving m
// at -Inf) over MLAFewSplits' ranges (1, 4 and 8 chunks a range at 2048
// tokens), then mla_combine_few's merge (M = max m_z, w_z = exp(m_z - M) or
// 0, L = sum w_z l_z, out = sum w_z o_z / L, lse = M + log L), transcribed
// on scalar values against one softmax over all tokens: ranges with skipped
// slots, empty ranges, a row with none valid.
func TestMLAFewSoftmaxModel(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for _, sh := range [][2]int{{1, 16}, {4, 32}, {16, 8}} {
		for _, nidx := range []int{1, 16, 17, 300, 2048} {
			for _, skip := range []float64{0, 0.3, 1} {
				mlaFewSoftmaxCase(t, r, sh[0], sh[1], nidx, skip)
			}
		}
	}
}

func mlaFewSoftmaxCase(t *testing.T, r *rand.Rand, nq, H, nidx int, skip float64) {
	s := make([]float64, nidx)
	v := make([]float64, nidx)
	valid := make([]bool, nidx)
	for i := range s {
		s[i], v[i] = 4*r.NormFloat64(), r.NormFloat64()
		valid[i] = r.Float64() >= skip
	}
	// Reference.
	mx, any := math.Inf(-1), false
	for i := range s {
		if valid[i] {
			mx, any = math.Max(mx, s[i]), true
		}
	}
	var l, o float64
	for i := range s {
		if valid[i] {
			p := math.Exp(s[i] - mx)
			l += p
			o += p * v[i]
		}
	}
	wantOut, wantLse := 0.0, math.Inf(-1)
	if any {
		wantOut, wantLse = o/l, mx+math.Log(l)
	}
	// The kernel's recurrence, range by range.
	ns := MLAFewSplits(nq, H, nidx)
	tps := cdiv(cdiv(nidx, ns), mlaFewChunk) * mlaFewChunk
	ms, ls, os := make([]float64, ns), make([]float64, ns), make([]float64, ns)
	for z := range ns {
		end := min(nidx, z*tps+tps)
		m, lz, acc := math.Inf(-1), 0.0, 0.0
		for base := z * tps; base < end; base += mlaFewChunk {
			var sc [mlaFewChunk]float64
			cm := math.Inf(-1)
			for j := range mlaFewChunk {
				sc[j] = math.Inf(-1)
				if i := base + j; i < end && valid[i] {
					sc[j] = s[i]
				}
				cm = math.Max(cm, sc[j])
			}
			mn := math.Max(m, cm)
			c, sp := 1.0, 0.0
			if !math.IsInf(mn, -1) {
				c = math.Exp(m - mn)
			}
			acc *= c
			for j := range mlaFewChunk {
				p := 0.0
				if !math.IsInf(mn, -1) {
					p = math.Exp(sc[j] - mn)
				}
				sp += p
				if p != 0 {
					acc += p * v[base+j]
				}
			}
			m, lz = mn, lz*c+sp
		}
		ms[z], ls[z], os[z] = m, lz, acc
	}
	gotOut, gotLse := 0.0, math.Inf(-1)
	if ns == 1 {
		if ls[0] > 0 {
			gotOut, gotLse = os[0]/ls[0], ms[0]+math.Log(ls[0])
		}
	} else {
		M := math.Inf(-1)
		for _, m := range ms {
			M = math.Max(M, m)
		}
		var L, acc float64
		for z := range ns {
			w := 0.0
			if !math.IsInf(ms[z], -1) {
				w = math.Exp(ms[z] - M)
			}
			L += ls[z] * w
			acc += os[z] * w
		}
		if L > 0 {
			gotOut, gotLse = acc/L, M+math.Log(L)
		}
	}
	if math.Abs(gotOut-wantOut) > 1e-12*math.Max(1, math.Abs(wantOut)) ||
		!(gotLse == wantLse || math.Abs(gotLse-wantLse) < 1e-12*math.Max(1, math.Abs(wantLse))) {
		t.Errorf("nq=%d H=%d nidx=%d skip=%v (%d ranges of %d): out %v lse %v, want %v %v", nq, H, nidx, skip, ns, tps, gotOut, gotLse, wantOut, wantLse)
	}
}
