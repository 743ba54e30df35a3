package cuda

import (
	"fmt"
	"runtime"
	"strings"
	"sync"
	"unsafe"

	"github.com/cockroachdb/errors"
)

// NVRTC is a loaded libnvrtc.
type NVRTC struct {
	Lib          string
	Major, Minor int
	archs        []int

	create, destroy, compile, logSize, getLog uintptr
	cubinSize, getCubin, ptxSize, getPTX      uintptr
}

var (
	nvrtcOnce sync.Once
	nvrtcLib  *NVRTC
	nvrtcErr  error
)

// LoadNVRTC opens the NVRTC library once per process (see nvrtcCandidates
// for the search order; TILERT_NVRTC / NVRTC_PATH come first).
func LoadNVRTC() (*NVRTC, error) {
	nvrtcOnce.Do(func() { nvrtcLib, nvrtcErr = openNVRTC() })
	return nvrtcLib, nvrtcErr
}

func openNVRTC() (*NVRTC, error) {
	cands := nvrtcCandidates(osGetenv, osGlob)
	h, path, fails := dlopenFirst(cands)
	if h == 0 {
		err := errors.New("NVRTC (libnvrtc.so) not found")
		if len(fails) > 0 {
			err = errors.WithDetail(err, strings.Join(fails, "\n"))
		}
		return nil, errors.WithHint(err, "install the CUDA toolkit or the nvidia-cuda-nvrtc wheel, or set TILERT_NVRTC to the libnvrtc.so file (or NVRTC_PATH to its folder); or use --device cpu")
	}
	s := symbols{lib: path, handle: h}
	n := &NVRTC{Lib: path}
	var version, numArchs, archs uintptr
	for _, r := range []struct {
		dst  *uintptr
		name string
	}{
		{&version, "nvrtcVersion"},
		{&n.create, "nvrtcCreateProgram"},
		{&n.destroy, "nvrtcDestroyProgram"},
		{&n.compile, "nvrtcCompileProgram"},
		{&n.logSize, "nvrtcGetProgramLogSize"},
		{&n.getLog, "nvrtcGetProgramLog"},
		{&n.ptxSize, "nvrtcGetPTXSize"},
		{&n.getPTX, "nvrtcGetPTX"},
	} {
		if err := s.must(r.dst, r.name); err != nil {
			return nil, err
		}
	}
	s.optional(&n.cubinSize, "nvrtcGetCUBINSize")
	s.optional(&n.getCubin, "nvrtcGetCUBIN")
	s.optional(&numArchs, "nvrtcGetNumSupportedArchs")
	s.optional(&archs, "nvrtcGetSupportedArchs")
	var maj, min int32
	if r := call(version, uintptr(unsafe.Pointer(&maj)), uintptr(unsafe.Pointer(&min))); r != 0 {
		return nil, newNVRTCError("nvrtcVersion", NVRTCResult(r))
	}
	n.Major, n.Minor = int(maj), int(min)
	if numArchs != 0 && archs != 0 {
		var cnt int32
		if call(numArchs, uintptr(unsafe.Pointer(&cnt))) == 0 && cnt > 0 && cnt < 256 {
			a := make([]int32, cnt)
			if call(archs, uintptr(unsafe.Pointer(&a[0]))) == 0 {
				for _, v := range a {
					n.archs = append(n.archs, int(v))
				}
			}
		}
	}
	return n, nil
}

// Version is "major.minor".
func (n *NVRTC) Version() string { return fmt.Sprintf("%d.%d", n.Major, n.Minor) }

// SupportedArchs lists the SM versions this NVRTC can target (e.g. 90).
func (n *NVRTC) SupportedArchs() []int { return n.archs }

// chooseArch picks the compile target for a device of compute capability
// major.minor. A real SASS image (sm_XY) when NVRTC knows the device's arch
// (sm_90a on Hopper with NVRTC >= 12, which unlocks wgmma/setmaxnreg);
// otherwise PTX for the newest older arch, which the driver compiles at load.
func chooseArch(major, minor int, supported []int, nvrtcMajor int, haveCubin bool) (arch string, cubin bool, err error) {
	cc := major*10 + minor
	best := 0
	exact := false
	for _, a := range supported {
		if a == cc {
			exact = true
		}
		if a <= cc && a > best {
			best = a
		}
	}
	if len(supported) == 0 { // NVRTC < 11.2 cannot list; trust it with the device arch
		exact, best = true, cc
	}
	if exact && haveCubin {
		if cc == 90 && nvrtcMajor >= 12 {
			return "sm_90a", true, nil
		}
		return fmt.Sprintf("sm_%d", cc), true, nil
	}
	if best == 0 {
		return "", false, errors.WithHint(
			errors.Newf("NVRTC supports none of the architectures up to sm_%d (it knows %v)", cc, supported),
			"use an NVRTC at least as new as the GPU: set TILERT_NVRTC to a newer libnvrtc.so")
	}
	return fmt.Sprintf("compute_%d", best), false, nil
}

// Compile builds src for arch (sm_XY gives a cubin, compute_XY PTX).
// The compile log comes back with the error on failure.
func (n *NVRTC) Compile(src, name string, opts []string, cubin bool) ([]byte, error) {
	img, _, err := n.CompileLog(src, name, opts, cubin)
	return img, err
}

// CompileLog is Compile that also returns NVRTC's log on success (with
// -Xptxas -v among opts: ptxas's registers, shared memory and spills).
func (n *NVRTC) CompileLog(src, name string, opts []string, cubin bool) ([]byte, string, error) {
	var prog uintptr
	csrc, cname := cstr(src), cstr(name)
	if r := call(n.create, uintptr(unsafe.Pointer(&prog)), uintptr(unsafe.Pointer(csrc)), uintptr(unsafe.Pointer(cname)), 0, 0, 0); r != 0 {
		return nil, "", newNVRTCError("nvrtcCreateProgram", NVRTCResult(r))
	}
	defer func() { call(n.destroy, uintptr(unsafe.Pointer(&prog))) }()

	var pin runtime.Pinner
	defer pin.Unpin()
	copts := make([]uintptr, len(opts)+1)
	for i, o := range opts {
		p := cstr(o)
		pin.Pin(p)
		copts[i] = uintptr(unsafe.Pointer(p))
	}
	pin.Pin(&copts[0])
	r := call(n.compile, prog, uintptr(len(opts)), uintptr(unsafe.Pointer(&copts[0])))
	log := n.log(prog)
	if r != 0 {
		err := newNVRTCError("nvrtcCompileProgram "+name, NVRTCResult(r))
		return nil, log, errors.WithDetailf(err, "options: %s\n%s", strings.Join(opts, " "), log)
	}
	sizeFn, getFn, what := n.ptxSize, n.getPTX, "PTX"
	if cubin {
		if n.cubinSize == 0 {
			return nil, log, errors.New("this NVRTC cannot emit cubins (needs 11.1+)")
		}
		sizeFn, getFn, what = n.cubinSize, n.getCubin, "CUBIN"
	}
	var size uint64
	if r := call(sizeFn, prog, uintptr(unsafe.Pointer(&size))); r != 0 {
		return nil, "", newNVRTCError("nvrtcGet"+what+"Size", NVRTCResult(r))
	}
	out := make([]byte, size+1) // +1: PTX is loaded as a NUL-terminated string
	if r := call(getFn, prog, uintptr(unsafe.Pointer(&out[0]))); r != 0 {
		return nil, "", newNVRTCError("nvrtcGet"+what, NVRTCResult(r))
	}
	return out[:size], log, nil
}

func (n *NVRTC) log(prog uintptr) string {
	var size uint64
	if call(n.logSize, prog, uintptr(unsafe.Pointer(&size))) != 0 || size <= 1 {
		return ""
	}
	b := make([]byte, size)
	if call(n.getLog, prog, uintptr(unsafe.Pointer(&b[0]))) != 0 {
		return ""
	}
	return strings.TrimRight(string(b), "\x00\n")
}
