package kernels

// CPU references for the kernel checks, written independently of numeric/
// (so they also cross-check it) and computed in float64 unless the kernel's
// contract is bit-exact.

import (
	"math"
	"math/rand/v2"
	"sort"

	"github.com/tilert-go/tilert/cuda"
)

// fp8Table decodes e4m3fn codes: bias 7, subnormals m*2^-9, 0x7f/0xff NaN.
var fp8Table = func() [256]float64 {
	var t [256]float64
	for b := range 256 {
		e, m := (b>>3)&15, b&7
		var v float64
		switch {
		case e == 15 && m == 7:
			v = math.NaN()
		case e == 0:
			v = float64(m) * math.Ldexp(1, -9)
		default:
			v = (1 + float64(m)/8) * math.Ldexp(1, e-7)
		}
		if b&0x80 != 0 {
			v = -v
		}
		t[b] = v
	}
	return t
}()

// fp8Encode rounds to the nearest finite e4m3 code, ties to the even code,
// saturating at +-448; it searches the code table, so it is slow but plainly
// right.
func fp8Encode(f float32) byte {
	x := float64(f)
	if math.IsNaN(x) {
		return 0x7f
	}
	sign := byte(0)
	if math.Signbit(x) {
		sign = 0x80
		x = -x
	}
	if x >= 448 {
		return sign | 0x7e
	}
	best, bestD := 0, math.Inf(1)
	for c := 0; c <= 0x7e; c++ {
		d := math.Abs(fp8Table[c] - x)
		if d < bestD || (d == bestD && c%2 == 0) {
			best, bestD = c, d
		}
	}
	return sign | byte(best)
}

func bf16ToF64(u uint16) float64 { return float64(math.Float32frombits(uint32(u) << 16)) }

// bf16Round rounds float32 to bf16 (RNE).
func bf16Round(f float32) uint16 {
	u := math.Float32bits(f)
	if u&0x7fffffff > 0x7f800000 {
		return uint16(u>>16) | 0x40
	}
	u += 0x7fff + (u>>16)&1
	return uint16(u >> 16)
}

func randFP8(r *rand.Rand, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		for {
			v := byte(r.UintN(256))
			if v&0x7f != 0x7f {
				b[i] = v
				break
			}
		}
	}
	return b
}

func randF32(r *rand.Rand, n int, scale float64) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(r.NormFloat64() * scale)
	}
	return x
}

func randBF16(r *rand.Rand, n int, scale float64) []uint16 {
	x := make([]uint16, n)
	for i := range x {
		x[i] = bf16Round(float32(r.NormFloat64() * scale))
	}
	return x
}

// relErr is max|out-ref| / max|ref| over finite references; a NaN or Inf
// in out where ref is finite gives +Inf (unwritten poisoned outputs).
func relErr(out []float32, ref []float64) float64 {
	var maxRef, maxDiff float64
	for i, r := range ref {
		o := float64(out[i])
		if math.IsInf(r, 0) {
			if o != r {
				return math.Inf(1)
			}
			continue
		}
		if math.IsNaN(o) || math.IsInf(o, 0) {
			return math.Inf(1)
		}
		maxRef = math.Max(maxRef, math.Abs(r))
		maxDiff = math.Max(maxDiff, math.Abs(o-r))
	}
	if maxRef == 0 {
		return maxDiff
	}
	return maxDiff / maxRef
}

// refGemv: y[m][n] = sum_k W[n][k] x[m][k] (+resid) with W given by at().
func refGemv(at func(n, k int) float64, x []float32, resid []float32, N, K, M, ldx, ldy int) []float64 {
	y := make([]float64, M*ldy)
	for m := range M {
		for n := range N {
			var s float64
			for k := range K {
				s += at(n, k) * float64(x[m*ldx+k])
			}
			if resid != nil {
				s += float64(resid[m*ldy+n])
			}
			y[m*ldy+n] = s
		}
	}
	return y
}

func refRMSNorm(x, w []float32, rows, D int, eps float64) []float64 {
	y := make([]float64, rows*D)
	for r := range rows {
		var ss float64
		for i := range D {
			v := float64(x[r*D+i])
			ss += v * v
		}
		inv := 1 / math.Sqrt(ss/float64(D)+eps)
		for i := range D {
			y[r*D+i] = float64(x[r*D+i]) * inv * float64(w[i])
		}
	}
	return y
}

func refLayerNorm(x, w, b []float32, rows, D int, eps float64) []float64 {
	y := make([]float64, rows*D)
	for r := range rows {
		var mean, v float64
		for i := range D {
			mean += float64(x[r*D+i])
		}
		mean /= float64(D)
		for i := range D {
			d := float64(x[r*D+i]) - mean
			v += d * d
		}
		inv := 1 / math.Sqrt(v/float64(D)+eps)
		for i := range D {
			o := (float64(x[r*D+i]) - mean) * inv
			if w != nil {
				o *= float64(w[i])
			}
			if b != nil {
				o += float64(b[i])
			}
			y[r*D+i] = o
		}
	}
	return y
}

func refRoPE(x []float32, pos []int32, cosT, sinT []float32, rows, rowsPerTok, ld, off, rot int, interleaved bool) []float64 {
	y := make([]float64, len(x))
	for i, v := range x {
		y[i] = float64(v)
	}
	half := rot / 2
	for r := range rows {
		p := int(pos[r/rowsPerTok])
		for i := range half {
			c, s := float64(cosT[p*half+i]), float64(sinT[p*half+i])
			i0, i1 := off+i, off+i+half
			if interleaved {
				i0, i1 = off+2*i, off+2*i+1
			}
			a, b := float64(x[r*ld+i0]), float64(x[r*ld+i1])
			y[r*ld+i0] = a*c - b*s
			y[r*ld+i1] = b*c + a*s
		}
	}
	return y
}

func sigmoid(x float64) float64 { return 1 / (1 + math.Exp(-x)) }

// refMoERoute returns the chosen experts (selection order), their weights,
// and the smallest gap between a chosen and an unchosen candidate score
// (where a flip under float32 rounding is possible).
func refMoERoute(logits, bias []float32, E, K, ngroup, topkGroup int, norm bool, scale float64) ([]int, []float64, float64) {
	c := make([]float64, E)
	for i := range E {
		c[i] = sigmoid(float64(logits[i]))
		if bias != nil {
			c[i] += float64(bias[i])
		}
	}
	gap := math.Inf(1)
	if ngroup > 1 && topkGroup < ngroup {
		gs := E / ngroup
		gsc := make([]float64, ngroup)
		for g := range ngroup {
			v := append([]float64(nil), c[g*gs:(g+1)*gs]...)
			sort.Sort(sort.Reverse(sort.Float64Slice(v)))
			gsc[g] = v[0]
			if gs >= 2 {
				gsc[g] += v[1]
			}
		}
		order := make([]int, ngroup)
		for i := range order {
			order[i] = i
		}
		sort.SliceStable(order, func(a, b int) bool { return gsc[order[a]] > gsc[order[b]] })
		gap = math.Min(gap, gsc[order[topkGroup-1]]-gsc[order[topkGroup]])
		keep := map[int]bool{}
		for _, g := range order[:topkGroup] {
			keep[g] = true
		}
		for i := range E {
			if !keep[i/gs] {
				c[i] = math.Inf(-1)
			}
		}
	}
	order := make([]int, E)
	for i := range order {
		order[i] = i
	}
	sort.SliceStable(order, func(a, b int) bool { return c[order[a]] > c[order[b]] })
	if K < E && !math.IsInf(c[order[K]], -1) {
		gap = math.Min(gap, c[order[K-1]]-c[order[K]])
	}
	for j := 1; j < K; j++ { // order inside the selection matters too
		gap = math.Min(gap, c[order[j-1]]-c[order[j]])
	}
	idx := order[:K]
	w := make([]float64, K)
	var sum float64
	for j, e := range idx {
		w[j] = sigmoid(float64(logits[e]))
		sum += w[j]
	}
	for j := range w {
		if norm {
			w[j] /= sum + 1e-20
		}
		w[j] *= scale
	}
	return idx, w, gap
}

// refTopK: the K largest of x[0..n) in ascending index order, ties to the
// lower index; n <= K: 0..n-1 then -1.
func refTopK(x []float32, n, K int) []int32 {
	out := make([]int32, K)
	if n <= K {
		for j := range K {
			out[j] = -1
			if j < n {
				out[j] = int32(j)
			}
		}
		return out
	}
	order := make([]int, n)
	for i := range order {
		order[i] = i
	}
	sort.SliceStable(order, func(a, b int) bool { return x[order[a]] > x[order[b]] })
	sel := append([]int(nil), order[:K]...)
	sort.Ints(sel)
	for j, i := range sel {
		out[j] = int32(i)
	}
	return out
}

// mix64 / rngUniform mirror the device RNG in common.cuh.
func mix64(z uint64) uint64 {
	z += 0x9E3779B97F4A7C15
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
	z = (z ^ (z >> 27)) * 0x94D049BB133111EB
	return z ^ (z >> 31)
}

func rngUniform(seed, step, i uint64) float64 {
	h := mix64(seed ^ mix64(step^mix64(i)))
	return (float64(h>>41) + 0.5) / (1 << 23)
}

// refSampleSet returns the survivors of top-k then top-p (ties kept) and the
// probabilities over all n (0 outside the survivors).
func refSampleSet(x []float32, temp float64, topK int, topP, minP float64) []float64 {
	n := len(x)
	thr := math.Inf(-1)
	if topK > 0 && topK < n {
		v := make([]float64, n)
		for i := range v {
			v[i] = float64(x[i])
		}
		sort.Sort(sort.Reverse(sort.Float64Slice(v)))
		thr = v[topK-1]
	}
	mx := math.Inf(-1)
	for _, f := range x {
		mx = math.Max(mx, float64(f))
	}
	p := make([]float64, n)
	var z float64
	for i, f := range x {
		if e := math.Exp((float64(f) - mx) / temp); float64(f) >= thr && (minP <= 0 || e >= minP) {
			p[i] = e
			z += p[i]
		}
	}
	for i := range p {
		p[i] /= z
	}
	if topP < 1 {
		order := make([]int, n)
		for i := range order {
			order[i] = i
		}
		sort.SliceStable(order, func(a, b int) bool { return x[order[a]] > x[order[b]] })
		var cum float64
		cut := math.Inf(-1)
		for _, i := range order {
			if p[i] == 0 {
				break
			}
			cum += p[i]
			if cum >= topP {
				cut = float64(x[i])
				break
			}
		}
		var z2 float64
		for i, f := range x {
			if float64(f) < cut {
				p[i] = 0
			}
			z2 += p[i]
		}
		for i := range p {
			p[i] /= z2
		}
	}
	return p
}

// randFP8Rows is n rows of R fp8 weights with one positive float32 scale per
// 128 columns of a row (the layout of the absorb products' W_UK / W_UV), on
// the device, and the dequantised weight at (row, col) for the references.
func randFP8Rows(r *rand.Rand, a *allocs, n, R int) (cuda.DevPtr, cuda.DevPtr, func(row, col int) float64) {
	rb := (R + 127) / 128
	w, sc := randFP8(r, n*R), randF32(r, n*rb, 0.01)
	for i := range sc {
		sc[i] = float32(math.Abs(float64(sc[i]))) + 1e-3
	}
	return a.up(w), a.up(sc), func(row, col int) float64 {
		return fp8Table[w[row*R+col]] * float64(sc[row*rb+col/128])
	}
}
