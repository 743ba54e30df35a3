package numeric

import (
	"github.com/cockroachdb/errors"
)

// FP8BlockSize is the edge of the square blocks that share one scale in
// DeepSeek-style FP8 checkpoints (quantization_config.weight_block_size).
const FP8BlockSize = 128

// BlockGrid returns the shape of the scale tensor for a rows x cols matrix:
// ceil(rows/128) x ceil(cols/128). Partial edge blocks get their own scale.
func BlockGrid(rows, cols int) (br, bc int) {
	return (rows + FP8BlockSize - 1) / FP8BlockSize, (cols + FP8BlockSize - 1) / FP8BlockSize
}

func checkBlockArgs(nw, nscale, rows, cols int) error {
	if rows < 0 || cols < 0 {
		return errors.Newf("numeric: negative matrix shape %dx%d", rows, cols)
	}
	if nw != rows*cols {
		return errors.WithHint(
			errors.Newf("numeric: fp8 weight has %d elements, want %dx%d=%d", nw, rows, cols, rows*cols),
			"check the weight's shape against its byte size")
	}
	br, bc := BlockGrid(rows, cols)
	if nscale != br*bc {
		return errors.WithHint(
			errors.Newf("numeric: block scale has %d elements, want %dx%d=%d for a %dx%d weight",
				nscale, br, bc, br*bc, rows, cols),
			"weight_scale_inv must have shape [ceil(rows/128), ceil(cols/128)]")
	}
	return nil
}

// DequantBlockFP8 computes dst[i*cols+j] = fp8(w[i*cols+j]) * scale[(i/128)*bc + j/128]
// (DeepSeek's formula; rows and columns of partial edge blocks share their
// block's scale). dst must hold rows*cols elements.
func DequantBlockFP8(dst []float32, w []byte, scale []float32, rows, cols int) error {
	if err := checkBlockArgs(len(w), len(scale), rows, cols); err != nil {
		return err
	}
	if len(dst) < rows*cols {
		return errors.Newf("numeric: dequant destination has %d elements, want %d", len(dst), rows*cols)
	}
	_, bc := BlockGrid(rows, cols)
	for i := range rows {
		srow := scale[(i/FP8BlockSize)*bc : (i/FP8BlockSize+1)*bc]
		wr := w[i*cols : (i+1)*cols]
		dr := dst[i*cols : (i+1)*cols]
		for b, s := range srow {
			j0 := b * FP8BlockSize
			j1 := min(j0+FP8BlockSize, cols)
			wb := wr[j0:j1]
			db := dr[j0:j1:j1]
			for k, c := range wb {
				db[k] = fp8LUT[c] * s
			}
		}
	}
	return nil
}

// QuantBlockFP8 quantises a row-major rows x cols matrix into e4m3fn codes
// with one float32 scale per 128x128 block (scale = amax/448, 1 for an
// all-zero block), the inverse of DequantBlockFP8. It panics if len(w) !=
// rows*cols, a programming error.
func QuantBlockFP8(w []float32, rows, cols int) (q []byte, scale []float32) {
	br, bc := BlockGrid(rows, cols)
	q = make([]byte, rows*cols)
	scale = make([]float32, br*bc)
	if err := QuantBlockFP8Into(q, scale, w, rows, cols); err != nil {
		panic(err)
	}
	return q, scale
}

// QuantBlockFP8Into is QuantBlockFP8 writing into caller-owned buffers, so a
// streaming converter can reuse them.
func QuantBlockFP8Into(q []byte, scale []float32, w []float32, rows, cols int) error {
	if err := checkBlockArgs(len(w), len(scale), rows, cols); err != nil {
		return err
	}
	if len(q) < rows*cols {
		return errors.Newf("numeric: quant destination has %d bytes, want %d", len(q), rows*cols)
	}
	br, bc := BlockGrid(rows, cols)
	for bi := range br {
		i0, i1 := bi*FP8BlockSize, min((bi+1)*FP8BlockSize, rows)
		for bj := range bc {
			j0, j1 := bj*FP8BlockSize, min((bj+1)*FP8BlockSize, cols)
			var amax float32
			for i := i0; i < i1; i++ {
				for _, v := range w[i*cols+j0 : i*cols+j1] {
					if v < 0 {
						v = -v
					}
					if v > amax || v != v { // NaN poisons the block like amax() in torch
						amax = v
					}
				}
			}
			s := amax / FP8MaxE4M3
			if amax == 0 {
				s = 1
			}
			scale[bi*bc+bj] = s
			for i := i0; i < i1; i++ {
				src := w[i*cols+j0 : i*cols+j1]
				dst := q[i*cols+j0 : i*cols+j1]
				for k, v := range src {
					// Divide (not multiply by 1/s) to match the reference quantisers bit for bit.
					dst[k] = Float32ToFP8E4M3(v / s)
				}
			}
		}
	}
	return nil
}
