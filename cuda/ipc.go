package cuda

import (
	"sync"

	"github.com/cockroachdb/errors"
	"github.com/ebitengine/purego"
)

// IpcMemHandle is a CUipcMemHandle: 64 opaque bytes naming another
// process's device allocation (cuIpcGetMemHandle, or torch's
// storage._share_cuda_()).
type IpcMemHandle [64]byte

// ipcHandleArg is CUipcMemHandle as C declares it (a struct of 64 chars):
// cuIpcOpenMemHandle takes it by value, which purego's struct-argument
// support passes per the platform ABI (in memory, on the stack).
type ipcHandleArg struct{ reserved [64]byte }

var ipcFns struct {
	once  sync.Once
	err   error
	open  func(p *uint64, h ipcHandleArg, flags uint32) int32
	close func(p uint64) int32
	get   func(h *IpcMemHandle, p uint64) int32
}

const ipcLazyEnablePeerAccess = 1

func (c *Ctx) loadIpc() error {
	ipcFns.once.Do(func() {
		h, _, _ := dlopenFirst([]string{c.drv.lib})
		if h == 0 {
			ipcFns.err = errors.Newf("cuda: reopening %s for the IPC calls", c.drv.lib)
			return
		}
		s := symbols{lib: c.drv.lib, handle: h}
		var open, cls, get uintptr
		for _, x := range []struct {
			dst   *uintptr
			names []string
		}{
			{&open, []string{"cuIpcOpenMemHandle_v2", "cuIpcOpenMemHandle"}},
			{&cls, []string{"cuIpcCloseMemHandle"}},
			{&get, []string{"cuIpcGetMemHandle"}},
		} {
			if err := s.must(x.dst, x.names...); err != nil {
				ipcFns.err = err
				return
			}
		}
		purego.RegisterFunc(&ipcFns.open, open)
		purego.RegisterFunc(&ipcFns.close, cls)
		purego.RegisterFunc(&ipcFns.get, get)
	})
	return ipcFns.err
}

// IpcOpenMemHandle maps another process's allocation into this context
// and returns its base address here. Close it with IpcCloseMemHandle.
func (c *Ctx) IpcOpenMemHandle(h IpcMemHandle) (DevPtr, error) {
	if err := c.loadIpc(); err != nil {
		return 0, err
	}
	var p uint64
	if err := c.check("cuIpcOpenMemHandle", ipcFns.open(&p, ipcHandleArg{h}, ipcLazyEnablePeerAccess)); err != nil {
		return 0, errors.WithHint(err, "the handle must come from another process on this machine whose allocation is still alive (and not from PyTorch's expandable segments)")
	}
	return DevPtr(p), nil
}

// IpcCloseMemHandle unmaps an allocation opened with IpcOpenMemHandle.
func (c *Ctx) IpcCloseMemHandle(p DevPtr) error {
	if err := c.loadIpc(); err != nil {
		return err
	}
	return c.check("cuIpcCloseMemHandle", ipcFns.close(uint64(p)))
}

// IpcGetMemHandle exports an allocation of this context (a cuMemAlloc
// base address) for another process (gpu-check's round trip).
func (c *Ctx) IpcGetMemHandle(p DevPtr) (IpcMemHandle, error) {
	var h IpcMemHandle
	if err := c.loadIpc(); err != nil {
		return h, err
	}
	return h, c.check("cuIpcGetMemHandle", ipcFns.get(&h, uint64(p)))
}

// GatherDtoH copies device spans back to back into dst (len(dst) must be
// their total) on the context's stream and waits: one queued copy per span,
// one synchronisation. dst should be pinned (HostAlloc) for DMA speed.
func (c *Ctx) GatherDtoH(dst []byte, srcs []DevPtr, lens []int64) error {
	if len(srcs) != len(lens) {
		return errors.Newf("cuda: gather of %d spans with %d lengths", len(srcs), len(lens))
	}
	at := int64(0)
	for i, p := range srcs {
		n := lens[i]
		if n < 0 || at+n > int64(len(dst)) {
			return errors.Newf("cuda: gather span %d (%d bytes) overruns the %d-byte destination", i, n, len(dst))
		}
		if err := c.CopyDtoHAsync(dst[at:at+n], p, c.stream); err != nil {
			return err
		}
		at += n
	}
	if at != int64(len(dst)) {
		return errors.Newf("cuda: gather spans hold %d bytes, destination %d", at, len(dst))
	}
	return c.SyncStream(c.stream)
}
