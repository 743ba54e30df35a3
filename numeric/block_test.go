package numeric

import (
	"math"
	"math/rand/v2"
	"testing"
)

func TestDequantBlockFP8PartialBlocks(t *testing.T) {
	shapes := []struct{ rows, cols int }{
		{1, 1}, {128, 128}, {96, 160}, {576, 200}, {129, 127}, {300, 257}, {0, 5},
	}
	r := rand.New(rand.NewPCG(5, 6))
	for _, sh := range shapes {
		br := (sh.rows + 127) / 128
		bc := (sh.cols + 127) / 128
		w := make([]byte, sh.rows*sh.cols)
		for i := range w {
			w[i] = byte(r.IntN(256))
			if w[i]&0x7f == 0x7f {
				w[i] = 0x42
			}
		}
		scale := make([]float32, br*bc)
		for i := range scale {
			scale[i] = float32(math.Ldexp(1, i%7-3)) * (1 + float32(i)/16)
		}
		dst := make([]float32, sh.rows*sh.cols)
		if err := DequantBlockFP8(dst, w, scale, sh.rows, sh.cols); err != nil {
			t.Fatalf("%dx%d: %v", sh.rows, sh.cols, err)
		}
		for i := range sh.rows {
			for j := range sh.cols {
				want := float32(refFP8(w[i*sh.cols+j])) * scale[(i/128)*bc+j/128]
				if dst[i*sh.cols+j] != want {
					t.Fatalf("%dx%d [%d,%d]: got %v want %v", sh.rows, sh.cols, i, j, dst[i*sh.cols+j], want)
				}
			}
		}
	}
}

func TestDequantBlockFP8Errors(t *testing.T) {
	cases := []struct {
		name       string
		nw, ns, nd int
		rows, cols int
	}{
		{"weight size", 10, 1, 10, 3, 4},
		{"scale size rows", 200 * 10, 1, 2000, 200, 10},
		{"scale size cols", 10 * 200, 1, 2000, 10, 200},
		{"dst short", 12, 1, 11, 3, 4},
		{"negative", 0, 0, 0, -1, 4},
	}
	for _, tc := range cases {
		err := DequantBlockFP8(make([]float32, tc.nd), make([]byte, tc.nw), make([]float32, tc.ns), tc.rows, tc.cols)
		if err == nil {
			t.Errorf("%s: no error", tc.name)
		}
	}
}

func TestQuantBlockFP8(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	for _, sh := range []struct{ rows, cols int }{{96, 160}, {130, 129}, {256, 128}, {5, 3}} {
		w := make([]float32, sh.rows*sh.cols)
		for i := range w {
			w[i] = float32(r.NormFloat64()) * float32(1+i%5)
		}
		// One all-zero block to exercise the amax==0 scale.
		for i := range min(sh.rows, 128) {
			for j := range min(sh.cols, 128) {
				if sh.rows > 128 {
					w[i*sh.cols+j] = 0
				}
			}
		}
		q, s := QuantBlockFP8(w, sh.rows, sh.cols)
		br, bc := BlockGrid(sh.rows, sh.cols)
		if len(s) != br*bc {
			t.Fatalf("scale len %d want %d", len(s), br*bc)
		}
		// Reference per block, computed naively.
		for bi := range br {
			for bj := range bc {
				var amax float32
				for i := bi * 128; i < min(bi*128+128, sh.rows); i++ {
					for j := bj * 128; j < min(bj*128+128, sh.cols); j++ {
						amax = max(amax, float32(math.Abs(float64(w[i*sh.cols+j]))))
					}
				}
				want := amax / 448
				if amax == 0 {
					want = 1
				}
				if s[bi*bc+bj] != want {
					t.Fatalf("scale[%d,%d] = %v want %v", bi, bj, s[bi*bc+bj], want)
				}
			}
		}
		deq := make([]float32, len(w))
		if err := DequantBlockFP8(deq, q, s, sh.rows, sh.cols); err != nil {
			t.Fatal(err)
		}
		for i := range sh.rows {
			for j := range sh.cols {
				k := i*sh.cols + j
				sc := s[(i/128)*bc+j/128]
				if q[k] != refEncodeFP8(w[k]/sc) {
					t.Fatalf("q[%d,%d] = %#02x want %#02x", i, j, q[k], refEncodeFP8(w[k]/sc))
				}
				// e4m3 has 3 mantissa bits: relative error <= 2^-4, absolute
				// error <= half a subnormal quantum in the scaled domain.
				err := math.Abs(float64(deq[k] - w[k]))
				if err > math.Abs(float64(w[k]))/16+float64(sc)*math.Ldexp(1, -10)*1.0001 {
					t.Fatalf("[%d,%d] w=%v deq=%v scale=%v", i, j, w[k], deq[k], sc)
				}
			}
		}
	}
	if err := QuantBlockFP8Into(make([]byte, 4), make([]float32, 2), make([]float32, 4), 2, 2); err == nil {
		t.Error("QuantBlockFP8Into with a wrong scale length: no error")
	}
}

func BenchmarkDecodeBF16(b *testing.B) {
	const n = 1 << 20
	src := make([]byte, 2*n)
	for i := range src {
		src[i] = byte(i * 7)
	}
	dst := make([]float32, n)
	b.SetBytes(2 * n)
	b.ReportAllocs()
	for b.Loop() {
		DecodeBF16(dst, src)
	}
}

func BenchmarkEncodeBF16(b *testing.B) {
	const n = 1 << 20
	src := make([]float32, n)
	for i := range src {
		src[i] = float32(i) * 0.001
	}
	dst := make([]byte, 2*n)
	b.SetBytes(4 * n)
	b.ReportAllocs()
	for b.Loop() {
		EncodeBF16(dst, src)
	}
}

func BenchmarkDecodeFP8E4M3(b *testing.B) {
	const n = 1 << 20
	src := make([]byte, n)
	for i := range src {
		src[i] = byte(i * 13)
	}
	dst := make([]float32, n)
	b.SetBytes(n)
	b.ReportAllocs()
	for b.Loop() {
		DecodeFP8E4M3(dst, src)
	}
}

func BenchmarkEncodeFP8E4M3(b *testing.B) {
	const n = 1 << 20
	r := rand.New(rand.NewPCG(1, 1))
	src := make([]float32, n)
	for i := range src {
		src[i] = float32(r.NormFloat64() * 50)
	}
	dst := make([]byte, n)
	b.SetBytes(4 * n)
	b.ReportAllocs()
	for b.Loop() {
		EncodeFP8E4M3(dst, src)
	}
}

// 7168x2048 is a DeepSeek-V3 expert's down-projection shape transposed-ish;
// the 1000 edge exercises partial blocks.
func BenchmarkDequantBlockFP8(b *testing.B) {
	const rows, cols = 2048, 7000
	w := make([]byte, rows*cols)
	for i := range w {
		w[i] = byte(i*31) & 0x7e
	}
	br, bc := BlockGrid(rows, cols)
	s := make([]float32, br*bc)
	for i := range s {
		s[i] = 0.01
	}
	dst := make([]float32, rows*cols)
	b.SetBytes(rows * cols)
	b.ReportAllocs()
	for b.Loop() {
		if err := DequantBlockFP8(dst, w, s, rows, cols); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkQuantBlockFP8(b *testing.B) {
	const rows, cols = 1024, 1000
	r := rand.New(rand.NewPCG(1, 1))
	w := make([]float32, rows*cols)
	for i := range w {
		w[i] = float32(r.NormFloat64())
	}
	br, bc := BlockGrid(rows, cols)
	q := make([]byte, rows*cols)
	s := make([]float32, br*bc)
	b.SetBytes(4 * rows * cols)
	b.ReportAllocs()
	for b.Loop() {
		if err := QuantBlockFP8Into(q, s, w, rows, cols); err != nil {
			b.Fatal(err)
		}
	}
}
