package prefillshim

import (
	"sync"

	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/cuda"
	"github.com/tilert-go/tilert/rdma"
)

// gpuAccess is DeviceAccess over the CUDA driver: IPC-mapped allocations,
// device reads through pinned host buffers. Devices open on first use; the
// ordinals are the plugin's (run the sidecar with vLLM's
// CUDA_VISIBLE_DEVICES).
type gpuAccess struct {
	mu     sync.Mutex
	devs   map[int]*cuda.Device
	pinned map[*byte]pinnedBuf
}

type pinnedBuf struct {
	dev int
	buf *cuda.HostBuf
}

// newGPUAccess returns the CUDA DeviceAccess, or an error marked
// cuda.ErrNoGPU on a machine without a driver or device.
func newGPUAccess() (*gpuAccess, error) {
	if _, err := cuda.DeviceCount(); err != nil {
		return nil, err
	}
	return &gpuAccess{devs: map[int]*cuda.Device{}, pinned: map[*byte]pinnedBuf{}}, nil
}

func (g *gpuAccess) dev(ordinal int) (*cuda.Device, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if d := g.devs[ordinal]; d != nil {
		return d, nil
	}
	d, err := cuda.Open(ordinal)
	if err != nil {
		return nil, err
	}
	g.devs[ordinal] = d
	return d, nil
}

func (g *gpuAccess) Open(device int, handle []byte, _ int64) (uintptr, error) {
	if len(handle) != len(cuda.IpcMemHandle{}) {
		return 0, errors.Newf("IPC handle of %d bytes", len(handle))
	}
	d, err := g.dev(device)
	if err != nil {
		return 0, err
	}
	var h cuda.IpcMemHandle
	copy(h[:], handle)
	var p cuda.DevPtr
	err = d.Do(func(c *cuda.Ctx) error {
		var e error
		p, e = c.IpcOpenMemHandle(h)
		return e
	})
	return uintptr(p), err
}

func (g *gpuAccess) Close(device int, addr uintptr) error {
	d, err := g.dev(device)
	if err != nil {
		return err
	}
	return d.Do(func(c *cuda.Ctx) error { return c.IpcCloseMemHandle(cuda.DevPtr(addr)) })
}

// HostBuffer allocates portable pinned memory on the first open device
// (or device 0).
func (g *gpuAccess) HostBuffer(n int) ([]byte, error) {
	g.mu.Lock()
	ord := 0
	for o := range g.devs {
		ord = o
		break
	}
	g.mu.Unlock()
	d, err := g.dev(ord)
	if err != nil {
		return nil, err
	}
	var hb *cuda.HostBuf
	if err := d.Do(func(c *cuda.Ctx) error {
		var e error
		hb, e = c.HostAlloc(n)
		return e
	}); err != nil {
		return nil, err
	}
	g.mu.Lock()
	g.pinned[&hb.Bytes[0]] = pinnedBuf{dev: ord, buf: hb}
	g.mu.Unlock()
	return hb.Bytes, nil
}

func (g *gpuAccess) FreeHostBuffer(b []byte) error {
	if len(b) == 0 {
		return nil
	}
	g.mu.Lock()
	pb, ok := g.pinned[&b[0]]
	delete(g.pinned, &b[0])
	d := g.devs[pb.dev]
	g.mu.Unlock()
	if !ok || d == nil {
		return errors.New("gpu access: freeing a buffer it did not allocate")
	}
	return d.Do(func(c *cuda.Ctx) error { return c.FreeHost(pb.buf) })
}

func (g *gpuAccess) Gather(device int, dst []byte, segs []rdma.DeviceSeg) error {
	d, err := g.dev(device)
	if err != nil {
		return err
	}
	srcs := make([]cuda.DevPtr, len(segs))
	lens := make([]int64, len(segs))
	for i, s := range segs {
		srcs[i], lens[i] = cuda.DevPtr(s.Addr), s.Len
	}
	return d.Do(func(c *cuda.Ctx) error { return c.GatherDtoH(dst, srcs, lens) })
}

// close releases every pinned buffer and device.
func (g *gpuAccess) close() {
	g.mu.Lock()
	defer g.mu.Unlock()
	for k, pb := range g.pinned {
		if d := g.devs[pb.dev]; d != nil {
			_ = d.Do(func(c *cuda.Ctx) error { return c.FreeHost(pb.buf) })
		}
		delete(g.pinned, k)
	}
	for o, d := range g.devs {
		_ = d.Close()
		delete(g.devs, o)
	}
}
