package cuda

import (
	"os"
	"path/filepath"
	"sort"
	"strings"
	"unsafe"

	"github.com/cockroachdb/errors"
	"github.com/ebitengine/purego"
)

// Environment variables naming an NVRTC library file or the folder holding it.
const (
	envNVRTC     = "TILERT_NVRTC"
	envNVRTCPath = "NVRTC_PATH"
)

// nvrtcSonames are tried in order: newest major first. 11.2 is the soname
// NVRTC 11.x shipped under.
var nvrtcSonames = []string{
	"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so.11.2", "libnvrtc.so",
}

// cudaCandidates lists where libcuda.so.1 is looked for; the bare soname
// first so the dynamic loader's own search (ld.so.cache, LD_LIBRARY_PATH) wins.
func cudaCandidates() []string {
	return []string{
		"libcuda.so.1",
		"/usr/local/nvidia/lib64/libcuda.so.1",
		"/usr/lib/x86_64-linux-gnu/libcuda.so.1",
		"/usr/lib/aarch64-linux-gnu/libcuda.so.1",
		"/usr/lib64/libcuda.so.1",
		"/usr/lib/wsl/lib/libcuda.so.1",
	}
}

// nvrtcCandidates lists NVRTC libraries to try, in order. getenv and glob are
// parameters so tests can run without touching the machine.
func nvrtcCandidates(getenv func(string) string, glob func(string) []string) []string {
	var out []string
	seen := map[string]bool{}
	add := func(p string) {
		if p != "" && !seen[p] {
			seen[p] = true
			out = append(out, p)
		}
	}
	addDir := func(dir string) {
		for _, n := range nvrtcSonames {
			add(filepath.Join(dir, n))
		}
		// Versioned names beyond the known sonames (libnvrtc.so.13.0.88 ...).
		for _, m := range glob(filepath.Join(dir, "libnvrtc.so.*")) {
			if !strings.Contains(filepath.Base(m), "builtins") {
				add(m)
			}
		}
	}
	for _, env := range []string{envNVRTC, envNVRTCPath} {
		for _, v := range filepath.SplitList(getenv(env)) {
			if v == "" {
				continue
			}
			if strings.Contains(filepath.Base(v), "libnvrtc") {
				add(v)
			} else {
				addDir(v)
			}
		}
	}
	for _, env := range []string{"CUDA_PATH", "CUDA_HOME", "CUDA_ROOT"} {
		if v := getenv(env); v != "" {
			addDir(filepath.Join(v, "lib64"))
			addDir(filepath.Join(v, "lib"))
		}
	}
	// The loader's own search path.
	for _, n := range nvrtcSonames {
		add(n)
	}
	addDir("/usr/local/cuda/lib64")
	// Versioned toolkits, newest first.
	tk := glob("/usr/local/cuda-*")
	sort.Sort(sort.Reverse(sort.StringSlice(tk)))
	for _, d := range tk {
		addDir(filepath.Join(d, "lib64"))
	}
	addDir("/usr/lib/x86_64-linux-gnu")
	addDir("/usr/lib/aarch64-linux-gnu")
	addDir("/usr/lib64")
	// NVRTC from pip wheels (nvidia-cuda-nvrtc), e.g. next to PyTorch.
	for _, pat := range []string{
		"/opt/*/.venv/lib/python3*/site-packages/nvidia/cu*/lib",
		"/opt/*/.venv/lib/python3*/site-packages/nvidia/cuda_nvrtc/lib",
		"/usr/local/lib/python3*/dist-packages/nvidia/cu*/lib",
		"/usr/local/lib/python3*/dist-packages/nvidia/cuda_nvrtc/lib",
		"/usr/lib/python3/dist-packages/nvidia/cu*/lib",
	} {
		m := glob(pat)
		sort.Sort(sort.Reverse(sort.StringSlice(m)))
		for _, d := range m {
			addDir(d)
		}
	}
	return out
}

var osGetenv = os.Getenv

func osGlob(p string) []string {
	m, _ := filepath.Glob(p)
	return m
}

// dlopenFirst opens the first library in paths that loads; it reports every
// failure when none does.
func dlopenFirst(paths []string) (uintptr, string, []string) {
	var fails []string
	for _, p := range paths {
		if strings.HasPrefix(p, "/") {
			if _, err := os.Stat(p); err != nil {
				continue
			}
		}
		h, err := purego.Dlopen(p, purego.RTLD_NOW|purego.RTLD_GLOBAL)
		if err == nil {
			return h, p, nil
		}
		fails = append(fails, p+": "+err.Error())
	}
	return 0, "", fails
}

// symbols resolves C function addresses from one library.
type symbols struct {
	lib    string
	handle uintptr
}

func (s symbols) must(dst *uintptr, names ...string) error {
	for _, n := range names {
		if p, err := purego.Dlsym(s.handle, n); err == nil && p != 0 {
			*dst = p
			return nil
		}
	}
	return errors.Newf("%s: symbol %s not found", s.lib, strings.Join(names, " / "))
}

func (s symbols) optional(dst *uintptr, names ...string) {
	_ = s.must(dst, names...)
}

// cstr returns a NUL-terminated copy of s for C calls.
func cstr(s string) *byte {
	b := make([]byte, len(s)+1)
	copy(b, s)
	return &b[0]
}

// gostr copies a NUL-terminated C string.
func gostr(p *byte) string {
	if p == nil {
		return ""
	}
	n := 0
	for *(*byte)(unsafe.Add(unsafe.Pointer(p), n)) != 0 {
		n++
	}
	return string(unsafe.Slice(p, n))
}

// call invokes a C function returning an int status. uintptrescapes keeps
// the objects behind uintptr(unsafe.Pointer(...)) arguments on the heap, so
// they cannot move while C reads or writes them.
//
//go:uintptrescapes
func call(fn uintptr, args ...uintptr) int32 {
	r, _, _ := purego.SyscallN(fn, args...)
	return int32(r)
}
