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
	// NVRTC from pip wheels (nvidia-cuda-nvrtc; CUDA 13's in nvidia/cu13).
	for _, d := range WheelPaths(glob, "nvidia/cu*/lib", "nvidia/cuda_nvrtc/lib") {
		addDir(d)
	}
	return out
}

var osGetenv = os.Getenv

func osGlob(p string) []string {
	m, _ := filepath.Glob(p)
	return m
}

// dlopenFirst opens the first library in paths that loads, its symbols
// global (the driver, NVRTC, NCCL); see DlopenFirst.
func dlopenFirst(paths []string) (uintptr, string, []string) {
	return DlopenFirst(paths, purego.RTLD_NOW|purego.RTLD_GLOBAL)
}

// DlopenFirst opens the first library in paths that loads with purego's
// dlopen mode (absolute paths that do not exist are skipped, sonames go to
// the loader's own search); it reports every failure when none does.
func DlopenFirst(paths []string, mode int) (handle uintptr, path string, fails []string) {
	for _, p := range paths {
		if strings.HasPrefix(p, "/") {
			if _, err := os.Stat(p); err != nil {
				continue
			}
		}
		h, err := purego.Dlopen(p, mode)
		if err == nil {
			return h, p, nil
		}
		fails = append(fails, p+": "+err.Error())
	}
	return 0, "", fails
}

// wheelSites are where pip puts NVIDIA's wheels (the nvidia/ folder), e.g.
// next to PyTorch: a virtual environment under /opt or /work, the system
// Python's dist-packages and site-packages.
var wheelSites = []string{
	"/opt/*/.venv/lib/python3*/site-packages",
	"/usr/local/lib/python3*/dist-packages",
	"/usr/local/lib/python3*/site-packages",
	"/usr/lib/python3/dist-packages",
	"/work/*/lib/python3*/site-packages",
}

// WheelPaths expands each of rels (a glob below site-packages, e.g.
// "nvidia/nccl/lib/libnccl.so.2") in every place pip puts NVIDIA's
// wheels: place by place, rels in order, the matches of one glob in
// reverse name order (newest version first).
func WheelPaths(glob func(string) []string, rels ...string) []string {
	var out []string
	for _, site := range wheelSites {
		for _, rel := range rels {
			m := glob(site + "/" + rel)
			sort.Sort(sort.Reverse(sort.StringSlice(m)))
			out = append(out, m...)
		}
	}
	return out
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
