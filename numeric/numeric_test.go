package numeric

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"testing"
)

// refFP8 decodes a code with integer arithmetic, independent of fp8Decode:
// normal (8+m)*2^(e-10), subnormal m*2^-9.
func refFP8(c byte) float64 {
	e := int(c>>3) & 15
	m := int(c) & 7
	if e == 15 && m == 7 {
		return math.NaN()
	}
	var v float64
	if e == 0 {
		v = math.Ldexp(float64(m), -9)
	} else {
		v = math.Ldexp(float64(8+m), e-10)
	}
	if c&0x80 != 0 {
		v = -v
	}
	return v
}

func TestFP8DecodeAllCodes(t *testing.T) {
	nan := 0
	for c := range 256 {
		got := FP8E4M3ToFloat32(byte(c))
		want := refFP8(byte(c))
		if math.IsNaN(want) {
			nan++
			if !math.IsNaN(float64(got)) {
				t.Errorf("code %#02x: got %v, want NaN", c, got)
			}
			continue
		}
		if float64(got) != want || math.Signbit(float64(got)) != (c&0x80 != 0) {
			t.Errorf("code %#02x: got %v, want %v", c, got, want)
		}
	}
	if nan != 2 {
		t.Errorf("found %d NaN codes, want 2 (0x7f, 0xff)", nan)
	}
	if FP8E4M3ToFloat32(0x7e) != 448 || FP8E4M3ToFloat32(0xfe) != -448 {
		t.Errorf("max code: got %v %v", FP8E4M3ToFloat32(0x7e), FP8E4M3ToFloat32(0xfe))
	}
	if FP8E4M3ToFloat32(0x01) != float32(math.Ldexp(1, -9)) {
		t.Errorf("min subnormal: got %v", FP8E4M3ToFloat32(0x01))
	}
}

func TestFP8RoundTripAllCodes(t *testing.T) {
	for c := range 256 {
		if c&0x7f == 0x7f {
			if got := Float32ToFP8E4M3(FP8E4M3ToFloat32(byte(c))); got != FP8NaN {
				t.Errorf("NaN code %#02x re-encodes to %#02x, want %#02x", c, got, FP8NaN)
			}
			continue
		}
		if got := Float32ToFP8E4M3(FP8E4M3ToFloat32(byte(c))); got != byte(c) {
			t.Errorf("code %#02x -> %v -> %#02x", c, FP8E4M3ToFloat32(byte(c)), got)
		}
	}
}

// refEncodeFP8 finds the nearest finite code by brute force over all codes;
// ties go to the even code (even mantissa), magnitudes past 448 saturate.
func refEncodeFP8(f float32) byte {
	x := float64(f)
	if math.IsNaN(x) {
		return 0x7f
	}
	sign := byte(0)
	if math.Signbit(x) {
		sign = 0x80
		x = -x
	}
	best, bestD := byte(0), math.Inf(1)
	for c := byte(0); c <= 0x7e; c++ {
		d := math.Abs(refFP8(c) - x)
		if d < bestD || (d == bestD && c&1 == 0) {
			best, bestD = c, d
		}
	}
	return sign | best
}

func TestFP8EncodeEdgeCases(t *testing.T) {
	cases := []struct {
		in   float32
		want byte
	}{
		{0, 0x00},
		{float32(math.Copysign(0, -1)), 0x80},
		{1, 0x38},
		{-1, 0xb8},
		{448, 0x7e},
		{449, 0x7e},
		{464, 0x7e}, // tie between 448 and the NaN slot: saturates
		{1e9, 0x7e},
		{-1e9, 0xfe},
		{float32(math.Inf(1)), 0x7e},
		{float32(math.Inf(-1)), 0xfe},
		{float32(math.NaN()), 0x7f},
		{1.0625, 0x38},                           // tie 1 vs 1.125 -> even (1)
		{1.1875, 0x3a},                           // tie 1.125 vs 1.25 -> even (1.25)
		{float32(math.Ldexp(1, -10)), 0x00},      // half of min subnormal -> 0 (even)
		{float32(math.Ldexp(1.0001, -10)), 0x01}, // just above -> min subnormal
		{float32(math.Ldexp(3, -10)), 0x02},      // 1.5 quanta -> 2 (even)
		{float32(math.Ldexp(15, -10)), 0x08},     // 7.5 quanta -> 8 = min normal
		{float32(math.Ldexp(1, -6)), 0x08},
		{float32(math.Ldexp(1, -20)), 0x00},
		{-float32(math.Ldexp(1, -20)), 0x80},
	}
	for _, tc := range cases {
		if got := Float32ToFP8E4M3(tc.in); got != tc.want {
			t.Errorf("Float32ToFP8E4M3(%v) = %#02x, want %#02x", tc.in, got, tc.want)
		}
		if got := refEncodeFP8(tc.in); got != tc.want {
			t.Errorf("reference(%v) = %#02x, want %#02x (test table is wrong)", tc.in, got, tc.want)
		}
	}
}

func TestFP8EncodeMatchesBruteForce(t *testing.T) {
	var vals []float32
	// Every midpoint between neighbouring codes and its float32 neighbours.
	for c := 0; c < 0x7e; c++ {
		mid := float32((refFP8(byte(c)) + refFP8(byte(c+1))) / 2)
		vals = append(vals, mid, math.Nextafter32(mid, 0), math.Nextafter32(mid, 1000))
	}
	r := rand.New(rand.NewPCG(1, 2))
	for range 20000 {
		vals = append(vals, float32(r.NormFloat64()*math.Pow(2, r.Float64()*24-16)))
	}
	for _, v := range vals {
		for _, s := range []float32{1, -1} {
			x := v * s
			if got, want := Float32ToFP8E4M3(x), refEncodeFP8(x); got != want {
				t.Fatalf("Float32ToFP8E4M3(%g) = %#02x, want %#02x", x, got, want)
			}
		}
	}
}

func TestBF16(t *testing.T) {
	cases := []struct {
		name string
		in   uint32 // float32 bits
		want uint16
	}{
		{"one", 0x3f800000, 0x3f80},
		{"tie to even down", 0x3f808000, 0x3f80}, // 1 + 2^-8: halfway, 0x3f80 is even
		{"tie to even up", 0x3f818000, 0x3f82},   // halfway, 0x3f81 odd -> 0x3f82
		{"above tie", 0x3f808001, 0x3f81},
		{"below tie", 0x3f807fff, 0x3f80},
		{"neg tie", 0xbf818000, 0xbf82},
		{"max float -> inf", 0x7f7fffff, 0x7f80},
		{"largest finite bf16", 0x7f7f0000, 0x7f7f},
		{"inf", 0x7f800000, 0x7f80},
		{"-inf", 0xff800000, 0xff80},
		{"nan quiet", 0x7fc00000, 0x7fc0},
		{"nan payload low bits only stays nan", 0x7f800001, 0x7fc0},
		{"neg nan", 0xff800001, 0xffc0},
		{"-0", 0x80000000, 0x8000},
		{"subnormal tie", 0x00008000, 0x0000},
		{"subnormal round up", 0x00018000, 0x0002},
		{"mantissa carry into exponent", 0x3fffffff, 0x4000},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := Float32ToBF16(math.Float32frombits(tc.in))
			if got != tc.want {
				t.Errorf("Float32ToBF16(%#08x) = %#04x, want %#04x", tc.in, got, tc.want)
			}
		})
	}
	// Every bf16 value round-trips through float32.
	for u := range 1 << 16 {
		f := BF16ToFloat32(uint16(u))
		if math.Float32bits(f) != uint32(u)<<16 {
			t.Fatalf("BF16ToFloat32(%#04x) bits = %#08x", u, math.Float32bits(f))
		}
		if f == f && Float32ToBF16(f) != uint16(u) {
			t.Fatalf("bf16 %#04x does not round-trip", u)
		}
	}
}

// refF16 decodes binary16 from its fields with float64 arithmetic.
func refF16(u uint16) float64 {
	e := int(u>>10) & 31
	m := int(u & 0x3ff)
	var v float64
	switch {
	case e == 31 && m == 0:
		v = math.Inf(1)
	case e == 31:
		return math.NaN()
	case e == 0:
		v = math.Ldexp(float64(m), -24)
	default:
		v = math.Ldexp(float64(1024+m), e-25)
	}
	if u&0x8000 != 0 {
		v = -v
	}
	return v
}

func TestF16AllCodes(t *testing.T) {
	for u := range 1 << 16 {
		got := F16ToFloat32(uint16(u))
		want := refF16(uint16(u))
		if math.IsNaN(want) {
			if got == got {
				t.Fatalf("F16ToFloat32(%#04x) = %v, want NaN", u, got)
			}
			if Float32ToF16(got)&0x7c00 != 0x7c00 || Float32ToF16(got)&0x3ff == 0 {
				t.Fatalf("NaN %#04x re-encodes to %#04x", u, Float32ToF16(got))
			}
			continue
		}
		if float64(got) != want || math.Signbit(float64(got)) != (u&0x8000 != 0) {
			t.Fatalf("F16ToFloat32(%#04x) = %v, want %v", u, got, want)
		}
		if back := Float32ToF16(got); back != uint16(u) {
			t.Fatalf("f16 %#04x -> %v -> %#04x", u, got, back)
		}
	}
}

func TestF16EncodeRounding(t *testing.T) {
	cases := []struct {
		in   float32
		want uint16
	}{
		{1 + 1.0/2048, 0x3c00},                // tie -> even
		{1 + 3.0/2048, 0x3c02},                // tie -> even (up)
		{65504, 0x7bff},                       // max
		{65519, 0x7bff},                       // below tie with inf
		{65520, 0x7c00},                       // tie -> inf (even)
		{float32(math.Ldexp(1, -25)), 0x0000}, // half min subnormal -> 0
		{float32(math.Ldexp(3, -25)), 0x0002},
		{float32(math.Ldexp(2047, -25)), 0x0400}, // rounds up into min normal
	}
	for _, tc := range cases {
		if got := Float32ToF16(tc.in); got != tc.want {
			t.Errorf("Float32ToF16(%g) = %#04x, want %#04x", tc.in, got, tc.want)
		}
	}
}

func TestBulkLittleEndian(t *testing.T) {
	src := []float32{1, -2.5, 3.140625, 0, float32(math.Inf(-1))}
	b := make([]byte, 2*len(src))
	EncodeBF16(b, src)
	if binary.LittleEndian.Uint16(b[2:]) != 0xc020 || b[0] != 0x80 || b[1] != 0x3f {
		t.Fatalf("EncodeBF16 bytes % x", b)
	}
	got := make([]float32, len(src))
	DecodeBF16(got, b)
	for i := range src {
		if got[i] != src[i] {
			t.Errorf("bf16 [%d] %v != %v", i, got[i], src[i])
		}
	}
	h := make([]byte, 2*len(src))
	EncodeF16(h, src)
	DecodeF16(got, h)
	for i := range src {
		if got[i] != src[i] {
			t.Errorf("f16 [%d] %v != %v", i, got[i], src[i])
		}
	}
	f := make([]byte, 4*len(src))
	EncodeF32(f, src)
	if binary.LittleEndian.Uint32(f[4:]) != math.Float32bits(-2.5) {
		t.Fatalf("EncodeF32 bytes % x", f)
	}
	DecodeF32(got, f)
	for i := range src {
		if got[i] != src[i] {
			t.Errorf("f32 [%d] %v != %v", i, got[i], src[i])
		}
	}
	q := make([]byte, len(src))
	EncodeFP8E4M3(q, []float32{1, -2.5, 500, 0, float32(math.NaN())})
	want := []byte{0x38, 0xc2, 0x7e, 0x00, 0x7f}
	for i := range q {
		if q[i] != want[i] {
			t.Errorf("fp8 [%d] %#02x != %#02x", i, q[i], want[i])
		}
	}
	DecodeFP8E4M3(got, q)
	if got[0] != 1 || got[1] != -2.5 || got[2] != 448 {
		t.Errorf("DecodeFP8E4M3 = %v", got)
	}
	// Short destinations convert only what fits.
	short := make([]float32, 2)
	DecodeBF16(short, b)
	if short[0] != 1 || short[1] != -2.5 {
		t.Errorf("short decode %v", short)
	}
}

func TestUE8M0Scale(t *testing.T) {
	cases := []struct {
		amax, want float32
	}{
		{448, 1},
		{448 * 1.0000001, 2},
		{447, 1},
		{224, 0.5},
		{225, 1},
		{896, 2},
		{1, float32(math.Ldexp(1, -8))}, // 1/448 in (2^-9, 2^-8]
		{0, 1},
		{-3, 1},
		{float32(math.NaN()), 1},
		{1e-40, float32(math.Ldexp(1, -126))},
		{float32(math.Inf(1)), float32(math.Ldexp(1, 127))},
	}
	for _, tc := range cases {
		got := UE8M0Scale(tc.amax)
		if got != tc.want {
			t.Errorf("UE8M0Scale(%g) = %g, want %g", tc.amax, got, tc.want)
		}
		if tc.amax > 1e-30 && tc.amax < 1e30 {
			if float64(got) < float64(tc.amax)/448 || float64(got)/2 >= float64(tc.amax)/448 {
				t.Errorf("UE8M0Scale(%g) = %g is not the smallest power of two >= amax/448", tc.amax, got)
			}
		}
	}
	r := rand.New(rand.NewPCG(3, 4))
	for range 10000 {
		a := float32(math.Ldexp(r.Float64()+0.5, r.IntN(60)-30))
		s := UE8M0Scale(a)
		fr, _ := math.Frexp(float64(s))
		if fr != 0.5 || float64(s) < float64(a)/448 || float64(s)/2 >= float64(a)/448 {
			t.Fatalf("UE8M0Scale(%g) = %g", a, s)
		}
	}
}
