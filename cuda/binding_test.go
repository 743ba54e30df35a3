package cuda

import (
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unsafe"

	"github.com/cockroachdb/errors"
)

func TestNVRTCCandidates(t *testing.T) {
	env := map[string]string{
		"TILERT_NVRTC": "/opt/nv/libnvrtc.so.12",
		"NVRTC_PATH":   "/x/lib",
		"CUDA_HOME":    "/cuda",
	}
	globs := map[string][]string{
		"/x/lib/libnvrtc.so.*":                     {"/x/lib/libnvrtc.so.12.4.99", "/x/lib/libnvrtc-builtins.so.12.4"},
		"/usr/local/cuda-*":                        {"/usr/local/cuda-12.4", "/usr/local/cuda-13.0"},
		"/usr/local/cuda-13.0/lib64/libnvrtc.so.*": {"/usr/local/cuda-13.0/lib64/libnvrtc.so.13.0.48"},
	}
	got := nvrtcCandidates(func(k string) string { return env[k] }, func(p string) []string { return globs[p] })
	idx := func(s string) int {
		for i, g := range got {
			if g == s {
				return i
			}
		}
		return -1
	}
	for _, tc := range []struct{ before, after string }{
		{"/opt/nv/libnvrtc.so.12", "/x/lib/libnvrtc.so.13"},
		{"/x/lib/libnvrtc.so.13", "/x/lib/libnvrtc.so.12.4.99"},
		{"/x/lib/libnvrtc.so.12.4.99", "/cuda/lib64/libnvrtc.so.13"},
		{"/cuda/lib64/libnvrtc.so.13", "libnvrtc.so.13"},
		{"libnvrtc.so.13", "libnvrtc.so.11.2"},
		{"/usr/local/cuda/lib64/libnvrtc.so.12", "/usr/local/cuda-13.0/lib64/libnvrtc.so.13"},
		{"/usr/local/cuda-13.0/lib64/libnvrtc.so.13.0.48", "/usr/local/cuda-12.4/lib64/libnvrtc.so.13"},
	} {
		b, a := idx(tc.before), idx(tc.after)
		if b < 0 || a < 0 || b >= a {
			t.Errorf("want %s (at %d) before %s (at %d); list:\n%s", tc.before, b, tc.after, a, strings.Join(got, "\n"))
		}
	}
	for _, g := range got {
		if strings.Contains(g, "builtins") {
			t.Errorf("builtins library offered as NVRTC: %s", g)
		}
	}
	seen := map[string]bool{}
	for _, g := range got {
		if seen[g] {
			t.Errorf("duplicate candidate %s", g)
		}
		seen[g] = true
	}
}

func TestCacheKey(t *testing.T) {
	base := CacheKey("src", []string{"-a", "-b"}, "sm_90a", "12.8")
	if len(base) != 64 {
		t.Fatalf("key %q is not a sha256 hex", base)
	}
	if CacheKey("src", []string{"-a", "-b"}, "sm_90a", "12.8") != base {
		t.Fatal("key not stable")
	}
	for name, k := range map[string]string{
		"source":  CacheKey("src2", []string{"-a", "-b"}, "sm_90a", "12.8"),
		"options": CacheKey("src", []string{"-a"}, "sm_90a", "12.8"),
		"split":   CacheKey("src", []string{"-a-b"}, "sm_90a", "12.8"),
		"arch":    CacheKey("src", []string{"-a", "-b"}, "sm_90", "12.8"),
		"nvrtc":   CacheKey("src", []string{"-a", "-b"}, "sm_90a", "13.0"),
	} {
		if k == base {
			t.Errorf("changing the %s does not change the key", name)
		}
	}
}

func TestKernelCacheStoreLoad(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "a", "b")
	kc := KernelCache{Dir: dir}
	if _, ok := kc.Load("k", "cubin"); ok {
		t.Fatal("hit in an empty cache")
	}
	want := []byte("\x7fELF image")
	if err := kc.Store("k", "cubin", want); err != nil {
		t.Fatal(err)
	}
	got, ok := kc.Load("k", "cubin")
	if !ok || string(got) != string(want) {
		t.Fatalf("load = %q, %v", got, ok)
	}
	if _, ok := kc.Load("k", "ptx"); ok {
		t.Fatal("extension ignored")
	}
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".tmp") {
			t.Errorf("temporary file left behind: %s", e.Name())
		}
	}
	// Disabled cache: no-ops.
	if err := (KernelCache{}).Store("k", "cubin", want); err != nil {
		t.Fatal(err)
	}
	if _, ok := (KernelCache{}).Load("k", "cubin"); ok {
		t.Fatal("disabled cache hit")
	}
}

func TestDefaultCacheDir(t *testing.T) {
	home := func() (string, error) { return "/home/u", nil }
	for _, tc := range []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{}, "/home/u/.cache/tilert/kernels"},
		{map[string]string{"XDG_CACHE_HOME": "/xdg"}, "/xdg/tilert/kernels"},
		{map[string]string{"XDG_CACHE_HOME": "/xdg", "TILERT_KERNEL_CACHE": "/k"}, "/k"},
		{map[string]string{"TILERT_KERNEL_CACHE": "off"}, ""},
	} {
		if got := defaultCacheDir(func(k string) string { return tc.env[k] }, home); got != tc.want {
			t.Errorf("env %v: %q, want %q", tc.env, got, tc.want)
		}
	}
}

func TestParamBits(t *testing.T) {
	for _, tc := range []struct {
		v    any
		want uint64
	}{
		{DevPtr(0x7f0012345600), 0x7f0012345600},
		{int(-1), 0xffffffff},
		{int(7), 7},
		{int32(-2), 0xfffffffe},
		{uint32(5), 5},
		{float32(1.5), uint64(math.Float32bits(1.5))},
		{float64(-2), math.Float64bits(-2)},
		{int64(-1), math.MaxUint64},
		{uint64(1) << 40, 1 << 40},
		{true, 1},
		{false, 0},
	} {
		got, err := paramBits(tc.v)
		if err != nil || got != tc.want {
			t.Errorf("paramBits(%T %v) = %#x, %v; want %#x", tc.v, tc.v, got, err, tc.want)
		}
	}
	if _, err := paramBits(int(1) << 40); err == nil {
		t.Error("int beyond C int accepted")
	}
	if _, err := paramBits("x"); err == nil {
		t.Error("string accepted")
	}
}

func TestParamArenaPack(t *testing.T) {
	a := newParamArena()
	defer a.release()
	args := []any{DevPtr(0xdead0000), int(3), float32(0.25)}
	p, err := a.pack(args)
	if err != nil {
		t.Fatal(err)
	}
	if p != uintptr(unsafe.Pointer(&a.ptrs[0])) {
		t.Fatal("pack returned the wrong array")
	}
	// What CUDA does: read each argument's bytes through the void* array.
	if got := *(*uint64)(unsafe.Pointer(&a.vals[0])); got != 0xdead0000 {
		t.Errorf("ptr arg = %#x", got)
	}
	if a.ptrs[1] != uintptr(unsafe.Pointer(&a.vals[1])) {
		t.Error("slot pointer 1 wrong")
	}
	if got := *(*int32)(unsafe.Pointer(&a.vals[1])); got != 3 {
		t.Errorf("int arg = %d", got)
	}
	if got := *(*float32)(unsafe.Pointer(&a.vals[2])); got != 0.25 {
		t.Errorf("float arg = %v", got)
	}
	if _, err := a.pack(make([]any, maxKernelParams+1)); err == nil {
		t.Error("too many args accepted")
	}
}

func TestCUDAErrorMapping(t *testing.T) {
	err := newCUDAError("cuMemAlloc_v2", 2, "", "")
	var ce *CUDAError
	if !errors.As(err, &ce) || ce.Name != "CUDA_ERROR_OUT_OF_MEMORY" || ce.Code != 2 {
		t.Fatalf("got %v", err)
	}
	if !strings.Contains(err.Error(), "cuMemAlloc_v2") || !strings.Contains(err.Error(), "CUDA_ERROR_OUT_OF_MEMORY") {
		t.Errorf("message %q lacks call or name", err)
	}
	if h := errors.FlattenHints(err); !strings.Contains(h, "out of memory") {
		t.Errorf("hint %q", h)
	}
	noDev := newCUDAError("cuInit", 100, "", "no CUDA-capable device is detected")
	if !errors.Is(noDev, ErrNoGPU) || !strings.Contains(errors.FlattenHints(noDev), "--device cpu") {
		t.Errorf("no-device error %v not marked or hinted", noDev)
	}
	if errors.Is(err, ErrNoGPU) {
		t.Error("OOM marked as no GPU")
	}
	ctx := newCUDAError("cuMemAlloc_v2", 201, "", "")
	if !strings.Contains(errors.FlattenHints(ctx), "Device).Do") {
		t.Errorf("context error hint %q", errors.FlattenHints(ctx))
	}
	if got := cuErrorName(12345); got != "CUDA_ERROR_12345" {
		t.Errorf("unknown code name %q", got)
	}
	// Driver-provided name wins over the table.
	if e := newCUDAError("x", 1, "DRIVER_NAME", "detail"); !strings.Contains(e.Error(), "DRIVER_NAME") || !strings.Contains(e.Error(), "detail") {
		t.Errorf("got %v", e)
	}
	if e := newNVRTCError("nvrtcCompileProgram", 6); !strings.Contains(e.Error(), "NVRTC_ERROR_COMPILATION") {
		t.Errorf("got %v", e)
	}
}

func TestChooseArch(t *testing.T) {
	archs118 := []int{35, 37, 50, 52, 53, 60, 61, 62, 70, 72, 75, 80, 86, 87, 89, 90}
	archs12 := []int{50, 52, 53, 60, 61, 62, 70, 72, 75, 80, 86, 87, 89, 90}
	for _, tc := range []struct {
		maj, min, nvMaj int
		archs           []int
		haveCubin       bool
		want            string
		cubin, err      bool
	}{
		{9, 0, 12, archs12, true, "sm_90a", true, false},
		{9, 0, 11, archs118, true, "sm_90", true, false},
		{8, 0, 12, archs12, true, "sm_80", true, false},
		{10, 0, 12, archs12, true, "compute_90", false, false}, // newer GPU than NVRTC: PTX
		{9, 0, 12, archs12, false, "compute_90", false, false}, // no cubin support
		{3, 0, 12, archs12, true, "", false, true},
		{8, 6, 11, nil, true, "sm_86", true, false},
	} {
		got, cubin, err := chooseArch(tc.maj, tc.min, tc.archs, tc.nvMaj, tc.haveCubin)
		if (err != nil) != tc.err || got != tc.want || cubin != tc.cubin {
			t.Errorf("cc %d.%d nvrtc %d: %q cubin=%v err=%v; want %q %v err=%v", tc.maj, tc.min, tc.nvMaj, got, cubin, err, tc.want, tc.cubin, tc.err)
		}
	}
}

func TestPool(t *testing.T) {
	next := DevPtr(1 << 20)
	live := map[DevPtr]int64{}
	budget := int64(10 << 20)
	var used int64
	raw := func(n int64) (DevPtr, error) {
		if used+n > budget {
			return 0, newCUDAError("cuMemAlloc_v2", 2, "", "")
		}
		p := next
		next += DevPtr(n)
		live[p] = n
		used += n
		return p, nil
	}
	rawFree := func(p DevPtr) error {
		n, ok := live[p]
		if !ok {
			t.Fatalf("double free %#x", p)
		}
		delete(live, p)
		used -= n
		return nil
	}
	p := newPool(raw, rawFree)
	a, err := p.Alloc(100)
	if err != nil {
		t.Fatal(err)
	}
	if live[a] != poolSmallQuantum {
		t.Errorf("100 B rounded to %d", live[a])
	}
	if err := p.Free(a); err != nil {
		t.Fatal(err)
	}
	b, _ := p.Alloc(300) // same class: reused
	if b != a {
		t.Errorf("buffer not reused: %#x vs %#x", b, a)
	}
	if err := p.Free(b); err != nil {
		t.Fatal(err)
	}
	if err := p.Free(b); err == nil {
		t.Error("double free accepted")
	}
	big, err := p.Alloc(3 << 20)
	if err != nil || live[big] != 4<<20 {
		t.Fatalf("large alloc: %v size %d", err, live[big])
	}
	if err := p.Free(big); err != nil {
		t.Fatal(err)
	}
	// 8 MiB does not fit next to 4 MiB parked + 512 B parked: Trim and retry.
	huge, err := p.Alloc(8 << 20)
	if err != nil {
		t.Fatalf("OOM retry after trim failed: %v", err)
	}
	if st := p.Stats(); st.InUse != 8<<20 || st.Cached != 0 {
		t.Errorf("stats %+v", st)
	}
	if _, err := p.Alloc(4 << 20); err == nil {
		t.Error("over-budget alloc succeeded")
	}
	_ = huge
	if err := p.releaseAll(); err != nil {
		t.Fatal(err)
	}
	if len(live) != 0 {
		t.Errorf("%d buffers leaked", len(live))
	}
}

func TestArena(t *testing.T) {
	a := NewArena(0x10000, 1000)
	p1, err := a.Alloc(10)
	if err != nil || p1 != 0x10000 {
		t.Fatal(p1, err)
	}
	p2, err := a.Alloc(10)
	if err != nil || p2 != 0x10000+256 {
		t.Fatalf("second piece at %#x, want 256-aligned", p2)
	}
	if _, err := a.Alloc(600); err == nil {
		t.Error("overflow accepted")
	}
	a.Reset()
	if p, _ := a.Alloc(1000); p != 0x10000 {
		t.Error("reset did not rewind")
	}
}

// Every launcher in ops.go must name a kernel that exists in the source.

// Without a GPU, opening one fails with ErrNoGPU and points at --device cpu.
func TestNoGPUError(t *testing.T) {
	_, err := DeviceCount()
	if err == nil {
		t.Skip("a GPU is present")
	}
	if !errors.Is(err, ErrNoGPU) {
		t.Fatalf("error not marked ErrNoGPU: %+v", err)
	}
	if !strings.Contains(errors.FlattenHints(err), "--device cpu") {
		t.Errorf("hint %q does not mention --device cpu", errors.FlattenHints(err))
	}
	if _, err := Open(0); !errors.Is(err, ErrNoGPU) {
		t.Errorf("Open: %v", err)
	}
}

// The test references (fp8Table, fp8Encode, bf16Round, the RNG) are written
// independently of numeric/; they must agree with it and with each other.

func TestSplitCompileOption(t *testing.T) {
	for _, tc := range []struct {
		major, minor int
		env, want    string
		bad          bool
	}{
		{13, 0, "", "--split-compile=0", false},
		{12, 1, "", "--split-compile=0", false},
		{12, 0, "", "", false},
		{11, 8, "", "", false},
		{13, 0, "1", "", false},
		{13, 0, "8", "--split-compile=8", false},
		{11, 8, "4", "--split-compile=4", false}, // asked for: tried, with the fallback
		{13, 0, "-2", "", true},
		{13, 0, "all", "", true},
	} {
		got, err := splitCompileOption(tc.major, tc.minor, tc.env)
		if (err != nil) != tc.bad || got != tc.want {
			t.Errorf("NVRTC %d.%d %s=%q: %q, %v; want %q (error %v)", tc.major, tc.minor, envNVRTCThreads, tc.env, got, err, tc.want, tc.bad)
		}
	}
}
