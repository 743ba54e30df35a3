package cuda

import (
	"fmt"
	"strings"
	"sync"
	"unsafe"

	"github.com/cockroachdb/errors"
	"github.com/ebitengine/purego"
)

// NCCL is libnccl.so.2 opened at run time through its C API (no cgo), as
// libcuda is: the collective baseline of the sharded engine and its setup
// on several GPUs. One process drives all ranks (ncclCommInitAll), so no
// unique id travels between processes.
type NCCL struct {
	Path    string
	Version int // e.g. 22803 for 2.28.3

	getVersion, commInitAll, commDestroy uintptr
	allReduce, broadcast                 uintptr
	groupStart, groupEnd                 uintptr
	errorString                          func(int32) string
}

// NCCLComm is an ncclComm_t.
type NCCLComm uintptr

// envNCCL names the NCCL library file to load first.
const envNCCL = "TILERT_NCCL"

// NCCL data types and reduction ops (nccl.h).
const (
	ncclUint8   = 1
	ncclFloat32 = 7
	ncclSum     = 0
)

// ErrNoNCCL marks a machine without a loadable libnccl.
var ErrNoNCCL = errors.New("no NCCL library")

var (
	ncclOnce sync.Once
	ncclLib  *NCCL
	ncclErr  error
)

func ncclCandidates(getenv func(string) string, glob func(string) []string) []string {
	var out []string
	if v := getenv(envNCCL); v != "" {
		out = append(out, v)
	}
	out = append(out, "libnccl.so.2", "/usr/lib/x86_64-linux-gnu/libnccl.so.2", "/usr/lib/aarch64-linux-gnu/libnccl.so.2")
	// NVIDIA's wheel (nvidia-nccl-cu12/cu13), e.g. next to PyTorch.
	return append(out, WheelPaths(glob, "nvidia/nccl/lib/libnccl.so.2")...)
}

// LoadNCCL opens libnccl.so.2 once per process (TILERT_NCCL first, then the
// loader's path, the system library, NVIDIA's pip wheel).
func LoadNCCL() (*NCCL, error) {
	ncclOnce.Do(func() { ncclLib, ncclErr = openNCCL() })
	return ncclLib, ncclErr
}

func openNCCL() (*NCCL, error) {
	h, path, fails := dlopenFirst(ncclCandidates(osGetenv, osGlob))
	if h == 0 {
		return nil, errors.WithHint(errors.Mark(errors.Newf("libnccl.so.2 not found (%s)", strings.Join(fails, "; ")), ErrNoNCCL),
			"install NVIDIA's nvidia-nccl-cu12 wheel or the libnccl2 package, or set TILERT_NCCL to the library file; or use --comm oneshot on one GPU")
	}
	n := &NCCL{Path: path}
	s := symbols{lib: path, handle: h}
	for _, f := range []struct {
		dst  *uintptr
		name string
	}{
		{&n.getVersion, "ncclGetVersion"}, {&n.commInitAll, "ncclCommInitAll"}, {&n.commDestroy, "ncclCommDestroy"},
		{&n.allReduce, "ncclAllReduce"}, {&n.broadcast, "ncclBroadcast"},
		{&n.groupStart, "ncclGroupStart"}, {&n.groupEnd, "ncclGroupEnd"},
	} {
		if err := s.must(f.dst, f.name); err != nil {
			return nil, err
		}
	}
	purego.RegisterLibFunc(&n.errorString, h, "ncclGetErrorString")
	var v int32
	if err := n.check("ncclGetVersion", call(n.getVersion, uintptr(unsafe.Pointer(&v)))); err != nil {
		return nil, err
	}
	n.Version = int(v)
	return n, nil
}

func (n *NCCL) check(name string, r int32) error {
	if r == 0 {
		return nil
	}
	err := errors.Newf("%s: NCCL error %d (%s)", name, r, n.errorString(r))
	if r == 5 { // ncclInvalidUsage: the usual cause on one GPU
		err = errors.WithHint(err, "NCCL refuses two ranks on one device: run several ranks on one GPU with --comm local or oneshot")
	}
	return err
}

// CommInitAll creates one communicator per listed device ordinal, all in
// this process. Call it on a thread with a current context (NCCL uses the
// devices' primary contexts, as package cuda does).
func (n *NCCL) CommInitAll(devs []int) ([]NCCLComm, error) {
	if len(devs) == 0 {
		return nil, errors.New("ncclCommInitAll: no devices")
	}
	comms := make([]NCCLComm, len(devs))
	list := make([]int32, len(devs))
	for i, d := range devs {
		list[i] = int32(d)
	}
	err := n.check("ncclCommInitAll", call(n.commInitAll, uintptr(unsafe.Pointer(&comms[0])), uintptr(len(devs)), uintptr(unsafe.Pointer(&list[0]))))
	if err != nil {
		return nil, err
	}
	return comms, nil
}

// CommDestroy frees a communicator.
func (n *NCCL) CommDestroy(c NCCLComm) error {
	return n.check("ncclCommDestroy", call(n.commDestroy, uintptr(c)))
}

// AllReduceSumF32 sums count float32 from send of every rank into recv
// (in place when send == recv), enqueued on s.
func (n *NCCL) AllReduceSumF32(send, recv DevPtr, count int64, c NCCLComm, s Stream) error {
	return n.check("ncclAllReduce", call(n.allReduce, uintptr(send), uintptr(recv), uintptr(count), ncclFloat32, ncclSum, uintptr(c), uintptr(s)))
}

// Broadcast copies nbytes from root's send to every rank's recv.
func (n *NCCL) Broadcast(send, recv DevPtr, nbytes int64, root int, c NCCLComm, s Stream) error {
	return n.check("ncclBroadcast", call(n.broadcast, uintptr(send), uintptr(recv), uintptr(nbytes), ncclUint8, uintptr(root), uintptr(c), uintptr(s)))
}

// GroupStart and GroupEnd bracket the calls of several ranks issued from one
// thread.
func (n *NCCL) GroupStart() error { return n.check("ncclGroupStart", call(n.groupStart)) }
func (n *NCCL) GroupEnd() error   { return n.check("ncclGroupEnd", call(n.groupEnd)) }

// VersionString is the version as major.minor.patch.
func (n *NCCL) VersionString() string {
	v := n.Version
	if v >= 10000 {
		return fmt.Sprintf("%d.%d.%d", v/10000, v/100%100, v%100)
	}
	return fmt.Sprintf("%d.%d.%d", v/1000, v/100%10, v%100)
}
