package safetensors

import (
	"encoding/binary"
	"encoding/json"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"

	"github.com/tilert-go/tilert/numeric"
)

// pythonWithSafetensors returns an interpreter that has torch and
// safetensors (TILERT_PYTHON or /work/pyenv), or skips: CI has neither.
func pythonWithSafetensors(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("-short: skipping the Python interop test")
	}
	py := os.Getenv("TILERT_PYTHON")
	if py == "" {
		py = "/work/pyenv/bin/python"
	}
	if _, err := os.Stat(py); err != nil {
		t.Skipf("no Python with safetensors at %s (set TILERT_PYTHON)", py)
	}
	if out, err := exec.Command(py, "-c", "import torch, safetensors").CombinedOutput(); err != nil {
		t.Skipf("%s lacks torch/safetensors: %v %s", py, err, out)
	}
	return py
}

// pyDump loads a file with the reference library and prints, per tensor,
// its dtype, shape and values widened to float64 (the check needs no more).
const pyDump = `
import json, sys
from safetensors import safe_open
from safetensors.torch import load_file
t = load_file(sys.argv[1])
with safe_open(sys.argv[1], "pt") as f:
    meta = f.metadata()
out = {"__metadata__": meta, "tensors": {}}
for k, v in t.items():
    out["tensors"][k] = {"dtype": str(v.dtype), "shape": list(v.shape), "values": v.double().flatten().tolist()}
print(json.dumps(out))
`

// pyWrite saves tensors with the reference library (header layout and
// ordering are its own) and prints their values.
const pyWrite = `
import json, sys, torch
from safetensors.torch import save_file
g = torch.Generator().manual_seed(0)
t = {
  "w.fp8": (torch.randn(130, 7, generator=g) * 40).to(torch.float8_e4m3fn),
  "w.bf16": torch.randn(3, 5, generator=g).to(torch.bfloat16),
  "w.f16": torch.randn(4, generator=g).to(torch.float16),
  "w.f32": torch.randn(2, 2, generator=g),
  "i.i32": torch.tensor([1, -2, 3], dtype=torch.int32),
  "i.i64": torch.tensor([[1 << 40]], dtype=torch.int64),
  "b.bool": torch.tensor([True, False, True]),
  "u.u8": torch.tensor([0, 255], dtype=torch.uint8),
  "s.i8": torch.tensor([-128, 127], dtype=torch.int8),
  "scalar": torch.tensor(2.5),
}
save_file(t, sys.argv[1], metadata={"format": "pt"})
print(json.dumps({k: v.double().flatten().tolist() for k, v in t.items()}))
`

// decodeF64 widens raw little-endian tensor bytes with our own decoders.
func decodeF64(t *testing.T, dt DType, b []byte) []float64 {
	t.Helper()
	var out []float64
	switch dt {
	case F8E4M3:
		for _, c := range b {
			out = append(out, float64(numeric.FP8E4M3ToFloat32(c)))
		}
	case BF16:
		for i := 0; i < len(b); i += 2 {
			out = append(out, float64(numeric.BF16ToFloat32(binary.LittleEndian.Uint16(b[i:]))))
		}
	case F16:
		for i := 0; i < len(b); i += 2 {
			out = append(out, float64(numeric.F16ToFloat32(binary.LittleEndian.Uint16(b[i:]))))
		}
	case F32:
		for i := 0; i < len(b); i += 4 {
			out = append(out, float64(math.Float32frombits(binary.LittleEndian.Uint32(b[i:]))))
		}
	case I32:
		for i := 0; i < len(b); i += 4 {
			out = append(out, float64(int32(binary.LittleEndian.Uint32(b[i:]))))
		}
	case I64:
		for i := 0; i < len(b); i += 8 {
			out = append(out, float64(int64(binary.LittleEndian.Uint64(b[i:]))))
		}
	case U8, Bool:
		for _, c := range b {
			out = append(out, float64(c))
		}
	case I8:
		for _, c := range b {
			out = append(out, float64(int8(c)))
		}
	default:
		t.Fatalf("no decoder for %s", dt)
	}
	return out
}

var torchDType = map[DType]string{
	F8E4M3: "torch.float8_e4m3fn", BF16: "torch.bfloat16", F16: "torch.float16", F32: "torch.float32",
	I32: "torch.int32", I64: "torch.int64", U8: "torch.uint8", I8: "torch.int8", Bool: "torch.bool",
}

func TestPythonLoadsOurFiles(t *testing.T) {
	py := pythonWithSafetensors(t)
	path := filepath.Join(t.TempDir(), "go.safetensors")
	ts := sampleTensors()
	if err := WriteFile(path, ts, sampleMeta); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(py, "-c", pyDump, path).Output()
	if err != nil {
		t.Fatalf("python failed to load our file: %v\n%s", err, exitStderr(err))
	}
	var got struct {
		Meta    map[string]string `json:"__metadata__"`
		Tensors map[string]struct {
			DType  string    `json:"dtype"`
			Shape  []int64   `json:"shape"`
			Values []float64 `json:"values"`
		} `json:"tensors"`
	}
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if got.Meta["format"] != "pt" || got.Meta["producer"] != "tilert test" {
		t.Errorf("python sees metadata %v", got.Meta)
	}
	if len(got.Tensors) != len(ts) {
		t.Errorf("python sees %d tensors, want %d", len(got.Tensors), len(ts))
	}
	for _, tt := range ts {
		p, ok := got.Tensors[tt.Info.Name]
		if !ok {
			t.Errorf("python lacks %q", tt.Info.Name)
			continue
		}
		if p.DType != torchDType[tt.Info.DType] || !slices.Equal(p.Shape, tt.Info.Shape) {
			t.Errorf("%q: python sees %s %v, want %s %v", tt.Info.Name, p.DType, p.Shape, tt.Info.DType, tt.Info.Shape)
		}
		want := decodeF64(t, tt.Info.DType, tt.Data)
		if !slices.Equal(p.Values, want) && !(len(p.Values) == 0 && len(want) == 0) {
			t.Errorf("%q: python values %v, want %v", tt.Info.Name, p.Values, want)
		}
	}
}

func TestWeLoadPythonFiles(t *testing.T) {
	py := pythonWithSafetensors(t)
	dir := t.TempDir()
	path := filepath.Join(dir, "model.safetensors")
	out, err := exec.Command(py, "-c", pyWrite, path).Output()
	if err != nil {
		t.Fatalf("python: %v\n%s", err, exitStderr(err))
	}
	var want map[string][]float64
	if err := json.Unmarshal(out, &want); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	c, err := OpenDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if len(c.Names()) != len(want) {
		t.Errorf("names %v, want %d tensors", c.Names(), len(want))
	}
	f := c.Files()[0]
	if f.Metadata()["format"] != "pt" {
		t.Errorf("metadata %v", f.Metadata())
	}
	for name, w := range want {
		info, _, ok := c.Lookup(name)
		if !ok {
			t.Errorf("missing %q", name)
			continue
		}
		d, err := c.Data(name)
		if err != nil {
			t.Fatal(err)
		}
		if got := decodeF64(t, info.DType, d); !slices.Equal(got, w) {
			t.Errorf("%q (%s %v): got %v, want %v", name, info.DType, info.Shape, got, w)
		}
	}
	if info, _, _ := c.Lookup("w.fp8"); info.DType != F8E4M3 || !slices.Equal(info.Shape, []int64{130, 7}) {
		t.Errorf("w.fp8 info %+v", info)
	}
}

func exitStderr(err error) string {
	if ee, ok := err.(*exec.ExitError); ok {
		return string(ee.Stderr)
	}
	return ""
}
