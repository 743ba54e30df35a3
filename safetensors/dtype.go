// Package safetensors reads and writes the safetensors format: an 8-byte
// little-endian header length, a JSON header describing each tensor's dtype,
// shape and byte range, then the raw little-endian tensor data.
//
// Files are memory-mapped so Data returns zero-copy views; checkpoints of
// several shards are opened through their model.safetensors.index.json.
package safetensors

import (
	"math"

	"github.com/cockroachdb/errors"
)

// DType is a safetensors element type, spelled as in the header.
type DType string

// The dtypes DeepSeek-V3.2 and GLM-5 checkpoints and our converted weights use,
// plus the remaining fixed-width types the format defines so any file loads.
const (
	F8E4M3 DType = "F8_E4M3"
	F8E5M2 DType = "F8_E5M2"
	F8E8M0 DType = "F8_E8M0"
	BF16   DType = "BF16"
	F16    DType = "F16"
	F32    DType = "F32"
	F64    DType = "F64"
	I8     DType = "I8"
	I16    DType = "I16"
	I32    DType = "I32"
	I64    DType = "I64"
	U8     DType = "U8"
	U16    DType = "U16"
	U32    DType = "U32"
	U64    DType = "U64"
	Bool   DType = "BOOL"
)

var dtypeSizes = map[DType]int{
	F8E4M3: 1, F8E5M2: 1, F8E8M0: 1, BF16: 2, F16: 2, F32: 4, F64: 8,
	I8: 1, I16: 2, I32: 4, I64: 8, U8: 1, U16: 2, U32: 4, U64: 8, Bool: 1,
}

// Size is the element size in bytes, or 0 for an unknown dtype.
func (d DType) Size() int { return dtypeSizes[d] }

// Valid reports whether d is a dtype this package can read and write.
func (d DType) Valid() bool { return dtypeSizes[d] != 0 }

// TensorInfo describes one tensor. Begin and End are byte offsets relative
// to the start of the data section (after the header), End exclusive.
type TensorInfo struct {
	Name  string
	DType DType
	Shape []int64
	Begin int64
	End   int64
}

// NumElements is the product of the shape (1 for a scalar). It returns -1
// if a dimension is negative or the product overflows int64.
func (t TensorInfo) NumElements() int64 {
	n := int64(1)
	for _, d := range t.Shape {
		if d < 0 {
			return -1
		}
		if d != 0 && n > math.MaxInt64/d {
			return -1
		}
		n *= d
	}
	return n
}

// ByteSize is the number of data bytes the dtype and shape call for, or -1
// if the dtype is unknown or the size overflows.
func (t TensorInfo) ByteSize() int64 {
	n := t.NumElements()
	s := int64(t.DType.Size())
	if n < 0 || s == 0 || (n != 0 && n > math.MaxInt64/s) {
		return -1
	}
	return n * s
}

// checkInfo validates dtype and shape, returning the byte size. Errors name
// the tensor; callers add the file.
func checkInfo(t TensorInfo) (int64, error) {
	if !t.DType.Valid() {
		return 0, errors.WithHint(
			errors.Newf("tensor %q: unknown dtype %q", t.Name, t.DType),
			"supported dtypes: F8_E4M3, F8_E5M2, F8_E8M0, BF16, F16, F32, F64, I8..I64, U8..U64, BOOL")
	}
	for _, d := range t.Shape {
		if d < 0 {
			return 0, errors.WithHint(errors.Newf("tensor %q: negative dimension in shape %v", t.Name, t.Shape),
				"dimensions must be >= 0")
		}
	}
	n := t.ByteSize()
	if n < 0 {
		return 0, errors.WithHint(errors.Newf("tensor %q: shape %v of %s overflows int64 bytes", t.Name, t.Shape, t.DType),
			"the shape is corrupt")
	}
	return n, nil
}
