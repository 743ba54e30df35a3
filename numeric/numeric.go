// Package numeric converts between float32 and the narrow floating-point
// formats found in FP8 checkpoints and vLLM caches: OCP FP8 e4m3fn, bfloat16
// and IEEE half precision, plus 128x128 block-scaled FP8 (de)quantisation.
//
// All byte-level encodings are little-endian, matching safetensors and the
// CUDA devices the engine targets.
package numeric

import (
	"encoding/binary"
	"math"
)

// FP8MaxE4M3 is the largest finite e4m3fn magnitude (1.75 * 2^8).
const FP8MaxE4M3 = 448.0

// FP8NaN is the canonical e4m3fn NaN code produced by Float32ToFP8E4M3.
const FP8NaN byte = 0x7f

// fp8LUT holds the float32 value of every e4m3fn code; decoding is a table
// lookup because checkpoints decode billions of codes.
var fp8LUT = func() (t [256]float32) {
	for c := range 256 {
		t[c] = fp8Decode(byte(c))
	}
	return t
}()

// fp8Decode computes a code's value from its bit fields (1 sign, 4 exponent
// with bias 7, 3 mantissa). e4m3fn has no infinities; S.1111.111 is NaN.
func fp8Decode(b byte) float32 {
	neg := b&0x80 != 0
	e := int(b>>3) & 0xf
	m := int(b & 7)
	var v float32
	switch {
	case e == 0xf && m == 7:
		v = float32(math.NaN())
	case e == 0:
		v = float32(m) / 8 * (1.0 / 64) // subnormal: m/8 * 2^-6
	default:
		v = float32(math.Ldexp(1+float64(m)/8, e-7))
	}
	if neg {
		return -v
	}
	return v
}

// FP8E4M3ToFloat32 decodes one OCP e4m3fn code (exact).
func FP8E4M3ToFloat32(b byte) float32 { return fp8LUT[b] }

// Float32ToFP8E4M3 encodes f as e4m3fn with round-to-nearest-even. Values
// beyond +-448 (including infinities) saturate to +-448, as DeepSeek's
// quantisers clamp before casting; NaN becomes 0x7f.
func Float32ToFP8E4M3(f float32) byte {
	bits := math.Float32bits(f)
	sign := byte(bits>>24) & 0x80
	abs := bits & 0x7fffffff
	switch {
	case abs > 0x7f800000:
		return FP8NaN
	case abs >= 0x43e00000: // >= 448
		return sign | 0x7e
	case abs < 0x3c800000: // < 2^-6: subnormal range, quantum 2^-9
		// Scaling by 2^9 is exact, so this rounds the true value. A result
		// of 8 is the smallest normal, whose code is also 8.
		q := math.RoundToEven(float64(math.Float32frombits(abs)) * 512)
		return sign | byte(q)
	}
	// Normal: keep 3 of the 23 mantissa bits, rounding half to even; a carry
	// out of the mantissa correctly bumps the exponent.
	abs += 0x7ffff + (abs>>20)&1
	// Inputs below 448 round to at most 448 (code 0x7e), so no clamp is needed.
	return sign | byte(abs>>20-(127-7)<<3)
}

// BF16ToFloat32 widens a bfloat16 (exact).
func BF16ToFloat32(u uint16) float32 { return math.Float32frombits(uint32(u) << 16) }

// Float32ToBF16 narrows f to bfloat16 with round-to-nearest-even; overflow
// rounds to infinity as in IEEE, NaN stays a quiet NaN with its sign.
func Float32ToBF16(f float32) uint16 {
	bits := math.Float32bits(f)
	if bits&0x7fffffff > 0x7f800000 {
		return uint16(bits>>16) | 0x0040
	}
	bits += 0x7fff + (bits>>16)&1
	return uint16(bits >> 16)
}

// F16ToFloat32 widens an IEEE binary16 value (exact).
func F16ToFloat32(u uint16) float32 {
	sign := uint32(u&0x8000) << 16
	e := uint32(u>>10) & 0x1f
	m := uint32(u & 0x3ff)
	switch {
	case e == 0x1f: // inf / NaN
		return math.Float32frombits(sign | 0x7f800000 | m<<13)
	case e == 0:
		if m == 0 {
			return math.Float32frombits(sign)
		}
		v := float32(m) * (1.0 / (1 << 24)) // subnormal: m * 2^-24, exact
		if sign != 0 {
			return -v
		}
		return v
	}
	return math.Float32frombits(sign | (e+127-15)<<23 | m<<13)
}

// Float32ToF16 narrows f to IEEE binary16 with round-to-nearest-even.
func Float32ToF16(f float32) uint16 {
	bits := math.Float32bits(f)
	sign := uint16(bits>>16) & 0x8000
	abs := bits & 0x7fffffff
	switch {
	case abs > 0x7f800000:
		return sign | 0x7e00 | uint16(abs>>13)&0x3ff
	case abs >= 0x477ff000: // rounds to >= 65520 -> inf
		return sign | 0x7c00
	case abs < 0x38800000: // < 2^-14: subnormal, quantum 2^-24
		q := math.RoundToEven(float64(math.Float32frombits(abs)) * (1 << 24))
		return sign | uint16(q)
	}
	abs += 0xfff + (abs>>13)&1
	return sign | uint16(abs>>13-(127-15)<<10)
}

// DecodeBF16 widens little-endian bfloat16 values; it converts
// min(len(dst), len(src)/2) elements.
func DecodeBF16(dst []float32, src []byte) {
	n := min(len(dst), len(src)/2)
	src = src[:2*n]
	for i := range dst[:n] {
		dst[i] = math.Float32frombits(uint32(binary.LittleEndian.Uint16(src[2*i:])) << 16)
	}
}

// EncodeBF16 narrows src to little-endian bfloat16 (RNE); it converts
// min(len(src), len(dst)/2) elements.
func EncodeBF16(dst []byte, src []float32) {
	n := min(len(src), len(dst)/2)
	dst = dst[:2*n]
	for i, f := range src[:n] {
		binary.LittleEndian.PutUint16(dst[2*i:], Float32ToBF16(f))
	}
}

// DecodeF16 widens little-endian binary16 values; it converts
// min(len(dst), len(src)/2) elements.
func DecodeF16(dst []float32, src []byte) {
	n := min(len(dst), len(src)/2)
	src = src[:2*n]
	for i := range dst[:n] {
		dst[i] = F16ToFloat32(binary.LittleEndian.Uint16(src[2*i:]))
	}
}

// EncodeF16 narrows src to little-endian binary16 (RNE); it converts
// min(len(src), len(dst)/2) elements.
func EncodeF16(dst []byte, src []float32) {
	n := min(len(src), len(dst)/2)
	dst = dst[:2*n]
	for i, f := range src[:n] {
		binary.LittleEndian.PutUint16(dst[2*i:], Float32ToF16(f))
	}
}

// DecodeF32 reads little-endian float32 values; it converts
// min(len(dst), len(src)/4) elements.
func DecodeF32(dst []float32, src []byte) {
	n := min(len(dst), len(src)/4)
	src = src[:4*n]
	for i := range dst[:n] {
		dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(src[4*i:]))
	}
}

// EncodeF32 writes little-endian float32 values; it converts
// min(len(src), len(dst)/4) elements.
func EncodeF32(dst []byte, src []float32) {
	n := min(len(src), len(dst)/4)
	dst = dst[:4*n]
	for i, f := range src[:n] {
		binary.LittleEndian.PutUint32(dst[4*i:], math.Float32bits(f))
	}
}

// DecodeFP8E4M3 widens e4m3fn codes; it converts min(len(dst), len(src)).
func DecodeFP8E4M3(dst []float32, src []byte) {
	n := min(len(dst), len(src))
	src = src[:n]
	for i := range dst[:n] {
		dst[i] = fp8LUT[src[i]]
	}
}

// EncodeFP8E4M3 narrows src to e4m3fn codes (RNE, saturating); it converts
// min(len(dst), len(src)).
func EncodeFP8E4M3(dst []byte, src []float32) {
	n := min(len(dst), len(src))
	dst = dst[:n]
	for i, f := range src[:n] {
		dst[i] = Float32ToFP8E4M3(f)
	}
}

// UE8M0Scale returns the smallest power of two s with s >= amax/448, the
// exponent-only scale vLLM's indexer cache and DeepGEMM use. Non-positive
// or NaN amax gives 1 (nothing to scale); the result is clamped to the
// normal float32 range.
func UE8M0Scale(amax float32) float32 {
	if !(amax > 0) {
		return 1
	}
	if math.IsInf(float64(amax), 1) {
		return math.Float32frombits(0x7f000000) // 2^127
	}
	// amax/448 computed in float64 is exact enough: the quotient's float64
	// rounding cannot cross a power of two that the exact quotient does not.
	r := float64(amax) / FP8MaxE4M3
	frac, exp := math.Frexp(r) // r = frac * 2^exp, frac in [0.5, 1)
	if frac == 0.5 {
		exp-- // r is already a power of two
	}
	exp = max(min(exp, 127), -126)
	return float32(math.Ldexp(1, exp))
}
