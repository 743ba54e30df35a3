package safetensors

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

func FuzzParseHeader(f *testing.F) {
	hdr := func(ts []TensorInfo, meta map[string]string) []byte {
		var pos int64
		for i := range ts {
			n := ts[i].ByteSize()
			ts[i].Begin, ts[i].End = pos, pos+n
			pos += n
		}
		return append(encodeHeader(ts, meta), make([]byte, pos)...)
	}
	f.Add(hdr(nil, nil), uint16(0))
	f.Add(hdr([]TensorInfo{{Name: "w", DType: F8E4M3, Shape: []int64{3, 5}}, {Name: "s", DType: F32, Shape: []int64{1, 1}}}, map[string]string{"format": "pt"}), uint16(0))
	f.Add(hdr([]TensorInfo{{Name: "e", DType: BF16, Shape: []int64{0}}, {Name: "x", DType: I64, Shape: []int64{}}}, nil), uint16(0))
	f.Add(hdr([]TensorInfo{{Name: "a\"\\\u00e9", DType: Bool, Shape: []int64{2, 1, 1}}}, map[string]string{"k": "v\n"}), uint16(3))
	f.Add(rawFile(`{"a":{"dtype":"U8","shape":[6],"data_offsets":[0,6]},"b":{"dtype":"U8","shape":[4],"data_offsets":[4,8]}}`, 8), uint16(0))
	f.Add(rawFile(`{"w":{"dtype":"BF16","shape":[2,2],"data_offsets":[0,8]}}`, 8), uint16(0))
	f.Add(rawFile(`{"w":{"dtype":"BF16","shape":[2,2],"data_offsets":[0,8]}}`, 0), uint16(8))
	f.Add(rawFile(`{"__metadata__":null}`, 0), uint16(0))
	f.Add([]byte{}, uint16(0))
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, uint16(1))
	if b, err := os.ReadFile(filepath.Join("testdata", "sample.safetensors")); err == nil {
		f.Add(b, uint16(0))
	}
	f.Fuzz(func(t *testing.T, data []byte, extra uint16) {
		size := int64(len(data)) + int64(extra)
		h, err := ParseHeader(data, size)
		if err != nil {
			return
		}
		if h.DataOffset < 8 || h.DataOffset > size || h.DataOffset > int64(len(data)) {
			t.Fatalf("DataOffset %d outside file of %d (buf %d)", h.DataOffset, size, len(data))
		}
		// Accepted headers must tile the data section exactly.
		var pos int64
		for _, ti := range h.Tensors {
			if ti.Begin != pos || ti.End-ti.Begin != ti.ByteSize() || !ti.DType.Valid() {
				t.Fatalf("tensor %+v does not follow at %d", ti, pos)
			}
			pos = ti.End
		}
		if pos != size-h.DataOffset {
			t.Fatalf("tensors end at %d, data section is %d", pos, size-h.DataOffset)
		}
		// Re-encoding gives a header that parses to the same content.
		enc := encodeHeader(h.Tensors, h.Metadata)
		h2, err := ParseHeader(enc, int64(len(enc))+pos)
		if err != nil {
			t.Fatalf("re-encoded header rejected: %v\n%s", err, enc[8:])
		}
		if len(h2.Tensors) != len(h.Tensors) || len(h2.Metadata) != len(h.Metadata) || (h.Metadata == nil) != (h2.Metadata == nil) {
			t.Fatalf("round trip changed the header: %+v -> %+v", h, h2)
		}
		for i := range h.Tensors {
			a, b := h.Tensors[i], h2.Tensors[i]
			if a.Name != b.Name || a.DType != b.DType || !slices.Equal(a.Shape, b.Shape) || a.Begin != b.Begin || a.End != b.End {
				t.Fatalf("round trip changed tensor %d: %+v -> %+v", i, a, b)
			}
		}
		for k, v := range h.Metadata {
			if h2.Metadata[k] != v {
				t.Fatalf("round trip changed metadata %q: %q -> %q", k, v, h2.Metadata[k])
			}
		}
	})
}
