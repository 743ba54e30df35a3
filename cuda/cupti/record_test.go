package cupti

import (
	"encoding/binary"
	"runtime"
	"strings"
	"testing"
	"unsafe"
)

// kernelBytes lays r out as a CUpti_ActivityKernel10 record at the offsets
// of record.go, written field by field here so an offset typo there fails.
// name must stay alive while the record is read.
func kernelBytes(r KernelRecord, name []byte) []byte {
	b := make([]byte, kernel10Size)
	le := binary.LittleEndian
	le.PutUint32(b[0:], kindConcurrentKernel)
	le.PutUint64(b[16:], r.Start)
	le.PutUint64(b[24:], r.End)
	le.PutUint64(b[32:], r.End+5) // completed: not read
	le.PutUint32(b[40:], r.Device)
	le.PutUint32(b[44:], r.Context)
	le.PutUint32(b[48:], r.Stream)
	for i := range 3 {
		le.PutUint32(b[52+4*i:], uint32(r.Grid[i]))
		le.PutUint32(b[64+4*i:], uint32(r.Block[i]))
	}
	le.PutUint32(b[76:], 0xdead) // staticSharedMemory: not read
	le.PutUint32(b[92:], r.Correlation)
	le.PutUint64(b[96:], 0xbeef) // gridId: not read
	if name != nil {
		*(**byte)(unsafe.Pointer(&b[104])) = &name[0]
	}
	le.PutUint64(b[144:], r.GraphNodeID)
	le.PutUint32(b[156:], r.GraphID)
	return b
}

func sampleRecord() KernelRecord {
	return KernelRecord{Name: "gemv_fp8", Start: 1_000_000, End: 1_004_500, Device: 0, Context: 1, Stream: 7,
		Correlation: 42, GraphID: 3, GraphNodeID: 0x1_0000_0005, Grid: [3]int32{132, 2, 1}, Block: [3]int32{256, 1, 1}}
}

func TestParseKernel(t *testing.T) {
	want := sampleRecord()
	name := append([]byte(want.Name), 0)
	got, err := parseKernel(kernelBytes(want, name))
	runtime.KeepAlive(name)
	if err != nil {
		t.Fatal(err)
	}
	if got != want {
		t.Fatalf("parsed\n%+v\nwant\n%+v", got, want)
	}
}

func TestParseKernelRejects(t *testing.T) {
	name := append([]byte("k"), 0)
	for _, tc := range []struct {
		name string
		edit func(b []byte)
		want string
	}{
		{"kind", func(b []byte) { binary.LittleEndian.PutUint32(b, 3) }, "kind 3"},
		{"no name", func(b []byte) { *(**byte)(unsafe.Pointer(&b[104])) = nil }, "without a name"},
		{"no end", func(b []byte) { binary.LittleEndian.PutUint64(b[24:], 0) }, "no timestamps"},
		{"end before start", func(b []byte) { binary.LittleEndian.PutUint64(b[24:], 999_999) }, "before it starts"},
		{"grid zero", func(b []byte) { binary.LittleEndian.PutUint32(b[56:], 0) }, "grid"},
		{"block too big", func(b []byte) { binary.LittleEndian.PutUint32(b[64:], 4096) }, "block"},
		{"short", nil, "cut short"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := kernelBytes(sampleRecord(), name)
			if tc.edit != nil {
				tc.edit(b)
			} else {
				b = b[:kernelReadBytes-1]
			}
			_, err := parseKernel(b)
			runtime.KeepAlive(name)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want one saying %q", err, tc.want)
			}
		})
	}
}

// TestWalk steps through a buffer of kernel records and one record of
// another kind (skipped) the way cuptiActivityGetNextRecord would.
func TestWalk(t *testing.T) {
	a, b := sampleRecord(), sampleRecord()
	b.Name, b.Start, b.End, b.Correlation = "rmsnorm", 2_000_000, 2_000_900, 43
	na, nb := append([]byte(a.Name), 0), append([]byte(b.Name), 0)
	other := make([]byte, 32)
	binary.LittleEndian.PutUint32(other, 5) // CUPTI_ACTIVITY_KIND_RUNTIME
	buf := append(append(kernelBytes(a, na), other...), kernelBytes(b, nb)...)
	offs := []int{0, kernel10Size, kernel10Size + 32}
	step := func(offs []int) func(int) (int, bool, error) {
		i := 0
		return func(prev int) (int, bool, error) {
			if i == len(offs) {
				return 0, false, nil
			}
			i++
			return offs[i-1], true, nil
		}
	}
	got, err := walk(buf, step(offs))
	runtime.KeepAlive(na)
	runtime.KeepAlive(nb)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0] != a || got[1] != b {
		t.Fatalf("walk: %+v", got)
	}
	if _, err := walk(buf, step([]int{0, 0})); err == nil {
		t.Fatal("walk accepted a record offset that does not move forward")
	}
}

func TestCandidates(t *testing.T) {
	env := map[string]string{EnvLib: "/opt/x/libcupti.so.13"}
	glob := func(p string) []string {
		if strings.Contains(p, "/opt/*/.venv") {
			return []string{"/opt/a/.venv/lib/python3.12/site-packages/nvidia/cuda_cupti/lib/libcupti.so.13"}
		}
		return nil
	}
	c := candidates(func(k string) string { return env[k] }, glob)
	if c[0] != env[EnvLib] {
		t.Fatalf("first candidate %q, want %s's", c[0], EnvLib)
	}
	if c[1] != "/usr/local/cuda-13.0/targets/x86_64-linux/lib/libcupti.so.13" {
		t.Fatalf("second candidate %q", c[1])
	}
	if !strings.Contains(c[len(c)-1], "cuda_cupti") {
		t.Fatalf("last candidate %q, want the pip wheel's", c[len(c)-1])
	}
	if c := candidates(func(string) string { return "" }, glob); strings.Contains(c[0], "/opt/x") {
		t.Fatal("env candidate without the env")
	}
}
