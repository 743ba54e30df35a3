// Package cupti records kernel executions with NVIDIA CUPTI's Activity API
// (libcupti, loaded at run time through purego): which kernels ran, on which
// stream, when, as the GPU ran them (graphs and side streams included). It
// knows nothing of the engine; Open loads the library only when asked.
package cupti

import (
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"unsafe"

	"github.com/cockroachdb/errors"
	"github.com/ebitengine/purego"

	"github.com/tilert-go/tilert/cuda"
)

// EnvLib names a libcupti file to load before the usual places.
const EnvLib = "TILERT_CUPTI"

// CUptiResult values (cupti_result.h).
const (
	resultSuccess         = 0
	resultMaxLimitReached = 12
	resultInvalidKind     = 21
	flushForced           = 1 // CUPTI_ACTIVITY_FLAG_FLUSH_FORCED
)

// bufferBytes is the size of each activity buffer handed to CUPTI: about
// 38,000 kernel records of 216 bytes.
const bufferBytes = 8 << 20

// candidates lists libcupti files to try, in order.
func candidates(getenv func(string) string, glob func(string) []string) []string {
	var out []string
	if v := getenv(EnvLib); v != "" {
		out = append(out, v)
	}
	out = append(out,
		"/usr/local/cuda-13.0/targets/x86_64-linux/lib/libcupti.so.13",
		"/usr/local/cuda-13.0/targets/x86_64-linux/lib/libcupti.so",
		"/usr/local/cuda/extras/CUPTI/lib64/libcupti.so.13",
		"/usr/local/cuda/extras/CUPTI/lib64/libcupti.so",
		"/usr/local/cuda/targets/x86_64-linux/lib/libcupti.so",
		"libcupti.so.13", "libcupti.so",
	)
	// CUPTI from pip wheels (nvidia-cuda-cupti; CUDA 13's put it in
	// nvidia/cu13/lib), e.g. next to PyTorch.
	out = append(out, cuda.WheelPaths(glob, "nvidia/cu13/lib/libcupti.so*", "nvidia/cuda_cupti/lib/libcupti.so*")...)
	return out
}

// lib is the loaded library's entry points.
type lib struct {
	path                                                                     string
	getResultString, enable, disable, flushAll, register, next, dropped, now uintptr
}

var (
	openOnce sync.Once
	theLib   *lib
	openErr  error
)

func loadLib() (*lib, error) {
	glob := func(p string) []string { m, _ := filepath.Glob(p); return m }
	paths := candidates(os.Getenv, glob)
	// Local: CUPTI's symbols are only looked up here.
	h, p, fails := cuda.DlopenFirst(paths, purego.RTLD_NOW|purego.RTLD_LOCAL)
	if h != 0 {
		l := &lib{path: p}
		for _, s := range []struct {
			dst  *uintptr
			name string
		}{
			{&l.getResultString, "cuptiGetResultString"},
			{&l.enable, "cuptiActivityEnable"},
			{&l.disable, "cuptiActivityDisable"},
			{&l.flushAll, "cuptiActivityFlushAll"},
			{&l.register, "cuptiActivityRegisterCallbacks"},
			{&l.next, "cuptiActivityGetNextRecord"},
			{&l.dropped, "cuptiActivityGetNumDroppedRecords"},
			{&l.now, "cuptiGetTimestamp"},
		} {
			var err error
			if *s.dst, err = purego.Dlsym(h, s.name); err != nil || *s.dst == 0 {
				return nil, errors.WithHint(errors.Newf("cupti: %s has no %s", p, s.name),
					"point "+EnvLib+" at the libcupti of the CUDA toolkit the driver supports (CUDA 12 or 13)")
			}
		}
		return l, nil
	}
	msg := "cupti: libcupti not found"
	if len(fails) > 0 {
		msg += " (" + strings.Join(fails, "; ") + ")"
	}
	return nil, errors.WithHint(errors.New(msg),
		"install the CUDA toolkit's CUPTI (e.g. /usr/local/cuda/extras/CUPTI/lib64, or pip install nvidia-cuda-cupti: CUDA 13 wheels put it in nvidia/cu13/lib) or set "+EnvLib+"=/path/to/libcupti.so")
}

// call invokes a C function returning a CUptiResult. uintptrescapes keeps
// the objects behind uintptr(unsafe.Pointer(...)) arguments on the heap,
// where they do not move while C writes them.
//
//go:uintptrescapes
func call(fn uintptr, args ...uintptr) uint32 {
	r, _, _ := purego.SyscallN(fn, args...)
	return uint32(r)
}

// check turns a CUptiResult into an error naming the call.
func (l *lib) check(what string, r uint32) error {
	if r == resultSuccess {
		return nil
	}
	var s *byte
	msg := ""
	if call(l.getResultString, uintptr(r), uintptr(unsafe.Pointer(&s))) == resultSuccess && s != nil {
		msg = cString(s, 1024)
	}
	return errors.Newf("cupti: %s: error %d %s", what, r, msg)
}

// Tracer records the kernels that run between Start and Stop. CUPTI's
// activity state is one per process, so there is one Tracer: Open returns
// it, and one Start may be open at a time.
type Tracer struct {
	l  *lib
	mu sync.Mutex // one Start..Stop at a time
	on bool
}

var tracer Tracer

// Open loads libcupti (once per process) and returns the process's Tracer.
func Open() (*Tracer, error) {
	openOnce.Do(func() { theLib, openErr = loadLib() })
	if openErr != nil {
		return nil, openErr
	}
	tracer.l = theLib
	return &tracer, nil
}

// Path is the library file loaded.
func (t *Tracer) Path() string { return t.l.path }

// Buffers handed to CUPTI: CUPTI fills them from its own threads after the
// request callback returns and gives them back through the completion
// callback, so they live outside Go's heap (anonymous mmaps) and are kept
// for reuse, never unmapped.
var bufs struct {
	mu   sync.Mutex
	free [][]byte
	out  map[uintptr][]byte // handed to CUPTI, by address
	done []filled           // given back, in order
	lost int                // given back but not ours, or requests refused
}

type filled struct {
	b     []byte
	valid int
}

var (
	registerOnce sync.Once
	registerErr  error
)

var (
	cbOnce        sync.Once
	cbReq, cbDone uintptr
)

// callbacks returns the C function pointers of bufferRequested and
// bufferCompleted, made once per process (purego never frees callbacks).
func callbacks() (req, done uintptr) {
	cbOnce.Do(func() {
		cbReq = purego.NewCallback(bufferRequested)
		cbDone = purego.NewCallback(bufferCompleted)
	})
	return cbReq, cbDone
}

// bufferRequested is CUpti_BuffersCallbackRequestFunc.
func bufferRequested(buffer *uintptr, size *uintptr, maxNumRecords *uintptr) {
	bufs.mu.Lock()
	defer bufs.mu.Unlock()
	var b []byte
	if n := len(bufs.free); n > 0 {
		b, bufs.free = bufs.free[n-1], bufs.free[:n-1]
	} else {
		var err error
		b, err = syscall.Mmap(-1, 0, bufferBytes, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
		if err != nil {
			bufs.lost++
			*buffer, *size, *maxNumRecords = 0, 0, 0 // CUPTI drops records, counted
			return
		}
	}
	p := uintptr(unsafe.Pointer(&b[0]))
	if bufs.out == nil {
		bufs.out = map[uintptr][]byte{}
	}
	bufs.out[p] = b
	*buffer, *size, *maxNumRecords = p, uintptr(len(b)), 0
}

// bufferCompleted is CUpti_BuffersCallbackCompleteFunc.
func bufferCompleted(ctx uintptr, streamID uint32, buffer *byte, size uintptr, validSize uintptr) {
	bufs.mu.Lock()
	defer bufs.mu.Unlock()
	p := uintptr(unsafe.Pointer(buffer))
	b, ok := bufs.out[p]
	if !ok || validSize > uintptr(len(b)) {
		bufs.lost++
		return
	}
	delete(bufs.out, p)
	bufs.done = append(bufs.done, filled{b: b, valid: int(validSize)})
}

// Start clears what earlier traces left and starts recording kernels.
func (t *Tracer) Start() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.on {
		return errors.New("cupti: Start while a trace is running")
	}
	registerOnce.Do(func() {
		req, done := callbacks()
		registerErr = t.l.check("cuptiActivityRegisterCallbacks", call(t.l.register, req, done))
	})
	if registerErr != nil {
		return registerErr
	}
	bufs.mu.Lock()
	for _, f := range bufs.done {
		bufs.free = append(bufs.free, f.b)
	}
	bufs.done, bufs.lost = nil, 0
	bufs.mu.Unlock()
	if err := t.l.check("cuptiActivityEnable(CONCURRENT_KERNEL)", call(t.l.enable, kindConcurrentKernel)); err != nil {
		return errors.WithHint(err, "CUPTI needs the NVIDIA driver and no other profiler (nsys, ncu) holding it")
	}
	// Reading the dropped count resets it; nothing ran yet, so a failure
	// here loses nothing and Stop's reading reports.
	var n uintptr
	_ = call(t.l.dropped, 0, 0, uintptr(unsafe.Pointer(&n)))
	t.on = true
	return nil
}

// Now is CUPTI's current timestamp (ns), on the clock of the records.
func (t *Tracer) Now() (uint64, error) {
	var ts uint64
	err := t.l.check("cuptiGetTimestamp", call(t.l.now, uintptr(unsafe.Pointer(&ts))))
	return ts, err
}

// Stop stops recording and returns the kernels recorded since Start, by
// start time. The caller synchronises the device first: a kernel still
// running has no end time, and its record is an error here.
func (t *Tracer) Stop() ([]KernelRecord, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.on {
		return nil, errors.New("cupti: Stop without Start")
	}
	t.on = false
	err := t.l.check("cuptiActivityFlushAll", call(t.l.flushAll, flushForced))
	var dropped uintptr
	err = errors.CombineErrors(err, t.l.check("cuptiActivityGetNumDroppedRecords", call(t.l.dropped, 0, 0, uintptr(unsafe.Pointer(&dropped)))))
	err = errors.CombineErrors(err, t.l.check("cuptiActivityDisable(CONCURRENT_KERNEL)", call(t.l.disable, kindConcurrentKernel)))
	// Buffers CUPTI still holds (empty ones it keeps for later) stay in
	// bufs.out, alive, for it to fill and hand back in a later trace.
	bufs.mu.Lock()
	done, lost := bufs.done, bufs.lost
	bufs.done, bufs.lost = nil, 0
	bufs.mu.Unlock()
	defer func() {
		bufs.mu.Lock()
		for _, f := range done {
			bufs.free = append(bufs.free, f.b)
		}
		bufs.mu.Unlock()
	}()
	if err != nil {
		return nil, err
	}
	if dropped > 0 || lost > 0 {
		return nil, errors.WithHint(errors.Newf("cupti: %d kernel records dropped, %d buffers lost", dropped, lost),
			"trace fewer kernels at a time")
	}
	var recs []KernelRecord
	for _, f := range done {
		if f.valid == 0 {
			continue // a forced flush hands back empty buffers too
		}
		rs, err := walk(f.b[:f.valid], t.nextRecord(f.b[:f.valid]))
		if err != nil {
			return nil, err
		}
		recs = append(recs, rs...)
	}
	sort.SliceStable(recs, func(i, j int) bool { return recs[i].Start < recs[j].Start })
	return recs, nil
}

// nextRecord steps through buf with cuptiActivityGetNextRecord: it returns
// the offset of the record after prev (-1: the first) and false at the end.
func (t *Tracer) nextRecord(buf []byte) func(prev int) (int, bool, error) {
	var rec uintptr // CUpti_Activity*, kept between calls as the API wants
	base := uintptr(unsafe.Pointer(&buf[0]))
	return func(prev int) (int, bool, error) {
		if prev < 0 {
			rec = 0
		}
		r := call(t.l.next, base, uintptr(len(buf)), uintptr(unsafe.Pointer(&rec)))
		switch r {
		case resultSuccess:
		case resultMaxLimitReached:
			return 0, false, nil
		case resultInvalidKind:
			return 0, false, errors.New("cupti: an incomplete or invalid activity record (synchronise the device before Stop)")
		default:
			return 0, false, t.l.check("cuptiActivityGetNextRecord", r)
		}
		if rec < base || rec >= base+uintptr(len(buf)) {
			return 0, false, errors.Newf("cupti: next record at %#x outside the buffer [%#x, +%d)", rec, base, len(buf))
		}
		return int(rec - base), true, nil
	}
}

// walk collects the kernel records of buf, visiting records with next
// (offsets into buf, strictly increasing); records of other kinds are
// skipped.
func walk(buf []byte, next func(prev int) (int, bool, error)) ([]KernelRecord, error) {
	var out []KernelRecord
	prev := -1
	for {
		off, ok, err := next(prev)
		if err != nil {
			return nil, err
		}
		if !ok {
			return out, nil
		}
		if off <= prev || off >= len(buf) {
			return nil, errors.Newf("cupti: record offset %d after %d in a buffer of %d bytes", off, prev, len(buf))
		}
		prev = off
		k, err := recordKind(buf[off:])
		if err != nil {
			return nil, err
		}
		if k != kindConcurrentKernel {
			continue
		}
		r, err := parseKernel(buf[off:])
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
}
