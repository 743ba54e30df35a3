package kern

import (
	"math"
	"math/rand/v2"
	"sort"
	"testing"
)

func randVec(r *rand.Rand, n int) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(r.NormFloat64())
	}
	return v
}

func relErr(got []float32, want []float64) float64 {
	var num, den float64
	for i := range want {
		num = math.Max(num, math.Abs(float64(got[i])-want[i]))
		den = math.Max(den, math.Abs(want[i]))
	}
	return num / math.Max(den, 1e-30)
}

func TestMatMul(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, tc := range []struct{ M, N, K int }{{1, 1, 1}, {1, 7, 13}, {2, 300, 129}, {5, 64, 512}, {3, 1000, 96}} {
		x, w := randVec(r, tc.M*tc.K), randVec(r, tc.N*tc.K)
		out := make([]float32, tc.M*tc.N)
		MatMul(out, x, w, tc.M, tc.N, tc.K)
		want := make([]float64, tc.M*tc.N)
		for m := 0; m < tc.M; m++ {
			for n := 0; n < tc.N; n++ {
				var s float64
				for k := 0; k < tc.K; k++ {
					s += float64(x[m*tc.K+k]) * float64(w[n*tc.K+k])
				}
				want[m*tc.N+n] = s
			}
		}
		if e := relErr(out, want); e > 1e-5 {
			t.Errorf("%+v: rel err %g", tc, e)
		}
		// batched rows must be bit-identical to one-row calls
		for m := 0; m < tc.M; m++ {
			one := make([]float32, tc.N)
			MatVec(one, w, x[m*tc.K:(m+1)*tc.K], tc.N, tc.K)
			for n := range one {
				if one[n] != out[m*tc.N+n] {
					t.Fatalf("%+v: row %d not bit-identical to MatVec", tc, m)
				}
			}
		}
	}
}

func TestNorms(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for _, n := range []int{1, 8, 128, 513} {
		x, w, b := randVec(r, n), randVec(r, n), randVec(r, n)
		out := make([]float32, n)
		RMSNorm(out, x, w, 1e-6)
		var ss float64
		for _, v := range x {
			ss += float64(v) * float64(v)
		}
		rr := 1 / math.Sqrt(ss/float64(n)+1e-6)
		want := make([]float64, n)
		for i := range x {
			want[i] = float64(w[i]) * float64(x[i]) * rr
		}
		if e := relErr(out, want); e > 1e-6 {
			t.Errorf("rmsnorm n=%d err %g", n, e)
		}
		LayerNorm(out, x, w, b, 1e-6)
		var mean float64
		for _, v := range x {
			mean += float64(v)
		}
		mean /= float64(n)
		var vr float64
		for _, v := range x {
			vr += (float64(v) - mean) * (float64(v) - mean)
		}
		vr /= float64(n)
		for i := range x {
			want[i] = (float64(x[i])-mean)/math.Sqrt(vr+1e-6)*float64(w[i]) + float64(b[i])
		}
		if e := relErr(out, want); e > 1e-5 {
			t.Errorf("layernorm n=%d err %g", n, e)
		}
	}
}

func TestSoftmaxSiLU(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	x := randVec(r, 100)
	for i := range x {
		x[i] *= 10
	}
	y := append([]float32(nil), x...)
	Softmax(y)
	var z float64
	mx := math.Inf(-1)
	for _, v := range x {
		mx = math.Max(mx, float64(v))
	}
	for _, v := range x {
		z += math.Exp(float64(v) - mx)
	}
	want := make([]float64, len(x))
	for i, v := range x {
		want[i] = math.Exp(float64(v)-mx) / z
	}
	if e := relErr(y, want); e > 1e-6 {
		t.Errorf("softmax err %g", e)
	}
	g, u := randVec(r, 50), randVec(r, 50)
	out := make([]float32, 50)
	SiLUMul(out, g, u)
	for i := range g {
		want[i] = float64(g[i]) / (1 + math.Exp(-float64(g[i]))) * float64(u[i])
	}
	if e := relErr(out, want[:50]); e > 1e-6 {
		t.Errorf("silu err %g", e)
	}
}

func TestRope(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	for _, p := range []RopeParams{
		{Theta: 10000},
		{Type: "yarn", Theta: 10000, Factor: 40, OriginalMaxPosition: 4096, BetaFast: 32, BetaSlow: 1, MScale: 1, MScaleAllDim: 1},
		{Type: "yarn", Theta: 10000, Factor: 4, OriginalMaxPosition: 256},
	} {
		rp := NewRope(64, p)
		cos, sin := make([]float32, 32), make([]float32, 32)
		for _, pos := range []int{0, 1, 17, 1000} {
			rp.CosSin(pos, cos, sin)
			x := randVec(r, 64)
			// reference: complex multiplication per pair in float64
			inter := append([]float32(nil), x...)
			ApplyInterleaved(inter, cos, sin)
			half := append([]float32(nil), x...)
			ApplyHalf(half, cos, sin)
			wi, wh := make([]float64, 64), make([]float64, 64)
			for i := 0; i < 32; i++ {
				a := float64(rp.InvFreq[i]) * float64(pos)
				c, s := math.Cos(a)*float64(rp.Scale), math.Sin(a)*float64(rp.Scale)
				wi[2*i] = float64(x[2*i])*c - float64(x[2*i+1])*s
				wi[2*i+1] = float64(x[2*i+1])*c + float64(x[2*i])*s
				wh[i] = float64(x[i])*c - float64(x[i+32])*s
				wh[i+32] = float64(x[i+32])*c + float64(x[i])*s
			}
			if e := relErr(inter, wi); e > 1e-4 {
				t.Errorf("interleaved %+v pos %d err %g", p, pos, e)
			}
			if e := relErr(half, wh); e > 1e-4 {
				t.Errorf("half %+v pos %d err %g", p, pos, e)
			}
		}
	}
	// YaRN: the highest frequency is pure extrapolation, the lowest pure interpolation.
	y := NewRope(64, RopeParams{Type: "yarn", Theta: 10000, Factor: 40, OriginalMaxPosition: 4096})
	d := NewRope(64, RopeParams{Theta: 10000})
	if y.InvFreq[0] != d.InvFreq[0] || math.Abs(float64(y.InvFreq[31]*40/d.InvFreq[31])-1) > 1e-6 {
		t.Errorf("yarn ramp ends wrong: %v vs %v", y.InvFreq, d.InvFreq)
	}
	if math.Abs(float64(y.Scale)-(0.1*math.Log(40)+1)) > 1e-6 {
		t.Errorf("yarn attention factor %v", y.Scale)
	}
}

func TestTopK(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 10))
	for _, n := range []int{1, 5, 100, 1000} {
		for _, k := range []int{1, 3, 8, 64, 2000} {
			s := randVec(r, n)
			s[0] = s[n-1] // a tie
			got := TopK(s, k)
			idx := make([]int, n)
			for i := range idx {
				idx[i] = i
			}
			sort.SliceStable(idx, func(a, b int) bool { return s[idx[a]] > s[idx[b]] })
			want := idx[:min(k, n)]
			if len(got) != len(want) {
				t.Fatalf("n=%d k=%d len %d", n, k, len(got))
			}
			for i := range want {
				if got[i] != want[i] {
					t.Fatalf("n=%d k=%d: %v vs %v", n, k, got, want)
				}
			}
		}
	}
}

func BenchmarkMatVec(b *testing.B) {
	r := rand.New(rand.NewPCG(1, 1))
	w, x := randVec(r, 1024*1024), randVec(r, 1024)
	out := make([]float32, 1024)
	b.ReportAllocs()
	for b.Loop() {
		MatVec(out, w, x, 1024, 1024)
	}
}
