package safetensors

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"math"
	"slices"
	"strconv"

	"github.com/cockroachdb/errors"
)

// MaxHeaderSize bounds the JSON header, as the reference implementation does,
// so a corrupt length cannot make us allocate gigabytes.
const MaxHeaderSize = 100 << 20

const metadataKey = "__metadata__"

// Header is a parsed and validated safetensors header.
type Header struct {
	// Tensors sorted by Begin (file order); they tile the data section
	// exactly: contiguous, non-overlapping, ending at the file's end.
	Tensors  []TensorInfo
	Metadata map[string]string
	// DataOffset is the absolute file offset of the data section (8 + header length).
	DataOffset int64
}

type rawTensor struct {
	DType       *string   `json:"dtype"`
	Shape       *[]int64  `json:"shape"`
	DataOffsets *[]uint64 `json:"data_offsets"`
}

// ParseHeader parses buf, which holds the start of a safetensors file of
// fileSize bytes (at least the 8-byte length and the header), and checks
// that the header describes the whole file: known dtypes, byte ranges that
// match the shapes, lie inside the file, do not overlap and leave no gaps.
// Errors do not name the file; callers wrap them with it.
func ParseHeader(buf []byte, fileSize int64) (*Header, error) {
	h, err := parseHeader(buf, fileSize)
	if err != nil && len(errors.GetAllHints(err)) == 0 {
		err = errors.WithHint(err, "the header is corrupt; re-write or re-download the file")
	}
	return h, err
}

func parseHeader(buf []byte, fileSize int64) (*Header, error) {
	if fileSize < 8 || len(buf) < 8 {
		return nil, errors.WithHint(
			errors.Newf("file too short for a safetensors header length (%d bytes)", fileSize),
			"the file is truncated or not a safetensors file")
	}
	n := binary.LittleEndian.Uint64(buf)
	if n > MaxHeaderSize {
		return nil, errors.WithHint(
			errors.Newf("header length %d exceeds the %d byte limit", n, MaxHeaderSize),
			"the file is corrupt or not a safetensors file")
	}
	if int64(n) > fileSize-8 {
		return nil, errors.WithHint(
			errors.Newf("header length %d runs past the end of the %d byte file", n, fileSize),
			"the file is truncated; re-download or re-write it")
	}
	if uint64(len(buf)-8) < n {
		return nil, errors.Newf("header needs %d bytes, only %d given", n, len(buf)-8)
	}
	h := &Header{DataOffset: 8 + int64(n)}
	tensors, meta, err := parseJSON(buf[8 : 8+n])
	if err != nil {
		return nil, err
	}
	h.Metadata = meta
	dataSize := fileSize - h.DataOffset
	for _, t := range tensors {
		if t.Begin > t.End {
			return nil, errors.Newf("tensor %q: data_offsets [%d, %d] begin after end", t.Name, t.Begin, t.End)
		}
		if t.End > dataSize {
			return nil, errors.WithHint(
				errors.Newf("tensor %q: data_offsets [%d, %d] past the end of the %d byte data section",
					t.Name, t.Begin, t.End, dataSize),
				"the file is truncated; re-download or re-write it")
		}
		want, err := checkInfo(t)
		if err != nil {
			return nil, err
		}
		if t.End-t.Begin != want {
			return nil, errors.WithHint(
				errors.Newf("tensor %q: %s %v needs %d bytes but data_offsets [%d, %d] hold %d",
					t.Name, t.DType, t.Shape, want, t.Begin, t.End, t.End-t.Begin),
				"dtype or shape does not match the data; the writer is broken")
		}
	}
	// Zero-length tensors sort before a non-empty one at the same offset.
	slices.SortStableFunc(tensors, func(a, b TensorInfo) int {
		if a.Begin != b.Begin {
			return cmpInt(a.Begin, b.Begin)
		}
		return cmpInt(a.End, b.End)
	})
	var pos int64
	for i, t := range tensors {
		if t.Begin < pos {
			return nil, errors.WithHint(
				errors.Newf("tensor %q: data_offsets [%d, %d] overlap tensor %q ending at %d",
					t.Name, t.Begin, t.End, tensors[i-1].Name, pos),
				"the header is corrupt; re-write the file")
		}
		if t.Begin > pos {
			return nil, errors.WithHint(
				errors.Newf("tensor %q: gap of %d bytes before it (data_offsets [%d, %d], previous end %d)",
					t.Name, t.Begin-pos, t.Begin, t.End, pos),
				"the header is corrupt; re-write the file")
		}
		pos = t.End
	}
	if pos != dataSize { // pos < dataSize: every End was checked against dataSize
		return nil, errors.WithHint(
			errors.Newf("%d trailing bytes after the last tensor (tensors cover %d of %d data bytes)",
				dataSize-pos, pos, dataSize),
			"the file was not written by a safetensors writer or was appended to; re-write it")
	}
	h.Tensors = tensors
	return h, nil
}

func cmpInt(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// parseJSON reads the header object key by key so duplicate names, which a
// map-based decode would silently merge, are rejected.
func parseJSON(js []byte) ([]TensorInfo, map[string]string, error) {
	if len(js) == 0 || js[0] != '{' {
		return nil, nil, errors.WithHint(errors.New("header is not a JSON object"),
			"the file is corrupt or not a safetensors file")
	}
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.UseNumber()
	if _, err := dec.Token(); err != nil {
		return nil, nil, errors.Wrap(err, "header JSON")
	}
	seen := map[string]bool{}
	var tensors []TensorInfo
	var meta map[string]string
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, nil, errors.Wrap(err, "header JSON")
		}
		name, ok := tok.(string)
		if !ok {
			return nil, nil, errors.Newf("header JSON: unexpected token %v", tok)
		}
		if seen[name] {
			return nil, nil, errors.Newf("tensor %q: listed twice in the header", name)
		}
		seen[name] = true
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, nil, errors.Wrapf(err, "header JSON at %q", name)
		}
		if name == metadataKey {
			if err := json.Unmarshal(raw, &meta); err != nil {
				return nil, nil, errors.WithHint(errors.Wrap(err, "header __metadata__"),
					"__metadata__ must map strings to strings")
			}
			continue
		}
		t, err := decodeTensor(name, raw)
		if err != nil {
			return nil, nil, err
		}
		tensors = append(tensors, t)
	}
	if _, err := dec.Token(); err != nil {
		return nil, nil, errors.Wrap(err, "header JSON")
	}
	// Only the space padding writers add may follow the object.
	if rest := js[dec.InputOffset():]; len(bytes.TrimSpace(rest)) != 0 {
		return nil, nil, errors.Newf("header JSON: %d unexpected bytes after the object", len(rest))
	}
	return tensors, meta, nil
}

func decodeTensor(name string, raw json.RawMessage) (TensorInfo, error) {
	var rt rawTensor
	if err := json.Unmarshal(raw, &rt); err != nil {
		return TensorInfo{}, errors.Wrapf(err, "tensor %q: header entry", name)
	}
	if rt.DType == nil || rt.Shape == nil || rt.DataOffsets == nil {
		return TensorInfo{}, errors.Newf("tensor %q: header entry needs dtype, shape and data_offsets", name)
	}
	off := *rt.DataOffsets
	if len(off) != 2 {
		return TensorInfo{}, errors.Newf("tensor %q: data_offsets has %d values, want 2", name, len(off))
	}
	if off[0] > math.MaxInt64 || off[1] > math.MaxInt64 {
		return TensorInfo{}, errors.Newf("tensor %q: data_offsets %v out of range", name, off)
	}
	return TensorInfo{Name: name, DType: DType(*rt.DType), Shape: *rt.Shape,
		Begin: int64(off[0]), End: int64(off[1])}, nil
}

// encodeHeader builds the 8-byte length and the JSON header for tensors in
// the given order, padded with spaces so the data section starts on an
// 8-byte boundary as the reference writer does.
func encodeHeader(tensors []TensorInfo, meta map[string]string) []byte {
	var b bytes.Buffer
	b.Write(make([]byte, 8))
	b.WriteByte('{')
	first := true
	if meta != nil {
		keys := make([]string, 0, len(meta))
		for k := range meta {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		b.WriteString(`"__metadata__":{`)
		for i, k := range keys {
			if i > 0 {
				b.WriteByte(',')
			}
			writeJSONString(&b, k)
			b.WriteByte(':')
			writeJSONString(&b, meta[k])
		}
		b.WriteByte('}')
		first = false
	}
	for _, t := range tensors {
		if !first {
			b.WriteByte(',')
		}
		first = false
		writeJSONString(&b, t.Name)
		b.WriteString(`:{"dtype":`)
		writeJSONString(&b, string(t.DType))
		b.WriteString(`,"shape":[`)
		for i, d := range t.Shape {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString(strconv.FormatInt(d, 10))
		}
		b.WriteString(`],"data_offsets":[`)
		b.WriteString(strconv.FormatInt(t.Begin, 10))
		b.WriteByte(',')
		b.WriteString(strconv.FormatInt(t.End, 10))
		b.WriteString("]}")
	}
	b.WriteByte('}')
	for b.Len()%8 != 0 {
		b.WriteByte(' ')
	}
	out := b.Bytes()
	binary.LittleEndian.PutUint64(out, uint64(len(out)-8))
	return out
}

func writeJSONString(b *bytes.Buffer, s string) {
	enc, _ := json.Marshal(s) // a string always marshals
	b.Write(enc)
}
