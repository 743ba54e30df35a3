package cuda

import (
	"fmt"
	"log/slog"
	"maps"
	"runtime"
	"runtime/debug"
	"sync"
	"unsafe"

	"github.com/cockroachdb/errors"
)

// DeviceInfo describes an opened GPU.
type DeviceInfo struct {
	Ordinal          int
	Name             string
	CCMajor, CCMinor int
	SMs              int
	L2Bytes          int
	MaxSharedOptin   int // bytes of shared memory a block may opt into
	MaxSharedPerSM   int // bytes of shared memory an SM holds for all its blocks
	ReservedShared   int // bytes of an SM's shared memory the driver keeps for each block
	TotalMem         int64
	DriverVersion    int // e.g. 13000 for CUDA 13.0
	DriverLib        string
}

// Arch is the compute capability as "sm_XY".
func (i DeviceInfo) Arch() string { return fmt.Sprintf("sm_%d%d", i.CCMajor, i.CCMinor) }

// Device owns one GPU's primary context and the OS thread that drives it.
type Device struct {
	Info DeviceInfo

	drv    *driver
	mu     sync.RWMutex
	closed bool
	work   chan job
	done   chan struct{}
	ctx    *Ctx
	cerr   error
}

// Open starts the executor thread for GPU ordinal and makes its primary
// context current there. Without a driver or GPU the error is marked
// ErrNoGPU and hints at --device cpu.
func Open(ordinal int) (*Device, error) {
	n, err := DeviceCount()
	if err != nil {
		return nil, err
	}
	if ordinal < 0 || ordinal >= n {
		return nil, errors.WithHint(errors.Newf("GPU %d requested, the driver sees %d", ordinal, n), "pick a device index below the count nvidia-smi shows")
	}
	dr, err := loadDriver()
	if err != nil {
		return nil, err
	}
	d := &Device{drv: dr, work: make(chan job), done: make(chan struct{})}
	init := make(chan error, 1)
	go d.loop(ordinal, init)
	if err := <-init; err != nil {
		return nil, err
	}
	return d, nil
}

// loop is the executor: every CUDA call of this device runs here, on one
// locked OS thread where the primary context is current.
func (d *Device) loop(ordinal int, init chan<- error) {
	// Never unlocked: when this goroutine ends the runtime retires the
	// thread, so no other goroutine inherits the context.
	runtime.LockOSThread()
	c, err := d.setup(ordinal)
	init <- err
	if err != nil {
		close(d.done)
		return
	}
	d.serve(c)
}

// serve runs the queued work until Close, then tears the context down.
func (d *Device) serve(c *Ctx) {
	for j := range d.work {
		runJob(c, j, d.rethread)
	}
	d.cerr = c.teardown()
	close(d.done)
}

// rethread continues serving on a new locked thread after a job ended the
// executor's goroutine (runtime.Goexit: a test's t.Fatal or t.Skip inside
// Do). The primary context is made current there; if that fails, every
// later Do gets the error.
func (d *Device) rethread() {
	runtime.LockOSThread()
	c := d.ctx
	if err := d.drv.check("cuCtxSetCurrent", call(d.drv.cuCtxSetCurrent, c.handle)); err != nil {
		slog.Error("gpu: the device thread could not be replaced", "err", err)
		for j := range d.work {
			j.res <- errors.Wrap(err, "gpu: device thread lost")
		}
		d.cerr = c.teardown()
		close(d.done)
		return
	}
	d.serve(c)
}

func (d *Device) setup(ordinal int) (*Ctx, error) {
	dr := d.drv
	var dev int32
	if err := dr.check("cuDeviceGet", call(dr.cuDeviceGet, uintptr(unsafe.Pointer(&dev)), uintptr(ordinal))); err != nil {
		return nil, err
	}
	info := DeviceInfo{Ordinal: ordinal, DriverLib: dr.lib}
	name := make([]byte, 256)
	if err := dr.check("cuDeviceGetName", call(dr.cuDeviceGetName, uintptr(unsafe.Pointer(&name[0])), uintptr(len(name)), uintptr(dev))); err != nil {
		return nil, err
	}
	info.Name = gostr(&name[0])
	attr := func(a int) (int, error) {
		var v int32
		err := dr.check("cuDeviceGetAttribute", call(dr.cuDeviceGetAttribute, uintptr(unsafe.Pointer(&v)), uintptr(a), uintptr(dev)))
		return int(v), err
	}
	var err error
	for _, p := range []struct {
		dst *int
		a   int
	}{
		{&info.CCMajor, attrComputeCapMajor}, {&info.CCMinor, attrComputeCapMinor},
		{&info.SMs, attrMultiprocessorCount}, {&info.L2Bytes, attrL2CacheSize},
		{&info.MaxSharedOptin, attrMaxSharedPerBlockOptin},
		{&info.MaxSharedPerSM, attrMaxSharedPerSM}, {&info.ReservedShared, attrReservedSharedPerBlock},
	} {
		if *p.dst, err = attr(p.a); err != nil {
			return nil, err
		}
	}
	var total uint64
	if err := dr.check("cuDeviceTotalMem_v2", call(dr.cuDeviceTotalMem, uintptr(unsafe.Pointer(&total)), uintptr(dev))); err != nil {
		return nil, err
	}
	info.TotalMem = int64(total)
	var ver int32
	if err := dr.check("cuDriverGetVersion", call(dr.cuDriverGetVersion, uintptr(unsafe.Pointer(&ver)))); err != nil {
		return nil, err
	}
	info.DriverVersion = int(ver)
	var ctx uintptr
	if err := dr.check("cuDevicePrimaryCtxRetain", call(dr.cuDevicePrimaryCtxRetain, uintptr(unsafe.Pointer(&ctx)), uintptr(dev))); err != nil {
		return nil, err
	}
	if err := dr.check("cuCtxSetCurrent", call(dr.cuCtxSetCurrent, ctx)); err != nil {
		_ = dr.check("cuDevicePrimaryCtxRelease", call(dr.cuDevicePrimaryCtxRelease, uintptr(dev)))
		return nil, err
	}
	d.Info = info
	c := &Ctx{dev: d, drv: dr, cudev: dev, handle: ctx, params: newParamArena(), modules: map[string]*Module{}}
	c.pool = newPool(c.memAlloc, c.memFree)
	s, err := c.NewStream()
	if err != nil {
		c.params.release()
		_ = dr.check("cuDevicePrimaryCtxRelease", call(dr.cuDevicePrimaryCtxRelease, uintptr(dev)))
		return nil, err
	}
	c.stream = s
	d.ctx = c
	slog.Debug("gpu: device open", "ordinal", ordinal, "name", info.Name, "arch", info.Arch(), "sms", info.SMs, "mem", info.TotalMem, "driver", info.DriverVersion)
	return c, nil
}

// Do runs f on the device's thread and waits for it. f must not call Do
// (that would deadlock) and must not keep c after returning. A panic in f
// comes back as an error; the device stays usable. So does f ending its
// goroutine (runtime.Goexit, as t.Fatal or t.Skip called inside f do): Do
// returns ErrGoexit and a new thread takes over the context.
func (d *Device) Do(f func(c *Ctx) error) error {
	d.mu.RLock()
	defer d.mu.RUnlock()
	if d.closed {
		return errors.New("gpu: device is closed")
	}
	j := job{f: f, res: make(chan error, 1)}
	d.work <- j
	return <-j.res
}

// ErrGoexit is Do's error when f ended the device thread's goroutine
// (runtime.Goexit) instead of returning. A test helper that runs test
// code inside Do sees it after a t.Skip or t.Fatal there, and should end
// the test the same way on its own goroutine.
var ErrGoexit = errors.New("gpu: the function run on the device thread called runtime.Goexit (t.Fatal or t.Skip inside Device.Do?)")

// job is one Do call: the function and where its result goes.
type job struct {
	f   func(c *Ctx) error
	res chan error
}

// runJob runs j.f(c) and always answers j.res: with f's error, a panic as
// an error, or ErrGoexit when f ended this goroutine, after which
// onGoexit (started on a new goroutine) has to take over the queue.
func runJob(c *Ctx, j job, onGoexit func()) {
	returned := false
	defer func() {
		if returned {
			return
		}
		if r := recover(); r != nil {
			j.res <- errors.Newf("gpu: panic on device thread: %v\n%s", r, debug.Stack())
			return
		}
		j.res <- ErrGoexit
		go onGoexit()
	}()
	err := j.f(c)
	returned = true
	j.res <- err
}

// Close synchronises, frees every pooled buffer and module, and releases the
// primary context. Safe to call twice.
func (d *Device) Close() error {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		<-d.done
		return d.cerr
	}
	d.closed = true
	close(d.work)
	d.mu.Unlock()
	<-d.done
	return d.cerr
}

// Stream is a CUDA stream handle; 0 is the legacy default stream.
type Stream uintptr

// Event is a CUDA event handle.
type Event uintptr

// Dim3 is a grid or block shape.
type Dim3 struct{ X, Y, Z int }

// D1 is a one-dimensional shape.
func D1(x int) Dim3 { return Dim3{x, 1, 1} }

// D3 is a three-dimensional shape.
func D3(x, y, z int) Dim3 { return Dim3{x, y, z} }

// Ctx is the device as seen from its own thread, inside Device.Do.
type Ctx struct {
	dev     *Device
	drv     *driver
	cudev   int32
	handle  uintptr // the primary CUcontext (peer.go)
	params  *paramArena
	pool    *Pool
	stream  Stream
	modules map[string]*Module
	values  map[any]any // Value's store
	// queueHook, when set, runs before each call of this context that
	// queues work on a stream (SetQueueHook).
	queueHook func()
}

// SetQueueHook makes f run before every call of c that queues work on a
// stream (kernel launches, asynchronous copies, memsets, graph launches;
// not event records or waits) and returns the hook it replaces; nil
// removes it. A timer's way to see where device work starts after an idle
// stream (engine/gpu clock.go). f runs on the device thread and must not
// queue work itself.
func (c *Ctx) SetQueueHook(f func()) (prev func()) {
	prev, c.queueHook = c.queueHook, f
	return prev
}

// queued runs the queue hook, if any.
func (c *Ctx) queued() {
	if c.queueHook != nil {
		c.queueHook()
	}
}

// Info describes the device.
func (c *Ctx) Info() DeviceInfo { return c.dev.Info }

// Value returns the context's value under key, building it with build on
// first use (a kernel set loaded once per context, say). A failed build is
// not kept, so the next call tries again.
func (c *Ctx) Value(key any, build func() (any, error)) (any, error) {
	if v, ok := c.values[key]; ok {
		return v, nil
	}
	v, err := build()
	if err != nil {
		return nil, err
	}
	if c.values == nil {
		c.values = map[any]any{}
	}
	c.values[key] = v
	return v, nil
}

// Stream is the context's own (non-blocking) stream, used by the helpers
// below unless told otherwise.
func (c *Ctx) Stream() Stream { return c.stream }

// Pool is the context's caching allocator.
func (c *Ctx) Pool() *Pool { return c.pool }

func (c *Ctx) check(name string, r int32) error { return c.drv.check(name, r) }

func (c *Ctx) teardown() error {
	errs := c.Synchronize()
	for name, m := range c.modules {
		errs = errors.CombineErrors(errs, c.check("cuModuleUnload", call(c.drv.cuModuleUnload, m.h)))
		delete(c.modules, name)
	}
	errs = errors.CombineErrors(errs, c.pool.releaseAll())
	if c.stream != 0 {
		errs = errors.CombineErrors(errs, c.DestroyStream(c.stream))
	}
	c.params.release()
	errs = errors.CombineErrors(errs, c.check("cuDevicePrimaryCtxRelease", call(c.drv.cuDevicePrimaryCtxRelease, uintptr(c.cudev))))
	return errs
}

// Synchronize waits for all work on the context.
func (c *Ctx) Synchronize() error {
	return c.check("cuCtxSynchronize", call(c.drv.cuCtxSynchronize))
}

// MemInfo returns free and total device memory.
func (c *Ctx) MemInfo() (free, total int64, err error) {
	var f, t uint64
	err = c.check("cuMemGetInfo_v2", call(c.drv.cuMemGetInfo, uintptr(unsafe.Pointer(&f)), uintptr(unsafe.Pointer(&t))))
	return int64(f), int64(t), err
}

func (c *Ctx) memAlloc(n int64) (DevPtr, error) {
	var p uint64
	if err := c.check("cuMemAlloc_v2", call(c.drv.cuMemAlloc, uintptr(unsafe.Pointer(&p)), uintptr(n))); err != nil {
		return 0, err
	}
	return DevPtr(p), nil
}

func (c *Ctx) memFree(p DevPtr) error {
	return c.check("cuMemFree_v2", call(c.drv.cuMemFree, uintptr(p)))
}

// Alloc returns device memory from the pool (256-byte aligned).
func (c *Ctx) Alloc(n int64) (DevPtr, error) { return c.pool.Alloc(n) }

// Free returns a pool buffer for reuse.
func (c *Ctx) Free(p DevPtr) error { return c.pool.Free(p) }

// HostBuf is page-locked host memory (cuMemHostAlloc): fast DMA, and the
// only host memory async copies and captured graphs may use.
type HostBuf struct {
	p     unsafe.Pointer
	Bytes []byte
}

// HostAlloc allocates n bytes of pinned host memory.
func (c *Ctx) HostAlloc(n int) (*HostBuf, error) {
	if n <= 0 {
		return nil, errors.Newf("gpu: pinned allocation of %d bytes", n)
	}
	var p unsafe.Pointer
	if err := c.check("cuMemHostAlloc", call(c.drv.cuMemHostAlloc, uintptr(unsafe.Pointer(&p)), uintptr(n), memHostAllocPortable)); err != nil {
		return nil, err
	}
	return &HostBuf{p: p, Bytes: unsafe.Slice((*byte)(p), n)}, nil
}

// FreeHost releases pinned memory from HostAlloc.
func (c *Ctx) FreeHost(h *HostBuf) error {
	if h == nil || h.p == nil {
		return nil
	}
	err := c.check("cuMemFreeHost", call(c.drv.cuMemFreeHost, uintptr(h.p)))
	h.p, h.Bytes = nil, nil
	return err
}

// BytesOf views a slice of plain numbers as bytes (no copy).
func BytesOf(v any) ([]byte, error) {
	switch s := v.(type) {
	case []byte:
		return s, nil
	case []int8:
		return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(s))), len(s)), nil
	case []uint16:
		return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(s))), 2*len(s)), nil
	case []int16:
		return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(s))), 2*len(s)), nil
	case []float32:
		return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(s))), 4*len(s)), nil
	case []int32:
		return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(s))), 4*len(s)), nil
	case []uint32:
		return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(s))), 4*len(s)), nil
	case []float64:
		return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(s))), 8*len(s)), nil
	case []int64:
		return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(s))), 8*len(s)), nil
	case []uint64:
		return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(s))), 8*len(s)), nil
	case []DevPtr:
		return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(s))), 8*len(s)), nil
	default:
		return nil, errors.Newf("gpu: cannot copy %T", v)
	}
}

// Upload copies a Go slice to device memory and waits for it (ordered after
// earlier work on the context's stream).
func (c *Ctx) Upload(dst DevPtr, src any) error {
	b, err := BytesOf(src)
	if err != nil || len(b) == 0 {
		return err
	}
	if err := c.CopyHtoDAsync(dst, b, c.stream); err != nil {
		return err
	}
	return c.SyncStream(c.stream)
}

// Download copies device memory into a Go slice (its full length) after the
// context stream's earlier work.
func (c *Ctx) Download(dst any, src DevPtr) error {
	b, err := BytesOf(dst)
	if err != nil || len(b) == 0 {
		return err
	}
	if err := c.CopyDtoHAsync(b, src, c.stream); err != nil {
		return err
	}
	return c.SyncStream(c.stream)
}

// CopyHtoDAsync queues a host-to-device copy. With pageable src the driver
// stages it before returning; pinned src (HostBuf) copies truly async and
// must stay untouched until the stream passes the copy.
func (c *Ctx) CopyHtoDAsync(dst DevPtr, src []byte, s Stream) error {
	if len(src) == 0 {
		return nil
	}
	c.queued()
	return c.check("cuMemcpyHtoDAsync_v2", call(c.drv.cuMemcpyHtoDAsync, uintptr(dst), uintptr(unsafe.Pointer(&src[0])), uintptr(len(src)), uintptr(s)))
}

// CopyDtoHAsync queues a device-to-host copy into dst (see CopyHtoDAsync).
func (c *Ctx) CopyDtoHAsync(dst []byte, src DevPtr, s Stream) error {
	if len(dst) == 0 {
		return nil
	}
	c.queued()
	return c.check("cuMemcpyDtoHAsync_v2", call(c.drv.cuMemcpyDtoHAsync, uintptr(unsafe.Pointer(&dst[0])), uintptr(src), uintptr(len(dst)), uintptr(s)))
}

// CopyDtoD queues a device-to-device copy of n bytes.
func (c *Ctx) CopyDtoD(dst, src DevPtr, n int64, s Stream) error {
	c.queued()
	return c.check("cuMemcpyDtoDAsync_v2", call(c.drv.cuMemcpyDtoDAsync, uintptr(dst), uintptr(src), uintptr(n), uintptr(s)))
}

// MemsetD32 fills n 32-bit words at dst with v.
func (c *Ctx) MemsetD32(dst DevPtr, v uint32, n int64, s Stream) error {
	c.queued()
	return c.check("cuMemsetD32Async", call(c.drv.cuMemsetD32Async, uintptr(dst), uintptr(v), uintptr(n), uintptr(s)))
}

// MemsetD8 fills n bytes at dst with v.
func (c *Ctx) MemsetD8(dst DevPtr, v byte, n int64, s Stream) error {
	c.queued()
	return c.check("cuMemsetD8Async", call(c.drv.cuMemsetD8Async, uintptr(dst), uintptr(v), uintptr(n), uintptr(s)))
}

// NewStream creates a non-blocking stream.
func (c *Ctx) NewStream() (Stream, error) {
	var s uintptr
	err := c.check("cuStreamCreate", call(c.drv.cuStreamCreate, uintptr(unsafe.Pointer(&s)), streamNonBlocking))
	return Stream(s), err
}

// DestroyStream releases a stream from NewStream.
func (c *Ctx) DestroyStream(s Stream) error {
	return c.check("cuStreamDestroy_v2", call(c.drv.cuStreamDestroy, uintptr(s)))
}

// SyncStream waits for the stream's work; asynchronous kernel faults show up
// here.
func (c *Ctx) SyncStream(s Stream) error {
	return c.check("cuStreamSynchronize", call(c.drv.cuStreamSynchronize, uintptr(s)))
}

// NewEvent creates a timing-capable event.
func (c *Ctx) NewEvent() (Event, error) {
	var e uintptr
	err := c.check("cuEventCreate", call(c.drv.cuEventCreate, uintptr(unsafe.Pointer(&e)), eventDefault))
	return Event(e), err
}

// NewSyncEvent creates an event without timing, for ordering streams (the
// cheap kind: recording it captures no timestamp).
func (c *Ctx) NewSyncEvent() (Event, error) {
	var e uintptr
	err := c.check("cuEventCreate", call(c.drv.cuEventCreate, uintptr(unsafe.Pointer(&e)), eventDisableTiming))
	return Event(e), err
}

// WaitEvent makes the work queued on s after this call wait for e's last
// record. Under graph capture a record on one stream and a wait on another
// fork and join the captured graph's branches.
func (c *Ctx) WaitEvent(s Stream, e Event) error {
	return c.check("cuStreamWaitEvent", call(c.drv.cuStreamWaitEvent, uintptr(s), uintptr(e), 0))
}

// Record queues the event on s.
func (c *Ctx) Record(e Event, s Stream) error {
	return c.check("cuEventRecord", call(c.drv.cuEventRecord, uintptr(e), uintptr(s)))
}

// EventSync waits for the event.
func (c *Ctx) EventSync(e Event) error {
	return c.check("cuEventSynchronize", call(c.drv.cuEventSynchronize, uintptr(e)))
}

// Elapsed returns milliseconds between two completed events.
func (c *Ctx) Elapsed(start, end Event) (float32, error) {
	var ms float32
	err := c.check("cuEventElapsedTime", call(c.drv.cuEventElapsedTime, uintptr(unsafe.Pointer(&ms)), uintptr(start), uintptr(end)))
	return ms, err
}

// DestroyEvent releases an event.
func (c *Ctx) DestroyEvent(e Event) error {
	return c.check("cuEventDestroy_v2", call(c.drv.cuEventDestroy, uintptr(e)))
}

// Graph is an instantiated CUDA graph, replayed with LaunchGraph.
type Graph struct{ graph, exec uintptr }

// BeginCapture starts recording the work queued on s into a graph. Capture is
// thread-local: only this device thread's calls are recorded.
func (c *Ctx) BeginCapture(s Stream) error {
	return c.check("cuStreamBeginCapture_v2", call(c.drv.cuStreamBeginCapture, uintptr(s), captureModeThreadLocal))
}

// EndCapture stops recording on s and instantiates the graph.
func (c *Ctx) EndCapture(s Stream) (*Graph, error) { return c.EndCaptureWith(s, false) }

// EndCaptureWith is EndCapture; with nodePriority the graph replays each
// kernel node at the priority of the stream it was captured on, not at the
// launching stream's (priority.go).
func (c *Ctx) EndCaptureWith(s Stream, nodePriority bool) (*Graph, error) {
	var g uintptr
	if err := c.check("cuStreamEndCapture", call(c.drv.cuStreamEndCapture, uintptr(s), uintptr(unsafe.Pointer(&g)))); err != nil {
		return nil, err
	}
	var e uintptr
	var flags uintptr
	if nodePriority {
		flags = graphInstantiateUseNodePriority
	}
	if err := c.check("cuGraphInstantiateWithFlags", call(c.drv.cuGraphInstantiate, uintptr(unsafe.Pointer(&e)), g, flags)); err != nil {
		_ = c.check("cuGraphDestroy", call(c.drv.cuGraphDestroy, g))
		return nil, err
	}
	return &Graph{graph: g, exec: e}, nil
}

// LaunchGraph replays g on s.
func (c *Ctx) LaunchGraph(g *Graph, s Stream) error {
	c.queued()
	return c.check("cuGraphLaunch", call(c.drv.cuGraphLaunch, g.exec, uintptr(s)))
}

// DestroyGraph releases g.
func (c *Ctx) DestroyGraph(g *Graph) error {
	if g == nil {
		return nil
	}
	err := c.check("cuGraphExecDestroy", call(c.drv.cuGraphExecDestroy, g.exec))
	return errors.CombineErrors(err, c.check("cuGraphDestroy", call(c.drv.cuGraphDestroy, g.graph)))
}

// Module is a loaded cubin or PTX image.
type Module struct {
	h     uintptr
	funcs map[string]*Function
}

// Function is a kernel entry point.
type Function struct {
	h       uintptr
	Name    string
	NumRegs int
}

// LoadModule loads a cubin or NUL-terminated PTX image under name.
func (c *Ctx) LoadModule(name string, image []byte) (*Module, error) {
	if m, ok := c.modules[name]; ok {
		return m, nil
	}
	if len(image) == 0 {
		return nil, errors.Newf("gpu: empty module image %s", name)
	}
	if image[len(image)-1] != 0 {
		image = append(image[:len(image):len(image)], 0)
	}
	var h uintptr
	if err := c.check("cuModuleLoadData", call(c.drv.cuModuleLoadData, uintptr(unsafe.Pointer(&h)), uintptr(unsafe.Pointer(&image[0])))); err != nil {
		return nil, errors.Wrapf(err, "loading kernel module %s", name)
	}
	m := &Module{h: h, funcs: map[string]*Function{}}
	c.modules[name] = m
	return m, nil
}

// Function looks up a kernel by its extern "C" name.
func (c *Ctx) Function(m *Module, name string) (*Function, error) {
	if f, ok := m.funcs[name]; ok {
		return f, nil
	}
	var h uintptr
	if err := c.check("cuModuleGetFunction", call(c.drv.cuModuleGetFunction, uintptr(unsafe.Pointer(&h)), m.h, uintptr(unsafe.Pointer(cstr(name))))); err != nil {
		return nil, errors.Wrapf(err, "kernel %s", name)
	}
	f := &Function{h: h, Name: name}
	var regs int32
	if call(c.drv.cuFuncGetAttribute, uintptr(unsafe.Pointer(&regs)), funcAttrNumRegs, h) == 0 {
		f.NumRegs = int(regs)
	}
	m.funcs[name] = f
	return f, nil
}

// SetMaxDynamicShared lets f's blocks use up to n bytes of dynamic shared
// memory (needed above 48 KiB).
func (c *Ctx) SetMaxDynamicShared(f *Function, n int) error {
	return c.check("cuFuncSetAttribute", call(c.drv.cuFuncSetAttribute, f.h, funcAttrMaxDynamicShared, uintptr(n)))
}

// PreferMaxShared asks the driver to give f's SMs the most shared memory
// (CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT = 100), so that shared
// memory does not lower how many of its blocks an SM holds.
func (c *Ctx) PreferMaxShared(f *Function) error { return c.PreferShared(f, 100) }

// PreferShared asks the driver for pct percent (0..100) of f's SMs' unified
// L1 / shared memory as shared memory (the preferred carveout; -1: the
// driver's choice again).
func (c *Ctx) PreferShared(f *Function, pct int) error {
	if pct < -1 || pct > 100 {
		return errors.Newf("shared memory carveout %d%%: want -1..100", pct)
	}
	return c.check("cuFuncSetAttribute", call(c.drv.cuFuncSetAttribute, f.h, funcAttrPreferredCarveout, uintptr(int64(pct))))
}

// ModuleGlobal returns the device address and size in bytes of the
// __device__ variable name of m (cuModuleGetGlobal): a host-set knob of a
// diagnostic build, such as the block clocks' buffer (kernels/clocks.go).
func (c *Ctx) ModuleGlobal(m *Module, name string) (DevPtr, int64, error) {
	if c.drv.cuModuleGetGlobal == 0 {
		return 0, 0, errors.WithHint(errors.New("the driver has no cuModuleGetGlobal_v2"), "update the NVIDIA driver")
	}
	var p uintptr
	var n uintptr
	if err := c.check("cuModuleGetGlobal_v2", call(c.drv.cuModuleGetGlobal, uintptr(unsafe.Pointer(&p)), uintptr(unsafe.Pointer(&n)),
		m.h, uintptr(unsafe.Pointer(cstr(name))))); err != nil {
		return 0, 0, errors.Wrapf(err, "module global %s", name)
	}
	return DevPtr(p), int64(n), nil
}

// Modules returns the context's loaded modules by name.
func (c *Ctx) Modules() map[string]*Module { return maps.Clone(c.modules) }

// ErrNoOccupancy: the driver has no cuOccupancyMaxActiveBlocksPerMultiprocessor.
var ErrNoOccupancy = errors.New("the driver has no occupancy query")

// MaxActiveBlocks is how many blocks of f (block threads, smem bytes of
// dynamic shared memory) one SM holds at once
// (cuOccupancyMaxActiveBlocksPerMultiprocessor): a grid of that many
// blocks per SM is co-resident on an otherwise idle device. Nothing calls
// it (nor PreferMaxShared) since the persistent MoE kernel, which sized
// its grid by them, was removed in session 11, nor PreferShared since the
// staged GEMV's carveout was removed in session 54: kept as generic API.
func (c *Ctx) MaxActiveBlocks(f *Function, block, smem int) (int, error) {
	if c.drv.cuOccupancyMaxActiveBlocksPerMultiprocessor == 0 {
		return 0, ErrNoOccupancy
	}
	var n int32
	if err := c.check("cuOccupancyMaxActiveBlocksPerMultiprocessor", call(c.drv.cuOccupancyMaxActiveBlocksPerMultiprocessor,
		uintptr(unsafe.Pointer(&n)), f.h, uintptr(block), uintptr(smem))); err != nil {
		return 0, err
	}
	return int(n), nil
}

// Launch queues f on s. Arguments follow paramBits (DevPtr, int as C int,
// float32, ...). Launch-configuration errors come back here; faults inside
// the kernel at the next synchronisation.
func (c *Ctx) Launch(f *Function, grid, block Dim3, smem int, s Stream, args ...any) error {
	return c.LaunchEx(f, grid, block, smem, s, false, args...)
}
