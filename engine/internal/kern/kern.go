// Package kern holds the float32 building blocks of the CPU engine. Every
// function computes each output element with one fixed loop, independent of
// how many rows are processed together or how the work is split across
// goroutines, so a batched forward is bit-identical to a sequential one (the
// engine relies on this for "greedy with MTP == greedy without").
package kern

import (
	"math"
	"runtime"
	"sync"
)

// Workers is the number of goroutines used by the parallel kernels.
var Workers = runtime.GOMAXPROCS(0)

// minParallelWork is the number of multiply-adds below which splitting work
// across goroutines costs more than it saves.
const minParallelWork = 1 << 15

// ParallelFor runs fn over [0,n) in contiguous chunks. work is the estimated
// cost per index (multiply-adds); small jobs run inline.
func ParallelFor(n, work int, fn func(lo, hi int)) {
	w := Workers
	if w <= 1 || n < 2 || n*work < minParallelWork {
		fn(0, n)
		return
	}
	if w > n {
		w = n
	}
	var wg sync.WaitGroup
	chunk := (n + w - 1) / w
	for lo := 0; lo < n; lo += chunk {
		hi := min(lo+chunk, n)
		wg.Add(1)
		go func(lo, hi int) {
			defer wg.Done()
			fn(lo, hi)
		}(lo, hi)
	}
	wg.Wait()
}

// Dot returns sum(a[i]*b[i]) with four independent accumulators (better
// rounding and pipelining than a single running sum).
func Dot(a, b []float32) float32 {
	n := len(a)
	b = b[:n]
	var s0, s1, s2, s3 float32
	i := 0
	for ; i+4 <= n; i += 4 {
		s0 += a[i] * b[i]
		s1 += a[i+1] * b[i+1]
		s2 += a[i+2] * b[i+2]
		s3 += a[i+3] * b[i+3]
	}
	for ; i < n; i++ {
		s0 += a[i] * b[i]
	}
	return (s0 + s1) + (s2 + s3)
}

// Axpy does y += a*x.
func Axpy(y []float32, a float32, x []float32) {
	x = x[:len(y)]
	for i := range y {
		y[i] += a * x[i]
	}
}

// MatMul computes out[m][n] = dot(x[m], w[n]) for x (M x K) and w (N x K),
// both row-major: the nn.Linear convention y = x W^T. out is M x N.
func MatMul(out, x, w []float32, M, N, K int) {
	if len(x) < M*K || len(w) < N*K || len(out) < M*N {
		panic("kern.MatMul: short buffer")
	}
	ParallelFor(N, M*K, func(lo, hi int) {
		for n := lo; n < hi; n++ {
			wr := w[n*K : n*K+K]
			for m := 0; m < M; m++ {
				out[m*N+n] = Dot(x[m*K:m*K+K], wr)
			}
		}
	})
}

// MatVec is MatMul with one row.
func MatVec(out, w, x []float32, N, K int) { MatMul(out, x, w, 1, N, K) }

// RMSNorm writes x / sqrt(mean(x^2)+eps) * w into out (out may alias x). The
// mean of squares is accumulated in float64 so the result does not depend on
// summation order in any meaningful way.
func RMSNorm(out, x, w []float32, eps float64) {
	var ss float64
	for _, v := range x {
		ss += float64(v) * float64(v)
	}
	r := float32(1 / math.Sqrt(ss/float64(len(x))+eps))
	for i, v := range x {
		out[i] = w[i] * (v * r)
	}
}

// LayerNorm writes (x-mean)/sqrt(var+eps)*w + b (biased variance, as torch).
func LayerNorm(out, x, w, b []float32, eps float64) {
	var s float64
	for _, v := range x {
		s += float64(v)
	}
	mean := s / float64(len(x))
	var vs float64
	for _, v := range x {
		d := float64(v) - mean
		vs += d * d
	}
	r := 1 / math.Sqrt(vs/float64(len(x))+eps)
	for i, v := range x {
		out[i] = float32((float64(v)-mean)*r)*w[i] + b[i]
	}
}

// SiLUMul writes silu(g)*u into out.
func SiLUMul(out, g, u []float32) {
	for i, v := range g {
		out[i] = v / (1 + float32(math.Exp(float64(-v)))) * u[i]
	}
}

// Sigmoid in float32 as torch computes it.
func Sigmoid(x float32) float32 { return float32(1 / (1 + math.Exp(float64(-x)))) }

// Softmax in place (max-subtracted, float64 normaliser).
func Softmax(x []float32) {
	if len(x) == 0 {
		return
	}
	mx := x[0]
	for _, v := range x[1:] {
		if v > mx {
			mx = v
		}
	}
	var s float64
	for i, v := range x {
		e := math.Exp(float64(v - mx))
		x[i] = float32(e)
		s += e
	}
	inv := 1 / s
	for i := range x {
		x[i] = float32(float64(x[i]) * inv)
	}
}

// Add does y += x.
func Add(y, x []float32) {
	x = x[:len(y)]
	for i := range y {
		y[i] += x[i]
	}
}

// Scale does x *= a.
func Scale(x []float32, a float32) {
	for i := range x {
		x[i] *= a
	}
}
