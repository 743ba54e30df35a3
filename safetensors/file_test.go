package safetensors

import (
	"bytes"
	"encoding/binary"
	"flag"
	"math"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/tilert-go/tilert/numeric"
)

var update = flag.Bool("update", false, "rewrite golden files under testdata/")

// sampleTensors covers every dtype the checkpoints use, a scalar, an empty
// tensor and odd sizes so padding and offsets are exercised.
func sampleTensors() []Tensor {
	f32 := make([]byte, 4*6)
	numeric.EncodeF32(f32, []float32{1, -2, 3.5, 0, 1e-3, -448})
	bf := make([]byte, 2*5)
	numeric.EncodeBF16(bf, []float32{1, -2, 3.5, 0.125, 65536})
	f16 := make([]byte, 2*3)
	numeric.EncodeF16(f16, []float32{1, -0.5, 1024})
	fp8 := make([]byte, 3*5)
	numeric.EncodeFP8E4M3(fp8, []float32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, -1, -2, 448, 0.5, 0})
	i32 := binary.LittleEndian.AppendUint32(nil, 7)
	i32 = binary.LittleEndian.AppendUint32(i32, math.MaxUint32) // -1
	i64 := binary.LittleEndian.AppendUint64(nil, 1<<40)
	return []Tensor{
		{TensorInfo{Name: "model.layers.0.self_attn.kv_a_proj_with_mqa.weight", DType: F8E4M3, Shape: []int64{3, 5}}, fp8},
		{TensorInfo{Name: "model.layers.0.self_attn.kv_a_proj_with_mqa.weight_scale_inv", DType: F32, Shape: []int64{2, 3}}, f32},
		{TensorInfo{Name: "model.norm.weight", DType: BF16, Shape: []int64{5}}, bf},
		{TensorInfo{Name: "half", DType: F16, Shape: []int64{3}}, f16},
		{TensorInfo{Name: "ids", DType: I32, Shape: []int64{2}}, i32},
		{TensorInfo{Name: "scalar", DType: I64, Shape: []int64{}}, i64},
		{TensorInfo{Name: "empty", DType: F32, Shape: []int64{0, 4}}, nil},
		{TensorInfo{Name: "mask", DType: Bool, Shape: []int64{3}}, []byte{1, 0, 1}},
		{TensorInfo{Name: "bytes", DType: U8, Shape: []int64{1}}, []byte{0xab}},
		{TensorInfo{Name: "signed", DType: I8, Shape: []int64{2}}, []byte{0xff, 0x01}},
	}
}

var sampleMeta = map[string]string{"format": "pt", "producer": "tilert test"}

func TestWriteReadRoundTrip(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "model.safetensors")
	ts := sampleTensors()
	if err := WriteFile(path, ts, sampleMeta); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	golden := filepath.Join("testdata", "sample.safetensors")
	if *update {
		if err := os.WriteFile(golden, raw, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (run go test ./safetensors -update to create it)", err)
	}
	if !bytes.Equal(raw, want) {
		t.Errorf("written file differs from %s (run with -update if the change is intended)", golden)
	}
	hlen := binary.LittleEndian.Uint64(raw)
	if (8+hlen)%8 != 0 {
		t.Errorf("data section starts at %d, not 8-byte aligned", 8+hlen)
	}
	if raw[8+hlen-1] != ' ' && raw[8+hlen-1] != '}' {
		t.Errorf("header ends in %q, want padding spaces or '}'", raw[8+hlen-1])
	}

	f, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if f.Path() != path || f.DataOffset() != int64(8+hlen) {
		t.Errorf("Path %q DataOffset %d", f.Path(), f.DataOffset())
	}
	if got := f.Metadata(); len(got) != 2 || got["format"] != "pt" || got["producer"] != "tilert test" {
		t.Errorf("Metadata = %v", got)
	}
	infos := f.Tensors()
	if len(infos) != len(ts) {
		t.Fatalf("%d tensors, want %d", len(infos), len(ts))
	}
	for i := 1; i < len(infos); i++ {
		if infos[i].Begin < infos[i-1].End {
			t.Errorf("Tensors not in file order at %d", i)
		}
	}
	for _, tt := range ts {
		info, ok := f.Lookup(tt.Info.Name)
		if !ok {
			t.Fatalf("tensor %q missing", tt.Info.Name)
		}
		if info.DType != tt.Info.DType || !slices.Equal(info.Shape, tt.Info.Shape) ||
			info.End-info.Begin != int64(len(tt.Data)) {
			t.Errorf("%q: info %+v", tt.Info.Name, info)
		}
		if info.NumElements()*int64(info.DType.Size()) != info.End-info.Begin {
			t.Errorf("%q: NumElements %d inconsistent", tt.Info.Name, info.NumElements())
		}
		d, err := f.Data(tt.Info.Name)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(d, tt.Data) {
			t.Errorf("%q: data % x, want % x", tt.Info.Name, d, tt.Data)
		}
		if cap(d) != len(d) {
			t.Errorf("%q: view capacity %d exceeds length %d (append would clobber the next tensor)", tt.Info.Name, cap(d), len(d))
		}
	}
	if _, err := f.Data("nope"); err == nil {
		t.Error("Data of a missing tensor: no error")
	} else {
		checkErr(t, err, path, "nope")
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := f.Data("ids"); err == nil {
		t.Error("Data after Close: no error")
	}
}

func TestWriterStreamingAndErrors(t *testing.T) {
	dir := t.TempDir()
	infos := []TensorInfo{
		{Name: "a", DType: BF16, Shape: []int64{4, 3}},
		{Name: "z", DType: F32, Shape: []int64{0}},
		{Name: "b", DType: U8, Shape: []int64{5}},
	}
	path := filepath.Join(dir, "s.safetensors")
	w, err := Create(path, infos, nil)
	if err != nil {
		t.Fatal(err)
	}
	if infos[0].End != 0 {
		t.Error("Create modified the caller's infos")
	}
	if got := w.Infos(); got[2].Begin != 24 || got[2].End != 29 {
		t.Errorf("layout %+v", got)
	}
	checkErr(t, w.WriteTensor("b", make([]byte, 5)), path, `"b"`, `"a"`)
	checkErr(t, w.WriteTensor("a", make([]byte, 23)), path, `"a"`, "24")
	a := bytes.Repeat([]byte{1, 2, 3}, 8)
	for i := 0; i < len(a); i += 5 {
		if err := w.WriteTensorPart("a", a[i:min(i+5, len(a))]); err != nil {
			t.Fatal(err)
		}
	}
	checkErr(t, w.WriteTensorPart("b", make([]byte, 6)), path, `"b"`)
	if err := w.WriteTensor("b", []byte("hello")); err != nil { // skips the empty "z"
		t.Fatal(err)
	}
	checkErr(t, w.WriteTensor("c", nil), path, `"c"`)
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	f, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if d, _ := f.Data("a"); !bytes.Equal(d, a) {
		t.Errorf("a = % x", d)
	}
	if d, _ := f.Data("b"); string(d) != "hello" {
		t.Errorf("b = %q", d)
	}
	if _, ok := f.Lookup("z"); !ok {
		t.Error("empty tensor z missing")
	}
	if f.Metadata() != nil {
		t.Errorf("Metadata = %v, want nil", f.Metadata())
	}

	// Incomplete: Close fails, names the tensor, removes the file.
	p2 := filepath.Join(dir, "incomplete.safetensors")
	w, err = Create(p2, infos, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.WriteTensorPart("a", make([]byte, 10)); err != nil {
		t.Fatal(err)
	}
	checkErr(t, w.Close(), p2, `"a"`, "10 of 24")
	if _, err := os.Stat(p2); !os.IsNotExist(err) {
		t.Errorf("incomplete file left behind: %v", err)
	}
	// Abort removes the file too.
	w, err = Create(p2, infos, nil)
	if err != nil {
		t.Fatal(err)
	}
	w.Abort()
	if _, err := os.Stat(p2); !os.IsNotExist(err) {
		t.Errorf("aborted file left behind: %v", err)
	}
	if err := w.WriteTensor("a", make([]byte, 24)); err == nil {
		t.Error("write after Abort: no error")
	}

	bad := []struct {
		name  string
		infos []TensorInfo
		frag  string
	}{
		{"dup", []TensorInfo{{Name: "x", DType: U8}, {Name: "x", DType: U8}}, `"x"`},
		{"dtype", []TensorInfo{{Name: "x", DType: "F7"}}, `"F7"`},
		{"neg", []TensorInfo{{Name: "x", DType: U8, Shape: []int64{-1}}}, `"x"`},
		{"overflow", []TensorInfo{{Name: "x", DType: F32, Shape: []int64{1 << 40, 1 << 40}}}, `"x"`},
		{"meta name", []TensorInfo{{Name: "__metadata__", DType: U8}}, "__metadata__"},
		{"empty name", []TensorInfo{{Name: "", DType: U8}}, `""`},
	}
	for _, tc := range bad {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Create(filepath.Join(dir, tc.name), tc.infos, nil)
			checkErr(t, err, tc.frag)
		})
	}
	_, err = Create(filepath.Join(dir, "no", "such", "dir.safetensors"), infos, nil)
	checkErr(t, err, "dir.safetensors")
}

func TestOpenBadFiles(t *testing.T) {
	good := `{"w":{"dtype":"BF16","shape":[2,2],"data_offsets":[0,8]}}`
	cases := []struct {
		name  string
		data  []byte
		frags []string // besides the path
	}{
		{"empty file", nil, []string{"too short"}},
		{"short length", []byte{1, 2, 3}, []string{"too short"}},
		{"header length past end", append(binary.LittleEndian.AppendUint64(nil, 1000), good...), []string{"header length 1000"}},
		{"huge header length", binary.LittleEndian.AppendUint64(nil, 1<<62), []string{"exceeds"}},
		{"truncated data", rawFile(good, 5), []string{`"w"`, "past the end"}},
		{"trailing bytes", rawFile(good, 9), []string{"trailing"}},
		{"offsets past end", rawFile(`{"w":{"dtype":"U8","shape":[8],"data_offsets":[4,12]}}`, 8), []string{`"w"`, "past the end"}},
		{"begin after end", rawFile(`{"w":{"dtype":"U8","shape":[0],"data_offsets":[4,2]}}`, 8), []string{`"w"`}},
		{"overlap", rawFile(`{"a":{"dtype":"U8","shape":[6],"data_offsets":[0,6]},"b":{"dtype":"U8","shape":[4],"data_offsets":[4,8]}}`, 8), []string{`"b"`, `"a"`, "overlap"}},
		{"gap", rawFile(`{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"b":{"dtype":"U8","shape":[2],"data_offsets":[6,8]}}`, 8), []string{`"b"`, "gap"}},
		{"wrong shape size", rawFile(`{"w":{"dtype":"BF16","shape":[3,2],"data_offsets":[0,8]}}`, 8), []string{`"w"`, "needs 12 bytes"}},
		{"wrong dtype size", rawFile(`{"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,8]}}`, 8), []string{`"w"`, "needs 16 bytes"}},
		{"unknown dtype", rawFile(`{"w":{"dtype":"Q4","shape":[8],"data_offsets":[0,8]}}`, 8), []string{`"w"`, `"Q4"`}},
		{"negative dim", rawFile(`{"w":{"dtype":"U8","shape":[-8],"data_offsets":[0,8]}}`, 8), []string{`"w"`}},
		{"missing field", rawFile(`{"w":{"dtype":"U8","data_offsets":[0,8]}}`, 8), []string{`"w"`}},
		{"three offsets", rawFile(`{"w":{"dtype":"U8","shape":[8],"data_offsets":[0,8,9]}}`, 8), []string{`"w"`}},
		{"duplicate tensor", rawFile(`{"w":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"w":{"dtype":"U8","shape":[4],"data_offsets":[4,8]}}`, 8), []string{`"w"`, "twice"}},
		{"not json", rawFile(`hello world`, 0), []string{"JSON"}},
		{"json array", rawFile(`[]`, 0), []string{"JSON"}},
		{"garbage after object", rawFile(good+`xx`, 8), []string{"unexpected"}},
		{"metadata not strings", rawFile(`{"__metadata__":{"a":1},"w":{"dtype":"U8","shape":[8],"data_offsets":[0,8]}}`, 8), []string{"__metadata__"}},
		{"float shape", rawFile(`{"w":{"dtype":"U8","shape":[8.5],"data_offsets":[0,8]}}`, 8), []string{`"w"`}},
	}
	dir := t.TempDir()
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := writeRaw(t, dir, "bad"+string(rune('a'+i))+".safetensors", tc.data)
			f, err := Open(p)
			if err == nil {
				f.Close()
			}
			checkErr(t, err, append([]string{p}, tc.frags...)...)
		})
	}
	// The unpadded good header with exactly its data opens.
	p := writeRaw(t, dir, "good.safetensors", rawFile(good, 8))
	f, err := Open(p)
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	_, err = Open(filepath.Join(dir, "missing.safetensors"))
	checkErr(t, err, "missing.safetensors")
	_, err = Open(dir)
	checkErr(t, err, dir)
}
