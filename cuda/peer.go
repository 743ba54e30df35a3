package cuda

import (
	"unsafe"

	"github.com/cockroachdb/errors"
)

// Peer access between the GPUs of one host: once this context has enabled
// access to a peer's context, kernels here read and write the peer's device
// memory through the same pointers (unified addressing), over NVLink where
// the GPUs have it. The one-shot all-reduce across GPUs reads its peers'
// partial buffers this way.

// cuErrPeerAccessAlreadyEnabled is CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED.
const cuErrPeerAccessAlreadyEnabled CUresult = 704

// CanAccessPeer reports whether this context's GPU can map peer's memory.
func (c *Ctx) CanAccessPeer(peer *Device) (bool, error) {
	if c.drv.cuDeviceCanAccessPeer == 0 {
		return false, errors.New("cuDeviceCanAccessPeer: not in this driver")
	}
	pc, err := peer.context()
	if err != nil {
		return false, err
	}
	var can int32
	err = c.check("cuDeviceCanAccessPeer", call(c.drv.cuDeviceCanAccessPeer, uintptr(unsafe.Pointer(&can)), uintptr(c.cudev), uintptr(pc.cudev)))
	return can != 0, err
}

// EnablePeerAccess maps peer's memory into this context (already mapped:
// no error). Peer access is one-way: each GPU that reads another enables it.
func (c *Ctx) EnablePeerAccess(peer *Device) error {
	if c.drv.cuCtxEnablePeerAccess == 0 {
		return errors.New("cuCtxEnablePeerAccess: not in this driver")
	}
	pc, err := peer.context()
	if err != nil {
		return err
	}
	err = c.check("cuCtxEnablePeerAccess", call(c.drv.cuCtxEnablePeerAccess, pc.handle, 0))
	var ce *CUDAError
	if errors.As(err, &ce) && ce.Code == cuErrPeerAccessAlreadyEnabled {
		return nil
	}
	return err
}

// context is the device's context (its handle and ordinal are fixed after
// Open; nothing else of it is used off its thread).
func (d *Device) context() (*Ctx, error) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	if d.closed || d.ctx == nil {
		return nil, errors.New("peer device is closed")
	}
	return d.ctx, nil
}
